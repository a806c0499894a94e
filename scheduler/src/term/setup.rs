//! A term's setup: the consumers, subscriptions and streams it works with, each set up
//! patiently (a stream electing a leader answers within seconds).

use async_nats::jetstream::{self, consumer::PullConsumer};
use std::time::Duration;
use tangram_shared::subject;
use tokio_util::sync::CancellationToken;
use tracing::warn;

/// One try of a term's setup call, at most.
const SETUP_TRY: Duration = Duration::from_secs(2);
/// All tries of one setup call, at most.
const SETUP_WITHIN: Duration = Duration::from_secs(60);

/// Calls `f` until it succeeds, each try bounded by [`SETUP_TRY`] and tried again with
/// backoff: a stream electing a leader (a NATS server of a cluster gone) answers within
/// seconds, and a term must not stall on one request meanwhile. Gives up after
/// [`SETUP_WITHIN`], or when the term ends.
pub(super) async fn patiently<T, E, F, Fut>(
    what: &str,
    stop: &CancellationToken,
    mut f: F,
) -> anyhow::Result<T>
where
    E: std::fmt::Display,
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, E>>,
{
    let deadline = tokio::time::Instant::now() + SETUP_WITHIN;
    let mut attempt = 0u32;
    loop {
        let last = match tokio::time::timeout(SETUP_TRY, f()).await {
            Ok(Ok(v)) => return Ok(v),
            Ok(Err(e)) => e.to_string(),
            Err(_) => format!("no answer within {SETUP_TRY:?}"),
        };
        attempt += 1;
        if tokio::time::Instant::now() >= deadline || stop.is_cancelled() {
            anyhow::bail!("{what}: {last}");
        }
        warn!(attempt, error = %last, "{what}; trying again");
        let wait = tangram_nats::backoff::backoff(
            attempt,
            Duration::from_millis(100),
            Duration::from_secs(1),
        );
        tokio::select! {
            _ = stop.cancelled() => anyhow::bail!("{what}: the term ended"),
            _ = tokio::time::sleep(wait) => {}
        }
    }
}

/// What a term works with.
pub(super) struct Wiring {
    /// The scheduler's intake consumer on `TANGRAM_ACTIONS`.
    pub(super) actions: PullConsumer,
    /// The scheduler's consumer on `TANGRAM_RESULTS`.
    pub(super) results: PullConsumer,
    /// Heartbeats (core NATS).
    pub(super) heartbeats: async_nats::Subscriber,
    /// Status requests (core NATS request/reply).
    pub(super) status_requests: async_nats::Subscriber,
    /// Requests to close a job's sandboxes (core NATS request/reply).
    pub(super) close_requests: async_nats::Subscriber,
    /// Rollouts' lease renewals (core NATS).
    pub(super) leases: async_nats::Subscriber,
    pub(super) results_stream: jetstream::stream::Stream,
    pub(super) dispatch_stream: jetstream::stream::Stream,
    pub(super) actions_stream: jetstream::stream::Stream,
}

/// Sets up what a term works with.
pub(super) async fn connect(
    client: &async_nats::Client,
    js: &jetstream::Context,
    shutdown: &CancellationToken,
) -> anyhow::Result<Wiring> {
    let actions = patiently("creating the actions consumer", shutdown, || {
        tangram_nats::scheduler_actions_consumer(js)
    })
    .await?;
    let results = patiently("creating the results consumer", shutdown, || {
        tangram_nats::scheduler_results_consumer(js)
    })
    .await?;
    let heartbeats = client.subscribe(subject::HEARTBEAT_ALL).await?;
    let status_requests = client.subscribe(subject::STATUS).await?;
    let close_requests = client.subscribe(subject::CLOSE_JOB_ALL).await?;
    let leases = client.subscribe(subject::LEASE_ALL).await?;
    let results_stream = patiently("looking up the results stream", shutdown, || {
        js.get_stream(subject::RESULTS_STREAM)
    })
    .await?;
    let dispatch_stream = patiently("looking up the dispatch stream", shutdown, || {
        js.get_stream(subject::DISPATCH_STREAM)
    })
    .await?;
    let actions_stream = patiently("looking up the actions stream", shutdown, || {
        js.get_stream(subject::ACTIONS_STREAM)
    })
    .await?;
    Ok(Wiring {
        actions,
        results,
        heartbeats,
        status_requests,
        close_requests,
        leases,
        results_stream,
        dispatch_stream,
        actions_stream,
    })
}
