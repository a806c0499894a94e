//! Test support for Tangram's end-to-end suites.
//!
//! - [`NatsServer`]: a real `nats-server` per test on a free loopback port with a temporary
//!   store directory, killed and cleaned up on drop. A missing binary fails loudly with the
//!   install command.
//! - [`Cluster`]: NATS plus the scheduler and N workers, in process, each with its own
//!   cancellation token.
//! - [`Client`]: a minimal submitter: publish an action, wait for its result.
#![forbid(unsafe_code)]

pub mod api_server;
pub mod dockerd;
pub mod faults;
pub mod images;
pub mod prometheus;
pub mod registry;

use anyhow::{bail, Context as _};
use async_nats::jetstream;
use futures::StreamExt;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;
use tangram_shared::codec::{self, Encoding};
use tangram_shared::status::Status;
use tangram_shared::{subject, Action, ActionId, ActionResult, Heartbeat, JobId, WorkerId};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// The repository root.
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

/// The pinned nats-server installed by `deploy/install-tools.sh`.
pub fn nats_server_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("TANGRAM_NATS_SERVER") {
        return p.into();
    }
    let p = repo_root().join("tools/bin/nats-server");
    assert!(
        p.exists(),
        "nats-server not found at {}: run `bash deploy/install-tools.sh` first (it installs the pinned version)",
        p.display()
    );
    p
}

/// A binary of the workspace, built by `cargo build` (the test command builds them first).
pub fn built_binary(name: &str) -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("target"));
    let p = target.join("debug").join(name);
    assert!(
        p.exists(),
        "{} not found: run `cargo build --bins` first",
        p.display()
    );
    p
}

/// A finished command's stdout and stderr, as one text for assertions and failure messages.
pub fn output_text(out: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

pub use rustix::process::Signal;

/// Sends `signal` to process `pid` (a system call, not a `kill` child process). A process
/// already gone is an error (`ESRCH`); callers that race its exit ignore it.
pub fn signal(pid: u32, signal: Signal) -> std::io::Result<()> {
    let pid = i32::try_from(pid)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
        .ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("no such pid {pid}"),
            )
        })?;
    rustix::process::kill_process(pid, signal).map_err(std::io::Error::from)
}

/// A port free now on loopback.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// A real nats-server with JetStream, for one test.
#[derive(Debug)]
pub struct NatsServer {
    child: Option<Child>,
    port: u16,
    store: tempfile::TempDir,
    conf: PathBuf,
}

impl NatsServer {
    /// Starts a server and waits until it accepts connections.
    pub fn start() -> Self {
        Self::start_with("")
    }

    /// Starts a server whose configuration is the bundled one plus `extra` (for example
    /// an `authorization` block from [`tangram_nats::auth::server_authorization`]).
    pub fn start_with(extra: &str) -> Self {
        let store = tempfile::tempdir().expect("temp store dir");
        let conf = store.path().join("server.conf");
        let base = std::fs::read_to_string(repo_root().join("nats/server.conf"))
            .expect("the bundled server.conf");
        std::fs::write(&conf, format!("{base}\n{extra}\n")).expect("writing server.conf");
        let mut s = Self {
            child: None,
            port: free_port(),
            store,
            conf,
        };
        s.spawn();
        s
    }

    fn spawn(&mut self) {
        let bin = nats_server_bin();
        let store = self.store.path().join("js");
        let server = tangram_nats::local::LocalServer {
            bin: &bin,
            conf: &self.conf,
            store: &store,
            port: self.port,
            monitor_port: free_port(),
        };
        let child = server
            .command()
            .stdout(Stdio::null())
            // TANGRAM_TEST_NATS_LOG=1 shows the server's log (permission violations...).
            .stderr(if std::env::var_os("TANGRAM_TEST_NATS_LOG").is_some() {
                Stdio::inherit()
            } else {
                Stdio::null()
            })
            .spawn()
            .expect("spawning nats-server");
        self.child = Some(child);
        assert!(
            tangram_nats::local::wait_listening(
                self.port,
                Duration::from_secs(10),
                Duration::from_millis(20)
            ),
            "nats-server did not start on port {}",
            self.port
        );
    }

