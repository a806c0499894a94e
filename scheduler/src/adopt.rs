//! Finding stored dispatches, for adoption (see `tangram_core::engine` adopt): by worker and
//! action when a heartbeat lists an action this leader does not know, and by action alone
//! when an action message comes back (an earlier leader stored its dispatch, then ended
//! before acking the message).

use async_nats::jetstream;
use futures::StreamExt;
use tangram_shared::codec::{decode, Encoding};
use tangram_shared::{subject, ActionId, Dispatch, WorkerId};
use tracing::warn;

/// The last dispatch stored on `subject`, if any; `Err` when the server could not say
/// (logged). One that does not decode counts as none, logged.
async fn last_on(
    stream: &jetstream::stream::Stream,
    subject: &str,
) -> Result<Option<Dispatch>, ()> {
    use async_nats::jetstream::stream::LastRawMessageErrorKind;
    match stream.get_last_raw_message_by_subject(subject).await {
        Ok(m) => match decode::<Dispatch>(&m.payload, Encoding::Msgpack) {
            Ok(d) => Ok(Some(d)),
            Err(e) => {
                warn!(%subject, error = %e, "stored dispatch does not decode");
                Ok(None)
            }
        },
        Err(e) if e.kind() == LastRawMessageErrorKind::NoMessageFound => Ok(None),
        Err(e) => {
            warn!(%subject, error = %e, "looking up a stored dispatch");
            Err(())
        }
    }
}

/// The dispatch of `id` to `worker`, as stored.
pub(crate) async fn dispatch_to(
    stream: &jetstream::stream::Stream,
    worker: &WorkerId,
    id: &ActionId,
) -> Option<Dispatch> {
    // A failed lookup is asked again later (the heartbeat lists the action again).
    last_on(stream, &subject::dispatch(worker, id))
        .await
        .ok()
        .flatten()
}

/// A dispatch of `id` to any worker, as stored (the one that counts by the engine's
/// `latest_dispatch`, if several workers were tried);
/// `Err` when the stream could not be asked (the caller must not take that as none).
pub(crate) async fn dispatch_of(
    stream: &jetstream::stream::Stream,
    id: &ActionId,
) -> Result<Option<(WorkerId, Dispatch)>, ()> {
    let filter = format!("{}.dispatch.*.{id}", subject::PREFIX);
    let mut subjects = match stream.info_with_subjects(&filter).await {
        Ok(s) => s,
        Err(e) => {
            warn!(action = %id, error = %e, "listing stored dispatches");
            return Err(());
        }
    };
    let mut found: Vec<(WorkerId, Dispatch)> = Vec::new();
    while let Some(entry) = subjects.next().await {
        let (subj, _) = match entry {
            Ok(x) => x,
            Err(e) => {
                warn!(action = %id, error = %e, "listing stored dispatches");
                return Err(());
            }
        };
        let Some(worker) = subj
            .strip_prefix(&format!("{}.dispatch.", subject::PREFIX))
            .and_then(|rest| rest.split_once('.'))
            .and_then(|(w, _)| WorkerId::new(w).ok())
        else {
            continue;
        };
        if let Some(d) = last_on(stream, &subj).await? {
            found.push((worker, d));
        }
    }
    // Which one counts is the engine's rule.
    Ok(tangram_core::engine::latest_dispatch(found))
}

/// Dispatches read from the backlog at once, at most.
const SCAN_CONCURRENCY: usize = 32;

