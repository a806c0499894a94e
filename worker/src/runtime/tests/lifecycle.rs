//! The worker's life around its actions: shutdown and drain, the reward and api seams, a
//! fenced instance, an open outliving its timeout, results kept on disk across a restart.

use super::*;

#[tokio::test(start_paused = true)]
async fn shutdown_stops_intake_lets_short_actions_finish_and_kills_the_rest_at_the_deadline() {
    let h = Harness::start(); // grace 5 s
    h.run(&open("o1", "t1")).await;
    h.run(&open("o2", "t2")).await;
    h.deliver("short", &exec("short", "t1", &["sleep", "2"], 1), false)
        .await;
    h.deliver("long", &exec("long", "t2", &["sleep", "60"], 1), false)
        .await;
    h.until_running(2).await;
    let t0 = Instant::now();
    h.shutdown.cancel();
    // Intake stops at once: the worker lets go of its dispatch feed.
    tokio::time::timeout(NEVER, h.intake.closed())
        .await
        .expect("intake closes");
    assert!(h
        .intake
        .send(Box::new(FakeDelivery {
            tag: "late".into(),
            subject: "tangram.v1.dispatch.w.late".into(),
            payload: Vec::new(),
            redelivered: false,
            seq: 0,
            acks: h.acks.clone(),
        }))
        .await
        .is_err());
    tokio::time::timeout(NEVER, h.tasks.wait())
        .await
        .expect("the worker stops");
    assert_eq!(t0.elapsed(), Duration::from_secs(5), "the drain deadline");
    let short = h.results.wait("short").await;
    assert_eq!(completed(&short), 0);
    let long = h.results.wait("long").await;
    assert_eq!(infra_code(&long), InfraCode::Shutdown);
    assert_eq!(h.acks_of("short"), [Ack::Done]);
    assert_eq!(h.acks_of("long"), [Ack::Done]);
    assert!(h.acks_of("late").is_empty());
    // The killed command's sandbox was stopped; every sandbox is gone.
    assert_eq!(h.sandboxes.stopped().len(), 1);
    assert_eq!(h.sandboxes.open_count(), 0);
    assert_eq!(h.running(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_drain_with_nothing_running_ends_at_once() {
    let h = Harness::start();
    h.run(&open("o1", "t1")).await;
    let t0 = Instant::now();
    h.stop().await;
    assert_eq!(t0.elapsed(), Duration::ZERO);
    assert_eq!(h.sandboxes.open_count(), 0);
}

#[tokio::test(start_paused = true)]
async fn reward_and_api_actions_go_through_their_seams() {
    let provider: ProviderConfig = toml::from_str(
        "name = \"search\"\nbase_url = \"http://127.0.0.1:1\"\nrate_per_s = 10.0\nallow = [\"GET /search\"]",
    )
    .unwrap();
    let providers = Arc::new(FakeProviders::new(
        vec![provider],
        200,
        Duration::from_millis(40),
    ));
    let replicas = Arc::new(FakeReplicas::new(
        &["judge"],
        0.5,
        Duration::from_millis(30),
    ));
    let h = Harness::with(
        RawConfig::default(),
        Some(replicas.clone()),
        Some(providers.clone()),
    );
    let api = |id: &str, path: &str| {
        dispatch(
            1,
            0,
            action(
                id,
                "t1",
                ActionSpec::Api(tangram_shared::Api {
                    provider: "search".into(),
                    method: "GET".into(),
                    path: path.into(),
                    query: BTreeMap::new(),
                    body: None,
                    headers: BTreeMap::new(),
                }),
            ),
        )
    };
    let r = h.run(&api("a1", "/search")).await;
    assert_eq!(r.http.as_ref().map(|h| h.status), Some(200), "{r:?}");
    let r = h.run(&api("a2", "/admin")).await;
    assert!(
        matches!(
            r.outcome,
            Outcome::Rejected {
                code: RejectCode::NotAllowed,
                ..
            }
        ),
        "{r:?}"
    );
    assert_eq!(providers.calls(), 1);
    let mut reward = dispatch(
        1,
        0,
        action(
            "r1",
            "t1",
            ActionSpec::Reward(tangram_shared::Reward {
                service: "judge".into(),
                inputs: vec!["x".into(), "y".into()],
                options: BTreeMap::new(),
            }),
        ),
    );
    reward.gpu = Some(GpuRoute {
        service: "judge".into(),
        chunk: ChunkRef {
            group: 0,
            start: 0,
            len: 1,
        },
        restore: false,
        evict: Vec::new(),
    });
    let r = h.run(&reward).await;
    assert_eq!(r.scores, Some(vec![0.5, 0.5]), "{r:?}");
    h.stop().await;
    assert!(replicas.stopped());
}

#[tokio::test(start_paused = true)]
async fn an_action_starts_without_waiting_for_the_timer_wheel() {
    // Regression: the in-progress ack interval's first tick ("now") was awaited before every
    // action ran, which waits for the timer's next millisecond: about 1 ms on every action.
    // Off a millisecond boundary, any such wait shows as time passing on the paused clock.
    let h = Harness::start();
    tokio::time::advance(Duration::from_micros(300)).await;
    let t0 = Instant::now();
    h.run(&open("o1", "t1")).await;
    let r = h.run(&exec("e1", "t1", &["true"], 1)).await;
    assert_eq!(completed(&r), 0);
    assert_eq!(Instant::now(), t0, "an action waited on a timer");
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_fenced_instance_drops_its_sandboxes_and_results_and_refuses_dispatches_addressed_to_it()
{
    let h = Harness::start();
    h.run(&open("o1", "t1")).await;
    let old = h.worker.instance();
    let long = exec("long", "t1", &["sleep", "10"], 1);
    h.deliver("long", &long, false).await;
    h.until_running(1).await;
    // A record naming another (earlier) instance fences nothing that runs.
    assert!(!h.worker.fence("an-earlier-instance").await);
    assert_eq!(h.running(), 1);
    assert!(h.worker.fence(&old).await);
    assert_ne!(h.worker.instance(), old);
    assert_eq!(
        h.sandboxes.open_count(),
        0,
        "the fenced sandboxes are removed"
    );
    assert_eq!(
        h.running(),
        0,
        "heartbeats no longer list what the fenced instance ran"
    );
    // A redelivery of the orphaned action while it still runs is not run again.
    h.deliver("long#2", &long, true).await;
    h.until_acked("long").await;
    assert!(
        h.results.of("long").is_empty(),
        "the scheduler settled it: no second result"
    );
    // Addressed to the fenced instance: refused and recorded, not run.
    let mut stale = exec("stale", "t1", &["true"], 1);
    stale.instance = Some(old.clone());
    h.deliver("stale", &stale, false).await;
    h.until_acked("stale").await;
    assert!(h.results.of("stale").is_empty());
    assert!(h
        .results
        .refused
        .lock()
        .unwrap()
        .contains(&("stale".to_string(), "fenced_instance")));
    // So is one addressed to the earlier instance named before.
    let mut earlier = exec("earlier", "t1", &["true"], 1);
    earlier.instance = Some("an-earlier-instance".into());
    h.deliver("earlier", &earlier, false).await;
    h.until_acked("earlier").await;
    assert!(h.results.of("earlier").is_empty());
    // The new instance runs what is addressed to it.
    let mut fresh = open("o2", "t1");
    fresh.instance = Some(h.worker.instance());
    assert_eq!(completed(&h.run(&fresh).await), 0);
    assert_eq!(h.sandboxes.open_count(), 1);
    h.stop().await;
}

/// Regression: an open whose image pull outlived the open's deadline was settled
/// `worker_lost` by the scheduler, yet the container was created afterwards, listed in
/// heartbeats with its memory never booked, and its late completion stored as a second
/// result. The open's timeout now covers the pull: past it the open is answered `timed_out`
/// and what the creation makes is removed.
#[tokio::test(start_paused = true)]
async fn an_open_whose_creation_outlives_its_timeout_times_out_and_leaves_nothing() {
    let sandboxes = Arc::new(InMemorySandboxes::with_start_delay(Duration::from_secs(5)));
    let results = Arc::new(Results::default());
    let worker = Arc::new(Worker::new(
        config(RawConfig::default()),
        Some(sandboxes.clone()),
        None,
        None,
        results.clone(),
        None,
    ));
    let (tx, rx) = mpsc::channel::<Box<dyn Delivery>>(16);
    let intake =
        futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|d| (d, rx)) });
    let shutdown = CancellationToken::new();
    let tasks = TaskTracker::new();
    tasks.spawn(serve(worker.clone(), Box::pin(intake), shutdown.clone()));
    tasks.close();
    let mut slow = open("slow-open", "t1");
    slow.action.timeout_ms = 1_000;
    let acks = AckLog::default();
    tx.send(Box::new(FakeDelivery {
        tag: "slow-open".into(),
        subject: "tangram.v1.dispatch.w.slow-open".into(),
        payload: codec::encode(&slow, Encoding::Msgpack).unwrap(),
        redelivered: false,
        seq: 0,
        acks: acks.clone(),
    }))
    .await
    .unwrap();
    let t0 = Instant::now();
    let r = results.wait("slow-open").await;
    assert_eq!(r.outcome, Outcome::TimedOut, "{r:?}");
    assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
    // The creation finishes later: what it made is removed, and the worker holds nothing.
    let deadline = Instant::now() + NEVER;
    while sandboxes.open_count() > 0 || Instant::now() < t0 + Duration::from_secs(6) {
        assert!(
            Instant::now() < deadline,
            "the late sandbox was never removed"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(worker.state.lock().unwrap().sandboxes.is_empty());
    assert_eq!(results.of("slow-open").len(), 1, "one result");
    shutdown.cancel();
    tasks.wait().await;
}

/// Regression: a worker gave up a result after about 25 s of failed publishing and acked the
/// dispatch, so an outage longer than that turned a real completion into `worker_lost` (or
/// nothing). Now it keeps trying, keeps the result on disk, leaves the dispatch unacked, and
/// a worker started again on the same state directory publishes the kept result first.
#[tokio::test(start_paused = true)]
async fn a_result_not_stored_before_the_worker_dies_is_kept_on_disk_and_published_at_the_next_start(
) {
    use std::sync::atomic::Ordering;
    let state = tempfile::tempdir().unwrap();
    let raw = || RawConfig {
        state_dir: Some(state.path().display().to_string()),
        ..RawConfig::default()
    };
    let h = Harness::with(raw(), None, None);
    h.results.down.store(true, Ordering::SeqCst);
    let o = open("kept-open", "t1");
    h.deliver("kept-open", &o, false).await;
    // Far past the old 25 s budget: still trying, the dispatch not acked.
    let deadline = Instant::now() + NEVER;
    while h.results.failed.load(Ordering::SeqCst) < 5 {
        assert!(Instant::now() < deadline, "no publishing tries");
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    assert!(
        h.acks_of("kept-open").is_empty(),
        "acked without a stored result"
    );
    let kept = std::fs::read_dir(state.path().join("results"))
        .unwrap()
        .count();
    assert_eq!(kept, 1, "the result is kept on disk");
    // The process dies (its tasks end without storing anything).
    h.worker.hard_stop.cancel();
    h.stop().await;
    assert!(h.results.of("kept-open").is_empty());

    // Started again on the same state directory, NATS back: the kept result goes first.
    let again = Harness::with(raw(), None, None);
    assert_eq!(again.worker.publish_kept().await, 1);
    let r = again.results.wait("kept-open").await;
    assert_eq!(completed(&r), 0, "the real result, not worker_lost: {r:?}");
    assert_eq!(
        std::fs::read_dir(state.path().join("results"))
            .unwrap()
            .count(),
        0,
        "forgotten once stored"
    );
    again.stop().await;
}