    /// The server's process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The client port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The client URL.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// Stops and starts the server on the same port and store.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// Kills the server (SIGKILL).
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A child process that is killed when the guard drops (a failing test leaves nothing behind).
#[derive(Debug)]
pub struct ChildGuard(pub Child);

impl std::ops::Deref for ChildGuard {
    type Target = Child;
    fn deref(&self) -> &Child {
        &self.0
    }
}

impl std::ops::DerefMut for ChildGuard {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.0
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// Options for a worker in a test cluster.
#[derive(Debug, Clone)]
pub struct WorkerSpec {
    /// Worker id.
    pub id: String,
    /// Cores, as a cpuset list.
    pub cores: String,
    /// Memory for sandboxes, MiB.
    pub mem_mb: u64,
    /// `cgroup` or `docker` grants.
    pub grant_mode: tangram_worker::config::GrantMode,
    /// What runs the sandboxes (`noop` only in benchmarks and the tests of it).
    pub sandbox_runtime: tangram_worker::sandbox::RuntimeKind,
}

impl WorkerSpec {
    /// A worker granting cores 0-1 (this machine's two), 4 GiB.
    pub fn new(id: &str) -> Self {
        Self {
            id: id.into(),
            cores: "0-1".into(),
            mem_mb: 4096,
            grant_mode: tangram_worker::config::GrantMode::Cgroup,
            sandbox_runtime: tangram_worker::sandbox::RuntimeKind::Docker,
        }
    }
}

/// The reference replica's command for a service, small enough for tests: a 4,096-row
/// embedding table `dim` wide (wider scores more slowly).
pub fn reference_replica_command(dim: u32) -> Vec<String> {
    let script = repo_root().join("services/reference-replica/replica.py");
    replica_argv(script.to_str().expect("utf-8 path"), dim)
}

/// `python3 SCRIPT --service {service} --port {port} --vocab 4096 --dim DIM`.
pub fn replica_argv(script: &str, dim: u32) -> Vec<String> {
    let dim = dim.to_string();
    [
        "python3",
        script,
        "--service",
        "{service}",
        "--port",
        "{port}",
        "--vocab",
        "4096",
        "--dim",
        &dim,
    ]
    .into_iter()
    .map(String::from)
    .collect()
}

/// A GPU worker's validated config: declared GPUs, reference replicas, no sandboxes.
pub fn gpu_worker_config(
    id: &str,
    nats_url: &str,
    gpus: u32,
    services: &[&str],
    state_dir: &Path,
) -> anyhow::Result<tangram_worker::Config> {
    use tangram_worker::services::{Driver, ServiceConfig};
    let raw = tangram_worker::config::RawConfig {
        id: Some(id.into()),
        nats_url: Some(nats_url.into()),
        heartbeat_ms: Some(200),
        shutdown_grace_ms: Some(2000),
        sandboxes: Some(false),
        state_dir: Some(state_dir.display().to_string()),
        gpu: Some(tangram_worker::config::RawGpu {
            nvml: Some(tangram_worker::gpu::NvmlMode::Off),
            groups: None,
            count: Some(gpus),
        }),
        service: Some(
            services
                .iter()
                .map(|name| ServiceConfig {
                    name: name.to_string(),
                    driver: Driver::Reference,
                    command: reference_replica_command(16),
                    image: None,
                    args: Vec::new(),
                    mounts: Vec::new(),
                    gpus: 1,
                    host_mem_mb: 1,
                    restore_ms: 50,
                    slots: 1,
                    start_timeout_ms: 30_000,
                    model: None,
                    env: Default::default(),
                })
                .collect(),
        ),
        ..Default::default()
    };
    Ok(raw.validate()?)
}

/// Pids of reference replica processes serving `service`.
pub fn replica_pids(service: &str) -> Vec<u32> {
    let out = Command::new("pgrep")
        .args(["-f", &format!("replica.py --service {service} ")])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    out.lines().filter_map(|l| l.trim().parse().ok()).collect()
}

/// NATS, the scheduler and workers, in this process.
#[derive(Debug)]
pub struct Cluster {
    /// The server.
    pub nats: NatsServer,
    /// Where the role seeds are, when the server requires credentials.
    pub creds: Option<PathBuf>,
    scheduler: Option<(
        CancellationToken,
        tokio::task::JoinHandle<anyhow::Result<()>>,
    )>,
    /// The scheduler's policy, when not the default.
    policy: Option<String>,
    workers: Vec<(
        String,
        CancellationToken,
        tokio::task::JoinHandle<anyhow::Result<()>>,
    )>,
}

/// Turns on test logging once (`RUST_LOG` selects).
pub fn init_logging() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_test_writer()
        .try_init();
}

impl Cluster {
    /// Starts NATS, the scheduler and the workers, and waits until the scheduler knows
    /// every worker.
    pub async fn start(workers: &[WorkerSpec]) -> anyhow::Result<Self> {
        Self::start_running(workers, None).await
    }

