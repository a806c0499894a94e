//! Worker configuration: TOML file, then `TANGRAM_*` environment variables, then flags, over
//! defaults. Validated before any connection; `main` exits with 64 on error. Settings that
//! would weaken sandbox isolation are refused here, with the reason.

use crate::cpuset;
use crate::gpu::NvmlMode;
use crate::providers::ProviderConfig;
use crate::sandbox::RuntimeKind;
use serde::Deserialize;
use service::ServiceConfig;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;
use tangram_shared::WorkerId;

mod error;
mod mounts;
mod sandbox;
pub(crate) mod service;
use error::{bad, conflict, invalid, refused};
pub use error::{ConfigError, ConfigErrorKind};
use sandbox::validate_sandbox;
pub use sandbox::{
    PullConfig, RawSandbox, RegistryAuth, SandboxConfig, DEFAULT_IMAGE, DEFAULT_OUTPUT_LIMIT,
    DEFAULT_PIDS_LIMIT, DEFAULT_RUNTIMES, DEFAULT_USER,
};

/// How cores are granted to and taken from a sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum GrantMode {
    /// Write the container's cgroup files directly (the default: measured faster).
    Cgroup,
    /// Call Docker's container update API.
    Docker,
}

/// The file as written.
#[derive(Debug, Default, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawConfig {
    /// Worker id, unique in the fleet.
    pub id: Option<String>,
    /// NATS server URL.
    pub nats_url: Option<String>,
    /// `[nats]`: credentials (nkey seed file) and TLS.
    pub nats: Option<tangram_nats::auth::RawCredentials>,
    /// Cores this worker grants, as a cpuset list (`"2-15"`).
    pub cores: Option<String>,
    /// Where idle sandboxes are parked, as a cpuset list.
    pub parking_cores: Option<String>,
    /// Memory this worker reserves for sandboxes, in MiB.
    pub mem_mb: Option<u64>,
    /// `cgroup` or `docker`.
    pub grant_mode: Option<GrantMode>,
    /// Heartbeat period, in milliseconds.
    pub heartbeat_ms: Option<u64>,
    /// How long a stopping worker lets running actions finish, in milliseconds.
    pub shutdown_grace_ms: Option<u64>,
    /// Prometheus listen address; absent disables the exporter.
    pub metrics_addr: Option<String>,
    /// Health endpoints' listen address (`/healthz`, `/readyz`); absent disables them.
    pub health_addr: Option<String>,
    /// Container settings.
    pub sandbox: Option<RawSandbox>,
    /// False on GPU hosts: no sandboxes (model-generated code never runs there), no Docker.
    pub sandboxes: Option<bool>,
    /// What runs sandboxes: `docker`, or `noop` for pipeline benchmarks only.
    pub sandbox_runtime: Option<RuntimeKind>,
    /// Where the worker keeps its own state (replica pid files), default
    /// `$TMPDIR/tangram-worker-<id>`.
    pub state_dir: Option<String>,
    /// GPUs.
    pub gpu: Option<RawGpu>,
    /// Model services served by this worker.
    pub service: Option<Vec<ServiceConfig>>,
    /// External API providers this worker calls.
    pub provider: Option<Vec<ProviderConfig>>,
    /// Take the id and seed from a pool instead of `id` (interchangeable workers).
    pub pool: Option<crate::pool::RawPool>,
}

/// The `[gpu]` table.
#[derive(Debug, Default, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawGpu {
    /// `auto` (default), `off` or `required`.
    pub nvml: Option<NvmlMode>,
    /// GPUs declared explicitly, as NVLink groups of indices (`[[0, 1]]`): used only when
    /// NVML is off or absent.
    pub groups: Option<Vec<Vec<u32>>>,
    /// Shorthand for `groups`: this many GPUs, in groups of up to 8.
    pub count: Option<u32>,
}

