//! The warm pool on a real worker with Docker sandboxes: an open claims a parked, hardened
//! container that no one used before, the pool fills again, and the worker reports it.

use std::time::Duration;
use tangram_shared::{Outcome, WarmPoolReport};
use tangram_tests::build::{close, exec, open};
use tangram_tests::{containers_of, Cluster};

const T: Duration = Duration::from_secs(60);

/// The worker's pool as the scheduler's status shows it (none while the scheduler is not
/// answering yet).
async fn pool_of(c: &tangram_tests::Client, worker: &str) -> Option<WarmPoolReport> {
    let st = c.status().await.ok()?;
    st.workers
        .iter()
        .find(|w| w.id == worker)
        .and_then(|w| w.warm)
}

/// Waits until the worker's pool reports `want(pool)`.
async fn until(
    c: &tangram_tests::Client,
    worker: &str,
    want: impl Fn(&WarmPoolReport) -> bool,
) -> anyhow::Result<WarmPoolReport> {
    let deadline = tokio::time::Instant::now() + T;
    loop {
        if let Some(p) = pool_of(c, worker).await {
            if want(&p) {
                return Ok(p);
            }
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "the pool never got there: {:?}",
            pool_of(c, worker).await
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_claims_a_warm_hardened_sandbox_and_the_pool_fills_again() -> anyhow::Result<()> {
    let mut cluster = Cluster::start(&[]).await?;
    cluster.start_sandbox_worker(
        "warm-a",
        tangram_worker::config::RawSandbox {
            warm_pool: Some(2),
            warm_pool_min: Some(2),
            ..Default::default()
        },
    )?;
    let c = cluster.client("warm").await?;
    c.wait_for_workers(&["warm-a"], T).await?;
    let p = until(&c, "warm-a", |p| p.ready == 2).await?;
    assert_eq!((p.hits, p.misses), (0, 0));
    assert_eq!(containers_of("warm-a"), 2, "two parked, nothing else");

    // Two trajectories open: each claims a parked container, a different one.
    let mut overheads = Vec::new();
    for t in ["t1", "t2"] {
        let r = c.run(&open(&format!("open-{t}"), "warm", t), T).await?;
        assert_eq!(r.outcome, Outcome::Completed { exit_code: 0 }, "{r:?}");
        overheads.push(r.timing.overhead_us);
    }
    let p = until(&c, "warm-a", |p| p.hits == 2).await?;
    assert_eq!(p.misses, 0, "{p:?}");
    // The hardening is the same as for a sandbox created on demand, and each trajectory
    // has its own, unused before: no file of the other is there.
    let probe = "id -u; touch /etc/x 2>/dev/null && echo writable || echo read-only; \
                 ls /work; echo mine > /work/owner";
    let mut seen = Vec::new();
    for t in ["t1", "t2"] {
        let mut a = exec(&format!("probe-{t}"), "warm", t, &["sh", "-c", probe], 1, 1);
        a.timeout_ms = 20_000;
        let r = c.run(&a, T).await?;
        assert_eq!(r.outcome, Outcome::Completed { exit_code: 0 }, "{r:?}");
        seen.push(r.stdout.clone());
    }
    for out in &seen {
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.first(), Some(&"65534"), "runs as nobody: {out}");
        assert_eq!(lines.get(1), Some(&"read-only"), "{out}");
        assert_eq!(
            lines.len(),
            2,
            "an empty /work, used by no one before: {out}"
        );
    }
    // It fills again to its floor; the claimed ones are the trajectories' own.
    until(&c, "warm-a", |p| p.ready == 2).await?;
    assert_eq!(containers_of("warm-a"), 4);
    for t in ["t1", "t2"] {
        let r = c.run(&close(&format!("close-{t}"), "warm", t), T).await?;
        assert_eq!(r.outcome, Outcome::Completed { exit_code: 0 }, "{r:?}");
    }
    assert_eq!(
        containers_of("warm-a"),
        2,
        "closed ones go; the parked ones stay"
    );
    eprintln!("open overheads with a warm pool: {overheads:?} us");
    cluster.shutdown().await?;
    assert_eq!(
        containers_of("warm-a"),
        0,
        "a stopping worker removes its pool"
    );
    Ok(())
}
