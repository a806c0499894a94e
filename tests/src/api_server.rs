//! A local stand-in for a rate-limited web API, started by a test: it enforces its own token
//! bucket and counts violations (requests beyond it), tracks concurrency, records which job
//! each request came for and the credential it carried, and can be switched to answer 429
//! above a lower rate (a provider that tightens its limit).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpListener;
use tokio::time::Instant;

/// One request seen.
#[derive(Debug, Clone)]
pub struct Seen {
    /// When it arrived, since the server started.
    pub at: Duration,
    /// The `job` query parameter.
    pub job: String,
    /// HTTP status answered.
    pub status: u16,
    /// The `Authorization` header.
    pub auth: Option<String>,
    /// Method and path.
    pub target: String,
}

#[derive(Debug)]
struct Bucket {
    rate: f64,
    burst: f64,
    tokens: f64,
    at: Instant,
}

impl Bucket {
    fn new(rate: f64, burst: f64) -> Self {
        Self {
            rate,
            burst,
            tokens: burst,
            at: Instant::now(),
        }
    }
    fn take(&mut self) -> bool {
        let now = Instant::now();
        self.tokens =
            (self.tokens + now.duration_since(self.at).as_secs_f64() * self.rate).min(self.burst);
        self.at = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

#[derive(Debug)]
struct State {
    bucket: Bucket,
    strict: Option<Bucket>,
    inflight: u32,
    max_inflight: u32,
    violations: u64,
    seen: Vec<Seen>,
}

/// A provider `search` at `url` allowing `GET /search`, with this quota; no credential, a
/// 5 s timeout, 64 KiB bodies. Tests change the fields they care about.
pub fn search_provider(
    url: &str,
    rate_per_s: f64,
    burst: u32,
    concurrency: u32,
) -> tangram_worker::providers::ProviderConfig {
    tangram_worker::providers::ProviderConfig {
        name: "search".into(),
        base_url: url.into(),
        credential_env: None,
        credential_file: None,
        auth_header: "Authorization".into(),
        auth_prefix: "Bearer ".into(),
        rate_per_s,
        burst,
        concurrency,
        timeout_ms: 5_000,
        slow_ms: None,
        allow: vec!["GET /search".into()],
        allow_headers: vec![],
        reply_headers: vec!["content-type".into()],
        max_body_bytes: 1 << 16,
    }
}

/// The server.
#[derive(Debug, Clone)]
pub struct RateLimitedApi {
    /// Its base URL (`http://127.0.0.1:PORT`).
    pub url: String,
    state: Arc<Mutex<State>>,
    started: Instant,
}

impl RateLimitedApi {
    /// Starts a server allowing `rate` requests/s with `burst`, answering after `delay`.
    pub async fn start(rate: f64, burst: f64, delay: Duration) -> anyhow::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}", listener.local_addr()?);
        let state = Arc::new(Mutex::new(State {
            bucket: Bucket::new(rate, burst),
            strict: None,
            inflight: 0,
            max_inflight: 0,
            violations: 0,
            seen: Vec::new(),
        }));
        let started = Instant::now();
        let st = state.clone();
        tokio::spawn(async move {
            while let Ok((sock, _)) = listener.accept().await {
                let st = st.clone();
                tokio::spawn(async move {
                    let _ = serve(sock, st, started, delay).await;
                });
            }
        });
        Ok(Self {
            url,
            state,
            started,
        })
    }

    /// From now on, answer 429 to requests beyond `rate` requests/s (burst 1); `None` lifts it.
    pub fn tighten(&self, rate: Option<f64>) {
        self.state.lock().expect("lock").strict = rate.map(|r| Bucket::new(r, 1.0));
    }

    /// Requests beyond the configured bucket.
    pub fn violations(&self) -> u64 {
        self.state.lock().expect("lock").violations
    }

    /// Most requests in flight at once.
    pub fn max_inflight(&self) -> u32 {
        self.state.lock().expect("lock").max_inflight
    }

    /// Every request seen, in arrival order.
    pub fn seen(&self) -> Vec<Seen> {
        self.state.lock().expect("lock").seen.clone()
    }

    /// Time since the server started.
    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    /// Requests per job in the first `n` requests.
    pub fn share(&self, n: usize) -> BTreeMap<String, usize> {
        let mut out = BTreeMap::new();
        for s in self.seen().into_iter().take(n) {
            *out.entry(s.job).or_default() += 1;
        }
        out
    }
}

async fn serve(
    sock: tokio::net::TcpStream,
    st: Arc<Mutex<State>>,
    started: Instant,
    delay: Duration,
) -> anyhow::Result<()> {
    sock.set_nodelay(true)?;
    let (r, mut w) = sock.into_split();
    let mut r = BufReader::new(r);
    loop {
        let mut line = String::new();
        if r.read_line(&mut line).await? == 0 {
            return Ok(());
        }
        let target = line
            .trim()
            .rsplit_once(' ')
            .map(|(a, _)| a.to_string())
            .unwrap_or_default();
        let mut len = 0usize;
        let mut auth = None;
        loop {
            let mut h = String::new();
            r.read_line(&mut h).await?;
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            if let Some((k, v)) = h.split_once(':') {
                match k.to_ascii_lowercase().as_str() {
                    "content-length" => len = v.trim().parse().unwrap_or(0),
                    "authorization" => auth = Some(v.trim().to_string()),
                    _ => {}
                }
            }
        }
        let mut body = vec![0u8; len];
        r.read_exact(&mut body).await?;
        let job = target
            .split_once('?')
            .and_then(|(_, q)| q.split('&').find_map(|kv| kv.strip_prefix("job=")))
            .unwrap_or("")
            .to_string();
        let status = {
            let mut s = st.lock().expect("lock");
            let status = if !s.bucket.take() {
                s.violations += 1;
                429
            } else if s.strict.as_mut().is_some_and(|b| !b.take()) {
                429
            } else {
                200
            };
            if status == 200 {
                s.inflight += 1;
                s.max_inflight = s.max_inflight.max(s.inflight);
            }
            s.seen.push(Seen {
                at: started.elapsed(),
                job: job.clone(),
                status,
                auth,
                target: target.clone(),
            });
            status
        };
        if status == 200 {
            tokio::time::sleep(delay).await;
            st.lock().expect("lock").inflight -= 1;
        }
        let body = if status == 200 {
            format!("{{\"job\": \"{job}\", \"hits\": [\"result for {target}\"]}}")
        } else {
            "{\"error\": \"rate limited\"}".to_string()
        };
        let head = format!(
            "HTTP/1.1 {status} {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nX-Internal: secret-routing\r\n\r\n",
            if status == 200 { "OK" } else { "Too Many Requests" },
            body.len()
        );
        // One write per response: headers and body in separate segments waited ~40 ms for
        // the client's delayed ACK on a reused connection (Nagle's algorithm).
        w.write_all((head + &body).as_bytes()).await?;
        w.flush().await?;
    }
}