/// The validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// Worker id.
    pub id: WorkerId,
    /// NATS server URL.
    pub nats_url: String,
    /// How to authenticate to NATS (none by default).
    pub credentials: tangram_nats::auth::Credentials,
    /// Cores granted to actions.
    pub cores: Vec<u32>,
    /// Parking cpuset list.
    pub parking_cores: String,
    /// Memory for sandboxes, in MiB.
    pub mem_mb: u64,
    /// How grants are applied.
    pub grant_mode: GrantMode,
    /// Heartbeat period.
    pub heartbeat: Duration,
    /// Drain deadline on shutdown.
    pub shutdown_grace: Duration,
    /// Prometheus listen address.
    pub metrics_addr: Option<SocketAddr>,
    /// Health endpoints' listen address.
    pub health_addr: Option<SocketAddr>,
    /// Container settings.
    pub sandbox: SandboxConfig,
    /// Runs sandboxes (CPU host) or not (GPU host).
    pub sandboxes: bool,
    /// What runs them.
    pub sandbox_runtime: RuntimeKind,
    /// The worker's state directory.
    pub state_dir: std::path::PathBuf,
    /// How GPUs are found.
    pub nvml: NvmlMode,
    /// Declared GPU groups.
    pub gpu_groups: Vec<Vec<u32>>,
    /// Model services.
    pub services: Vec<ServiceConfig>,
    /// External API providers.
    pub providers: Vec<ProviderConfig>,
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
            id: over.id.or(self.id),
            nats_url: over.nats_url.or(self.nats_url),
            nats: match (self.nats, over.nats) {
                (Some(a), Some(b)) => Some(a.merge(b)),
                (a, b) => b.or(a),
            },
            cores: over.cores.or(self.cores),
            parking_cores: over.parking_cores.or(self.parking_cores),
            mem_mb: over.mem_mb.or(self.mem_mb),
            grant_mode: over.grant_mode.or(self.grant_mode),
            heartbeat_ms: over.heartbeat_ms.or(self.heartbeat_ms),
            shutdown_grace_ms: over.shutdown_grace_ms.or(self.shutdown_grace_ms),
            metrics_addr: over.metrics_addr.or(self.metrics_addr),
            health_addr: over.health_addr.or(self.health_addr),
            sandbox: over.sandbox.or(self.sandbox),
            sandboxes: over.sandboxes.or(self.sandboxes),
            sandbox_runtime: over.sandbox_runtime.or(self.sandbox_runtime),
            state_dir: over.state_dir.or(self.state_dir),
            gpu: over.gpu.or(self.gpu),
            service: over.service.or(self.service),
            provider: over.provider.or(self.provider),
            pool: over.pool.or(self.pool),
        }
    }

    /// With `[pool]`: claims a free id of the pool and sets `id` and the seed from it. The
    /// claim holds the id until it is dropped; keep it for as long as the worker runs.
    pub fn claim_from_pool(mut self) -> Result<(Self, Option<crate::pool::Claim>), ConfigError> {
        let Some(pool) = self.pool.take() else {
            return Ok((self, None));
        };
        if self.id.is_some() {
            return conflict(
                "pool",
                "a pooled worker takes its id from the pool; give id or [pool], not both",
            );
        }
        if self.nats.as_ref().is_some_and(|n| n.nkey_file.is_some()) {
            return conflict(
                "pool",
                "a pooled worker takes its seed from the pool; drop nats.nkey_file",
            );
        }
        let claim = crate::pool::claim(&pool).map_err(|e| ConfigError::Invalid {
            field: "pool",
            why: e.to_string(),
        })?;
        self.id = Some(claim.id.clone());
        let mut nats = self.nats.take().unwrap_or_default();
        nats.nkey_file = Some(claim.seed.clone());
        self.nats = Some(nats);
        Ok((self, Some(claim)))
    }

    /// Checks every field and fills defaults.
    pub fn validate(self) -> Result<Config, ConfigError> {
        let id = self.id.unwrap_or_else(|| "cpu-0".into());
        let id = WorkerId::new(id).map_err(|e| ConfigError::Invalid {
            field: "id",
            why: e.to_string(),
        })?;
        let nats_url = self
            .nats_url
            .unwrap_or_else(|| "nats://127.0.0.1:4222".into());
        if !(nats_url.starts_with("nats://") || nats_url.starts_with("tls://")) {
            return invalid(
                "nats_url",
                format!("{nats_url:?} must start with nats:// or tls://"),
            );
        }
        let credentials = match self.nats.clone().unwrap_or_default().validate() {
            Ok(c) => c,
            Err(e) => return invalid("nats", e.to_string()),
        };
        let online = std::thread::available_parallelism()
            .map(|n| n.get() as u32)
            .unwrap_or(1);
        let cores = match &self.cores {
            Some(list) => cpuset::parse(list).map_err(bad("cores"))?,
            None => (0..online).collect(),
        };
        let parking_cores = self.parking_cores.unwrap_or_else(|| cores[0].to_string());
        cpuset::parse(&parking_cores).map_err(bad("parking_cores"))?;
        let mem_mb = self.mem_mb.unwrap_or(8192);
        if mem_mb < 64 {
            return invalid(
                "mem_mb",
                format!("{mem_mb} is too small; a worker needs at least 64 MiB for sandboxes"),
            );
        }
        let heartbeat = Duration::from_millis(self.heartbeat_ms.unwrap_or(1000));
        if !(Duration::from_millis(50)..=Duration::from_secs(60)).contains(&heartbeat) {
            return invalid("heartbeat_ms", "must be between 50 and 60000");
        }
        let metrics_addr = socket_addr("metrics_addr", self.metrics_addr.as_deref())?;
        let health_addr = socket_addr("health_addr", self.health_addr.as_deref())?;
        let mut sandbox = validate_sandbox(self.sandbox.unwrap_or_default())?;
        sandbox.cluster = nats_url.clone();
        let gpu = self.gpu.unwrap_or_default();
        let gpu_groups = match (gpu.groups, gpu.count) {
            (Some(_), Some(_)) => {
                return conflict("gpu", "gpu.groups and gpu.count are alternatives; give one")
            }
            (Some(g), None) => g,
            (None, Some(n)) => (0..n)
                .collect::<Vec<u32>>()
                .chunks(8)
                .map(<[u32]>::to_vec)
                .collect(),
            (None, None) => Vec::new(),
        };
        let mut seen = std::collections::BTreeSet::new();
        for g in &gpu_groups {
            if g.is_empty() || g.len() > 8 {
                return invalid("gpu.groups", format!("group {g:?} must hold 1 to 8 GPUs"));
            }
            for i in g {
                if !seen.insert(*i) {
                    return conflict("gpu.groups", format!("GPU {i} is listed twice"));
                }
            }
        }
        let services = self.service.unwrap_or_default();
        let mut names = std::collections::BTreeSet::new();
        for s in &services {
            s.check().map_err(bad("service"))?;
            if !names.insert(s.name.clone()) {
                return conflict("service", format!("{:?} is declared twice", s.name));
            }
        }
        let providers = self.provider.unwrap_or_default();
        let mut pnames = std::collections::BTreeSet::new();
        for p in &providers {
            p.check().map_err(bad("provider"))?;
            if !pnames.insert(p.name.clone()) {
                return conflict("provider", format!("{:?} is declared twice", p.name));
            }
        }
        let grant_mode = self.grant_mode.unwrap_or(GrantMode::Cgroup);
        if sandbox.gvisor() && grant_mode == GrantMode::Docker {
            return conflict(
                "grant_mode",
                "\"docker\" cannot grant cores under gVisor (sandbox.runtime = \"runsc\"): \
                 runsc has no update command, so Docker's update API fails; use \"cgroup\"",
            );
        }
        let state_dir = self
            .state_dir
            .map(std::path::PathBuf::from)
            .unwrap_or_else(|| std::env::temp_dir().join(format!("tangram-worker-{id}")));
        Ok(Config {
            sandboxes: self.sandboxes.unwrap_or(true),
            // Docker unless asked: `noop` runs no commands and exists for benchmarks only.
            sandbox_runtime: self.sandbox_runtime.unwrap_or(RuntimeKind::Docker),
            state_dir,
            nvml: gpu.nvml.unwrap_or(NvmlMode::Auto),
            gpu_groups,
            services,
            providers,
            id,
            nats_url,
            credentials,
            cores,
            parking_cores,
            mem_mb,
            grant_mode,
            heartbeat,
            shutdown_grace: Duration::from_millis(self.shutdown_grace_ms.unwrap_or(10_000)),
            metrics_addr,
            health_addr,
            sandbox,
        })
    }
}

/// An optional listen address (absent or empty: off).
fn socket_addr(
    field: &'static str,
    value: Option<&str>,
) -> Result<Option<SocketAddr>, ConfigError> {
    match value {
        None | Some("") => Ok(None),
        Some(a) => a.parse().map(Some).map_err(|e| ConfigError::Invalid {
            field,
            why: format!("{a:?} is not a socket address: {e}"),
        }),
    }
}

/// Prefix of the environment variables that set any key of the file:
/// `TANGRAM_WORKER_<KEY>`, a nested key's parts joined by `__`
/// (`TANGRAM_WORKER_NATS__NKEY_FILE`). Values read as TOML-like scalars, arrays (`[1, 2]`) or
/// tables (`{a = 1}`), else as strings.
pub const ENV_PREFIX: &str = "TANGRAM_WORKER_";

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

#[cfg(test)]
mod tests;
