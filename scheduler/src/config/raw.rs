//! The configuration file as written ([`RawConfig`]: every field optional, unknown fields
//! refused) and its validation into a [`Config`].

use super::{
    Config, ConfigError, DEFAULT_LEASE_TTL_MS, DEFAULT_MAX_ACTION_BYTES,
    DEFAULT_MAX_QUEUED_ACTIONS, DEFAULT_MAX_QUEUED_BYTES, DEFAULT_MAX_SANDBOX_IDLE_TIMEOUT_MS,
    DEFAULT_MAX_TIMEOUT_MS, DEFAULT_MISSED_HEARTBEATS, DEFAULT_NATS_URL, DEFAULT_POLICY,
    DEFAULT_SANDBOX_IDLE_TIMEOUT_MS, DEFAULT_SETTLE_MS,
};
use serde::Deserialize;

use std::path::Path;
use std::time::Duration;

/// The file as written: every field optional, unknown fields refused.
#[derive(Debug, Default, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawConfig {
    /// NATS server URL.
    pub nats_url: Option<String>,
    /// `[nats]`: credentials (nkey seed file) and TLS.
    pub nats: Option<tangram_nats::auth::RawCredentials>,
    /// Prometheus listen address; absent disables the exporter.
    pub metrics_addr: Option<String>,
    /// Health endpoints' listen address (`/healthz`, `/readyz`); absent disables them.
    pub health_addr: Option<String>,
    /// Largest action message accepted, in bytes.
    pub max_action_bytes: Option<u64>,
    /// Longest action timeout accepted, in milliseconds.
    pub max_timeout_ms: Option<u64>,
    /// Action messages held in memory (queued or being dispatched) at most.
    pub max_queued_actions: Option<u64>,
    /// Bytes of action messages held in memory at most.
    pub max_queued_bytes: Option<u64>,
    /// Action messages one job may have queued at most (default: a quarter of
    /// `max_queued_actions`).
    pub max_queued_per_job: Option<u64>,
    /// Bytes of action messages one job may have queued at most (default: a quarter of
    /// `max_queued_bytes`).
    pub max_queued_bytes_per_job: Option<u64>,
    /// Heartbeat periods a worker may miss before it is declared lost.
    pub worker_missed_heartbeats: Option<u32>,
    /// Scheduling policy, by name (see `tangram_core::policies::NAMES`).
    pub policy: Option<String>,
    /// After start, how long to wait for worker heartbeats before rejecting actions as
    /// `no_sandbox` or `unsatisfiable`, in milliseconds.
    pub settle_ms: Option<u64>,
    /// After a worker is lost, how long actions only it could take wait for it to return.
    pub worker_rejoin_ms: Option<u64>,
    /// A sandbox no action used for this long is closed, in milliseconds (0: never).
    pub sandbox_idle_timeout_ms: Option<u64>,
    /// The longest idle timeout an open may ask for, in milliseconds.
    pub max_sandbox_idle_timeout_ms: Option<u64>,
    /// Weights of jobs' shares of external API quota when demand exceeds it (default 1).
    pub job_weights: Option<std::collections::BTreeMap<String, f64>>,
    /// Caps per job (`[job_caps.<job>]`, and `[job_caps."*"]` for every job not listed).
    pub job_caps: Option<std::collections::BTreeMap<String, super::tenancy::RawJobCaps>>,
    /// The fleet's definitions of external API providers' quotas (`[[provider]]`): workers'
    /// declarations must match them.
    pub provider: Option<Vec<super::tenancy::RawProvider>>,
    /// The fleet's definitions of GPU services' sizes and slots (`[[service]]`): workers'
    /// declarations must match them.
    pub service: Option<Vec<super::tenancy::RawService>>,
    /// Cores each trajectory's sandbox holds under the `static` policy.
    pub static_cores: Option<u32>,
    /// This scheduler's id in the leader lease (default: `<host>-<pid>`).
    pub id: Option<String>,
    /// How long the leader lease holds without a renewal, ms: a standby takes over this
    /// long after the leader's last renewal.
    pub lease_ttl_ms: Option<u64>,
    /// `[streams]`: replicas of the streams and the KV bucket (1 on one server, 3 on a
    /// cluster), and `[streams.<name>]` limits. Used when a stream is created; an existing
    /// stream is left as stored (differences are logged).
    pub streams: Option<tangram_nats::streams::StreamSettings>,
    /// `[images]`: image-aware placement of sandbox opens.
    pub images: Option<RawImages>,
}

