//! `tangram up`: a local cluster, as named steps. Nothing else is started when a cluster from
//! the same state directory is up or the NATS port is taken; the state directory is laid out
//! (the server's config with per-role credentials unless `--no-auth`, the reference replica
//! and search stand-in); NATS, the schedulers, the CPU workers and (with `--gpus`) the
//! search stand-in and the GPU worker start in that order, each logging to `logs/`; what
//! started is recorded for `down` and `status` (also when a start fails, so `down` can stop
//! the rest); and `up` returns once the scheduler answers and knows every worker with its
//! warm pool filled to its floor.

use super::files::{prometheus_config, GpuProvider, GpuSection, GpuService, GpuWorkerFile};
use super::{
    alive, credentials, down_at, fetch_status, free_port, sibling, spawn, tail, Running, UpArgs,
    REPLICA_PY, SEARCH_PY, SERVER_CONF,
};
use anyhow::{bail, Context as _};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;
use tangram_nats::local::{SchedulerProcess, WorkerProcess};
use tokio::time::Instant;

/// `tangram up`.
pub fn up(a: UpArgs) -> anyhow::Result<()> {
    let mut c = Cluster::prepare(&a)?;
    let started = c.start_all(&a);
    let search_url = match started {
        Ok(s) => s,
        Err(e) => {
            let _ = c.record(None);
            let _ = down_at(&c.state);
            return Err(e);
        }
    };
    c.record(search_url.clone())?;
    c.wait_until_up(&a, search_url.as_deref())
}

/// A local cluster being started.
struct Cluster {
    state: PathBuf,
    state_abs: PathBuf,
    url: String,
    monitor_port: u16,
    /// Where the credentials are, unless `--no-auth`.
    creds: Option<PathBuf>,
    metrics_on: bool,
    nats_port: u16,
    /// Component name → metrics endpoint, in start order.
    metrics: Vec<(String, String)>,
    /// Component name → pid, in start order.
    pids: Vec<(String, u32)>,
    /// Worker ids expected to report.
    workers: Vec<String>,
    /// Each CPU worker's warm pool floor: half its ceiling, waited for before "up".
    warm_min: u32,
}

impl Cluster {
    /// Checks nothing is in the way, lays the state directory out and writes the server's
    /// config (with credentials unless `--no-auth`).
    fn prepare(a: &UpArgs) -> anyhow::Result<Self> {
        let state = a.state_dir.clone();
        refuse_a_second_cluster(a, &state)?;
        let _ = std::fs::remove_dir_all(state.join("nats"));
        for d in ["logs", "nats", "bin"] {
            std::fs::create_dir_all(state.join(d))?;
        }
        let state_abs = std::fs::canonicalize(&state)?;
        let creds = write_server_conf(a, &state, &state_abs)?;
        std::fs::write(state.join("bin/replica.py"), REPLICA_PY)?;
        std::fs::write(state.join("bin/search.py"), SEARCH_PY)?;
        let monitor_port = match a.nats_monitor_port {
            Some(p) => p,
            None if a.nats_port == 4222 => 8222,
            None => free_port()?,
        };
        Ok(Self {
            state,
            state_abs,
            url: format!("nats://127.0.0.1:{}", a.nats_port),
            monitor_port,
            creds,
            metrics_on: !a.no_metrics,
            nats_port: a.nats_port,
            metrics: Vec::new(),
            pids: Vec::new(),
            workers: Vec::new(),
            warm_min: a.warm_pool / 2,
        })
    }

    /// The environment giving `role` its credentials.
    fn seed(&self, role: &str) -> Vec<(String, String)> {
        self.creds
            .as_ref()
            .map(|d| {
                vec![(
                    "TANGRAM_NKEY_FILE".to_string(),
                    d.join(format!("{role}.nk")).display().to_string(),
                )]
            })
            .unwrap_or_default()
    }

