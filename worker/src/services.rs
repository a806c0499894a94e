//! Model services on a GPU worker: replica processes, their sleep/wake lifecycle through the
//! serving engine's own API, scoring, health checks and restarts (the worker's half of
//! Evict-on-Execution; the scheduler decides what is resident where).
//!
//! A replica is one process of one service bound to one aligned chunk of GPUs (its
//! `CUDA_VISIBLE_DEVICES`). Every service is deployed at start with one replica asleep on a
//! home chunk, its state in host memory; the scheduler's routes name the chunk, and a route to
//! a chunk where the service has no process yet starts one there first.

use crate::docker::ReplicaContainers;
use crate::metrics as m;
use anyhow::{anyhow, bail, Context as _};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tangram_shared::{ChunkRef, GpuInventory, GpuRoute, ReplicaReport, ServiceReport};
use tokio::io::AsyncBufReadExt;
use tracing::{info, warn};

/// The serving engine a service runs, which decides the lifecycle and scoring calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Driver {
    /// vLLM with `--enable-sleep-mode`: `/sleep?level=1`, `/wake_up`, `/is_sleeping`;
    /// scores through `/pooling`.
    Vllm,
    /// SGLang: `/release_memory_occupation`, `/resume_memory_occupation`; scores through
    /// `/classify`.
    Sglang,
    /// The reference replica shipped in `services/reference-replica/`.
    Reference,
}

/// One `[[service]]` entry of the worker's config.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServiceConfig {
    /// Name reward actions use.
    pub name: String,
    /// Serving engine.
    pub driver: Driver,
    /// How to start a replica as a process; `{port}`, `{service}` and `{gpus}` are
    /// replaced. The process also gets `CUDA_VISIBLE_DEVICES` set to its chunk's GPUs.
    #[serde(default)]
    pub command: Vec<String>,
    /// Or: a container image (present locally) that runs a replica, with `args` as its
    /// command (placeholders as in `command`). It runs with host networking; the chunk's GPUs
    /// are passed through a Docker device request when NVML found them.
    #[serde(default)]
    pub image: Option<String>,
    /// The container's command, with `image`.
    #[serde(default)]
    pub args: Vec<String>,
    /// Bind mounts for the container (`host:container[:ro]`), with `image`.
    #[serde(default)]
    pub mounts: Vec<String>,
    /// GPUs per replica: 1, 2, 4 or 8.
    #[serde(default = "one")]
    pub gpus: u8,
    /// Host memory the service's state takes, in MiB (for operators; reported in logs).
    #[serde(default)]
    pub host_mem_mb: u64,
    /// Expected restore time, ms (the scheduler's first estimate; measured restores refine it).
    #[serde(default = "restore_default")]
    pub restore_ms: u64,
    /// Requests one replica serves at once.
    #[serde(default = "slots_default")]
    pub slots: u32,
    /// How long a new replica may take to answer its health check, ms.
    #[serde(default = "start_default")]
    pub start_timeout_ms: u64,
    /// Engine model name passed in scoring requests (vLLM and SGLang need it).
    #[serde(default)]
    pub model: Option<String>,
}

fn one() -> u8 {
    1
}
fn restore_default() -> u64 {
    500
}
fn slots_default() -> u32 {
    8
}
fn start_default() -> u64 {
    60_000
}

impl ServiceConfig {
    /// Checks the entry.
    pub fn check(&self) -> Result<(), String> {
        if self.name.is_empty() || self.name.len() > 128 {
            return Err("service.name must have 1 to 128 characters".into());
        }
        if !tangram_shared::CHUNK_SIZES.contains(&self.gpus) {
            return Err(format!(
                "service {:?}: gpus must be 1, 2, 4 or 8, not {}",
                self.name, self.gpus
            ));
        }
        if self.command.is_empty() {
            return Err(format!("service {:?}: command is empty", self.name));
        }
        if !self.command.iter().any(|a| a.contains("{port}")) {
            return Err(format!(
                "service {:?}: command must take the replica's port as {{port}}",
                self.name
            ));
        }
        if self.slots == 0 {
            return Err(format!("service {:?}: slots must be at least 1", self.name));
        }
        Ok(())
    }
}

