//! The fleet under fault: every component a separate process (so that a fault can SIGKILL,
//! SIGSTOP or SIGTERM it), each with its effects written where the harness can count them.
//!
//! - `cpu-a` and `cpu-b`: CPU workers; sandboxes mount the shared effects directory, and every
//!   exec of the workload appends its action id to `/effects/log`. `cpu-b` reaches NATS
//!   through a [`Proxy`] that a partition cuts.
//! - `gpu-a`: declares two GPUs and serves `judge` with the reference replica, which appends
//!   every scored input (the action id) to its request log.
//! - `api-a`: calls the `search` provider, a local stand-in that records every request.

use super::proxy::Proxy;
use crate::api_server::RateLimitedApi;
use crate::{built_binary, repo_root, ChildGuard, NatsServer, Signal};
use anyhow::Context;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

/// What the fleet's processes log: every action's dispatch, admission and result too, so
/// that a lost or duplicated action can be followed.
const PROCESS_LOG_FILTER: &str = "info,tangram_scheduler=debug,tangram_worker=debug";

/// The CPU workers.
pub const CPU_WORKERS: [&str; 2] = ["cpu-a", "cpu-b"];
/// The worker behind the proxy.
pub const PARTITIONED: &str = "cpu-b";
/// The GPU worker.
pub const GPU_WORKER: &str = "gpu-a";
/// The API worker.
pub const API_WORKER: &str = "api-a";
/// The reward service.
pub const SERVICE: &str = "judge";
/// The API provider.
pub const PROVIDER: &str = "search";

/// How a fleet is made.
#[derive(Debug, Clone, Default)]
pub struct FleetOptions {
    /// The CPU workers run the `noop` sandbox runtime: opens, execs and closes complete at
    /// once and leave no mark, so only their results can be counted (for soaks at rates
    /// real sandboxes on a small machine cannot reach). Rewards and api calls stay real.
    pub noop_sandboxes: bool,
    /// Processes log at `info` only, not every action's path (for long, fast soaks).
    pub quiet_logs: bool,
}

/// One worker process, its config and, for the partitioned one, its proxy.
#[derive(Debug)]
struct WorkerProc {
    config: PathBuf,
    child: Option<ChildGuard>,
}

/// The running fleet.
#[derive(Debug)]
pub struct Fleet {
    /// The server (SIGKILL, restart, SIGSTOP through its pid).
    pub nats: NatsServer,
    /// The provider stand-in.
    pub api: RateLimitedApi,
    dir: tempfile::TempDir,
    schedulers: Vec<(String, ChildGuard)>,
    next_scheduler: u32,
    workers: BTreeMap<String, WorkerProc>,
    proxy: Proxy,
    /// Prefix of every worker id: fleets running at once (one per fault) must not share ids,
    /// since a starting worker removes every container labelled with its id.
    tag: String,
    /// Where every process of the fleet writes its log.
    logs: PathBuf,
    /// What the processes log (`RUST_LOG`).
    log_filter: &'static str,
}

impl Fleet {
    /// Starts NATS, the provider and the four workers, no scheduler. Worker ids are
    /// `<tag>-cpu-a` and so on; methods take the short names ([`CPU_WORKERS`]...).
    pub async fn start(tag: &str) -> anyhow::Result<Self> {
        Self::start_with(tag, FleetOptions::default()).await
    }

