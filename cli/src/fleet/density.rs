//! `tangram bench density`: how many sandboxes one real Docker worker keeps open, what each
//! costs the host, and how fast they open, run and close at that density. Two runs, each a
//! fresh cluster (nats-server, the schedulers, one Docker worker with the default hardening):
//! - pool off: opens `--sandboxes`, `--in-flight` at a time (every one a creation), timing
//!   `true` round trips with 10 open and again with all open; the host's memory before and
//!   after, and where it went; then closes them all, `--in-flight` at a time;
//! - pool on: waits for a full pool of `--warm-pool`, then opens that many at once (claims).

use super::cluster::{Cluster, Shape as ClusterShape};
use super::load::{exec_true, Load, Sample, JOB};
use super::{ms, pcts};
use anyhow::{bail, Context as _};
use futures::StreamExt as _;
use serde_json::{json, Value};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tangram_shared::{
    Action, ActionId, ActionSpec, JobId, SandboxClose, SandboxOpen, TrajectoryId,
};
use tokio::time::Instant;

mod host;

/// The worker's id.
const WORKER: &str = "density-w";
/// Sandboxes open for the first exec measurement.
const FEW: usize = 10;

/// Options of `tangram bench density`.
#[derive(Debug, clap::Args)]
pub struct DensityArgs {
    /// Sandboxes kept open at once (the density measured).
    #[arg(long, default_value_t = 200)]
    pub sandboxes: u32,
    /// Opens (and closes) in flight at once.
    #[arg(long, default_value_t = 8)]
    pub in_flight: usize,
    /// `true` round trips timed at each density, one at a time across the open sandboxes.
    #[arg(long, default_value_t = 200)]
    pub execs: u32,
    /// The warm run's pool (floor and ceiling); 0 skips the warm run.
    #[arg(long, default_value_t = 16)]
    pub warm_pool: u32,
    /// The sandbox image.
    #[arg(long, default_value = "tangram/sandbox:poly-v2")]
    pub image: String,
    /// The OCI runtime sandboxes run under (`runsc` for gVisor), as registered with the
    /// Docker daemon; repeat it to measure several side by side in one run (each in a fresh
    /// cluster). Docker's default when absent.
    #[arg(long)]
    pub runtime: Vec<String>,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
    /// nats-server binary [default: tools/bin/nats-server above the working directory, then PATH].
    #[arg(long, env = "TANGRAM_NATS_SERVER")]
    pub nats_server: Option<PathBuf>,
}

/// Runs the bench and prints the report.
pub fn density(a: DensityArgs) -> anyhow::Result<()> {
    if (a.sandboxes as usize) < FEW || a.in_flight == 0 || a.execs == 0 {
        bail!("--sandboxes must be at least {FEW}; --in-flight and --execs positive");
    }
    let nats = crate::nats_server::find(a.nats_server.as_ref())?;
    let rt = tokio::runtime::Runtime::new()?;
    let load_before = crate::pipeline::loadavg();
    let runtimes: Vec<Option<String>> = match a.runtime.is_empty() {
        true => vec![None],
        false => a.runtime.iter().cloned().map(Some).collect(),
    };
    let mut runs = Vec::new();
    for runtime in &runtimes {
        let cold = {
            let cluster = start(&nats, &a, 0, runtime.as_deref())?;
            let r = rt.block_on(cold_run(&a, &cluster.url));
            r.with_context(|| cluster.log_tails())?
        };
        let warm = if a.warm_pool > 0 {
            let cluster = start(&nats, &a, a.warm_pool, runtime.as_deref())?;
            let r = rt.block_on(warm_run(&a, &cluster.url));
            Some(r.with_context(|| cluster.log_tails())?)
        } else {
            None
        };
        runs.push(json!({
            "runtime": runtime.as_deref().unwrap_or("default"),
            "cold": cold,
            "warm": warm,
        }));
    }
    let mut report = json!({
        "bench": "density",
        "load_before": load_before,
        "load_after": crate::pipeline::loadavg(),
        "cores": std::thread::available_parallelism().map_or(1, |n| n.get()),
        "sandboxes": a.sandboxes,
        "in_flight": a.in_flight,
        // The first runtime's figures at the top, as before runtimes could be compared.
        "runtime": runs[0]["runtime"],
        "cold": runs[0]["cold"],
        "warm": runs[0]["warm"],
    });
    if a.json {
        report["runs"] = json!(runs);
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        for run in &runs {
            print_table(&report, run);
        }
    }
    Ok(())
}