/// How a replica runs.
#[derive(Debug)]
enum Proc {
    Child(tokio::process::Child),
    Container {
        id: String,
        gone: Arc<std::sync::atomic::AtomicBool>,
        docker: ReplicaContainers,
    },
}

/// A replica process.
#[derive(Debug)]
struct Replica {
    service: String,
    chunk: ChunkRef,
    gpus: Vec<u32>,
    port: u16,
    child: Mutex<Option<Proc>>,
    awake: Mutex<bool>,
    healthy: Mutex<bool>,
    /// Sleep, wake and restart happen one at a time per replica.
    lifecycle: tokio::sync::Mutex<()>,
}

impl Replica {
    fn base(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
    fn exited(&self) -> bool {
        let mut c = self.child.lock().expect("child lock");
        match c.as_mut() {
            None => true,
            Some(Proc::Child(child)) => !matches!(child.try_wait(), Ok(None)),
            Some(Proc::Container { gone, .. }) => gone.load(std::sync::atomic::Ordering::SeqCst),
        }
    }
    fn kill(&self) {
        match self.child.lock().expect("child lock").take() {
            Some(Proc::Child(mut child)) => {
                let _ = child.start_kill();
            }
            Some(Proc::Container { id, docker, .. }) => {
                tokio::spawn(async move {
                    let _ = docker.remove(&id).await;
                });
            }
            None => {}
        }
    }
}

/// Why a reward action failed on the worker.
#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    /// The worker serves no such service.
    #[error("worker serves no service named {0:?}")]
    Unknown(String),
    /// The route names GPUs the worker does not have.
    #[error("{0}")]
    BadRoute(String),
    /// A replica failed.
    #[error("{0}")]
    Replica(String),
}

/// What a served reward action measured.
#[derive(Debug, Clone)]
pub struct Served {
    /// Scores, one per input.
    pub scores: Vec<f64>,
    /// Time spent evicting and restoring, µs.
    pub overhead_us: u64,
    /// Time spent scoring, µs.
    pub exec_us: u64,
    /// The replica's GPUs.
    pub gpus: Vec<u32>,
    /// True when this action woke the replica.
    pub restored: bool,
    /// Services put to sleep first.
    pub evicted: Vec<String>,
}

/// The worker's services and replicas.
#[derive(Debug)]
pub struct Services {
    configs: BTreeMap<String, ServiceConfig>,
    inventory: GpuInventory,
    replicas: Mutex<BTreeMap<(String, ChunkRef), Arc<Replica>>>,
    http: reqwest::Client,
    state_dir: PathBuf,
    worker: String,
    containers: tokio::sync::OnceCell<ReplicaContainers>,
}

/// A port free now on loopback, for a new replica.
fn free_port() -> anyhow::Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(l.local_addr()?.port())
}

impl Services {
    /// Builds the manager; nothing starts until [`Services::start`].
    pub fn new(
        worker: &str,
        configs: Vec<ServiceConfig>,
        inventory: GpuInventory,
        state_dir: PathBuf,
    ) -> Self {
        Self {
            configs: configs.into_iter().map(|c| (c.name.clone(), c)).collect(),
            inventory,
            replicas: Mutex::new(BTreeMap::new()),
            http: reqwest::Client::builder()
                .connect_timeout(Duration::from_secs(2))
                .pool_idle_timeout(Duration::from_secs(30))
                .build()
                .expect("building the HTTP client"),
            state_dir,
            worker: worker.to_string(),
            containers: tokio::sync::OnceCell::new(),
        }
    }

    async fn containers(&self) -> anyhow::Result<&ReplicaContainers> {
        self.containers
            .get_or_try_init(|| async {
                ReplicaContainers::connect(&self.worker)
                    .await
                    .context("connecting to Docker for replica containers")
            })
            .await
    }

