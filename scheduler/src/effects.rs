//! The effects of the engine that leave the process, carried out for the state task
//! ([`crate::shell`]): acks in order, rejections with their dead letters, fence records for
//! workers declared lost, and observations into the metrics.

use crate::held::Incoming;
use crate::lease::Fence;
use crate::metrics as m;
use async_nats::jetstream::{self, AckKind};
use async_nats::HeaderMap;
use std::sync::Arc;
use std::time::Duration;
use tangram_core::engine::{Observation, Reject};
use tangram_shared::codec::Encoding;
use tangram_shared::{subject, ActionResult};
use tokio::sync::mpsc;
use tracing::{info, warn};

/// Attempts at storing a result or rejection the engine publishes (backoff doubling from
/// 100 ms, capped: about 30 s in all); the result's `Nats-Msg-Id` makes repeats harmless.
pub(crate) const RESULT_ATTEMPTS: u32 = 10;
/// Dead-letter records keep at most this much of the original payload.
const DEADLETTER_PAYLOAD_CAP: usize = 64 * 1024;

/// Ack-type replies to action messages, sent in order by one task.
#[derive(Debug)]
pub(crate) enum Reply {
    Ack(Box<Incoming>),
    Nak(Box<Incoming>),
    Progress(Box<jetstream::Message>),
}

/// Records that `instance` of `worker` was declared lost, where the worker looks
/// (`fence.<worker>` in the scheduler's bucket). Retried for about 30 s while this
/// scheduler leads: a worker that never reads it keeps being ignored by this leader, and a
/// dispatch addressed to the instance is refused by it once it does.
pub(crate) async fn write_fence(
    js: jetstream::Context,
    fence: Arc<Fence>,
    worker: tangram_shared::WorkerId,
    instance: String,
) {
    let key = tangram_shared::subject::fence_key(&worker);
    for attempt in 0..10u32 {
        if attempt > 0 {
            // 500 ms, doubling, at most 4 s, spread.
            let wait = tangram_nats::backoff::backoff(
                attempt,
                Duration::from_millis(500),
                Duration::from_secs(4),
            );
            tokio::time::sleep(wait).await;
        }
        if !fence.holds() {
            warn!(%worker, "not the leader any more; fence record left to the next one");
            return;
        }
        let put = async {
            let store = js
                .get_key_value(tangram_shared::subject::SCHEDULER_BUCKET)
                .await
                .map_err(|e| e.to_string())?;
            store
                .put(&key, instance.clone().into())
                .await
                .map_err(|e| e.to_string())
        };
        match tokio::time::timeout(Duration::from_secs(5), put).await {
            Ok(Ok(_)) => {
                info!(%worker, %instance, "worker instance fenced");
                m::worker_fenced();
                return;
            }
            Ok(Err(e)) => warn!(%worker, attempt, error = %e, "writing the fence record"),
            Err(_) => warn!(%worker, attempt, "writing the fence record timed out"),
        }
    }
    warn!(%worker, %instance, "fence record not written; the instance is ignored by this leader only");
}

/// Sends acks in the order the engine decided them; each is one publish, no round trip.
pub(crate) async fn replier(mut rx: mpsc::UnboundedReceiver<Reply>) {
    while let Some(reply) = rx.recv().await {
        let (msg, kind) = match reply {
            Reply::Ack(m) => (m, AckKind::Ack),
            Reply::Nak(m) => (m, AckKind::Nak(None)),
            Reply::Progress(m) => (Box::new(Incoming::Delivered(*m)), AckKind::Progress),
        };
        let sent = tokio::time::timeout(Duration::from_secs(1), msg.reply(kind)).await;
        if !matches!(sent, Ok(Ok(()))) {
            warn!(subject = %msg.subject(), "ack not sent; the action may be redelivered (and deduplicated)");
        }
    }
}

