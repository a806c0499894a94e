//! `tangram bench pipeline`: what Tangram's own path costs per action, against what NATS
//! itself costs, on one server in one run.
//!
//! An action's path is three persisted hops: the client publishes the action, the scheduler
//! publishes a dispatch, the worker publishes the result. So the floor for one action is a
//! three-hop JetStream chain (publish, a consumer republishes, a consumer republishes, a reader
//! gets it), and the floor for throughput is how many persisted writes per second the server
//! takes, divided by the writes one action makes (counted, not assumed). The bench starts a
//! real cluster per sync setting (nats-server, the scheduler, one CPU worker), measures the
//! floors on that server with the cluster idle, then runs `sandbox_exec` actions whose
//! execution is near zero: with the worker's benchmark-only `noop` sandbox runtime nothing
//! runs at all; with `docker` the command is `true`. Orchestration per action is the result in
//! hand minus the execution time the worker reports.

mod cluster;
mod floor;
mod load;
mod table;

use anyhow::{bail, Context as _};
use async_nats::jetstream::{self, consumer};
pub(crate) use cluster::{server_conf, Proc};
use cluster::{wait_for_worker, LocalCluster};
pub use floor::relay;
use floor::Floor;
use futures::stream::FuturesUnordered;
use futures::StreamExt as _;
use load::*;
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use table::print_table;
use tangram_nats::local::{SchedulerProcess, WorkerProcess};
use tangram_shared::codec::{self, Encoding};
use tangram_shared::stats::quantile;
use tangram_shared::{
    subject, Action, ActionId, ActionResult, ActionSpec, CpuRange, JobId, Outcome, SandboxExec,
    SandboxOpen, TrajectoryId,
};
use tokio::sync::oneshot;
use tokio::time::Instant;

const SERVER_CONF: &str = include_str!("../../../nats/server.conf");
const JOB: &str = "bench";
/// Memory each bench sandbox reserves, MiB (the smallest a sandbox may ask for is 16).
const SANDBOX_MB: u64 = 64;
/// How long one action may take before the bench gives up on it.
const ACTION_WAIT: Duration = Duration::from_secs(30);

/// Options of `tangram bench pipeline`.
#[derive(Debug, clap::Args)]
pub struct PipelineArgs {
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
    /// JetStream sync setting(s) to run: `default` (the server's, 2 min), `always` (fsync per
    /// write, what nats/server.conf ships), or `both`.
    #[arg(long, default_value = "both", value_parser = ["both", "default", "always"])]
    pub sync: String,
    /// The worker's sandbox runtime: `noop` (benchmark-only: nothing runs, execution is zero)
    /// or `docker` (the command `true` in a real sandbox).
    #[arg(long, default_value = "noop", value_parser = ["noop", "docker"])]
    pub sandbox_runtime: String,
    /// Sequential samples for the floors and for orchestration at concurrency 1.
    #[arg(long, default_value_t = 300)]
    pub samples: usize,
    /// Actions in the throughput run.
    #[arg(long, default_value_t = 5000)]
    pub actions: usize,
    /// Actions in flight in the throughput run, one trajectory (and sandbox) each
    /// [default: 256 with noop, 8 with docker].
    #[arg(long)]
    pub concurrency: Option<usize>,
    /// Messages published for the persisted-writes floor.
    #[arg(long, default_value_t = 20_000)]
    pub writes: usize,
    /// Cores the worker declares [default: 0-255 with noop, which books but runs nothing, so
    /// cores do not cap throughput; this machine's cores with docker].
    #[arg(long)]
    pub worker_cores: Option<String>,
    /// Upper bound on each measured phase, seconds.
    #[arg(long, default_value_t = 60)]
    pub phase_s: u64,
    /// The shortest run, for a smoke test: 20 samples, 200 actions, 8 in flight, 2,000 writes.
    #[arg(long)]
    pub quick: bool,
    /// nats-server binary [default: tools/bin/nats-server above the working directory, then PATH].
    #[arg(long, env = "TANGRAM_NATS_SERVER")]
    pub nats_server: Option<PathBuf>,
}

