//! What a term reads besides its feeds, for the status answer and the metrics: the actions
//! stream's backlog, the dead letters, and the leader lease with the live standbys.

use crate::channels::Input;
use crate::gate::Gate;
use crate::lease;
use async_nats::jetstream::{self, kv};
use futures::StreamExt;
use std::time::Duration;
use tangram_shared::subject;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::warn;

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

/// Answers one status request: the engine's report from the state task, paged to fit one
/// message, with the lease, the standbys and the backlog read here. False when the state
/// task is gone.
pub(crate) async fn answer_status(
    msg: async_nats::Message,
    tx: &mpsc::Sender<Input>,
    client: &async_nats::Client,
    store: &kv::Store,
    consumer: &jetstream::consumer::PullConsumer,
    gate: &Gate,
) -> bool {
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
        // Rollout roles read only their own job's part (the inbox says whose: a role can
        // read answers under its own inbox prefix only).
        if let Some(job) = subject::rollout_job_of_inbox(&reply) {
            status.scope_to(job);
        }
        tangram_shared::status::page(&mut status, &req, tangram_shared::status::STATUS_PAGE_BYTES);
        fill_lease(&mut status, store).await;
        status.backlog = backlog(consumer, gate).await;
        if let Ok(body) = serde_json::to_vec(&status) {
            let _ = client.publish(reply, body.into()).await;
        }
    }
    true
}

/// Reads the backlog and the dead letters into the metrics every [`BACKLOG_EVERY`] until
/// `stop` (status answers read the backlog afresh).
pub(crate) async fn watch(
    consumer: jetstream::consumer::PullConsumer,
    gate: std::sync::Arc<Gate>,
    js: jetstream::Context,
    stop: CancellationToken,
) {
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
}