    /// The metrics address of component `name` (none when metrics are off). Beside
    /// the default NATS port, the ports deploy/prometheus.yml scrapes: the scheduler 9464,
    /// the workers from 9476 in start order; otherwise free ones.
    fn metrics_addr(&mut self, name: &str) -> anyhow::Result<Option<String>> {
        if !self.metrics_on {
            return Ok(None);
        }
        let workers_before = self
            .metrics
            .iter()
            .filter(|(n, _)| !n.starts_with("scheduler"))
            .count();
        let port = match (self.nats_port, name) {
            (4222, "scheduler") => 9464,
            (4222, n) if !n.starts_with("scheduler") => 9476 + workers_before as u16,
            _ => free_port()?,
        };
        let addr = format!("127.0.0.1:{port}");
        self.metrics.push((name.to_string(), addr.clone()));
        Ok(Some(addr))
    }

    fn spawn(&mut self, name: &str, cmd: &mut Command) -> anyhow::Result<()> {
        let pid = spawn(&self.state, name, cmd)?;
        self.pids.push((name.to_string(), pid));
        Ok(())
    }

    /// Everything, in order; returns the search stand-in's URL when there is one.
    fn start_all(&mut self, a: &UpArgs) -> anyhow::Result<Option<String>> {
        self.start_nats(a)?;
        self.start_schedulers(a)?;
        self.start_cpu_workers(a)?;
        if a.gpus > 0 {
            let search = self.start_search(a)?;
            self.start_gpu_worker(a, &search)?;
            return Ok(Some(search));
        }
        Ok(None)
    }

    fn start_nats(&mut self, a: &UpArgs) -> anyhow::Result<()> {
        let nats = crate::nats_server::find(a.nats_server.as_ref())?;
        let conf = self.state_abs.join("server.conf");
        let store = self.state_abs.join("nats");
        let server = tangram_nats::local::LocalServer {
            bin: &nats,
            conf: &conf,
            store: &store,
            port: a.nats_port,
            monitor_port: self.monitor_port,
        };
        self.spawn("nats", &mut server.command()).with_context(|| {
            format!(
                "nats-server ({}); install it with deploy/install-tools.sh",
                nats.display()
            )
        })?;
        let up = tangram_nats::local::wait_listening(
            a.nats_port,
            Duration::from_secs(10),
            Duration::from_millis(100),
        );
        if !up {
            bail!(
                "nats-server did not start:\n{}",
                tail(&self.state.join("logs/nats.log"), 20)
            );
        }
        Ok(())
    }

    fn start_schedulers(&mut self, a: &UpArgs) -> anyhow::Result<()> {
        for i in 0..a.schedulers {
            // The first keeps the plain name (its log is logs/scheduler.log); standbys are
            // scheduler-1, scheduler-2, ...
            let name = if i == 0 {
                "scheduler".to_string()
            } else {
                format!("scheduler-{i}")
            };
            let scheduler = SchedulerProcess {
                id: Some(name.clone()),
                nats_url: Some(self.url.clone()),
                policy: Some(a.policy.clone()),
                static_cores: Some(a.static_cores),
                metrics_addr: self.metrics_addr(&name)?,
                ..Default::default()
            };
            let mut cmd = scheduler.command(&sibling("tangram-scheduler")?);
            cmd.envs(self.seed("scheduler"));
            self.spawn(&name, &mut cmd)?;
        }
        Ok(())
    }