    /// [`Cluster::start`] with the scheduler running `policy`.
    pub async fn start_with_policy(workers: &[WorkerSpec], policy: &str) -> anyhow::Result<Self> {
        Self::start_running(workers, Some(policy.into())).await
    }

    async fn start_running(workers: &[WorkerSpec], policy: Option<String>) -> anyhow::Result<Self> {
        init_logging();
        let nats = NatsServer::start();
        let mut cluster = Self {
            nats,
            creds: None,
            scheduler: None,
            policy,
            workers: Vec::new(),
        };
        cluster.start_scheduler();
        for w in workers {
            cluster.start_worker(w.clone())?;
        }
        Ok(cluster)
    }

    /// Starts NATS with users and permissions (operator, scheduler, rollout, one
    /// `rollout-<job>` per job, one `worker-<id>` per worker), then the scheduler and the
    /// workers with their own seeds, as `tangram up` does. Seeds are in [`Cluster::creds`].
    pub async fn start_secured(workers: &[WorkerSpec], jobs: &[&str]) -> anyhow::Result<Self> {
        Self::start_secured_with(workers, &[], jobs).await
    }

    /// [`Cluster::start_secured`] with credentials for more workers, started later (GPU and
    /// API workers).
    pub async fn start_secured_with(
        workers: &[WorkerSpec],
        more_workers: &[&str],
        jobs: &[&str],
    ) -> anyhow::Result<Self> {
        use tangram_nats::auth::{server_authorization, Role, User};
        init_logging();
        let dir = tempfile::tempdir()?.keep();
        let mut roles = vec![Role::Operator, Role::Scheduler, Role::Rollout];
        roles.extend(jobs.iter().map(|j| Role::RolloutOf(j.to_string())));
        roles.extend(workers.iter().map(|w| Role::Worker(w.id.clone())));
        roles.extend(more_workers.iter().map(|w| Role::Worker(w.to_string())));
        let users: Vec<User> = roles.into_iter().map(User::generate).collect();
        for u in &users {
            std::fs::write(dir.join(format!("{}.nk", u.role.name())), &u.seed)?;
        }
        let mut cluster = Self {
            nats: NatsServer::start_with(&server_authorization(&users)),
            creds: Some(dir),
            scheduler: None,
            policy: None,
            workers: Vec::new(),
        };
        cluster.start_scheduler();
        for w in workers {
            cluster.start_worker(w.clone())?;
        }
        Ok(cluster)
    }

    /// Credentials of a role (`operator`, `scheduler`, `rollout-<job>`...) of a secured
    /// cluster; none for an open one.
    pub fn credentials(&self, role: &str) -> tangram_nats::auth::Credentials {
        match &self.creds {
            Some(d) => {
                tangram_nats::auth::Credentials::from_seed_file(d.join(format!("{role}.nk")))
            }
            None => Default::default(),
        }
    }

    /// Starts NATS and the workers with no scheduler (a test starts scheduler processes).
    pub async fn start_without_scheduler(workers: &[WorkerSpec]) -> anyhow::Result<Self> {
        init_logging();
        let mut cluster = Self {
            nats: NatsServer::start(),
            creds: None,
            scheduler: None,
            policy: None,
            workers: Vec::new(),
        };
        for w in workers {
            cluster.start_worker(w.clone())?;
        }
        Ok(cluster)
    }

    /// Starts a `tangram-scheduler` process with this id, so that a test can SIGKILL it.
    pub fn spawn_scheduler_process(&self, id: &str) -> anyhow::Result<ChildGuard> {
        let bin = built_binary("tangram-scheduler");
        let child = Command::new(&bin)
            .args(["--id", id, "--nats-url", &self.nats.url()])
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .with_context(|| format!("spawning {}", bin.display()))?;
        Ok(ChildGuard(child))
    }

    /// Starts the scheduler.
    pub fn start_scheduler(&mut self) {
        let mut config = tangram_scheduler::Config::with_nats_url(self.nats.url());
        if let Some(p) = &self.policy {
            config.policy = p.clone();
        }
        self.start_scheduler_config(config);
    }

    /// Starts the scheduler with this configuration (its credentials set here).
    pub fn start_scheduler_config(&mut self, mut config: tangram_scheduler::Config) {
        config.credentials = self.credentials("scheduler");
        let token = CancellationToken::new();
        let handle = tokio::spawn(tangram_scheduler::run(config, token.clone()));
        self.scheduler = Some((token, handle));
    }

