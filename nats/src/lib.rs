//! Tangram's JetStream layout. The definitions live as JSON beside this crate (`streams/`,
//! `consumers/`) in the NATS API's own format, so operators can read them or apply them with
//! the `nats` CLI; this crate embeds them and creates them idempotently at start.
#![forbid(unsafe_code)]

pub mod auth;
pub mod backoff;
pub mod layers;
pub mod local;
mod publish;
pub mod status;
pub mod streams;
pub mod upgrade;

use async_nats::jetstream::{self, consumer, stream};
use std::time::Duration;
use tangram_shared::{subject, WorkerId};

pub use publish::{publish_is_transient, publish_result, result_exists, stream_full, PublishError};

/// The stream definitions, in creation order.
pub const STREAMS: [(&str, &str); 5] = [
    ("actions", include_str!("../streams/actions.json")),
    ("results", include_str!("../streams/results.json")),
    ("dispatch", include_str!("../streams/dispatch.json")),
    ("deadletter", include_str!("../streams/deadletter.json")),
    // Last: it sources the backlog streams.
    ("history", include_str!("../streams/history.json")),
];

const SCHEDULER_CONSUMER: &str = include_str!("../consumers/scheduler.json");
const SCHEDULER_RESULTS_CONSUMER: &str = include_str!("../consumers/scheduler-results.json");
const WORKER_CONSUMER: &str = include_str!("../consumers/worker.json");

/// Setting up JetStream failed.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    /// A bundled definition does not parse (a bug in this crate; tests catch it).
    #[error("bundled definition {name} is invalid: {source}")]
    Definition {
        /// Which definition.
        name: &'static str,
        /// Why.
        source: serde_json::Error,
    },
    /// A stream is still missing after waiting for the scheduler to create it.
    #[error(
        "stream {name} does not exist; is the scheduler running (only it may create streams)?"
    )]
    Missing {
        /// Which stream.
        name: String,
    },
    /// The server refused to create or update a stream.
    #[error("creating stream {name}: {source}")]
    Stream {
        /// Which stream.
        name: String,
        /// Why.
        source: async_nats::jetstream::context::CreateStreamError,
    },
    /// The server refused to create a consumer.
    #[error("creating consumer {name}: {source}")]
    Consumer {
        /// Which consumer.
        name: String,
        /// Why.
        source: async_nats::jetstream::stream::ConsumerError,
    },
    /// A stream's stored configuration could not be read.
    #[error("reading the configuration of stream {name}: {why}")]
    Info {
        /// Which stream.
        name: String,
        /// Why.
        why: String,
    },
    /// A backlog stream was created by an earlier release (limits retention: it keeps
    /// history, so it fills and refuses work); `tangram streams upgrade` converts it.
    #[error("stream {name} has the layout of an earlier release (it keeps history and fills up); stop the schedulers and workers and run `tangram streams upgrade` (docs/PROTOCOL.md, Streams)")]
    OldLayout {
        /// Which stream.
        name: String,
    },
    /// A stream could not be looked up.
    #[error("looking up stream {name}: {source}")]
    Lookup {
        /// Which stream.
        name: String,
        /// Why.
        source: async_nats::jetstream::context::GetStreamError,
    },
}

/// Parses the bundled stream definitions.
pub fn stream_configs() -> Result<Vec<stream::Config>, SetupError> {
    STREAMS
        .iter()
        .map(|(name, json)| {
            serde_json::from_str(json).map_err(|source| SetupError::Definition { name, source })
        })
        .collect()
}

fn consumer_config(name: &'static str, json: &str) -> Result<consumer::pull::Config, SetupError> {
    serde_json::from_str(json).map_err(|source| SetupError::Definition { name, source })
}

/// Creates every missing stream from the bundled definitions and `settings`; a stream that
/// exists is left as stored, and each way it differs from the configuration is returned and
/// logged (see [`streams`]). Safe to call from every process at every start.
pub async fn ensure_streams(
    js: &jetstream::Context,
    settings: &streams::StreamSettings,
) -> Result<Vec<streams::Drift>, SetupError> {
    streams::ensure(js, settings).await
}

/// For processes that do not administer streams (workers, rollouts): creates a stream only
/// when it is missing, so that with NATS permissions on, a worker needs no right to change
/// stream configurations (the scheduler keeps them current).
pub async fn ensure_streams_exist(js: &jetstream::Context) -> Result<(), SetupError> {
    if let Some(name) = upgrade::old_layout(js).await? {
        return Err(SetupError::OldLayout { name });
    }
    for config in stream_configs()? {
        if js.get_stream(&config.name).await.is_ok() {
            continue;
        }
        let name = config.name.clone();
        match js.create_stream(config).await {
            Ok(_) => {}
            // Another process created it in between: it exists, which is all this asks.
            Err(e) if created_meanwhile(&e) => {}
            Err(source) => return Err(SetupError::Stream { name, source }),
        }
    }
    Ok(())
}

