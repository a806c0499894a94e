//! The dispatcher: publishes the engine's dispatches and awaits their PubAcks concurrently,
//! reporting each as stored or failed. The engine books capacity when it hands a dispatch
//! out (assume on send) and gives it back on failure (forget on failure), so nothing here
//! waits on the state task and no state task waits on a PubAck.

use crate::shell::Input;
use async_nats::jetstream;
use async_nats::HeaderMap;
use futures::stream::FuturesUnordered;
use futures::StreamExt;
use tangram_core::Event;
use tangram_shared::codec::{self, Encoding};
use tangram_shared::{subject, ActionId, Dispatch, WorkerId};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::warn;

/// Dispatches whose PubAck has not come back, at most: past this the dispatcher stops
/// taking new ones until some are acknowledged (the engine's queue holds the rest).
const IN_FLIGHT: usize = 4096;

/// One dispatch to publish.
#[derive(Debug)]
pub(crate) struct Outgoing {
    pub(crate) worker: WorkerId,
    pub(crate) dispatch: Box<Dispatch>,
}

/// Runs until `rx` closes or `stop` is cancelled; outcomes go to `events`.
pub(crate) async fn run(
    js: jetstream::Context,
    mut rx: mpsc::UnboundedReceiver<Outgoing>,
    events: mpsc::Sender<Input>,
    stop: CancellationToken,
) {
    let mut pending = FuturesUnordered::new();
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            Some(done) = pending.next(), if !pending.is_empty() => {
                if events.send(Input::Engine(done)).await.is_err() {
                    break;
                }
            }
            out = rx.recv(), if pending.len() < IN_FLIGHT => {
                let Some(out) = out else { break };
                let (id, attempt) = (out.dispatch.action.id.clone(), out.dispatch.attempt);
                match publish(&js, &out).await {
                    Ok(ack) => pending.push(async move {
                        match ack.await {
                            Ok(_) => Event::DispatchStored { id, attempt },
                            Err(e) => failed(id, attempt, e.to_string()),
                        }
                    }),
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
        if events.send(Input::Engine(done)).await.is_err() {
            break;
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
    let mut headers = HeaderMap::new();
    // The same for every attempt of one scheduler epoch: when a store went through but its
    // acknowledgement was lost, the retry (to the same worker) is dropped by JetStream's
    // duplicate window instead of running the action twice.
    headers.insert(
        subject::HEADER_MSG_ID,
        format!("{}:{}", out.dispatch.action.id, out.dispatch.epoch).as_str(),
    );
    headers.insert(
        subject::HEADER_CONTENT_TYPE,
        Encoding::Msgpack.content_type(),
    );
    js.publish_with_headers(subject::dispatch(&out.worker), headers, payload.into())
        .await
        .map_err(|e| e.to_string())
}
