//! Where dispatches come from and where results go: the NATS side of the action path,
//! behind two small traits so the path can be driven without a server.

use async_nats::jetstream;
use futures::future::BoxFuture;
use tangram_shared::codec::Encoding;
use tangram_shared::{ActionResult, WorkerId};

/// A failure to ack; logged, never fatal (the dispatch comes back and is recognised).
pub(crate) type AckError = Box<dyn std::error::Error + Send + Sync>;

/// One dispatch as delivered, with the acks the action path owes it.
pub(crate) trait Delivery: Send + Sync {
    /// The encoded dispatch.
    fn payload(&self) -> &[u8];
    /// Its subject: a dispatch's, or a re-size's (`….regrant`).
    fn subject(&self) -> &str;
    /// True when it was delivered before (to this or an earlier instance of the worker).
    fn redelivered(&self) -> bool;
    /// Its sequence in the dispatch stream (0 when unknown).
    fn stream_seq(&self) -> u64;
    /// Settles it, and waits until the server confirms: it will not come again (the
    /// dispatch stream is a work queue: a confirmed ack removes the message).
    fn ack(&self) -> BoxFuture<'_, Result<(), AckError>>;
    /// Still working on it: pushes the redelivery deadline back.
    fn progress(&self) -> BoxFuture<'_, Result<(), AckError>>;
}

impl Delivery for jetstream::Message {
    fn payload(&self) -> &[u8] {
        &self.payload
    }
    fn subject(&self) -> &str {
        self.subject.as_str()
    }
    fn redelivered(&self) -> bool {
        self.info().map(|i| i.delivered > 1).unwrap_or(false)
    }
    fn stream_seq(&self) -> u64 {
        self.info().map(|i| i.stream_sequence).unwrap_or(0)
    }
    fn ack(&self) -> BoxFuture<'_, Result<(), AckError>> {
        Box::pin(jetstream::Message::double_ack(self))
    }
    fn progress(&self) -> BoxFuture<'_, Result<(), AckError>> {
        Box::pin(self.ack_with(jetstream::AckKind::Progress))
    }
}

/// A dispatch the worker will not run, for the record an operator reads.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Refusal<'a> {
    /// `stale_epoch` or `unknown_epoch`.
    pub(crate) reason: &'static str,
    /// Why, for a person.
    pub(crate) detail: &'a str,
    /// The dispatch as delivered.
    pub(crate) payload: &'a [u8],
    /// Its action.
    pub(crate) action: &'a str,
    /// This worker.
    pub(crate) worker: &'a str,
}

/// Where results go, and what the worker reads of the scheduler.
pub(crate) trait ResultSink: Send + Sync {
    /// Stores a result durably (retrying, bounded) or says why it could not.
    fn publish<'a>(
        &'a self,
        result: &'a ActionResult,
        encoding: Encoding,
    ) -> BoxFuture<'a, Result<(), tangram_nats::PublishError>>;

    /// The scheduler epoch as stored by the leaders (the only authority on which epochs
    /// exist); `None` when it cannot be read.
    fn stored_epoch(&self) -> BoxFuture<'_, Option<u64>>;

    /// The instance of `worker` that the leaders fenced (declared lost), if any; `None` too
    /// when it cannot be read (it is read again soon).
    fn fence_record<'a>(&'a self, worker: &'a WorkerId) -> BoxFuture<'a, Option<String>>;

    /// An operator's cordon of `worker`, if any; `None` too when it cannot be read.
    fn cordon_record<'a>(
        &'a self,
        worker: &'a WorkerId,
    ) -> BoxFuture<'a, Option<tangram_shared::status::CordonRecord>>;

    /// Records a refused dispatch in the dead-letter stream (best effort).
    fn refuse<'a>(&'a self, refusal: Refusal<'a>) -> BoxFuture<'a, ()>;
}