/// Whether a stream creation failed because the stream exists now (a race with another
/// process creating it, perhaps with other settings).
///
/// The client keeps the server's error in the error's kind, not as its source: reading the
/// source (as this once did) never matched, and a client that lost the race on a three-node
/// cluster (its lookup failed while the new stream elected a leader) gave up on "stream name
/// already in use".
pub fn created_meanwhile(e: &jetstream::context::CreateStreamError) -> bool {
    matches!(e.kind(), jetstream::context::CreateStreamErrorKind::JetStream(j)
        if j.error_code() == jetstream::ErrorCode::STREAM_NAME_EXIST)
}

/// For processes with credentials that may not create streams: waits (up to `within`) until
/// the scheduler has created every stream.
pub async fn wait_for_streams(js: &jetstream::Context, within: Duration) -> Result<(), SetupError> {
    let deadline = tokio::time::Instant::now() + within;
    for config in stream_configs()? {
        let mut logged = false;
        while js.get_stream(&config.name).await.is_err() {
            if tokio::time::Instant::now() > deadline {
                return Err(SetupError::Missing { name: config.name });
            }
            if !logged {
                tracing::info!(stream = %config.name, "waiting for the scheduler to create the stream");
                logged = true;
            }
            tokio::time::sleep(backoff::jitter(Duration::from_millis(200))).await;
        }
    }
    Ok(())
}

async fn ensure_consumer(
    js: &jetstream::Context,
    stream_name: &str,
    config: consumer::pull::Config,
) -> Result<consumer::PullConsumer, SetupError> {
    let stream = js
        .get_stream(stream_name)
        .await
        .map_err(|source| SetupError::Lookup {
            name: stream_name.to_string(),
            source,
        })?;
    let name = config.durable_name.clone().unwrap_or_default();
    // create_consumer is idempotent for an identical config and updates a changed one.
    stream
        .create_consumer(config)
        .await
        .map_err(|source| SetupError::Consumer { name, source })
}

/// The scheduler's durable consumer on the actions stream.
pub async fn scheduler_actions_consumer(
    js: &jetstream::Context,
) -> Result<consumer::PullConsumer, SetupError> {
    let config = consumer_config("consumers/scheduler.json", SCHEDULER_CONSUMER)?;
    ensure_consumer(js, subject::ACTIONS_STREAM, config).await
}

/// The scheduler's durable consumer on the results stream.
pub async fn scheduler_results_consumer(
    js: &jetstream::Context,
) -> Result<consumer::PullConsumer, SetupError> {
    let config = consumer_config(
        "consumers/scheduler-results.json",
        SCHEDULER_RESULTS_CONSUMER,
    )?;
    ensure_consumer(js, subject::RESULTS_STREAM, config).await
}

/// A worker's durable consumer on its dispatch subject.
pub async fn worker_consumer(
    js: &jetstream::Context,
    worker: &WorkerId,
) -> Result<consumer::PullConsumer, SetupError> {
    let mut config = consumer_config("consumers/worker.json", WORKER_CONSUMER)?;
    config.durable_name = Some(subject::worker_consumer(worker));
    config.filter_subject = subject::dispatch_filter(worker);
    match ensure_consumer(js, subject::DISPATCH_STREAM, config).await {
        Ok(c) => Ok(c),
        Err(e) => {
            // A consumer created by an earlier version with settings that cannot be changed
            // in place (its delivery policy): use it as it is.
            let name = subject::worker_consumer(worker);
            let existing = match js.get_stream(subject::DISPATCH_STREAM).await {
                Ok(stream) => stream.get_consumer(&name).await.ok(),
                Err(_) => None,
            };
            match existing {
                Some(c) => {
                    tracing::warn!(consumer = %name, error = %e,
                        "the worker's consumer predates its current definition; using it as it is (delete it while the worker is stopped to apply the new one)");
                    Ok(c)
                }
                None => Err(e),
            }
        }
    }
}

