//! Regression tests for the defects issue 11 reproduced against a real cluster, each named
//! after what broke.

use std::time::Duration;
use tangram_shared::codec::{self, Encoding};
use tangram_shared::{subject, Dispatch, Grant, Outcome, WorkerId};
use tangram_tests::build::{exec, open};
use tangram_tests::{eventually, gpu_worker_config, replica_pids, Cluster, WorkerSpec};

const T: Duration = Duration::from_secs(60);

/// Regression: 1 MiB of `\x01` on stdout and on stderr, JSON-encoded (each byte escaped to
/// six), made a result over NATS's max_payload; the worker gave up publishing it and the
/// action stayed running with its core booked forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_over_the_payload_limit_is_truncated_and_published() -> anyhow::Result<()> {
    let cluster = Cluster::start(&[WorkerSpec::new("big-a")]).await?;
    let c = cluster.client("big").await?;
    c.wait_for_workers(&["big-a"], T).await?;
    let r = c.run(&open("o1", "big", "t1"), T).await?;
    assert_eq!(r.outcome, Outcome::Completed { exit_code: 0 }, "{r:?}");
    let script = "import sys\nb = b'\\x01' * (1 << 20)\nsys.stdout.buffer.write(b)\nsys.stderr.buffer.write(b)\n";
    let a = exec("flood", "big", "t1", &["python3", "-c", script], 1, 1);
    // Submitted as JSON, so its result is JSON too.
    c.publish_raw(
        &subject::action(&a.job, a.kind()),
        Some(a.id.as_str()),
        Some(Encoding::Json.content_type()),
        codec::encode(&a, Encoding::Json)?,
    )
    .await?;
    let r = c.result(&a.id, T).await?;
    assert_eq!(
        r.outcome,
        Outcome::Completed { exit_code: 0 },
        "{:?}",
        r.outcome
    );
    assert!(r.truncated);
    assert!(!r.stdout.is_empty() && r.stdout.bytes().all(|b| b == 1));
    assert!(r.stdout.len() + r.stderr.len() < 2 << 20);
    // Nothing is left running, and the core is free for the next command.
    c.wait_for_status(T, "nothing running", |s| {
        s.running.values().sum::<usize>() == 0
    })
    .await?;
    let r = c
        .run(&exec("after", "big", "t1", &["echo", "ok"], 1, 1), T)
        .await?;
    assert_eq!(r.stdout, "ok\n");
    cluster.shutdown().await
}

/// Regression: anyone who could publish on a worker's dispatch subject could store a
/// dispatch with epoch 2^63, after which the worker dropped every real dispatch as stale,
/// silently, and every action placed there hung.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_high_epoch_dispatch_does_not_block_real_ones() -> anyhow::Result<()> {
    let cluster = Cluster::start(&[WorkerSpec::new("forge-a")]).await?;
    let c = cluster.client("forge").await?;
    c.wait_for_workers(&["forge-a"], T).await?;
    let r = c.run(&open("o1", "forge", "t1"), T).await?;
    assert_eq!(r.outcome, Outcome::Completed { exit_code: 0 }, "{r:?}");
    let forged = Dispatch {
        epoch: 1 << 63,
        attempt: 1,
        action: exec("forged", "forge", "t1", &["echo", "pwned"], 1, 1),
        grant: Grant {
            cores: 1,
            mem_mb: 0,
        },
        submitted_at_us: 0,
        result_encoding: Encoding::Msgpack,
        instance: None,
        gpu: None,
    };
    let worker = WorkerId::new("forge-a")?;
    c.publish_raw(
        &subject::dispatch(&worker, &forged.action.id),
        Some("forged-dispatch"),
        None,
        codec::encode(&forged, Encoding::Msgpack)?,
    )
    .await?;
    // The refusal is on record for an operator...
    let mut refused = false;
    for _ in 0..100 {
        let dl = c.dead_letters().await?;
        if dl.iter().any(|(code, _)| code == "unknown_epoch") {
            refused = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(refused, "no unknown_epoch dead-letter record");
    // ... and real work still runs there.
    for i in 0..3 {
        let r = c
            .run(
                &exec(&format!("real-{i}"), "forge", "t1", &["echo", "ok"], 1, 1),
                T,
            )
            .await?;
        assert_eq!(r.outcome, Outcome::Completed { exit_code: 0 }, "{r:?}");
        assert_eq!(r.placement.map(|p| p.worker), Some(worker.clone()));
    }
    // The forged action never ran and got no result (asking for two returns what came).
    assert!(c
        .results(&forged.action.id, 2, Duration::from_millis(500))
        .await?
        .is_empty());
    cluster.shutdown().await
}

/// Regression: replica processes inherited the worker's whole environment, credentials
/// included; a model server (or code it loads) could read the fleet's secrets.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replica_processes_do_not_inherit_the_worker_environment() -> anyhow::Result<()> {
    // A secret in the worker's environment (this process runs the worker).
    std::env::set_var("TANGRAM_TEST_FLEET_SECRET", "hunter2");
    let mut cluster = Cluster::start(&[]).await?;
    let dir = tempfile::tempdir()?;
    let mut config =
        gpu_worker_config("env-gpu", &cluster.nats.url(), 1, &["envjudge"], dir.path())?;
    config.services[0]
        .env
        .insert("JUDGE_MODE".into(), "strict".into());
    cluster.start_worker_config(config);
    let c = cluster.client("env").await?;
    c.wait_for_workers(&["env-gpu"], T).await?;
    // Replicas are deployed ahead, asleep.
    assert!(eventually(T, || !replica_pids("envjudge").is_empty()).await);
    let pids = replica_pids("envjudge");
    assert!(!pids.is_empty());
    for pid in pids {
        let environ = std::fs::read(format!("/proc/{pid}/environ"))?;
        let vars: Vec<String> = environ
            .split(|b| *b == 0)
            .map(|v| String::from_utf8_lossy(v).into_owned())
            .collect();
        assert!(
            !vars
                .iter()
                .any(|v| v.starts_with("TANGRAM_TEST_FLEET_SECRET=")),
            "the secret reached the replica: {vars:?}"
        );
        assert!(vars.iter().any(|v| v == "JUDGE_MODE=strict"), "{vars:?}");
        assert!(
            vars.iter().any(|v| v.starts_with("CUDA_VISIBLE_DEVICES=")),
            "{vars:?}"
        );
        assert!(vars.iter().any(|v| v.starts_with("PATH=")), "{vars:?}");
    }
    cluster.shutdown().await
}

