//! The serving engines' own HTTP APIs: health, sleep and wake, and scoring, per [`Driver`].

use super::{Driver, Replica, ServiceConfig};
use std::collections::BTreeMap;
use std::time::Duration;

/// A replica or its engine failed.
#[derive(Debug, thiserror::Error)]
pub enum ReplicaError {
    /// The request did not get a reply.
    #[error("{call}")]
    Http {
        /// The call, as `METHOD /path`.
        call: String,
        /// Why.
        #[source]
        source: reqwest::Error,
    },
    /// The engine answered with an error status.
    #[error("{call}: HTTP {status}: {body}")]
    Status {
        /// The call.
        call: String,
        /// Its status.
        status: u16,
        /// The reply.
        body: String,
    },
    /// The reply does not say what the call asked.
    #[error("{call}: {why}")]
    Reply {
        /// The call.
        call: String,
        /// What is missing.
        why: String,
    },
    /// The replica process could not be started.
    #[error("starting a replica of {service:?} ({command})")]
    Spawn {
        /// Which service.
        service: String,
        /// The command line.
        command: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The replica container could not be started.
    #[error("starting a replica container of {service:?}")]
    Container {
        /// Which service.
        service: String,
        /// Why.
        #[source]
        source: crate::docker::DockerError,
    },
    /// The process ended while starting.
    #[error("replica of {service:?} on GPUs {gpus:?} exited during start")]
    Exited {
        /// Which service.
        service: String,
        /// Its GPUs.
        gpus: Vec<u32>,
    },
    /// The process never answered its health check.
    #[error("replica of {service:?} did not answer /health within {ms} ms")]
    StartTimeout {
        /// Which service.
        service: String,
        /// The start timeout.
        ms: u64,
    },
    /// No GPU group of this worker is large enough.
    #[error("service {service:?} needs {gpus} GPUs per replica; no GPU group of this worker is that large")]
    NoChunk {
        /// Which service.
        service: String,
        /// GPUs per replica.
        gpus: u8,
    },
    /// The route names GPUs the worker does not have.
    #[error("{0}")]
    Route(String),
    /// The worker's own files (state directory, a free port).
    #[error("{what}")]
    Local {
        /// What was being done.
        what: String,
        /// Why it failed.
        #[source]
        source: std::io::Error,
    },
}

impl ReplicaError {
    /// True when the request certainly never reached the replica (the connection was not
    /// made), so sending it again cannot make a second effect.
    pub(super) fn never_sent(&self) -> bool {
        matches!(self, Self::Http { source, .. } if source.is_connect())
    }
}

/// One JSON request to a replica; a status other than 2xx is an error naming the call.
pub(super) async fn exchange(
    http: &reqwest::Client,
    r: &Replica,
    method: reqwest::Method,
    path: &str,
    body: Option<serde_json::Value>,
    timeout: Duration,
) -> Result<serde_json::Value, ReplicaError> {
    let call = format!("{method} {path}");
    let mut req = http
        .request(method, format!("{}{path}", r.base()))
        .timeout(timeout);
    if let Some(body) = &body {
        req = req.json(body);
    }
    let resp = req.send().await.map_err(|source| ReplicaError::Http {
        call: call.clone(),
        source,
    })?;
    let status = resp.status();
    let v = resp
        .json::<serde_json::Value>()
        .await
        .unwrap_or(serde_json::Value::Null);
    if !status.is_success() {
        return Err(ReplicaError::Status {
            call,
            status: status.as_u16(),
            body: v.to_string(),
        });
    }
    Ok(v)
}

pub(super) async fn get_json(
    http: &reqwest::Client,
    r: &Replica,
    path: &str,
) -> Result<serde_json::Value, ReplicaError> {
    exchange(
        http,
        r,
        reqwest::Method::GET,
        path,
        None,
        Duration::from_secs(5),
    )
    .await
}

async fn post(
    http: &reqwest::Client,
    r: &Replica,
    path: &str,
    body: serde_json::Value,
    timeout: Duration,
) -> Result<serde_json::Value, ReplicaError> {
    exchange(http, r, reqwest::Method::POST, path, Some(body), timeout).await
}

pub(super) async fn is_sleeping(
    http: &reqwest::Client,
    d: Driver,
    r: &Replica,
) -> Result<bool, ReplicaError> {
    match d {
        Driver::Vllm | Driver::Reference => Ok(get_json(http, r, "/is_sleeping").await?
            ["is_sleeping"]
            .as_bool()
            .unwrap_or(false)),
        // SGLang has no query for it; the worker's own record is the truth.
        Driver::Sglang => Ok(!r.is_awake()),
    }
}

pub(super) async fn sleep(
    http: &reqwest::Client,
    d: Driver,
    r: &Replica,
) -> Result<(), ReplicaError> {
    let t = Duration::from_secs(120);
    let path = match d {
        Driver::Vllm | Driver::Reference => "/sleep?level=1",
        Driver::Sglang => "/release_memory_occupation",
    };
    post(http, r, path, serde_json::json!({}), t).await?;
    r.set_awake(false);
    Ok(())
}

pub(super) async fn wake(
    http: &reqwest::Client,
    d: Driver,
    r: &Replica,
) -> Result<(), ReplicaError> {
    let t = Duration::from_secs(300);
    let path = match d {
        Driver::Vllm | Driver::Reference => "/wake_up",
        Driver::Sglang => "/resume_memory_occupation",
    };
    post(http, r, path, serde_json::json!({}), t).await?;
    r.set_awake(true);
    Ok(())
}

pub(super) async fn score(
    http: &reqwest::Client,
    c: &ServiceConfig,
    r: &Replica,
    inputs: &[String],
    options: &BTreeMap<String, String>,
    timeout: Duration,
) -> Result<Vec<f64>, ReplicaError> {
    let model = options.get("model").cloned().or_else(|| c.model.clone());
    // Each engine's scoring call, where its reply lists the items, and where an item's
    // score is (the last number in that field).
    let (path, body) = match c.driver {
        Driver::Reference => (
            "/score",
            serde_json::json!({"inputs": inputs, "options": options}),
        ),
        Driver::Vllm => (
            "/pooling",
            serde_json::json!({"model": model, "input": inputs}),
        ),
        Driver::Sglang => (
            "/classify",
            serde_json::json!({"model": model, "text": inputs}),
        ),
    };
    let v = post(http, r, path, body, timeout).await?;
    let (items, field) = match c.driver {
        Driver::Reference => (&v["scores"], None),
        Driver::Vllm => (&v["data"], Some("data")),
        Driver::Sglang => (&v, Some("embedding")),
    };
    let bad = |why: String| ReplicaError::Reply {
        call: format!("POST {path}"),
        why,
    };
    let items = items
        .as_array()
        .ok_or_else(|| bad(format!("the reply lists no scores: {v}")))?;
    items
        .iter()
        .map(|d| {
            let x = field.map_or(d, |f| &d[f]);
            last_number(x).ok_or_else(|| bad(format!("no score in {d}")))
        })
        .collect()
}

fn last_number(v: &serde_json::Value) -> Option<f64> {
    match v {
        serde_json::Value::Number(n) => n.as_f64(),
        serde_json::Value::Array(a) => a.iter().rev().find_map(last_number),
        _ => None,
    }
}
