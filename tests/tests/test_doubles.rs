//! The test doubles that figures are measured through (the reference replica, the search
//! stand-in, the rate-limited API server) must not add latency of their own.
//!
//! Regression: each wrote a response as headers then body, two small segments; on a reused
//! (keep-alive) connection the second waited for the client's delayed ACK under Nagle's
//! algorithm, and every request took ~40 ms instead of ~1 ms. Every reward and api figure
//! carried those 40 ms. The median over 20 requests on one connection must stay far below the
//! delayed-ACK timer.

use anyhow::{bail, Context as _};
use std::io::BufRead as _;
use std::process::{Command, Stdio};
use std::time::Duration;
use tangram_tests::api_server::RateLimitedApi;
use tangram_tests::{repo_root, ChildGuard};
use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _, BufReader};
use tokio::net::TcpStream;
use tokio::time::Instant;

const REQUESTS: usize = 20;
/// Far below Linux's 40 ms minimum delayed-ACK timer, far above a loopback round trip.
const LIMIT: Duration = Duration::from_millis(10);
const T: Duration = Duration::from_secs(10);

/// Starts a Python double with `--port 0` and returns it with the port it reports when ready.
fn start_python(script: &str, args: &[&str]) -> anyhow::Result<(ChildGuard, u16)> {
    let mut child = ChildGuard(
        Command::new("python3")
            .arg(repo_root().join(script))
            .args(["--port", "0"])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .with_context(|| format!("starting python3 {script}"))?,
    );
    let stdout = child.0.stdout.take().context("stdout")?;
    let mut line = String::new();
    std::io::BufReader::new(stdout).read_line(&mut line)?;
    let ready: serde_json::Value =
        serde_json::from_str(&line).with_context(|| format!("{script} ready line {line:?}"))?;
    let port = ready["port"].as_u64().context("port in the ready line")? as u16;
    Ok((child, port))
}

/// Sends `REQUESTS` requests on one keep-alive connection; returns the median latency.
async fn median_on_one_connection(
    port: u16,
    method: &str,
    path: &str,
    body: &str,
) -> anyhow::Result<Duration> {
    let mut conn = BufReader::new(TcpStream::connect(("127.0.0.1", port)).await?);
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let mut took = Vec::with_capacity(REQUESTS);
    for _ in 0..REQUESTS {
        let t = Instant::now();
        tokio::time::timeout(T, async {
            conn.get_mut().write_all(request.as_bytes()).await?;
            let mut status = String::new();
            conn.read_line(&mut status).await?;
            if !status.starts_with("HTTP/1.1 2") {
                bail!("{method} {path}: {status:?}");
            }
            let mut len = 0usize;
            loop {
                let mut h = String::new();
                if conn.read_line(&mut h).await? == 0 {
                    bail!("connection closed in the headers");
                }
                let h = h.trim_end();
                if h.is_empty() {
                    break;
                }
                if let Some((k, v)) = h.split_once(':') {
                    if k.eq_ignore_ascii_case("content-length") {
                        len = v.trim().parse()?;
                    }
                }
            }
            let mut buf = vec![0u8; len];
            conn.read_exact(&mut buf).await?;
            anyhow::Ok(())
        })
        .await
        .context("request timed out")??;
        took.push(t.elapsed());
    }
    took.sort();
    Ok(took[REQUESTS / 2])
}

#[tokio::test]
async fn search_standin_keep_alive_requests_do_not_wait_for_delayed_acks() -> anyhow::Result<()> {
    let (_server, port) = start_python(
        "services/search-standin/search.py",
        &["--rate", "1000", "--burst", "100"],
    )?;
    let median = median_on_one_connection(port, "GET", "/search?q=sorted&k=3", "").await?;
    assert!(median < LIMIT, "median {median:?} per keep-alive request");
    Ok(())
}

#[tokio::test]
async fn reference_replica_keep_alive_requests_do_not_wait_for_delayed_acks() -> anyhow::Result<()>
{
    let (_replica, port) = start_python(
        "services/reference-replica/replica.py",
        &[
            "--service",
            "keepalive",
            "--vocab",
            "256",
            "--dim",
            "4",
            "--awake",
        ],
    )?;
    let median =
        median_on_one_connection(port, "POST", "/score", r#"{"inputs": ["def f(): pass"]}"#)
            .await?;
    assert!(median < LIMIT, "median {median:?} per keep-alive request");
    Ok(())
}

#[tokio::test]
async fn rate_limited_api_keep_alive_requests_do_not_wait_for_delayed_acks() -> anyhow::Result<()> {
    let server = RateLimitedApi::start(10_000.0, 100.0, Duration::ZERO).await?;
    let port: u16 = server
        .url
        .rsplit_once(':')
        .and_then(|(_, p)| p.parse().ok())
        .context("port in the server's url")?;
    let median = median_on_one_connection(port, "GET", "/search?job=j", "").await?;
    assert!(median < LIMIT, "median {median:?} per keep-alive request");
    Ok(())
}
