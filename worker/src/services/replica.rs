//! Replica processes: starting one (a child process or a container) on a chunk, waiting for
//! it to answer, stopping it, and finding those an earlier run left behind.

use super::engine::{self, ReplicaError};
use super::Services;
use crate::docker::ReplicaContainers;
use crate::metrics as m;
use rustix::process::{kill_process, Pid, Signal};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tangram_shared::ChunkRef;
use tokio::io::AsyncBufReadExt;
use tokio::time::Instant;
use tracing::{info, warn, Instrument};

/// How a replica runs.
#[derive(Debug)]
pub(super) enum Proc {
    Child(tokio::process::Child),
    Container {
        id: String,
        gone: Arc<AtomicBool>,
        docker: ReplicaContainers,
    },
}

/// A replica process.
#[derive(Debug)]
pub(super) struct Replica {
    pub(super) service: String,
    pub(super) chunk: ChunkRef,
    pub(super) gpus: Vec<u32>,
    pub(super) port: u16,
    child: Mutex<Option<Proc>>,
    awake: AtomicBool,
    healthy: AtomicBool,
    /// Sleep, wake and restart happen one at a time per replica.
    pub(super) lifecycle: tokio::sync::Mutex<()>,
}

impl Replica {
    pub(super) fn base(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
    pub(super) fn is_awake(&self) -> bool {
        self.awake.load(Ordering::SeqCst)
    }
    pub(super) fn set_awake(&self, awake: bool) {
        self.awake.store(awake, Ordering::SeqCst)
    }
    pub(super) fn is_healthy(&self) -> bool {
        self.healthy.load(Ordering::SeqCst)
    }
    pub(super) fn set_healthy(&self, healthy: bool) {
        self.healthy.store(healthy, Ordering::SeqCst)
    }
    pub(super) fn exited(&self) -> bool {
        let mut c = self.child.lock().expect("child lock");
        match c.as_mut() {
            None => true,
            Some(Proc::Child(child)) => !matches!(child.try_wait(), Ok(None)),
            Some(Proc::Container { gone, .. }) => gone.load(Ordering::SeqCst),
        }
    }
}

/// Starts of a process replica tried at most, when it exits while starting.
const LAUNCH_TRIES: u32 = 3;

/// A port free now on loopback, for a new replica.
fn free_port() -> std::io::Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(l.local_addr()?.port())
}

impl Services {
    pub(super) fn pid_file(&self, port: u16) -> PathBuf {
        self.state_dir.join(format!("replica-{port}.pid"))
    }

    /// Stops a replica; a container goes in the background, owned by the service tasks.
    pub(super) fn kill(&self, r: &Replica) {
        match r.child.lock().expect("child lock").take() {
            Some(Proc::Child(mut child)) => {
                let _ = child.start_kill();
            }
            Some(Proc::Container { id, docker, .. }) => {
                let span = tracing::info_span!("replica_remove", service = %r.service);
                self.tasks.spawn(
                    async move {
                        let _ = docker.remove(&id).await;
                    }
                    .instrument(span),
                );
            }
            None => {}
        }
    }

