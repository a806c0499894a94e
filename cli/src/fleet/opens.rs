//! `tangram bench opens`: how long a `sandbox_open` takes on one real Docker worker, for a
//! held-out mix of open shapes (the default; 256 MB and 1 GiB of memory; an environment of
//! its own; a task image other than the default), with the worker's warm pool on and, for
//! the comparison, off. Each open is timed from its publish to its result, then its sandbox
//! runs `true` (the exec round trip beside it) and is closed.

use super::cluster::{Cluster, Shape as ClusterShape};
use super::load::{exec_true, Load, JOB};
use super::{docker, ms, pcts};
use anyhow::{bail, Context as _};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;
use tangram_shared::{
    Action, ActionId, ActionSpec, JobId, SandboxClose, SandboxOpen, TrajectoryId,
};
use tokio::time::Instant;

/// Options of `tangram bench opens`.
#[derive(Debug, clap::Args)]
pub struct OpensArgs {
    /// Opens measured per shape with the warm pool on.
    #[arg(long, default_value_t = 20)]
    pub rounds: u32,
    /// Opens measured per shape with the pool off (each a container creation).
    #[arg(long, default_value_t = 5)]
    pub cold_rounds: u32,
    /// Opens a second, one at a time, across the shapes in turn.
    #[arg(long, default_value_t = 1.0)]
    pub rate: f64,
    /// The worker's `warm_pool` (its ceiling); its floor is half of it.
    #[arg(long, default_value_t = 8)]
    pub warm_pool: u32,
    /// The worker's default sandbox image; the task image is it under another name.
    #[arg(long, default_value = "tangram/sandbox:poly-v2")]
    pub image: String,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
    /// nats-server binary [default: tools/bin/nats-server above the working directory, then PATH].
    #[arg(long, env = "TANGRAM_NATS_SERVER")]
    pub nats_server: Option<PathBuf>,
}

/// The held-out shapes, by name.
fn shapes(task_image: &str) -> Vec<(&'static str, SandboxOpen)> {
    let with = |f: &dyn Fn(&mut SandboxOpen)| {
        let mut o = SandboxOpen::default();
        f(&mut o);
        o
    };
    vec![
        ("default", SandboxOpen::default()),
        ("memory 256 MB", with(&|o| o.memory_mb = 256)),
        ("memory 1 GiB", with(&|o| o.memory_mb = 1024)),
        (
            "env",
            with(&|o| {
                o.env.insert("TASK_SEED".into(), "7".into());
            }),
        ),
        (
            "task image",
            with(&|o| o.image = Some(task_image.to_string())),
        ),
    ]
}

/// Runs the bench and prints the report.
pub fn opens(a: OpensArgs) -> anyhow::Result<()> {
    if a.rounds == 0 || a.rate <= 0.0 {
        bail!("--rounds and --rate must be positive");
    }
    let nats = crate::nats_server::find(a.nats_server.as_ref())?;
    // A task image of its own name: the default image under another tag, removed after.
    let base = a.image.as_str();
    let task_image = format!("tangram-bench/task:opens-{}", std::process::id());
    docker(&["tag", base, &task_image]).with_context(|| {
        format!("tagging {base}; build it first with deploy/build-sandbox-image.sh")
    })?;
    let _untag = Untag(task_image.clone());
    let rt = tokio::runtime::Runtime::new()?;
    let load_before = crate::pipeline::loadavg();
    let mut runs = Vec::new();
    for (label, pool, rounds) in [("warm", a.warm_pool, a.rounds), ("cold", 0, a.cold_rounds)] {
        if rounds == 0 {
            continue;
        }
        let cluster = start(&nats, pool, &a.image)?;
        let r = rt.block_on(run(&cluster, &a, &task_image, pool, rounds));
        let r = r.with_context(|| cluster.log_tails())?;
        runs.push((label, r));
    }
    let report = json!({
        "bench": "opens",
        "load_before": load_before,
        "load_after": crate::pipeline::loadavg(),
        "rate": a.rate,
        "warm_pool": a.warm_pool,
        "runs": runs.iter().map(|(l, r)| json!({"pool": l, "shapes": r})).collect::<Vec<_>>(),
    });
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_table(&report);
    }
    Ok(())
}

/// Removes the task image's tag when dropped.
struct Untag(String);
impl Drop for Untag {
    fn drop(&mut self) {
        let _ = docker(&["rmi", &self.0]);
    }
}

/// nats-server, the two schedulers and one Docker worker keeping a pool of `pool`.
fn start(nats: &std::path::Path, pool: u32, image: &str) -> anyhow::Result<Cluster> {
    let mut c = Cluster::start(
        nats,
        &ClusterShape {
            workers: 0,
            cores: 2,
            mem_mb: 16_384,
            heartbeat_ms: 500,
            groups: 1,
            sync: "always".into(),
            // One Docker host's own costs: no roles, reward replicas or api provider.
            auth: false,
            gpus: 0,
            api_rate: 0.0,
        },
    )?;
    let online = std::thread::available_parallelism().map_or(1, |n| n.get());
    c.add_worker(
        tangram_nats::local::WorkerProcess {
            id: Some("opens-w".into()),
            cores: Some(format!("0-{}", online - 1)),
            mem_mb: Some(16_384),
            heartbeat_ms: Some(500),
            ..Default::default()
        },
        &[
            ("TANGRAM_WORKER_SANDBOX__IMAGE", image.to_string()),
            // The task image is a tag made on this host (see `run`), opened without a pull.
            (
                "TANGRAM_WORKER_SANDBOX__IMAGES",
                "[\"docker.io/tangram-bench/*\"]".to_string(),
            ),
            ("TANGRAM_WORKER_SANDBOX__WARM_POOL", pool.to_string()),
            (
                "TANGRAM_WORKER_SANDBOX__WARM_POOL_MIN",
                (pool / 2).to_string(),
            ),
        ],
    )?;
    Ok(c)
}