/// Every subject of `stream` matching `filter` that holds a message (the stream's subject
/// listing, read to its end); the error as text.
pub async fn stored_subjects(
    stream: &jetstream::stream::Stream,
    filter: &str,
) -> Result<Vec<String>, String> {
    use futures::StreamExt;
    let mut out = Vec::new();
    let mut list = stream
        .info_with_subjects(filter)
        .await
        .map_err(|e| e.to_string())?;
    while let Some(entry) = list.next().await {
        out.push(entry.map_err(|e| e.to_string())?.0);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bundled_definitions_parse_and_match_the_subject_module() {
        let streams = stream_configs().unwrap();
        let names: Vec<_> = streams.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(
            names,
            [
                subject::ACTIONS_STREAM,
                subject::RESULTS_STREAM,
                subject::DISPATCH_STREAM,
                subject::DEADLETTER_STREAM,
                subject::HISTORY_STREAM,
            ]
        );
        assert_eq!(streams[0].subjects, [subject::ACTION_ALL]);
        assert_eq!(streams[1].subjects, [subject::RESULT_ALL]);
        assert_eq!(streams[2].subjects, [subject::DISPATCH_ALL]);
        assert_eq!(streams[3].subjects, [subject::DEADLETTER_ALL]);
        assert!(streams[4].subjects.is_empty(), "history only sources");
        for s in &streams {
            assert_eq!(s.storage, stream::StorageType::File);
            if s.name == subject::ACTIONS_STREAM || s.name == subject::DISPATCH_STREAM {
                // Backlog: what is processed leaves, so the limits count unprocessed work,
                // and a full backlog refuses rather than dropping work; no age limit.
                assert_eq!(
                    s.retention,
                    stream::RetentionPolicy::WorkQueue,
                    "{}",
                    s.name
                );
                assert_eq!(s.discard, stream::DiscardPolicy::New, "{}", s.name);
                assert!(s.max_age.is_zero(), "{}", s.name);
            } else {
                // History: a window that evicts its oldest, never refuses.
                assert_eq!(s.retention, stream::RetentionPolicy::Limits, "{}", s.name);
                assert_eq!(s.discard, stream::DiscardPolicy::Old, "{}", s.name);
                assert!(s.max_age.as_secs() >= 86_400, "{}", s.name);
            }
        }
        let sources: Vec<_> = streams[4]
            .sources
            .iter()
            .flatten()
            .map(|s| s.name.as_str())
            .collect();
        assert_eq!(sources, [subject::ACTIONS_STREAM, subject::DISPATCH_STREAM]);
        let c = consumer_config("scheduler", SCHEDULER_CONSUMER).unwrap();
        assert_eq!(
            c.durable_name.as_deref(),
            Some(subject::SCHEDULER_ACTIONS_CONSUMER)
        );
        assert_eq!(c.ack_policy, consumer::AckPolicy::Explicit);
        let c = consumer_config("scheduler-results", SCHEDULER_RESULTS_CONSUMER).unwrap();
        assert_eq!(
            c.durable_name.as_deref(),
            Some(subject::SCHEDULER_RESULTS_CONSUMER)
        );
        consumer_config("worker", WORKER_CONSUMER).unwrap();
    }

    /// Regression: the streams' byte limits once added up to more than the server's
    /// `max_file_store`, and JetStream refused to create the last stream.
    #[test]
    fn stream_byte_limits_fit_the_server_file_store() {
        let conf = include_str!("../server.conf");
        let line = conf
            .lines()
            .find(|l| l.trim_start().starts_with("max_file_store"))
            .unwrap();
        let value = line.split(':').nth(1).unwrap().trim();
        let gb: i64 = value.trim_end_matches("GB").parse().unwrap();
        let total: i64 = stream_configs().unwrap().iter().map(|s| s.max_bytes).sum();
        assert!(
            total <= gb * 1_000_000_000,
            "streams reserve {total} bytes; the server allows {gb} GB"
        );
        // Regression: at 17 GiB, servers sharing one disk (a test suite's) refused the last
        // stream for want of storage; 11 GiB was the reservation long known to work.
        assert!(total <= 11 << 30, "streams reserve {total} bytes");
    }

    /// Regression: a crashed worker's in-flight dispatch stayed invisible for the consumer's
    /// whole ack wait (once an hour), so its action never got a result.
    #[test]
    fn worker_dispatches_come_back_quickly_after_a_crash() {
        let c = consumer_config("worker", WORKER_CONSUMER).unwrap();
        // Consumers of workers gone for good are removed by the server; one created again
        // reads what the work queue still holds (JetStream requires `all` there).
        assert_eq!(c.deliver_policy, consumer::DeliverPolicy::All);
        assert!(c.inactive_threshold >= Duration::from_secs(600));
        assert!(c.ack_wait.as_secs() <= 30, "ack_wait {:?}", c.ack_wait);
        // The engine waits this long before it counts a dispatch the worker omits.
        assert_eq!(
            c.ack_wait,
            Duration::from_millis(tangram_shared::DISPATCH_REDELIVERY_MS)
        );
    }
}