    pub(super) fn reconcile_leftovers(&self) -> usize {
        let Ok(dir) = std::fs::read_dir(&self.state_dir) else {
            return 0;
        };
        let mut killed = 0;
        for e in dir.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if !name.starts_with("replica-") || !name.ends_with(".pid") {
                continue;
            }
            if let Ok(text) = std::fs::read_to_string(e.path()) {
                let mut it = text.lines();
                let pid = it.next().and_then(|p| p.trim().parse::<u32>().ok());
                let marker = it.next().unwrap_or("").trim();
                if let Some(pid) = pid {
                    // Only a process that is still the replica we started (its command line
                    // carries the marker) is killed: pids get reused.
                    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
                    let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
                    let args = marker.split_once(' ').map(|(_, rest)| rest).unwrap_or("");
                    let cmd_args = cmdline
                        .trim()
                        .split_once(' ')
                        .map(|(_, rest)| rest)
                        .unwrap_or("");
                    if !args.is_empty() && cmd_args.ends_with(args) {
                        let target = i32::try_from(pid).ok().and_then(Pid::from_raw);
                        if let Some(target) = target {
                            // Gone since the cmdline was read is fine: it is dead either way.
                            let _ = kill_process(target, Signal::KILL);
                            killed += 1;
                        }
                    }
                }
            }
            let _ = std::fs::remove_file(e.path());
        }
        killed
    }

    /// Starts a replica of `service` on `chunk` (asleep) and waits until it answers. A
    /// process replica that exits while starting is started again on another port, twice at
    /// most: the port it was given can be taken between the check that it is free and the
    /// replica's bind (another process, a replica of another worker on this host).
    pub(super) async fn launch(
        &self,
        service: &str,
        chunk: ChunkRef,
    ) -> Result<Arc<Replica>, ReplicaError> {
        let mut tries = 0;
        loop {
            tries += 1;
            match self.launch_once(service, chunk).await {
                Err(ReplicaError::Exited { .. })
                    if tries < LAUNCH_TRIES
                        && self.configs.get(service).is_some_and(|c| c.image.is_none()) =>
                {
                    warn!(
                        service,
                        tries, "a replica exited while starting; starting it again on another port"
                    );
                }
                r => return r,
            }
        }
    }

    async fn launch_once(
        &self,
        service: &str,
        chunk: ChunkRef,
    ) -> Result<Arc<Replica>, ReplicaError> {
        let c = self
            .configs
            .get(service)
            .ok_or_else(|| ReplicaError::Route(format!("no service {service:?}")))?;
        let gpus = self
            .gpus_of(chunk)
            .map_err(|e| ReplicaError::Route(e.to_string()))?;
        let port = free_port().map_err(|source| ReplicaError::Local {
            what: "finding a free port".into(),
            source,
        })?;
        let gpu_list = gpus
            .iter()
            .map(u32::to_string)
            .collect::<Vec<_>>()
            .join(",");
        let template = if c.image.is_some() {
            &c.args
        } else {
            &c.command
        };
        let argv: Vec<String> = template
            .iter()
            .map(|a| {
                a.replace("{port}", &port.to_string())
                    .replace("{service}", service)
                    .replace("{gpus}", &gpu_list)
            })
            .collect();
        let span = tracing::info_span!("replica", service, port);
        let proc = match &c.image {
            Some(image) => {
                let container_err = |source| ReplicaError::Container {
                    service: service.to_string(),
                    source,
                };
                let docker = self.containers().await.map_err(container_err)?.clone();
                let real = self.inventory.source == "nvml";
                let id = docker
                    .start(service, port, image, &argv, &c.mounts, &gpus, real)
                    .await
                    .map_err(container_err)?;
                let gone = Arc::new(AtomicBool::new(false));
                let (d, g, i) = (docker.clone(), gone.clone(), id.clone());
                let stop = self.stop.clone();
                self.tasks.spawn(
                    async move {
                        tokio::select! {
                            _ = d.wait(&i) => g.store(true, Ordering::SeqCst),
                            _ = stop.cancelled() => {}
                        }
                    }
                    .instrument(span),
                );
                Proc::Container { id, gone, docker }
            }
            None => {
                let mut cmd = tokio::process::Command::new(&argv[0]);
                cmd.env_clear();
                for key in super::REPLICA_PASSTHROUGH {
                    if let Some(v) = std::env::var_os(key) {
                        cmd.env(key, v);
                    }
                }
                cmd.envs(&c.env)
                    .args(&argv[1..])
                    .env("CUDA_VISIBLE_DEVICES", &gpu_list)
                    .env("TANGRAM_SERVICE", service)
                    .stdin(std::process::Stdio::null())
                    .stdout(std::process::Stdio::piped())
                    .stderr(std::process::Stdio::inherit())
                    .kill_on_drop(true);
                let mut child = cmd.spawn().map_err(|source| ReplicaError::Spawn {
                    service: service.to_string(),
                    command: argv.join(" "),
                    source,
                })?;
                if let Some(pid) = child.id() {
                    // The check at the next start compares the arguments after the program:
                    // launchers such as pyenv shims rewrite the program path.
                    let _ =
                        std::fs::write(self.pid_file(port), format!("{pid}\n{}\n", argv.join(" ")));
                }
                // Forward the replica's stdout lines to the log until it closes.
                if let Some(out) = child.stdout.take() {
                    let stop = self.stop.clone();
                    self.tasks.spawn(
                        async move {
                            let mut lines = tokio::io::BufReader::new(out).lines();
                            loop {
                                tokio::select! {
                                    line = lines.next_line() => match line {
                                        Ok(Some(line)) => info!("replica: {line}"),
                                        _ => break,
                                    },
                                    _ = stop.cancelled() => break,
                                }
                            }
                        }
                        .instrument(span),
                    );
                }
                Proc::Child(child)
            }
        };
        let replica = Arc::new(Replica {
            service: service.to_string(),
            chunk,
            gpus,
            port,
            child: Mutex::new(Some(proc)),
            awake: AtomicBool::new(false),
            healthy: AtomicBool::new(false),
            lifecycle: tokio::sync::Mutex::new(()),
        });
        let deadline = Instant::now() + Duration::from_millis(c.start_timeout_ms);
        loop {
            if replica.exited() {
                let _ = std::fs::remove_file(self.pid_file(port));
                return Err(ReplicaError::Exited {
                    service: service.to_string(),
                    gpus: replica.gpus.clone(),
                });
            }
            if engine::get_json(&self.http, &replica, "/health")
                .await
                .is_ok()
            {
                break;
            }
            if Instant::now() > deadline {
                self.kill(&replica);
                return Err(ReplicaError::StartTimeout {
                    service: service.to_string(),
                    ms: c.start_timeout_ms,
                });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // Deployed ahead means evicted: state in host memory, GPUs free.
        let sleeping = engine::is_sleeping(&self.http, c.driver, &replica)
            .await
            .unwrap_or(false);
        if !sleeping {
            engine::sleep(&self.http, c.driver, &replica).await?;
        }
        replica.set_healthy(true);
        m::replica_started(service);
        let old = self
            .replicas
            .lock()
            .expect("replicas lock")
            .insert((service.to_string(), chunk), replica.clone());
        if let Some(old) = old {
            self.kill(&old);
            let _ = std::fs::remove_file(self.pid_file(old.port));
        }
        Ok(replica)
    }
}
