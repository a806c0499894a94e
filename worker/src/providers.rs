//! External API providers: the worker makes `api` calls with the fleet's credentials (an
//! environment variable or file on the worker; rollouts never send or see them), within the
//! provider's allow-list, concurrency cap and timeout, and returns the status, the allowed
//! reply headers and the body (capped).
//!
//! The scheduler admits calls under the provider's pooled quota; the checks here are the
//! second line (a worker never exceeds its own concurrency cap, never calls outside the
//! allow-list, whatever it is sent).

use crate::pacer::Pacer;
use futures::future::BoxFuture;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tangram_shared::{Api, HttpReply, ProviderReport};
use tokio::time::Instant;

/// What the worker needs from whatever makes its `api` calls. [`Providers`] calls the real
/// providers over HTTP; [`FakeProviders`] answers from memory, for tests.
pub trait ApiCaller: Send + Sync + std::fmt::Debug {
    /// The providers this worker offers (its fingerprint, carried by the heartbeat).
    fn report(&self) -> Vec<ProviderReport>;

    /// Makes one call within the allow-list, the worker's concurrency cap and `timeout`.
    fn call<'a>(
        &'a self,
        api: &'a Api,
        timeout: Duration,
    ) -> BoxFuture<'a, Result<Called, CallError>>;
}

/// One `[[provider]]` entry of the worker's config.
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct ProviderConfig {
    /// Name `api` actions use.
    pub name: String,
    /// Base URL; an action's path is appended (`https://api.example.com/v1`).
    pub base_url: String,
    /// Environment variable on the worker holding the credential.
    #[serde(default)]
    pub credential_env: Option<String>,
    /// Or a file on the worker holding it (first line).
    #[serde(default)]
    pub credential_file: Option<PathBuf>,
    /// Header that carries the credential.
    #[serde(default = "auth_header")]
    pub auth_header: String,
    /// Prefix before the credential in that header.
    #[serde(default = "auth_prefix")]
    pub auth_prefix: String,
    /// Requests per second for the whole fleet.
    pub rate_per_s: f64,
    /// Burst, requests.
    #[serde(default = "one")]
    pub burst: u32,
    /// Requests in flight at most (fleet-wide, enforced by the scheduler; this worker also
    /// never exceeds it on its own).
    #[serde(default = "conc")]
    pub concurrency: u32,
    /// Per-request timeout, ms (the action's own timeout applies too).
    #[serde(default = "timeout")]
    pub timeout_ms: u64,
    /// Replies slower than this make the scheduler back off, like a 429, ms.
    #[serde(default)]
    pub slow_ms: Option<u64>,
    /// What may be called: `"GET /search"`, `"POST /v1/*"` (a trailing `*` matches the rest).
    pub allow: Vec<String>,
    /// Request headers rollouts may set.
    #[serde(default)]
    pub allow_headers: Vec<String>,
    /// Reply headers passed back to the rollout.
    #[serde(default = "reply_headers")]
    pub reply_headers: Vec<String>,
    /// Reply bodies are cut at this many bytes.
    #[serde(default = "max_body")]
    pub max_body_bytes: usize,
}

fn auth_header() -> String {
    "Authorization".into()
}
fn auth_prefix() -> String {
    "Bearer ".into()
}
fn one() -> u32 {
    1
}
fn conc() -> u32 {
    16
}
fn timeout() -> u64 {
    30_000
}
fn reply_headers() -> Vec<String> {
    vec!["content-type".into(), "retry-after".into()]
}
fn max_body() -> usize {
    1 << 20
}

impl ProviderConfig {
    /// Checks the entry.
    pub fn check(&self) -> Result<(), String> {
        let n = &self.name;
        if n.is_empty() || n.len() > 128 {
            return Err("provider.name must have 1 to 128 characters".into());
        }
        if !(self.base_url.starts_with("http://") || self.base_url.starts_with("https://")) {
            return Err(format!(
                "provider {n:?}: base_url must start with http:// or https://"
            ));
        }
        if !(self.rate_per_s > 0.0 && self.rate_per_s.is_finite()) {
            return Err(format!("provider {n:?}: rate_per_s must be above 0"));
        }
        if self.burst == 0 || self.concurrency == 0 {
            return Err(format!(
                "provider {n:?}: burst and concurrency must be at least 1"
            ));
        }
        if self.allow.is_empty() {
            return Err(format!(
                "provider {n:?}: allow is empty, so nothing could be called"
            ));
        }
        for rule in &self.allow {
            match rule.split_once(' ') {
                Some((m, p)) if !m.is_empty() && p.starts_with('/') => {}
                _ => {
                    return Err(format!(
                        "provider {n:?}: allow rule {rule:?} is not \"METHOD /path\""
                    ))
                }
            }
        }
        if self.credential_env.is_some() && self.credential_file.is_some() {
            return Err(format!(
                "provider {n:?}: credential_env and credential_file are alternatives"
            ));
        }
        Ok(())
    }

