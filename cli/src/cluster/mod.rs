//! `tangram up`, `tangram down`, `tangram status`: a local cluster on loopback from embedded
//! defaults (nats-server, the scheduler, CPU workers, a GPU worker with declared GPUs serving
//! reference replicas, and a local search API stand-in called through the quota manager).

use anyhow::{bail, Context as _};
use rustix::process::Signal;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;
use tokio::time::Instant;

pub(crate) mod files;
mod status;
mod up;

pub use crate::connect::{credentials, nats_url};
pub(crate) use files::apply_config_file;
pub use status::{fetch_status, status};
pub use up::up;

const SERVER_CONF: &str = include_str!("../../../nats/server.conf");
pub(crate) const REPLICA_PY: &str = include_str!("../../../services/reference-replica/replica.py");
pub(crate) const SEARCH_PY: &str = include_str!("../../../services/search-standin/search.py");

/// Options of `tangram up`. Each is a flag, an environment variable, and a key of the
/// `[up]` table of the config file (`--config`, or `tangram.toml`): flags and environment
/// variables win over the file, the file over the defaults.
#[derive(Debug, clap::Args, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpArgs {
    /// Where the cluster keeps its state, logs and pid files.
    #[arg(long, env = "TANGRAM_STATE_DIR", default_value = ".tangram")]
    pub state_dir: PathBuf,
    /// NATS client port on 127.0.0.1.
    #[arg(long, env = "TANGRAM_NATS_PORT", default_value_t = 4222)]
    pub nats_port: u16,
    /// Schedulers: the first to start leads, the others stand by and take over within
    /// about 2.3 s of its death.
    #[arg(long, env = "TANGRAM_UP_SCHEDULERS", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=8))]
    pub schedulers: u32,
    /// CPU workers (each grants all of this machine's cores; on a small machine they share them).
    #[arg(long, env = "TANGRAM_UP_WORKERS", default_value_t = 2)]
    pub workers: u32,
    /// Warm sandboxes each CPU worker keeps at most, created and parked ahead of the opens
    /// that claim them (half of it at least, whatever the open rate); 0 keeps none.
    #[arg(long, env = "TANGRAM_UP_WARM_POOL", default_value_t = 8, value_parser = clap::value_parser!(u32).range(0..=256))]
    pub warm_pool: u32,
    /// Memory each CPU worker reserves for sandboxes, MiB.
    #[arg(long, env = "TANGRAM_UP_WORKER_MEM_MB", default_value_t = 4096)]
    pub worker_mem_mb: u64,
    /// GPUs the GPU worker declares when NVML finds none (0: no GPU worker).
    #[arg(long, env = "TANGRAM_UP_GPUS", default_value_t = 2)]
    pub gpus: u32,
    /// Reward services the GPU worker serves with reference replicas, comma-separated.
    #[arg(
        long,
        env = "TANGRAM_UP_SERVICES",
        default_value = "judge,teacher-code,teacher-style"
    )]
    pub services: String,
    /// Scheduling policy.
    #[arg(long, env = "TANGRAM_SCHEDULER_POLICY", default_value = "tangram-v2")]
    pub policy: String,
    /// Cores per trajectory sandbox under `--policy static`.
    #[arg(long, env = "TANGRAM_UP_STATIC_CORES", default_value_t = 1)]
    pub static_cores: u32,
    /// The search stand-in's rate limit, requests/s (the provider quota declared to Tangram).
    #[arg(long, env = "TANGRAM_UP_SEARCH_RATE", default_value_t = 20.0)]
    pub search_rate: f64,
    /// nats-server binary [default: tools/bin/nats-server above the working directory, then PATH].
    #[arg(long, env = "TANGRAM_NATS_SERVER")]
    pub nats_server: Option<PathBuf>,
    /// Seconds to wait for every component to report.
    #[arg(long, env = "TANGRAM_UP_WAIT_S", default_value_t = 90)]
    pub wait_s: u64,
    /// Run NATS without users or permissions (anyone who reaches the port may do anything).
    /// By default every component, the CLI and rollouts authenticate with nkeys written to
    /// <state-dir>/creds/<role>.nk.
    #[arg(long, env = "TANGRAM_UP_NO_AUTH")]
    pub no_auth: bool,
    /// Jobs that get rollout credentials of their own (`creds/rollout-<job>.nk`: that job's
    /// actions and results only), comma-separated; `creds/rollout.nk` serves every job.
    #[arg(long, env = "TANGRAM_UP_ROLLOUT_JOBS", default_value = "")]
    pub rollout_jobs: String,
    /// NATS monitoring port on 127.0.0.1 [default: 8222 beside the default client port 4222,
    /// else a free one].
    #[arg(long, env = "TANGRAM_UP_NATS_MONITOR_PORT")]
    pub nats_monitor_port: Option<u16>,
    /// Serve Prometheus metrics from the scheduler and every worker, on loopback (the
    /// default; `up` prints the addresses and writes <state-dir>/prometheus.yml).
    #[arg(long, overrides_with = "no_metrics")]
    #[serde(default, skip_serializing)]
    pub metrics: bool,
    /// Serve no metrics.
    #[arg(long, env = "TANGRAM_UP_NO_METRICS")]
    #[serde(default)]
    pub no_metrics: bool,
}

