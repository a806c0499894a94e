//! The processes of one fleet-bench cluster: nats-server, a leader and a standby scheduler,
//! and worker processes each running many workers on the `noop` runtime. Killed when dropped.

use crate::pipeline::{server_conf, Proc};
use anyhow::{bail, Context as _};
use std::path::Path;
use std::process::Command;
use std::time::Duration;
use tangram_nats::local::{SchedulerProcess, WorkerProcess};
use tokio::time::Instant;

mod services;

/// Workers one worker process hosts, at most.
const WORKERS_PER_PROCESS: u32 = 100;
/// The two schedulers' ids.
pub const SCHEDULERS: [&str; 2] = ["fleet-sched-a", "fleet-sched-b"];

/// What a cluster is started with.
#[derive(Debug, Clone)]
pub struct Shape {
    /// Workers in all.
    pub workers: u32,
    /// Cores each worker declares.
    pub cores: u32,
    /// Memory each worker declares, MiB.
    pub mem_mb: u64,
    /// Heartbeat period of every worker, ms.
    pub heartbeat_ms: u64,
    /// Scheduler groups, each a NATS account of its own with a leader, a standby and its
    /// share of the workers (1: no accounts).
    pub groups: u32,
    /// `always` or `default`.
    pub sync: String,
    /// Every process connects as its own role (the secured default: per-role nkeys, each
    /// worker its own); false: no authentication at all.
    pub auth: bool,
    /// Reward replicas and an api provider: each group gets a GPU worker with this many
    /// declared GPUs serving the `rm` reward service (the reference replica), and the
    /// `search` provider (a rate-limited stand-in) at `api_rate` a second; 0: none.
    pub gpus: u32,
    /// The `search` provider's fleet-wide quota, requests a second.
    pub api_rate: f64,
}

/// The reward service the GPU workers serve.
pub const REWARD_SERVICE: &str = "rm";
/// The api provider the GPU workers call.
pub const API_PROVIDER: &str = "search";

/// A running cluster, in a temporary directory.
#[derive(Debug)]
pub struct Cluster {
    // Dropped in order: workers, schedulers, helper services, then the server.
    workers: Vec<Proc>,
    schedulers: Vec<(String, Option<Proc>)>,
    services: Vec<Proc>,
    nats: Option<Proc>,
    pub url: String,
    /// Worker ids, in the order they were made.
    pub worker_ids: Vec<String>,
    /// The scheduler groups: one unless the shape asks for more.
    pub groups: Vec<Group>,
    dir: tempfile::TempDir,
}

/// One scheduler group: its NATS account's users, its schedulers and its workers. Groups share
/// nothing but the server; each account has its own subjects, streams and bucket.
#[derive(Debug, Clone, Default)]
pub struct Group {
    /// Where its users' seeds are, one `<role>.nk` a role as `tangram creds` writes them
    /// (none on a cluster without authentication).
    pub creds: Option<std::path::PathBuf>,
    /// Its schedulers' ids.
    pub schedulers: Vec<String>,
    /// Its workers' ids (the GPU worker's included).
    pub worker_ids: Vec<String>,
    /// Its worker processes' ids.
    pub worker_pids: Vec<u32>,
    /// Its GPU worker, when the shape has one.
    pub gpu_worker: Option<String>,
}

impl Group {
    /// The seed file of `role` (`operator`, `scheduler`, `rollout-<job>`, `worker-<id>`).
    pub fn seed(&self, role: &str) -> Option<std::path::PathBuf> {
        self.creds.as_ref().map(|d| d.join(format!("{role}.nk")))
    }
}

/// The `noop` worker processes of a group: (process id prefix, its workers' ids).
fn plan_processes(shape: &Shape, groups: u32) -> Vec<Vec<(String, Vec<String>)>> {
    let mut left = shape.workers;
    let mut k = 0;
    (0..groups)
        .map(|g| {
            // This group's share of the workers (the first groups take any remainder).
            let share = shape.workers / groups + u32::from(g < shape.workers % groups);
            let mut mine = share.min(left);
            left -= mine;
            let mut out = Vec::new();
            while mine > 0 {
                let n = mine.min(WORKERS_PER_PROCESS);
                let prefix = format!("fw{k:02}");
                let ids = (0..n).map(|i| format!("{prefix}-{i:04}")).collect();
                out.push((prefix, ids));
                mine -= n;
                k += 1;
            }
            out
        })
        .collect()
}

