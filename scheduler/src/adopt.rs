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

/// A dispatch of `id` to any worker, as stored (the latest, if several workers were tried);
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
    let mut best: Option<(WorkerId, Dispatch)> = None;
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
            let newer = best.as_ref().is_none_or(|(_, b)| {
                (d.epoch, d.attempt, d.submitted_at_us) > (b.epoch, b.attempt, b.submitted_at_us)
            });
            if newer {
                best = Some((worker, d));
            }
        }
    }
    Ok(best)
}
