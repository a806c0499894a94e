//! The GPU worker's replica manager on real reference-replica processes: starts are never
//! doubled and a request that reached a replica is never sent twice (the regression tests of
//! the reward scored twice under a worker partition, docs/RELIABILITY.md).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tangram_shared::{ChunkRef, GpuInventory, GpuRoute};
use tangram_tests::reference_replica_command;
use tangram_worker::services::{Driver, ReplicaDriver, ServiceConfig, ServiceError, Services};

const T: Duration = Duration::from_secs(30);

/// A reference replica that appends its port to `starts` when it starts and every scored
/// input to `requests`; with `exit_after`, it dies unanswered after that many requests.
fn service(dir: &Path, exit_after: Option<u32>) -> ServiceConfig {
    let mut argv = reference_replica_command(16);
    argv.extend([
        "--request-log".into(),
        dir.join("requests").display().to_string(),
    ]);
    if let Some(n) = exit_after {
        argv.extend(["--exit-after-scores".into(), n.to_string()]);
    }
    let line = format!(
        "echo {{port}} >> {}; exec {}",
        dir.join("starts").display(),
        argv.join(" ")
    );
    ServiceConfig {
        name: "judge".into(),
        driver: Driver::Reference,
        command: vec!["sh".into(), "-c".into(), line],
        image: None,
        args: Vec::new(),
        mounts: Vec::new(),
        gpus: 1,
        host_mem_mb: 0,
        restore_ms: 100,
        slots: 4,
        start_timeout_ms: 20_000,
        model: None,
        env: BTreeMap::new(),
    }
}

fn services(dir: &Path, exit_after: Option<u32>) -> Arc<Services> {
    Arc::new(Services::new(
        "replica-test",
        vec![service(dir, exit_after)],
        GpuInventory {
            source: "declared".into(),
            groups: vec![vec![0, 1]],
            devices: Vec::new(),
        },
        dir.join("state"),
    ))
}

fn lines(path: &Path) -> usize {
    std::fs::read_to_string(path).map_or(0, |s| s.lines().count())
}

/// The chunk the service is not deployed on at start: a route there starts a replica.
fn second_chunk() -> GpuRoute {
    GpuRoute {
        service: "judge".into(),
        chunk: ChunkRef {
            group: 0,
            start: 1,
            len: 1,
        },
        restore: true,
        evict: Vec::new(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_rewards_on_a_chunk_without_a_replica_start_one_and_score_each_once(
) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let s = services(dir.path(), None);
    s.start().await?;
    assert_eq!(
        lines(&dir.path().join("starts")),
        1,
        "one replica on its home chunk"
    );
    let route = second_chunk();
    let options = BTreeMap::new();
    let inputs: Vec<Vec<String>> = (0..4).map(|i| vec![format!("input {i}")]).collect();
    let served = futures::future::join_all(
        inputs
            .iter()
            .map(|i| tokio::time::timeout(T, s.serve(&route, i, &options, T))),
    )
    .await;
    for r in served {
        let r = r?;
        assert!(r.is_ok(), "{r:?}");
    }
    // Before the fix each request that found no replica started its own and the last start
    // replaced (and killed) the others, some of them mid-request.
    assert_eq!(
        lines(&dir.path().join("starts")),
        2,
        "one more replica, on the second chunk"
    );
    assert_eq!(
        lines(&dir.path().join("requests")),
        4,
        "each input scored once"
    );
    s.stop_all(Duration::from_secs(5)).await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_that_dies_after_scoring_is_not_sent_the_request_again() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let s = services(dir.path(), Some(1));
    s.start().await?;
    let route = second_chunk();
    let inputs = vec!["scored once".to_string()];
    let r = tokio::time::timeout(T, s.serve(&route, &inputs, &BTreeMap::new(), T)).await?;
    assert!(
        matches!(r, Err(ServiceError::Score { .. })),
        "a request lost with its replica is a service error: {r:?}"
    );
    assert_eq!(
        lines(&dir.path().join("requests")),
        1,
        "the effect happened once; the request was not retried on a fresh replica"
    );
    // The next request gets a fresh replica (started by this serve, as the old one exited).
    let next = vec!["next".to_string()];
    let r = tokio::time::timeout(T, s.serve(&route, &next, &BTreeMap::new(), T)).await?;
    // That replica too dies after its first score, so this is again one effect and an error.
    assert!(matches!(r, Err(ServiceError::Score { .. })), "{r:?}");
    assert_eq!(lines(&dir.path().join("requests")), 2);
    assert_eq!(
        lines(&dir.path().join("starts")),
        3,
        "home, then one per lost replica"
    );
    s.stop_all(Duration::from_secs(5)).await;
    Ok(())
}

/// Regression: a replica's port can be taken between the check that it is free and the
/// replica's bind (a CI run saw `Address already in use`, and the GPU worker never came up).
/// A replica that exits while starting is started again on another port.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_that_exits_while_starting_is_started_again_on_another_port() -> anyhow::Result<()>
{
    let dir = tempfile::tempdir()?;
    let mut config = service(dir.path(), None);
    // The first start fails as a lost bind would; the second runs the replica.
    let marker = dir.path().join("failed-once");
    let argv = config.command[2].clone();
    config.command[2] = format!(
        "echo {{port}} >> {starts}; if [ ! -e {m} ]; then touch {m}; exit 98; fi; {rest}",
        starts = dir.path().join("attempts").display(),
        m = marker.display(),
        rest = argv
    );
    let s = Arc::new(Services::new(
        "replica-test",
        vec![config],
        GpuInventory {
            source: "declared".into(),
            groups: vec![vec![0, 1]],
            devices: Vec::new(),
        },
        dir.path().join("state"),
    ));
    s.start().await?;
    let ports = std::fs::read_to_string(dir.path().join("attempts"))?;
    let ports: Vec<&str> = ports.lines().collect();
    assert_eq!(
        ports.len(),
        2,
        "one failed start, one that served: {ports:?}"
    );
    let r = tokio::time::timeout(
        T,
        s.serve(
            &GpuRoute {
                restore: false,
                chunk: ChunkRef {
                    group: 0,
                    start: 0,
                    len: 1,
                },
                ..second_chunk()
            },
            &["scored".to_string()],
            &BTreeMap::new(),
            T,
        ),
    )
    .await?;
    assert!(r.is_ok(), "{r:?}");
    s.stop_all(Duration::from_secs(5)).await;
    Ok(())
}
