//! The `[sandbox]` table and its guard. Settings that would weaken isolation are refused
//! with the reason; paths are compared as canonical paths, component by component, never as
//! strings, so `..`, symlinks and doubled slashes cannot smuggle a host path past the guard.

use super::mounts::check_mount;
use super::{invalid, refused, ConfigError};
use serde::Deserialize;

/// The `[sandbox]` table: container settings. The secure values are the defaults; the
/// dangerous ones exist only so that asking for them gets a clear refusal.
#[derive(Debug, Default, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawSandbox {
    /// Default image for `sandbox_open` without one.
    pub image: Option<String>,
    /// User the sandbox runs as (`uid:gid`). Root (`0`) is refused.
    pub user: Option<String>,
    /// Process limit per sandbox.
    pub pids_limit: Option<i64>,
    /// Open-file limit per process.
    pub nofile: Option<u64>,
    /// Stdout and stderr are each cut at this many bytes.
    pub output_limit_bytes: Option<usize>,
    /// Refused when true.
    pub privileged: Option<bool>,
    /// Only `"none"` is allowed.
    pub network: Option<String>,
    /// Extra bind mounts (`host:container[:ro|rw]`); host runtime paths are refused.
    pub mounts: Option<Vec<String>>,
    /// Extra capabilities; refused (all are dropped).
    pub cap_add: Option<Vec<String>>,
    /// The OCI runtime Docker runs sandboxes with (`runc`, `runsc` for gVisor, `kata`...);
    /// Docker's default when unset. Must be in `allowed_runtimes`.
    pub runtime: Option<String>,
    /// Runtimes an operator may name in `runtime`. Defaults to [`DEFAULT_RUNTIMES`].
    pub allowed_runtimes: Option<Vec<String>>,
    /// Warm sandboxes kept at most (created and parked ahead of opens); 0, the default,
    /// keeps none.
    pub warm_pool: Option<usize>,
    /// Warm sandboxes kept at least, whatever the open rate (at most `warm_pool`).
    pub warm_pool_min: Option<usize>,
    /// Images this worker may pull when a `sandbox_open` names one it lacks: rules
    /// `registry/repository`, `registry/prefix/*` or `registry/*`. Unset or empty: nothing
    /// is pulled (an absent image is refused).
    pub pull: Option<Vec<String>>,
    /// Images already on the host (loaded or built there) that a `sandbox_open` may name
    /// besides the default image and what `pull` allows: rules as in `pull`. Unset or empty:
    /// none. An image on the host that no rule allows is refused like one outside `pull`.
    pub images: Option<Vec<String>>,
    /// JSON file of registry credentials, `{"host[:port]": {"username": "...",
    /// "password": "..."}}`, read at start. Credentials never come from an action.
    pub registry_auth_file: Option<String>,
    /// How long one pull may take [default: 300000].
    pub pull_timeout_ms: Option<u64>,
    /// Disk the pulled images may take, MiB: after a pull, unused ones go, least recently
    /// used first, until the rest fit. Unset: no limit.
    pub image_budget_mb: Option<u64>,
    /// The Docker daemon's socket, `unix:///path` [default: `DOCKER_HOST`, else
    /// `/var/run/docker.sock`]. Only local sockets: a daemon reached over TCP would put the
    /// sandboxes on another host than the cores this worker grants.
    pub docker_host: Option<String>,
}

/// Credentials for one registry. Its `Debug` never shows the password.
#[derive(Clone, Deserialize)]
pub struct RegistryAuth {
    /// The user.
    pub username: String,
    /// The password or token.
    pub password: String,
}

impl std::fmt::Debug for RegistryAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "RegistryAuth {{ username: {:?}, password: <redacted> }}",
            self.username
        )
    }
}

/// What a worker pulls, from where, with which credentials.
#[derive(Debug, Clone, Default)]
pub struct PullConfig {
    /// The allow rules (none: no pulls).
    pub allow: Vec<tangram_shared::image::ImageRule>,
    /// Rules for images on the host that opens may name without a pull (`sandbox.images`).
    pub local: Vec<tangram_shared::image::ImageRule>,
    /// Credentials by registry (`host[:port]`).
    pub auth: std::collections::BTreeMap<String, RegistryAuth>,
    /// The longest one pull may take.
    pub timeout: std::time::Duration,
    /// Disk the pulled images may take, bytes (`None`: no limit).
    pub budget_bytes: Option<u64>,
}