struct Ids(std::sync::atomic::AtomicU64);
impl Ids {
    fn action(&self, t: &str, what: &str, spec: ActionSpec) -> Action {
        let n = self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Action {
            queue_timeout_ms: None,
            id: ActionId(format!("opens-{}-{what}-{n}", std::process::id()).into()),
            job: JobId(JOB.into()),
            trajectory: TrajectoryId(t.into()),
            timeout_ms: 60_000,
            spec,
        }
    }
}

/// One pool setting: waits for the worker (and its pool's floor), then opens, execs `true`
/// in and closes one sandbox at a time, shapes in turn, at `rate`.
async fn run(
    cluster: &Cluster,
    a: &OpensArgs,
    task_image: &str,
    pool: u32,
    rounds: u32,
) -> anyhow::Result<Value> {
    let load = Load::start(&cluster.url, None, None).await?;
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let s = super::status(load.client()).await.ok();
        let w = s
            .as_ref()
            .and_then(|s| s.0.workers.iter().find(|w| w.id == "opens-w").cloned());
        if w.is_some_and(|w| pool == 0 || w.warm.is_some_and(|p| p.ready >= pool / 2)) {
            break;
        }
        if Instant::now() > deadline {
            bail!("the worker (and its warm pool) did not come up within 120 s");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let ids = Ids(Default::default());
    let shapes = shapes(task_image);
    let mut opens: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    let mut execs: Vec<f64> = Vec::new();
    let mut failed = 0;
    let gap = Duration::from_secs_f64(1.0 / a.rate);
    // One unmeasured open of each shape first: the worker learns what is asked for, as it
    // would from a job's first trajectories.
    for r in 0..=rounds {
        for (name, open) in &shapes {
            let next = Instant::now() + gap;
            let t = format!("{}-{r}", name.replace(' ', "-"));
            let o = load
                .submit(ids.action(&t, "open", ActionSpec::SandboxOpen(open.clone())))
                .await;
            let Some(o) = o.filter(|o| o.completed) else {
                failed += 1;
                continue;
            };
            let e = load.submit(ids.action(&t, "exec", exec_true())).await;
            let c = load
                .submit(ids.action(
                    &t,
                    "close",
                    ActionSpec::SandboxClose(SandboxClose::default()),
                ))
                .await;
            if c.is_none_or(|c| !c.completed) || e.as_ref().is_none_or(|e| !e.completed) {
                failed += 1;
            }
            if r > 0 {
                opens
                    .entry(name)
                    .or_default()
                    .push(ms(o.answered - o.published));
                if let Some(e) = e {
                    execs.push(ms(e.answered - e.published));
                }
            }
            tokio::time::sleep_until(next).await;
        }
    }
    if failed > 0 {
        bail!("{failed} opens, execs or closes did not complete");
    }
    let (st, _, _) = super::status(load.client()).await?;
    let warm = st
        .workers
        .iter()
        .find(|w| w.id == "opens-w")
        .and_then(|w| w.warm);
    Ok(json!({
        "opens_ms": shapes.iter().map(|(n, _)| (n.to_string(), pcts(opens.remove(n).unwrap_or_default()))).collect::<serde_json::Map<_, _>>(),
        "exec_true_ms": pcts(execs),
        "pool": warm.map(|p| json!({"hits": p.hits, "misses": p.misses, "ready": p.ready})),
    }))
}

fn print_table(r: &Value) {
    println!(
        "tangram bench opens: one Docker worker, {} opens/s one at a time; load {} before, {} after",
        r["rate"], r["load_before"], r["load_after"]
    );
    let mut t = crate::table::new(["pool", "shape", "n", "p50 ms", "p99 ms"]);
    crate::table::left(&mut t, &[1]);
    for run in r["runs"].as_array().into_iter().flatten() {
        let pool = run["pool"].as_str().unwrap_or("");
        let shapes = &run["shapes"];
        let rows = shapes["opens_ms"]
            .as_object()
            .into_iter()
            .flatten()
            .map(|(s, v)| (format!("open, {s}"), v))
            .chain(std::iter::once((
                "exec `true`, any shape".to_string(),
                &shapes["exec_true_ms"],
            )));
        for (what, v) in rows {
            t.add_row([
                pool.to_string(),
                what,
                v["n"].to_string(),
                v["p50"].to_string(),
                v["p99"].to_string(),
            ]);
        }
    }
    print!("{}", crate::table::render(&t, ""));
    for run in r["runs"].as_array().into_iter().flatten() {
        if let Some(p) = run["shapes"]["pool"].as_object() {
            println!(
                "{} pool at the end: {} hits, {} misses, {} ready",
                run["pool"], p["hits"], p["misses"], p["ready"]
            );
        }
    }
}