/// At the start of a term: every dispatch left in the dispatch backlog. One whose action has
/// a stored result is removed (its worker stored the result, then stopped before acking);
/// every other one is handed to the engine to adopt (`Event::AdoptStored`), whatever
/// became of its worker. Retried until the listing succeeds or the term ends: a dispatch
/// not adopted would never get a result if its worker is gone.
pub(crate) async fn scan_backlog(
    dispatches: jetstream::stream::Stream,
    results: jetstream::stream::Stream,
    tx: tokio::sync::mpsc::Sender<crate::channels::Input>,
    stop: tokio_util::sync::CancellationToken,
) {
    let mut attempt = 0u32;
    let subjects = loop {
        match tangram_nats::stored_subjects(&dispatches, subject::DISPATCH_ALL).await {
            Ok(s) => break s,
            Err(e) => {
                attempt += 1;
                warn!(error = %e, attempt, "listing the dispatch backlog");
                let wait = tangram_nats::backoff::backoff(
                    attempt,
                    std::time::Duration::from_millis(250),
                    std::time::Duration::from_secs(5),
                );
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(wait) => {}
                }
            }
        }
    };
    let (regrants, plain): (Vec<_>, Vec<_>) =
        subjects.into_iter().partition(|s| s.ends_with(".regrant"));
    let found = plain.len();
    let resized: std::collections::HashSet<&str> = regrants
        .iter()
        .map(|r| r.trim_end_matches(".regrant"))
        .collect();
    let outcomes = futures::stream::iter(plain)
        .map(|subj| {
            let dispatches = &dispatches;
            let results = &results;
            let tx = &tx;
            let resized = resized.contains(subj.as_str());
            async move {
                let outcome = one(dispatches, results, tx, &subj, resized).await;
                (subj, outcome)
            }
        })
        .buffer_unordered(SCAN_CONCURRENCY)
        .collect::<std::collections::HashMap<String, Scanned>>()
        .await;
    let adopted = outcomes
        .values()
        .filter(|o| **o == Scanned::Adopted)
        .count();
    // Sent after every adoption, on the same channel: the engine places work from now on.
    let _ = tx
        .send(crate::channels::Input::Engine(
            tangram_core::Event::BacklogRead,
        ))
        .await;
    // A re-size whose dispatch is gone (or was, as settled, removed just now) amends nothing.
    // One whose dispatch could not be read stays, for the worker to take.
    for r in regrants {
        let base = r.trim_end_matches(".regrant");
        if matches!(outcomes.get(base), None | Some(Scanned::Gone)) {
            if let Err(e) = dispatches.purge().filter(&r).await {
                warn!(subject = %r, error = %e, "removing a stale re-size");
            }
        }
    }
    tracing::info!(
        found,
        adopted,
        "dispatch backlog read: every dispatch without a result is this term's"
    );
}

/// What the scan made of one dispatch of the backlog.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scanned {
    /// Handed to the engine to adopt.
    Adopted,
    /// Not there (taken meanwhile), settled (removed), or unreadable as a dispatch (removed).
    Gone,
    /// Not read within the tries: left to a heartbeat's fetch.
    Unread,
}

/// One dispatch of the backlog. `resized`: a re-size of it is in the backlog too (not yet
/// taken by its worker).
async fn one(
    dispatches: &jetstream::stream::Stream,
    results: &jetstream::stream::Stream,
    tx: &tokio::sync::mpsc::Sender<crate::channels::Input>,
    subj: &str,
    resized: bool,
) -> Scanned {
    use async_nats::jetstream::stream::{DirectGetErrorKind, LastRawMessageErrorKind};
    let Some(worker) = subj
        .strip_prefix(&format!("{}.dispatch.", subject::PREFIX))
        .and_then(|rest| rest.split_once('.'))
        .and_then(|(w, _)| WorkerId::new(w).ok())
    else {
        return Scanned::Gone;
    };
    // A failover is when a stream may be electing a new leader of its own: keep trying for
    // about half a minute (backoff capped at 2 s) before leaving this one to a heartbeat's
    // fetch, since the term places nothing until the whole backlog is read.
    for attempt in 0..20u32 {
        if attempt > 0 {
            tokio::time::sleep(tangram_nats::backoff::backoff(
                attempt,
                std::time::Duration::from_millis(200),
                std::time::Duration::from_secs(2),
            ))
            .await;
        }
        let m = match dispatches.get_last_raw_message_by_subject(subj).await {
            Ok(m) => m,
            Err(e) if e.kind() == LastRawMessageErrorKind::NoMessageFound => return Scanned::Gone,
            Err(e) => {
                warn!(subject = %subj, error = %e, "reading a dispatch of the backlog");
                continue;
            }
        };
        let Ok(d) = decode::<Dispatch>(&m.payload, Encoding::Msgpack) else {
            warn!(subject = %subj, "a dispatch of the backlog does not decode; removed");
            let _ = dispatches.delete_message(m.sequence).await;
            return Scanned::Gone;
        };
        let result = subject::result(&d.action.job, &d.action.id);
        match results.direct_get_last_for_subject(&result).await {
            Ok(_) => {
                // Settled: only the ack was missing.
                let _ = dispatches.delete_message(m.sequence).await;
                return Scanned::Gone;
            }
            Err(e) if e.kind() == DirectGetErrorKind::NotFound => {}
            Err(e) => {
                warn!(subject = %result, error = %e, "looking up the result of a backlog dispatch");
                continue;
            }
        }
        let resize = if resized {
            match pending_regrant(dispatches, subj, d.attempt).await {
                Ok(r) => r,
                Err(()) => continue,
            }
        } else {
            None
        };
        let event = tangram_core::Event::AdoptStored {
            worker,
            dispatch: Box::new(d),
            seq: m.sequence,
            resize,
        };
        return match tx.send(crate::channels::Input::Engine(event)).await {
            Ok(()) => Scanned::Adopted,
            // The term is over: nothing to leave for anyone.
            Err(_) => Scanned::Unread,
        };
    }
    Scanned::Unread
}

