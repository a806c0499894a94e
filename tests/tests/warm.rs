//! The warm pool on a real worker with Docker sandboxes: an open claims a parked, hardened
//! container that no one used before, the pool fills again, and the worker reports it.

use std::time::Duration;
use tangram_shared::{ActionSpec, Outcome, WarmPoolReport};
use tangram_tests::build::{close, exec, open};
use tangram_tests::images::{distinct_image, open_image, Untag};
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

/// Containers of `worker` running `image`.
fn running_of(worker: &str, image: &str) -> usize {
    tangram_tests::running_containers(worker, &[&format!("ancestor={image}")]).len()
}

/// What a command printed, trimmed.
async fn run_sh(
    c: &tangram_tests::Client,
    id: &str,
    t: &str,
    script: &str,
) -> anyhow::Result<String> {
    let mut a = exec(id, "warm", t, &["sh", "-c", script], 1, 1);
    a.timeout_ms = 20_000;
    let r = c.run(&a, T).await?;
    anyhow::ensure!(r.outcome == Outcome::Completed { exit_code: 0 }, "{r:?}");
    Ok(r.stdout.trim().to_string())
}

/// Opens asking 256 MB, or an environment, or a pulled task image, were cold creations
/// (p50 1.7 s) however full the pool was: only the default shape was ever parked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opens_of_other_memory_environment_and_images_in_demand_claim_warm_sandboxes(
) -> anyhow::Result<()> {
    let task_image = distinct_image(&format!("warm-shape-{}", std::process::id()))?;
    let _untag = Untag(vec![task_image.clone()]);
    let mut cluster = Cluster::start(&[]).await?;
    cluster.start_sandbox_worker(
        "warm-b",
        tangram_worker::config::RawSandbox {
            warm_pool: Some(4),
            warm_pool_min: Some(2),
            // The task image is built on this host, not pulled.
            images: Some(vec!["docker.io/tangram-test/*".into()]),
            ..Default::default()
        },
    )?;
    let c = cluster.client("warm").await?;
    c.wait_for_workers(&["warm-b"], T).await?;
    until(&c, "warm-b", |p| p.ready == 2).await?;

    // Memory down and up, and an environment: claims, fitted to the open.
    for (t, mb) in [("small", 256u64), ("large", 1024)] {
        let mut a = open(&format!("open-{t}"), "warm", t);
        if let ActionSpec::SandboxOpen(o) = &mut a.spec {
            o.memory_mb = mb;
            o.env.insert("GREETING".into(), format!("hello-{t}"));
        }
        let r = c.run(&a, T).await?;
        assert_eq!(r.outcome, Outcome::Completed { exit_code: 0 }, "{r:?}");
        let limit = run_sh(
            &c,
            &format!("limit-{t}"),
            t,
            "cat /sys/fs/cgroup/memory/memory.limit_in_bytes",
        )
        .await?;
        assert_eq!(limit, (mb << 20).to_string(), "the open's memory limit");
        let env = run_sh(&c, &format!("env-{t}"), t, "echo $GREETING").await?;
        assert_eq!(env, format!("hello-{t}"), "the open's environment");
    }
    let p = until(&c, "warm-b", |p| p.hits == 2).await?;
    assert_eq!(p.misses, 0, "both were claims: {p:?}");

    // A task image: the first open creates, and teaches the pool; the next is a claim.
    let r = c
        .run(&open_image("open-task-1", "warm", "task-1", &task_image), T)
        .await?;
    assert_eq!(r.outcome, Outcome::Completed { exit_code: 0 }, "{r:?}");
    let p = until(&c, "warm-b", |p| p.misses == 1).await?;
    assert_eq!(p.hits, 2, "{p:?}");
    // The trajectory's own container and one parked beside it.
    let deadline = tokio::time::Instant::now() + T;
    while running_of("warm-b", &task_image) < 2 {
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "no warm sandbox of the task image: {:?}",
            pool_of(&c, "warm-b").await
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Running is not yet parked: the pool counts a container ready once its keeper answers.
    // On a loaded machine the next open came before that and was a creation (CI, once).
    until(&c, "warm-b", |p| p.ready >= p.target).await?;
    let r = c
        .run(&open_image("open-task-2", "warm", "task-2", &task_image), T)
        .await?;
    assert_eq!(r.outcome, Outcome::Completed { exit_code: 0 }, "{r:?}");
    let p = until(&c, "warm-b", |p| p.hits == 3).await?;
    assert_eq!(p.misses, 1, "{p:?}");
    // It runs the task image (a shell and sleep, nothing else) and was never used before.
    let ls = run_sh(&c, "probe-task-2", "task-2", "echo /work/* /bin/*").await?;
    assert_eq!(
        ls, "/work/* /bin/sh /bin/sleep",
        "an empty /work, the task image's /bin"
    );

    for t in ["small", "large", "task-1", "task-2"] {
        let r = c.run(&close(&format!("close-{t}"), "warm", t), T).await?;
        assert_eq!(r.outcome, Outcome::Completed { exit_code: 0 }, "{r:?}");
    }
    cluster.shutdown().await?;
    assert_eq!(
        containers_of("warm-b"),
        0,
        "a stopping worker removes every pool"
    );
    Ok(())
}
