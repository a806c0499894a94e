//! Actions: what a rollout asks Tangram to run.

use crate::ids::{ActionId, JobId, TrajectoryId};
use crate::rejection::{RejectCode, Rejection};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Default action timeout when the submitter gives none: 60 s.
pub const DEFAULT_TIMEOUT_MS: u64 = 60_000;

fn default_timeout_ms() -> u64 {
    DEFAULT_TIMEOUT_MS
}

/// One action, as published on `tangram.v1.action.<job>.<kind>`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Action {
    /// Idempotency key; also sent as the `Nats-Msg-Id` header.
    pub id: ActionId,
    /// The job that submits it; must match the subject's `<job>` token.
    pub job: JobId,
    /// The trajectory it belongs to; sandbox actions address that trajectory's container.
    pub trajectory: TrajectoryId,
    /// Wall-clock limit for the execution itself, in milliseconds (queueing not included).
    #[serde(default = "default_timeout_ms")]
    #[cfg_attr(feature = "schema", schemars(range(min = 1)))]
    pub timeout_ms: u64,
    /// Longest wait in the scheduler's queue, in milliseconds from its arrival there: an
    /// action not started by then is rejected `queue_timeout` (nothing ran). No limit when
    /// absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schema", schemars(range(min = 1)))]
    pub queue_timeout_ms: Option<u64>,
    /// What to do; its `kind` field selects the variant.
    pub spec: ActionSpec,
}

/// The kind-specific part of an action, tagged by `kind`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ActionSpec {
    /// Create the trajectory's container. Holds memory, not cores.
    SandboxOpen(SandboxOpen),
    /// Run a command in the trajectory's container with an elastic number of cores.
    SandboxExec(SandboxExec),
    /// Remove the trajectory's container.
    SandboxClose(SandboxClose),
    /// Score a batch of inputs with a reward or teacher model service on GPUs.
    Reward(Reward),
    /// Call an external API through the fleet's quota and credentials.
    Api(Api),
}

/// The kinds of action, as they appear in subjects, messages and metric labels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum ActionKind {
    /// See [`ActionSpec::SandboxOpen`].
    SandboxOpen,
    /// See [`ActionSpec::SandboxExec`].
    SandboxExec,
    /// See [`ActionSpec::SandboxClose`].
    SandboxClose,
    /// See [`ActionSpec::Reward`].
    Reward,
    /// See [`ActionSpec::Api`].
    Api,
}

impl ActionKind {
    /// Every kind, in a fixed order.
    pub const ALL: [ActionKind; 5] = [
        ActionKind::SandboxOpen,
        ActionKind::SandboxExec,
        ActionKind::SandboxClose,
        ActionKind::Reward,
        ActionKind::Api,
    ];

    /// The kind's wire name (`sandbox_exec`).
    pub fn as_str(self) -> &'static str {
        match self {
            ActionKind::SandboxOpen => "sandbox_open",
            ActionKind::SandboxExec => "sandbox_exec",
            ActionKind::SandboxClose => "sandbox_close",
            ActionKind::Reward => "reward",
            ActionKind::Api => "api",
        }
    }

    /// Parses a wire name.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.as_str() == s)
    }
}

/// `sandbox_open`: create the trajectory's container.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct SandboxOpen {
    /// Container image; the worker's default sandbox image when absent.
    #[serde(default)]
    pub image: Option<String>,
    /// Memory limit of the container, in MiB. Reserved on the worker while the sandbox lives.
    #[serde(default = "SandboxOpen::default_memory_mb")]
    #[cfg_attr(feature = "schema", schemars(range(min = 16)))]
    pub memory_mb: u64,
    /// Size of the writable tmpfs working directory `/work`, in MiB (counts against memory).
    #[serde(default = "SandboxOpen::default_workdir_mb")]
    #[cfg_attr(feature = "schema", schemars(range(min = 1)))]
    pub workdir_mb: u64,
    /// Environment set for every command run in the sandbox.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Close the sandbox once no action has used it for this long, in milliseconds; the
    /// fleet's default when absent, and at most the fleet's maximum.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schema", schemars(range(min = 1000)))]
    pub idle_timeout_ms: Option<u64>,
}

impl SandboxOpen {
    fn default_memory_mb() -> u64 {
        512
    }
    fn default_workdir_mb() -> u64 {
        64
    }
}

