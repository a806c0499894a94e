//! Reading the retained streams: the one module of `inspect` and `replay` that talks to
//! JetStream. A scan is an ordered consumer (ephemeral, server-side filtered) read until the
//! server reports nothing pending, so it sees the stream as it was when the scan began and
//! never waits on new traffic.

use anyhow::{bail, Context as _};
use async_nats::jetstream::{self, consumer, stream::Stream};
use async_nats::HeaderMap;
use bytes::Bytes;
use futures::StreamExt as _;
use std::time::Duration;
use tangram_shared::codec::{self, Encoding};
use tangram_shared::subject;

/// One stored message.
#[derive(Debug, Clone)]
pub struct Record {
    /// Stream sequence.
    pub seq: u64,
    /// Subject it was stored under.
    pub subject: String,
    /// When the server stored it, Unix microseconds.
    pub at_us: u64,
    /// Its headers.
    pub headers: HeaderMap,
    /// Its payload (empty for a headers-only scan).
    pub payload: Bytes,
}

impl Record {
    /// A header's value.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(|v| v.as_str())
    }

    /// The encoding its `Content-Type` names (msgpack when absent or unknown).
    pub fn encoding(&self) -> Encoding {
        Encoding::from_content_type(self.header(subject::HEADER_CONTENT_TYPE))
            .unwrap_or(Encoding::Msgpack)
    }

    /// Decodes the payload.
    pub fn decode<T: serde::de::DeserializeOwned>(&self) -> anyhow::Result<T> {
        codec::decode(&self.payload, self.encoding()).with_context(|| {
            format!(
                "message {} on {} is not what its stream should hold",
                self.seq, self.subject
            )
        })
    }
}

/// What to read.
#[derive(Debug, Clone, Default)]
pub struct Scan {
    /// Subject filters (wildcards allowed); empty reads every subject.
    pub filters: Vec<String>,
    /// Only messages stored at or after this time, Unix microseconds.
    pub since_us: Option<u64>,
    /// Only messages stored before this time, Unix microseconds.
    pub until_us: Option<u64>,
    /// Headers only (the payloads stay on the server).
    pub headers_only: bool,
    /// Refuse to read more than this many messages (0: no bound).
    pub max: usize,
}

/// Unix microseconds of a server timestamp.
pub fn unix_us(t: time::OffsetDateTime) -> u64 {
    u64::try_from(t.unix_timestamp_nanos() / 1000).unwrap_or(0)
}

/// Opens a stream by name, with a hint when it is missing.
pub async fn open(js: &jetstream::Context, name: &str) -> anyhow::Result<Stream> {
    js.get_stream(name).await.with_context(|| {
        format!("stream {name} is not there: is this a Tangram cluster, and do these credentials read it?")
    })
}

/// Reads every message the scan selects, oldest first.
pub async fn scan(js: &jetstream::Context, stream: &str, s: &Scan) -> anyhow::Result<Vec<Record>> {
    let stream = open(js, stream).await?;
    let deliver_policy = match s.since_us {
        Some(us) => consumer::DeliverPolicy::ByStartTime {
            start_time: time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(us) * 1000)
                .context("--since is out of range")?,
        },
        None => consumer::DeliverPolicy::All,
    };
    let (filter_subject, filter_subjects) = match s.filters.as_slice() {
        [] => (String::new(), Vec::new()),
        [one] => (one.clone(), Vec::new()),
        many => (String::new(), many.to_vec()),
    };
    let mut c = stream
        .create_consumer(consumer::pull::OrderedConfig {
            filter_subject,
            filter_subjects,
            deliver_policy,
            headers_only: s.headers_only,
            ..Default::default()
        })
        .await
        .context("creating a reader on the stream")?;
    let pending = c.info().await.map(|i| i.num_pending).unwrap_or(u64::MAX);
    let mut out = Vec::new();
    if pending == 0 {
        return Ok(out);
    }
    let mut messages = c.messages().await.context("reading the stream")?;
    loop {
        let next = tokio::time::timeout(Duration::from_secs(10), messages.next())
            .await
            .context("the stream stopped delivering for 10 s")?;
        let Some(m) = next else { break };
        let m = m.map_err(|e| anyhow::anyhow!("reading the stream: {e}"))?;
        let info = m.info().map_err(|e| anyhow::anyhow!("{e}"))?;
        let (seq, at_us, left) = (info.stream_sequence, unix_us(info.published), info.pending);
        if s.until_us.is_some_and(|u| at_us >= u) {
            break;
        }
        if s.max > 0 && out.len() >= s.max {
            bail!(
                "more than {} messages match; narrow the selection (--job, --since, --until) or raise --max",
                s.max
            );
        }
        let m = m.message;
        out.push(Record {
            seq,
            subject: m.subject.to_string(),
            at_us,
            headers: m.headers.unwrap_or_default(),
            payload: m.payload,
        });
        if left == 0 {
            break;
        }
    }
    Ok(out)
}

/// One message by sequence, with its payload.
pub async fn get(js: &jetstream::Context, stream: &str, seq: u64) -> anyhow::Result<Record> {
    let stream = open(js, stream).await?;
    let m = stream
        .get_raw_message(seq)
        .await
        .with_context(|| format!("message {seq} is not in the stream (expired or deleted?)"))?;
    Ok(Record {
        seq: m.sequence,
        subject: m.subject.to_string(),
        at_us: unix_us(m.time),
        headers: m.headers,
        payload: m.payload,
    })
}
