//! `tangram cordon`, `uncordon` and `drain`: an operator's record under `cordon.<worker>`
//! in the scheduler's bucket, which the leader watches (and the worker reads, to close its
//! sandboxes at a drain's deadline).

use crate::connect::{unix_ms, ClusterArgs};
use clap::Args;
use std::time::Duration;
use tangram_shared::status::CordonRecord;
use tangram_shared::{subject, WorkerId};

/// A worker of a cluster.
#[derive(Debug, Args)]
pub(crate) struct Target {
    /// The worker's id.
    worker: String,
    #[command(flatten)]
    cluster: ClusterArgs,
}

/// `tangram drain`'s options.
#[derive(Debug, Args)]
pub(crate) struct DrainArgs {
    #[command(flatten)]
    target: Target,
    /// Seconds the worker's open sandboxes get for their trajectories to close them; then
    /// they are closed, and commands sent to them are rejected (`no_sandbox`).
    #[arg(long, default_value_t = 600)]
    deadline_s: u64,
    /// Return once the record is written instead of waiting until nothing runs there.
    #[arg(long)]
    no_wait: bool,
}

/// What to do.
pub(crate) enum Op {
    Cordon,
    Uncordon,
}

fn worker_id(t: &Target) -> anyhow::Result<WorkerId> {
    WorkerId::new(t.worker.clone()).map_err(|e| anyhow::anyhow!("worker {:?}: {e}", t.worker))
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?)
}

async fn store(t: &Target) -> anyhow::Result<async_nats::jetstream::kv::Store> {
    let (url, creds) = t.cluster.resolve();
    let client = crate::errors::connect(&url, "tangram-cli", &creds).await?;
    let js = async_nats::jetstream::new(client);
    js.get_key_value(subject::SCHEDULER_BUCKET)
        .await
        .map_err(|e| {
            anyhow::anyhow!(
            "reading the scheduler's bucket at {url}: {e} (has a scheduler run on this cluster?)"
        )
        })
}

fn record(drain_by_unix_ms: Option<u64>) -> CordonRecord {
    CordonRecord {
        drain_by_unix_ms,
        by: std::env::var("USER").unwrap_or_else(|_| "tangram".into()),
        at_unix_ms: unix_ms(),
    }
}

/// `tangram cordon` and `tangram uncordon`.
pub(crate) fn set(t: Target, op: Op) -> anyhow::Result<()> {
    let worker = worker_id(&t)?;
    runtime()?.block_on(async {
        let kv = store(&t).await?;
        let key = subject::cordon_key(&worker);
        match op {
            Op::Cordon => {
                kv.put(&key, serde_json::to_vec(&record(None))?.into())
                    .await?;
                println!("{worker} cordoned: no new sandboxes or api/reward calls go there; its open sandboxes keep running");
            }
            Op::Uncordon => {
                kv.delete(&key).await?;
                println!("{worker} uncordoned");
            }
        }
        Ok(())
    })
}

/// `tangram drain`: cordons with a deadline, then (unless `--no-wait`) waits until the
/// worker runs nothing and holds no sandbox, printing what is left.
pub(crate) fn drain(a: DrainArgs) -> anyhow::Result<()> {
    let worker = worker_id(&a.target)?;
    let deadline = unix_ms() + a.deadline_s * 1000;
    runtime()?.block_on(async {
        let kv = store(&a.target).await?;
        kv.put(
            subject::cordon_key(&worker),
            serde_json::to_vec(&record(Some(deadline)))?.into(),
        )
        .await?;
        Ok::<_, anyhow::Error>(())
    })?;
    println!(
        "{worker} draining: cordoned; open sandboxes are closed in {} s if their trajectories have not closed them",
        a.deadline_s
    );
    if a.no_wait {
        return Ok(());
    }
    let (url, creds) = a.target.cluster.resolve();
    let mut last = None;
    // Bounded: the deadline, plus a minute for the last commands and the close to land.
    let give_up = tokio::time::Instant::now() + Duration::from_secs(a.deadline_s + 60);
    loop {
        let st = crate::cluster::fetch_status(&url, &creds, Duration::from_secs(5))?;
        let Some(w) = st.workers.iter().find(|w| w.id == worker.as_str()) else {
            println!(
                "{worker} is not in the cluster (stopped, or never joined): nothing to wait for"
            );
            return Ok(());
        };
        let now = (w.running, w.sandboxes);
        if now == (0, 0) {
            println!(
                "{worker} drained: nothing runs there and no sandbox is open; it can be stopped"
            );
            return Ok(());
        }
        if last != Some(now) {
            println!("  {} action(s) running, {} sandbox(es) open", now.0, now.1);
            last = Some(now);
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < give_up,
            "{worker} still runs {} action(s) with {} sandbox(es) a minute past the drain deadline",
            now.0,
            now.1
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}