    /// Stops the scheduler gracefully and waits for it.
    pub async fn stop_scheduler(&mut self) -> anyhow::Result<()> {
        if let Some((token, handle)) = self.scheduler.take() {
            token.cancel();
            handle.await??;
        }
        Ok(())
    }

    /// Starts a worker.
    pub fn start_worker(&mut self, w: WorkerSpec) -> anyhow::Result<()> {
        let raw = tangram_worker::config::RawConfig {
            id: Some(w.id.clone()),
            nats_url: Some(self.nats.url()),
            cores: Some(w.cores),
            mem_mb: Some(w.mem_mb),
            grant_mode: Some(w.grant_mode),
            sandbox_runtime: Some(w.sandbox_runtime),
            heartbeat_ms: Some(200),
            shutdown_grace_ms: Some(2000),
            ..Default::default()
        };
        let mut config = raw.validate()?;
        config.credentials = self.credentials(&format!("worker-{}", w.id));
        let token = CancellationToken::new();
        let handle = tokio::spawn(tangram_worker::run(config, token.clone()));
        self.workers.push((w.id, token, handle));
        Ok(())
    }

    /// Starts a GPU worker (no sandboxes) that declares `gpus` GPUs (one NVLink group) and
    /// serves `services` (1 GPU, one request at a time each) with the reference replica.
    pub fn start_gpu_worker(
        &mut self,
        id: &str,
        gpus: u32,
        services: &[&str],
        state_dir: &Path,
    ) -> anyhow::Result<()> {
        self.start_gpu_worker_dim(id, gpus, services, state_dir, 16)
    }

    /// [`Cluster::start_gpu_worker`] with the scoring model's embedding width (wider is slower).
    pub fn start_gpu_worker_dim(
        &mut self,
        id: &str,
        gpus: u32,
        services: &[&str],
        state_dir: &Path,
        dim: u32,
    ) -> anyhow::Result<()> {
        let mut config = gpu_worker_config(id, &self.nats.url(), gpus, services, state_dir)?;
        config.credentials = self.credentials(&format!("worker-{id}"));
        for s in &mut config.services {
            s.command = reference_replica_command(dim);
        }
        let token = CancellationToken::new();
        let handle = tokio::spawn(tangram_worker::run(config, token.clone()));
        self.workers.push((id.to_string(), token, handle));
        Ok(())
    }

    /// Starts a worker from a validated config (a test that edits one, e.g. from
    /// [`gpu_worker_config`]).
    /// Starts CPU worker `id` with these `[sandbox]` settings: cores 0-1, 4 GiB, 200 ms
    /// heartbeats, its own credentials.
    pub fn start_sandbox_worker(
        &mut self,
        id: &str,
        sandbox: tangram_worker::config::RawSandbox,
    ) -> anyhow::Result<()> {
        let raw = tangram_worker::config::RawConfig {
            id: Some(id.into()),
            nats_url: Some(self.nats.url()),
            cores: Some("0-1".into()),
            mem_mb: Some(4096),
            heartbeat_ms: Some(200),
            shutdown_grace_ms: Some(2000),
            sandbox: Some(sandbox),
            ..Default::default()
        };
        let mut config = raw.validate()?;
        config.credentials = self.credentials(&format!("worker-{id}"));
        self.start_worker_config(config);
        Ok(())
    }

    /// Starts a worker with this configuration.
    pub fn start_worker_config(&mut self, config: tangram_worker::Config) {
        let id = config.id.to_string();
        let token = CancellationToken::new();
        let handle = tokio::spawn(tangram_worker::run(config, token.clone()));
        self.workers.push((id, token, handle));
    }

    /// Starts a worker that runs no sandboxes and calls the given external API providers.
    pub fn start_api_worker(
        &mut self,
        id: &str,
        providers: Vec<tangram_worker::providers::ProviderConfig>,
    ) -> anyhow::Result<()> {
        let raw = tangram_worker::config::RawConfig {
            id: Some(id.into()),
            nats_url: Some(self.nats.url()),
            heartbeat_ms: Some(200),
            shutdown_grace_ms: Some(2000),
            sandboxes: Some(false),
            provider: Some(providers),
            ..Default::default()
        };
        let mut config = raw.validate()?;
        config.credentials = self.credentials(&format!("worker-{id}"));
        let token = CancellationToken::new();
        let handle = tokio::spawn(tangram_worker::run(config, token.clone()));
        self.workers.push((id.to_string(), token, handle));
        Ok(())
    }