impl Cluster {
    /// Starts the server, both schedulers and the workers of every group (and the reward
    /// and api stand-ins); returns once the server listens.
    pub fn start(nats: &Path, shape: &Shape) -> anyhow::Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("tangram-fleet-")
            .tempdir()?;
        let d = dir.path().to_path_buf();
        std::fs::create_dir_all(d.join("store"))?;
        let groups = shape.groups.max(1);
        if groups > 1 && !shape.auth {
            bail!("scheduler groups are NATS accounts, which need users: drop --no-auth");
        }
        let plans = plan_processes(shape, groups);
        let gpu_id = |g: usize| {
            if groups > 1 {
                format!("gpu-g{g}")
            } else {
                "gpu-0".into()
            }
        };
        let mut conf = server_conf(&shape.sync)?;
        let mut group_list = vec![Group::default(); groups as usize];
        if shape.auth {
            let mut accounts = String::new();
            for (g, group) in group_list.iter_mut().enumerate() {
                // Every role's seed, each worker its own: what a secured fleet runs with.
                let creds = d.join(format!("creds-{g}"));
                let mut ids: Vec<String> =
                    plans[g].iter().flat_map(|(_, ids)| ids.clone()).collect();
                if shape.gpus > 0 {
                    ids.push(gpu_id(g));
                }
                let users = crate::creds::ensure(&creds, &ids, &[super::load::JOB])?;
                if groups == 1 {
                    conf.push_str(&tangram_nats::auth::server_authorization(&users));
                } else {
                    accounts.push_str(&format!(
                        "  G{g}: {{ jetstream: enabled, users: {} }}\n",
                        tangram_nats::auth::server_users(&users)
                    ));
                }
                group.creds = Some(creds);
            }
            if groups > 1 {
                // Each account's streams book the shipped limits: the server's store holds
                // them all (a booking; the files grow only with what is stored).
                conf = conf.replace(
                    "max_file_store: 20GB",
                    &format!("max_file_store: {}GB", 20 * groups),
                );
                conf.push_str(&format!("accounts {{\n{accounts}}}\n"));
            }
        }
        std::fs::write(d.join("server.conf"), conf)?;
        let port = crate::cluster::free_port()?;
        let url = format!("nats://127.0.0.1:{port}");
        let spawn = |name: &'static str, log: &str, cmd: &mut Command| -> anyhow::Result<Proc> {
            let child = crate::cluster::spawn_logged(&d.join(log), name, cmd)?;
            Ok(Proc { name, child })
        };
        let local = tangram_nats::local::LocalServer {
            bin: nats,
            conf: &d.join("server.conf"),
            store: &d.join("store"),
            port,
            monitor_port: crate::cluster::free_port()?,
        };
        let server = spawn("nats", "nats.log", &mut local.command()).with_context(|| {
            format!(
                "nats-server ({}); install it with deploy/install-tools.sh",
                nats.display()
            )
        })?;
        let mut c = Cluster {
            workers: Vec::new(),
            schedulers: Vec::new(),
            services: Vec::new(),
            nats: Some(server),
            url: url.clone(),
            worker_ids: Vec::new(),
            groups: Vec::new(),
            dir,
        };
        let deadline = std::time::Duration::from_secs(10);
        let started = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if started.elapsed() > deadline {
                bail!("nats-server did not start\n{}", c.log_tail("nats.log"));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let search = if shape.gpus > 0 {
            Some(c.start_search(shape.api_rate)?)
        } else {
            None
        };
        for (g, (mut group, processes)) in group_list.into_iter().zip(plans).enumerate() {
            let creds = group.creds.clone();
            let seed = |role: &str| -> Vec<(&'static str, std::path::PathBuf)> {
                creds
                    .iter()
                    .map(|d| ("TANGRAM_NKEY_FILE", d.join(format!("{role}.nk"))))
                    .collect()
            };
            for id in SCHEDULERS {
                let id = if groups > 1 {
                    format!("g{g}-{id}")
                } else {
                    id.to_string()
                };
                let p = spawn(
                    "scheduler",
                    &format!("{id}.log"),
                    SchedulerProcess {
                        id: Some(id.clone()),
                        nats_url: Some(url.clone()),
                        ..Default::default()
                    }
                    .command(&crate::cluster::sibling("tangram-scheduler")?)
                    .envs(seed("scheduler"))
                    .env("RUST_LOG", "warn"),
                )?;
                c.schedulers.push((id.clone(), Some(p)));
                group.schedulers.push(id);
            }
            for (prefix, ids) in processes {
                let replicas = WorkerProcess {
                    id: Some(prefix.clone()),
                    nats_url: Some(url.clone()),
                    sandbox_runtime: Some("noop".into()),
                    cores: Some(format!("0-{}", shape.cores.max(1) - 1)),
                    mem_mb: Some(shape.mem_mb),
                    heartbeat_ms: Some(shape.heartbeat_ms),
                    bench_replicas: Some(ids.len()),
                    bench_creds_dir: creds.clone(),
                    ..Default::default()
                };
                let mut cmd = replicas.command(&crate::cluster::sibling("tangram-worker")?);
                cmd.env("RUST_LOG", "warn").env("TMPDIR", &d);
                let p = spawn("workers", &format!("{prefix}.log"), &mut cmd)?;
                group.worker_pids.push(p.child.id());
                c.workers.push(p);
                c.worker_ids.extend(ids.iter().cloned());
                group.worker_ids.extend(ids);
            }
            if let Some((search_url, token_file)) = &search {
                let id = gpu_id(g);
                let config = c.gpu_worker_config(
                    &id,
                    shape,
                    search_url,
                    token_file,
                    shape.api_rate / groups as f64,
                )?;
                let p = spawn(
                    "worker",
                    &format!("{id}.log"),
                    WorkerProcess {
                        config: Some(config),
                        nats_url: Some(url.clone()),
                        ..Default::default()
                    }
                    .command(&crate::cluster::sibling("tangram-worker")?)
                    .envs(seed(&format!("worker-{id}")))
                    .env("RUST_LOG", "warn"),
                )?;
                group.worker_pids.push(p.child.id());
                c.workers.push(p);
                c.worker_ids.push(id.clone());
                group.worker_ids.push(id.clone());
                group.gpu_worker = Some(id);
            }
            c.groups.push(group);
        }
        Ok(c)
    }

    /// Starts one more worker process, `id`, on the cluster's server, with these arguments
    /// and environment (the opens bench: one real Docker worker with a warm pool).
    pub fn add_worker(
        &mut self,
        mut worker: tangram_nats::local::WorkerProcess,
        env: &[(&str, String)],
    ) -> anyhow::Result<()> {
        let id = worker.id.clone().context("a worker added needs an id")?;
        worker.nats_url = Some(self.url.clone());
        let log = self.dir.path().join(format!("{id}.log"));
        let child = crate::cluster::spawn_logged(
            &log,
            "worker",
            worker
                .command(&crate::cluster::sibling("tangram-worker")?)
                .envs(env.iter().map(|(k, v)| (*k, v)))
                .env("RUST_LOG", "warn"),
        )?;
        if let Some(g) = self.groups.first_mut() {
            g.worker_ids.push(id.to_string());
            g.worker_pids.push(child.id());
        }
        self.workers.push(Proc {
            name: "worker",
            child,
        });
        self.worker_ids.push(id.to_string());
        Ok(())
    }

    /// The process id of a scheduler still running.
    pub fn scheduler_pid(&self, id: &str) -> Option<u32> {
        self.schedulers
            .iter()
            .find(|(s, _)| s == id)
            .and_then(|(_, p)| p.as_ref())
            .map(|p| p.child.id())
    }

    /// The server's process id.
    pub fn nats_pid(&self) -> Option<u32> {
        self.nats.as_ref().map(|p| p.child.id())
    }

    /// The last lines of every log, for an error.
    pub fn log_tails(&self) -> String {
        let mut names: Vec<String> = self
            .schedulers
            .iter()
            .map(|(s, _)| format!("{s}.log"))
            .collect();
        names.push("nats.log".into());
        names.extend(self.worker_ids.first().map(|w| {
            // Bench replicas log per process (fw00), a worker of its own under its id.
            let process = w
                .split_once('-')
                .filter(|(p, _)| p.starts_with("fw"))
                .map_or(w.as_str(), |(p, _)| p);
            format!("{process}.log")
        }));
        names
            .iter()
            .map(|n| format!("--- {n}\n{}", self.log_tail(n)))
            .collect::<Vec<_>>()
            .join("\n")
    }

    fn log_tail(&self, name: &str) -> String {
        let text = std::fs::read_to_string(self.dir.path().join(name)).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(10)..].join("\n")
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.workers.clear();
        self.schedulers.clear();
        self.services.clear();
        self.nats = None;
    }
}