    fn start_cpu_workers(&mut self, a: &UpArgs) -> anyhow::Result<()> {
        let online = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1);
        for i in 0..a.workers {
            let id = format!("cpu-{i}");
            let worker = WorkerProcess {
                id: Some(id.clone()),
                nats_url: Some(self.url.clone()),
                cores: Some(format!("0-{}", online - 1)),
                mem_mb: Some(a.worker_mem_mb),
                heartbeat_ms: Some(500),
                metrics_addr: self.metrics_addr(&id)?,
                ..Default::default()
            };
            let mut cmd = worker.command(&sibling("tangram-worker")?);
            cmd.envs(self.seed(&format!("worker-{id}")))
                .env("TANGRAM_WORKER_SANDBOX__WARM_POOL", a.warm_pool.to_string())
                .env(
                    "TANGRAM_WORKER_SANDBOX__WARM_POOL_MIN",
                    self.warm_min.to_string(),
                );
            self.spawn(&id, &mut cmd)?;
            self.workers.push(id);
        }
        Ok(())
    }

    /// The search stand-in (a rate-limited HTTP API the GPU worker calls); its URL.
    fn start_search(&mut self, a: &UpArgs) -> anyhow::Result<String> {
        let port = free_port()?;
        let token = format!(
            "local-{:x}",
            std::process::id() as u64 * 2_654_435_761 % 1_000_000_007
        );
        std::fs::write(self.state.join("search.key"), format!("{token}\n"))?;
        let script = self.state_abs.join("bin/search.py");
        self.spawn(
            "search",
            Command::new("python3").arg(script).args([
                "--port",
                &port.to_string(),
                "--rate",
                &a.search_rate.to_string(),
                "--burst",
                "5",
                "--token",
                &token,
            ]),
        )?;
        Ok(format!("http://127.0.0.1:{port}"))
    }

    /// The GPU worker: the reference replica for each service on declared GPUs, and the
    /// search provider.
    fn start_gpu_worker(&mut self, a: &UpArgs, search_url: &str) -> anyhow::Result<()> {
        let gpu_metrics = self.metrics_addr("gpu-0")?;
        let services: Vec<GpuService> = a
            .services
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(|s| GpuService::reference(s, &self.state_abs.join("bin/replica.py")))
            .collect();
        let file = GpuWorkerFile {
            id: "gpu-0".into(),
            nats_url: self.url.clone(),
            sandboxes: false,
            heartbeat_ms: 500,
            state_dir: self.state_abs.join("gpu-0"),
            metrics_addr: gpu_metrics,
            gpu: GpuSection {
                nvml: "auto".into(),
                count: a.gpus,
            },
            service: services,
            provider: vec![GpuProvider {
                name: "search".into(),
                base_url: search_url.to_string(),
                credential_file: self.state_abs.join("search.key"),
                rate_per_s: a.search_rate,
                burst: 5,
                concurrency: 8,
                timeout_ms: 10_000,
                allow: vec!["GET /search".into()],
            }],
        };
        let toml = toml::to_string(&file).context("writing the GPU worker's config")?;
        std::fs::write(self.state.join("gpu-0.toml"), toml)?;
        let config = self.state_abs.join("gpu-0.toml");
        // The URL as a flag too: a `TANGRAM_NATS_URL` left in the caller's shell beats the
        // file and would send this worker to another server.
        let worker = WorkerProcess {
            config: Some(config),
            nats_url: Some(self.url.clone()),
            ..Default::default()
        };
        let mut cmd = worker.command(&sibling("tangram-worker")?);
        cmd.envs(self.seed("worker-gpu-0"));
        self.spawn("gpu-0", &mut cmd)?;
        self.workers.push("gpu-0".into());
        Ok(())
    }

    /// What started, for `down` and `status`.
    fn record(&self, search_url: Option<String>) -> anyhow::Result<()> {
        let running = Running {
            nats_monitor: Some(format!("127.0.0.1:{}", self.monitor_port)),
            metrics: self.metrics.clone(),
            nats_url: self.url.clone(),
            pids: self.pids.clone(),
            workers: self.workers.clone(),
            search_url,
            creds: self.creds.clone(),
        };
        std::fs::write(
            self.state.join("running.json"),
            serde_json::to_string_pretty(&running)?,
        )?;
        Ok(())
    }

    /// Waits until the scheduler answers and knows every worker, each CPU worker's warm pool
    /// at its floor; then says what is up. A component that exits meanwhile, or the wait
    /// running out, stops the rest.
    fn wait_until_up(&self, a: &UpArgs, search_url: Option<&str>) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(a.wait_s);
        let spinner = crate::progress::Spinner::start(format!(
            "waiting for the scheduler and {} workers (with their warm sandboxes) to report",
            self.workers.len()
        ));
        loop {
            if let Some((name, _)) = self.pids.iter().find(|(_, p)| !alive(*p)) {
                let log = tail(&self.state.join("logs").join(format!("{name}.log")), 15);
                let _ = down_at(&self.state);
                bail!("{name} exited during start; its log ends with:\n{log}");
            }
            let operator = credentials(None, &Default::default(), &self.state_abs);
            if let Ok(st) = fetch_status(&self.url, &operator, Duration::from_secs(2)) {
                let seen: Vec<&str> = st.workers.iter().map(|w| w.id.as_str()).collect();
                let reported = self
                    .workers
                    .iter()
                    .filter(|w| seen.contains(&w.as_str()))
                    .count();
                spinner.set_count(reported as u64, self.workers.len() as u64);
                // A CPU worker's warm pool holds its floor before the first open comes.
                let filled = st.workers.iter().all(|w| {
                    !self.workers.contains(&w.id) || w.warm.is_none_or(|p| p.ready >= self.warm_min)
                });
                if reported == self.workers.len() && filled {
                    drop(spinner);
                    return self.say_up(a, &st, search_url);
                }
            }
            if Instant::now() > deadline {
                let _ = down_at(&self.state);
                bail!(
                    "the cluster did not come up within {} s; logs in {}",
                    a.wait_s,
                    self.state.join("logs").display()
                );
            }
            std::thread::sleep(Duration::from_millis(300));
        }
    }

    /// What is up, where, and what to try.
    fn say_up(
        &self,
        a: &UpArgs,
        st: &tangram_shared::status::Status,
        search_url: Option<&str>,
    ) -> anyhow::Result<()> {
        let seen: Vec<&str> = st.workers.iter().map(|w| w.id.as_str()).collect();
        println!(
            "tangram is up: {} (state, logs: {})",
            self.url,
            self.state.display()
        );
        println!(
            "  scheduler policy {}; workers: {}",
            st.policy,
            seen.join(", ")
        );
        if !st.services.is_empty() {
            println!(
                "  services: {}",
                st.services
                    .iter()
                    .map(|s| s.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
        if let Some(s) = search_url {
            println!("  provider search -> {s} ({} requests/s)", a.search_rate);
        }
        if !self.metrics.is_empty() {
            let prom = self.state.join("prometheus.yml");
            std::fs::write(&prom, prometheus_config(&self.metrics))?;
            println!(
                "  metrics: {} (scrape config: {})",
                self.metrics
                    .iter()
                    .map(|(n, a)| format!("{n} {a}"))
                    .collect::<Vec<_>>()
                    .join(", "),
                prom.display()
            );
        }
        println!("  try: tangram status | tangram submit open --trajectory t1 | tangram down");
        Ok(())
    }
}

/// Refuses to start over a cluster from the same state directory that is still up, or on a
/// NATS port that is taken.
fn refuse_a_second_cluster(a: &UpArgs, state: &Path) -> anyhow::Result<()> {
    if let Ok(text) = std::fs::read_to_string(state.join("running.json")) {
        if let Ok(r) = serde_json::from_str::<Running>(&text) {
            if r.pids.iter().any(|(_, p)| alive(*p)) {
                bail!(
                    "a cluster from {} is already up ({}); run `tangram down` first",
                    state.display(),
                    r.nats_url
                );
            }
        }
    }
    if std::net::TcpStream::connect(("127.0.0.1", a.nats_port)).is_ok() {
        bail!(
            "port {} is taken (another NATS server?); pass --nats-port",
            a.nats_port
        );
    }
    Ok(())
}

/// The NATS server's config: with each role's credentials and permissions, unless
/// `--no-auth`. Returns where the credentials are.
fn write_server_conf(
    a: &UpArgs,
    state: &Path,
    state_abs: &Path,
) -> anyhow::Result<Option<PathBuf>> {
    if a.no_auth {
        std::fs::write(state.join("server.conf"), SERVER_CONF)?;
        return Ok(None);
    }
    let worker_ids: Vec<String> = (0..a.workers)
        .map(|i| format!("cpu-{i}"))
        .chain((a.gpus > 0).then(|| "gpu-0".to_string()))
        .collect();
    let jobs: Vec<&str> = a
        .rollout_jobs
        .split(',')
        .map(str::trim)
        .filter(|j| !j.is_empty())
        .collect();
    let dir = state_abs.join("creds");
    let users = crate::creds::ensure(&dir, &worker_ids, &jobs)?;
    std::fs::write(
        state.join("server.conf"),
        format!(
            "{SERVER_CONF}\n{}",
            tangram_nats::auth::server_authorization(&users)
        ),
    )?;
    Ok(Some(dir))
}
