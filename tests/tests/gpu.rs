//! GPU services end to end on a CPU-only machine: a worker that declares 2 GPUs serves 9
//! reward services with reference replicas (real processes, real scoring model, the
//! sleep/wake contract), routed by the scheduler's Evict-on-Execution manager over NATS.
//! Service names are unique per test, because tests find replica processes by name.

use std::time::Duration;
use tangram_shared::{ActionResult, InfraCode, Outcome, RejectCode};
use tangram_tests::build::reward;
use tangram_tests::{eventually, replica_pids, Cluster};
use tokio::time::Instant;

const T: Duration = Duration::from_secs(60);

fn completed(r: &ActionResult) {
    assert!(
        matches!(r.outcome, Outcome::Completed { exit_code: 0 }),
        "{r:?}"
    );
}

fn used(r: &ActionResult) -> (bool, Vec<String>) {
    let u = r
        .service
        .as_ref()
        .expect("reward results say which replica served them");
    (u.restored, u.evicted.clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nine_services_share_two_gpus_with_lru_eviction_and_restore_only_when_evicted(
) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let names: Vec<String> = (0..9).map(|i| format!("lru{i}")).collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let mut cluster = Cluster::start(&[]).await?;
    cluster.start_gpu_worker("gpu-lru", 2, &refs, dir.path())?;
    let c = cluster.client("rl").await?;
    c.wait_for_workers(&["gpu-lru"], T).await?;
    for n in &names {
        assert_eq!(replica_pids(n).len(), 1, "{n} is deployed ahead, once");
    }

    // First call of each service: none is resident, so each restores; from the third on, the
    // least recently used resident service is evicted.
    let mut first_scores = Vec::new();
    for (i, n) in names.iter().enumerate() {
        let r = c
            .run(
                &reward(
                    &format!("first-{i}"),
                    "rl",
                    "t",
                    n,
                    &["def f(x): return x + 1", "print('hi')"],
                ),
                T,
            )
            .await?;
        completed(&r);
        let scores = r.scores.clone().expect("scores");
        assert_eq!(scores.len(), 2);
        first_scores.push(scores);
        let (restored, evicted) = used(&r);
        assert!(restored, "{n}: first call restores: {r:?}");
        if i >= 2 {
            assert_eq!(
                evicted,
                vec![names[i - 2].clone()],
                "{n}: evicts the least recently used"
            );
        } else {
            assert!(evicted.is_empty(), "{n}: a free GPU needs no eviction");
        }
        assert!(
            r.timing.overhead_us > 0,
            "restore time is reported as overhead"
        );
    }
    // Different services score differently (different weights).
    assert_ne!(first_scores[0], first_scores[1]);

    // lru8 and lru7 are resident now: no restore, and the same scores as before.
    let r = c
        .run(
            &reward(
                "again-8",
                "rl",
                "t",
                "lru8",
                &["def f(x): return x + 1", "print('hi')"],
            ),
            T,
        )
        .await?;
    completed(&r);
    assert_eq!(used(&r), (false, vec![]), "{r:?}");
    assert_eq!(r.scores.as_ref(), Some(&first_scores[8]));
    let r = c
        .run(&reward("again-7", "rl", "t", "lru7", &["x"]), T)
        .await?;
    assert_eq!(used(&r), (false, vec![]), "{r:?}");
    // lru0 restores and evicts lru8, used before lru7.
    let r = c
        .run(
            &reward(
                "back-0",
                "rl",
                "t",
                "lru0",
                &["def f(x): return x + 1", "print('hi')"],
            ),
            T,
        )
        .await?;
    completed(&r);
    assert_eq!(used(&r), (true, vec!["lru8".to_string()]), "{r:?}");
    // A restored replica rebuilt from host memory scores exactly as before.
    assert_eq!(r.scores.as_ref(), Some(&first_scores[0]));

    // Concurrent calls to all nine: all complete.
    for (i, n) in names.iter().enumerate() {
        c.submit(&reward(
            &format!("burst-{i}"),
            "rl",
            "t",
            n,
            &["a", "b", "c"],
        ))
        .await?;
    }
    for i in 0..9 {
        let r = c
            .result(&tangram_shared::ActionId::new(format!("burst-{i}"))?, T)
            .await?;
        completed(&r);
        assert_eq!(r.scores.map(|s| s.len()), Some(3));
    }

    // Stopping the worker stops its replicas.
    cluster.shutdown().await?;
    for n in &names {
        assert!(
            eventually(Duration::from_secs(10), || replica_pids(n).is_empty()).await,
            "{n} still running"
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_service_is_rejected_with_the_reason_and_dead_lettered() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut cluster = Cluster::start(&[]).await?;
    cluster.start_gpu_worker("gpu-unk", 2, &["unk-judge"], dir.path())?;
    let c = cluster.client("rl").await?;
    c.wait_for_workers(&["gpu-unk"], T).await?;
    let r = c
        .run(&reward("u1", "rl", "t", "no-such-model", &["x"]), T)
        .await?;
    match &r.outcome {
        Outcome::Rejected { code, reason } => {
            assert_eq!(*code, RejectCode::UnknownService);
            assert!(
                reason.contains("no-such-model") && reason.contains("unk-judge"),
                "{reason}"
            );
        }
        other => panic!("expected a rejection, got {other:?}"),
    }
    let dl = c
        .dead_letters_once(T, |d| d.iter().any(|(code, _)| code == "unknown_service"))
        .await?;
    assert!(
        dl.iter().any(|(code, _)| code == "unknown_service"),
        "{dl:?}"
    );
    // The known one still works.
    let r = c
        .run(&reward("u2", "rl", "t", "unk-judge", &["x"]), T)
        .await?;
    completed(&r);
    cluster.shutdown().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replica_killed_mid_request_never_hangs_and_a_fresh_replica_serves_next(
) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut cluster = Cluster::start(&[]).await?;
    cluster.start_gpu_worker_dim("gpu-kill", 1, &["kill-judge"], dir.path(), 256)?;
    let c = cluster.client("rl").await?;
    c.wait_for_workers(&["gpu-kill"], T).await?;
    let before = replica_pids("kill-judge");
    assert_eq!(before.len(), 1);
    // A slow request: many long inputs through the pure-Python model take seconds.
    let long = "token ".repeat(400);
    let inputs: Vec<&str> = std::iter::repeat_n(long.as_str(), 100).collect();
    let t0 = Instant::now();
    c.submit(&reward("slow", "rl", "t", "kill-judge", &inputs))
        .await?;
    // Wait until it is scoring (the replica is awake and the request running), then kill the
    // replica.
    let slow = tangram_shared::ActionId::new("slow")?;
    c.wait_for_heartbeat(T, "kill-judge resident and scoring", |hb| {
        hb.worker.as_str() == "gpu-kill"
            && hb.running.contains(&slow)
            && hb.services.iter().any(|s| {
                s.name == "kill-judge" && s.replicas.iter().any(|r| r.resident && r.healthy)
            })
    })
    .await?;
    assert!(
        c.result(
            &tangram_shared::ActionId::new("slow")?,
            Duration::from_millis(50)
        )
        .await
        .is_err(),
        "the request must still be running when its replica is killed"
    );
    tangram_tests::signal(before[0], tangram_tests::Signal::KILL)?;
    let r = c.result(&tangram_shared::ActionId::new("slow")?, T).await?;
    match &r.outcome {
        // The kill can land before the scoring request is sent (it is then retried on a
        // fresh replica) or after (a service error: a sent request is never sent twice).
        Outcome::Completed { .. } => {
            assert_eq!(r.scores.as_ref().map(Vec::len), Some(100));
            assert!(used(&r).0, "the retry restored a fresh replica");
        }
        Outcome::InfraError {
            code: InfraCode::Service,
            ..
        } => {}
        other => panic!("expected completion on a fresh replica or an infra error, got {other:?}"),
    }
    assert!(t0.elapsed() < T);
    // A fresh replica serves the service afterwards.
    assert!(
        eventually(Duration::from_secs(20), || {
            let now = replica_pids("kill-judge");
            now.len() == 1 && now != before
        })
        .await
    );
    let r = c
        .run(&reward("after", "rl", "t", "kill-judge", &["x"]), T)
        .await?;
    completed(&r);
    cluster.shutdown().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leftover_replicas_of_an_earlier_run_are_stopped_when_the_worker_starts(
) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    // A replica an earlier (crashed) worker instance started, recorded in its state dir.
    let mut argv = tangram_tests::reference_replica_command(16);
    for a in &mut argv {
        *a = a.replace("{service}", "left-judge").replace("{port}", "0");
    }
    argv.push("--no-parent-watch".into());
    let mut child = std::process::Command::new(&argv[0])
        .args(&argv[1..])
        .stdout(std::process::Stdio::null())
        .spawn()?;
    std::fs::write(
        dir.path().join("replica-1.pid"),
        format!("{}\n{}\n", child.id(), argv.join(" ")),
    )?;
    // Running as the replica, as a crashed instance's leftover is: `python3` may be a shim
    // that execs through a shell or two, and while a process execs its command line can
    // read empty, which the sweep rightly does not match.
    let pid = child.id();
    assert!(
        eventually(Duration::from_secs(10), || {
            let exe = std::fs::read_link(format!("/proc/{pid}/exe")).unwrap_or_default();
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            exe.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("python"))
                && !cmdline.is_empty()
        })
        .await
    );
    let mut cluster = Cluster::start(&[]).await?;
    cluster.start_gpu_worker("gpu-left", 1, &["left-judge2"], dir.path())?;
    let c = cluster.client("rl").await?;
    c.wait_for_workers(&["gpu-left"], T).await?;
    let exited = eventually(Duration::from_secs(10), || {
        matches!(child.try_wait(), Ok(Some(_)))
    })
    .await;
    // What the worker's sweep had to go on, for a failure: whether it took the pid file (it
    // removes each it reads) and what the process's command line is now.
    let cmdline = std::fs::read(format!("/proc/{}/cmdline", child.id()))
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
        .unwrap_or_default();
    assert!(
        exited,
        "the leftover replica was not stopped (pid file still there: {}; its command line now: {cmdline:?}; recorded: {:?})",
        dir.path().join("replica-1.pid").exists(),
        argv.join(" ")
    );
    cluster.shutdown().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_containerised_replica_serves_and_is_removed_when_the_worker_stops() -> anyhow::Result<()>
{
    let dir = tempfile::tempdir()?;
    let nats = tangram_tests::NatsServer::start();
    let mut config =
        tangram_tests::gpu_worker_config("gpu-ctr", &nats.url(), 1, &["ctr-judge"], dir.path())?;
    let script_dir = tangram_tests::repo_root().join("services/reference-replica");
    let s = &mut config.services[0];
    s.command.clear();
    s.image = Some("tangram/sandbox:poly-v2".into());
    s.args = tangram_tests::replica_argv("/opt/replica/replica.py", 16);
    s.args.push("--no-parent-watch".into());
    s.mounts = vec![format!("{}:/opt/replica:ro", script_dir.display())];
    let sched = tokio::spawn(tangram_scheduler::run(
        tangram_scheduler::Config::with_nats_url(nats.url()),
        tokio_util::sync::CancellationToken::new(),
    ));
    let stop = tokio_util::sync::CancellationToken::new();
    let worker = tokio::spawn(tangram_worker::run(config, stop.clone()));
    let c = tangram_tests::Client::connect(&nats.url(), "rl").await?;
    c.wait_for_workers(&["gpu-ctr"], T).await?;
    let containers = || {
        let out = std::process::Command::new("docker")
            .args(["ps", "-q", "--filter", "label=tangram.replica-of=gpu-ctr"])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).lines().count())
            .unwrap_or(0);
        out
    };
    assert_eq!(
        containers(),
        1,
        "the service is deployed ahead as one container"
    );
    let r = c
        .run(&reward("c1", "rl", "t", "ctr-judge", &["print(1)", "x"]), T)
        .await?;
    completed(&r);
    assert_eq!(r.scores.as_ref().map(Vec::len), Some(2));
    assert!(used(&r).0);
    stop.cancel();
    worker.await??;
    assert!(
        eventually(Duration::from_secs(20), || containers() == 0).await,
        "replica container left behind"
    );
    sched.abort();
    Ok(())
}