    /// [`Fleet::start`], made as `options` say.
    pub async fn start_with(tag: &str, options: FleetOptions) -> anyhow::Result<Self> {
        crate::init_logging();
        let nats = NatsServer::start();
        let dir = tempfile::tempdir()?;
        let effects = dir.path().join("effects");
        std::fs::create_dir(&effects)?;
        // Sandboxes run as nobody.
        set_mode(&effects, 0o777)?;
        let api = RateLimitedApi::start(10_000.0, 10_000.0, Duration::from_millis(2)).await?;
        let proxy = Proxy::start(format!("127.0.0.1:{}", nats.port())).await?;
        let logs = std::env::var_os("TANGRAM_FAULT_LOGS")
            .map(PathBuf::from)
            .unwrap_or_else(|| dir.path().join("logs"));
        std::fs::create_dir_all(&logs)?;
        let mut fleet = Self {
            nats,
            api,
            dir,
            schedulers: Vec::new(),
            next_scheduler: 0,
            workers: BTreeMap::new(),
            proxy,
            tag: tag.to_string(),
            logs,
            log_filter: if options.quiet_logs {
                "info"
            } else {
                PROCESS_LOG_FILTER
            },
        };
        for short in CPU_WORKERS {
            let id = fleet.id(short);
            let url = if short == PARTITIONED {
                fleet.proxy.url()
            } else {
                fleet.nats.url()
            };
            let text = format!(
                "id = \"{id}\"\nnats_url = \"{url}\"\ncores = \"0-1\"\nmem_mb = 8192\n\
                 heartbeat_ms = 200\nshutdown_grace_ms = 10000\n{runtime}\
                 [sandbox]\nmounts = [\"{}:/effects:rw\"]\n",
                effects.display(),
                runtime = if options.noop_sandboxes {
                    "sandbox_runtime = \"noop\"\n"
                } else {
                    ""
                },
            );
            fleet.add_worker(&id, &text)?;
        }
        let replica = repo_root().join("services/reference-replica/replica.py");
        let gpu = format!(
            "id = \"{gpu_id}\"\nnats_url = \"{url}\"\nheartbeat_ms = 200\n\
             shutdown_grace_ms = 10000\nsandboxes = false\nstate_dir = \"{state}\"\n\
             [gpu]\ncount = 2\nnvml = \"off\"\n\
             [[service]]\nname = \"{SERVICE}\"\ndriver = \"reference\"\n\
             command = [\"python3\", \"{script}\", \"--service\", \"{{service}}\", \"--port\", \"{{port}}\", \
             \"--vocab\", \"4096\", \"--dim\", \"16\", \"--request-log\", \"{log}\"]\n\
             gpus = 1\nhost_mem_mb = 1\nrestore_ms = 20\nslots = 4\nstart_timeout_ms = 30000\n",
            gpu_id = fleet.id(GPU_WORKER),
            url = fleet.nats.url(),
            state = fleet.dir.path().join("gpu-state").display(),
            script = replica.display(),
            log = fleet.replica_log().display(),
        );
        fleet.add_worker(&fleet.id(GPU_WORKER), &gpu)?;
        let api = format!(
            "id = \"{api_id}\"\nnats_url = \"{url}\"\nheartbeat_ms = 200\n\
             shutdown_grace_ms = 10000\nsandboxes = false\n\
             [[provider]]\nname = \"{PROVIDER}\"\nbase_url = \"{base}\"\nrate_per_s = 2000.0\n\
             burst = 100\nconcurrency = 32\ntimeout_ms = 10000\nallow = [\"GET /search\"]\n",
            api_id = fleet.id(API_WORKER),
            url = fleet.nats.url(),
            base = fleet.api.url,
        );
        fleet.add_worker(&fleet.id(API_WORKER), &api)?;
        Ok(fleet)
    }

    /// The full id of a worker by its short name.
    pub fn id(&self, short: &str) -> String {
        format!("{}-{short}", self.tag)
    }

    fn add_worker(&mut self, id: &str, text: &str) -> anyhow::Result<()> {
        let config = self.dir.path().join(format!("{id}.toml"));
        std::fs::write(&config, text)?;
        self.workers.insert(
            id.to_string(),
            WorkerProc {
                config,
                child: None,
            },
        );
        self.start_process(id)
    }

    /// Where sandbox execs leave their marks.
    pub fn effects_log(&self) -> PathBuf {
        self.dir.path().join("effects/log")
    }

