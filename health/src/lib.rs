//! Health endpoints for probes (Docker health checks, Kubernetes, load balancers, systemd
//! watchdogs written as scripts): `GET /healthz` answers 200 while the process serves, and
//! `GET /readyz` answers 200 when it is ready for work and 503 when not, each with a small
//! JSON body saying why. Plain HTTP/1.1 on a local address, one request per connection,
//! bounded in size and time, so a probe can never hold the process.
#![forbid(unsafe_code)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

/// Whether the process is ready, and what a person reading the probe should know.
#[derive(Debug, Clone, PartialEq)]
pub struct Readiness {
    /// Ready for work.
    pub ready: bool,
    /// The body's fields (for example the role, the NATS connection, why not ready).
    pub detail: serde_json::Value,
}

/// Asked on every `/readyz` (and for the body of `/healthz`); must be quick.
pub type Check = Arc<dyn Fn() -> Readiness + Send + Sync>;

/// The largest request read.
const MAX_REQUEST: usize = 8 * 1024;
/// How long a connection may take to send its request.
const READ_WITHIN: Duration = Duration::from_secs(2);

/// Binds `addr` (fails at once if it cannot) and serves until `stop`.
pub async fn serve(
    addr: SocketAddr,
    check: Check,
    stop: CancellationToken,
) -> std::io::Result<tokio::task::JoinHandle<()>> {
    let listener = TcpListener::bind(addr).await?;
    tracing::info!(addr = %listener.local_addr()?, "health endpoints on /healthz and /readyz");
    Ok(tokio::spawn(async move {
        loop {
            let conn = tokio::select! {
                _ = stop.cancelled() => return,
                c = listener.accept() => c,
            };
            match conn {
                Ok((stream, _)) => {
                    let check = check.clone();
                    tokio::spawn(async move {
                        let _ = answer(stream, &check).await;
                    });
                }
                Err(e) => {
                    tracing::warn!(error = %e, "accepting a health probe");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }))
}

async fn answer(mut stream: TcpStream, check: &Check) -> std::io::Result<()> {
    let mut buf = Vec::with_capacity(512);
    let read = tokio::time::timeout(READ_WITHIN, async {
        let mut chunk = [0u8; 1024];
        while !buf.windows(4).any(|w| w == b"\r\n\r\n") && buf.len() < MAX_REQUEST {
            let n = stream.read(&mut chunk).await?;
            if n == 0 {
                break;
            }
            buf.extend_from_slice(&chunk[..n]);
        }
        Ok::<_, std::io::Error>(())
    })
    .await;
    if !matches!(read, Ok(Ok(()))) {
        return Ok(());
    }
    let (status, body) = respond(&buf, check);
    let reason = match status {
        200 => "OK",
        404 => "Not Found",
        405 => "Method Not Allowed",
        _ => "Service Unavailable",
    };
    let body = body.to_string();
    let head = format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(body.as_bytes()).await?;
    stream.shutdown().await
}

/// The status and body for one raw request.
fn respond(request: &[u8], check: &Check) -> (u16, serde_json::Value) {
    let line = request
        .split(|b| *b == b'\n')
        .next()
        .map(|l| String::from_utf8_lossy(l).trim().to_string())
        .unwrap_or_default();
    let mut parts = line.split_whitespace();
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = target.split('?').next().unwrap_or("");
    if method != "GET" && method != "HEAD" {
        return (405, serde_json::json!({"error": "only GET"}));
    }
    match path {
        "/healthz" | "/livez" => {
            let r = check();
            (200, with_status(r.detail, "ok"))
        }
        "/readyz" => {
            let r = check();
            if r.ready {
                (200, with_status(r.detail, "ready"))
            } else {
                (503, with_status(r.detail, "not ready"))
            }
        }
        _ => (
            404,
            serde_json::json!({"error": "no such endpoint; try /healthz or /readyz"}),
        ),
    }
}

fn with_status(mut detail: serde_json::Value, status: &str) -> serde_json::Value {
    if let serde_json::Value::Object(m) = &mut detail {
        m.insert("status".into(), status.into());
        detail
    } else {
        serde_json::json!({"status": status, "detail": detail})
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};

    async fn get(addr: SocketAddr, path: &str) -> (u16, serde_json::Value) {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())
            .await
            .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        let status: u16 = out.split_whitespace().nth(1).unwrap().parse().unwrap();
        let body = out.split("\r\n\r\n").nth(1).unwrap();
        (status, serde_json::from_str(body).unwrap())
    }

    #[tokio::test]
    async fn readyz_follows_the_check_and_healthz_stays_up() {
        let ready = Arc::new(AtomicBool::new(false));
        let r = ready.clone();
        let check: Check = Arc::new(move || Readiness {
            ready: r.load(Ordering::SeqCst),
            detail: serde_json::json!({"role": "worker"}),
        });
        let stop = CancellationToken::new();
        // Port 0 then the bound address: find it through a listener of our own first.
        let probe = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = probe.local_addr().unwrap();
        drop(probe);
        let task = serve(addr, check, stop.clone()).await.unwrap();
        let (s, b) = get(addr, "/readyz").await;
        assert_eq!((s, b["status"].as_str()), (503, Some("not ready")));
        assert_eq!(b["role"], "worker");
        let (s, _) = get(addr, "/healthz").await;
        assert_eq!(s, 200);
        ready.store(true, Ordering::SeqCst);
        let (s, b) = get(addr, "/readyz?verbose").await;
        assert_eq!((s, b["status"].as_str()), (200, Some("ready")));
        let (s, _) = get(addr, "/metrics").await;
        assert_eq!(s, 404);
        stop.cancel();
        task.await.unwrap();
    }

    #[tokio::test]
    async fn a_silent_or_oversized_probe_cannot_hold_the_endpoint() {
        let check: Check = Arc::new(|| Readiness {
            ready: true,
            detail: serde_json::json!({}),
        });
        let stop = CancellationToken::new();
        let probe = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = probe.local_addr().unwrap();
        drop(probe);
        let _task = serve(addr, check, stop.clone()).await.unwrap();
        // One connection says nothing, one sends garbage past the limit; a real probe still
        // gets its answer.
        let _silent = TcpStream::connect(addr).await.unwrap();
        let mut big = TcpStream::connect(addr).await.unwrap();
        let _ = big.write_all(&vec![b'x'; MAX_REQUEST * 2]).await;
        let (s, _) = get(addr, "/healthz").await;
        assert_eq!(s, 200);
        stop.cancel();
    }
}
