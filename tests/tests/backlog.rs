//! Backlog and history apart: the streams that hold work count only unprocessed work, the
//! history is a window that evicts its oldest, and a cluster made by an earlier release
//! upgrades in place.

use async_nats::jetstream::{self, consumer, stream};
use std::collections::BTreeMap;
use std::time::Duration;
use tangram_nats::streams::{StreamLimits, StreamSettings};
use tangram_shared::codec::{self, Encoding};
use tangram_shared::{subject, ActionResult, Dispatch, Grant, Outcome};
use tangram_tests::build::{close, exec, open, worker};
use tangram_tests::{Cluster, WorkerSpec};

const T: Duration = Duration::from_secs(30);

fn noop(id: &str) -> WorkerSpec {
    WorkerSpec {
        sandbox_runtime: tangram_worker::sandbox::RuntimeKind::Noop,
        ..WorkerSpec::new(id)
    }
}

fn limit(bytes: i64) -> StreamLimits {
    StreamLimits {
        max_bytes: Some(bytes),
        ..Default::default()
    }
}

/// Submits `a`, again after a pause while the actions stream is full (until [`T`]), and
/// waits for its result.
async fn run_through_backpressure(
    c: &tangram_tests::Client,
    a: &tangram_shared::Action,
) -> anyhow::Result<ActionResult> {
    let deadline = tokio::time::Instant::now() + T;
    loop {
        match c.submit(a).await {
            Ok(()) => break,
            Err(e)
                if e.to_string().contains("maximum bytes exceeded")
                    && tokio::time::Instant::now() < deadline =>
            {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => return Err(e),
        }
    }
    c.result(&a.id, T).await
}

/// Regression: the action and dispatch streams kept every processed message until it aged
/// out (7 days, 1 day), so their byte limits counted history: at 100 actions/s they were full
/// within hours and the whole fleet was refused until an operator purged. Here every stream
/// holds 64 KiB and about ten times that flows through: every action is taken and answered,
/// the history wraps, and the backlog is empty at the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_wraps_many_times_while_every_action_is_taken_and_answered() -> anyhow::Result<()> {
    let mut cluster = Cluster::start_without_scheduler(&[]).await?;
    let mut config = tangram_scheduler::Config::with_nats_url(cluster.nats.url());
    config.streams = StreamSettings {
        limits: BTreeMap::from([
            ("actions".to_string(), limit(64 << 10)),
            ("dispatch".to_string(), limit(64 << 10)),
            ("history".to_string(), limit(64 << 10)),
        ]),
        ..Default::default()
    };
    // Created as configured before any process could create them with the bundled limits.
    let js = jetstream::new(async_nats::connect(cluster.nats.url()).await?);
    let drift = tangram_nats::ensure_streams(&js, &config.streams).await?;
    assert!(drift.is_empty(), "{drift:?}");
    cluster.start_scheduler_config(config);
    let c = cluster.client("wrap").await?;
    cluster.start_worker(noop("wrap-cpu"))?;
    c.wait_for_workers(&["wrap-cpu"], T).await?;
    // A 2 KiB source file per exec, as a coding rollout sends.
    let source = "x".repeat(2048);
    let mut ids = Vec::new();
    // A dispatch leaves its stream only when the worker acks it after storing the result,
    // and an action only once its dispatch is stored: on a loaded machine the earlier steps'
    // messages can still be there when the next step starts, and a submission finds the
    // 64 KiB stream full (CI saw it, twice). The full stream is the backpressure a submitter
    // meets; it waits and submits again, as a client should. Were processed messages kept,
    // the stream would stay full and the submission fail at the deadline.
    for batch in 0..24 {
        let trajs: Vec<String> = (0..4).map(|t| format!("t{batch}-{t}")).collect();
        let opens: Vec<_> = trajs
            .iter()
            .map(|t| open(&format!("o-{t}"), "wrap", t))
            .collect();
        let mut execs: Vec<_> = trajs
            .iter()
            .map(|t| exec(&format!("e-{t}"), "wrap", t, &["python3", "main.py"], 1, 1))
            .collect();
        for e in &mut execs {
            if let tangram_shared::ActionSpec::SandboxExec(x) = &mut e.spec {
                x.files.insert("main.py".into(), source.clone());
            }
        }
        let closes: Vec<_> = trajs
            .iter()
            .map(|t| close(&format!("c-{t}"), "wrap", t))
            .collect();
        for step in [opens, execs, closes] {
            let runs = step.iter().map(|a| run_through_backpressure(&c, a));
            for (a, r) in step.iter().zip(futures::future::join_all(runs).await) {
                let r = r?;
                assert!(
                    matches!(r.outcome, Outcome::Completed { exit_code: 0 }),
                    "{}: {r:?}",
                    a.id
                );
                ids.push(a.id.clone());
            }
        }
    }
    assert_eq!(ids.len(), 24 * 4 * 3);
    // Exactly one result each (the results stream is not shrunk: all are there).
    let mut results = c.js.get_stream(subject::RESULTS_STREAM).await?;
    let held = results.info().await?.state.messages;
    assert_eq!(held, ids.len() as u64, "one result per action");
    // The history wrapped: its first message is long gone, and it holds under its limit.
    let mut history = c.js.get_stream(subject::HISTORY_STREAM).await?;
    let state = history.info().await?.state.clone();
    assert!(state.first_sequence > 200, "the history wrapped: {state:?}");
    assert!(state.bytes <= 64 << 10, "{state:?}");
    // Nothing is left in the backlog: what was processed left it.
    for name in [subject::ACTIONS_STREAM, subject::DISPATCH_STREAM] {
        let mut s = c.js.get_stream(name).await?;
        let deadline = tokio::time::Instant::now() + T;
        loop {
            let n = s.info().await?.state.messages;
            if n == 0 {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{name} still holds {n} messages"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    cluster.shutdown().await
}

/// Regression: a rejected action stayed in the actions stream, so oversized bodies filled it
/// (up to the server's 8 MiB message limit each) and every job was refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rejected_input_leaves_the_backlog() -> anyhow::Result<()> {
    let cluster = Cluster::start(&[]).await?;
    let c = cluster.client("rej").await?;
    // Over the scheduler's 1 MiB action limit, under the server's message limit.
    let big = vec![b'x'; 2 << 20];
    c.publish_raw(
        &format!("{}.action.rej.sandbox_exec", subject::PREFIX),
        Some("big-1"),
        None,
        big,
    )
    .await?;
    let r = c
        .result(&tangram_shared::ActionId::new("big-1")?, T)
        .await?;
    assert!(matches!(r.outcome, Outcome::Rejected { .. }), "{r:?}");
    let mut actions = c.js.get_stream(subject::ACTIONS_STREAM).await?;
    let deadline = tokio::time::Instant::now() + T;
    while actions.info().await?.state.bytes > 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the rejected body still occupies the backlog"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    cluster.shutdown().await
}

/// Regression: results were deduplicated only within JetStream's two-minute window, so a
/// completion that came later than that after the scheduler had settled the action
/// `worker_lost` was stored as a second, contradictory result.
#[tokio::test]
async fn a_late_completion_after_a_settlement_is_never_stored_as_a_second_result(
) -> anyhow::Result<()> {
    let nats = tangram_tests::NatsServer::start();
    let client = async_nats::connect(nats.url()).await?;
    let js = jetstream::new(client);
    tangram_nats::ensure_streams(&js, &StreamSettings::default()).await?;
    // The duplicate window shortened to a second, so that the test outlives it.
    let mut results = js.get_stream(subject::RESULTS_STREAM).await?;
    let mut config = results.info().await?.config.clone();
    config.duplicate_window = Duration::from_secs(1);
    js.update_stream(config).await?;

    let a = open("late-1", "late", "t");
    let lost = ActionResult::new(
        a.id.clone(),
        a.job.clone(),
        Outcome::InfraError {
            code: tangram_shared::InfraCode::WorkerLost,
            reason: "settled by the scheduler".into(),
        },
        1,
    );
    tangram_nats::publish_result(&js, &lost, Encoding::Msgpack, 3).await?;
    // Past the duplicate window, the worker's completion comes.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let done = ActionResult::new(
        a.id.clone(),
        a.job.clone(),
        Outcome::Completed { exit_code: 0 },
        2,
    );
    tangram_nats::publish_result(&js, &done, Encoding::Msgpack, 3).await?;
    let subj = subject::result(&a.job, &a.id);
    let info = results.info_with_subjects(&subj).await?;
    let counts: Vec<(String, usize)> = futures::StreamExt::collect::<Vec<_>>(info)
        .await
        .into_iter()
        .collect::<Result<_, _>>()?;
    assert_eq!(counts, [(subj.clone(), 1)], "one result on the subject");
    let stored = results.get_last_raw_message_by_subject(&subj).await?;
    let r: ActionResult = codec::decode(&stored.payload, Encoding::Msgpack)?;
    assert!(
        matches!(r.outcome, Outcome::InfraError { .. }),
        "the first result stands: {r:?}"
    );
    Ok(())
}

/// Regression: a worker restarted while an action's result was stored but its dispatch not
/// yet acknowledged reported the redelivered dispatch `worker_lost` without looking for the
/// stored result, and past JetStream's duplicate window that was stored as a second,
/// contradictory result. Here the completed result is stored, the duplicate window (shortened
/// to a second) passes, and the dispatch, addressed to an earlier instance, reaches the
/// worker: the action keeps its one result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_workers_worker_lost_never_follows_a_stored_result() -> anyhow::Result<()> {
    let mut cluster = Cluster::start_without_scheduler(&[]).await?;
    let client = async_nats::connect(cluster.nats.url()).await?;
    let js = jetstream::new(client);
    tangram_nats::ensure_streams(&js, &StreamSettings::default()).await?;
    let mut results = js.get_stream(subject::RESULTS_STREAM).await?;
    let mut config = results.info().await?.config.clone();
    config.duplicate_window = Duration::from_secs(1);
    js.update_stream(config).await?;

    let w = worker("restarted-1");
    let a = open("done-before-restart", "rs", "t1");
    let done = ActionResult::new(
        a.id.clone(),
        a.job.clone(),
        Outcome::Completed { exit_code: 0 },
        1,
    );
    tangram_nats::publish_result(&js, &done, Encoding::Msgpack, 3).await?;
    tokio::time::sleep(Duration::from_millis(1500)).await; // past the duplicate window
    let dispatch = |a: tangram_shared::Action, instance: Option<&str>| Dispatch {
        epoch: 0,
        attempt: 1,
        action: a,
        grant: Grant {
            cores: 0,
            mem_mb: 256,
        },
        submitted_at_us: 1,
        result_encoding: Encoding::Msgpack,
        instance: instance.map(str::to_string),
        gpu: None,
    };
    // The earlier instance's dispatch, then one for this instance: intake is sequential, so
    // once the second has its result the first was judged and answered.
    let probe = open("after-restart", "rs", "t2");
    for d in [
        dispatch(a.clone(), Some("an-earlier-instance")),
        dispatch(probe.clone(), None),
    ] {
        js.publish(
            subject::dispatch(&w, &d.action.id),
            codec::encode(&d, Encoding::Msgpack)?.into(),
        )
        .await?
        .await?;
    }
    cluster.start_worker(noop(w.as_str()))?;
    let c = tangram_tests::Client::connect(&cluster.nats.url(), "rs").await?;
    let r = c.result(&probe.id, T).await?;
    assert_eq!(r.outcome, Outcome::Completed { exit_code: 0 }, "{r:?}");

    let subj = subject::result(&a.job, &a.id);
    let info = results.info_with_subjects(&subj).await?;
    let counts: Vec<(String, usize)> = futures::StreamExt::collect::<Vec<_>>(info)
        .await
        .into_iter()
        .collect::<Result<_, _>>()?;
    assert_eq!(counts, [(subj.clone(), 1)], "one result on the subject");
    let stored = results.get_last_raw_message_by_subject(&subj).await?;
    let r: ActionResult = codec::decode(&stored.payload, Encoding::Msgpack)?;
    assert_eq!(
        r.outcome,
        Outcome::Completed { exit_code: 0 },
        "the stored completion stands"
    );
    Ok(())
}