impl Default for SandboxOpen {
    fn default() -> Self {
        Self {
            image: None,
            memory_mb: Self::default_memory_mb(),
            workdir_mb: Self::default_workdir_mb(),
            env: BTreeMap::new(),
            idle_timeout_ms: None,
        }
    }
}

/// `reward`: score a batch of inputs with a declared reward or teacher service. The
/// scheduler routes it to a resident replica of the service, restoring one first when none
/// is resident (Evict-on-Execution); the result carries one score per input.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Reward {
    /// The service, as declared in the fleet's config.
    pub service: String,
    /// The texts to score, in order.
    #[cfg_attr(feature = "schema", schemars(length(min = 1)))]
    pub inputs: Vec<String>,
    /// Options passed through to the service (engine-specific, e.g. `"model"`).
    #[serde(default)]
    pub options: BTreeMap<String, String>,
}

/// `api`: one HTTP call to an external provider declared in the fleet's config. The
/// scheduler admits it under the provider's pooled quota (rate, burst, concurrency, fair
/// shares between jobs); a worker makes the call with the fleet's credentials, which
/// rollouts never see.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Api {
    /// The provider, as declared in the fleet's config.
    pub provider: String,
    /// HTTP method, upper case (`GET`, `POST`, ...).
    #[serde(default = "Api::default_method")]
    pub method: String,
    /// Path under the provider's base URL, starting with `/`.
    pub path: String,
    /// Query parameters.
    #[serde(default)]
    pub query: BTreeMap<String, String>,
    /// Request body (UTF-8), for methods that take one.
    #[serde(default)]
    pub body: Option<String>,
    /// Request headers; only those the provider's config allows are accepted.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
}

impl Api {
    fn default_method() -> String {
        "GET".into()
    }

    /// Checks what can be checked without the provider's config: a method token, and a path
    /// that stays under the base URL.
    pub fn check(&self) -> Result<(), String> {
        if self.provider.is_empty() || self.provider.len() > 128 {
            return Err("provider must be a name of 1 to 128 characters".into());
        }
        if self.method.is_empty() || !self.method.bytes().all(|b| b.is_ascii_uppercase()) {
            return Err(format!(
                "method {:?} is not an upper-case HTTP method",
                self.method
            ));
        }
        let p = &self.path;
        if !p.starts_with('/')
            || p.starts_with("//")
            || p.contains("..")
            || p.contains("://")
            || p.contains(['@', '?', '#', '\\'])
            || p.chars().any(|c| c.is_control() || c == ' ')
        {
            return Err(format!(
                "path {p:?} must start with one '/', and hold no '..', '@', '?', '#', spaces or control characters (put query parameters in query)"
            ));
        }
        for (k, v) in &self.headers {
            if k.is_empty()
                || k.chars().any(|c| c.is_control() || c == ':' || c == ' ')
                || v.chars().any(char::is_control)
            {
                return Err(format!("header {k:?} is not a valid name: value pair"));
            }
        }
        Ok(())
    }
}

/// An elastic range of cores, inclusive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct CpuRange {
    /// Fewest cores the command can run with.
    #[cfg_attr(feature = "schema", schemars(range(min = 1)))]
    pub min: u32,
    /// Most cores the command can use.
    #[cfg_attr(feature = "schema", schemars(range(min = 1)))]
    pub max: u32,
}

impl Default for CpuRange {
    fn default() -> Self {
        Self { min: 1, max: 1 }
    }
}

/// `sandbox_exec`: run a command in the trajectory's container.
///
/// The command sees its core count as the `TANGRAM_CPUS` environment variable, and every
/// `{cpus}` in `argv` is replaced by it.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct SandboxExec {
    /// Program and arguments; not run through a shell.
    #[cfg_attr(feature = "schema", schemars(length(min = 1)))]
    pub argv: Vec<String>,
    /// Elastic core range.
    #[serde(default)]
    pub cpus: CpuRange,
    /// Files written into the working directory `/work` before the command runs, by relative
    /// path, as UTF-8 text.
    #[serde(default)]
    pub files: BTreeMap<String, String>,
    /// Extra environment variables for this command.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Text fed to the command's standard input, which is closed afterwards.
    #[serde(default)]
    pub stdin: Option<String>,
}

/// `sandbox_close`: remove the trajectory's container.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct SandboxClose {
    /// Set only on closes the scheduler submits itself (absent on a rollout's): why it
    /// closed the sandbox. Its result, on the job's results subject, is the job's notice.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<CloseReason>,
}

