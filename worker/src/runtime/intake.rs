//! Where dispatches come from and where results go: the NATS side of the action path,
//! behind two small traits so the path can be driven without a server.

use async_nats::jetstream;
use futures::future::BoxFuture;
use tangram_shared::codec::Encoding;
use tangram_shared::ActionResult;

/// A failure to ack; logged, never fatal (the dispatch comes back and is recognised).
pub(crate) type AckError = Box<dyn std::error::Error + Send + Sync>;

/// One dispatch as delivered, with the acks the action path owes it.
pub(crate) trait Delivery: Send + Sync {
    /// The encoded dispatch.
    fn payload(&self) -> &[u8];
    /// True when it was delivered before (to this or an earlier instance of the worker).
    fn redelivered(&self) -> bool;
    /// Settles it: it will not come again.
    fn ack(&self) -> BoxFuture<'_, Result<(), AckError>>;
    /// Still working on it: pushes the redelivery deadline back.
    fn progress(&self) -> BoxFuture<'_, Result<(), AckError>>;
}

impl Delivery for jetstream::Message {
    fn payload(&self) -> &[u8] {
        &self.payload
    }
    fn redelivered(&self) -> bool {
        self.info().map(|i| i.delivered > 1).unwrap_or(false)
    }
    fn ack(&self) -> BoxFuture<'_, Result<(), AckError>> {
        Box::pin(jetstream::Message::ack(self))
    }
    fn progress(&self) -> BoxFuture<'_, Result<(), AckError>> {
        Box::pin(self.ack_with(jetstream::AckKind::Progress))
    }
}

/// Where results go.
pub(crate) trait ResultSink: Send + Sync {
    /// Stores a result durably (retrying, bounded) or says why it could not.
    fn publish<'a>(
        &'a self,
        result: &'a ActionResult,
        encoding: Encoding,
    ) -> BoxFuture<'a, Result<(), tangram_nats::PublishError>>;
}

/// Results on their JetStream subjects.
pub(crate) struct JetStreamResults(pub(crate) jetstream::Context);

impl ResultSink for JetStreamResults {
    fn publish<'a>(
        &'a self,
        result: &'a ActionResult,
        encoding: Encoding,
    ) -> BoxFuture<'a, Result<(), tangram_nats::PublishError>> {
        // About 3 s of retries in all: results must not be lost to a brief outage.
        Box::pin(tangram_nats::publish_result(&self.0, result, encoding, 5))
    }
}