    /// Starts the scheduler with its config changed by `edit` (stops any running one first).
    pub async fn restart_scheduler_with(
        &mut self,
        edit: impl FnOnce(&mut tangram_scheduler::Config),
    ) -> anyhow::Result<()> {
        self.stop_scheduler().await?;
        let mut config = tangram_scheduler::Config::with_nats_url(self.nats.url());
        edit(&mut config);
        let token = CancellationToken::new();
        let handle = tokio::spawn(tangram_scheduler::run(config, token.clone()));
        self.scheduler = Some((token, handle));
        Ok(())
    }

    /// Stops one worker gracefully and waits for it.
    pub async fn stop_worker(&mut self, id: &str) -> anyhow::Result<()> {
        let pos = self
            .workers
            .iter()
            .position(|(w, _, _)| w == id)
            .context("no such worker")?;
        let (_, token, handle) = self.workers.remove(pos);
        token.cancel();
        handle.await??;
        Ok(())
    }

    /// Starts a worker as a separate `tangram-worker` process, so that a test can kill it
    /// with SIGKILL the way a crash would.
    pub fn spawn_worker_process(&self, w: &WorkerSpec) -> anyhow::Result<ChildGuard> {
        let bin = built_binary("tangram-worker");
        let child = Command::new(&bin)
            .args([
                "--id",
                &w.id,
                "--nats-url",
                &self.nats.url(),
                "--cores",
                &w.cores,
            ])
            .args(["--mem-mb", &w.mem_mb.to_string(), "--heartbeat-ms", "200"])
            .args(["--sandbox-runtime", w.sandbox_runtime.as_str()])
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .with_context(|| format!("spawning {}", bin.display()))?;
        Ok(ChildGuard(child))
    }

    /// A client for `job`.
    pub async fn client(&self, job: &str) -> anyhow::Result<Client> {
        Client::connect_with(&self.nats.url(), job, &self.credentials("operator")).await
    }

    /// Stops everything, workers first (they remove their sandboxes).
    pub async fn shutdown(mut self) -> anyhow::Result<()> {
        for (_, token, handle) in self.workers.drain(..) {
            token.cancel();
            handle.await??;
        }
        if let Some((token, handle)) = self.scheduler.take() {
            token.cancel();
            handle.await??;
        }
        Ok(())
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for (_, token, _) in &self.workers {
            token.cancel();
        }
        if let Some((token, _)) = &self.scheduler {
            token.cancel();
        }
    }
}

/// A minimal submitter.
#[derive(Debug, Clone)]
pub struct Client {
    /// The NATS client.
    pub nats: async_nats::Client,
    /// JetStream.
    pub js: jetstream::Context,
    /// The job.
    pub job: JobId,
}

impl Client {
    /// Connects (no credentials) and makes sure the streams exist.
    pub async fn connect(url: &str, job: &str) -> anyhow::Result<Self> {
        Self::connect_with(url, job, &tangram_nats::auth::Credentials::default()).await
    }