/// Results on their JetStream subjects, and the scheduler's KV records the worker reads.
pub(crate) struct JetStreamResults {
    js: jetstream::Context,
    /// The scheduler's bucket, looked up once: a lookup is a JetStream API request (stream
    /// info), and the fence watch reads two keys a second. Made per read, 500 workers sent the
    /// server's API queue a thousand requests a second whatever the action rate, and under
    /// load it filled (the leader's own consumer calls then timed out and its term failed).
    store: tokio::sync::OnceCell<jetstream::kv::Store>,
}

impl JetStreamResults {
    pub(crate) fn new(js: jetstream::Context) -> Self {
        Self {
            js,
            store: tokio::sync::OnceCell::new(),
        }
    }

    /// The scheduler's bucket; `None` while it cannot be looked up (asked again next time).
    async fn store(&self) -> Option<&jetstream::kv::Store> {
        self.store
            .get_or_try_init(|| {
                self.js
                    .get_key_value(tangram_shared::subject::SCHEDULER_BUCKET)
            })
            .await
            .ok()
    }

    /// A key of the scheduler's bucket, read within 5 s; `None` when absent or unreadable.
    async fn bucket_value(&self, key: String) -> Option<Vec<u8>> {
        let read = async {
            let entry = self.store().await?.entry(key).await.ok()??;
            Some(entry.value.to_vec())
        };
        tokio::time::timeout(std::time::Duration::from_secs(5), read)
            .await
            .ok()
            .flatten()
    }
}

impl ResultSink for JetStreamResults {
    fn cordon_record<'a>(
        &'a self,
        worker: &'a WorkerId,
    ) -> BoxFuture<'a, Option<tangram_shared::status::CordonRecord>> {
        Box::pin(async move {
            let v = self
                .bucket_value(tangram_shared::subject::cordon_key(worker))
                .await?;
            // One that does not decode still cordons (no drain), as the scheduler reads it.
            Some(serde_json::from_slice(&v).unwrap_or_default())
        })
    }

    fn fence_record<'a>(&'a self, worker: &'a WorkerId) -> BoxFuture<'a, Option<String>> {
        Box::pin(async move {
            let v = self
                .bucket_value(tangram_shared::subject::fence_key(worker))
                .await?;
            let v = String::from_utf8_lossy(&v).trim().to_string();
            (!v.is_empty()).then_some(v)
        })
    }

    fn stored_epoch(&self) -> BoxFuture<'_, Option<u64>> {
        Box::pin(async move {
            let v = self
                .bucket_value(tangram_shared::subject::EPOCH_KEY.to_string())
                .await?;
            String::from_utf8_lossy(&v).trim().parse().ok()
        })
    }

    fn refuse<'a>(&'a self, r: Refusal<'a>) -> BoxFuture<'a, ()> {
        use tangram_shared::subject;
        Box::pin(async move {
            let mut headers = async_nats::HeaderMap::new();
            headers.insert(subject::HEADER_DLQ_CODE, r.reason);
            headers.insert(subject::HEADER_DLQ_REASON, r.detail);
            headers.insert(subject::HEADER_DLQ_WORKER, r.worker);
            headers.insert(subject::HEADER_DLQ_ACTION, r.action);
            headers.insert(
                subject::HEADER_CONTENT_TYPE,
                Encoding::Msgpack.content_type(),
            );
            let sent = self
                .js
                .publish_with_headers(
                    subject::deadletter_refused(r.reason),
                    headers,
                    r.payload.to_vec().into(),
                )
                .await;
            match sent {
                Ok(ack) => {
                    if let Err(e) = ack.await {
                        tracing::warn!(error = %e, "refusal record not stored");
                    }
                }
                Err(e) => tracing::warn!(error = %e, "refusal record not sent"),
            }
        })
    }

    fn publish<'a>(
        &'a self,
        result: &'a ActionResult,
        encoding: Encoding,
    ) -> BoxFuture<'a, Result<(), tangram_nats::PublishError>> {
        // About 25 s of retries in all (each attempt also waits for its acknowledgement):
        // results must not be lost to an outage or a cluster electing a stream leader.
        Box::pin(tangram_nats::publish_result(&self.js, result, encoding, 9))
    }
}