    /// What the heartbeat says (never the credential).
    pub fn report(&self) -> ProviderReport {
        ProviderReport {
            name: self.name.clone(),
            rate_per_s: self.rate_per_s,
            burst: self.burst,
            concurrency: self.concurrency,
            allow: self.allow.clone(),
            allow_headers: self
                .allow_headers
                .iter()
                .map(|h| h.to_ascii_lowercase())
                .collect(),
            slow_ms: self.slow_ms,
        }
    }

    fn credential(&self) -> Result<Option<String>, CallError> {
        if let Some(var) = &self.credential_env {
            return std::env::var(var)
                .map(Some)
                .map_err(|_| CallError::Credential {
                    provider: self.name.clone(),
                    why: format!("credential variable {var} is not set on this worker"),
                    source: None,
                });
        }
        if let Some(path) = &self.credential_file {
            let text = std::fs::read_to_string(path).map_err(|e| CallError::Credential {
                provider: self.name.clone(),
                why: format!("reading its credential file {}", path.display()),
                source: Some(e),
            })?;
            return Ok(text.lines().next().map(|l| l.trim().to_string()));
        }
        Ok(None)
    }
}

/// Why a call did not produce a reply.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// No such provider on this worker.
    #[error("this worker has no provider named {0:?}")]
    Unknown(String),
    /// Outside the allow-list.
    #[error("{0}")]
    NotAllowed(String),
    /// The provider did not answer in time.
    #[error("the provider did not answer within {0} ms")]
    Timeout(u64),
    /// The credential is missing on this worker.
    #[error("provider {provider:?}: {why}")]
    Credential {
        /// Which provider.
        provider: String,
        /// What is missing.
        why: String,
        /// The underlying failure, when there is one.
        #[source]
        source: Option<std::io::Error>,
    },
    /// The provider could not be reached, or its reply could not be read.
    #[error("calling provider {provider:?}")]
    Unreachable {
        /// Which provider.
        provider: String,
        /// Why.
        #[source]
        source: reqwest::Error,
    },
}

/// The worker's providers.
#[derive(Debug)]
pub struct Providers {
    /// Each provider with its concurrency slots and the pacing of its calls.
    providers: BTreeMap<String, (ProviderConfig, Arc<tokio::sync::Semaphore>, Arc<Pacer>)>,
    http: reqwest::Client,
}

/// A finished call.
#[derive(Debug)]
pub struct Called {
    /// The reply.
    pub reply: HttpReply,
    /// Time waiting for this worker's own concurrency slot, µs.
    pub wait_us: u64,
    /// The call itself, µs.
    pub call_us: u64,
}

impl Providers {
    /// Builds the set.
    pub fn new(configs: Vec<ProviderConfig>) -> Self {
        Self {
            providers: configs
                .into_iter()
                .map(|c| {
                    let sem = Arc::new(tokio::sync::Semaphore::new(c.concurrency as usize));
                    let pacer = Arc::new(Pacer::for_provider(c.rate_per_s, c.burst));
                    (c.name.clone(), (c, sem, pacer))
                })
                .collect(),
            http: reqwest::Client::builder()
                .connect_timeout(Duration::from_secs(5))
                // Small requests and replies: never wait on Nagle's algorithm.
                .tcp_nodelay(true)
                .redirect(reqwest::redirect::Policy::none())
                .build()
                .expect("building the HTTP client"),
        }
    }

