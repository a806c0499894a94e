//! The Python client's own tests (clients/python/tests), run against a real cluster started
//! here: NATS, the scheduler, a CPU worker, a GPU worker serving `judge` with a reference
//! replica, and a worker calling a local search stand-in as provider `search`.

use std::time::Duration;
use tangram_tests::api_server::{search_provider, RateLimitedApi};
use tangram_tests::{repo_root, Cluster, WorkerSpec};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_client_tests_pass_against_a_real_cluster() -> anyhow::Result<()> {
    let python = repo_root().join("tools/venv/bin/python");
    anyhow::ensure!(
        python.exists(),
        "{} is missing; run deploy/install-tools.sh",
        python.display()
    );
    let dir = tempfile::tempdir()?;
    let server = RateLimitedApi::start(100.0, 20.0, Duration::from_millis(2)).await?;
    // With users and permissions, as tangram up runs it: the client holds the `py-sdk` job's
    // rollout credentials.
    let mut cluster = Cluster::start_secured_with(
        &[WorkerSpec::new("py-cpu")],
        &["py-gpu", "py-api"],
        &["py-sdk"],
    )
    .await?;
    cluster.start_gpu_worker("py-gpu", 1, &["judge"], dir.path())?;
    cluster.start_api_worker("py-api", vec![search_provider(&server.url, 100.0, 20, 8)])?;
    let c = cluster.client("py-sdk").await?;
    c.wait_for_workers(&["py-cpu", "py-gpu", "py-api"], Duration::from_secs(60))
        .await?;
    let url = cluster.nats.url();
    let creds = cluster.creds.as_ref().expect("a secured cluster");
    let seed = creds.join("rollout-py-sdk.nk");
    // For the tests that look where a job may not: other consumers, heartbeats.
    let operator_seed = creds.join("operator.nk");
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(python)
            .args(["-m", "unittest", "discover", "-v", "-s"])
            .arg(repo_root().join("clients/python/tests"))
            .env("TANGRAM_NATS_URL", url)
            .env("TANGRAM_NKEY_FILE", seed)
            .env("TANGRAM_OPERATOR_NKEY_FILE", operator_seed)
            .output()
    })
    .await??;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "python client tests failed:\n{text}");
    assert!(text.contains("Ran 44 tests"), "{text}");
    assert!(
        !text.contains("skipped"),
        "every Python test runs here:\n{text}"
    );
    cluster.shutdown().await?;
    Ok(())
}