impl PullConfig {
    /// Why a `sandbox_open` may not name `image` (not the worker's default `default`), or
    /// `None` when it may: the image must be allowed by `sandbox.pull` or `sandbox.images`,
    /// whether or not it is on the host already (another job's private task image, or an
    /// infrastructure image, is not the open's to use).
    pub fn open_refusal(&self, image: &str, default: &str) -> Option<String> {
        if image == default {
            return None;
        }
        // Docker reads these as image ids, which no rule can name: any image on the host.
        let bare = image.strip_prefix("sha256:").unwrap_or(image);
        if image.starts_with("sha256:")
            || (bare.len() >= 6 && bare.bytes().all(|b| b.is_ascii_hexdigit()))
        {
            return Some(format!(
                "{image} reads as an image id; name the image by its reference"
            ));
        }
        let r = match tangram_shared::image::ImageRef::parse(image) {
            Ok(r) => r,
            Err(e) => return Some(e),
        };
        if let Ok(d) = tangram_shared::image::ImageRef::parse(default) {
            if d.canonical() == r.canonical() {
                return None;
            }
        }
        if self
            .allow
            .iter()
            .chain(&self.local)
            .any(|rule| rule.allows(&r))
        {
            return None;
        }
        Some(format!(
            "{}/{} is not this worker's default image and not in its allow-list (sandbox.pull or sandbox.images)",
            r.registry, r.repository
        ))
    }

    /// Why `image` may not be pulled, or `None` when it may.
    pub fn refusal(&self, image: &str) -> Option<String> {
        if self.allow.is_empty() {
            return Some("this worker pulls no images (sandbox.pull is empty)".into());
        }
        match tangram_shared::image::ImageRef::parse(image) {
            Err(e) => Some(e),
            Ok(r) if self.allow.iter().any(|rule| rule.allows(&r)) => None,
            Ok(r) => Some(format!(
                "{}/{} is not in this worker's sandbox.pull allow-list",
                r.registry, r.repository
            )),
        }
    }
}

/// Validated sandbox settings.
#[derive(Debug, Clone)]
pub struct SandboxConfig {
    /// Default image.
    pub image: String,
    /// `uid:gid`.
    pub user: String,
    /// Process limit.
    pub pids_limit: i64,
    /// Open-file limit.
    pub nofile: u64,
    /// Output cap per stream, in bytes.
    pub output_limit_bytes: usize,
    /// Extra read-only or read-write bind mounts, with canonical host paths.
    pub mounts: Vec<String>,
    /// The OCI runtime, when one is named (checked against the daemon's at start).
    pub runtime: Option<String>,
    /// The cluster this worker serves (its NATS URL), labelled on its sandboxes: a worker
    /// treats as leftovers of its own only sandboxes of its id *and* cluster, so two clusters
    /// sharing a Docker daemon and a worker id (two `tangram up`s on one host) do not remove
    /// each other's live sandboxes. Set by the worker's config, not read from the file.
    pub cluster: String,
    /// Warm pool size, at most and at least (0 and 0: no pool).
    pub warm_max: usize,
    pub warm_min: usize,
    /// Pulls of images a `sandbox_open` names and the worker lacks.
    pub pull: PullConfig,
    /// The daemon's socket, when not the local default.
    pub docker_host: Option<String>,
}

impl SandboxConfig {
    /// True when sandboxes run under gVisor (`runtime = "runsc"`). Docker cannot update a
    /// gVisor container (runsc has no `update`), and its processes on the host are gVisor's
    /// own (its kernel, gofer and the stubs that run the sandboxed code), not the sandbox's:
    /// cores and memory are set through the cgroup files, and processes are killed from
    /// inside.
    pub fn gvisor(&self) -> bool {
        self.runtime.as_deref() == Some(GVISOR_RUNTIME)
    }
}

/// gVisor's runtime under its usual name.
pub const GVISOR_RUNTIME: &str = "runsc";

/// The largest warm pool a worker may keep.
pub const MAX_WARM: usize = 256;

/// The default sandbox image, built by `deploy/build-sandbox-image.sh`.
pub const DEFAULT_IMAGE: &str = "tangram/sandbox:poly-v2";
/// `nobody`: sandboxes never run as root.
pub const DEFAULT_USER: &str = "65534:65534";
/// Enough for a parallel test runner, low enough to stop a fork bomb.
pub const DEFAULT_PIDS_LIMIT: i64 = 512;
/// 1 MiB per stream: a failing test suite's log fits; a runaway print loop does not.
pub const DEFAULT_OUTPUT_LIMIT: usize = 1 << 20;
/// OCI runtimes that keep a container's isolation: runc (Docker's default), gVisor and
/// Kata Containers under their usual names.
pub const DEFAULT_RUNTIMES: &[&str] = &[
    "runc",
    "io.containerd.runc.v2",
    "runsc",
    "kata",
    "kata-runtime",
    "kata-qemu",
    "kata-clh",
    "kata-fc",
];