    /// Where the replica logs what it scored.
    pub fn replica_log(&self) -> PathBuf {
        self.dir.path().join("replica.log")
    }

    /// The worker ids.
    pub fn worker_ids(&self) -> Vec<String> {
        self.workers.keys().cloned().collect()
    }

    /// Starts (or restarts) a worker's process, by short name.
    pub fn start_worker(&mut self, short: &str) -> anyhow::Result<()> {
        self.start_process(&self.id(short))
    }

    fn start_process(&mut self, id: &str) -> anyhow::Result<()> {
        anyhow::ensure!(self.workers.contains_key(id), "no such worker {id}");
        let bin = built_binary("tangram-worker");
        let (out, err) = self.process_output(id)?;
        let w = self.workers.get_mut(id).context("no such worker")?;
        let process = tangram_nats::local::WorkerProcess {
            config: Some(w.config.clone()),
            ..Default::default()
        };
        let child = process
            .command(&bin)
            .env("RUST_LOG", self.log_filter)
            .stdout(out)
            .stderr(err)
            .spawn()
            .with_context(|| format!("spawning {}", bin.display()))?;
        w.child = Some(ChildGuard(child));
        Ok(())
    }

    /// Sends a signal to a worker's process.
    pub fn signal_worker(&mut self, short: &str, signal: Signal) -> anyhow::Result<()> {
        let id = self.id(short);
        let w = self.workers.get_mut(&id).context("no such worker")?;
        let child = w.child.as_mut().context("worker not running")?;
        signal_pid(child.id(), signal)
    }

