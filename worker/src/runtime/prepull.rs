//! Pre-pulls: a worker answers `tangram.v1.prepull.<worker>` requests by making the image
//! present, under the same allow-list, credentials, single-flight pulls and disk budget as a
//! sandbox open's pull, so that the opens of a coming step find it.

use super::Worker;
use crate::sandbox::SandboxError;
use futures::StreamExt as _;
use std::sync::Arc;
use tangram_shared::image::{PrepullOutcome, PrepullReply, PrepullRequest};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// Pre-pulls running at once on one worker, beyond which requests wait their turn.
const MAX_AT_ONCE: usize = 4;
/// Requests held at once (running and waiting); more are answered `failed` at once.
const MAX_HELD: usize = 64;

/// Answers pre-pull requests until `stop`.
pub(super) async fn serve(
    worker: Arc<Worker>,
    client: async_nats::Client,
    stop: CancellationToken,
) {
    let subject = tangram_shared::subject::prepull(&worker.config.id);
    let mut sub = match client.subscribe(subject.clone()).await {
        Ok(s) => s,
        Err(e) => {
            warn!(%subject, error = %e, "cannot take pre-pull requests");
            return;
        }
    };
    let limit = Arc::new(tokio::sync::Semaphore::new(MAX_AT_ONCE));
    let held = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    loop {
        let msg = tokio::select! {
            _ = stop.cancelled() => break,
            m = sub.next() => match m { Some(m) => m, None => break },
        };
        let Some(reply_to) = msg.reply.clone() else {
            continue;
        };
        if !tangram_shared::subject::is_reply_inbox(&reply_to) {
            warn!(reply = %reply_to, "a pre-pull asked for its answer outside an inbox; not answered");
            continue;
        }
        use std::sync::atomic::Ordering;
        if held.fetch_add(1, Ordering::SeqCst) >= MAX_HELD {
            held.fetch_sub(1, Ordering::SeqCst);
            let busy = PrepullReply::not_done(
                worker.config.id.to_string(),
                "",
                PrepullOutcome::Failed,
                format!("{MAX_HELD} pre-pulls are waiting here already; ask again later"),
            );
            let body = serde_json::to_vec(&busy).unwrap_or_default();
            let _ = client.publish(reply_to, body.into()).await;
            continue;
        }
        let (worker, client, limit, held) =
            (worker.clone(), client.clone(), limit.clone(), held.clone());
        tokio::spawn(async move {
            let permit = limit.acquire_owned().await;
            let reply = answer(&worker, &msg.payload).await;
            drop(permit);
            held.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
            let body = serde_json::to_vec(&reply).unwrap_or_default();
            if let Err(e) = client.publish(reply_to, body.into()).await {
                warn!(error = %e, "answering a pre-pull");
            }
        });
    }
}

/// One request's answer.
pub(crate) async fn answer(worker: &Worker, payload: &[u8]) -> PrepullReply {
    let mut reply = PrepullReply {
        worker: worker.config.id.to_string(),
        image: String::new(),
        outcome: PrepullOutcome::Refused,
        pull_ms: None,
        error: None,
    };
    let request: PrepullRequest = match serde_json::from_slice(payload) {
        Ok(r) => r,
        Err(e) => {
            reply.error = Some(format!(
                "a pre-pull request is JSON {{\"image\": \"...\"}}: {e}"
            ));
            return reply;
        }
    };
    reply.image = request.image.clone();
    if let Err(why) = tangram_shared::image::ImageRef::parse(&request.image) {
        reply.error = Some(why);
        return reply;
    }
    let Some(sandboxes) = worker.sandboxes.as_ref() else {
        reply.error = Some("this worker runs no sandboxes".into());
        return reply;
    };
    match sandboxes.prepull(&request.image).await {
        Ok(None) => reply.outcome = PrepullOutcome::Present,
        Ok(Some(us)) => {
            reply.outcome = PrepullOutcome::Pulled;
            reply.pull_ms = Some(us / 1_000);
            info!(image = %request.image, pull_ms = us / 1_000, "pre-pulled");
        }
        Err(e) => {
            reply.outcome = match e {
                SandboxError::ImageRefused(_) | SandboxError::NoImage(_) => PrepullOutcome::Refused,
                _ => PrepullOutcome::Failed,
            };
            reply.error = Some(e.to_string());
        }
    }
    reply
}
