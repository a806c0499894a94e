//! The dispatcher: publishes the engine's dispatches and re-sizes in the order the engine
//! emitted them (a narrowing before the dispatch that needs its cores) and awaits their
//! PubAcks concurrently, reporting each dispatch as stored or failed. The engine books capacity when it hands a dispatch
//! out (assume on send) and gives it back on failure (forget on failure), so nothing here
//! waits on the state task and no state task waits on a PubAck.

use crate::channels::{Input, Outgoing, Publish};
use crate::lease::Fence;
use async_nats::jetstream;
use async_nats::HeaderMap;
use futures::stream::FuturesUnordered;
use futures::StreamExt;
use std::sync::Arc;
use tangram_core::Event;
use tangram_shared::codec::{self, Encoding};
use tangram_shared::{subject, ActionId, WorkerId};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::warn;

/// Dispatches whose PubAck has not come back, at most: past this the dispatcher stops
/// taking new ones until some are acknowledged (the engine's queue holds the rest).
const IN_FLIGHT: usize = 4096;

/// Runs until `rx` closes or `stop` is cancelled; outcomes go to `events`.
pub(crate) async fn run(
    js: jetstream::Context,
    mut rx: mpsc::UnboundedReceiver<Publish>,
    events: mpsc::Sender<Input>,
    fence: Arc<Fence>,
    stop: CancellationToken,
) {
    let mut pending: FuturesUnordered<futures::future::BoxFuture<'static, Option<Event>>> =
        FuturesUnordered::new();
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            Some(done) = pending.next(), if !pending.is_empty() => {
                let Some(done) = done else { continue };
                if events.send(Input::Engine(done)).await.is_err() {
                    break;
                }
            }
            out = rx.recv(), if pending.len() < IN_FLIGHT => {
                let out = match out {
                    None => break,
                    Some(Publish::Dispatch(out)) => out,
                    Some(Publish::Regrant { worker, regrant }) => {
                        if fence.holds() {
                            if let Some(ack) = send_regrant(&js, &worker, &regrant).await {
                                pending.push(Box::pin(async move {
                                    if let Err(e) = ack.await {
                                        warn!(action = %regrant.id, error = %e, "re-size not stored");
                                    }
                                    None
                                }));
                            }
                        }
                        continue;
                    }
                };
                let (id, attempt) = (out.dispatch.action.id.clone(), out.dispatch.attempt);
                tracing::debug!(action = %id, attempt, worker = %out.worker, epoch = out.dispatch.epoch, "dispatching");
                // A leader whose lease may have passed to another publishes nothing more.
                let published = if fence.holds() {
                    publish(&js, &out).await
                } else {
                    Err("this scheduler no longer holds the leader lease".to_string())
                };
                match published {
                    Ok(ack) => pending.push(Box::pin(async move {
                        Some(match ack.await {
                            Ok(ack) => Event::DispatchStored {
                                id,
                                attempt,
                                seq: ack.sequence,
                            },
                            Err(e) => failed(id, attempt, e.to_string()),
                        })
                    })),
                    Err(error) => {
                        let event = failed(id, attempt, error);
                        if events.send(Input::Engine(event)).await.is_err() {
                            break;
                        }
                    }
                }
            }
        }
    }
    // Whatever is still waiting for a PubAck is reported, so no booking is left assumed.
    while let Some(done) = pending.next().await {
        let Some(done) = done else { continue };
        if events.send(Input::Engine(done)).await.is_err() {
            break;
        }
    }
}

/// Sends a re-size of a running exec, once; the worker reads it in the order it was sent
/// among the dispatches (same consumer). A lost one leaves the exec at its old size until it
/// ends.
async fn send_regrant(
    js: &jetstream::Context,
    worker: &WorkerId,
    r: &tangram_shared::Regrant,
) -> Option<jetstream::context::PublishAckFuture> {
    let payload = match codec::encode(r, Encoding::Msgpack) {
        Ok(p) => p,
        Err(e) => {
            warn!(action = %r.id, error = %e, "encoding a re-size");
            return None;
        }
    };
    let headers = msgpack_headers(&format!(
        "{}:{}:{}:regrant:{}",
        r.id, r.epoch, worker, r.seq
    ));
    match js
        .publish_with_headers(subject::regrant(worker, &r.id), headers, payload.into())
        .await
    {
        Ok(ack) => Some(ack),
        Err(e) => {
            warn!(action = %r.id, error = %e, "publishing a re-size");
            None
        }
    }
}

fn failed(id: ActionId, attempt: u32, error: String) -> Event {
    warn!(action = %id, attempt, %error, "dispatch not stored; it goes back to the queue");
    Event::DispatchFailed { id, attempt, error }
}

async fn publish(
    js: &jetstream::Context,
    out: &Outgoing,
) -> Result<jetstream::context::PublishAckFuture, String> {
    let payload = codec::encode(&*out.dispatch, Encoding::Msgpack)
        .map_err(|e| format!("encoding the dispatch: {e}"))?;
    let headers = msgpack_headers(&tangram_core::engine::dispatch_msg_id(
        &out.worker,
        &out.dispatch,
    ));
    js.publish_with_headers(
        subject::dispatch(&out.worker, &out.dispatch.action.id),
        headers,
        payload.into(),
    )
    .await
    .map_err(|e| e.to_string())
}

/// Headers of a msgpack message on the dispatch stream with its `Nats-Msg-Id`.
fn msgpack_headers(msg_id: &str) -> HeaderMap {
    let mut headers = HeaderMap::new();
    headers.insert(subject::HEADER_MSG_ID, msg_id);
    headers.insert(
        subject::HEADER_CONTENT_TYPE,
        Encoding::Msgpack.content_type(),
    );
    headers
}