/// Why the scheduler closed a sandbox no rollout asked it to close.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum CloseReason {
    /// No action used it for its idle timeout.
    IdleTimeout,
    /// Someone closed every sandbox of its job (`tangram close --job`, `close_job()`).
    JobClosed,
    /// Its job's rollout lease ran out: the rollout stopped renewing it.
    LeaseExpired,
}

impl CloseReason {
    /// Its wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::IdleTimeout => "idle_timeout",
            Self::JobClosed => "job_closed",
            Self::LeaseExpired => "lease_expired",
        }
    }
}

/// What an action needs from a worker while it runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Demand {
    /// Elastic core range; `None` for actions that hold no cores.
    pub cores: Option<CpuRange>,
    /// Memory reserved, in MiB.
    pub mem_mb: u64,
}

/// Bounds that validation enforces; they come from the scheduler's config.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Longest timeout accepted, in milliseconds.
    pub max_timeout_ms: u64,
    /// Most files one exec may carry.
    pub max_files: usize,
    /// Most inputs one reward action may carry.
    pub max_reward_inputs: usize,
    /// Longest idle timeout an open may ask for, in milliseconds.
    pub max_idle_timeout_ms: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_timeout_ms: 3_600_000,
            max_files: 1024,
            max_reward_inputs: 4096,
            max_idle_timeout_ms: 86_400_000,
        }
    }
}

impl Action {
    /// The kind of this action.
    pub fn kind(&self) -> ActionKind {
        match self.spec {
            ActionSpec::SandboxOpen(_) => ActionKind::SandboxOpen,
            ActionSpec::SandboxExec(_) => ActionKind::SandboxExec,
            ActionSpec::SandboxClose(_) => ActionKind::SandboxClose,
            ActionSpec::Reward(_) => ActionKind::Reward,
            ActionSpec::Api(_) => ActionKind::Api,
        }
    }

    /// The resources this action declares.
    pub fn demand(&self) -> Demand {
        match &self.spec {
            ActionSpec::SandboxOpen(o) => Demand {
                cores: None,
                mem_mb: o.memory_mb,
            },
            ActionSpec::SandboxExec(e) => Demand {
                cores: Some(e.cpus),
                mem_mb: 0,
            },
            ActionSpec::SandboxClose(_) | ActionSpec::Reward(_) | ActionSpec::Api(_) => {
                Demand::default()
            }
        }
    }

    /// Checks everything that can be checked without knowing the cluster.
    pub fn validate(&self, limits: &Limits) -> Result<(), Rejection> {
        let invalid = |reason: String| Rejection::new(RejectCode::InvalidField, reason);
        for check in [self.id.check(), self.job.check(), self.trajectory.check()] {
            check.map_err(|e| invalid(e.to_string()))?;
        }
        if self.timeout_ms == 0 || self.timeout_ms > limits.max_timeout_ms {
            return Err(invalid(format!(
                "timeout_ms is {}; it must be between 1 and {}",
                self.timeout_ms, limits.max_timeout_ms
            )));
        }
        if let Some(t) = self.queue_timeout_ms {
            if t == 0 || t > limits.max_timeout_ms {
                return Err(invalid(format!(
                    "queue_timeout_ms is {t}; it must be between 1 and {}",
                    limits.max_timeout_ms
                )));
            }
        }
        match &self.spec {
            ActionSpec::SandboxOpen(o) => {
                if o.memory_mb < 16 {
                    return Err(invalid(format!(
                        "memory_mb is {}; the least is 16",
                        o.memory_mb
                    )));
                }
                if o.workdir_mb == 0 || o.workdir_mb > o.memory_mb {
                    return Err(invalid(format!(
                        "workdir_mb is {}; it must be between 1 and memory_mb ({})",
                        o.workdir_mb, o.memory_mb
                    )));
                }
                if let Some(image) = &o.image {
                    if image.is_empty() || image.chars().any(char::is_whitespace) {
                        return Err(invalid(format!(
                            "image {image:?} is not an image reference"
                        )));
                    }
                }
                check_env(&o.env).map_err(invalid)?;
                if let Some(t) = o.idle_timeout_ms {
                    if t < 1_000 || t > limits.max_idle_timeout_ms {
                        return Err(invalid(format!(
                            "idle_timeout_ms is {t}; it must be between 1000 and the fleet's maximum {}",
                            limits.max_idle_timeout_ms
                        )));
                    }
                }
            }
            ActionSpec::SandboxExec(e) => {
                if e.argv.is_empty() || e.argv[0].is_empty() {
                    return Err(invalid(
                        "argv is empty; it needs at least the program".into(),
                    ));
                }
                if e.argv.iter().any(|a| a.contains('\0')) {
                    return Err(invalid("argv holds a NUL byte".into()));
                }
                if e.cpus.min == 0 || e.cpus.min > e.cpus.max {
                    return Err(invalid(format!(
                        "cpus is [{}, {}]; it needs 1 <= min <= max",
                        e.cpus.min, e.cpus.max
                    )));
                }
                if e.files.len() > limits.max_files {
                    return Err(invalid(format!(
                        "{} files; the limit is {}",
                        e.files.len(),
                        limits.max_files
                    )));
                }
                for path in e.files.keys() {
                    check_relative_path(path).map_err(invalid)?;
                }
                check_env(&e.env).map_err(invalid)?;
            }
            ActionSpec::SandboxClose(_) => {}
            ActionSpec::Api(api) => api.check().map_err(invalid)?,
            ActionSpec::Reward(r) => {
                if r.service.is_empty() || r.service.len() > 128 {
                    return Err(invalid(
                        "service must be a name of 1 to 128 characters".into(),
                    ));
                }
                if r.inputs.is_empty() {
                    return Err(invalid(
                        "inputs is empty; a reward action scores at least one input".into(),
                    ));
                }
                if r.inputs.len() > limits.max_reward_inputs {
                    return Err(invalid(format!(
                        "{} inputs; the limit is {}",
                        r.inputs.len(),
                        limits.max_reward_inputs
                    )));
                }
            }
        }
        Ok(())
    }
}

