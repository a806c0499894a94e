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

mod floor;
mod table;

use anyhow::{bail, Context as _};
use async_nats::jetstream::{self, consumer};
pub use floor::relay;
use floor::Floor;
use futures::stream::FuturesUnordered;
use futures::StreamExt as _;
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

/// The shipped server config with the sync setting under test: `always`, or no
/// `sync_interval` at all (the server's default).
pub(crate) fn server_conf(sync: &str) -> anyhow::Result<String> {
    let mut conf: String = SERVER_CONF
        .lines()
        .filter(|l| !l.trim_start().starts_with("sync_interval"))
        .map(|l| format!("{l}\n"))
        .collect();
    if sync == "always" {
        let Some(at) = conf.find("jetstream {\n") else {
            bail!("nats/server.conf has no `jetstream {{` block to set sync_interval in");
        };
        conf.insert_str(at + "jetstream {\n".len(), "  sync_interval: always\n");
    }
    Ok(conf)
}

/// A child process killed when dropped.
#[derive(Debug)]
pub(crate) struct Proc {
    pub(crate) name: &'static str,
    pub(crate) child: Child,
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            // SIGTERM first: the worker removes its sandboxes on a graceful stop.
            let _ = crate::cluster::signal(self.child.id(), rustix::process::Signal::TERM);
            let deadline = Instant::now() + Duration::from_secs(15);
            while matches!(self.child.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// nats-server, the scheduler and one CPU worker on loopback, in a temporary directory.
#[derive(Debug)]
struct LocalCluster {
    // Dropped in order: the worker first (it removes its sandboxes), the server last.
    procs: Vec<Proc>,
    url: String,
    worker: String,
    dir: tempfile::TempDir,
}

impl LocalCluster {
    fn start(nats: &Path, sync: &str, plan: &Plan) -> anyhow::Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("tangram-bench-")
            .tempdir()?;
        std::fs::create_dir_all(dir.path().join("store"))?;
        std::fs::write(dir.path().join("server.conf"), server_conf(sync)?)?;
        let port = crate::cluster::free_port()?;
        let url = format!("nats://127.0.0.1:{port}");
        let worker = format!("bench-{}", std::process::id());
        let mut c = LocalCluster {
            procs: Vec::new(),
            url: url.clone(),
            worker: worker.clone(),
            dir,
        };
        let d = c.dir.path().to_path_buf();
        let server = tangram_nats::local::LocalServer {
            bin: nats,
            conf: &d.join("server.conf"),
            store: &d.join("store"),
            port,
            monitor_port: crate::cluster::free_port()?,
        };
        c.spawn("nats", &mut server.command()).with_context(|| {
            format!(
                "nats-server ({}); install it with deploy/install-tools.sh",
                nats.display()
            )
        })?;
        let listening = tangram_nats::local::wait_listening(
            port,
            Duration::from_secs(10),
            Duration::from_millis(50),
        );
        if !listening {
            bail!("nats-server did not start\n{}", c.log_tails());
        }
        let scheduler = SchedulerProcess {
            nats_url: Some(url.clone()),
            ..Default::default()
        };
        let bin = crate::cluster::sibling("tangram-scheduler")?;
        c.spawn("scheduler", &mut scheduler.command(&bin))?;
        let w = WorkerProcess {
            id: Some(worker.clone()),
            nats_url: Some(url.clone()),
            cores: Some(plan.worker_cores.clone()),
            mem_mb: Some((plan.concurrency as u64 + 2) * SANDBOX_MB),
            heartbeat_ms: Some(200),
            sandbox_runtime: (plan.runtime != "docker").then(|| plan.runtime.clone()),
            ..Default::default()
        };
        let bin = crate::cluster::sibling("tangram-worker")?;
        c.spawn("worker", &mut w.command(&bin))?;
        // The worker goes first when the cluster drops.
        c.procs.reverse();
        Ok(c)
    }

    fn spawn(&mut self, name: &'static str, cmd: &mut Command) -> anyhow::Result<()> {
        let log = self.dir.path().join(format!("{name}.log"));
        let child = crate::cluster::spawn_logged(&log, name, cmd)?;
        self.procs.push(Proc { name, child });
        Ok(())
    }

    fn log_tails(&self) -> String {
        self.procs
            .iter()
            .map(|p| {
                let text = std::fs::read_to_string(self.dir.path().join(format!("{}.log", p.name)))
                    .unwrap_or_default();
                let lines: Vec<&str> = text.lines().collect();
                format!(
                    "--- {} log (last lines)\n{}",
                    p.name,
                    lines[lines.len().saturating_sub(10)..].join("\n")
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// Waits until the scheduler's status lists `worker`.
async fn wait_for_worker(
    client: &async_nats::Client,
    worker: &str,
    within: Duration,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        let reply = tangram_nats::status::fetch(client, Duration::from_secs(2)).await;
        if let Ok(f) = reply {
            if f.status.workers.iter().any(|w| w.id == worker) {
                return Ok(());
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    bail!("the scheduler did not list worker {worker} within {within:?}")
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

fn exec_action(id: &str, trajectory: &str) -> Action {
    Action {
        id: ActionId(id.into()),
        job: JobId(JOB.into()),
        trajectory: TrajectoryId(trajectory.into()),
        timeout_ms: ACTION_WAIT.as_millis() as u64,
        spec: ActionSpec::SandboxExec(SandboxExec {
            argv: vec!["true".into()],
            cpus: CpuRange { min: 1, max: 1 },
            files: BTreeMap::new(),
            env: BTreeMap::new(),
            stdin: None,
        }),
    }
}

fn open_action(id: &str, trajectory: &str) -> Action {
    Action {
        id: ActionId(id.into()),
        job: JobId(JOB.into()),
        trajectory: TrajectoryId(trajectory.into()),
        timeout_ms: ACTION_WAIT.as_millis() as u64,
        spec: ActionSpec::SandboxOpen(SandboxOpen {
            memory_mb: SANDBOX_MB,
            workdir_mb: 16,
            ..Default::default()
        }),
    }
}

type Waiters = Arc<Mutex<HashMap<ActionId, oneshot::Sender<(Instant, ActionResult)>>>>;

/// One subscription to the bench job's results, handing each to whoever waits for it, with the
/// moment it arrived.
#[derive(Debug)]
struct ResultReader {
    waiters: Waiters,
    _task: tokio::task::JoinSet<()>,
}

impl ResultReader {
    async fn start(client: &async_nats::Client) -> anyhow::Result<Self> {
        let mut sub = client
            .subscribe(format!("{}.result.{JOB}.>", subject::PREFIX))
            .await?;
        let waiters: Waiters = Arc::default();
        let w = waiters.clone();
        let mut task = tokio::task::JoinSet::new();
        task.spawn(async move {
            while let Some(m) = sub.next().await {
                let at = Instant::now();
                let enc = Encoding::from_content_type(
                    m.headers
                        .as_ref()
                        .and_then(|h| h.get(subject::HEADER_CONTENT_TYPE))
                        .map(|v| v.as_str()),
                )
                .unwrap_or(Encoding::Msgpack);
                let Ok(r) = codec::decode::<ActionResult>(&m.payload, enc) else {
                    continue;
                };
                let waiter = w.lock().expect("lock").remove(&r.id);
                if let Some(tx) = waiter {
                    let _ = tx.send((at, r));
                }
            }
        });
        Ok(Self {
            waiters,
            _task: task,
        })
    }

    fn expect(&self, id: &ActionId) -> oneshot::Receiver<(Instant, ActionResult)> {
        let (tx, rx) = oneshot::channel();
        self.waiters.lock().expect("lock").insert(id.clone(), tx);
        rx
    }
}

/// Publishes `a` (waiting for JetStream to store it) and waits for its result; returns the
/// time from publishing to the result in hand.
async fn submit_and_wait(
    js: &jetstream::Context,
    results: &ResultReader,
    a: &Action,
) -> anyhow::Result<(Duration, ActionResult)> {
    let rx = results.expect(&a.id);
    let mut headers = async_nats::HeaderMap::new();
    headers.insert(subject::HEADER_MSG_ID, a.id.as_str());
    let t0 = Instant::now();
    js.publish_with_headers(
        subject::action(&a.job, a.kind()),
        headers,
        codec::encode(a, Encoding::Msgpack)?.into(),
    )
    .await?
    .await
    .context("the action was not stored")?;
    let (at, r) = tokio::time::timeout(ACTION_WAIT, rx)
        .await
        .with_context(|| format!("no result for {} within {ACTION_WAIT:?}", a.id))?
        .context("the result reader stopped")?;
    Ok((at - t0, r))
}

/// Runs `actions` with at most `limit` in flight, in any order.
async fn run_concurrently(
    js: &jetstream::Context,
    results: &ResultReader,
    actions: Vec<Action>,
    limit: usize,
    within: Duration,
) -> anyhow::Result<Vec<(Duration, ActionResult)>> {
    let deadline = Instant::now() + within;
    let mut pending = actions.into_iter();
    let mut running = FuturesUnordered::new();
    let mut out = Vec::new();
    loop {
        while running.len() < limit {
            let Some(a) = pending.next() else { break };
            running.push(async move { submit_and_wait(js, results, &a).await });
        }
        match tokio::time::timeout_at(deadline, running.next()).await {
            Ok(Some(r)) => out.push(r?),
            Ok(None) => return Ok(out),
            Err(_) => bail!("{} actions still running after {within:?}", running.len()),
        }
    }
}

/// Runs `actions`, one at a time per trajectory, `trajectories` at once: a trajectory's
/// sandbox takes one command at a time, as a rollout would send them.
async fn run_by_trajectory(
    js: &jetstream::Context,
    results: &ResultReader,
    actions: Vec<Action>,
    trajectories: usize,
    within: Duration,
) -> anyhow::Result<Vec<(Duration, ActionResult)>> {
    let mut lanes: Vec<Vec<Action>> = vec![Vec::new(); trajectories];
    for (i, a) in actions.into_iter().enumerate() {
        lanes[i % trajectories].push(a);
    }
    let deadline = Instant::now() + within;
    let lanes = lanes.into_iter().map(|lane| async move {
        let mut out = Vec::with_capacity(lane.len());
        for a in lane {
            if Instant::now() > deadline {
                break;
            }
            out.push(submit_and_wait(js, results, &a).await?);
        }
        anyhow::Ok(out)
    });
    let mut out = Vec::new();
    for lane in futures::future::join_all(lanes).await {
        out.extend(lane?);
    }
    Ok(out)
}

/// Messages each Tangram stream has taken so far (its last sequence).
async fn stream_writes(js: &jetstream::Context) -> anyhow::Result<BTreeMap<&'static str, u64>> {
    let mut out = BTreeMap::new();
    for name in [
        subject::ACTIONS_STREAM,
        subject::DISPATCH_STREAM,
        subject::RESULTS_STREAM,
        subject::DEADLETTER_STREAM,
    ] {
        let mut s = js.get_stream(name).await?;
        out.insert(name, s.info().await?.state.last_sequence);
    }
    Ok(out)
}

/// How many results the results stream holds per action id of the bench job.
async fn results_in_stream(
    js: &jetstream::Context,
    job: &JobId,
    within: Duration,
) -> anyhow::Result<HashMap<String, usize>> {
    let stream = js.get_stream(subject::RESULTS_STREAM).await?;
    let prefix = format!("{}.result.{job}.", subject::PREFIX);
    let consumer = stream
        .create_consumer(consumer::pull::OrderedConfig {
            filter_subject: format!("{prefix}>"),
            ..Default::default()
        })
        .await?;
    let mut counts = HashMap::new();
    if consumer.cached_info().num_pending == 0 {
        return Ok(counts);
    }
    let mut messages = consumer.messages().await?;
    let deadline = Instant::now() + within;
    loop {
        let m = tokio::time::timeout_at(deadline, messages.next())
            .await
            .context("reading the results stream back took too long")?
            .context("the results stream ended")??;
        let id = m.subject.as_str().strip_prefix(&prefix).unwrap_or_default();
        *counts.entry(id.to_string()).or_insert(0) += 1;
        if m.info().map_err(|e| anyhow::anyhow!("{e}"))?.pending == 0 {
            return Ok(counts);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_conf_sets_or_removes_the_sync_interval() {
        let always = server_conf("always").unwrap();
        let default = server_conf("default").unwrap();
        assert_eq!(always.matches("sync_interval").count(), 1, "{always}");
        assert!(always.contains("jetstream {\n  sync_interval: always\n"));
        assert!(!default.contains("sync_interval"), "{default}");
        // Nothing else changes.
        assert_eq!(always.replace("  sync_interval: always\n", ""), default);
    }
}