/// A cluster made by the release before the backlog/history split (limits retention on the
/// action and dispatch streams) upgrades in place with `tangram streams upgrade`: processes
/// refuse the old layout with the command to run; the upgrade keeps the history and
/// carries exactly the unprocessed actions and the dispatches without a result; a scheduler
/// and a worker started afterwards answer the carried actions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_of_the_previous_release_upgrades_in_place() -> anyhow::Result<()> {
    let mut cluster = Cluster::start_without_scheduler(&[]).await?;
    let client = async_nats::connect(cluster.nats.url()).await?;
    let js = jetstream::new(client);
    // The previous release's layout.
    for json in [
        include_str!("../fixtures/streams-0.1/actions.json"),
        include_str!("../fixtures/streams-0.1/dispatch.json"),
        include_str!("../../nats/streams/results.json"),
        include_str!("../../nats/streams/deadletter.json"),
    ] {
        let config: stream::Config = serde_json::from_str(json)?;
        js.create_stream(config).await?;
    }
    let actions = js.get_stream(subject::ACTIONS_STREAM).await?;
    let scheduler: consumer::pull::Config =
        serde_json::from_str(include_str!("../../nats/consumers/scheduler.json"))?;
    let intake = actions.create_consumer(scheduler).await?;
    let submitted: Vec<_> = (1..=6)
        .map(|i| open(&format!("up-{i}"), "up", &format!("t{i}")))
        .collect();
    for a in &submitted {
        let mut h = async_nats::HeaderMap::new();
        h.insert(subject::HEADER_MSG_ID, a.id.as_str());
        js.publish_with_headers(
            subject::action(&a.job, a.kind()),
            h,
            codec::encode(a, Encoding::Msgpack)?.into(),
        )
        .await?
        .await?;
    }
    // The old scheduler processed 1 to 4: 1 and 2 answered, 3 dispatched and still running,
    // 4 dispatched and answered. 5 and 6 were never read.
    let mut batch = intake.fetch().max_messages(4).messages().await?;
    let mut got = 0;
    while let Some(m) = futures::StreamExt::next(&mut batch).await {
        m.map_err(|e| anyhow::anyhow!("{e}"))?
            .double_ack()
            .await
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        got += 1;
    }
    assert_eq!(got, 4);
    let gone = worker("up-gone");
    for a in &submitted[2..4] {
        let d = Dispatch {
            epoch: 1,
            attempt: 1,
            action: a.clone(),
            grant: Grant {
                cores: 0,
                mem_mb: 256,
            },
            submitted_at_us: 1,
            result_encoding: Encoding::Msgpack,
            instance: None,
            gpu: None,
        };
        js.publish(
            subject::dispatch(&gone, &a.id),
            codec::encode(&d, Encoding::Msgpack)?.into(),
        )
        .await?
        .await?;
    }
    for i in [0, 1, 3] {
        let a = &submitted[i];
        let r = ActionResult::new(
            a.id.clone(),
            a.job.clone(),
            Outcome::Completed { exit_code: 0 },
            1,
        );
        tangram_nats::publish_result(&js, &r, Encoding::Msgpack, 3).await?;
    }

    // A process of this release refuses the old layout and names the command.
    let err = tangram_nats::ensure_streams(&js, &StreamSettings::default())
        .await
        .expect_err("the old layout is refused");
    assert!(err.to_string().contains("tangram streams upgrade"), "{err}");

    let out = std::process::Command::new(tangram_tests::built_binary("tangram"))
        .args([
            "streams",
            "upgrade",
            "--json",
            "--state-dir",
            "/nonexistent",
        ])
        .args(["--nats-url", &cluster.nats.url()])
        .output()?;
    let text = tangram_tests::output_text(&out);
    assert!(out.status.success(), "{text}");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    assert_eq!(report["actions_carried"], 2, "{text}");
    assert_eq!(report["dispatches_carried"], 1, "{text}");
    assert_eq!(
        report["history_messages"], 8,
        "6 actions and 2 dispatches: {text}"
    );

    for (name, held) in [(subject::ACTIONS_STREAM, 2), (subject::DISPATCH_STREAM, 1)] {
        let mut s = js.get_stream(name).await?;
        let info = s.info().await?;
        assert_eq!(
            info.config.retention,
            stream::RetentionPolicy::WorkQueue,
            "{name}"
        );
        assert_eq!(info.state.messages, held, "{name}");
    }
    // The history kept all eight, and follows the new streams (which hold three).
    let mut history = js.get_stream(subject::HISTORY_STREAM).await?;
    let deadline = tokio::time::Instant::now() + T;
    while history.info().await?.state.messages < 11 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "history: {:?}",
            history.cached_info().state
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let drift = tangram_nats::ensure_streams(&js, &StreamSettings::default()).await?;
    assert!(drift.is_empty(), "{drift:?}");
    // Run again: nothing to do.
    let again = std::process::Command::new(tangram_tests::built_binary("tangram"))
        .args([
            "streams",
            "upgrade",
            "--json",
            "--state-dir",
            "/nonexistent",
        ])
        .args(["--nats-url", &cluster.nats.url()])
        .output()?;
    let report: serde_json::Value = serde_json::from_slice(&again.stdout)?;
    assert_eq!(report["already_current"], true);

    // The fleet starts as usual and answers the carried actions.
    cluster.start_scheduler();
    let c = cluster.client("up").await?;
    cluster.start_worker(noop("up-cpu"))?;
    for a in &submitted[4..] {
        let r = c.result(&a.id, T).await?;
        assert!(
            matches!(r.outcome, Outcome::Completed { exit_code: 0 }),
            "{}: {r:?}",
            a.id
        );
    }
    cluster.shutdown().await
}
