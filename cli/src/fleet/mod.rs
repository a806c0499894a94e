//! `tangram bench fleet`: the real scheduler process (a leader and a standby) and a real
//! nats-server under hundreds of workers and tens of thousands of open sandboxes, on one
//! machine. The workers are real too (`tangram-worker`: their own NATS connections, dispatch
//! consumers and heartbeats), on the benchmark-only `noop` runtime, many to a process
//! (`--bench-replicas`), so that hundreds fit beside the scheduler.
//!
//! For each worker count of the sweep, a fresh cluster: every lane's sandbox opened, the
//! scheduler's cost of the heartbeats alone (idle), then actions at the asked rate (execs,
//! and trajectories ending and starting), the status answer timed meanwhile, then the leader
//! SIGKILLed and the time until the standby leads and answers an exec on a sandbox opened
//! under the old leader. Every submitted action must have exactly one stored result.

mod cluster;
mod density;
mod load;
mod measure;
mod opens;
mod report;
mod usage;

pub use density::{density, DensityArgs};
pub use opens::{opens, OpensArgs};

use anyhow::{bail, Context as _};
use cluster::{Cluster, Shape};
use load::{Lanes, Load};
use measure::measure;
use serde_json::{json, Value};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tangram_shared::stats::quantile;
use tangram_shared::status::Status;
use tokio::time::Instant;
use usage::{usage, usage_of};

/// Options of `tangram bench fleet`.
#[derive(Debug, clap::Args)]
pub struct FleetArgs {
    /// Worker counts to measure, one fresh cluster each.
    #[arg(long, value_delimiter = ',', default_value = "10,50,100,250,500")]
    pub workers: Vec<u32>,
    /// Cores each worker declares (the noop runtime books them and runs nothing).
    #[arg(long, default_value_t = 64)]
    pub cores: u32,
    /// Sandboxes open at once across the fleet (one lane, a trajectory at a time, each).
    #[arg(long, default_value_t = 20_000)]
    pub sandboxes: usize,
    /// Actions a second offered in the steady phase.
    #[arg(long, default_value_t = 2000.0)]
    pub rate: f64,
    /// Length of the steady phase, seconds.
    #[arg(long, default_value_t = 60)]
    pub duration_s: u64,
    /// Every this many actions of a lane, its trajectory ends (close) and the next opens.
    #[arg(long, default_value_t = 20)]
    pub churn: u32,
    /// Opens in flight at once while the sandboxes are opened.
    #[arg(long, default_value_t = 512)]
    pub open_in_flight: usize,
    /// Heartbeat period of every worker, ms.
    #[arg(long, default_value_t = 1000)]
    pub heartbeat_ms: u64,
    /// JetStream sync: `always` (what nats/server.conf ships) or `default` (the server's).
    #[arg(long, default_value = "always", value_parser = ["always", "default"])]
    pub sync: String,
    /// Scheduler groups sharing the server, each a NATS account with its own leader and
    /// standby, its share of the workers, sandboxes and rate, and its own job.
    #[arg(long, default_value_t = 1)]
    pub groups: u32,
    /// Of the turns that do not end a trajectory, the percentage that are `reward` actions
    /// (served by each group's GPU worker with the reference replica).
    #[arg(long, default_value_t = 5)]
    pub reward_pct: u32,
    /// Of those turns, the percentage that are `api` calls (a search through the fleet's
    /// provider quota, to a rate-limited stand-in).
    #[arg(long, default_value_t = 5)]
    pub api_pct: u32,
    /// Declared GPUs of each group's GPU worker, a reward replica on each at most.
    #[arg(long, default_value_t = 4)]
    pub gpus: u32,
    /// The api provider's quota, requests a second across the fleet [default: twice the
    /// api calls offered].
    #[arg(long)]
    pub api_rate: Option<f64>,
    /// No authentication: by default every process connects with its own role's nkey (each
    /// worker its own, the load as the job's rollout role), as a secured fleet does.
    #[arg(long)]
    pub no_auth: bool,
    /// Skip the leader failover.
    #[arg(long)]
    pub no_failover: bool,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Write the curves against workers as SVG.
    #[arg(long)]
    pub picture: Option<PathBuf>,
    /// nats-server binary [default: tools/bin/nats-server above the working directory, then PATH].
    #[arg(long, env = "TANGRAM_NATS_SERVER")]
    pub nats_server: Option<PathBuf>,
}

