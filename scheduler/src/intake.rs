//! A term's feeds into the state task. Actions one message at a time: validated, and
//! checked against what is stored already (a result, or a dispatch by an earlier leader),
//! before the state task sees them. Results and heartbeats, decoded.

use crate::channels::Input;
use crate::held::Incoming;
use crate::stored::StoredResults;
use async_nats::jetstream;
use futures::StreamExt;
use std::sync::Arc;
use std::time::Duration;
use tangram_core::engine::{self, Arrival, RawMessage};
use tangram_core::Event;
use tangram_shared::codec::{decode, Encoding};
use tangram_shared::{subject, ActionResult, Limits};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// Tries of a stored-result or stored-dispatch lookup before the message is handed back.
const LOOKUP_TRIES: u32 = 3;
/// When a message whose lookups failed comes back.
pub(crate) const LOOKUP_RETRY_AFTER: Duration = Duration::from_secs(1);

/// Fills `stored` with the subject of every result in the stream, then marks it ready. Until
/// then (and for good, if the scan fails) intake looks every action up.
pub(crate) async fn scan_stored(
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
pub(crate) async fn admit(
    msg: Incoming,
    limits: &Limits,
    max_bytes: usize,
    results: &jetstream::stream::Stream,
    dispatches: &jetstream::stream::Stream,
    stored: &StoredResults,
) -> (Incoming, Option<Event>) {
    let position = msg.position();
    let (delivery, first_delivery) = (position.sequence, position.first_delivery);
    if !first_delivery && !msg.is_taken_back() {
        crate::metrics::action_redelivered();
    }
    let submitted_at_us = position.stored_at_us;
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
                bytes: u32::try_from(msg.payload().len()).unwrap_or(u32::MAX),
                redelivered: !first_delivery,
            })))
        }
        Err(bad) => Some(Event::Bad(bad)),
    };
    (msg, event)
}

/// Hands a stored result to the state task (it releases the action's resources) and acks
/// it once handed over (a release is idempotent). False when the state task is gone.
pub(crate) async fn take_result<E: std::fmt::Display>(
    m: Result<jetstream::Message, E>,
    tx: &mpsc::Sender<Input>,
    stored: &StoredResults,
) -> bool {
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
        Err(e) => warn!(subject = %msg.subject, error = %e, "undecodable result ignored"),
    }
    if let Err(e) = msg.ack().await {
        warn!(error = %e, "acking a result");
    }
    true
}

/// Hands a heartbeat (core NATS) to the state task, if `gate` takes it in (see
/// `heartbeats`). False when the state task is gone.
pub(crate) async fn take_heartbeat(
    msg: async_nats::Message,
    gate: &std::sync::Mutex<crate::heartbeats::HeartbeatGate>,
    tx: &mpsc::Sender<Input>,
) -> bool {
    let now = tokio::time::Instant::now();
    let taken =
        gate.lock()
            .expect("heartbeat gate lock")
            .take(msg.subject.as_str(), &msg.payload, now);
    match taken {
        Ok(hb) => {
            let event = Input::Engine(Event::Heartbeat(Box::new(hb)));
            tx.send(event).await.is_ok()
        }
        Err(refused) => {
            crate::metrics::heartbeat_refused(refused.reason());
            let warn_now = gate.lock().expect("heartbeat gate lock").should_warn(
                msg.subject.as_str(),
                refused.reason(),
                now,
            );
            if warn_now {
                warn!(subject = %msg.subject, refused = ?refused, "heartbeat refused (said once a minute per subject and reason)");
            }
            true
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