/// Sizes after `--quick` and the runtime's defaults.
#[derive(Debug, Clone)]
struct Plan {
    runtime: String,
    samples: usize,
    actions: usize,
    concurrency: usize,
    writes: usize,
    window: usize,
    worker_cores: String,
    phase: Duration,
}

impl Plan {
    fn from(a: &PipelineArgs) -> anyhow::Result<Self> {
        let noop = a.sandbox_runtime == "noop";
        let online = std::thread::available_parallelism().map_or(1, |n| n.get());
        let mut p = Plan {
            runtime: a.sandbox_runtime.clone(),
            samples: a.samples,
            actions: a.actions,
            concurrency: a.concurrency.unwrap_or(if noop { 256 } else { 8 }),
            writes: a.writes,
            window: 256,
            worker_cores: a.worker_cores.clone().unwrap_or_else(|| {
                if noop {
                    "0-255".into()
                } else {
                    format!("0-{}", online - 1)
                }
            }),
            phase: Duration::from_secs(a.phase_s),
        };
        if a.quick {
            p.samples = p.samples.min(20);
            p.actions = p.actions.min(200);
            p.concurrency = p.concurrency.min(8);
            p.writes = p.writes.min(2000);
        }
        if p.samples == 0 || p.actions == 0 || p.concurrency == 0 || p.writes == 0 {
            bail!("--samples, --actions, --concurrency and --writes must be at least 1");
        }
        Ok(p)
    }
}

/// Runs the benchmark for each sync setting asked for and prints the report.
pub fn pipeline(a: PipelineArgs) -> anyhow::Result<()> {
    let plan = Plan::from(&a)?;
    let nats = crate::nats_server::find(a.nats_server.as_ref())?;
    let syncs: &[&str] = match a.sync.as_str() {
        "both" => &["default", "always"],
        "default" => &["default"],
        _ => &["always"],
    };
    let load_before = loadavg();
    let mut settings = Vec::new();
    for sync in syncs {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let cluster = LocalCluster::start(&nats, sync, &plan)?;
        let report = rt.block_on(async {
            tokio::time::timeout(plan.phase * 8, measure(&cluster, sync, &plan))
                .await
                .context("the run took longer than eight phases")?
        });
        let report = match report {
            Ok(r) => r,
            Err(e) => bail!("{e:#}\n{}", cluster.log_tails()),
        };
        settings.push(report);
        drop(cluster);
    }
    let out = json!({
        "bench": "pipeline",
        "sandbox_runtime": plan.runtime,
        "worker_cores": plan.worker_cores,
        "samples": plan.samples,
        "actions": plan.actions,
        "concurrency": plan.concurrency,
        "load_avg_before": load_before,
        "load_avg_after": loadavg(),
        "settings": settings,
    });
    if a.json {
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        print_table(&out);
    }
    Ok(())
}

/// The 1, 5 and 15 minute load averages: the bench shares the machine, and says so.
pub(crate) fn loadavg() -> Vec<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .filter_map(|s| s.parse().ok())
        .collect()
}