/// Runs the sweep and prints the report; an error when an action was lost or doubled, or
/// the status answer broke.
pub fn fleet(a: FleetArgs) -> anyhow::Result<()> {
    if a.workers.is_empty() || a.workers.contains(&0) {
        bail!("--workers takes worker counts of at least 1, such as 10,50,100");
    }
    if a.groups == 0 || a.workers.iter().any(|&w| w < a.groups) {
        bail!("--groups must be at least 1 and at most the smallest worker count");
    }
    if a.sandboxes == 0 || a.rate <= 0.0 || a.duration_s == 0 {
        bail!("--sandboxes, --rate and --duration-s must be positive");
    }
    if a.reward_pct + a.api_pct > 100 {
        bail!("--reward-pct and --api-pct add up to more than 100");
    }
    if a.reward_pct > 0 && a.gpus == 0 {
        bail!("--reward-pct needs GPUs to serve the reward service: give --gpus");
    }
    let mixed = a.reward_pct + a.api_pct > 0;
    // The api calls offered a second, roughly (closes and opens take some turns).
    let api_rate = a
        .api_rate
        .unwrap_or((a.rate * f64::from(a.api_pct) / 100.0 * 2.0).max(10.0));
    let nats = crate::nats_server::find(a.nats_server.as_ref())?;
    let load_before = crate::pipeline::loadavg();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let mut rows = Vec::new();
    for &workers in &a.workers {
        eprintln!("fleet: {workers} workers, {} sandboxes ...", a.sandboxes);
        let per_worker = a.sandboxes.div_ceil(workers as usize) as u64;
        let shape = Shape {
            workers,
            cores: a.cores,
            // Room for every lane's sandbox, and for a churning lane's next one.
            mem_mb: (per_worker * 2 + 8) * load::SANDBOX_MB,
            heartbeat_ms: a.heartbeat_ms,
            sync: a.sync.clone(),
            groups: a.groups,
            auth: !a.no_auth,
            // The GPU worker serves both the reward service and the api provider.
            gpus: if mixed { a.gpus.max(1) } else { 0 },
            api_rate,
        };
        let cluster = Cluster::start(&nats, &shape)?;
        let measured = rt.block_on(async {
            let budget = Duration::from_secs(a.duration_s * 3 + 600);
            let groups = (0..cluster.groups.len()).map(|g| measure(&cluster, g, &a));
            tokio::time::timeout(budget, futures::future::join_all(groups))
                .await
                .with_context(|| format!("{workers} workers: the run took longer than {budget:?}"))
        });
        let measured = match measured {
            Ok(rows) => rows.into_iter().collect::<anyhow::Result<Vec<Value>>>(),
            Err(e) => Err(e),
        };
        match measured {
            Ok(r) => rows.extend(r),
            Err(e) => bail!("{e:#}\n{}", cluster.log_tails()),
        }
        drop(cluster);
    }
    let out = json!({
        "bench": "fleet",
        "cores_per_worker": a.cores,
        "sandboxes": a.sandboxes,
        "rate": a.rate,
        "duration_s": a.duration_s,
        "sync": a.sync,
        "groups": a.groups,
        "heartbeat_ms": a.heartbeat_ms,
        "auth": if a.no_auth { "none" } else { "per-role nkeys" },
        "mix": {"reward_pct": a.reward_pct, "api_pct": a.api_pct, "gpus": a.gpus, "api_rate": api_rate},
        "load_avg_before": load_before,
        "load_avg_after": crate::pipeline::loadavg(),
        "rows": rows,
    });
    if let Some(path) = &a.picture {
        std::fs::write(path, report::picture(&out)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if a.json {
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        report::print_table(&out);
    }
    let broken: Vec<String> = rows
        .iter()
        .filter(|r| {
            r["results"]["missing"].as_u64() != Some(0)
                || r["results"]["duplicated"].as_u64() != Some(0)
                || r["status"]["answered"].as_bool() != Some(true)
                || r["anonymous_connection_refused"].as_bool() == Some(false)
        })
        .map(|r| r["workers"].to_string())
        .collect();
    if !broken.is_empty() {
        bail!(
            "actions lost or doubled, no status answer, or an anonymous connection let in, at {} workers",
            broken.join(", ")
        );
    }
    Ok(())
}

/// One status request: the answer, its size in bytes and how long it took.
async fn status(client: &async_nats::Client) -> anyhow::Result<(Status, usize, Duration)> {
    status_within(client, Duration::from_secs(10)).await
}

async fn status_within(
    client: &async_nats::Client,
    within: Duration,
) -> anyhow::Result<(Status, usize, Duration)> {
    let t = Instant::now();
    let f = tangram_nats::status::fetch(client, within).await?;
    Ok((f.status, f.bytes, t.elapsed()))
}

/// Waits until the leader's status lists every worker; the status then.
async fn wait_for_fleet(
    client: &async_nats::Client,
    n: usize,
    within: Duration,
) -> anyhow::Result<Status> {
    let deadline = Instant::now() + within;
    let mut last = String::from("no answer");
    while Instant::now() < deadline {
        match status(client).await {
            Ok((s, _, _)) if s.workers.len() >= n && s.leader.is_some() => return Ok(s),
            Ok((s, _, _)) => last = format!("{} of {n} workers listed", s.workers.len()),
            Err(e) => last = format!("{e:#}"),
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    bail!("the fleet did not come up within {within:?}: {last}")
}

fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e4).round() / 10.0
}

/// Runs the `docker` CLI; its standard output, or an error with its standard error.
fn docker(args: &[&str]) -> anyhow::Result<String> {
    let out = std::process::Command::new("docker").args(args).output()?;
    if !out.status.success() {
        bail!(
            "docker {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// p50 and p99 of `v` (milliseconds), rounded.
fn pcts(mut v: Vec<f64>) -> Value {
    v.sort_by(f64::total_cmp);
    let r = |x: f64| (x * 100.0).round() / 100.0;
    json!({"p50": r(quantile(&v, 0.5)), "p99": r(quantile(&v, 0.99)), "n": v.len()})
}
