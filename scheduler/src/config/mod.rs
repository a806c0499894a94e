//! Scheduler configuration: TOML file, then `TANGRAM_*` environment variables, then flags,
//! over defaults. Validated before any connection is opened; `main` exits with 64 on error.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

mod raw;
mod tenancy;
#[cfg(test)]
mod tests;

pub use raw::{RawConfig, RawImages};

/// The validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// NATS server URL.
    pub nats_url: String,
    /// How to authenticate to NATS (none by default).
    pub credentials: tangram_nats::auth::Credentials,
    /// Prometheus listen address, if any.
    pub metrics_addr: Option<SocketAddr>,
    /// Health endpoints' listen address, if any.
    pub health_addr: Option<SocketAddr>,
    /// Largest action message accepted, in bytes.
    pub max_action_bytes: usize,
    /// Longest action timeout accepted.
    pub max_timeout: Duration,
    /// Action messages held in memory at most; the rest wait in the stream.
    pub max_queued_actions: usize,
    /// Bytes of action messages held in memory at most.
    pub max_queued_bytes: u64,
    /// Action messages one job may have queued at most (past it: `queue_full`).
    pub max_queued_per_job: u32,
    /// Bytes of action messages one job may have queued at most.
    pub max_queued_bytes_per_job: u64,
    /// Heartbeat periods a worker may miss before it is declared lost.
    pub worker_missed_heartbeats: u32,
    /// Scheduling policy name.
    pub policy: String,
    /// Wait for heartbeats after start before rejecting on cluster knowledge.
    pub settle: Duration,
    /// After a worker is lost, how long actions only it could take wait for it.
    pub worker_rejoin: Duration,
    /// A sandbox no action used for this long is closed; zero: never.
    pub sandbox_idle_timeout: Duration,
    /// The longest idle timeout an open may ask for.
    pub max_sandbox_idle_timeout: Duration,
    /// Jobs' weights for shares of external API quota.
    pub job_weights: std::collections::BTreeMap<String, f64>,
    /// The fleet's definitions of providers' quotas, by name.
    pub providers: std::collections::BTreeMap<String, tangram_core::quota::ProviderQuota>,
    /// The fleet's definitions of GPU services' sizes and slots, by name.
    pub services: std::collections::BTreeMap<String, tangram_core::gpu::ServiceSpec>,
    /// Caps per job; `*` for every job not listed.
    pub job_caps: std::collections::BTreeMap<String, tangram_core::engine::JobCaps>,
    /// Cores per sandbox under `static`.
    pub static_cores: u32,
    /// Id in the leader lease.
    pub id: String,
    /// Leader lease lifetime without renewal.
    pub lease_ttl: Duration,
    /// Replicas and limits of streams it creates.
    pub streams: tangram_nats::streams::StreamSettings,
    /// Image-aware placement: on or off.
    pub image_locality: bool,
    /// Expected pull throughput, MB/s.
    pub pull_mb_per_s: f64,
    /// Load weighed against a pull, ms per sandbox per core.
    pub image_load_ms: u64,
}

/// Default NATS URL: the local cluster's server.
pub const DEFAULT_NATS_URL: &str = "nats://127.0.0.1:4222";
/// 1 MiB: room for an exec with a few hundred KiB of source files; larger inputs belong in the
/// image or a volume. NATS' own limit (nats/server.conf) is above it so oversize input reaches
/// us and gets a clear rejection rather than a publish error.
pub const DEFAULT_MAX_ACTION_BYTES: u64 = 1 << 20;
/// The scheduler consumer's `max_ack_pending`: JetStream never has more out at once.
pub const DEFAULT_MAX_QUEUED_ACTIONS: u64 = 100_000;
/// 1 GiB of action messages in memory; beyond it the intake pauses and the stream holds them.
pub const DEFAULT_MAX_QUEUED_BYTES: u64 = 1 << 30;
/// One hour: longer actions are almost always a hung test suite.
pub const DEFAULT_MAX_TIMEOUT_MS: u64 = 3_600_000;
/// Default [`Config::sandbox_idle_timeout`]: half an hour.
pub const DEFAULT_SANDBOX_IDLE_TIMEOUT_MS: u64 = 1_800_000;
/// Default [`Config::max_sandbox_idle_timeout`]: a day.
pub const DEFAULT_MAX_SANDBOX_IDLE_TIMEOUT_MS: u64 = 86_400_000;
/// Three missed heartbeats (3 s at the default 1 s period) before a worker counts as lost:
/// long enough to ride out a GC pause or a NATS reconnect.
pub const DEFAULT_MISSED_HEARTBEATS: u32 = 3;

