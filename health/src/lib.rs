//! Health endpoints for probes (Docker health checks, Kubernetes, load balancers, systemd
//! watchdogs written as scripts): `GET /healthz` answers 200 while the process serves, and
//! `GET /readyz` answers 200 when it is ready for work and 503 when not, each with a small
//! JSON body saying why. HTTP/1.1 (hyper) on a local address, one request per connection,
//! bounded in size and time, so a probe can never hold the process; every connection ends
//! when the server is stopped.
#![forbid(unsafe_code)]

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

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

/// The largest request head read (hyper's smallest allowed read buffer); a larger one is
/// refused and its connection closed.
const MAX_REQUEST: usize = 8 * 1024;
/// How long a connection may take to send its request head.
const READ_WITHIN: Duration = Duration::from_secs(2);
/// How long a connection may stay open in all, whatever it does.
const CONNECTION_WITHIN: Duration = Duration::from_secs(5);

/// Binds `addr` (fails at once if it cannot) and serves until `stop`; the task returns once
/// every open connection has been dropped.
pub async fn serve(
    addr: SocketAddr,
    check: Check,
    stop: CancellationToken,
) -> std::io::Result<tokio::task::JoinHandle<()>> {
    let listener = TcpListener::bind(addr).await?;
    tracing::info!(addr = %listener.local_addr()?, "health endpoints on /healthz and /readyz");
    Ok(tokio::spawn(async move {
        let connections = TaskTracker::new();
        loop {
            let conn = tokio::select! {
                _ = stop.cancelled() => break,
                c = listener.accept() => c,
            };
            match conn {
                Ok((stream, _)) => {
                    connections.spawn(connection(stream, check.clone(), stop.clone()));
                }
                Err(e) => {
                    tracing::warn!(error = %e, "accepting a health probe");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
        connections.close();
        connections.wait().await;
    }))
}

/// Serves one connection: one request, then closed; dropped at `stop` or after
/// [`CONNECTION_WITHIN`].
async fn connection(stream: TcpStream, check: Check, stop: CancellationToken) {
    let service = service_fn(move |req: Request<Incoming>| {
        let answer = respond(req.method(), req.uri().path(), &check);
        async move { Ok::<_, Infallible>(answer) }
    });
    let conn = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(READ_WITHIN)
        .max_buf_size(MAX_REQUEST)
        .keep_alive(false)
        .serve_connection(TokioIo::new(stream), service);
    tokio::select! {
        _ = stop.cancelled() => {}
        served = tokio::time::timeout(CONNECTION_WITHIN, conn) => {
            if let Ok(Err(e)) = served {
                tracing::debug!(error = %e, "a health probe's connection");
            }
        }
    }
}

/// The answer to one request.
fn respond(method: &Method, path: &str, check: &Check) -> Response<Full<Bytes>> {
    let (status, body) = answer(method, path, check);
    let mut response = Response::new(Full::new(Bytes::from(body.to_string())));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

/// The status and body for a method and path.
fn answer(method: &Method, path: &str, check: &Check) -> (StatusCode, serde_json::Value) {
    if method != Method::GET && method != Method::HEAD {
        return (
            StatusCode::METHOD_NOT_ALLOWED,
            serde_json::json!({"error": "only GET"}),
        );
    }
    match path {
        "/healthz" | "/livez" => {
            let r = check();
            (StatusCode::OK, with_status(r.detail, "ok"))
        }
        "/readyz" => {
            let r = check();
            if r.ready {
                (StatusCode::OK, with_status(r.detail, "ready"))
            } else {
                (
                    StatusCode::SERVICE_UNAVAILABLE,
                    with_status(r.detail, "not ready"),
                )
            }
        }
        _ => (
            StatusCode::NOT_FOUND,
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
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// `request` sent raw; the status line's code, the head and the body, read to the close.
    async fn send(addr: SocketAddr, request: &str) -> (u16, String, String) {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(request.as_bytes()).await.unwrap();
        let mut out = String::new();
        tokio::time::timeout(Duration::from_secs(10), s.read_to_string(&mut out))
            .await
            .expect("the server closes the connection after one answer")
            .unwrap();
        let status: u16 = out.split_whitespace().nth(1).unwrap().parse().unwrap();
        let (head, body) = out.split_once("\r\n\r\n").unwrap();
        (status, head.to_string(), body.to_string())
    }

    async fn get(addr: SocketAddr, path: &str) -> (u16, serde_json::Value) {
        let (status, _, body) =
            send(addr, &format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n")).await;
        (status, serde_json::from_str(&body).unwrap())
    }

    async fn started(check: Check) -> (SocketAddr, CancellationToken, tokio::task::JoinHandle<()>) {
        let stop = CancellationToken::new();
        // Port 0 then the bound address: find it through a listener of our own first.
        let probe = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = probe.local_addr().unwrap();
        drop(probe);
        let task = serve(addr, check, stop.clone()).await.unwrap();
        (addr, stop, task)
    }

    fn always_ready() -> Check {
        Arc::new(|| Readiness {
            ready: true,
            detail: serde_json::json!({}),
        })
    }

    #[tokio::test]
    async fn readyz_follows_the_check_and_healthz_stays_up() {
        let ready = Arc::new(AtomicBool::new(false));
        let r = ready.clone();
        let check: Check = Arc::new(move || Readiness {
            ready: r.load(Ordering::SeqCst),
            detail: serde_json::json!({"role": "worker"}),
        });
        let (addr, stop, task) = started(check).await;
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
    async fn answers_are_json_other_methods_are_refused_and_head_has_no_body() {
        let (addr, stop, task) = started(always_ready()).await;
        let (s, head, body) = send(addr, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").await;
        assert_eq!(s, 200);
        let head = head.to_ascii_lowercase();
        assert!(head.contains("content-type: application/json"), "{head}");
        assert!(head.contains("connection: close"), "{head}");
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(&body).unwrap()["status"],
            "ok"
        );
        let (s, _, body) = send(
            addr,
            "POST /readyz HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n",
        )
        .await;
        assert_eq!(s, 405);
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(&body).unwrap()["error"],
            "only GET"
        );
        let (s, _, body) = send(addr, "HEAD /readyz HTTP/1.1\r\nHost: x\r\n\r\n").await;
        assert_eq!((s, body.as_str()), (200, ""));
        stop.cancel();
        task.await.unwrap();
    }

    #[tokio::test]
    async fn a_silent_or_oversized_probe_cannot_hold_the_endpoint() {
        let (addr, stop, task) = started(always_ready()).await;
        // One connection says nothing, one sends garbage past the limit; a real probe still
        // gets its answer.
        let _silent = TcpStream::connect(addr).await.unwrap();
        let mut big = TcpStream::connect(addr).await.unwrap();
        let _ = big.write_all(&vec![b'x'; MAX_REQUEST * 2]).await;
        let (s, _) = get(addr, "/healthz").await;
        assert_eq!(s, 200);
        stop.cancel();
        task.await.unwrap();
    }

    #[tokio::test]
    async fn a_request_head_never_finished_is_dropped_after_the_read_bound() {
        let (addr, stop, task) = started(always_ready()).await;
        let mut slow = TcpStream::connect(addr).await.unwrap();
        slow.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
            .await
            .unwrap();
        let started = tokio::time::Instant::now();
        let mut out = Vec::new();
        // Closed by the server (maybe after a 408), well before the test's own bound.
        tokio::time::timeout(Duration::from_secs(10), slow.read_to_end(&mut out))
            .await
            .expect("the server drops a request head that never ends")
            .unwrap();
        assert!(
            started.elapsed() < READ_WITHIN + Duration::from_secs(2),
            "dropped by the read bound, not the connection bound"
        );
        assert!(!String::from_utf8_lossy(&out).contains(" 200 "), "{out:?}");
        stop.cancel();
        task.await.unwrap();
    }

    #[tokio::test]
    async fn stop_ends_the_server_and_its_open_connections() {
        let (addr, stop, task) = started(always_ready()).await;
        let mut open = TcpStream::connect(addr).await.unwrap();
        open.write_all(b"GET /healthz HTTP/1.1\r\n").await.unwrap();
        // The connection is accepted before the stop (a first probe answered proves the
        // accept loop ran past it).
        let (s, _) = get(addr, "/healthz").await;
        assert_eq!(s, 200);
        stop.cancel();
        tokio::time::timeout(READ_WITHIN / 2, task)
            .await
            .expect("the server stops at once, open connections or not")
            .unwrap();
        let mut out = Vec::new();
        tokio::time::timeout(READ_WITHIN / 2, open.read_to_end(&mut out))
            .await
            .expect("an open connection is closed at the stop")
            .unwrap();
        assert!(
            TcpStream::connect(addr).await.is_err(),
            "nothing listens after the stop"
        );
    }
}
