//! End to end across restarts, deaths and resubmissions: a duplicate or a resubmission after a
//! scheduler restart runs once, a restarted worker removes leftovers and reports lost work, a
//! worker stops without NATS, a dead worker's actions are reported lost, a restarted scheduler
//! adopts open sandboxes, and the cluster carries on after a nats-server restart.

use super::*;

/// An exec in job1/t1 that counts its own runs in the sandbox's `n.txt`.
fn counting_exec() -> tangram_shared::Action {
    exec(
        "count",
        "job1",
        "t1",
        &["sh", "-c", "echo x >> n.txt; wc -l < n.txt"],
        1,
        1,
    )
}

/// Publishes `a` again without a `Nats-Msg-Id` (so JetStream cannot deduplicate it), then
/// checks from inside the sandbox that it ran once and that it has one result.
async fn resubmit_and_check_it_ran_once(
    c: &tangram_tests::Client,
    a: &tangram_shared::Action,
) -> anyhow::Result<()> {
    let bytes = tangram_shared::codec::encode(a, tangram_shared::Encoding::Msgpack)?;
    c.publish_raw("tangram.v1.action.job1.sandbox_exec", None, None, bytes)
        .await?;
    let r = c
        .run(
            &exec("check", "job1", "t1", &["wc", "-l", "n.txt"], 1, 1),
            T,
        )
        .await?;
    assert_eq!(
        r.stdout.split_whitespace().next(),
        Some("1"),
        "ran more than once: {r:?}"
    );
    let all = c.results(&a.id, 2, Duration::from_secs(2)).await?;
    assert_eq!(all.len(), 1, "{all:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicate_submission_runs_once_with_one_result() -> anyhow::Result<()> {
    let cluster = Cluster::start(&[WorkerSpec::new("dup-a")]).await?;
    let c = cluster.client("job1").await?;
    c.run(&open("o1", "job1", "t1"), T).await?;
    let a = counting_exec();
    c.submit(&a).await?;
    c.submit(&a).await?; // same Nats-Msg-Id: JetStream drops it
    let first = c.result(&a.id, T).await?;
    assert_eq!(first.stdout.trim(), "1");
    // Again without the header, so JetStream cannot deduplicate: the scheduler must.
    resubmit_and_check_it_ran_once(&c, &a).await?;
    cluster.shutdown().await
}

/// The new scheduler has no memory of the first run: only its index of stored results (filled
/// from the results stream at start) stands between the resubmission and a second run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resubmission_after_a_scheduler_restart_runs_once() -> anyhow::Result<()> {
    let mut cluster = Cluster::start(&[WorkerSpec::new("resub-a")]).await?;
    let c = cluster.client("job1").await?;
    c.run(&open("o1", "job1", "t1"), T).await?;
    let a = counting_exec();
    assert_eq!(c.run(&a, T).await?.stdout.trim(), "1");

    cluster.stop_scheduler().await?;
    cluster.start_scheduler();
    // The new scheduler is up and placing work before the resubmission arrives.
    c.run(&exec("fresh", "job1", "t1", &["true"], 1, 1), T)
        .await?;
    resubmit_and_check_it_ran_once(&c, &a).await?;
    cluster.shutdown().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_worker_removes_leftovers_and_reports_lost_work() -> anyhow::Result<()> {
    let cluster = Cluster::start(&[]).await?;
    let spec = WorkerSpec::new("crash-a");
    let mut worker = cluster.spawn_worker_process(&spec)?;
    let c = cluster.client("job1").await?;
    c.run(&open("o1", "job1", "t1"), T).await?;
    let mut long = exec("long", "job1", "t1", &["sleep", "30"], 1, 1);
    long.timeout_ms = 60_000;
    c.submit(&long).await?;
    c.wait_until_running("crash-a", &long.id, T).await?;
    worker.kill()?; // SIGKILL: no cleanup at all
    worker.wait()?;
    assert_eq!(
        containers_of("crash-a"),
        1,
        "the crash should leave the container behind"
    );
    let mut worker = cluster.spawn_worker_process(&spec)?;
    let r = c.result(&long.id, T).await?;
    match r.outcome {
        Outcome::InfraError {
            code: InfraCode::SandboxLost | InfraCode::WorkerLost,
            ..
        } => {}
        other => panic!("expected the in-flight exec reported lost, got {other:?}"),
    }
    // The result may come from the scheduler (heartbeats stopped) before the new instance
    // has finished reconciling; the leftover must be gone soon after either way.
    assert!(
        tangram_tests::eventually(Duration::from_secs(30), || containers_of("crash-a") == 0).await,
        "leftover not reconciled"
    );
    // The trajectory can open a fresh sandbox and go on, once the scheduler has let go of the
    // lost one.
    c.wait_for_status(T, "the lost sandbox forgotten", |st| st.sandboxes == 0)
        .await?;
    let reopened = c.run(&open("o2", "job1", "t1"), T).await?;
    assert_eq!(exit_code(&reopened.outcome), 0, "{reopened:?}");
    let r = c
        .run(&exec("e2", "job1", "t1", &["echo", "back"], 1, 1), T)
        .await?;
    assert_eq!(r.stdout, "back\n");
    // SIGTERM: a graceful stop removes the worker's sandboxes.
    tangram_tests::signal(worker.id(), tangram_tests::Signal::TERM)?;
    let status = worker.wait()?;
    assert!(status.success(), "worker exited with {status}");
    assert_eq!(containers_of("crash-a"), 0);
    cluster.shutdown().await
}

/// Regression: a worker told to stop after NATS went away waited forever on a final flush.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_stops_on_sigterm_even_when_nats_is_gone() -> anyhow::Result<()> {
    let mut cluster = Cluster::start(&[]).await?;
    let spec = WorkerSpec::new("orphan-a");
    let mut worker = cluster.spawn_worker_process(&spec)?;
    let c = cluster.client("job1").await?;
    c.wait_for_workers(&["orphan-a"], T).await?;
    drop(c);
    cluster.nats.kill();
    let port = cluster.nats.port();
    assert!(
        tangram_tests::eventually(T, || std::net::TcpStream::connect(("127.0.0.1", port))
            .is_err())
        .await,
        "NATS still accepts connections after it was killed"
    );
    tangram_tests::signal(worker.id(), tangram_tests::Signal::TERM)?;
    let mut exited = None;
    assert!(
        tangram_tests::eventually(Duration::from_secs(20), || {
            exited = worker.try_wait().ok().flatten();
            exited.is_some()
        })
        .await,
        "worker still running 20 s after SIGTERM"
    );
    let status = exited.expect("exited");
    assert!(status.success(), "worker exited with {status}");
    assert_eq!(containers_of("orphan-a"), 0);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_that_dies_for_good_has_its_running_actions_reported_lost() -> anyhow::Result<()> {
    let cluster = Cluster::start(&[]).await?;
    let spec = WorkerSpec::new("gone-a");
    let mut worker = cluster.spawn_worker_process(&spec)?;
    let c = cluster.client("job1").await?;
    c.run(&open("o1", "job1", "t1"), T).await?;
    let mut long = exec("long", "job1", "t1", &["sleep", "60"], 1, 1);
    long.timeout_ms = 120_000;
    c.submit(&long).await?;
    c.wait_until_running("gone-a", &long.id, T).await?;
    worker.kill()?;
    worker.wait()?;
    let t = Instant::now();
    let r = c.result(&long.id, T).await?;
    match &r.outcome {
        Outcome::InfraError {
            code: InfraCode::WorkerLost,
            reason,
        } => assert!(reason.contains("gone-a"), "{reason}"),
        other => panic!("expected worker_lost, got {other:?}"),
    }
    // Three missed 200 ms heartbeats, plus a tick: well under 10 s.
    assert!(
        t.elapsed() < Duration::from_secs(10),
        "took {:?}",
        t.elapsed()
    );
    // Its sandboxes are forgotten with it.
    let r = c
        .run(&exec("after", "job1", "t1", &["true"], 1, 1), T)
        .await?;
    assert!(
        matches!(
            r.outcome,
            Outcome::Rejected {
                code: RejectCode::NoSandbox,
                ..
            }
        ),
        "{r:?}"
    );
    // Clean up the container the killed worker left.
    std::process::Command::new("sh")
        .args(["-c", "docker rm -f $(docker ps -aq --filter label=tangram.worker=gone-a) >/dev/null 2>&1 || true"])
        .status()?;
    cluster.shutdown().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_scheduler_bumps_its_epoch_and_adopts_open_sandboxes() -> anyhow::Result<()> {
    let mut cluster = Cluster::start(&[WorkerSpec::new("epoch-a")]).await?;
    let c = cluster.client("job1").await?;
    c.run(&open("o1", "job1", "t1"), T).await?;
    let before = c
        .run(&exec("e1", "job1", "t1", &["echo", "one"], 1, 1), T)
        .await?;
    assert_eq!(before.stdout, "one\n");

    cluster.stop_scheduler().await?;
    cluster.start_scheduler();
    // The new scheduler learns the sandbox from the worker's heartbeats.
    let r = c
        .run(&exec("e2", "job1", "t1", &["echo", "two"], 1, 1), T)
        .await?;
    assert_eq!(r.stdout, "two\n", "{r:?}");

    // A dispatch from the old epoch is refused by the worker: it never runs.
    let stale = tangram_shared::Dispatch {
        epoch: 1,
        attempt: 1,
        action: exec(
            "stale",
            "job1",
            "t1",
            &["sh", "-c", "echo ran > stale.txt"],
            1,
            1,
        ),
        grant: tangram_shared::Grant {
            cores: 1,
            mem_mb: 0,
        },
        submitted_at_us: 0,
        result_encoding: tangram_shared::Encoding::Msgpack,
        instance: None,
        gpu: None,
    };
    let bytes = tangram_shared::codec::encode(&stale, tangram_shared::Encoding::Msgpack)?;
    c.publish_raw(
        &tangram_shared::subject::dispatch(
            &tangram_tests::build::worker("epoch-a"),
            &stale.action.id,
        ),
        None,
        None,
        bytes,
    )
    .await?;
    let results = c
        .results(&stale.action.id, 1, Duration::from_secs(2))
        .await
        .unwrap_or_default();
    assert!(results.is_empty(), "stale dispatch ran: {results:?}");
    let r = c
        .run(
            &exec(
                "check",
                "job1",
                "t1",
                &["sh", "-c", "ls stale.txt 2>/dev/null || echo absent"],
                1,
                1,
            ),
            T,
        )
        .await?;
    assert_eq!(r.stdout, "absent\n");
    cluster.shutdown().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cluster_carries_on_after_a_nats_server_restart() -> anyhow::Result<()> {
    let mut cluster = Cluster::start(&[WorkerSpec::new("natsr-a")]).await?;
    let c = cluster.client("job1").await?;
    c.run(&open("o1", "job1", "t1"), T).await?;
    assert_eq!(
        c.run(&exec("e1", "job1", "t1", &["echo", "before"], 1, 1), T)
            .await?
            .stdout,
        "before\n"
    );
    // Same port, same store: streams, consumers and the result of e1 survive.
    cluster.nats.restart();
    let c = cluster.client("job1").await?;
    assert_eq!(
        c.result(&tangram_shared::ActionId::new("e1")?, T)
            .await?
            .stdout,
        "before\n"
    );
    let r = c
        .run(&exec("e2", "job1", "t1", &["echo", "after"], 1, 1), T)
        .await?;
    assert_eq!(r.stdout, "after\n", "{r:?}");
    cluster.shutdown().await
}