    async fn call_one(&self, api: &Api, timeout: Duration) -> Result<Called, CallError> {
        let (c, sem, pacer) = self
            .providers
            .get(&api.provider)
            .ok_or_else(|| CallError::Unknown(api.provider.clone()))?;
        let report = c.report();
        // The same check the scheduler made before admitting it (a worker never trusts that).
        report.permits(api).map_err(CallError::NotAllowed)?;
        let method = reqwest::Method::from_bytes(api.method.as_bytes()).map_err(|_| {
            CallError::NotAllowed(format!("{:?} is not an HTTP method", api.method))
        })?;
        let credential = c.credential()?;
        let w0 = Instant::now();
        // The semaphore is never closed: it lives as long as the provider.
        let _slot = sem
            .acquire()
            .await
            .expect("provider semaphores are never closed");
        // Admitted calls that reach this worker bunched together leave spaced out.
        pacer.wait().await;
        let wait_us = w0.elapsed().as_micros() as u64;
        let url = format!("{}{}", c.base_url.trim_end_matches('/'), api.path);
        let mut req = self.http.request(method, &url).query(&api.query);
        for (k, v) in &api.headers {
            req = req.header(k.as_str(), v.as_str());
        }
        if let Some(cred) = credential {
            req = req.header(c.auth_header.as_str(), format!("{}{cred}", c.auth_prefix));
        }
        if let Some(body) = &api.body {
            req = req.body(body.clone());
        }
        let limit = timeout.min(Duration::from_millis(c.timeout_ms));
        let t0 = Instant::now();
        let exchange = async {
            let resp = req.send().await?;
            let status = resp.status().as_u16();
            let mut headers = BTreeMap::new();
            for name in &c.reply_headers {
                if let Some(v) = resp
                    .headers()
                    .get(name.as_str())
                    .and_then(|v| v.to_str().ok())
                {
                    headers.insert(name.to_ascii_lowercase(), v.to_string());
                }
            }
            let mut body = Vec::new();
            let mut truncated = false;
            let mut resp = resp;
            while let Some(chunk) = resp.chunk().await? {
                let room = c.max_body_bytes.saturating_sub(body.len());
                if chunk.len() > room {
                    body.extend_from_slice(&chunk[..room]);
                    truncated = true;
                    break;
                }
                body.extend_from_slice(&chunk);
            }
            Ok::<_, reqwest::Error>(HttpReply {
                status,
                headers,
                body: String::from_utf8_lossy(&body).into_owned(),
                truncated,
            })
        };
        match tokio::time::timeout(limit, exchange).await {
            Err(_) => Err(CallError::Timeout(limit.as_millis() as u64)),
            Ok(Err(source)) => Err(CallError::Unreachable {
                provider: api.provider.clone(),
                source,
            }),
            Ok(Ok(reply)) => Ok(Called {
                reply,
                wait_us,
                call_us: t0.elapsed().as_micros() as u64,
            }),
        }
    }
}

impl ApiCaller for Providers {
    fn report(&self) -> Vec<ProviderReport> {
        self.providers
            .values()
            .map(|(c, _, _)| c.report())
            .collect()
    }

    fn call<'a>(
        &'a self,
        api: &'a Api,
        timeout: Duration,
    ) -> BoxFuture<'a, Result<Called, CallError>> {
        Box::pin(self.call_one(api, timeout))
    }
}

/// Providers that answer from memory: every allowed call gets `status` with an empty body
/// after `latency` of tokio time (tests on paused time control it). The allow-list is the
/// configs', as with real providers.
#[derive(Debug)]
pub struct FakeProviders {
    configs: Vec<ProviderConfig>,
    status: u16,
    latency: Duration,
    calls: std::sync::atomic::AtomicU64,
}

impl FakeProviders {
    /// Fake providers answering `status` after `latency`.
    pub fn new(configs: Vec<ProviderConfig>, status: u16, latency: Duration) -> Self {
        Self {
            configs,
            status,
            latency,
            calls: Default::default(),
        }
    }

    /// Calls answered so far.
    pub fn calls(&self) -> u64 {
        self.calls.load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl ApiCaller for FakeProviders {
    fn report(&self) -> Vec<ProviderReport> {
        self.configs.iter().map(ProviderConfig::report).collect()
    }

    fn call<'a>(
        &'a self,
        api: &'a Api,
        timeout: Duration,
    ) -> BoxFuture<'a, Result<Called, CallError>> {
        Box::pin(async move {
            let c = self
                .configs
                .iter()
                .find(|c| c.name == api.provider)
                .ok_or_else(|| CallError::Unknown(api.provider.clone()))?;
            c.report().permits(api).map_err(CallError::NotAllowed)?;
            let limit = timeout.min(Duration::from_millis(c.timeout_ms));
            if self.latency > limit {
                tokio::time::sleep(limit).await;
                return Err(CallError::Timeout(limit.as_millis() as u64));
            }
            tokio::time::sleep(self.latency).await;
            self.calls
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            Ok(Called {
                reply: HttpReply {
                    status: self.status,
                    headers: BTreeMap::new(),
                    body: String::new(),
                    truncated: false,
                },
                wait_us: 0,
                call_us: self.latency.as_micros() as u64,
            })
        })
    }
}
