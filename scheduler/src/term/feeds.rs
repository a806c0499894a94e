//! The tasks that feed a term's state task: the intake of action messages (with what an
//! earlier leader left unanswered), results, heartbeats, operators' cordons, status
//! requests, the backlog gauge, and the ticks.

use super::setup::Wiring;
use super::{LOOKUPS, TICK};
use crate::channels::Input;
use crate::gate::Gate;
use crate::held::Incoming;
use crate::intake::{admit, LOOKUP_RETRY_AFTER};
use crate::lease::Fence;
use crate::stored::StoredResults;
use async_nats::jetstream::{self, kv, message::StreamMessage, AckKind};
use futures::StreamExt;
use std::sync::Arc;
use tangram_core::Event;
use tangram_shared::Limits;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{warn, Instrument};

/// Where the feeds send what they take in, and what they share.
pub(super) struct Feeds<'a> {
    pub(super) tasks: &'a TaskTracker,
    pub(super) tx: &'a mpsc::Sender<Input>,
    pub(super) gate: &'a Arc<Gate>,
    pub(super) stored: &'a Arc<StoredResults>,
    pub(super) shutdown: &'a CancellationToken,
}

/// Reads what is stored already: the results consumer exists (it delivers everything stored
/// from here on), so a scan of the stream's subjects covers the rest. And everything in
/// flight when the term began: the dispatch backlog, read once.
pub(super) fn scans(w: &Wiring, f: &Feeds<'_>) {
    f.tasks.spawn(
        crate::intake::scan_stored(
            w.results_stream.clone(),
            f.stored.clone(),
            f.shutdown.clone(),
        )
        .instrument(tracing::info_span!("stored-scan")),
    );
    f.tasks.spawn(
        crate::adopt::scan_backlog(
            w.dispatch_stream.clone(),
            w.results_stream.clone(),
            f.tx.clone(),
            f.shutdown.clone(),
        )
        .instrument(tracing::info_span!("backlog-scan")),
    );
}

/// Intake: actions, in stream order, validated and checked against stored results with up
/// to [`LOOKUPS`] lookups in flight, beside those taken back from an earlier leader; held in
/// the gate while the state task has them. Stops at `stop`.
pub(super) async fn intake(
    w: &Wiring,
    taken_back: impl futures::Stream<Item = StreamMessage> + Send + 'static,
    limits: Limits,
    max_bytes: usize,
    f: &Feeds<'_>,
    stop: CancellationToken,
) -> anyhow::Result<()> {
    let messages = w.actions.messages().await?;
    let stream = w.results_stream.clone();
    let dispatch_stream = w.dispatch_stream.clone();
    let stored = f.stored.clone();
    let delivered = messages.filter_map(|m| async move {
        m.map_err(|e| warn!(error = %e, "action consumer error"))
            .ok()
            .map(Incoming::Delivered)
    });
    // Side by side, not one before the other: taking back thousands, read one by one, must
    // not hold up what arrives meanwhile.
    let admitted = futures::stream::select(taken_back.map(Incoming::TakenBack), delivered)
        .map(move |msg| {
            let stream = stream.clone();
            let dispatches = dispatch_stream.clone();
            let stored = stored.clone();
            async move { admit(msg, &limits, max_bytes, &stream, &dispatches, &stored).await }
        })
        .buffered(LOOKUPS);
    let to_state = f.tx.clone();
    let gate = f.gate.clone();
    f.tasks.spawn(
        pump(admitted, stop, move |(msg, event)| {
            let tx = to_state.clone();
            let gate = gate.clone();
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
    Ok(())
}

/// Results (they release capacity; acked once handed to the state task, the release being
/// idempotent), heartbeats, operators' cordons and drains, status requests (the state task
/// builds the answer), and the stream's backlog for the metrics.
pub(super) async fn the_rest(
    w: Wiring,
    client: &async_nats::Client,
    js: &jetstream::Context,
    store: &kv::Store,
    f: &Feeds<'_>,
) -> anyhow::Result<()> {
    let Wiring {
        actions,
        results,
        heartbeats,
        status_requests,
        close_requests,
        leases,
        ..
    } = w;
    let messages = results.messages().await?;
    let (to_state, stored) = (f.tx.clone(), f.stored.clone());
    f.tasks.spawn(
        pump(messages, f.shutdown.clone(), move |m| {
            let tx = to_state.clone();
            let stored = stored.clone();
            async move { crate::intake::take_result(m, &tx, &stored).await }
        })
        .instrument(tracing::info_span!("results")),
    );
    let to_state = f.tx.clone();
    let hb_gate = Arc::new(std::sync::Mutex::new(
        crate::heartbeats::HeartbeatGate::default(),
    ));
    f.tasks.spawn(
        pump(heartbeats, f.shutdown.clone(), move |msg| {
            let tx = to_state.clone();
            let gate = hb_gate.clone();
            async move { crate::intake::take_heartbeat(msg, &gate, &tx).await }
        })
        .instrument(tracing::info_span!("heartbeats")),
    );
    f.tasks.spawn(
        crate::cordons::watch(store.clone(), f.tx.clone(), f.shutdown.clone())
            .instrument(tracing::info_span!("cordons")),
    );
    let (to_state, replier, consumer) = (f.tx.clone(), client.clone(), actions.clone());
    let (store_, gate) = (store.clone(), f.gate.clone());
    f.tasks.spawn(
        pump(status_requests, f.shutdown.clone(), move |msg| {
            let tx = to_state.clone();
            let client = replier.clone();
            let store = store_.clone();
            let consumer = consumer.clone();
            let gate = gate.clone();
            async move {
                crate::report::answer_status(msg, &tx, &client, &store, &consumer, &gate).await
            }
        })
        .instrument(tracing::info_span!("status")),
    );
    let (to_state, replier) = (f.tx.clone(), client.clone());
    f.tasks.spawn(
        pump(close_requests, f.shutdown.clone(), move |msg| {
            let (tx, client) = (to_state.clone(), replier.clone());
            async move { crate::closes::answer_close(msg, &tx, &client).await }
        })
        .instrument(tracing::info_span!("close")),
    );
    let to_state = f.tx.clone();
    let renewals = Arc::new(std::sync::Mutex::new(crate::closes::Leases::default()));
    f.tasks.spawn(
        pump(leases, f.shutdown.clone(), move |msg| {
            let tx = to_state.clone();
            let event = renewals.lock().expect("leases lock").take(
                &msg.subject,
                &msg.payload,
                tokio::time::Instant::now(),
            );
            async move {
                match event {
                    Some(e) => tx.send(Input::Engine(e)).await.is_ok(),
                    None => true,
                }
            }
        })
        .instrument(tracing::info_span!("leases")),
    );
    f.tasks.spawn(crate::report::watch(
        actions,
        f.gate.clone(),
        js.clone(),
        f.shutdown.clone(),
    ));
    Ok(())
}

/// Ticks: liveness checks, deadlines and keeping queued actions' acks alive; after each
/// lease renewal, word that NATS answered (worker liveness is judged on that); and when the
/// fence falls or holds again, the engine is told (it plans only while it holds; the
/// dispatcher checks it again before each publish).
pub(super) fn ticks(f: &Feeds<'_>, fence: Arc<Fence>) {
    let (tx, stop) = (f.tx.clone(), f.shutdown.clone());
    f.tasks.spawn(
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