/// Two seconds: a standby takes over within about 2.3 s of the leader's death (the lease
/// plus one poll), and a leader renews four times per lease.
pub const DEFAULT_LEASE_TTL_MS: u64 = 2_000;

/// Two default heartbeat periods: every live worker has reported by then.
pub const DEFAULT_SETTLE_MS: u64 = 2_000;

/// A configuration error: its Display is for a person, [`ConfigError::field`] and the variant
/// for code.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("reading {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The file is not valid TOML for this schema (unknown fields included).
    #[error("{}: {source}", path.display())]
    Parse {
        /// The file.
        path: PathBuf,
        /// Where and why.
        #[source]
        source: toml::de::Error,
    },
    /// The file or an environment variable does not fit the schema (names the key and
    /// where it was set).
    #[error("{0}")]
    Layered(String),
    /// A value is malformed or out of range.
    #[error("{field}: {why}")]
    Invalid {
        /// The key.
        field: &'static str,
        /// What is wrong and what is allowed.
        why: String,
    },
}

impl ConfigError {
    /// The key at fault, for an invalid value.
    pub fn field(&self) -> Option<&'static str> {
        match self {
            ConfigError::Invalid { field, .. } => Some(field),
            ConfigError::Read { .. } | ConfigError::Parse { .. } | ConfigError::Layered(_) => None,
        }
    }
}

impl Config {
    /// Defaults with the given NATS URL (for tests and embedding).
    pub fn with_nats_url(url: impl Into<String>) -> Self {
        let mut c = RawConfig::default().validate().expect("defaults are valid");
        c.nats_url = url.into();
        c
    }
}

/// Reads the file if given; a missing default path is not an error.
pub fn load_file(path: Option<&PathBuf>) -> Result<RawConfig, ConfigError> {
    load_layered(path.map(PathBuf::as_path))
}

/// Prefix of the environment variables that set any key of the file:
/// `TANGRAM_SCHEDULER_<KEY>`, a nested key's parts joined by `__`
/// (`TANGRAM_SCHEDULER_NATS__NKEY_FILE`). Values read as TOML-like scalars, arrays (`[1, 2]`) or
/// tables (`{a = 1}`), else as strings.
pub const ENV_PREFIX: &str = "TANGRAM_SCHEDULER_";

/// The policy when none is configured: `tangram-v2` (the paper's policy with malleable
/// grants), which has the lower mean ACT on every workload with sandbox commands and the
/// same decisions as `tangram` on GPU and API calls (docs/BENCHMARKS.md).
pub const DEFAULT_POLICY: &str = "tangram-v2";

/// The file (when given) with the environment variables laid over it
/// (`tangram_nats::layers`): its errors name the key and where it was set (the file's line,
/// or the variable).
pub fn load_layered(path: Option<&Path>) -> Result<RawConfig, ConfigError> {
    use tangram_nats::layers::{layered, LayerError};
    layered(path, ENV_PREFIX).map_err(|e| match e {
        LayerError::Read { path, source } => ConfigError::Read { path, source },
        LayerError::Layered(why) => ConfigError::Layered(why),
    })
}

/// The configuration as it takes effect, as TOML, with secrets redacted (`--check-config`).
pub fn effective(raw: &RawConfig) -> String {
    tangram_nats::layers::effective(raw)
}