fn check_env(env: &BTreeMap<String, String>) -> Result<(), String> {
    for (k, v) in env {
        if k.is_empty() || k.contains('=') || k.contains('\0') || v.contains('\0') {
            return Err(format!(
                "environment variable {k:?} is not a valid name=value pair"
            ));
        }
    }
    Ok(())
}

/// A file path inside the working directory: relative, no `..`, no empty components.
fn check_relative_path(path: &str) -> Result<(), String> {
    let bad = path.is_empty()
        || path.starts_with('/')
        || path.contains('\0')
        || path
            .split('/')
            .any(|c| c.is_empty() || c == "." || c == "..")
        || path.len() > 1024;
    if bad {
        Err(format!(
            "file path {path:?} must be relative to /work, without '..' or empty parts"
        ))
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exec(argv: &[&str]) -> Action {
        Action {
            queue_timeout_ms: None,
            id: ActionId::new("a1").unwrap(),
            job: JobId::new("j1").unwrap(),
            trajectory: TrajectoryId::new("t1").unwrap(),
            timeout_ms: 1000,
            spec: ActionSpec::SandboxExec(SandboxExec {
                argv: argv.iter().map(|s| s.to_string()).collect(),
                ..Default::default()
            }),
        }
    }

    #[test]
    fn validation_explains_bad_fields() {
        assert!(exec(&["true"]).validate(&Limits::default()).is_ok());
        let err = exec(&[]).validate(&Limits::default()).unwrap_err();
        assert_eq!(err.code, RejectCode::InvalidField);
        assert!(err.reason.contains("argv"));

        let mut a = exec(&["true"]);
        if let ActionSpec::SandboxExec(e) = &mut a.spec {
            e.cpus = CpuRange { min: 4, max: 2 };
        }
        assert!(a
            .validate(&Limits::default())
            .unwrap_err()
            .reason
            .contains("cpus"));

        for path in ["/etc/passwd", "../x", "a//b", "a/./b", ""] {
            let mut a = exec(&["true"]);
            if let ActionSpec::SandboxExec(e) = &mut a.spec {
                e.files.insert(path.into(), "x".into());
            }
            assert!(a.validate(&Limits::default()).is_err(), "{path:?} accepted");
        }
        let mut a = exec(&["true"]);
        a.timeout_ms = 0;
        assert!(a.validate(&Limits::default()).is_err());
    }

    #[test]
    fn demand_follows_kind() {
        let a = exec(&["true"]);
        assert_eq!(a.demand().cores, Some(CpuRange { min: 1, max: 1 }));
        let open = Action {
            spec: ActionSpec::SandboxOpen(SandboxOpen::default()),
            ..a
        };
        assert_eq!(
            open.demand(),
            Demand {
                cores: None,
                mem_mb: 512
            }
        );
    }
}
