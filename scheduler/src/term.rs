//! One term as leader: the tasks around the state task, the I/O shell of the engine.
//!
//! Intake decodes and validates action messages and checks for stored results (the duplicate
//! check beyond the stream's window: an in-memory filter, a lookup only when it cannot rule a
//! result out; see [`crate::stored`] and [`crate::intake`]) on its own task, pipelined, in
//! stream order, beside what an earlier leader left unanswered ([`crate::held`]); the state
//! task ([`crate::shell`]) runs the engine; the dispatcher ([`crate::dispatcher`]) stores
//! dispatches and awaits their PubAcks concurrently; results, heartbeats, status requests
//! ([`crate::report`]) and ticks are fed in by their own tasks.

use crate::config::Config;
use crate::dispatcher;
use crate::gate::Gate;
use crate::held::Incoming;
use crate::intake::{admit, scan_stored, LOOKUP_RETRY_AFTER};
use crate::lease::Fence;
use crate::shell::{Input, Shell, ShellIo};
use crate::stored::StoredResults;
use async_nats::jetstream::{self, kv, AckKind};
use futures::StreamExt;
use std::sync::Arc;
use std::time::Duration;
use tangram_core::{Engine, EngineConfig, Event};
use tangram_shared::{subject, Limits};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{warn, Instrument};

/// Inputs waiting for the state task; intake pauses when it is full.
const EVENT_CHANNEL: usize = 4096;
/// Stored-result lookups in flight at once on the intake (their answers are taken in order).
const LOOKUPS: usize = 64;
/// How often the engine is ticked (liveness, deadlines, in-progress acks).
const TICK: Duration = Duration::from_millis(250);

/// One try of a term's setup call, at most.
const SETUP_TRY: Duration = Duration::from_secs(2);
/// All tries of one setup call, at most.
const SETUP_WITHIN: Duration = Duration::from_secs(60);

/// Calls `f` until it succeeds, each try bounded by [`SETUP_TRY`] and tried again with
/// backoff: a stream electing a leader (a NATS server of a cluster gone) answers within
/// seconds, and a term must not stall on one request meanwhile. Gives up after
/// [`SETUP_WITHIN`], or when the term ends.
async fn patiently<T, E, F, Fut>(
    what: &str,
    stop: &CancellationToken,
    mut f: F,
) -> anyhow::Result<T>
where
    E: std::fmt::Display,
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, E>>,
{
    let deadline = tokio::time::Instant::now() + SETUP_WITHIN;
    let mut attempt = 0u32;
    loop {
        let last = match tokio::time::timeout(SETUP_TRY, f()).await {
            Ok(Ok(v)) => return Ok(v),
            Ok(Err(e)) => e.to_string(),
            Err(_) => format!("no answer within {SETUP_TRY:?}"),
        };
        attempt += 1;
        if tokio::time::Instant::now() >= deadline || stop.is_cancelled() {
            anyhow::bail!("{what}: {last}");
        }
        warn!(attempt, error = %last, "{what}; trying again");
        let wait = tangram_nats::backoff::backoff(
            attempt,
            Duration::from_millis(100),
            Duration::from_secs(1),
        );
        tokio::select! {
            _ = stop.cancelled() => anyhow::bail!("{what}: the term ended"),
            _ = tokio::time::sleep(wait) => {}
        }
    }
}

