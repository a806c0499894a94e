//! The Tangram wire contract, protocol v1.
//!
//! Everything that crosses NATS is defined here: identifiers, resource quantities, the
//! action, dispatch, result and heartbeat messages, the subject and stream names, and the
//! codec. `docs/PROTOCOL.md` describes the same contract for people writing clients in other
//! languages; the golden-bytes tests in `tests/golden.rs` keep the two honest.
//!
//! This crate is the only caller of `rmp-serde`, and it has no async runtime.
#![forbid(unsafe_code)]

pub mod action;
pub mod build;
pub mod codec;
pub mod dispatch;
pub mod fit;
pub mod heartbeat;
pub mod ids;
pub mod image;
pub mod metric;
pub mod pacing;
#[cfg(feature = "plot")]
pub mod plot;
pub mod rejection;
pub mod result;
#[cfg(feature = "schema")]
pub mod schema;
pub mod stats;
pub mod status;
pub mod subject;

pub use action::{
    Action, ActionKind, ActionSpec, Api, CloseReason, CpuRange, Demand, Limits, Reward,
    SandboxClose, SandboxExec, SandboxOpen,
};
pub use codec::{DecodeFailure, Encoding};
pub use dispatch::{Dispatch, Evict, GpuRoute, Grant, Regrant};
pub use heartbeat::{
    ChunkRef, GpuInventory, Heartbeat, ImageReport, ProviderReport, ReplicaReport, SandboxRef,
    ServiceReport, WarmPoolReport,
};
/// GPUs per replica a service may use: chunks of 1, 2, 4 or 8 cards, aligned to their size
/// inside one NVLink group.
pub const CHUNK_SIZES: [u8; 4] = [1, 2, 4, 8];

/// How long a dispatch delivered to a worker and not acknowledged waits before JetStream
/// delivers it again (the worker consumer's `ack_wait`). A delivery lost in transit (a NATS
/// node died while carrying it) comes back within this, possibly after later dispatches.
pub const DISPATCH_REDELIVERY_MS: u64 = 10_000;

pub use ids::{ActionId, IdError, JobId, TrajectoryId, WorkerId};
pub use result::{
    ActionResult, HttpReply, InfraCode, Outcome, Placement, RejectCode, Rejection, ServiceUse,
    Timing,
};
