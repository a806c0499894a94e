//! Results: exactly one per action, on `tangram.v1.result.<job>.<action-id>`.

use crate::action::ActionKind;
use crate::ids::{ActionId, JobId, TrajectoryId, WorkerId};
pub use crate::rejection::{RejectCode, Rejection};
use serde::{Deserialize, Serialize};

/// How an action ended.
///
/// A command that exits non-zero is `completed` with that exit code: the action ran, and the
/// trainer may learn from its result. `infra_error` means the infrastructure failed and the
/// result says nothing about the model's work.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum Outcome {
    /// The action ran to the end. For `sandbox_exec`, the command's exit code; 0 otherwise.
    Completed {
        /// Exit code of the command (128 + n when killed by signal n).
        exit_code: i32,
    },
    /// The command ran past `timeout_ms` and its whole process tree was killed.
    TimedOut,
    /// The sandbox reached its memory limit while the command ran and the kernel killed a
    /// process of it (usually the command itself, then `exit_code` is 137). Distinct from
    /// `completed` so that a trainer can tell "the program crashed" from "the program needed
    /// more memory than the sandbox has".
    OutOfMemory {
        /// Exit code of the command (137 when it was the process killed).
        exit_code: i32,
    },
    /// The action was refused before it ran; `reason` says why.
    Rejected {
        /// Machine-readable class of the refusal.
        code: RejectCode,
        /// What was wrong, for a person.
        reason: String,
    },
    /// The infrastructure failed (Docker error, worker lost); `reason` says how.
    InfraError {
        /// Machine-readable class of the failure.
        code: InfraCode,
        /// What failed, for a person.
        reason: String,
    },
}

impl Outcome {
    /// A bounded label for metrics.
    pub fn label(&self) -> &'static str {
        match self {
            Outcome::Completed { .. } => "completed",
            Outcome::TimedOut => "timed_out",
            Outcome::OutOfMemory { .. } => "out_of_memory",
            Outcome::Rejected { .. } => "rejected",
            Outcome::InfraError { .. } => "infra_error",
        }
    }
}

/// Why the infrastructure failed an action. A small closed set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum InfraCode {
    /// The container runtime returned an error.
    Runtime,
    /// The worker running the action stopped or went silent.
    WorkerLost,
    /// A model service replica failed (crashed, did not restore, answered with an error).
    Service,
    /// An external API could not be reached (connection refused, TLS or DNS failure).
    Provider,
    /// The sandbox container disappeared (worker restart, removed by hand).
    SandboxLost,
    /// Cores could not be granted or parked.
    Grant,
    /// The worker was shutting down and handed the action back.
    Shutdown,
    /// The dispatch came from a scheduler that has since been superseded (an older epoch);
    /// the worker did not run it.
    StaleEpoch,
    /// The dispatch carried an epoch no scheduler has held (forged, or from a scheduler that
    /// never registered); the worker did not run it.
    UnknownEpoch,
}

impl InfraCode {
    /// The code's wire name (as serialized), also a metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            InfraCode::Runtime => "runtime",
            InfraCode::WorkerLost => "worker_lost",
            InfraCode::Service => "service",
            InfraCode::Provider => "provider",
            InfraCode::SandboxLost => "sandbox_lost",
            InfraCode::Grant => "grant",
            InfraCode::Shutdown => "shutdown",
            InfraCode::StaleEpoch => "stale_epoch",
            InfraCode::UnknownEpoch => "unknown_epoch",
        }
    }
}

impl Outcome {
    /// The rejection or infrastructure code of a failure, `none` for the other outcomes: a
    /// bounded metric label.
    pub fn code_label(&self) -> &'static str {
        match self {
            Outcome::Rejected { code, .. } => code.as_str(),
            Outcome::InfraError { code, .. } => code.as_str(),
            _ => "none",
        }
    }
}

impl From<Rejection> for Outcome {
    fn from(r: Rejection) -> Self {
        Outcome::Rejected {
            code: r.code,
            reason: r.reason,
        }
    }
}

/// Where an action ran.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Placement {
    /// The worker.
    pub worker: WorkerId,
    /// Cores granted (0 for actions that hold none).
    pub cores: u32,
    /// The host CPUs granted, in cpuset list syntax (`"2-3"`); empty when none.
    #[serde(default)]
    pub cpuset: String,
}

