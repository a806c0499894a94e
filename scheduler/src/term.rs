//! One term as leader: the tasks around the state task, the I/O shell of the engine.
//!
//! Intake decodes and validates action messages and checks for stored results (the duplicate
//! check beyond the stream's window: an in-memory filter, a lookup only when it cannot rule a
//! result out; see [`crate::stored`]) on its own task, pipelined, in stream order; the state
//! task ([`crate::shell`]) runs the engine; the dispatcher ([`crate::dispatcher`]) stores
//! dispatches and awaits their PubAcks concurrently; results, heartbeats, status requests
//! and ticks are fed in by their own tasks.

use crate::config::Config;
use crate::dispatcher;
use crate::gate::Gate;
use crate::held::Incoming;
use crate::lease::{self, Fence};
use crate::shell::{Input, Shell, ShellIo};
use crate::stored::StoredResults;
use async_nats::jetstream::{self, kv, AckKind};
use futures::StreamExt;
use std::sync::Arc;
use std::time::Duration;
use tangram_core::engine::{self, Arrival, RawMessage};
use tangram_core::{Engine, EngineConfig, Event};
use tangram_shared::codec::{decode, Encoding};
use tangram_shared::{subject, ActionResult, Heartbeat, Limits};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{info, warn, Instrument};

/// Inputs waiting for the state task; intake pauses when it is full.
const EVENT_CHANNEL: usize = 4096;
/// Stored-result lookups in flight at once on the intake (their answers are taken in order).
const LOOKUPS: usize = 64;
/// How often the engine is ticked (liveness, deadlines, in-progress acks).
const TICK: Duration = Duration::from_millis(250);
/// Tries of a stored-result or stored-dispatch lookup before the message is handed back.
const LOOKUP_TRIES: u32 = 3;
/// When a message whose lookups failed comes back.
const LOOKUP_RETRY_AFTER: Duration = Duration::from_secs(1);

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
            async move {
                let msg = match m {
                    Ok(m) => m,
                    Err(e) => {
                        warn!(error = %e, "result consumer error");
                        return true;
                    }
                };
                stored.insert(msg.subject.as_str());
                let enc = content_type(&msg.headers).unwrap_or_default();
                match decode::<ActionResult>(&msg.payload, enc) {
                    Ok(r) => {
                        let event = Input::Engine(Event::Result(Box::new(r)));
                        if tx.send(event).await.is_err() {
                            return false;
                        }
                    }
                    Err(e) => {
                        warn!(subject = %msg.subject, error = %e, "undecodable result ignored")
                    }
                }
                if let Err(e) = msg.ack().await {
                    warn!(error = %e, "acking a result");
                }
                true
            }
        })
        .instrument(tracing::info_span!("results")),
    );
    // Heartbeats (core NATS).
    let to_state = tx.clone();
    tasks.spawn(
        pump(heartbeats, shutdown.clone(), move |msg| {
            let tx = to_state.clone();
            async move {
                match decode::<Heartbeat>(&msg.payload, Encoding::Msgpack) {
                    Ok(hb) => {
                        let event = Input::Engine(Event::Heartbeat(Box::new(hb)));
                        tx.send(event).await.is_ok()
                    }
                    Err(e) => {
                        warn!(subject = %msg.subject, error = %e, "undecodable heartbeat");
                        true
                    }
                }
            }
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
                let Some(reply) = msg.reply else { return true };
                if !subject::is_reply_inbox(&reply) {
                    tracing::warn!(%reply, "a status request asked for its answer outside an inbox; not answered");
                    return true;
                }
                let req = match tangram_shared::status::StatusRequest::parse(&msg.payload) {
                    Ok(r) => r,
                    Err(e) => {
                        // Answered, never dropped: the asker learns what was wrong.
                        let body = serde_json::json!({"error": format!(
                            "a status request's body is empty or JSON like {{\"workers_after\": \"<id>\", \"workers_limit\": 100}}: {e}"
                        )});
                        let _ = client.publish(reply, body.to_string().into()).await;
                        return true;
                    }
                };
                let (otx, orx) = tokio::sync::oneshot::channel();
                if tx.send(Input::Status(otx)).await.is_err() {
                    return false;
                }
                if let Ok(mut status) = orx.await {
                    tangram_shared::status::page(
                        &mut status,
                        &req,
                        tangram_shared::status::STATUS_PAGE_BYTES,
                    );
                    fill_lease(&mut status, &store).await;
                    status.backlog = backlog(&consumer, &gate).await;
                    if let Ok(body) = serde_json::to_vec(&status) {
                        let _ = client.publish(reply, body.into()).await;
                    }
                }
                true
            }
        })
        .instrument(tracing::info_span!("status")),
    );
    // The stream's backlog, for the metrics (status answers read it afresh).
    {
        let consumer = actions.clone();
        let stop = shutdown.clone();
        let gate = gate.clone();
        let js = js.clone();
        tasks.spawn(async move {
            let mut every = tokio::time::interval(BACKLOG_EVERY);
            loop {
                tokio::select! {
                    _ = stop.cancelled() => break,
                    _ = every.tick() => {
                        backlog(&consumer, &gate).await;
                        deadletters(&js).await;
                    }
                }
            }
        });
    }
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
                loop {
                    tokio::select! {
                        _ = stop.cancelled() => break,
                        _ = tick.tick() => {
                            let now = fence.renewals();
                            if now != renewals {
                                renewals = now;
                                if tx.send(Input::Engine(Event::Reachable)).await.is_err() { break; }
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
    });
    let mut shell = Shell::new(
        engine,
        ShellIo {
            js,
            dispatch_stream,
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

/// Fills `stored` with the subject of every result in the stream, then marks it ready. Until
/// then (and for good, if the scan fails) intake looks every action up.
async fn scan_stored(
    results: jetstream::stream::Stream,
    stored: Arc<StoredResults>,
    stop: CancellationToken,
) {
    let scan = async {
        let mut subjects = results.info_with_subjects(subject::RESULT_ALL).await?;
        let mut count = 0u64;
        while let Some(entry) = subjects.next().await {
            let (subject, _) = entry?;
            stored.insert(&subject);
            count += 1;
        }
        Ok::<u64, anyhow::Error>(count)
    };
    tokio::select! {
        _ = stop.cancelled() => {}
        scanned = scan => match scanned {
            Ok(count) => {
                stored.mark_ready();
                info!(results = count, "stored results indexed; lookups only where the index cannot rule one out");
            }
            Err(e) => warn!(error = %e, "indexing stored results failed; every action is looked up"),
        },
    }
}

/// Whether a result is stored on `subject`, by a direct get from the stream (no JetStream API
/// round trip); an error when the server could not say, after a few tries (never guessed: a
/// guess of "none" would run a finished action again).
async fn result_stored(results: &jetstream::stream::Stream, subject: &str) -> Result<bool, String> {
    use async_nats::jetstream::stream::DirectGetErrorKind;
    let mut last = String::new();
    for attempt in 0..LOOKUP_TRIES {
        if attempt > 0 {
            // 200 ms, then 400 ms, spread.
            let wait = tangram_nats::backoff::backoff(
                attempt,
                Duration::from_millis(200),
                Duration::from_millis(400),
            );
            tokio::time::sleep(wait).await;
        }
        match results.direct_get_last_for_subject(subject).await {
            Ok(_) => return Ok(true),
            Err(e) if e.kind() == DirectGetErrorKind::NotFound => return Ok(false),
            Err(e) => {
                warn!(%subject, attempt, error = %e, "looking up a stored result");
                last = e.to_string();
            }
        }
    }
    Err(last)
}

/// Turns one action message into the engine's event: validated (or bad), with its stream
/// position, publish time and whether a result is stored for its id already. The server is
/// asked unless the filter rules a stored result out for a first delivery (a redelivery may
/// race the results feed, so it is always asked). `None` when a lookup kept failing: the
/// message is handed back to come again, since guessing could run it twice.
async fn admit(
    msg: Incoming,
    limits: &Limits,
    max_bytes: usize,
    results: &jetstream::stream::Stream,
    dispatches: &jetstream::stream::Stream,
    stored: &StoredResults,
) -> (Incoming, Option<Event>) {
    let delivery = msg.sequence().unwrap_or(0);
    let first_delivery = msg.first_delivery();
    if !first_delivery && !msg.is_taken_back() {
        crate::metrics::action_redelivered();
    }
    let submitted_at_us = msg.stored_at_us();
    let header = |name: &str| {
        msg.headers()
            .and_then(|h| h.get(name))
            .map(|v| v.as_str().to_string())
    };
    let msg_id = header(subject::HEADER_MSG_ID);
    let content_type = header(subject::HEADER_CONTENT_TYPE);
    let raw = RawMessage {
        subject: msg.subject(),
        msg_id: msg_id.as_deref(),
        content_type: content_type.as_deref(),
        payload: msg.payload(),
    };
    let event = match engine::check(&raw, limits, max_bytes, delivery) {
        Ok((action, encoding)) => {
            // A message coming back may have been dispatched by a leader that ended before
            // acking it: the stored dispatch says so, and the action is taken over. Asked
            // before the result: a dispatch leaves the backlog only after its result is
            // stored, so one gone between the two lookups leaves its result to be found.
            let dispatched = if !first_delivery {
                match crate::adopt::dispatch_of(dispatches, &action.id).await {
                    Ok(d) => d.map(Box::new),
                    Err(()) => return (msg, None),
                }
            } else {
                None
            };
            let subject = subject::result(&action.job, &action.id);
            let seen = if first_delivery && stored.surely_absent(&subject) {
                crate::metrics::result_lookup("skipped");
                false
            } else {
                let Ok(seen) = result_stored(results, &subject).await else {
                    return (msg, None);
                };
                crate::metrics::result_lookup(if seen { "stored" } else { "absent" });
                seen
            };
            let dispatched = if seen { None } else { dispatched };
            Some(Event::Arrived(Box::new(Arrival {
                action,
                encoding,
                submitted_at_us,
                delivery,
                seen,
                model: None,
                dispatched,
            })))
        }
        Err(bad) => Some(Event::Bad(bad)),
    };
    (msg, event)
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

pub(crate) fn content_type(
    headers: &Option<async_nats::HeaderMap>,
) -> Result<Encoding, tangram_shared::codec::CodecError> {
    Encoding::from_content_type(
        headers
            .as_ref()
            .and_then(|h| h.get(subject::HEADER_CONTENT_TYPE))
            .map(|v| v.as_str()),
    )
}

/// How often the actions stream's backlog is read for the metrics.
const BACKLOG_EVERY: Duration = Duration::from_secs(2);

/// Actions stored and not yet delivered to this scheduler (beyond its in-memory queue).
/// That is the messages not yet delivered, plus those delivered into the client's buffer
/// and not yet let through the intake gate (JetStream counts them as awaiting an ack).
async fn backlog(consumer: &jetstream::consumer::PullConsumer, gate: &Gate) -> Option<u64> {
    match consumer.get_info().await {
        Ok(info) => {
            let buffered = (info.num_ack_pending as u64).saturating_sub(gate.count() as u64);
            let n = info.num_pending + buffered;
            crate::metrics::backlog(n);
            Some(n)
        }
        Err(e) => {
            warn!(error = %e, "reading the actions consumer for a status answer");
            None
        }
    }
}

/// Records stored in the dead-letter stream, for the metrics (left as last read when the
/// stream cannot be asked).
async fn deadletters(js: &jetstream::Context) {
    let read = async {
        let mut stream = js.get_stream(subject::DEADLETTER_STREAM).await.ok()?;
        Some(stream.info().await.ok()?.state.messages)
    };
    match tokio::time::timeout(Duration::from_secs(1), read).await {
        Ok(Some(n)) => crate::metrics::deadletters(n),
        _ => tracing::debug!("the dead-letter stream could not be read for the metrics"),
    }
}

/// Standbys that have not announced themselves for this long are left out of the status.
const STANDBY_STALE_MS: u64 = 5_000;

/// Adds the leader lease and the live standbys, read from KV, to a status answer.
async fn fill_lease(status: &mut tangram_shared::status::Status, store: &kv::Store) {
    let read = async {
        if let Some(e) = store.entry(subject::LEADER_KEY).await? {
            status.leader = serde_json::from_slice(&e.value).ok();
        }
        let mut keys = store.keys().await?;
        let now = lease::unix_ms();
        let mut standbys = Vec::new();
        while let Some(key) = keys.next().await {
            let key = key?;
            if !key.starts_with(subject::STANDBY_PREFIX) {
                continue;
            }
            if let Some(e) = store.entry(key).await? {
                if let Ok(r) =
                    serde_json::from_slice::<tangram_shared::status::StandbyRecord>(&e.value)
                {
                    if now.saturating_sub(r.seen_unix_ms) <= STANDBY_STALE_MS {
                        standbys.push(r);
                    }
                }
            }
        }
        standbys.sort_by(|a, b| a.id.cmp(&b.id));
        status.standbys = standbys;
        Ok::<(), anyhow::Error>(())
    };
    if let Err(e) = tokio::time::timeout(Duration::from_secs(1), read)
        .await
        .unwrap_or_else(|_| Err(anyhow::anyhow!("timed out")))
    {
        warn!(error = %e, "reading the leader lease for a status answer");
    }
}
