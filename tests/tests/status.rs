//! The status reply, paged: a listing of every worker could pass NATS's payload limit on a
//! fleet of thousands, so the scheduler answers a page at a time when it must (or when asked
//! for fewer), and says where to go on; `tangram_nats::status::fetch` (what `tangram status`
//! and `--json` use) follows the pages, so the listing stays complete. A request body that is
//! not JSON is answered with what was wrong.

use std::time::Duration;
use tangram_shared::status::Status;
use tangram_shared::subject;
use tangram_tests::{Cluster, WorkerSpec};

const T: Duration = Duration::from_secs(30);

async fn ask(c: &tangram_tests::Client, body: &str) -> anyhow::Result<serde_json::Value> {
    let m =
        tokio::time::timeout(T, c.nats.request(subject::STATUS, body.to_string().into())).await??;
    Ok(serde_json::from_slice(&m.payload)?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_status_pages_its_workers_and_a_fetch_follows_every_page() -> anyhow::Result<()> {
    let ids = ["page-a", "page-b", "page-c"];
    let cluster = Cluster::start(&ids.map(WorkerSpec::new)).await?;
    let c = cluster.client("paging").await?;
    c.wait_for_status(T, "the scheduler listing three workers", |s| {
        s.workers.len() == 3
    })
    .await?;

    // Asked for two: the first two by id, and where to go on.
    let first: Status = serde_json::from_value(ask(&c, r#"{"workers_limit": 2}"#).await?)?;
    let names: Vec<&str> = first.workers.iter().map(|w| w.id.as_str()).collect();
    assert_eq!(names, ["page-a", "page-b"]);
    assert_eq!(first.workers_total, 3);
    assert_eq!(first.next_after.as_deref(), Some("page-b"));
    let rest: Status = serde_json::from_value(
        ask(&c, r#"{"workers_after": "page-b", "workers_limit": 2}"#).await?,
    )?;
    let names: Vec<&str> = rest.workers.iter().map(|w| w.id.as_str()).collect();
    assert_eq!(names, ["page-c"]);
    assert_eq!(rest.next_after, None);

    // An empty body: everything fits one reply.
    let all: Status = serde_json::from_value(ask(&c, "").await?)?;
    assert_eq!((all.workers.len(), all.next_after), (3, None));

    // A fetch a worker at a time takes three replies and lists all three.
    let f = tangram_nats::status::fetch_pages(&c.nats, T, Some(1)).await?;
    assert_eq!(f.pages, 3);
    let names: Vec<&str> = f.status.workers.iter().map(|w| w.id.as_str()).collect();
    assert_eq!(names, ids);

    // Bad input: an answer saying what a body may be, and the scheduler goes on answering.
    let bad = ask(&c, "not json").await?;
    let error = bad["error"].as_str().unwrap_or_default();
    assert!(error.contains("workers_after"), "{bad}");
    assert_eq!(c.status().await?.workers.len(), 3);
    Ok(())
}
