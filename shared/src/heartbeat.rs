//! Heartbeats: a worker's inventory and liveness, on `tangram.v1.heartbeat.<worker>`.

use crate::ids::{ActionId, JobId, TrajectoryId, WorkerId};
use serde::{Deserialize, Serialize};

/// A sandbox a worker holds.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct SandboxRef {
    /// Owning job.
    pub job: JobId,
    /// Owning trajectory.
    pub trajectory: TrajectoryId,
    /// Memory it reserves, in MiB.
    pub mem_mb: u64,
    /// The open that created it (absent from workers that predate it): a scheduler that
    /// takes over names its own closes of this sandbox after it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub open: Option<ActionId>,
    /// The idle timeout its open asked for, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_timeout_ms: Option<u64>,
}

/// Sent by every worker every `interval_ms`, and once with `draining = true` when it stops.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Heartbeat {
    /// The worker.
    pub worker: WorkerId,
    /// Random id of this worker process; changes when the worker restarts.
    pub instance: String,
    /// Increases by one per heartbeat of this instance.
    pub seq: u64,
    /// Heartbeat period, in milliseconds; the scheduler declares the worker lost after a few
    /// missed periods.
    pub interval_ms: u64,
    /// Cores the worker can grant to actions.
    pub cores: u32,
    /// Memory the worker can reserve for sandboxes, in MiB.
    pub mem_mb: u64,
    /// Actions running now.
    #[serde(default)]
    pub running: Vec<ActionId>,
    /// Actions this instance finished lately (their results are published or being
    /// published): the scheduler does not take their absence from `running` as a loss
    /// while its results feed catches up.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub finished: Vec<ActionId>,
    /// The highest stream sequence of a dispatch or re-size this worker has taken in (0: none
    /// yet, or a worker that predates it). They reach a worker in stream order, so a dispatch
    /// it does not list although this has passed its sequence is not on its way any more, and
    /// `resized` reflects every re-size up to it.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub dispatch_seq: u64,
    /// The newest scheduler epoch this worker knows (0: none yet, or a worker that predates
    /// it). It drops a re-size of an older epoch that reaches it from now on, so one still on
    /// its way changes nothing it runs: a scheduler that finds such a re-size in the backlog
    /// books the exec as `resized` says.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub known_epoch: u64,
    /// Sandboxes held now.
    #[serde(default)]
    pub sandboxes: Vec<SandboxRef>,
    /// True when the worker takes no new work (shutting down).
    #[serde(default)]
    pub draining: bool,
    /// GPUs, when the worker has any (from NVML, or declared in its config).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpus: Option<GpuInventory>,
    /// Model services the worker serves, with their replicas.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub services: Vec<ServiceReport>,
    /// External API providers the worker can call (never their credentials).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub providers: Vec<ProviderReport>,
    /// The worker's warm pool of sandboxes, when it keeps one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warm: Option<WarmPoolReport>,
    /// Sandbox images the worker holds: its default image and those its pull allow-list
    /// admits (none on a worker without sandboxes).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub images: Vec<ImageReport>,
    /// Running execs whose cores a re-size changed since their dispatch, with the cores each
    /// holds now (absent when none): a scheduler that takes over books these, not the
    /// dispatch's grant.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub resized: std::collections::BTreeMap<ActionId, u32>,
}

/// One sandbox image a worker holds.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ImageReport {
    /// The reference it is held under (`registry/repository:tag`).
    pub reference: String,
    /// The image's id (`sha256:...`): two references with one id are one image on disk.
    pub id: String,
    /// Its size on disk, bytes (layers shared with other images counted in full).
    pub size_bytes: u64,
}

/// A worker's warm pool: sandboxes created and parked ahead of the opens that claim them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct WarmPoolReport {
    /// Warm sandboxes ready to claim.
    pub ready: u32,
    /// The size the pool is filling to (from the observed open rate).
    pub target: u32,
    /// Opens served from the pool since the worker started.
    pub hits: u64,
    /// Opens the pool could have served that found it empty.
    pub misses: u64,
    /// Memory the ready sandboxes may use (their limits, summed), MiB.
    pub mem_mb: u64,
}

/// An external API provider as the scheduler needs to know it: its quota and what may be
/// called.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ProviderReport {
    /// Name `api` actions use.
    pub name: String,
    /// Requests per second allowed, for the whole fleet.
    pub rate_per_s: f64,
    /// Requests that may be sent at once after a quiet period.
    pub burst: u32,
    /// Requests in flight at most, for the whole fleet.
    pub concurrency: u32,
    /// What a rollout may call: `"METHOD /path"`, a trailing `*` matching any rest of the path.
    pub allow: Vec<String>,
    /// Request headers a rollout may set (lower case).
    #[serde(default)]
    pub allow_headers: Vec<String>,
    /// A reply slower than this counts as a sign of overload (like a 429), ms.
    #[serde(default)]
    pub slow_ms: Option<u64>,
}