async fn measure(cluster: &LocalCluster, sync: &str, plan: &Plan) -> anyhow::Result<Value> {
    let client = async_nats::connect(&cluster.url).await?;
    let js = jetstream::new(client.clone());
    wait_for_worker(&client, &cluster.worker, Duration::from_secs(60)).await?;
    let results = ResultReader::start(&client).await?;
    let job = JobId::new(JOB)?;
    let payload_bytes = codec::encode(&exec_action("b-0", "t0"), Encoding::Msgpack)?.len();

    // Sandboxes: one per trajectory in flight; the one at concurrency 1 is t0.
    let mut opens = Vec::new();
    for t in 0..plan.concurrency {
        opens.push(open_action(&format!("open-{t}"), &format!("t{t}")));
    }
    let opened =
        run_concurrently(&js, &results, opens, plan.concurrency.min(16), plan.phase).await?;
    if let Some(bad) = opened
        .iter()
        .find(|(_, r)| !matches!(r.outcome, Outcome::Completed { .. }))
    {
        bail!("a bench sandbox did not open: {:?}", bad.1.outcome);
    }

    let floor = Floor::create(&js, payload_bytes).await?;
    let publish_ack = floor.publish_ack(plan.samples, plan.phase).await?;
    let three_hop = floor
        .three_hop(&js, &client, plan.samples, plan.phase)
        .await?;
    let three_hop_processes = floor
        .three_hop_processes(&cluster.url, &client, plan.samples, plan.phase)
        .await?;

    // Orchestration at concurrency 1: one action at a time in trajectory t0.
    let mut orchestration = Vec::new();
    let mut end_to_end = Vec::new();
    let mut exec = Vec::new();
    let (mut queued, mut overhead) = (Vec::new(), Vec::new());
    let phase_end = Instant::now() + plan.phase;
    for i in 0..plan.samples {
        if Instant::now() > phase_end {
            break;
        }
        let a = exec_action(&format!("seq-{i}"), "t0");
        let (took, r) = submit_and_wait(&js, &results, &a).await?;
        let exec_us = r.timing.exec_us as f64;
        queued.push(r.timing.queued_us as f64);
        overhead.push(r.timing.overhead_us as f64);
        end_to_end.push(took.as_secs_f64() * 1e6);
        orchestration.push(took.as_secs_f64() * 1e6 - exec_us);
        exec.push(exec_us);
    }
    for v in [
        &mut orchestration,
        &mut end_to_end,
        &mut exec,
        &mut queued,
        &mut overhead,
    ] {
        v.sort_by(f64::total_cmp);
    }

    // Throughput: `concurrency` trajectories, each one action at a time, until `actions`.
    let writes_before = stream_writes(&js).await?;
    let actions: Vec<Action> = (0..plan.actions)
        .map(|i| exec_action(&format!("tp-{i}"), &format!("t{}", i % plan.concurrency)))
        .collect();
    let t0 = Instant::now();
    let done = run_by_trajectory(&js, &results, actions, plan.concurrency, plan.phase).await?;
    let secs = t0.elapsed().as_secs_f64();
    let writes_after = stream_writes(&js).await?;
    let deltas: Vec<u64> = writes_after
        .iter()
        .map(|(k, v)| v - writes_before.get(k).copied().unwrap_or(0))
        .collect();
    let writes: u64 = deltas.iter().sum();
    let streams_written = deltas.iter().filter(|&&d| d > 0).count();
    let mut act: Vec<f64> = done.iter().map(|(d, _)| d.as_secs_f64() * 1e3).collect();
    act.sort_by(f64::total_cmp);
    let completed = done
        .iter()
        .filter(|(_, r)| matches!(r.outcome, Outcome::Completed { .. }))
        .count();
    let actions_per_s = done.len() as f64 / secs;
    let writes_per_action = writes as f64 / done.len().max(1) as f64;

    // The persisted-writes floors last, so their backlog cannot slow the action path. The
    // target is set against one stream (the design's floor); the server syncs each stream on
    // its own, so the same writes spread over as many streams as the actions wrote to go
    // faster, and that allowance is reported beside it.
    let writes_per_s = floor
        .persisted_writes(plan.writes, plan.window, 1, plan.phase)
        .await?;
    let writes_per_s_spread = floor
        .persisted_writes(plan.writes, plan.window, streams_written, plan.phase)
        .await?;
    let allowance = writes_per_s / writes_per_action.max(1.0);
    let allowance_spread = writes_per_s_spread / writes_per_action.max(1.0);

    let submitted: Vec<ActionId> = opened
        .iter()
        .map(|(_, r)| r.id.clone())
        .chain((0..end_to_end.len()).map(|i| ActionId(format!("seq-{i}").into())))
        .chain(done.iter().map(|(_, r)| r.id.clone()))
        .collect();
    let counts = results_in_stream(&js, &job, plan.phase).await?;
    let exactly_one = submitted
        .iter()
        .filter(|id| counts.get(id.as_str()) == Some(&1))
        .count();
    let missing = submitted
        .iter()
        .filter(|id| !counts.contains_key(id.as_str()))
        .count();
    let duplicated = submitted
        .iter()
        .filter(|id| counts.get(id.as_str()).is_some_and(|&n| n > 1))
        .count();

    let p = |v: &[f64], q: f64| (quantile(v, q) * 10.0).round() / 10.0;
    let pa = publish_ack;
    let hop_p50 = quantile(&three_hop, 0.5);
    let orch_p50 = quantile(&orchestration, 0.5);
    let ratio = orch_p50 / hop_p50.max(f64::MIN_POSITIVE);
    let share = actions_per_s / allowance.max(f64::MIN_POSITIVE);
    let throughput_target = if sync == "always" {
        json!({"what": "actions/s >= 70% of persisted writes/s (one stream) / writes per action", "met": share >= 0.7})
    } else {
        json!({"what": "actions/s >= 2,000", "met": actions_per_s >= 2000.0})
    };
    Ok(json!({
        "sync": sync,
        "floor": {
            "payload_bytes": payload_bytes,
            "publish_ack_p50_us": p(&pa, 0.5),
            "publish_ack_p99_us": p(&pa, 0.99),
            "three_hop_p50_us": p(&three_hop, 0.5),
            "three_hop_p99_us": p(&three_hop, 0.99),
            "three_hop_samples": three_hop.len(),
            "three_hop_processes_p50_us": p(&three_hop_processes, 0.5),
            "three_hop_processes_p99_us": p(&three_hop_processes, 0.99),
            "persisted_writes_per_s": writes_per_s.round(),
            "persisted_writes_per_s_spread": writes_per_s_spread.round(),
            "spread_over_streams": streams_written,
        },
        "concurrency_1": {
            "actions": end_to_end.len(),
            "orchestration_p50_us": p(&orchestration, 0.5),
            "orchestration_p99_us": p(&orchestration, 0.99),
            "end_to_end_p50_us": p(&end_to_end, 0.5),
            "exec_p50_us": p(&exec, 0.5),
            "worker_queued_p50_us": p(&queued, 0.5),
            "worker_overhead_p50_us": p(&overhead, 0.5),
            "orchestration_over_three_hop_p50": (ratio * 100.0).round() / 100.0,
            "orchestration_over_three_hop_processes_p50": (orch_p50 / quantile(&three_hop_processes, 0.5).max(f64::MIN_POSITIVE) * 100.0).round() / 100.0,
            "target": {"what": "orchestration p50 <= 1.5x the three-hop floor", "met": ratio <= 1.5},
        },
        "throughput": {
            "concurrency": plan.concurrency,
            "actions": done.len(),
            "completed": completed,
            "seconds": (secs * 1000.0).round() / 1000.0,
            "actions_per_s": actions_per_s.round(),
            "act_p50_ms": p(&act, 0.5),
            "act_p99_ms": p(&act, 0.99),
            "persisted_writes_per_action": (writes_per_action * 100.0).round() / 100.0,
            "actions_per_s_the_writes_allow": allowance.round(),
            "share_of_the_writes_allowance": (share * 100.0).round() / 100.0,
            "actions_per_s_the_spread_writes_allow": allowance_spread.round(),
            "share_of_the_spread_writes_allowance": (actions_per_s / allowance_spread.max(f64::MIN_POSITIVE) * 100.0).round() / 100.0,
            "target": throughput_target,
        },
        "results": {
            "submitted": submitted.len(),
            "exactly_one": exactly_one,
            "missing": missing,
            "duplicated": duplicated,
        },
    }))
}