/// nats-server, the schedulers and the Docker worker, whose declared memory books every
/// sandbox of the run (512 MiB each, the default open's limit) so that booking is not what
/// stops the opens.
fn start(
    nats: &std::path::Path,
    a: &DensityArgs,
    pool: u32,
    runtime: Option<&str>,
) -> anyhow::Result<Cluster> {
    let mut c = Cluster::start(
        nats,
        &ClusterShape {
            workers: 0,
            cores: 2,
            mem_mb: 0,
            heartbeat_ms: 1_000,
            groups: 1,
            sync: "default".into(),
            // One Docker host's own costs: no roles, reward replicas or api provider.
            auth: false,
            gpus: 0,
            api_rate: 0.0,
        },
    )?;
    let online = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mem_mb = (u64::from(a.sandboxes.max(pool)) + 1) * SandboxOpen::default().memory_mb;
    c.add_worker(
        tangram_nats::local::WorkerProcess {
            id: Some(WORKER.into()),
            cores: Some(format!("0-{}", online - 1)),
            mem_mb: Some(mem_mb),
            heartbeat_ms: Some(1_000),
            ..Default::default()
        },
        &[
            ("TANGRAM_WORKER_SANDBOX__IMAGE", a.image.clone()),
            ("TANGRAM_WORKER_SANDBOX__WARM_POOL", pool.to_string()),
            ("TANGRAM_WORKER_SANDBOX__WARM_POOL_MIN", pool.to_string()),
        ]
        .into_iter()
        .chain(runtime.map(|r| ("TANGRAM_WORKER_SANDBOX__RUNTIME", r.to_string())))
        .collect::<Vec<_>>()[..],
    )?;
    Ok(c)
}

/// Action ids unique to this process.
fn action(t: usize, what: &str, spec: ActionSpec) -> Action {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    Action {
        queue_timeout_ms: None,
        id: ActionId(format!("density-{}-{what}-{n}", std::process::id()).into()),
        job: JobId(JOB.into()),
        trajectory: TrajectoryId(format!("d{t}")),
        timeout_ms: 120_000,
        spec,
    }
}

/// Submits one action per trajectory of `ts`, `in_flight` at a time: the samples (all must
/// complete) and the wall time.
async fn each(
    load: &Arc<Load>,
    ts: std::ops::Range<usize>,
    in_flight: usize,
    what: &'static str,
    spec: fn() -> ActionSpec,
) -> anyhow::Result<(Vec<Sample>, Duration)> {
    let n = ts.len();
    let began = Instant::now();
    let samples: Vec<Sample> = futures::stream::iter(ts.map(|t| {
        let load = load.clone();
        async move { load.submit(action(t, what, spec())).await }
    }))
    .buffer_unordered(in_flight)
    .filter_map(|s| async move { s.filter(|s| s.completed) })
    .collect()
    .await;
    if samples.len() != n {
        bail!("{} of {n} {what}s did not complete", n - samples.len());
    }
    Ok((samples, began.elapsed()))
}

fn open() -> ActionSpec {
    ActionSpec::SandboxOpen(SandboxOpen::default())
}
fn close() -> ActionSpec {
    ActionSpec::SandboxClose(SandboxClose::default())
}

/// `execs` `true` round trips, one at a time, across the first `open` sandboxes in turn.
async fn execs(load: &Load, open: usize, execs: u32) -> anyhow::Result<Value> {
    let mut v = Vec::with_capacity(execs as usize);
    for k in 0..execs as usize {
        let s = load
            .submit(action(k % open, "exec", exec_true()))
            .await
            .filter(|s| s.completed)
            .with_context(|| format!("an exec of `true` with {open} sandboxes open failed"))?;
        v.push(ms(s.answered - s.published));
    }
    Ok(pcts(v))
}

/// The opens' latency (publish to result) and rate.
fn rate(samples: &[Sample], took: Duration) -> Value {
    let mut r = pcts(
        samples
            .iter()
            .map(|s| ms(s.answered - s.published))
            .collect(),
    );
    r["per_s"] = json!((samples.len() as f64 / took.as_secs_f64() * 10.0).round() / 10.0);
    r
}