impl ProviderReport {
    /// True when `method path` matches one of the allow rules.
    pub fn allows(&self, method: &str, path: &str) -> bool {
        // Judged on the path as the provider will read it: percent-decoded, with no dot
        // segments, encoded or doubled slashes, backslashes or NULs that could step outside
        // an allowed prefix.
        let Some(path) = plain_path(path) else {
            return false;
        };
        let path = path.as_str();
        self.allow.iter().any(|rule| {
            let Some((m, p)) = rule.split_once(' ') else {
                return false;
            };
            let method_ok = m == "*" || m.eq_ignore_ascii_case(method);
            let path_ok = match p.strip_suffix('*') {
                Some(prefix) => path.starts_with(prefix),
                None => p == path,
            };
            method_ok && path_ok
        })
    }

    /// Whether a rollout may make this call through this provider: its method and path match
    /// an allow rule and every header it sets is allowed. The one check the scheduler (before
    /// admission) and the worker (before calling) both apply; the reason is for the submitter.
    pub fn permits(&self, api: &crate::Api) -> Result<(), String> {
        if !self.allows(&api.method, &api.path) {
            return Err(format!(
                "{} {} is not allowed for provider {:?} (allowed: {})",
                api.method,
                api.path,
                api.provider,
                self.allow.join(", ")
            ));
        }
        if let Some(h) = api
            .headers
            .keys()
            .find(|h| !self.allow_headers.contains(&h.to_ascii_lowercase()))
        {
            return Err(format!(
                "header {h:?} is not allowed for provider {:?}",
                api.provider
            ));
        }
        Ok(())
    }
}

/// A worker's GPUs: NVLink groups of up to 8, as GPU indices.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct GpuInventory {
    /// Where the inventory came from: `nvml` or `declared`.
    pub source: String,
    /// Groups of GPUs connected by NVLink (a GPU alone is a group of one), each a list of
    /// GPU indices; chunks of 1, 2, 4 or 8 are carved from a group, aligned to their size.
    pub groups: Vec<Vec<u32>>,
    /// Per GPU index: its name and memory, for people (`"NVIDIA H200, 143771 MiB"`).
    #[serde(default)]
    pub devices: Vec<String>,
}

/// Where a replica lives: GPUs `start .. start + len` of NVLink group `group`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ChunkRef {
    /// Group index in [`GpuInventory::groups`].
    pub group: u16,
    /// First GPU, counted inside the group.
    pub start: u8,
    /// GPUs: 1, 2, 4 or 8.
    pub len: u8,
}

/// A model service a worker serves.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ServiceReport {
    /// The name reward actions use.
    pub name: String,
    /// GPUs per replica.
    pub gpus: u8,
    /// Expected restore time, ms.
    pub restore_ms: u64,
    /// Requests one replica serves at once.
    pub slots: u32,
    /// Replicas deployed now (their state in host memory at least).
    #[serde(default)]
    pub replicas: Vec<ReplicaReport>,
}

/// One deployed replica.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ReplicaReport {
    /// Its GPUs.
    pub chunk: ChunkRef,
    /// On the GPUs now.
    pub resident: bool,
    /// Answering its health check.
    pub healthy: bool,
}
/// The path percent-decoded, or `None` when it is not a plain absolute path: a `.` or `..`
/// segment (raw or encoded), an empty segment (`//`), an encoded slash or backslash, a
/// backslash, a NUL or control byte, or an encoding that is not valid UTF-8. The query
/// string is not part of the path.
pub fn plain_path(path: &str) -> Option<String> {
    let path = path.split_once('?').map_or(path, |(p, _)| p);
    if !path.starts_with('/') {
        return None;
    }
    let bytes = path.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        if b == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            let v = u8::from_str_radix(hex, 16).ok()?;
            // An encoded separator would be one segment to us and two to some servers.
            if v == b'/' || v == b'\\' {
                return None;
            }
            out.push(v);
            i += 3;
        } else {
            out.push(b);
            i += 1;
        }
    }
    let decoded = String::from_utf8(out).ok()?;
    if decoded.contains('\\') || decoded.chars().any(|c| c.is_control()) {
        return None;
    }
    let segments: Vec<&str> = decoded[1..].split('/').collect();
    let last = segments.len() - 1;
    for (n, s) in segments.iter().enumerate() {
        if *s == "." || *s == ".." || (s.is_empty() && n != last) {
            return None;
        }
    }
    Some(decoded)
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(allow: &[&str]) -> ProviderReport {
        ProviderReport {
            name: "p".into(),
            rate_per_s: 1.0,
            burst: 1,
            concurrency: 1,
            allow: allow.iter().map(|s| s.to_string()).collect(),
            allow_headers: vec![],
            slow_ms: None,
        }
    }

    #[test]
    fn percent_encoded_dot_segments_cannot_escape_an_allow_prefix() {
        let r = report(&["GET /page/*", "POST /search"]);
        assert!(r.allows("GET", "/page/1"));
        assert!(r.allows("GET", "/page/a%20b"));
        assert!(r.allows("GET", "/page/x?q=..%2f"));
        for escape in [
            "/page/%2e%2e/secret",
            "/page/%2E%2E/secret",
            "/page/../secret",
            "/page/./../secret",
            "/page/.%2e/secret",
            "/page/%2fsecret",
            "/page/%5c..%5csecret",
            "/page/..\\secret",
            "/page//../secret",
            "/page/%00",
            "/page/%zz",
            "page/1",
        ] {
            assert!(!r.allows("GET", escape), "{escape} was allowed");
        }
        assert!(r.allows("POST", "/search"));
        assert!(!r.allows("POST", "/search/."));
    }
}
