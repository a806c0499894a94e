//! Action messages as a term holds them, and taking back what an earlier leader held.
//!
//! An action reaches the intake in one of two ways. Most come through the intake consumer
//! (`Delivered`): JetStream expects an ack, nak or in-progress report on that delivery.
//! At the start of a term, the new leader also reads the actions an earlier leader had been
//! delivered and never answered (`TakenBack`): a leader that died or froze holds them until
//! the consumer's `ack_wait` runs out, 10 s after the last delivery or progress report, and
//! the new leader would otherwise sit idle on them that long.
//!
//! A taken-back action is read from the stream, not delivered: there is nothing to ack on,
//! and the message stays in the stream, still counted as the earlier leader's. When its ack
//! wait runs out it is delivered to this leader with the same stream sequence, and the
//! engine treats that as a redelivery of what it holds (acked if it is running, counted as a
//! duplicate if it is settled). Nothing is deleted or changed on the server, so if this
//! leader ends too, the next one finds the message where it was.

use async_nats::jetstream::{self, message::StreamMessage, AckKind};
use async_nats::HeaderMap;
use bytes::Bytes;
use futures::Stream;
use std::time::Duration;
use tangram_shared::subject;
use tracing::{info, warn};

/// At most this many messages are taken back at a term's start; the rest come when their
/// ack wait runs out, as before. Each costs a read and the intake's lookups, and they are
/// read one after another (about a millisecond each on a quiet server).
pub(crate) const TAKE_BACK_MAX: usize = 4_096;
/// One read of the stream, at most.
const READ_WITHIN: Duration = Duration::from_secs(2);

/// An action message in the intake.
#[derive(Debug, Clone)]
pub(crate) enum Incoming {
    /// Delivered by the intake consumer: acks go to the server.
    Delivered(jetstream::Message),
    /// Read from the stream at a term's start: an earlier leader's delivery, unanswered.
    TakenBack(StreamMessage),
    /// Made by a test of the shell: delivered, and answered through the fake outbox.
    #[cfg(test)]
    Fake {
        /// Its stream sequence.
        sequence: u64,
        /// Its subject.
        subject: String,
        /// Its payload.
        payload: Bytes,
    },
}

impl Incoming {
    pub(crate) fn subject(&self) -> &str {
        match self {
            Self::Delivered(m) => m.subject.as_str(),
            Self::TakenBack(m) => m.subject.as_str(),
            #[cfg(test)]
            Self::Fake { subject, .. } => subject.as_str(),
        }
    }

    pub(crate) fn headers(&self) -> Option<&HeaderMap> {
        match self {
            Self::Delivered(m) => m.headers.as_ref(),
            Self::TakenBack(m) => Some(&m.headers),
            #[cfg(test)]
            Self::Fake { .. } => None,
        }
    }

    pub(crate) fn payload(&self) -> &Bytes {
        match self {
            Self::Delivered(m) => &m.payload,
            Self::TakenBack(m) => &m.payload,
            #[cfg(test)]
            Self::Fake { payload, .. } => payload,
        }
    }

    /// Where it stands in the stream, read once from its delivery's metadata (all zero
    /// and not a first delivery where that cannot be read).
    pub(crate) fn position(&self) -> Position {
        match self {
            Self::Delivered(m) => match m.info() {
                Ok(i) => Position {
                    sequence: i.stream_sequence,
                    first_delivery: i.delivered == 1,
                    stored_at_us: (i.published.unix_timestamp_nanos() / 1000) as u64,
                },
                Err(_) => Position::default(),
            },
            // Delivered before, to the leader that held it.
            Self::TakenBack(m) => Position {
                sequence: m.sequence,
                first_delivery: false,
                stored_at_us: (m.time.unix_timestamp_nanos() / 1000) as u64,
            },
            #[cfg(test)]
            Self::Fake { sequence, .. } => Position {
                sequence: *sequence,
                first_delivery: true,
                stored_at_us: 0,
            },
        }
    }

    pub(crate) fn is_taken_back(&self) -> bool {
        matches!(self, Self::TakenBack(_))
    }

    /// Acks, naks or reports progress on a delivery; nothing for a taken-back message,
    /// which is answered when it is delivered.
    pub(crate) async fn reply(&self, kind: AckKind) -> Result<(), async_nats::Error> {
        match self {
            Self::Delivered(m) => m.ack_with(kind).await,
            Self::TakenBack(_) => Ok(()),
            #[cfg(test)]
            Self::Fake { .. } => Ok(()),
        }
    }
}

/// Where an action message stands in the stream.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Position {
    /// The stream sequence: the engine's delivery handle.
    pub(crate) sequence: u64,
    /// Whether the server delivers it for the first time.
    pub(crate) first_delivery: bool,
    /// When it was stored, microseconds since the epoch.
    pub(crate) stored_at_us: u64,
}

/// The unanswered deliveries of the intake consumer, read from the stream in order: every
/// message past the consumer's ack floor and up to the last sequence it delivered is one a
/// leader was given and has not acked (on a work-queue stream an ack removes the message).
/// Read once, before this term pulls anything, so none of them is this term's own.
pub(crate) async fn take_back(
    consumer: &mut jetstream::consumer::PullConsumer,
    stream: &jetstream::stream::Stream,
) -> impl Stream<Item = StreamMessage> + Send + 'static {
    let range = match tokio::time::timeout(READ_WITHIN, consumer.info()).await {
        Ok(Ok(info)) if info.num_ack_pending > 0 => Some((
            info.ack_floor.stream_sequence + 1,
            info.delivered.stream_sequence,
            info.num_ack_pending.min(TAKE_BACK_MAX),
        )),
        Ok(Ok(_)) => None,
        Ok(Err(e)) => {
            warn!(error = %e, "reading the intake consumer; nothing taken back (held actions come at their ack wait)");
            None
        }
        Err(_) => {
            warn!("reading the intake consumer timed out; nothing taken back");
            None
        }
    };
    if let Some((from, to, pending)) = range {
        info!(
            pending,
            from, to, "an earlier leader left actions unanswered; taking them back"
        );
    }
    let stream = stream.clone();
    // Up to as many as are unacknowledged: the range also holds messages an earlier leader
    // handed back (nak) as it stepped down, which the server delivers again at once anyway.
    let state = range.map(|(from, to, most)| (from, to, 0usize, most));
    futures::stream::unfold((stream, state), |(stream, state)| async move {
        let (next, to, count, most) = state?;
        if next > to || count >= most {
            if count >= TAKE_BACK_MAX {
                warn!(
                    count,
                    "taking back stopped at its bound; the rest come at their ack wait"
                );
            }
            return None;
        }
        let read = stream
            .raw_message_builder()
            .sequence(next)
            .next_by_subject(subject::ACTION_ALL)
            .send();
        let msg = match tokio::time::timeout(READ_WITHIN, read).await {
            Ok(Ok(m)) => m,
            Ok(Err(e)) => {
                use async_nats::jetstream::stream::RawMessageErrorKind;
                if e.kind() != RawMessageErrorKind::NoMessageFound {
                    warn!(error = %e, "taking back held actions stopped; the rest come at their ack wait");
                }
                return None;
            }
            Err(_) => {
                warn!("taking back held actions timed out; the rest come at their ack wait");
                return None;
            }
        };
        if msg.sequence > to {
            return None;
        }
        crate::metrics::intake_taken_back();
        let state = Some((msg.sequence + 1, to, count + 1, most));
        Some((msg, (stream, state)))
    })
}