pub(crate) fn observe(o: Observation) {
    match o {
        Observation::Received(kind) => m::received(kind.map_or("unknown", |k| k.as_str())),
        Observation::Duplicate => m::duplicate(),
        Observation::Rejected(code) => m::rejected(code),
        Observation::Dispatched { kind, queued_s } => m::dispatched(kind.as_str(), queued_s),
        Observation::Result { outcome, code } => m::result(outcome, code),
        Observation::Act { kind, timing } => m::act(kind, timing),
        Observation::Workers(live) => m::workers(&live),
        Observation::Adopted(kind) => {
            info!(
                kind = kind.as_str(),
                "took over an action an earlier leader dispatched"
            );
            m::adopted(kind.as_str())
        }
        Observation::Queues(q) => m::queues(&q),
        Observation::Unreachable { gap_ms } => {
            warn!(
                gap_ms,
                "NATS answered again after a gap; worker graces restarted, nobody declared lost for it"
            );
            m::nats_gap()
        }
        Observation::FencedHeartbeat => m::fenced_heartbeat(),
        Observation::Cordons(n) => m::cordons(n),
        Observation::WorkerLost => {
            warn!("worker lost: no heartbeat within the grace period");
            m::worker_lost()
        }
        Observation::Cycle {
            queued,
            running,
            workers,
        } => m::gauges(queued, running, workers),
        Observation::GpuRoute {
            service,
            restore,
            evictions,
        } => m::gpu_route(&service, restore, evictions),
        Observation::Gpus { total, resident } => m::gpus(total, resident),
        Observation::Provider {
            name,
            rate,
            inflight,
            waiting,
        } => m::provider(&name, rate, inflight, waiting),
        Observation::ApiAdmitted { provider, job } => m::api_admitted(&provider, &job),
    }
}

/// Stores the dead-letter record, then tells the submitter (when it can be addressed), then
/// acks the message: whoever sees a rejection can find it in the dead-letter stream.
pub(crate) async fn reject(js: jetstream::Context, msg: Box<Incoming>, r: Box<Reject>) {
    info!(subject = %msg.subject(), code = r.message.rejection.code.as_str(), reason = %r.message.rejection.reason, "action rejected");
    let mut headers = HeaderMap::new();
    headers.insert(subject::HEADER_DLQ_CODE, r.message.rejection.code.as_str());
    // Header values cannot hold line breaks.
    let reason: String = r
        .message
        .rejection
        .reason
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    headers.insert(subject::HEADER_DLQ_REASON, reason.as_str());
    headers.insert(subject::HEADER_DLQ_SUBJECT, msg.subject());
    if let Some(id) = &r.message.id {
        let id: String = id.chars().filter(|c| !c.is_control()).take(256).collect();
        headers.insert(subject::HEADER_DLQ_ACTION, id.as_str());
    }
    headers.insert(
        subject::HEADER_CONTENT_TYPE,
        r.message.encoding.content_type(),
    );
    let payload = msg
        .payload()
        .slice(..msg.payload().len().min(DEADLETTER_PAYLOAD_CAP));
    match js
        .publish_with_headers(
            subject::deadletter(r.message.rejection.code),
            headers,
            payload,
        )
        .await
    {
        Ok(f) => {
            if let Err(e) = f.await {
                warn!(error = %e, "dead-letter publish not acknowledged");
            }
        }
        Err(e) => warn!(error = %e, "dead-letter publish failed"),
    }
    if let Some(result) = &r.result {
        if !publish_result(&js, result, r.message.encoding).await {
            // The submitter would never hear: hand the message back to be rejected again.
            let _ = msg.reply(AckKind::Nak(None)).await;
            return;
        }
    }
    if let Err(e) = msg.reply(AckKind::Ack).await {
        warn!(subject = %msg.subject(), error = %e, "ack failed; the action may be redelivered (and deduplicated)");
    }
}

/// Stores a result; false when it could not be.
async fn publish_result(
    js: &jetstream::Context,
    result: &ActionResult,
    encoding: Encoding,
) -> bool {
    match tangram_nats::publish_result(js, result, encoding, RESULT_ATTEMPTS).await {
        Ok(()) => true,
        Err(e) => {
            warn!(action = %result.id, error = %e, "result not stored");
            false
        }
    }
}
