//! The state task's way out: every message it sends to NATS and every lookup it starts,
//! behind one trait ([`Outbox`]). [`Jetstream`] carries them out on the server; the shell's
//! tests use the in-memory [`fake::Fake`], which records what was asked in order and answers
//! as a test tells it. What the shell decides (in which order a rejection is stored, acked or
//! handed back, when a result stops being tried, how long a fence record is retried) is in the
//! shell and its effects, and tested through this seam.

#[cfg(test)]
pub(crate) mod fake;

use crate::held::Incoming;
use async_nats::jetstream::{self, AckKind};
use async_nats::HeaderMap;
use bytes::Bytes;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;
use tangram_shared::codec::Encoding;
use tangram_shared::{subject, ActionId, ActionResult, Dispatch, RejectCode, WorkerId};

/// A future the state task can hand to a tracked task.
pub(crate) type Boxed<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// An answer to an action message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Answer {
    /// Done with it: the server removes it.
    Ack,
    /// Handed back: the server delivers it again at once.
    Nak,
    /// Still working on it: the ack wait starts again.
    Progress,
}

/// Why a result was not stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum NotStored {
    /// It can never be (it does not encode): trying again cannot help.
    Never(String),
    /// The server did not take it this time (after the implementation's own retries).
    NotNow(String),
}

/// A rejected action message as an operator finds it in the dead-letter stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DeadLetter {
    /// Why it was rejected.
    pub(crate) code: RejectCode,
    /// The reason, on one line.
    pub(crate) reason: String,
    /// The subject it was submitted on.
    pub(crate) subject: String,
    /// Its action id, when it had a readable one (at most 256 characters).
    pub(crate) action: Option<String>,
    /// Its encoding's content type.
    pub(crate) content_type: &'static str,
    /// Its payload, cut to [`DEADLETTER_PAYLOAD_CAP`].
    pub(crate) payload: Bytes,
}

/// Dead-letter records keep at most this much of the original payload.
pub(crate) const DEADLETTER_PAYLOAD_CAP: usize = 64 * 1024;

/// Everything the state task does to NATS, besides its channels.
pub(crate) trait Outbox: Send + Sync + 'static {
    /// Answers an action message (nothing to do for one taken back, which is answered when
    /// it is delivered).
    fn answer<'a>(&'a self, msg: &'a Incoming, answer: Answer) -> Boxed<'a, Result<(), String>>;
    /// Stores a dead-letter record.
    fn dead_letter(&self, record: DeadLetter) -> Boxed<'_, Result<(), String>>;
    /// Stores a result (retrying a few times itself).
    fn store_result<'a>(
        &'a self,
        result: &'a ActionResult,
        encoding: Encoding,
    ) -> Boxed<'a, Result<(), NotStored>>;
    /// Removes the stored dispatches of an action whose result is stored.
    fn forget_dispatches<'a>(&'a self, id: &'a ActionId) -> Boxed<'a, ()>;
    /// The dispatch of `id` to `worker` as stored, if any (`None` also when the server could
    /// not say: the heartbeat that asked lists the action again).
    fn dispatch_to<'a>(
        &'a self,
        worker: &'a WorkerId,
        id: &'a ActionId,
    ) -> Boxed<'a, Option<Dispatch>>;
    /// Publishes an action of the scheduler's own on its job's action subject, its id as
    /// the message id (the stream drops a second copy within its duplicate window).
    fn submit<'a>(&'a self, action: &'a tangram_shared::Action) -> Boxed<'a, Result<(), String>>;
    /// Records that `instance` of `worker` was declared lost (`fence.<worker>`).
    fn put_fence<'a>(
        &'a self,
        worker: &'a WorkerId,
        instance: &'a str,
    ) -> Boxed<'a, Result<(), String>>;
}

/// The outbox on a JetStream server.
#[derive(Clone)]
pub(crate) struct Jetstream {
    pub(crate) js: jetstream::Context,
    /// `TANGRAM_DISPATCH`.
    pub(crate) dispatches: jetstream::stream::Stream,
}