/// Where the time went, in microseconds. `act_us` = `queued_us + overhead_us + exec_us`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Timing {
    /// From the action's arrival in JetStream to the worker starting it.
    pub queued_us: u64,
    /// Worker-side setup and teardown: granting and parking cores, writing files, container
    /// creation for opens.
    pub overhead_us: u64,
    /// The command itself.
    pub exec_us: u64,
    /// Action completion time: the sum of the three.
    pub act_us: u64,
    /// Of `overhead_us`, the time an open spent pulling its image (absent or 0: no pull).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub pull_us: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl Timing {
    /// Builds a timing whose `act_us` is the sum of its parts.
    pub fn new(queued_us: u64, overhead_us: u64, exec_us: u64) -> Self {
        Self {
            queued_us,
            overhead_us,
            exec_us,
            act_us: queued_us + overhead_us + exec_us,
            pull_us: 0,
        }
    }
}

/// The result of one action.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ActionResult {
    /// The action's id.
    pub id: ActionId,
    /// The action's job.
    pub job: JobId,
    /// The action's trajectory, when it could be read.
    #[serde(default)]
    pub trajectory: Option<TrajectoryId>,
    /// The action's kind, when it could be read.
    #[serde(default)]
    pub kind: Option<ActionKind>,
    /// How it ended.
    pub outcome: Outcome,
    /// Captured standard output (UTF-8, invalid bytes replaced), up to the worker's cap.
    #[serde(default)]
    pub stdout: String,
    /// Captured standard error, up to the worker's cap.
    #[serde(default)]
    pub stderr: String,
    /// True when stdout or stderr was cut at the cap.
    #[serde(default)]
    pub truncated: bool,
    /// Where it ran; absent when it never ran.
    #[serde(default)]
    pub placement: Option<Placement>,
    /// Timing breakdown.
    #[serde(default)]
    pub timing: Timing,
    /// Dispatch attempt that produced this result (0 when never dispatched).
    #[serde(default)]
    pub attempt: u32,
    /// When the result was produced, in Unix milliseconds.
    #[serde(default)]
    pub finished_at_ms: u64,
    /// `reward`: one score per input, in order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scores: Option<Vec<f64>>,
    /// `reward`: the replica that served it and whether it had to be restored first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<ServiceUse>,
    /// `api`: the provider's reply.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http: Option<HttpReply>,
}

/// An external API's reply to an `api` action.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct HttpReply {
    /// HTTP status code.
    pub status: u16,
    /// The reply headers the provider's config lets through, names in lower case.
    #[serde(default)]
    pub headers: std::collections::BTreeMap<String, String>,
    /// The body (UTF-8, invalid bytes replaced), up to the provider's cap.
    #[serde(default)]
    pub body: String,
    /// True when the body was cut at the cap.
    #[serde(default)]
    pub truncated: bool,
}

/// How a `reward` action used its service.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ServiceUse {
    /// The service.
    pub service: String,
    /// The GPUs of the replica, as indices on the worker.
    pub gpus: Vec<u32>,
    /// True when the replica was evicted and had to be restored for this action (its time is
    /// in `timing.overhead_us`).
    pub restored: bool,
    /// Replicas evicted to make room, as service names.
    #[serde(default)]
    pub evicted: Vec<String>,
}

impl ActionResult {
    /// A result for an action that never ran.
    pub fn rejected(id: ActionId, job: JobId, rejection: Rejection, finished_at_ms: u64) -> Self {
        Self::new(id, job, rejection.into(), finished_at_ms)
    }

    /// A result with the given outcome and nothing else filled in yet.
    pub fn new(id: ActionId, job: JobId, outcome: Outcome, finished_at_ms: u64) -> Self {
        Self {
            id,
            job,
            trajectory: None,
            kind: None,
            outcome,
            stdout: String::new(),
            stderr: String::new(),
            truncated: false,
            placement: None,
            timing: Timing::default(),
            attempt: 0,
            finished_at_ms,
            scores: None,
            service: None,
            http: None,
        }
    }

    /// Fills in the action's trajectory, kind and attempt.
    pub fn for_action(mut self, action: &crate::Action, attempt: u32) -> Self {
        self.trajectory = Some(action.trajectory.clone());
        self.kind = Some(action.kind());
        self.attempt = attempt;
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn infra_code_labels_are_the_wire_names() {
        use InfraCode::*;
        for code in [
            Runtime,
            WorkerLost,
            Service,
            Provider,
            SandboxLost,
            Grant,
            Shutdown,
            StaleEpoch,
            UnknownEpoch,
        ] {
            let wire = serde_json::to_value(code).unwrap();
            assert_eq!(wire.as_str(), Some(code.as_str()));
        }
        let lost = Outcome::InfraError {
            code: WorkerLost,
            reason: String::new(),
        };
        assert_eq!(lost.code_label(), "worker_lost");
        assert_eq!(Outcome::TimedOut.code_label(), "none");
    }
}