    /// The GPUs of a chunk, or why the route is wrong.
    fn gpus_of(&self, chunk: ChunkRef) -> Result<Vec<u32>, ServiceError> {
        let group = self
            .inventory
            .groups
            .get(chunk.group as usize)
            .ok_or_else(|| {
                ServiceError::BadRoute(format!(
                    "GPU group {} does not exist on this worker",
                    chunk.group
                ))
            })?;
        let (s, l) = (chunk.start as usize, chunk.len as usize);
        if !tangram_shared::CHUNK_SIZES.contains(&chunk.len) || s % l != 0 || s + l > group.len() {
            return Err(ServiceError::BadRoute(format!(
                "chunk {}+{} is not an aligned chunk of group {} ({} GPUs)",
                s,
                l,
                chunk.group,
                group.len()
            )));
        }
        Ok(group[s..s + l].to_vec())
    }

    /// Kills replicas an earlier run of this worker left behind (their pids are kept in the
    /// state directory), then deploys one sleeping replica per service on its home chunk.
    pub async fn start(&self) -> anyhow::Result<()> {
        std::fs::create_dir_all(&self.state_dir)
            .with_context(|| format!("creating {}", self.state_dir.display()))?;
        let killed = self.reconcile_leftovers();
        if killed > 0 {
            info!(
                count = killed,
                "stopped leftover replicas of an earlier run"
            );
        }
        // Home chunks: round-robin over the aligned chunks of each size, so services spread.
        let mut next: BTreeMap<u8, usize> = BTreeMap::new();
        let configs: Vec<ServiceConfig> = self.configs.values().cloned().collect();
        let mut starting = Vec::new();
        for c in &configs {
            let chunks: Vec<ChunkRef> = self
                .inventory
                .groups
                .iter()
                .enumerate()
                .flat_map(|(g, gpus)| {
                    (0..gpus.len())
                        .step_by(c.gpus as usize)
                        .filter(move |s| s + c.gpus as usize <= gpus.len())
                        .map(move |s| ChunkRef {
                            group: g as u16,
                            start: s as u8,
                            len: c.gpus,
                        })
                })
                .collect();
            if chunks.is_empty() {
                bail!("service {:?} needs {} GPUs per replica; no GPU group of this worker is that large", c.name, c.gpus);
            }
            let i = next.entry(c.gpus).or_default();
            let chunk = chunks[*i % chunks.len()];
            *i += 1;
            starting.push(self.launch(&c.name, chunk));
        }
        for r in futures::future::join_all(starting).await {
            r?;
        }
        info!(
            services = self.configs.len(),
            "services deployed, all asleep"
        );
        Ok(())
    }

    fn pid_file(&self, port: u16) -> PathBuf {
        self.state_dir.join(format!("replica-{port}.pid"))
    }