/// `[images]`: a sandbox open naming an image goes to a worker holding it (or already
/// fetching it) unless the load there costs more than the pull.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawImages {
    /// Prefer workers that hold an open's image (default true); false places opens as if
    /// every worker had every image.
    pub locality: Option<bool>,
    /// A worker's expected pull throughput, MB/s (default 100): an image's pull time is its
    /// advertised size over this.
    pub pull_mb_per_s: Option<f64>,
    /// What one more sandbox per core on a worker is expected to cost a trajectory, ms
    /// (default 60000): the load weighed against a pull.
    pub load_ms: Option<u64>,
}

pub(super) fn invalid(field: &'static str, why: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        field,
        why: why.into(),
    }
}

impl RawConfig {
    /// Reads a TOML file.
    pub fn from_file(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        toml::from_str(&text).map_err(|source| ConfigError::Parse {
            path: path.to_path_buf(),
            source,
        })
    }

    /// Lays `over` on top of `self`: fields set in `over` win.
    pub fn merge(self, over: RawConfig) -> Self {
        Self {
            nats_url: over.nats_url.or(self.nats_url),
            nats: match (self.nats, over.nats) {
                (Some(a), Some(b)) => Some(a.merge(b)),
                (a, b) => b.or(a),
            },
            metrics_addr: over.metrics_addr.or(self.metrics_addr),
            health_addr: over.health_addr.or(self.health_addr),
            max_action_bytes: over.max_action_bytes.or(self.max_action_bytes),
            max_timeout_ms: over.max_timeout_ms.or(self.max_timeout_ms),
            max_queued_actions: over.max_queued_actions.or(self.max_queued_actions),
            max_queued_bytes: over.max_queued_bytes.or(self.max_queued_bytes),
            max_queued_per_job: over.max_queued_per_job.or(self.max_queued_per_job),
            max_queued_bytes_per_job: over
                .max_queued_bytes_per_job
                .or(self.max_queued_bytes_per_job),
            worker_missed_heartbeats: over
                .worker_missed_heartbeats
                .or(self.worker_missed_heartbeats),
            policy: over.policy.or(self.policy),
            settle_ms: over.settle_ms.or(self.settle_ms),
            worker_rejoin_ms: over.worker_rejoin_ms.or(self.worker_rejoin_ms),
            sandbox_idle_timeout_ms: over
                .sandbox_idle_timeout_ms
                .or(self.sandbox_idle_timeout_ms),
            max_sandbox_idle_timeout_ms: over
                .max_sandbox_idle_timeout_ms
                .or(self.max_sandbox_idle_timeout_ms),
            job_weights: over.job_weights.or(self.job_weights),
            job_caps: over.job_caps.or(self.job_caps),
            provider: over.provider.or(self.provider),
            service: over.service.or(self.service),
            static_cores: over.static_cores.or(self.static_cores),
            id: over.id.or(self.id),
            lease_ttl_ms: over.lease_ttl_ms.or(self.lease_ttl_ms),
            streams: match (self.streams, over.streams) {
                (Some(mut a), Some(b)) => {
                    a.replicas = b.replicas.or(a.replicas);
                    a.limits.extend(b.limits);
                    Some(a)
                }
                (a, b) => b.or(a),
            },
            images: match (self.images, over.images) {
                (Some(a), Some(b)) => Some(RawImages {
                    locality: b.locality.or(a.locality),
                    pull_mb_per_s: b.pull_mb_per_s.or(a.pull_mb_per_s),
                    load_ms: b.load_ms.or(a.load_ms),
                }),
                (a, b) => b.or(a),
            },
        }
    }

