//! The main job in short mode: the rollout workload (sandbox_exec with unit tests, reward on a
//! reference replica, api through the quota manager) against a real cluster, first under the
//! `tangram` policy and then under the `static` baseline; every test outcome must be the
//! expected one (correct candidates pass, buggy ones fail) and nothing may fail.

use std::time::Duration;
use tangram_tests::api_server::{search_provider, RateLimitedApi};
use tangram_tests::{built_binary, Cluster, WorkerSpec};

async fn rollout(
    url: &str,
    label: &str,
    report: &std::path::Path,
) -> anyhow::Result<serde_json::Value> {
    let (url, name, report) = (url.to_string(), label.to_string(), report.to_path_buf());
    let out = tokio::task::spawn_blocking(move || {
        // Bounded: a stuck run fails the test with its output instead of hanging it.
        std::process::Command::new("timeout")
            .arg("120")
            .arg(built_binary("tangram-rollout"))
            .args([
                "--nats-url",
                &url,
                "--trajectories",
                "3",
                "--turns",
                "2",
                "--think-ms",
                "100",
                "--label",
                &name,
                "--report",
            ])
            .arg(&report)
            .output()
            .map(|o| (o, report))
    })
    .await??;
    let (o, report) = out;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(o.status.success(), "rollout under {label} failed:\n{text}");
    assert!(text.contains("as expected"), "{text}");
    Ok(serde_json::from_str(&std::fs::read_to_string(report)?)?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn main_job_short_mode_passes_as_expected_under_tangram_and_static() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let api = RateLimitedApi::start(50.0, 10.0, Duration::from_millis(2)).await?;
    let mut cluster = Cluster::start(&[WorkerSpec::new("job-cpu")]).await?;
    cluster.start_gpu_worker("job-gpu", 2, &["judge", "teacher"], dir.path())?;
    cluster.start_api_worker("job-api", vec![search_provider(&api.url, 50.0, 10, 8)])?;
    let c = cluster.client("main-job").await?;
    c.wait_for_workers(&["job-cpu", "job-gpu", "job-api"], Duration::from_secs(60))
        .await?;
    let url = cluster.nats.url();
    let a = rollout(&url, "tangram", &dir.path().join("a.json")).await?;
    cluster
        .restart_scheduler_with(|cfg| {
            cfg.policy = "static".into();
            cfg.static_cores = 1;
        })
        .await?;
    let b = rollout(&url, "static", &dir.path().join("b.json")).await?;
    for r in [&a, &b] {
        assert_eq!(r["tests"], 6);
        assert_eq!(r["tests_as_expected"], 6, "{r}");
        let kinds: std::collections::BTreeSet<&str> = r["actions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x["kind"].as_str().unwrap())
            .collect();
        assert_eq!(
            kinds.into_iter().collect::<Vec<_>>(),
            [
                "api",
                "reward",
                "sandbox_close",
                "sandbox_exec",
                "sandbox_open"
            ]
        );
        assert!(
            r["actions"]
                .as_array()
                .unwrap()
                .iter()
                .all(|x| x["outcome"] == "completed"),
            "{r}"
        );
    }
    assert_eq!(api.violations(), 0);
    // The comparison and its picture.
    let svg = dir.path().join("act.svg");
    let out = std::process::Command::new(built_binary("tangram-rollout"))
        .arg("--compare")
        .arg(dir.path().join("a.json"))
        .arg(dir.path().join("b.json"))
        .arg("--svg")
        .arg(&svg)
        .output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("tangram") && text.contains("static"),
        "{text}"
    );
    // ACT per kind, split into its parts, for both runs.
    let picture = std::fs::read_to_string(&svg)?;
    for part in [
        "queued",
        "overhead",
        "exec",
        "tangram",
        "static",
        "sandbox_exec",
    ] {
        assert!(
            picture.contains(&format!(">\n{part}\n</text>"))
                || picture.contains(&format!(">{part}</text>")),
            "{part} missing from the picture"
        );
    }
    cluster.shutdown().await?;
    Ok(())
}
