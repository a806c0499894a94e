//! The effects of the engine that leave the process, carried out for the state task
//! ([`crate::shell`]): acks in order, rejections with their dead letters, fence records for
//! workers declared lost, and observations into the metrics.

use crate::held::Incoming;
use crate::lease::Fence;
use crate::metrics as m;
use crate::outbox::{Answer, DeadLetter, NotStored, Outbox, DEADLETTER_PAYLOAD_CAP};
use std::sync::Arc;
use std::time::Duration;
use tangram_core::engine::{Observation, Reject};
use tangram_shared::codec::Encoding;
use tangram_shared::ActionResult;
use tokio::sync::mpsc;
use tracing::{info, warn};

/// Ack-type replies to action messages, sent in order by one task.
#[derive(Debug)]
pub(crate) struct Reply(pub(crate) Box<Incoming>, pub(crate) Answer);

/// Records that `instance` of `worker` was declared lost, where the worker looks
/// (`fence.<worker>` in the scheduler's bucket). Retried for about 30 s while this
/// scheduler leads: a worker that never reads it keeps being ignored by this leader, and a
/// dispatch addressed to the instance is refused by it once it does.
pub(crate) async fn write_fence(
    outbox: Arc<dyn Outbox>,
    fence: Arc<Fence>,
    worker: tangram_shared::WorkerId,
    instance: String,
) {
    for attempt in 0..FENCE_ATTEMPTS {
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
        match outbox.put_fence(&worker, &instance).await {
            Ok(()) => {
                info!(%worker, %instance, "worker instance fenced");
                m::worker_fenced();
                return;
            }
            Err(e) => warn!(%worker, attempt, error = %e, "writing the fence record"),
        }
    }
    warn!(%worker, %instance, "fence record not written; the instance is ignored by this leader only");
}

/// Tries at writing a fence record.
pub(crate) const FENCE_ATTEMPTS: u32 = 10;

/// Sends acks in the order the engine decided them; each is one publish, no round trip.
pub(crate) async fn replier(mut rx: mpsc::UnboundedReceiver<Reply>, outbox: Arc<dyn Outbox>) {
    while let Some(Reply(msg, answer)) = rx.recv().await {
        let sent = tokio::time::timeout(Duration::from_secs(1), outbox.answer(&msg, answer)).await;
        if !matches!(sent, Ok(Ok(()))) {
            warn!(subject = %msg.subject(), "ack not sent; the action may be redelivered (and deduplicated)");
        }
    }
}

/// Stores a result the engine publishes on a worker's behalf, for as long as this scheduler
/// leads: the action's dispatch stays in the backlog until the result is stored, so the next
/// leader settles it if this one cannot. Once stored, the dispatch leaves the backlog.
pub(crate) async fn publish_for_worker(
    outbox: Arc<dyn Outbox>,
    fence: Arc<Fence>,
    result: ActionResult,
    encoding: Encoding,
) {
    loop {
        if !fence.holds() {
            warn!(action = %result.id, "not the leader any more; result left to the next one (its dispatch is in the backlog)");
            return;
        }
        match outbox.store_result(&result, encoding).await {
            Ok(()) => break,
            Err(NotStored::Never(e)) => {
                warn!(action = %result.id, error = %e, "result not stored");
                return;
            }
            Err(NotStored::NotNow(e)) => {
                warn!(action = %result.id, error = %e, "result not stored yet; trying again while this scheduler leads");
            }
        }
    }
    outbox.forget_dispatches(&result.id).await;
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
        Observation::Closing(reason) => m::sandbox_closing(reason.as_str()),
        Observation::DeclarationRefused { kind, name, worker } => {
            warn!(kind, %name, %worker, "a worker's declaration differs from the fleet's definition; refused (the worker gets none of its calls)");
            m::declaration_refused(kind)
        }
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
/// acks the message: whoever sees a rejection can find it in the dead-letter stream. A
/// rejection result that cannot be stored hands the message back (nak), to be rejected
/// again: the submitter would otherwise never hear.
pub(crate) async fn reject(outbox: Arc<dyn Outbox>, msg: Box<Incoming>, r: Box<Reject>) {
    info!(subject = %msg.subject(), code = r.message.rejection.code.as_str(), reason = %r.message.rejection.reason, "action rejected");
    // Header values cannot hold line breaks.
    let reason: String = r
        .message
        .rejection
        .reason
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    let record = DeadLetter {
        code: r.message.rejection.code,
        reason,
        subject: msg.subject().to_string(),
        action: r
            .message
            .id
            .as_ref()
            .map(|id| id.chars().filter(|c| !c.is_control()).take(256).collect()),
        content_type: r.message.encoding.content_type(),
        payload: msg
            .payload()
            .slice(..msg.payload().len().min(DEADLETTER_PAYLOAD_CAP)),
    };
    if let Err(e) = outbox.dead_letter(record).await {
        warn!(error = %e, "dead letter not stored");
    }
    if let Some(result) = &r.result {
        if let Err(e) = outbox.store_result(result, r.message.encoding).await {
            warn!(action = %result.id, error = ?e, "rejection result not stored; the message is handed back");
            let _ = outbox.answer(&msg, Answer::Nak).await;
            return;
        }
    }
    if let Err(e) = outbox.answer(&msg, Answer::Ack).await {
        warn!(subject = %msg.subject(), error = %e, "ack failed; the action may be redelivered (and deduplicated)");
    }
}
