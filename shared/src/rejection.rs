//! Why an action is rejected: the code (a small closed set, also a metric label and a
//! dead-letter subject) and the reason. A leaf: both the action's validation and the result
//! use it.

use serde::{Deserialize, Serialize};

/// Why an action was rejected. A small closed set: it doubles as a metric label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum RejectCode {
    /// The payload is not valid msgpack or JSON, or not an action.
    Undecodable,
    /// `spec.kind` names no known action kind.
    UnknownKind,
    /// A field is missing or has a bad value.
    InvalidField,
    /// The message is larger than the scheduler accepts.
    Oversized,
    /// No worker in the fleet could ever satisfy the demand.
    Unsatisfiable,
    /// An exec or close names a trajectory that has no open sandbox.
    NoSandbox,
    /// A reward action names a service the fleet does not declare.
    UnknownService,
    /// An api action names a provider the fleet does not declare.
    UnknownProvider,
    /// An api action's method, path or header is not allowed by its provider's config.
    NotAllowed,
    /// An open names a trajectory that already has a sandbox.
    SandboxExists,
    /// The subject, header and body disagree (job or action id).
    Mismatch,
    /// The job already has as many actions queued at the scheduler as its cap allows;
    /// nothing ran (submit it again later, under a new id).
    QueueFull,
    /// The action waited in the queue past its `queue_timeout_ms`; nothing ran.
    QueueTimeout,
}

impl RejectCode {
    /// The code's wire name, also used in dead-letter subjects.
    pub fn as_str(self) -> &'static str {
        match self {
            RejectCode::Undecodable => "undecodable",
            RejectCode::UnknownKind => "unknown_kind",
            RejectCode::InvalidField => "invalid_field",
            RejectCode::Oversized => "oversized",
            RejectCode::Unsatisfiable => "unsatisfiable",
            RejectCode::NoSandbox => "no_sandbox",
            RejectCode::UnknownService => "unknown_service",
            RejectCode::UnknownProvider => "unknown_provider",
            RejectCode::NotAllowed => "not_allowed",
            RejectCode::SandboxExists => "sandbox_exists",
            RejectCode::Mismatch => "mismatch",
            RejectCode::QueueFull => "queue_full",
            RejectCode::QueueTimeout => "queue_timeout",
        }
    }
}

/// A rejection: a code and a reason.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{code:?}: {reason}")]
pub struct Rejection {
    /// Class.
    pub code: RejectCode,
    /// Explanation for a person.
    pub reason: String,
}

impl Rejection {
    /// Builds a rejection.
    pub fn new(code: RejectCode, reason: impl Into<String>) -> Self {
        Self {
            code,
            reason: reason.into(),
        }
    }
}