/// Regression: a stopping worker said `draining` only after its grace period, so for the
/// whole grace the scheduler kept placing actions there that it would never run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopping_worker_reports_draining_at_once() -> anyhow::Result<()> {
    let mut cluster = Cluster::start(&[WorkerSpec::new("drain-a")]).await?;
    let c = cluster.client("drain").await?;
    c.wait_for_workers(&["drain-a"], T).await?;
    let r = c.run(&open("o1", "drain", "t1"), T).await?;
    assert_eq!(r.outcome, Outcome::Completed { exit_code: 0 }, "{r:?}");
    // Something running, so the drain has a grace period to wait out (2 s in the harness).
    c.submit(&exec("long", "drain", "t1", &["sleep", "30"], 1, 1))
        .await?;
    c.wait_for_heartbeat(T, "running", |hb| !hb.running.is_empty())
        .await?;
    let started = tokio::time::Instant::now();
    let watch = c.wait_for_heartbeat(T, "draining", |hb| {
        hb.worker.as_str() == "drain-a" && hb.draining
    });
    let (stopped, draining) = tokio::join!(cluster.stop_worker("drain-a"), async {
        let hb = watch.await;
        (hb, started.elapsed())
    });
    stopped?;
    let (hb, after) = draining;
    hb?;
    assert!(
        after < Duration::from_millis(1_500),
        "draining reported {after:?} after the stop began; the grace is 2 s"
    );
    cluster.shutdown().await
}

/// Regression: a worker declared lost (cut off from NATS past its grace) was not fenced.
/// When the partition healed it carried on as if nothing had happened: its sandboxes stayed
/// (leaked, or adopted again while the trajectory had reopened elsewhere), its commands ran
/// on and their results came late for actions the scheduler had settled. Now the leader
/// records the lost instance, and the worker, on reading it, removes its sandboxes, drops
/// those results and rejoins as a new instance.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_declared_lost_fences_itself_when_it_comes_back() -> anyhow::Result<()> {
    use tangram_shared::{ActionId, InfraCode};
    use tangram_tests::containers_of;
    use tangram_tests::faults::proxy::Proxy;
    let mut cluster = Cluster::start(&[]).await?;
    let proxy = Proxy::start(format!("127.0.0.1:{}", cluster.nats.port())).await?;
    let raw = tangram_worker::config::RawConfig {
        id: Some("fence-a".into()),
        nats_url: Some(proxy.url()),
        cores: Some("0-1".into()),
        mem_mb: Some(4096),
        heartbeat_ms: Some(200),
        shutdown_grace_ms: Some(2000),
        ..Default::default()
    };
    cluster.start_worker_config(raw.validate()?);
    let c = cluster.client("fence").await?;
    c.wait_for_workers(&["fence-a"], T).await?;
    let r = c.run(&open("o1", "fence", "t1"), T).await?;
    assert_eq!(r.outcome, Outcome::Completed { exit_code: 0 }, "{r:?}");
    let long = exec("long", "fence", "t1", &["sleep", "60"], 1, 1);
    c.submit(&long).await?;
    let before = c.wait_until_running("fence-a", &long.id, T).await?.instance;
    assert_eq!(containers_of("fence-a"), 1);

    proxy.cut();
    let r = c.result(&long.id, T).await?;
    assert!(
        matches!(
            r.outcome,
            Outcome::InfraError {
                code: InfraCode::WorkerLost,
                ..
            }
        ),
        "{r:?}"
    );
    proxy.heal();

    // It fences itself: a new instance, running nothing, its sandbox removed.
    let hb = c
        .wait_for_heartbeat(T, "fence-a as a new instance", |hb| {
            hb.worker.as_str() == "fence-a" && hb.instance != before
        })
        .await?;
    assert!(hb.running.is_empty() && hb.sandboxes.is_empty(), "{hb:?}");
    assert!(
        eventually(T, || containers_of("fence-a") == 0).await,
        "the fenced instance's sandbox is still there"
    );
    // The trajectory opens a new sandbox, on the new instance, and runs there.
    let r = c.run(&open("o2", "fence", "t1"), T).await?;
    assert_eq!(r.outcome, Outcome::Completed { exit_code: 0 }, "{r:?}");
    let r = c
        .run(&exec("after", "fence", "t1", &["true"], 1, 1), T)
        .await?;
    assert_eq!(r.outcome, Outcome::Completed { exit_code: 0 }, "{r:?}");
    // One result for the long command: the scheduler's.
    let all = c
        .results(&ActionId::new("long")?, 2, Duration::from_secs(2))
        .await?;
    assert_eq!(all.len(), 1, "{all:?}");
    drop(proxy);
    cluster.shutdown().await
}
