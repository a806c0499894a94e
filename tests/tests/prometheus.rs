//! A real Prometheus scrapes a real cluster (nats-server, the scheduler and two workers as
//! processes, metrics on) that has run sandbox, reward and api actions, and every series the
//! Grafana dashboard and the alert rules query exists; every dashboard query and every rule
//! evaluates without error.

use anyhow::Context;
use std::process::{Command, Stdio};
use std::time::Duration;
use tangram_shared::{ActionId, Outcome};
use tangram_tests::build::{api, close, exec, open, reward};
use tangram_tests::prometheus::{
    alert_exprs, dashboard_exprs, selectors, tool, Prometheus, MISSING,
};
use tangram_tests::{
    built_binary, eventually, free_port, reference_replica_command, repo_root, ChildGuard, Client,
    NatsServer,
};

const T: Duration = Duration::from_secs(90);

fn spawn(bin: &str, args: &[String]) -> anyhow::Result<ChildGuard> {
    let child = Command::new(built_binary(bin))
        .args(args)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .with_context(|| format!("spawning {bin}"))?;
    Ok(ChildGuard(child))
}

/// The GPU worker's config: one declared GPU shared by two reward services (so rewards that
/// alternate evict and restore), and the search stand-in as an API provider.
fn gpu_config(nats: &str, metrics: &str, search: &str, state: &std::path::Path) -> String {
    let cmd: Vec<String> = reference_replica_command(16)
        .iter()
        .map(|a| format!("{a:?}"))
        .collect();
    let mut toml = format!(
        "id = \"gpu-m\"\nnats_url = \"{nats}\"\nsandboxes = false\nheartbeat_ms = 200\n\
         state_dir = \"{}\"\nmetrics_addr = \"{metrics}\"\n\n[gpu]\nnvml = \"off\"\ncount = 1\n",
        state.display()
    );
    for s in ["judge-a", "judge-b"] {
        toml += &format!(
            "\n[[service]]\nname = \"{s}\"\ndriver = \"reference\"\ncommand = [{}]\ngpus = 1\nrestore_ms = 20\nslots = 1\n",
            cmd.join(", ")
        );
    }
    toml += &format!(
        "\n[[provider]]\nname = \"search\"\nbase_url = \"{search}\"\nrate_per_s = 50\nburst = 10\nallow = [\"GET /search\"]\n"
    );
    toml
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_series_the_dashboard_and_the_alerts_query_is_scraped() -> anyhow::Result<()> {
    if tool("prometheus").is_none() {
        eprintln!("SKIPPED: {MISSING}");
        return Ok(());
    }
    tangram_tests::init_logging();
    let nats = NatsServer::start();
    let url = nats.url();
    let dir = tempfile::tempdir()?;
    let (sched_m, cpu_m, gpu_m) = (free_port(), free_port(), free_port());
    let search_port = free_port();
    let _search = ChildGuard(
        Command::new("python3")
            .arg(repo_root().join("services/search-standin/search.py"))
            .args(["--port", &search_port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?,
    );
    let _scheduler = spawn(
        "tangram-scheduler",
        &[
            "--id".into(),
            "sched-m".into(),
            "--nats-url".into(),
            url.clone(),
            "--metrics-addr".into(),
            format!("127.0.0.1:{sched_m}"),
        ],
    )?;
    let _cpu = spawn(
        "tangram-worker",
        &[
            "--id",
            "cpu-m",
            "--nats-url",
            &url,
            "--cores",
            "0-1",
            "--mem-mb",
            "2048",
            "--heartbeat-ms",
            "200",
            "--metrics-addr",
            &format!("127.0.0.1:{cpu_m}"),
        ]
        .map(String::from),
    )?;
    let search_up = eventually(T, || {
        tangram_tests::prometheus::http_get(&format!("127.0.0.1:{search_port}"), "/health").is_ok()
    })
    .await;
    assert!(search_up, "the search stand-in answers /health");
    let config = dir.path().join("gpu.toml");
    std::fs::write(
        &config,
        gpu_config(
            &url,
            &format!("127.0.0.1:{gpu_m}"),
            &format!("http://127.0.0.1:{search_port}"),
            &dir.path().join("state"),
        ),
    )?;
    let _gpu = spawn(
        "tangram-worker",
        &["--config".into(), config.display().to_string()],
    )?;

    let job = "obs";
    let c = Client::connect(&url, job).await?;
    c.wait_for_workers(&["cpu-m", "gpu-m"], T).await?;
    let mut ids = vec!["o1".to_string()];
    c.submit(&open("o1", job, "t1")).await?;
    c.result(&ActionId::new("o1")?, T).await?;
    for i in 0..3 {
        let id = format!("x{i}");
        c.submit(&exec(
            &id,
            job,
            "t1",
            &["python3", "-c", "print(6*7)"],
            1,
            2,
        ))
        .await?;
        ids.push(id);
    }
    for i in 0..4 {
        let id = format!("r{i}");
        let service = if i % 2 == 0 { "judge-a" } else { "judge-b" };
        c.submit(&reward(&id, job, "t1", service, &["a b c"]))
            .await?;
        ids.push(id);
    }
    for i in 0..3 {
        let id = format!("a{i}");
        c.submit(&api(&id, job, "t1", "search", "/search")).await?;
        ids.push(id);
    }
    for id in &ids {
        let r = c.result(&ActionId::new(id.as_str())?, T).await?;
        assert!(
            matches!(r.outcome, Outcome::Completed { .. }),
            "{id}: {r:?}"
        );
    }
    // A failure with a code, for the error panels: an exec with no sandbox to run in.
    c.submit(&exec("bad", job, "t-none", &["true"], 1, 1))
        .await?;
    let r = c.result(&ActionId::new("bad")?, T).await?;
    assert!(matches!(r.outcome, Outcome::Rejected { .. }), "{r:?}");
    c.submit(&close("c1", job, "t1")).await?;
    c.result(&ActionId::new("c1")?, T).await?;

    let prom = Prometheus::start(&[
        ("tangram-scheduler", vec![format!("127.0.0.1:{sched_m}")]),
        (
            "tangram-worker",
            vec![format!("127.0.0.1:{cpu_m}"), format!("127.0.0.1:{gpu_m}")],
        ),
    ])?;
    let dashboard = dashboard_exprs()?;
    let alerts = alert_exprs()?;
    let mut wanted: Vec<String> = dashboard
        .iter()
        .chain(&alerts)
        .flat_map(|e| selectors(e))
        .collect();
    wanted.sort();
    wanted.dedup();
    assert!(wanted.len() > 25, "selectors found: {wanted:?}");
    // Scraped: every selector matches a series (Prometheus scrapes every second).
    let mut missing = wanted.clone();
    let scraped = eventually(T, || {
        missing.retain(|s| prom.series(s).map_or(true, |n| n == 0));
        missing.is_empty()
    })
    .await;
    assert!(scraped, "no series in Prometheus for {missing:?}");
    // Every target is up, with its build. One scrape on a loaded two-core machine can
    // miss its one-second timeout, so this waits for a round in which all three answer.
    let mut last = (serde_json::Value::Null, serde_json::Value::Null);
    let all_up = eventually(T, || {
        let count = |q: &str, slot: &mut serde_json::Value| {
            let v = prom.query(q).unwrap_or_default();
            let n = v["result"].as_array().map(Vec::len);
            *slot = v;
            n
        };
        let up = count("up{deployment=\"test\"} == 1", &mut last.0);
        let builds = count("tangram_build_info", &mut last.1);
        up == Some(3) && builds == Some(3)
    })
    .await;
    assert!(all_up, "up: {} builds: {}", last.0, last.1);
    // Every dashboard query is valid PromQL and the rules evaluate cleanly.
    for e in &dashboard {
        prom.query(e)
            .with_context(|| format!("dashboard query {e}"))?;
    }
    let mut bad = Vec::new();
    let evaluated = eventually(T, || {
        let Ok(rules) = prom.api("/api/v1/rules") else {
            return false;
        };
        let all: Vec<&serde_json::Value> = rules["groups"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|g| g["rules"].as_array().into_iter().flatten())
            .collect();
        bad = all
            .iter()
            .filter(|r| r["health"] != "ok")
            .map(|r| format!("{}: {} {}", r["name"], r["health"], r["lastError"]))
            .collect();
        all.len() == alerts.len() && bad.is_empty()
    })
    .await;
    assert!(evaluated, "rules not all evaluated cleanly: {bad:?}");
    Ok(())
}
