//! Storing a result: `publish_result` (sized to the server's limit, stored at most once per
//! action whatever retries or settlements race it) and the reading of JetStream's publish
//! errors.

use crate::backoff;
use async_nats::jetstream;
use std::time::Duration;
use tangram_shared::codec::{self, Encoding};
use tangram_shared::{subject, ActionResult};

/// JetStream's optimistic-concurrency header: the subject's last sequence must be this (0:
/// the subject holds no message).
const HEADER_EXPECTED_LAST_SUBJECT_SEQ: &str = "Nats-Expected-Last-Subject-Sequence";

/// JetStream's "wrong last sequence" error: the subject holds a message already.
const WRONG_LAST_SEQUENCE: u64 = 10071;

/// Whether a publish was refused because its subject holds a message already (it was sent
/// with `Nats-Expected-Last-Subject-Sequence: 0`).
pub fn result_exists(e: &jetstream::context::PublishError) -> bool {
    use std::error::Error as _;
    e.kind() == jetstream::context::PublishErrorKind::WrongLastSequence
        || e.source()
            .and_then(|s| s.downcast_ref::<jetstream::Error>())
            .is_some_and(|j| j.error_code() == jetstream::ErrorCode(WRONG_LAST_SEQUENCE))
}

/// Whether a publish was refused because its stream is full: the streams that hold
/// unprocessed work discard new messages rather than old ones, so a full stream turns
/// publishers away (JetStream error 10077) instead of deleting what is not yet processed.
pub fn stream_full(e: &jetstream::context::PublishError) -> bool {
    use std::error::Error as _;
    e.source()
        .and_then(|s| s.downcast_ref::<jetstream::Error>())
        .is_some_and(|j| j.error_code() == jetstream::ErrorCode::STREAM_STORE_FAILED)
}

/// Whether a publish that failed may be stored by trying again with the same message id
/// (JetStream drops the copy if the first try was stored after all): no answer in time, a
/// connection that broke, too many acks pending, or no responder for the subject, which is
/// what a stream electing a leader, or one not yet created, answers. A full stream is not
/// transient in this sense: trying again at once does not help.
pub fn publish_is_transient(e: &jetstream::context::PublishError) -> bool {
    use jetstream::context::PublishErrorKind as K;
    !stream_full(e)
        && matches!(
            e.kind(),
            K::StreamNotFound | K::TimedOut | K::BrokenPipe | K::MaxAckPending
        )
}

/// A result could not be stored. The message names the cause too, because callers log the
/// error's Display alone.
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    /// The result does not encode (a bug; it is not retried).
    #[error("encoding the result: {0}")]
    Encode(#[source] codec::CodecError),
    /// The server did not take the message, on every attempt; the last error.
    #[error("result publish failed after {attempts} attempt(s): {source}")]
    Publish {
        /// Attempts made.
        attempts: u32,
        /// The last failure.
        #[source]
        source: jetstream::context::PublishError,
    },
}

/// Output above which a result is encoded on a blocking thread.
const LARGE_RESULT_BYTES: usize = 256 * 1024;

/// The result encoded, its texts cut (prefixes kept, `truncated` set) when it would not fit
/// in `max` bytes.
fn encode_to_fit(
    result: &ActionResult,
    encoding: Encoding,
    max: usize,
) -> Result<Vec<u8>, PublishError> {
    let payload = codec::encode(result, encoding).map_err(PublishError::Encode)?;
    if payload.len() + tangram_shared::fit::HEADROOM <= max {
        return Ok(payload);
    }
    let mut fitted = result.clone();
    tangram_shared::fit::fit(&mut fitted, encoding, max).map_err(PublishError::Encode)?;
    tracing::warn!(action = %result.id, bytes = payload.len(), max_payload = max,
        "result cut to fit the server's max_payload");
    codec::encode(&fitted, encoding).map_err(PublishError::Encode)
}

/// Publishes an action's result on its subject (`Nats-Msg-Id` = action id, so a repeat inside
/// the duplicate window is dropped) and waits for JetStream to store it. Retries `attempts`
/// times with doubling backoff from 100 ms; the last error is returned.
pub async fn publish_result(
    js: &jetstream::Context,
    result: &ActionResult,
    encoding: Encoding,
    attempts: u32,
) -> Result<(), PublishError> {
    // A result larger than the server takes would never be stored: cut its texts to fit.
    // (Before the first connection the server's limit is unknown: NATS's default, 1 MiB.)
    let max = match js.client().server_info().max_payload {
        0 => 1 << 20,
        m => m,
    };
    // Encoding (and cutting) megabytes of output is CPU work: off the async threads, so
    // that heartbeats and other actions are not held up by it.
    let large = result.stdout.len() + result.stderr.len() > LARGE_RESULT_BYTES;
    let payload = if large {
        let owned = result.clone();
        tokio::task::spawn_blocking(move || encode_to_fit(&owned, encoding, max))
            .await
            .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()))?
    } else {
        encode_to_fit(result, encoding, max)?
    };
    let mut headers = async_nats::HeaderMap::new();
    headers.insert(subject::HEADER_MSG_ID, result.id.as_str());
    headers.insert(subject::HEADER_CONTENT_TYPE, encoding.content_type());
    // Stored only while the subject holds no result: a late completion after a settlement
    // (or a settlement after a completion) is refused by the server, whenever it comes,
    // where the duplicate window would have let it through after two minutes.
    headers.insert(HEADER_EXPECTED_LAST_SUBJECT_SEQ, "0");
    let subject = subject::result(&result.job, &result.id);
    let attempts = attempts.max(1);
    let mut attempt = 0;
    loop {
        if attempt > 0 {
            // 200 ms, doubling, at most 6.4 s, spread.
            let wait = backoff::backoff(
                attempt,
                Duration::from_millis(200),
                Duration::from_millis(6400),
            );
            tokio::time::sleep(wait).await;
        }
        attempt += 1;
        // Both the send and the store acknowledgement fail with the same error type.
        let stored = match js
            .publish_with_headers(subject.clone(), headers.clone(), payload.clone().into())
            .await
        {
            Ok(ack) => ack.await.map(drop),
            Err(e) => Err(e),
        };
        match stored {
            Ok(()) => return Ok(()),
            // A result is stored under this subject already: this one's earlier try, or
            // another result (a settlement that came first). Either way the action has its
            // one result, and this one must not be a second.
            Err(e) if result_exists(&e) => {
                tracing::info!(action = %result.id, "a result is stored for this action already; this one is not stored");
                return Ok(());
            }
            Err(source) if attempt >= attempts => {
                return Err(PublishError::Publish { attempts, source })
            }
            Err(e) => {
                tracing::warn!(action = %result.id, attempt, error = %e, "publishing a result")
            }
        }
    }
}