/// Re-sizes of one dispatch read at most by the backlog scan (a leader sends a few per exec).
const MOST_REGRANTS: usize = 64;

/// Of the re-sizes stored for the dispatch on `subj` (of its `attempt`) that its worker has
/// not taken yet, the one it ends on; `Err` when the server could not say. The worker takes
/// its subject in stream order and keeps the newest re-size by (epoch, the leader's
/// sequence), dropping any it has seen superseded, so that is the newest of them wherever it
/// lies in the stream: a deposed leader's late re-size can be stored after a later leader's.
async fn pending_regrant(
    dispatches: &jetstream::stream::Stream,
    subj: &str,
    attempt: u32,
) -> Result<Option<tangram_core::PendingResize>, ()> {
    use async_nats::jetstream::stream::LastRawMessageErrorKind;
    let regrant = format!("{subj}.regrant");
    let mut newest: Option<((u64, u64), tangram_core::PendingResize)> = None;
    let mut from = 1;
    for _ in 0..MOST_REGRANTS {
        let m = match dispatches
            .get_first_raw_message_by_subject(&regrant, from)
            .await
        {
            Ok(m) => m,
            // None left: every re-size was taken by the worker or read here.
            Err(e) if e.kind() == LastRawMessageErrorKind::NoMessageFound => {
                return Ok(newest.map(|(_, p)| p))
            }
            Err(e) => {
                warn!(subject = %regrant, error = %e, "reading a re-size of the backlog");
                return Err(());
            }
        };
        from = m.sequence + 1;
        match decode::<tangram_shared::Regrant>(&m.payload, Encoding::Msgpack) {
            Ok(r) if r.attempt == attempt => {
                let key = (r.epoch, r.seq);
                if newest.as_ref().is_none_or(|(k, _)| key > *k) {
                    let pending = tangram_core::PendingResize {
                        cores: r.grant.cores,
                        seq: m.sequence,
                        epoch: r.epoch,
                    };
                    newest = Some((key, pending));
                }
            }
            Ok(_) => {}
            Err(e) => {
                warn!(subject = %regrant, error = %e, "a re-size of the backlog does not decode");
            }
        }
    }
    warn!(
        subject = %regrant,
        "more than {MOST_REGRANTS} re-sizes of one dispatch in the backlog; the newest read is booked"
    );
    Ok(newest.map(|(_, p)| p))
}

/// After a result the scheduler stored on a worker's behalf: the action's dispatches (and
/// re-sizes) leave the backlog, whichever workers they were addressed to.
pub(crate) async fn forget_dispatches(stream: &jetstream::stream::Stream, id: &ActionId) {
    for filter in [
        format!("{}.dispatch.*.{id}", subject::PREFIX),
        format!("{}.dispatch.*.{id}.regrant", subject::PREFIX),
    ] {
        if let Err(e) = stream.purge().filter(&filter).await {
            warn!(action = %id, error = %e, "removing a settled action's dispatch");
        }
    }
}