    /// Connects with credentials; creates the streams only where they are missing (a
    /// rollout may not administer streams, and need not when the scheduler is up).
    pub async fn connect_with(
        url: &str,
        job: &str,
        creds: &tangram_nats::auth::Credentials,
    ) -> anyhow::Result<Self> {
        let nats = tangram_nats::auth::connect(url, "tangram-test-client", creds).await?;
        let js = jetstream::new(nats.clone());
        if creds.nkey_file.is_none() {
            tangram_nats::ensure_streams_exist(&js).await?;
        } else {
            // Only the scheduler (or an operator) may create streams: wait for them.
            let deadline = Instant::now() + Duration::from_secs(30);
            while js.get_stream(subject::RESULTS_STREAM).await.is_err()
                || js.get_stream(subject::ACTIONS_STREAM).await.is_err()
            {
                if Instant::now() > deadline {
                    bail!("the streams do not exist (is the scheduler up?)");
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        Ok(Self {
            nats,
            js,
            job: JobId::new(job)?,
        })
    }

    /// Publishes an action (msgpack, `Nats-Msg-Id` = id) and waits for the JetStream ack.
    pub async fn submit(&self, action: &Action) -> anyhow::Result<()> {
        let bytes = codec::encode(action, Encoding::Msgpack)?;
        self.publish_raw(
            &subject::action(&action.job, action.kind()),
            Some(action.id.as_str()),
            None,
            bytes,
        )
        .await
    }

    /// Publishes raw bytes with optional headers.
    pub async fn publish_raw(
        &self,
        subject: &str,
        msg_id: Option<&str>,
        content_type: Option<&str>,
        payload: Vec<u8>,
    ) -> anyhow::Result<()> {
        let mut headers = async_nats::HeaderMap::new();
        if let Some(id) = msg_id {
            headers.insert(subject::HEADER_MSG_ID, id);
        }
        if let Some(ct) = content_type {
            headers.insert(subject::HEADER_CONTENT_TYPE, ct);
        }
        self.js
            .publish_with_headers(subject.to_string(), headers, payload.into())
            .await?
            .await?;
        Ok(())
    }

    /// Waits for the result of `id` (read from the persisted result stream).
    pub async fn result(&self, id: &ActionId, timeout: Duration) -> anyhow::Result<ActionResult> {
        // Listen first, then look for one already stored (a direct get names the subject, so
        // it works with one job's rollout credentials), then wait.
        let subject = subject::result(&self.job, id);
        let mut sub = self.nats.subscribe(subject.clone()).await?;
        let decode = |headers: Option<&async_nats::HeaderMap>, payload: &[u8]| {
            let enc = Encoding::from_content_type(
                headers
                    .and_then(|h| h.get(subject::HEADER_CONTENT_TYPE))
                    .map(|v| v.as_str()),
            )?;
            anyhow::Ok(codec::decode::<ActionResult>(payload, enc)?)
        };
        let stream =
            tokio::time::timeout(timeout, self.js.get_stream_no_info(subject::RESULTS_STREAM))
                .await
                .with_context(|| format!("no result for {id} within {timeout:?}"))??;
        // A direct get can fail under load (a timeout): ask again every half second while
        // waiting, so a result stored before the subscription took effect is not missed.
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if let Ok(m) = stream.direct_get_last_for_subject(subject.clone()).await {
                return decode(Some(&m.headers), &m.payload);
            }
            let wait = deadline
                .saturating_duration_since(tokio::time::Instant::now())
                .min(Duration::from_millis(500));
            match tokio::time::timeout(wait, sub.next()).await {
                Ok(Some(m)) => return decode(m.headers.as_ref(), &m.payload),
                Ok(None) => bail!("result subscription closed"),
                Err(_) if tokio::time::Instant::now() < deadline => continue,
                Err(_) => bail!("no result for {id} within {timeout:?}"),
            }
        }
    }

    /// Waits until `n` results for `id` arrived, or `timeout`; returns what arrived.
    pub async fn results(
        &self,
        id: &ActionId,
        n: usize,
        timeout: Duration,
    ) -> anyhow::Result<Vec<ActionResult>> {
        let stream = self.js.get_stream(subject::RESULTS_STREAM).await?;
        let consumer = stream
            .create_consumer(jetstream::consumer::pull::OrderedConfig {
                filter_subject: subject::result(&self.job, id),
                ..Default::default()
            })
            .await?;
        let mut messages = consumer.messages().await?;
        let mut out = Vec::new();
        let deadline = tokio::time::Instant::now() + timeout;
        while out.len() < n {
            match tokio::time::timeout_at(deadline, messages.next()).await {
                Ok(Some(Ok(m))) => {
                    let enc = Encoding::from_content_type(
                        m.headers
                            .as_ref()
                            .and_then(|h| h.get(subject::HEADER_CONTENT_TYPE))
                            .map(|v| v.as_str()),
                    )?;
                    out.push(codec::decode(&m.payload, enc)?);
                }
                Ok(Some(Err(e))) => bail!("reading results: {e}"),
                Ok(None) => break,
                Err(_) if out.is_empty() && n == 1 => {
                    bail!("no result for {id} within {timeout:?}")
                }
                Err(_) => break,
            }
        }
        Ok(out)
    }

    /// Submits and waits.
    pub async fn run(&self, action: &Action, timeout: Duration) -> anyhow::Result<ActionResult> {
        self.submit(action).await?;
        self.result(&action.id, timeout).await
    }

    /// The leader lease as stored now, if any.
    pub async fn leader(&self) -> anyhow::Result<Option<tangram_shared::status::LeaderRecord>> {
        let Ok(store) = self.js.get_key_value(subject::SCHEDULER_BUCKET).await else {
            return Ok(None);
        };
        Ok(match store.entry(subject::LEADER_KEY).await? {
            Some(e) if e.operation == jetstream::kv::Operation::Put => {
                Some(serde_json::from_slice(&e.value)?)
            }
            _ => None,
        })
    }

    /// Waits until the scheduler with this id holds the leader lease with an epoch set.
    pub async fn wait_for_leader(
        &self,
        id: &str,
        timeout: Duration,
    ) -> anyhow::Result<tangram_shared::status::LeaderRecord> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(l) = self.leader().await? {
                if l.id == id && l.epoch > 0 {
                    return Ok(l);
                }
            }
            if Instant::now() > deadline {
                bail!("{id} did not become leader within {timeout:?}");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits until `n` workers are registered with the scheduler, by submitting nothing:
    /// watches heartbeats instead.
    pub async fn wait_for_workers(&self, ids: &[&str], timeout: Duration) -> anyhow::Result<()> {
        let mut sub = self.nats.subscribe(subject::HEARTBEAT_ALL).await?;
        let mut seen = std::collections::BTreeSet::new();
        let deadline = tokio::time::Instant::now() + timeout;
        while seen.len() < ids.len() {
            let msg = tokio::time::timeout_at(deadline, sub.next())
                .await
                .context("workers did not heartbeat")?;
            let Some(msg) = msg else {
                bail!("heartbeat subscription closed")
            };
            let hb: Heartbeat = codec::decode(&msg.payload, Encoding::Msgpack)?;
            if ids.contains(&hb.worker.as_str()) {
                seen.insert(hb.worker.0.clone());
            }
        }
        Ok(())
    }

    /// Waits until the scheduler answers its status and lists every worker in `ids`: until
    /// then, actions already queued may be placed on the workers it knows so far.
    pub async fn wait_for_scheduler_to_know(
        &self,
        ids: &[&str],
        timeout: Duration,
    ) -> anyhow::Result<()> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if let Ok(st) = self.status().await {
                if ids.iter().all(|id| st.workers.iter().any(|w| w.id == *id)) {
                    return Ok(());
                }
            }
            if tokio::time::Instant::now() >= deadline {
                bail!("the scheduler did not list workers {ids:?} within {timeout:?}");
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Dead-letter records in the stream now, as (code header, reason header) pairs.
    pub async fn dead_letters(&self) -> anyhow::Result<Vec<(String, String)>> {
        let mut stream = self.js.get_stream(subject::DEADLETTER_STREAM).await?;
        let held = stream.info().await?.state.messages as usize;
        let mut out = Vec::with_capacity(held);
        if held == 0 {
            return Ok(out);
        }
        let consumer = stream
            .create_consumer(jetstream::consumer::pull::OrderedConfig::default())
            .await?;
        let mut messages = consumer.messages().await?;
        while out.len() < held {
            let m = tokio::time::timeout(Duration::from_secs(10), messages.next())
                .await
                .context("reading the dead-letter stream back")?
                .context("the dead-letter stream ended")?
                .map_err(|e| anyhow::anyhow!("reading dead letters: {e}"))?;
            let h = m.headers.clone().unwrap_or_default();
            let get = |k: &str| h.get(k).map(|v| v.as_str().to_string()).unwrap_or_default();
            out.push((
                get(subject::HEADER_DLQ_CODE),
                get(subject::HEADER_DLQ_REASON),
            ));
        }
        Ok(out)
    }

    /// Dead-letter records once `ready` holds for them (a rejection's record may land just
    /// after its result); fails after `timeout` with what the stream held.
    pub async fn dead_letters_once(
        &self,
        timeout: Duration,
        ready: impl Fn(&[(String, String)]) -> bool,
    ) -> anyhow::Result<Vec<(String, String)>> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let dl = self.dead_letters().await?;
            if ready(&dl) {
                return Ok(dl);
            }
            if tokio::time::Instant::now() >= deadline {
                bail!("dead letters still not as expected after {timeout:?}: {dl:?}");
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// The scheduler's status report (`tangram.v1.status`).
    pub async fn status(&self) -> anyhow::Result<Status> {
        Ok(
            tangram_nats::status::fetch(&self.nats, Duration::from_secs(5))
                .await?
                .status,
        )
    }

    /// Waits until the scheduler's status satisfies `ready` and returns it; fails after
    /// `timeout`, naming `what` and showing the last status.
    pub async fn wait_for_status(
        &self,
        timeout: Duration,
        what: &str,
        ready: impl Fn(&Status) -> bool,
    ) -> anyhow::Result<Status> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let last = self.status().await;
            match last {
                Ok(st) if ready(&st) => return Ok(st),
                _ => {}
            }
            if tokio::time::Instant::now() >= deadline {
                bail!("{what}: not within {timeout:?}; last status {last:?}");
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Waits for a heartbeat satisfying `ready` and returns it.
    pub async fn wait_for_heartbeat(
        &self,
        timeout: Duration,
        what: &str,
        ready: impl Fn(&Heartbeat) -> bool,
    ) -> anyhow::Result<Heartbeat> {
        let mut sub = self.nats.subscribe(subject::HEARTBEAT_ALL).await?;
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let msg = tokio::time::timeout_at(deadline, sub.next())
                .await
                .with_context(|| format!("{what}: no such heartbeat within {timeout:?}"))?
                .context("heartbeat subscription closed")?;
            let hb: Heartbeat = codec::decode(&msg.payload, Encoding::Msgpack)?;
            if ready(&hb) {
                return Ok(hb);
            }
        }
    }

    /// Waits until `worker` reports action `id` among those it is running.
    pub async fn wait_until_running(
        &self,
        worker: &str,
        id: &ActionId,
        timeout: Duration,
    ) -> anyhow::Result<Heartbeat> {
        self.wait_for_heartbeat(timeout, &format!("{worker} running {id}"), |hb| {
            hb.worker.as_str() == worker && hb.running.contains(id)
        })
        .await
    }
}

/// Builds actions tersely.
pub mod build {
    use super::*;
    use std::collections::BTreeMap;
    use tangram_shared::{
        ActionSpec, CpuRange, SandboxClose, SandboxExec, SandboxOpen, TrajectoryId,
    };

    fn action(id: &str, job: &str, traj: &str, spec: ActionSpec) -> Action {
        Action {
            id: ActionId::new(id).expect("id"),
            job: JobId::new(job).expect("job"),
            trajectory: TrajectoryId::new(traj).expect("trajectory"),
            timeout_ms: 30_000,
            spec,
        }
    }
    /// `sandbox_open` with defaults.
    pub fn open(id: &str, job: &str, traj: &str) -> Action {
        action(
            id,
            job,
            traj,
            ActionSpec::SandboxOpen(SandboxOpen::default()),
        )
    }
    /// `sandbox_exec` of argv with cores [min, max].
    pub fn exec(id: &str, job: &str, traj: &str, argv: &[&str], min: u32, max: u32) -> Action {
        action(
            id,
            job,
            traj,
            ActionSpec::SandboxExec(SandboxExec {
                argv: argv.iter().map(|s| s.to_string()).collect(),
                cpus: CpuRange { min, max },
                files: BTreeMap::new(),
                env: BTreeMap::new(),
                stdin: None,
            }),
        )
    }
    /// `reward` on `service`.
    pub fn reward(id: &str, job: &str, traj: &str, service: &str, inputs: &[&str]) -> Action {
        action(
            id,
            job,
            traj,
            ActionSpec::Reward(tangram_shared::Reward {
                service: service.into(),
                inputs: inputs.iter().map(|s| s.to_string()).collect(),
                options: BTreeMap::new(),
            }),
        )
    }
    /// `api` GET of `path` on `provider`, with `job=<job>` in the query.
    pub fn api(id: &str, job: &str, traj: &str, provider: &str, path: &str) -> Action {
        action(
            id,
            job,
            traj,
            ActionSpec::Api(tangram_shared::Api {
                provider: provider.into(),
                method: "GET".into(),
                path: path.into(),
                query: BTreeMap::from([("job".to_string(), job.to_string())]),
                body: None,
                headers: BTreeMap::new(),
            }),
        )
    }
    /// `sandbox_close`.
    pub fn close(id: &str, job: &str, traj: &str) -> Action {
        action(id, job, traj, ActionSpec::SandboxClose(SandboxClose {}))
    }
    /// A worker id.
    pub fn worker(id: &str) -> WorkerId {
        WorkerId::new(id).expect("worker id")
    }
}

/// How often the waits below look again.
const POLL: Duration = Duration::from_millis(50);

/// Polls `check` until it holds or `timeout` passes; returns whether it held. For state that
/// settles asynchronously (a restarted worker removing leftovers), never as a sleep.
pub async fn eventually(timeout: Duration, mut check: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if check() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Counts containers labelled for `worker`.
pub fn containers_of(worker: &str) -> usize {
    let out = Command::new("docker")
        .args([
            "ps",
            "-aq",
            "--filter",
            &format!("label=tangram.worker={worker}"),
        ])
        .output()
        .expect("docker ps");
    String::from_utf8_lossy(&out.stdout).lines().count()
}
