//! What a worker asks of the server's JetStream API while it idles. 500 workers' fence
//! watches sent it a thousand stream-info requests a second (the scheduler's KV bucket was
//! looked up for every read of a key, twice a second a worker), whatever the action rate;
//! under load the API queue filled, the leader's own consumer calls timed out and its term
//! failed. The bucket is looked up once now, and keys are read by direct gets, which are not
//! API requests. Counted from the server's own audit advisories.

use futures::StreamExt as _;
use std::time::Duration;
use tangram_tests::{Cluster, WorkerSpec};
use tokio::time::Instant;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_worker_sends_the_jetstream_api_nothing_a_second() -> anyhow::Result<()> {
    let cluster = Cluster::start(&[WorkerSpec::new("api-a")]).await?;
    let c = cluster.client("api").await?;
    // The scheduler leads, so its bucket exists; the worker's fence watch looks it up at its
    // next round (it runs every second; one made before the bucket existed found nothing and
    // asks again). Its requests from 1.5 s on are counted.
    c.wait_for_status(Duration::from_secs(30), "the worker listed", |s| {
        s.workers.iter().any(|w| w.id == "api-a")
    })
    .await?;
    let mut audit = c.nats.subscribe("$JS.EVENT.ADVISORY.API").await?;
    c.nats.flush().await?;
    let start = Instant::now() + Duration::from_millis(1_500);
    // Then five seconds of the worker idling: ten rounds of its fence watch.
    let end = start + Duration::from_secs(5);
    let (mut seen, mut mine) = (0, Vec::new());
    while let Ok(Some(m)) = tokio::time::timeout_at(end, audit.next()).await {
        seen += 1;
        let v: serde_json::Value = serde_json::from_slice(&m.payload)?;
        if Instant::now() >= start && v["client"]["name"] == "tangram-worker-api-a" {
            mine.push(v["subject"].as_str().unwrap_or_default().to_string());
        }
    }
    assert!(
        mine.is_empty(),
        "the worker's API requests in 5 s: {mine:?}"
    );
    // The audit is on: the scheduler's own requests (its backlog gauge) are seen.
    assert!(
        seen > 0,
        "no API audit advisory at all: the count above proves nothing"
    );
    Ok(())
}