impl Outbox for Jetstream {
    fn answer<'a>(&'a self, msg: &'a Incoming, answer: Answer) -> Boxed<'a, Result<(), String>> {
        let kind = match answer {
            Answer::Ack => AckKind::Ack,
            Answer::Nak => AckKind::Nak(None),
            Answer::Progress => AckKind::Progress,
        };
        Box::pin(async move { msg.reply(kind).await.map_err(|e| e.to_string()) })
    }

    fn dead_letter(&self, r: DeadLetter) -> Boxed<'_, Result<(), String>> {
        Box::pin(async move {
            let mut headers = HeaderMap::new();
            headers.insert(subject::HEADER_DLQ_CODE, r.code.as_str());
            headers.insert(subject::HEADER_DLQ_REASON, r.reason.as_str());
            headers.insert(subject::HEADER_DLQ_SUBJECT, r.subject.as_str());
            if let Some(id) = &r.action {
                headers.insert(subject::HEADER_DLQ_ACTION, id.as_str());
            }
            headers.insert(subject::HEADER_CONTENT_TYPE, r.content_type);
            let ack = self
                .js
                .publish_with_headers(subject::deadletter(r.code), headers, r.payload)
                .await
                .map_err(|e| format!("dead-letter publish failed: {e}"))?;
            ack.await
                .map(|_| ())
                .map_err(|e| format!("dead-letter publish not acknowledged: {e}"))
        })
    }

    fn store_result<'a>(
        &'a self,
        result: &'a ActionResult,
        encoding: Encoding,
    ) -> Boxed<'a, Result<(), NotStored>> {
        Box::pin(async move {
            match tangram_nats::publish_result(&self.js, result, encoding, RESULT_ATTEMPTS).await {
                Ok(()) => Ok(()),
                Err(e @ tangram_nats::PublishError::Encode(_)) => {
                    Err(NotStored::Never(e.to_string()))
                }
                Err(e) => Err(NotStored::NotNow(e.to_string())),
            }
        })
    }

    fn forget_dispatches<'a>(&'a self, id: &'a ActionId) -> Boxed<'a, ()> {
        Box::pin(crate::adopt::forget_dispatches(&self.dispatches, id))
    }

    fn dispatch_to<'a>(
        &'a self,
        worker: &'a WorkerId,
        id: &'a ActionId,
    ) -> Boxed<'a, Option<Dispatch>> {
        Box::pin(crate::adopt::dispatch_to(&self.dispatches, worker, id))
    }

    fn submit<'a>(&'a self, action: &'a tangram_shared::Action) -> Boxed<'a, Result<(), String>> {
        Box::pin(async move {
            let payload = tangram_shared::codec::encode(action, Encoding::Json)
                .map_err(|e| format!("encoding: {e}"))?;
            let mut headers = HeaderMap::new();
            headers.insert(subject::HEADER_MSG_ID, action.id.as_str());
            headers.insert(subject::HEADER_CONTENT_TYPE, Encoding::Json.content_type());
            let to = subject::action(&action.job, action.kind());
            let ack = self
                .js
                .publish_with_headers(to, headers, payload.into())
                .await
                .map_err(|e| format!("publish failed: {e}"))?;
            ack.await
                .map(|_| ())
                .map_err(|e| format!("publish not acknowledged: {e}"))
        })
    }

    fn put_fence<'a>(
        &'a self,
        worker: &'a WorkerId,
        instance: &'a str,
    ) -> Boxed<'a, Result<(), String>> {
        Box::pin(async move {
            let key = subject::fence_key(worker);
            let put = async {
                let store = self
                    .js
                    .get_key_value(subject::SCHEDULER_BUCKET)
                    .await
                    .map_err(|e| e.to_string())?;
                store
                    .put(&key, instance.to_string().into())
                    .await
                    .map(|_| ())
                    .map_err(|e| e.to_string())
            };
            match tokio::time::timeout(Duration::from_secs(5), put).await {
                Ok(r) => r,
                Err(_) => Err("timed out".into()),
            }
        })
    }
}

/// Attempts at storing a result or rejection the engine publishes (backoff doubling from
/// 100 ms, capped: about 30 s in all); the result's `Nats-Msg-Id` makes repeats harmless.
pub(crate) const RESULT_ATTEMPTS: u32 = 10;
