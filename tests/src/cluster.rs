//! NATS, the scheduler and workers, in this process (or as processes a test can kill).

use crate::{
    built_binary, gpu_worker_config, reference_replica_command, ChildGuard, Client, NatsServer,
};
use anyhow::Context as _;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use tokio_util::sync::CancellationToken;

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
        let process = tangram_nats::local::SchedulerProcess {
            id: Some(id.into()),
            nats_url: Some(self.nats.url()),
            ..Default::default()
        };
        let child = process
            .command(&bin)
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
        let process = tangram_nats::local::WorkerProcess {
            id: Some(w.id.clone()),
            nats_url: Some(self.nats.url()),
            cores: Some(w.cores.clone()),
            mem_mb: Some(w.mem_mb),
            heartbeat_ms: Some(200),
            sandbox_runtime: Some(w.sandbox_runtime.as_str().into()),
            ..Default::default()
        };
        let child = process
            .command(&bin)
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