pub(super) fn validate_sandbox(raw: RawSandbox) -> Result<SandboxConfig, ConfigError> {
    let pull = validate_pull(&raw)?;
    if raw.privileged == Some(true) {
        return refused(
            "sandbox.privileged",
            "a privileged container can take over the host. \
             Sandboxes run model-generated code; keep the default (false)",
        );
    }
    if let Some(net) = raw.network.as_deref() {
        if net != "none" {
            return refused(
                "sandbox.network",
                format!(
                    "{net:?}: sandboxes have no network (\"none\"); \
                     host or bridge networking would let model-generated code reach the fleet"
                ),
            );
        }
    }
    if let Some(caps) = raw.cap_add.as_ref().filter(|c| !c.is_empty()) {
        return refused(
            "sandbox.cap_add",
            format!("{caps:?}: sandboxes drop all capabilities"),
        );
    }
    let mounts = raw
        .mounts
        .unwrap_or_default()
        .iter()
        .map(|m| check_mount(m))
        .collect::<Result<Vec<_>, _>>()?;
    let user = raw.user.unwrap_or_else(|| DEFAULT_USER.into());
    check_user(&user)?;
    let pids_limit = raw.pids_limit.unwrap_or(DEFAULT_PIDS_LIMIT);
    if !(16..=65_536).contains(&pids_limit) {
        return invalid("sandbox.pids_limit", "must be between 16 and 65536");
    }
    let allowed: Vec<String> = raw
        .allowed_runtimes
        .unwrap_or_else(|| DEFAULT_RUNTIMES.iter().map(|s| s.to_string()).collect());
    if let Some(rt) = &raw.runtime {
        if !allowed.iter().any(|a| a == rt) {
            return refused(
                "sandbox.runtime",
                format!(
                    "{rt:?} is not in allowed_runtimes ({}); an unknown runtime may not isolate \
                     model-generated code",
                    allowed.join(", ")
                ),
            );
        }
    }
    let warm_max = raw.warm_pool.unwrap_or(0);
    if warm_max > MAX_WARM {
        return invalid("sandbox.warm_pool", format!("must be at most {MAX_WARM}"));
    }
    let warm_min = raw.warm_pool_min.unwrap_or(0);
    if warm_min > warm_max {
        return invalid("sandbox.warm_pool_min", "must be at most warm_pool");
    }
    if let Some(h) = raw.docker_host.as_deref() {
        if !h.starts_with("unix:///") {
            return invalid(
                "sandbox.docker_host",
                format!("{h:?}: only a local socket, unix:///path, is allowed"),
            );
        }
    }
    Ok(SandboxConfig {
        docker_host: raw.docker_host,
        pull,
        warm_max,
        warm_min,
        image: raw.image.unwrap_or_else(|| DEFAULT_IMAGE.into()),
        user,
        pids_limit,
        nofile: raw.nofile.unwrap_or(4096),
        output_limit_bytes: raw.output_limit_bytes.unwrap_or(DEFAULT_OUTPUT_LIMIT),
        mounts,
        runtime: raw.runtime,
        cluster: String::new(),
    })
}

/// The pull rules parsed, the credentials file read.
fn validate_pull(raw: &RawSandbox) -> Result<PullConfig, ConfigError> {
    let allow = raw
        .pull
        .iter()
        .flatten()
        .map(|r| tangram_shared::image::ImageRule::parse(r))
        .collect::<Result<Vec<_>, _>>()
        .or_else(|e| invalid("sandbox.pull", e))?;
    let local = raw
        .images
        .iter()
        .flatten()
        .map(|r| tangram_shared::image::ImageRule::parse(r))
        .collect::<Result<Vec<_>, _>>()
        .or_else(|e| invalid("sandbox.images", e))?;
    let auth = match raw.registry_auth_file.as_deref() {
        None => Default::default(),
        Some(path) => {
            let text = std::fs::read_to_string(path).or_else(|e| {
                invalid("sandbox.registry_auth_file", format!("reading {path}: {e}"))
            })?;
            serde_json::from_str(&text).or_else(|e| {
                invalid(
                    "sandbox.registry_auth_file",
                    format!("{path}: {e}; expected {{\"host[:port]\": {{\"username\": ..., \"password\": ...}}}}"),
                )
            })?
        }
    };
    let timeout_ms = raw.pull_timeout_ms.unwrap_or(300_000);
    if !(1_000..=3_600_000).contains(&timeout_ms) {
        return invalid("sandbox.pull_timeout_ms", "must be 1000 to 3600000");
    }
    if raw.image_budget_mb == Some(0) {
        return invalid(
            "sandbox.image_budget_mb",
            "must be at least 1 (leave it unset for no limit)",
        );
    }
    Ok(PullConfig {
        allow,
        local,
        auth,
        timeout: std::time::Duration::from_millis(timeout_ms),
        budget_bytes: raw.image_budget_mb.map(|mb| mb << 20),
    })
}

/// Root by number (`0`, `00`) or by name is refused; so is an empty user.
fn check_user(user: &str) -> Result<(), ConfigError> {
    let uid = user.split(':').next().unwrap_or("").trim();
    let root = match uid.parse::<u32>() {
        Ok(n) => n == 0,
        Err(_) => uid.is_empty() || uid == "root",
    };
    if root {
        return refused(
            "sandbox.user",
            format!("{user:?}: sandboxes never run as root"),
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests;