    /// Checks every field and fills defaults.
    pub fn validate(self) -> Result<Config, ConfigError> {
        let nats_url = self
            .nats_url
            .unwrap_or_else(|| DEFAULT_NATS_URL.to_string());
        if !(nats_url.starts_with("nats://") || nats_url.starts_with("tls://")) {
            return Err(invalid(
                "nats_url",
                format!("{nats_url:?} must start with nats:// or tls://"),
            ));
        }
        let credentials = self
            .nats
            .unwrap_or_default()
            .validate()
            .map_err(|e| invalid("nats", e.to_string()))?;
        let metrics_addr = match self.metrics_addr.as_deref() {
            None | Some("") => None,
            Some(a) => Some(a.parse().map_err(|e| {
                invalid(
                    "metrics_addr",
                    format!("{a:?} is not a socket address: {e}"),
                )
            })?),
        };
        let health_addr = match self.health_addr.as_deref() {
            None | Some("") => None,
            Some(a) => Some(a.parse().map_err(|e| {
                invalid("health_addr", format!("{a:?} is not a socket address: {e}"))
            })?),
        };
        let max_action_bytes = self.max_action_bytes.unwrap_or(DEFAULT_MAX_ACTION_BYTES);
        if !(1024..=8 << 20).contains(&max_action_bytes) {
            return Err(invalid(
                "max_action_bytes",
                format!("{max_action_bytes} is outside 1024 to 8 MiB (the NATS payload limit in nats/server.conf)"),
            ));
        }
        let max_queued_actions = self
            .max_queued_actions
            .unwrap_or(DEFAULT_MAX_QUEUED_ACTIONS);
        if !(1..=DEFAULT_MAX_QUEUED_ACTIONS).contains(&max_queued_actions) {
            return Err(invalid(
                "max_queued_actions",
                format!("{max_queued_actions} is outside 1 to {DEFAULT_MAX_QUEUED_ACTIONS} (the consumer's max_ack_pending)"),
            ));
        }
        let max_queued_bytes = self.max_queued_bytes.unwrap_or(DEFAULT_MAX_QUEUED_BYTES);
        if max_queued_bytes < 8 << 20 {
            return Err(invalid(
                "max_queued_bytes",
                format!("{max_queued_bytes} is below 8 MiB (one action may be that large)"),
            ));
        }
        let (max_queued_per_job, max_queued_bytes_per_job) = super::tenancy::queued_per_job(
            self.max_queued_per_job,
            self.max_queued_bytes_per_job,
            max_queued_actions,
            max_queued_bytes,
        )?;
        let max_timeout_ms = self.max_timeout_ms.unwrap_or(DEFAULT_MAX_TIMEOUT_MS);
        if max_timeout_ms == 0 {
            return Err(invalid("max_timeout_ms", "must be positive"));
        }
        let max_idle_ms = self
            .max_sandbox_idle_timeout_ms
            .unwrap_or(DEFAULT_MAX_SANDBOX_IDLE_TIMEOUT_MS);
        let idle_ms = self
            .sandbox_idle_timeout_ms
            .unwrap_or(DEFAULT_SANDBOX_IDLE_TIMEOUT_MS);
        if max_idle_ms < 1_000 {
            return Err(invalid(
                "max_sandbox_idle_timeout_ms",
                format!("{max_idle_ms} is below 1000 (opens may ask for 1 s at the least)"),
            ));
        }
        if idle_ms > max_idle_ms || (idle_ms > 0 && idle_ms < 1_000) {
            return Err(invalid(
                "sandbox_idle_timeout_ms",
                format!("{idle_ms} must be 0 (never) or between 1000 and max_sandbox_idle_timeout_ms ({max_idle_ms})"),
            ));
        }
        let worker_missed_heartbeats = self
            .worker_missed_heartbeats
            .unwrap_or(DEFAULT_MISSED_HEARTBEATS);
        if worker_missed_heartbeats == 0 {
            return Err(invalid("worker_missed_heartbeats", "must be at least 1"));
        }
        let policy = self.policy.unwrap_or_else(|| DEFAULT_POLICY.into());
        if tangram_core::sim::SIM_ONLY.contains(&policy.as_str()) {
            return Err(invalid(
                "policy",
                format!("{policy:?} is a simulator baseline (it models a pod's start); the live per-trajectory baseline is \"static\""),
            ));
        }
        if tangram_core::by_name(&policy).is_none() {
            return Err(invalid(
                "policy",
                format!(
                    "{policy:?} is unknown; choose one of {}",
                    tangram_core::policies::NAMES.join(", ")
                ),
            ));
        }
        let job_weights = self.job_weights.unwrap_or_default();
        if let Some((job, w)) = job_weights
            .iter()
            .find(|(_, w)| !(**w > 0.0 && w.is_finite()))
        {
            return Err(invalid(
                "job_weights",
                format!("{job} is {w}; weights must be above 0"),
            ));
        }
        let job_caps = super::tenancy::job_caps(self.job_caps.unwrap_or_default())?;
        let providers = super::tenancy::providers(self.provider.unwrap_or_default())?;
        let services = super::tenancy::services(self.service.unwrap_or_default())?;
        let static_cores = self.static_cores.unwrap_or(4);
        if static_cores == 0 {
            return Err(invalid("static_cores", "must be at least 1"));
        }
        let lease_ttl_ms = self.lease_ttl_ms.unwrap_or(DEFAULT_LEASE_TTL_MS);
        if !(200..=60_000).contains(&lease_ttl_ms) {
            return Err(invalid(
                "lease_ttl_ms",
                format!("{lease_ttl_ms} is outside 200 to 60000"),
            ));
        }
        let id = self
            .id
            .unwrap_or_else(|| format!("{}-{}", crate::lease::host_name(), std::process::id()));
        if id.is_empty()
            || id.len() > 128
            || !id
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_".contains(c))
        {
            return Err(invalid(
                "id",
                format!("{id:?} must be 1 to 128 characters of letters, digits, - and _"),
            ));
        }
        let streams = self.streams.unwrap_or_default();
        streams.validate().map_err(|why| invalid("streams", why))?;
        let images = self.images.unwrap_or_default();
        let engine_defaults = tangram_core::EngineConfig::default();
        let pull_mb_per_s = images
            .pull_mb_per_s
            .unwrap_or(engine_defaults.pull_mb_per_s);
        if !(pull_mb_per_s.is_finite() && pull_mb_per_s > 0.0) {
            return Err(invalid(
                "images.pull_mb_per_s",
                format!("{pull_mb_per_s} must be a positive number of MB/s"),
            ));
        }
        Ok(Config {
            image_locality: images.locality.unwrap_or(true),
            pull_mb_per_s,
            image_load_ms: images.load_ms.unwrap_or(engine_defaults.image_load_ms),
            streams,
            id,
            lease_ttl: Duration::from_millis(lease_ttl_ms),
            static_cores,
            job_weights,
            job_caps,
            providers,
            services,
            nats_url,
            credentials,
            metrics_addr,
            health_addr,
            max_action_bytes: max_action_bytes as usize,
            max_timeout: Duration::from_millis(max_timeout_ms),
            max_queued_actions: max_queued_actions as usize,
            max_queued_bytes,
            max_queued_per_job,
            max_queued_bytes_per_job,
            worker_missed_heartbeats,
            policy,
            settle: Duration::from_millis(self.settle_ms.unwrap_or(DEFAULT_SETTLE_MS)),
            worker_rejoin: Duration::from_millis(self.worker_rejoin_ms.unwrap_or(30_000)),
            sandbox_idle_timeout: Duration::from_millis(idle_ms),
            max_sandbox_idle_timeout: Duration::from_millis(max_idle_ms),
        })
    }
}