/// What `up` records for `down` and `status`.
#[derive(Debug, Serialize, Deserialize)]
pub struct Running {
    /// NATS URL.
    pub nats_url: String,
    /// Component name → pid, in start order.
    pub pids: Vec<(String, u32)>,
    /// Worker ids expected to report.
    pub workers: Vec<String>,
    /// The search stand-in's URL.
    pub search_url: Option<String>,
    /// Where the credentials are, when NATS requires them.
    #[serde(default)]
    pub creds: Option<PathBuf>,
    /// NATS monitoring endpoint (`host:port`).
    #[serde(default)]
    pub nats_monitor: Option<String>,
    /// Component name → its metrics endpoint (`host:port`), when metrics are on.
    #[serde(default)]
    pub metrics: Vec<(String, String)>,
}

/// Sends `sig` to `pid` with a system call (no `kill` child process).
pub(crate) fn signal(pid: u32, sig: Signal) -> std::io::Result<()> {
    let target = i32::try_from(pid)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
        .ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("no such pid {pid}"),
            )
        })?;
    rustix::process::kill_process(target, sig).map_err(std::io::Error::from)
}

fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| s.split_whitespace().nth(2).is_none_or(|st| st != "Z"))
        .unwrap_or(false)
}

pub(crate) fn free_port() -> anyhow::Result<u16> {
    Ok(tangram_nats::local::free_port()?)
}

pub(crate) fn sibling(name: &str) -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let p = exe.with_file_name(name);
    if !p.exists() {
        bail!(
            "{} not found next to {}; build the workspace's binaries first (cargo build --bins)",
            name,
            exe.display()
        );
    }
    Ok(p)
}

fn spawn(state: &Path, name: &str, cmd: &mut Command) -> anyhow::Result<u32> {
    let log = state.join("logs").join(format!("{name}.log"));
    Ok(spawn_logged(&log, name, cmd)?.id())
}

/// Starts `cmd` with no stdin and its stdout and stderr both in the file `log`.
pub(crate) fn spawn_logged(
    log: &Path,
    name: &str,
    cmd: &mut Command,
) -> anyhow::Result<std::process::Child> {
    let log = std::fs::File::create(log)?;
    cmd.stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()
        .with_context(|| format!("starting {name} ({:?})", cmd.get_program()))
}

fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// `tangram down`.
pub fn down(state: &Path) -> anyhow::Result<()> {
    let n = down_at(state)?;
    println!("tangram is down ({n} processes stopped)");
    Ok(())
}

fn down_at(state: &Path) -> anyhow::Result<usize> {
    let file = state.join("running.json");
    let text = std::fs::read_to_string(&file).with_context(|| {
        format!(
            "no cluster recorded in {} (nothing to stop)",
            state.display()
        )
    })?;
    let r: Running = serde_json::from_str(&text)?;
    // Workers first (they drain and remove their sandboxes and replicas), then the rest.
    let mut order: Vec<&(String, u32)> = r
        .pids
        .iter()
        .filter(|(n, _)| n.starts_with("cpu-") || n.starts_with("gpu-"))
        .collect();
    order.extend(
        r.pids
            .iter()
            .filter(|(n, _)| n.starts_with("scheduler") || n == "search"),
    );
    order.extend(r.pids.iter().filter(|(n, _)| n == "nats"));
    let mut stopped = 0;
    for group in [
        &order[..order.len().saturating_sub(1)],
        &order[order.len().saturating_sub(1)..],
    ] {
        for (_, pid) in group.iter() {
            if alive(*pid) {
                let _ = signal(*pid, Signal::TERM);
                stopped += 1;
            }
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        while group.iter().any(|(_, p)| alive(*p)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
        }
        for (_, pid) in group.iter() {
            if alive(*pid) {
                let _ = signal(*pid, Signal::KILL);
            }
        }
    }
    std::fs::remove_file(&file)?;
    Ok(stopped)
}