/// One term as leader, until `shutdown` (the end of the term) is cancelled.
pub(crate) async fn lead(
    client: &async_nats::Client,
    js: &jetstream::Context,
    store: &kv::Store,
    config: &Config,
    epoch: u64,
    fence: Arc<Fence>,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let config = config.clone();
    let js = js.clone();
    let store = store.clone();
    let mut actions = patiently("creating the actions consumer", &shutdown, || {
        tangram_nats::scheduler_actions_consumer(&js)
    })
    .await?;
    let results = patiently("creating the results consumer", &shutdown, || {
        tangram_nats::scheduler_results_consumer(&js)
    })
    .await?;
    let heartbeats = client.subscribe(subject::HEARTBEAT_ALL).await?;
    let status_requests = client.subscribe(subject::STATUS).await?;
    let results_stream = patiently("looking up the results stream", &shutdown, || {
        js.get_stream(subject::RESULTS_STREAM)
    })
    .await?;
    let dispatch_stream = patiently("looking up the dispatch stream", &shutdown, || {
        js.get_stream(subject::DISPATCH_STREAM)
    })
    .await?;
    let actions_stream = patiently("looking up the actions stream", &shutdown, || {
        js.get_stream(subject::ACTIONS_STREAM)
    })
    .await?;
    // What an earlier leader was delivered and never answered, read before this term pulls
    // anything (see `crate::held`).
    let taken_back = crate::held::take_back(&mut actions, &actions_stream).await;

    let (tx, rx) = mpsc::channel(EVENT_CHANNEL);
    let tasks = TaskTracker::new();
    // What is stored already: the results consumer exists (it delivers everything stored
    // from here on), so a scan of the stream's subjects covers the rest.
    let stored = Arc::new(StoredResults::default());
    tasks.spawn(
        scan_stored(results_stream.clone(), stored.clone(), shutdown.clone())
            .instrument(tracing::info_span!("stored-scan")),
    );
    // Everything in flight when the term began: the dispatch backlog, read once.
    tasks.spawn(
        crate::adopt::scan_backlog(
            dispatch_stream.clone(),
            results_stream.clone(),
            tx.clone(),
            shutdown.clone(),
        )
        .instrument(tracing::info_span!("backlog-scan")),
    );
    let intake_stop = shutdown.child_token();
    let limits = Limits {
        max_timeout_ms: config.max_timeout.as_millis() as u64,
        ..Limits::default()
    };

    // Intake: actions, in stream order, validated and checked against stored results with
    // up to LOOKUPS lookups in flight.
    let messages = actions.messages().await?;
    let max_bytes = config.max_action_bytes;
    let intake = {
        let stream = results_stream.clone();
        let dispatch_stream = dispatch_stream.clone();
        let stored = stored.clone();
        let delivered = messages.filter_map(|m| async move {
            m.map_err(|e| warn!(error = %e, "action consumer error"))
                .ok()
                .map(Incoming::Delivered)
        });
        // Side by side, not one before the other: taking back thousands, read one by one,
        // must not hold up what arrives meanwhile.
        futures::stream::select(taken_back.map(Incoming::TakenBack), delivered)
            .map(move |msg| {
                let stream = stream.clone();
                let dispatches = dispatch_stream.clone();
                let stored = stored.clone();
                async move { admit(msg, &limits, max_bytes, &stream, &dispatches, &stored).await }
            })
            .buffered(LOOKUPS)
    };
    let to_state = tx.clone();
    let gate = Arc::new(Gate::new(
        config.max_queued_actions,
        config.max_queued_bytes,
    ));
    let intake_gate = gate.clone();
    tasks.spawn(
        pump(intake, intake_stop.clone(), move |(msg, event)| {
            let tx = to_state.clone();
            let gate = intake_gate.clone();
            async move {
                let event = match event {
                    // A taken-back message the engine would reject, or could not be looked
                    // up: left where it is, for its delivery at its ack wait to settle.
                    Some(Event::Bad(_)) | None if msg.is_taken_back() => return true,
                    Some(event) => event,
                    None => {
                        // Whether it ran already could not be told: it comes back later
                        // rather than being guessed new and run twice.
                        crate::metrics::result_lookup("failed");
                        let nak = msg.reply(AckKind::Nak(Some(LOOKUP_RETRY_AFTER))).await;
                        if let Err(e) = nak {
                            warn!(error = %e, "handing back an action whose lookups failed");
                        }
                        return true;
                    }
                };
                // Memory is bounded: past the gate's limits the intake waits, and what it
                // has not pulled stays in the stream.
                if gate.wait_for_room().await {
                    crate::metrics::intake_paused();
                }
                let bytes = msg.payload().len();
                gate.hold(bytes);
                let sent = tx.send(Input::Message(Box::new(msg), event)).await.is_ok();
                if !sent {
                    gate.release(bytes);
                }
                sent
            }
        })
        .instrument(tracing::info_span!("intake")),
    );
    // Results: release capacity. Acked once handed to the state task (release is idempotent).
    let messages = results.messages().await?;
    let to_state = tx.clone();
    let feed_stored = stored.clone();
    tasks.spawn(
        pump(messages, shutdown.clone(), move |m| {
            let tx = to_state.clone();
            let stored = feed_stored.clone();
            async move { crate::intake::take_result(m, &tx, &stored).await }
        })
        .instrument(tracing::info_span!("results")),
    );
    // Heartbeats (core NATS).
    let to_state = tx.clone();
    tasks.spawn(
        pump(heartbeats, shutdown.clone(), move |msg| {
            let tx = to_state.clone();
            async move { crate::intake::take_heartbeat(msg, &tx).await }
        })
        .instrument(tracing::info_span!("heartbeats")),
    );
    // Operators' cordons and drains.
    tasks.spawn(
        crate::cordons::watch(store.clone(), tx.clone(), shutdown.clone())
            .instrument(tracing::info_span!("cordons")),
    );
    // Status requests (core NATS request/reply): the state task builds the answer.
    let to_state = tx.clone();
    let replier = client.clone();
    let consumer = actions.clone();
    let status_gate = gate.clone();
    tasks.spawn(
        pump(status_requests, shutdown.clone(), move |msg| {
            let tx = to_state.clone();
            let client = replier.clone();
            let store = store.clone();
            let consumer = consumer.clone();
            let gate = status_gate.clone();
            async move {
                crate::report::answer_status(msg, &tx, &client, &store, &consumer, &gate).await
            }
        })
        .instrument(tracing::info_span!("status")),
    );
    // The stream's backlog, for the metrics (status answers read it afresh).
    tasks.spawn(crate::report::watch(
        actions.clone(),
        gate.clone(),
        js.clone(),
        shutdown.clone(),
    ));
    // Ticks: liveness checks, deadlines and keeping queued actions' acks alive; and after
    // each lease renewal, word that NATS answered (worker liveness is judged on that).
    {
        let tx = tx.clone();
        let stop = shutdown.clone();
        let fence = fence.clone();
        tasks.spawn(
            async move {
                let mut tick = tokio::time::interval(TICK);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                let mut renewals = fence.renewals();
                let mut held = true;
                loop {
                    tokio::select! {
                        _ = stop.cancelled() => break,
                        _ = tick.tick() => {
                            let now = fence.renewals();
                            if now != renewals {
                                renewals = now;
                                if tx.send(Input::Engine(Event::Reachable)).await.is_err() { break; }
                            }
                            // The engine plans only while the fence holds (the dispatcher
                            // checks it again before each publish).
                            if fence.holds() != held {
                                held = !held;
                                if held {
                                    tracing::info!("the fence holds again: planning resumes");
                                } else {
                                    metrics::counter!(crate::metrics::PLANNING_PAUSED).increment(1);
                                    tracing::warn!("the fence fell (lease renewals unanswered): planning paused");
                                }
                                if tx.send(Input::Engine(Event::Leadership { held })).await.is_err() { break; }
                            }
                            if tx.send(Input::Engine(Event::Tick)).await.is_err() { break; }
                        }
                    }
                }
            }
            .instrument(tracing::info_span!("ticks")),
        );
    }
    // The dispatcher: PubAcks awaited concurrently, outcomes back to the state task.
    let (dispatch_tx, dispatch_rx) = mpsc::unbounded_channel();
    let dispatcher_stop = CancellationToken::new();
    tasks.spawn(
        dispatcher::run(
            js.clone(),
            dispatch_rx,
            tx.clone(),
            fence.clone(),
            dispatcher_stop.clone(),
        )
        .instrument(tracing::info_span!("dispatcher")),
    );
    // The state task's own sender, for answers to lookups it starts.
    let to_self = tx;

    let engine = Engine::new(EngineConfig {
        epoch,
        policy: config.policy.clone(),
        static_cores: config.static_cores,
        missed_heartbeats: config.worker_missed_heartbeats,
        settle_ms: config.settle.as_millis() as u64,
        rejoin_ms: config.worker_rejoin.as_millis() as u64,
        job_weights: config.job_weights.clone(),
        limits,
        // Renewals come every quarter lease; the ticker passes each on within a tick.
        reachable_every_ms: (config.lease_ttl / 4 + TICK).as_millis() as u64,
        image_locality: config.image_locality,
        pull_mb_per_s: config.pull_mb_per_s,
        image_load_ms: config.image_load_ms,
        ..EngineConfig::default()
    })?;
    let mut shell = Shell::new(
        engine,
        ShellIo {
            outbox: Arc::new(crate::outbox::Jetstream {
                js,
                dispatches: dispatch_stream,
            }),
            to_self,
            dispatches: dispatch_tx,
            fence,
            tasks: tasks.clone(),
            gate,
        },
    );
    shell
        .run(rx, shutdown.clone())
        .instrument(tracing::info_span!("state", epoch))
        .await;
    drop(shell);

    // Phase two: intake has stopped (shutdown cancelled it); let the tasks finish, the
    // dispatcher reporting what it still had in flight.
    intake_stop.cancel();
    dispatcher_stop.cancel();
    tasks.close();
    if tokio::time::timeout(Duration::from_secs(5), tasks.wait())
        .await
        .is_err()
    {
        warn!("scheduler tasks did not stop within 5 s");
    }
    Ok(())
}

/// Hands each item of `stream` to `handle` until `stop` is cancelled, the stream ends, or
/// `handle` returns false (the state task is gone).
async fn pump<S, F, Fut>(stream: S, stop: CancellationToken, mut handle: F)
where
    S: futures::Stream,
    F: FnMut(S::Item) -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let mut stream = std::pin::pin!(stream);
    loop {
        let item = tokio::select! {
            _ = stop.cancelled() => break,
            item = stream.next() => item,
        };
        let Some(item) = item else { break };
        if !handle(item).await {
            break;
        }
    }
}