/// Waits until the worker is up and its pool holds `ready` parked sandboxes.
async fn wait_for_worker(load: &Load, ready: u32) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let s = super::status(load.client()).await.ok();
        let w = s
            .as_ref()
            .and_then(|s| s.0.workers.iter().find(|w| w.id == WORKER).cloned());
        if w.is_some_and(|w| ready == 0 || w.warm.is_some_and(|p| p.ready >= ready)) {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("the worker (with {ready} parked sandboxes) did not come up within 300 s");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

async fn cold_run(a: &DensityArgs, url: &str) -> anyhow::Result<Value> {
    let n = a.sandboxes as usize;
    let load = Load::start(url, None, None).await?;
    wait_for_worker(&load, 0).await?;
    let before = host::Snapshot::take(WORKER)?;
    let (mut opened, _) = each(&load, 0..FEW, a.in_flight, "open", open).await?;
    let exec_few = execs(&load, FEW, a.execs).await?;
    let (rest, took) = each(&load, FEW..n, a.in_flight, "open", open).await?;
    let open_rate = rate(&rest, took);
    opened.extend(rest);
    let after = host::Snapshot::take(WORKER)?;
    if after.containers != n {
        bail!(
            "{} containers of the worker run, {n} sandboxes were opened",
            after.containers
        );
    }
    let exec_all = execs(&load, n, a.execs).await?;
    let (closed, took) = each(&load, 0..n, a.in_flight, "close", close).await?;
    let left = host::Snapshot::take(WORKER)?.containers;
    if left != 0 {
        bail!("{left} containers left after every sandbox was closed");
    }
    Ok(json!({
        "opens": open_rate,
        "first_opens_ms": pcts(opened[..FEW].iter().map(|s| ms(s.answered - s.published)).collect()),
        "exec_true_ms": {FEW.to_string(): exec_few, n.to_string(): exec_all},
        "closes": rate(&closed, took),
        "memory": host::per_sandbox(&before, &after),
    }))
}

async fn warm_run(a: &DensityArgs, url: &str) -> anyhow::Result<Value> {
    let p = a.warm_pool as usize;
    let load = Load::start(url, None, None).await?;
    wait_for_worker(&load, a.warm_pool).await?;
    let (claims, took) = each(&load, 0..p, a.in_flight, "open", open).await?;
    // The pool's counts arrive with the worker's next heartbeats.
    let deadline = Instant::now() + Duration::from_secs(10);
    let pool = loop {
        let st = super::status(load.client()).await?.0;
        let pool = st
            .workers
            .iter()
            .find(|w| w.id == WORKER)
            .and_then(|w| w.warm);
        if pool.is_some_and(|w| w.hits + w.misses >= p as u64) || Instant::now() > deadline {
            break pool;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let _ = each(&load, 0..p, a.in_flight, "close", close).await?;
    Ok(json!({
        "opens": rate(&claims, took),
        "pool": pool.map(|p| json!({"hits": p.hits, "misses": p.misses})),
    }))
}

fn print_table(r: &Value, run: &Value) {
    println!(
        "tangram bench density: one Docker worker ({} cores, runtime {}), {} sandboxes, {} opens in flight; load {} before, {} after",
        r["cores"], run["runtime"], r["sandboxes"], r["in_flight"], r["load_before"], r["load_after"]
    );
    let r = run;
    let mut t = crate::table::new(["what", "n", "p50 ms", "p99 ms", "per s"]);
    crate::table::left(&mut t, &[0]);
    let c = &r["cold"];
    let mut row = |what: String, v: &Value| {
        t.add_row([
            what,
            v["n"].to_string(),
            v["p50"].to_string(),
            v["p99"].to_string(),
            v.get("per_s").map_or("".into(), |x| x.to_string()),
        ]);
    };
    row("open, pool off (a creation)".into(), &c["opens"]);
    if !r["warm"].is_null() {
        row(
            "open, from a full pool (a claim)".into(),
            &r["warm"]["opens"],
        );
    }
    for (k, v) in c["exec_true_ms"].as_object().into_iter().flatten() {
        row(format!("exec `true`, {k} open"), v);
    }
    row("close".into(), &c["closes"]);
    print!("{}", crate::table::render(&t, ""));
    let m = &c["memory"];
    println!(
        "host memory a parked sandbox: {} KiB (MemAvailable); container cgroup {} KiB, shim {} KiB, dockerd and containerd {} KiB",
        m["host_kib"], m["cgroup_kib"], m["shim_kib"], m["daemons_kib"]
    );
    println!(
        "sandboxes this host could park at that rate: about {}",
        m["fit_in_available"]
    );
}