    /// Waits (bounded) for a worker's process to exit, and forgets it.
    pub async fn wait_worker_exit(&mut self, short: &str, within: Duration) -> anyhow::Result<()> {
        let id = self.id(short);
        let w = self.workers.get_mut(&id).context("no such worker")?;
        let mut child = w.child.take().context("worker not running")?;
        let deadline = tokio::time::Instant::now() + within;
        while child.try_wait()?.is_none() {
            anyhow::ensure!(
                tokio::time::Instant::now() < deadline,
                "{id} did not exit within {within:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(())
    }

    /// SIGKILLs a worker's process and waits for it.
    pub fn kill_worker(&mut self, short: &str) -> anyhow::Result<()> {
        let id = self.id(short);
        let w = self.workers.get_mut(&id).context("no such worker")?;
        if let Some(mut c) = w.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        Ok(())
    }

    /// Starts a scheduler process; returns its id.
    pub fn start_scheduler(&mut self) -> anyhow::Result<String> {
        self.next_scheduler += 1;
        let id = format!("sched-{}", self.next_scheduler);
        let bin = built_binary("tangram-scheduler");
        let (out, err) = self.process_output(&id)?;
        let process = tangram_nats::local::SchedulerProcess {
            id: Some(id.clone()),
            nats_url: Some(self.nats.url()),
            ..Default::default()
        };
        let child = process
            .command(&bin)
            .env("RUST_LOG", self.log_filter)
            .stdout(out)
            .stderr(err)
            .spawn()
            .with_context(|| format!("spawning {}", bin.display()))?;
        self.schedulers.push((id.clone(), ChildGuard(child)));
        Ok(id)
    }

    /// SIGKILLs the scheduler with this id.
    pub fn kill_scheduler(&mut self, id: &str) -> anyhow::Result<()> {
        let pos = self
            .schedulers
            .iter()
            .position(|(s, _)| s == id)
            .with_context(|| format!("no scheduler {id}"))?;
        let (_, mut child) = self.schedulers.remove(pos);
        let _ = child.kill();
        let _ = child.wait();
        Ok(())
    }

    /// Sends a signal to the scheduler with this id.
    pub fn signal_scheduler(&self, id: &str, signal: Signal) -> anyhow::Result<()> {
        let (_, child) = self
            .schedulers
            .iter()
            .find(|(s, _)| s == id)
            .with_context(|| format!("no scheduler {id}"))?;
        signal_pid(child.id(), signal)
    }

    /// Ids of the scheduler processes running.
    pub fn schedulers(&self) -> Vec<String> {
        self.schedulers.iter().map(|(s, _)| s.clone()).collect()
    }

    /// Every process of the fleet running now, by name (`nats-server`, scheduler ids,
    /// worker short names), with its pid.
    pub fn processes(&self) -> Vec<(String, u32)> {
        let mut out = Vec::new();
        if let Some(pid) = self.nats.pid() {
            out.push((super::soak::NATS_SERVER.to_string(), pid));
        }
        for (id, child) in &self.schedulers {
            out.push((id.clone(), child.id()));
        }
        for (id, w) in &self.workers {
            if let Some(c) = &w.child {
                let short = id
                    .strip_prefix(&format!("{}-", self.tag))
                    .unwrap_or(id)
                    .to_string();
                out.push((short, c.id()));
            }
        }
        out
    }

    /// The partition proxy of [`PARTITIONED`].
    pub fn proxy(&self) -> &Proxy {
        &self.proxy
    }

    /// Where a fleet process writes its output: `<fleet>-<process>.log` in the fleet's log
    /// folder (`TANGRAM_FAULT_LOGS` when set, so that it outlives the run), appended to
    /// across restarts.
    fn process_output(&self, name: &str) -> anyhow::Result<(Stdio, Stdio)> {
        let name = if name.starts_with(&self.tag) {
            name.to_string()
        } else {
            format!("{}-{name}", self.tag)
        };
        let path = self.logs.join(format!("{name}.log"));
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .with_context(|| format!("opening {}", path.display()))?;
        Ok((file.try_clone()?.into(), file.into()))
    }

    /// Up to `max` lines of this fleet's process logs that name one of `ids` (as a whole
    /// token), each prefixed with its file's name.
    pub fn log_lines_naming(&self, ids: &[String], max: usize) -> Vec<String> {
        let mut out = Vec::new();
        let Ok(dir) = std::fs::read_dir(&self.logs) else {
            return out;
        };
        let mut files: Vec<PathBuf> = dir
            .flatten()
            .map(|e| e.path())
            .filter(|p| {
                p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with(&self.tag))
            })
            .collect();
        files.sort();
        for path in files {
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            let file = path.file_name().unwrap_or_default().to_string_lossy();
            for line in text.lines() {
                if names_any(line, ids) && out.len() < max {
                    out.push(format!("{file}: {line}"));
                }
            }
        }
        out
    }

    /// Sends a signal to nats-server.
    pub fn signal_nats(&self, signal: Signal) -> anyhow::Result<()> {
        signal_pid(self.nats.pid().context("nats-server not running")?, signal)
    }
}

/// Whether `line` names one of `ids` as a whole token (`t1-r1` is not named by `t1-r10`).
pub(super) fn names_any(line: &str, ids: &[String]) -> bool {
    line.split(|c: char| !(c.is_ascii_alphanumeric() || c == '-' || c == '_'))
        .any(|tok| ids.iter().any(|id| id == tok))
}

fn signal_pid(pid: u32, signal: Signal) -> anyhow::Result<()> {
    crate::signal(pid, signal).with_context(|| format!("sending {signal:?} to {pid}"))
}

fn set_mode(path: &Path, mode: u32) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
}

#[cfg(test)]
mod tests {
    use super::names_any;

    #[test]
    fn a_log_line_names_an_action_only_by_its_whole_id() {
        let ids = vec!["t1-r1".to_string()];
        let line =
            "\u{1b}[2m2026\u{1b}[0m DEBUG action{id=t1-r1 kind=\"reward\"}: result published";
        assert!(names_any(line, &ids));
        assert!(!names_any("admitted action=t1-r10 epoch=1", &ids));
        assert!(!names_any("admitted action=xt1-r1 epoch=1", &ids));
    }
}
