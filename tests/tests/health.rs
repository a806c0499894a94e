//! The health endpoints of the scheduler and the worker, as a probe sees them.

use std::process::{Command, Stdio};
use std::time::Duration;
use tangram_tests::{built_binary, free_port, ChildGuard, Cluster};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const T: Duration = Duration::from_secs(60);

/// `GET path` on `port`: the status and the JSON body, or `None` when nothing answers.
async fn probe(port: u16, path: &str) -> Option<(u16, serde_json::Value)> {
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .ok()?;
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: probe\r\n\r\n").as_bytes())
        .await
        .ok()?;
    let mut out = String::new();
    tokio::time::timeout(Duration::from_secs(5), s.read_to_string(&mut out))
        .await
        .ok()?
        .ok()?;
    let status = out.split_whitespace().nth(1)?.parse().ok()?;
    let body = serde_json::from_str(out.split("\r\n\r\n").nth(1)?).ok()?;
    Some((status, body))
}

/// Polls until `path` answers with `status`, and returns the body.
async fn until(port: u16, path: &str, status: u16) -> serde_json::Value {
    let deadline = tokio::time::Instant::now() + T;
    loop {
        if let Some((s, body)) = probe(port, path).await {
            if s == status {
                return body;
            }
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{path} on {port} never answered {status}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_says_ready_while_connected_and_not_when_nats_is_gone() -> anyhow::Result<()> {
    let mut cluster = Cluster::start(&[]).await?;
    let (sp, wp) = (free_port(), free_port());
    let _scheduler = ChildGuard(
        Command::new(built_binary("tangram-scheduler"))
            .args(["--id", "standby-h", "--nats-url", &cluster.nats.url()])
            .args(["--health-addr", &format!("127.0.0.1:{sp}")])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?,
    );
    let raw = tangram_worker::config::RawConfig {
        id: Some("health-a".into()),
        nats_url: Some(cluster.nats.url()),
        cores: Some("0-1".into()),
        mem_mb: Some(1024),
        heartbeat_ms: Some(200),
        shutdown_grace_ms: Some(2000),
        health_addr: Some(format!("127.0.0.1:{wp}")),
        ..Default::default()
    };
    cluster.start_worker_config(raw.validate()?);

    // Two schedulers: whichever this one is, leader or standby, it is ready.
    let body = until(sp, "/readyz", 200).await;
    assert!(
        matches!(body["role"].as_str(), Some("leader" | "standby")),
        "{body}"
    );
    assert_eq!(body["nats"], "connected", "{body}");
    let body = until(wp, "/readyz", 200).await;
    assert_eq!(body["worker"], "health-a", "{body}");
    assert_eq!(body["draining"], false, "{body}");
    assert!(matches!(probe(wp, "/nope").await, Some((404, _))));

    // NATS gone: not ready, still alive.
    cluster.nats.kill();
    for port in [sp, wp] {
        let body = until(port, "/readyz", 503).await;
        assert_eq!(body["nats"], "disconnected", "{body}");
        assert!(matches!(probe(port, "/healthz").await, Some((200, _))));
    }
    // Back: ready again.
    cluster.nats.restart();
    for port in [sp, wp] {
        until(port, "/readyz", 200).await;
    }
    cluster.shutdown().await
}