    fn reconcile_leftovers(&self) -> usize {
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
                        let _ = std::process::Command::new("kill")
                            .arg("-9")
                            .arg(pid.to_string())
                            .status();
                        killed += 1;
                    }
                }
            }
            let _ = std::fs::remove_file(e.path());
        }
        killed
    }

    /// Starts a replica of `service` on `chunk` (asleep) and waits until it answers.
    async fn launch(&self, service: &str, chunk: ChunkRef) -> anyhow::Result<Arc<Replica>> {
        let c = self
            .configs
            .get(service)
            .ok_or_else(|| anyhow!("no service {service:?}"))?;
        let gpus = self.gpus_of(chunk).map_err(|e| anyhow!("{e}"))?;
        let port = free_port()?;
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
        let proc = match &c.image {
            Some(image) => {
                let docker = self.containers().await?.clone();
                let real = self.inventory.source == "nvml";
                let id = docker
                    .start(service, port, image, &argv, &c.mounts, &gpus, real)
                    .await
                    .with_context(|| {
                        format!("starting a replica container of {service:?} from {image}")
                    })?;
                let gone = Arc::new(std::sync::atomic::AtomicBool::new(false));
                let (d, g, i) = (docker.clone(), gone.clone(), id.clone());
                tokio::spawn(async move {
                    d.wait(&i).await;
                    g.store(true, std::sync::atomic::Ordering::SeqCst);
                });
                Proc::Container { id, gone, docker }
            }
            None => {
                let mut cmd = tokio::process::Command::new(&argv[0]);
                cmd.args(&argv[1..])
                    .env("CUDA_VISIBLE_DEVICES", &gpu_list)
                    .env("TANGRAM_SERVICE", service)
                    .stdin(std::process::Stdio::null())
                    .stdout(std::process::Stdio::piped())
                    .stderr(std::process::Stdio::inherit())
                    .kill_on_drop(true);
                let mut child = cmd.spawn().with_context(|| {
                    format!("starting a replica of {service:?} ({})", argv.join(" "))
                })?;
                if let Some(pid) = child.id() {
                    // The check at the next start compares the arguments after the program:
                    // launchers such as pyenv shims rewrite the program path.
                    let _ =
                        std::fs::write(self.pid_file(port), format!("{pid}\n{}\n", argv.join(" ")));
                }
                // Forward the replica's stdout lines to the log.
                if let Some(out) = child.stdout.take() {
                    let svc = service.to_string();
                    tokio::spawn(async move {
                        let mut lines = tokio::io::BufReader::new(out).lines();
                        while let Ok(Some(line)) = lines.next_line().await {
                            info!(service = %svc, "replica: {line}");
                        }
                    });
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
            awake: Mutex::new(false),
            healthy: Mutex::new(false),
            lifecycle: tokio::sync::Mutex::new(()),
        });
        let deadline = Instant::now() + Duration::from_millis(c.start_timeout_ms);
        loop {
            if replica.exited() {
                bail!(
                    "replica of {service:?} on GPUs {:?} exited during start",
                    replica.gpus
                );
            }
            if self.get_json(&replica, "/health").await.is_ok() {
                break;
            }
            if Instant::now() > deadline {
                replica.kill();
                bail!(
                    "replica of {service:?} did not answer /health within {} ms",
                    c.start_timeout_ms
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // Deployed ahead means evicted: state in host memory, GPUs free.
        let sleeping = self.is_sleeping(c.driver, &replica).await.unwrap_or(false);
        if !sleeping {
            self.sleep(c.driver, &replica).await?;
        }
        *replica.healthy.lock().expect("lock") = true;
        m::replica_started(service);
        let old = self
            .replicas
            .lock()
            .expect("replicas lock")
            .insert((service.to_string(), chunk), replica.clone());
        if let Some(old) = old {
            old.kill();
            let _ = std::fs::remove_file(self.pid_file(old.port));
        }
        Ok(replica)
    }

    async fn get_json(&self, r: &Replica, path: &str) -> anyhow::Result<serde_json::Value> {
        self.exchange(r, reqwest::Method::GET, path, None, Duration::from_secs(5))
            .await
    }

    async fn post(
        &self,
        r: &Replica,
        path: &str,
        body: serde_json::Value,
        timeout: Duration,
    ) -> anyhow::Result<serde_json::Value> {
        self.exchange(r, reqwest::Method::POST, path, Some(body), timeout)
            .await
    }

    /// One JSON request to a replica; a status other than 2xx is an error naming the call.
    async fn exchange(
        &self,
        r: &Replica,
        method: reqwest::Method,
        path: &str,
        body: Option<serde_json::Value>,
        timeout: Duration,
    ) -> anyhow::Result<serde_json::Value> {
        let mut req = self
            .http
            .request(method.clone(), format!("{}{path}", r.base()))
            .timeout(timeout);
        if let Some(body) = &body {
            req = req.json(body);
        }
        let resp = req.send().await?;
        let status = resp.status();
        let v = resp
            .json::<serde_json::Value>()
            .await
            .unwrap_or(serde_json::Value::Null);
        if !status.is_success() {
            bail!("{method} {path}: HTTP {status}: {v}");
        }
        Ok(v)
    }

    async fn is_sleeping(&self, d: Driver, r: &Replica) -> anyhow::Result<bool> {
        match d {
            Driver::Vllm | Driver::Reference => Ok(self.get_json(r, "/is_sleeping").await?
                ["is_sleeping"]
                .as_bool()
                .unwrap_or(false)),
            // SGLang has no query for it; the worker's own record is the truth.
            Driver::Sglang => Ok(!*r.awake.lock().expect("lock")),
        }
    }

    async fn sleep(&self, d: Driver, r: &Replica) -> anyhow::Result<()> {
        let t = Duration::from_secs(120);
        match d {
            Driver::Vllm | Driver::Reference => {
                self.post(r, "/sleep?level=1", serde_json::json!({}), t)
                    .await?
            }
            Driver::Sglang => {
                self.post(r, "/release_memory_occupation", serde_json::json!({}), t)
                    .await?
            }
        };
        *r.awake.lock().expect("lock") = false;
        Ok(())
    }

    async fn wake(&self, d: Driver, r: &Replica) -> anyhow::Result<()> {
        let t = Duration::from_secs(300);
        match d {
            Driver::Vllm | Driver::Reference => {
                self.post(r, "/wake_up", serde_json::json!({}), t).await?
            }
            Driver::Sglang => {
                self.post(r, "/resume_memory_occupation", serde_json::json!({}), t)
                    .await?
            }
        };
        *r.awake.lock().expect("lock") = true;
        Ok(())
    }

    async fn score(
        &self,
        c: &ServiceConfig,
        r: &Replica,
        inputs: &[String],
        options: &BTreeMap<String, String>,
        timeout: Duration,
    ) -> anyhow::Result<Vec<f64>> {
        let model = options.get("model").cloned().or_else(|| c.model.clone());
        // Each engine's scoring call, where its reply lists the items, and where an item's
        // score is (the last number in that field).
        let (path, body) = match c.driver {
            Driver::Reference => (
                "/score",
                serde_json::json!({"inputs": inputs, "options": options}),
            ),
            Driver::Vllm => (
                "/pooling",
                serde_json::json!({"model": model, "input": inputs}),
            ),
            Driver::Sglang => (
                "/classify",
                serde_json::json!({"model": model, "text": inputs}),
            ),
        };
        let v = self.post(r, path, body, timeout).await?;
        let (items, field) = match c.driver {
            Driver::Reference => (&v["scores"], None),
            Driver::Vllm => (&v["data"], Some("data")),
            Driver::Sglang => (&v, Some("embedding")),
        };
        let items = items
            .as_array()
            .ok_or_else(|| anyhow!("{path} reply lists no scores: {v}"))?;
        items
            .iter()
            .map(|d| {
                let x = field.map_or(d, |f| &d[f]);
                last_number(x).ok_or_else(|| anyhow!("no score in {d}"))
            })
            .collect()
    }

    fn replica(&self, service: &str, chunk: ChunkRef) -> Option<Arc<Replica>> {
        self.replicas
            .lock()
            .expect("replicas lock")
            .get(&(service.to_string(), chunk))
            .cloned()
    }

    /// Serves one routed reward action: evicts what the route says, makes the replica
    /// resident (starting it first if the service has no process on that chunk), scores.
    /// A replica that fails mid-request is restarted and the request retried once.
    pub async fn serve(
        &self,
        route: &GpuRoute,
        inputs: &[String],
        options: &BTreeMap<String, String>,
        timeout: Duration,
    ) -> Result<Served, ServiceError> {
        let c = self
            .configs
            .get(&route.service)
            .ok_or_else(|| ServiceError::Unknown(route.service.clone()))?;
        let gpus = self.gpus_of(route.chunk)?;
        let t0 = Instant::now();
        let mut evicted = Vec::new();
        for e in &route.evict {
            if let Some(v) = self.replica(&e.service, e.chunk) {
                let d = self
                    .configs
                    .get(&e.service)
                    .map(|c| c.driver)
                    .unwrap_or(Driver::Reference);
                let _g = v.lifecycle.lock().await;
                if *v.awake.lock().expect("lock") {
                    if let Err(err) = self.sleep(d, &v).await {
                        // A replica that cannot sleep holds GPU memory: stop it outright.
                        warn!(service = %e.service, error = %err, "eviction failed; stopping the replica");
                        v.kill();
                        *v.awake.lock().expect("lock") = false;
                    }
                    m::eviction(&e.service);
                    evicted.push(e.service.clone());
                }
            }
        }
        let mut restored = false;
        let mut last_err = String::new();
        for attempt in 0..2 {
            let replica = match self.replica(&route.service, route.chunk) {
                Some(r) if !r.exited() => r,
                _ => match self.launch(&route.service, route.chunk).await {
                    Ok(r) => r,
                    Err(e) => {
                        return Err(ServiceError::Replica(format!(
                            "starting a replica of {:?}: {e:#}",
                            route.service
                        )))
                    }
                },
            };
            {
                let _g = replica.lifecycle.lock().await;
                if !*replica.awake.lock().expect("lock") {
                    let w0 = Instant::now();
                    if let Err(e) = self.wake(c.driver, &replica).await {
                        last_err =
                            format!("restoring {:?} on GPUs {:?}: {e:#}", route.service, gpus);
                        replica.kill();
                        continue;
                    }
                    restored = true;
                    m::restore(&route.service, w0.elapsed().as_secs_f64());
                }
            }
            let overhead_us = t0.elapsed().as_micros() as u64;
            let s0 = Instant::now();
            match self.score(c, &replica, inputs, options, timeout).await {
                Ok(scores) if scores.len() == inputs.len() => {
                    return Ok(Served {
                        scores,
                        overhead_us,
                        exec_us: s0.elapsed().as_micros() as u64,
                        gpus,
                        restored,
                        evicted,
                    })
                }
                Ok(scores) => {
                    return Err(ServiceError::Replica(format!(
                        "{:?} returned {} scores for {} inputs",
                        route.service,
                        scores.len(),
                        inputs.len()
                    )))
                }
                Err(e) => {
                    last_err = format!(
                        "scoring on {:?} (attempt {}): {e:#}",
                        route.service,
                        attempt + 1
                    );
                    warn!(service = %route.service, error = %e, "scoring failed");
                    if replica.exited() {
                        *replica.awake.lock().expect("lock") = false;
                        *replica.healthy.lock().expect("lock") = false;
                        m::replica_crashed(&route.service);
                        continue; // a fresh replica, once
                    }
                    return Err(ServiceError::Replica(last_err));
                }
            }
        }
        Err(ServiceError::Replica(last_err))
    }

    /// Health checks: a replica whose process died is started again (asleep).
    pub async fn check_health(&self) {
        let all: Vec<Arc<Replica>> = self
            .replicas
            .lock()
            .expect("replicas lock")
            .values()
            .cloned()
            .collect();
        for r in all {
            if r.lifecycle.try_lock().is_err() {
                continue; // busy with a sleep or wake: not the moment to judge it
            }
            let ok = !r.exited() && self.get_json(&r, "/health").await.is_ok();
            *r.healthy.lock().expect("lock") = ok;
            if !ok && r.exited() {
                warn!(service = %r.service, gpus = ?r.gpus, "replica died; starting a fresh one");
                m::replica_crashed(&r.service);
                if let Err(e) = self.launch(&r.service, r.chunk).await {
                    warn!(service = %r.service, error = %e, "restarting a replica failed");
                }
            }
        }
    }

    /// What the heartbeat says.
    pub fn report(&self) -> Vec<ServiceReport> {
        let replicas = self.replicas.lock().expect("replicas lock");
        self.configs
            .values()
            .map(|c| ServiceReport {
                name: c.name.clone(),
                gpus: c.gpus,
                restore_ms: c.restore_ms,
                slots: c.slots,
                replicas: replicas
                    .iter()
                    .filter(|((s, _), _)| s == &c.name)
                    .map(|((_, chunk), r)| ReplicaReport {
                        chunk: *chunk,
                        resident: *r.awake.lock().expect("lock"),
                        healthy: *r.healthy.lock().expect("lock"),
                    })
                    .collect(),
            })
            .collect()
    }

    /// Stops every replica.
    pub fn stop_all(&self) {
        let all: Vec<Arc<Replica>> =
            std::mem::take(&mut *self.replicas.lock().expect("replicas lock"))
                .into_values()
                .collect();
        for r in all {
            r.kill();
            let _ = std::fs::remove_file(self.pid_file(r.port));
        }
    }
}

fn last_number(v: &serde_json::Value) -> Option<f64> {
    match v {
        serde_json::Value::Number(n) => n.as_f64(),
        serde_json::Value::Array(a) => a.iter().rev().find_map(last_number),
        _ => None,
    }
}
