//! Dispatches: the scheduler's decision to run an action on a worker.

use crate::action::Action;
use crate::codec::Encoding;
use crate::heartbeat::ChunkRef;
use serde::{Deserialize, Serialize};

/// What the scheduler granted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Grant {
    /// Cores to grant for the run (0 for actions that hold none).
    pub cores: u32,
    /// Memory reserved, in MiB.
    pub mem_mb: u64,
}

/// Published on `tangram.v1.dispatch.<worker>`: run `action` with `grant`.
///
/// Workers refuse dispatches whose `epoch` is older than the newest they have seen, so a
/// deposed scheduler cannot start work.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Dispatch {
    /// The scheduler's epoch, increasing across scheduler restarts.
    pub epoch: u64,
    /// Dispatch attempt for this action, starting at 1.
    pub attempt: u32,
    /// The action.
    pub action: Action,
    /// The allocation.
    pub grant: Grant,
    /// When the action arrived in JetStream, in Unix microseconds (for the queued time).
    pub submitted_at_us: u64,
    /// Encoding the submitter used; the result is written in the same one.
    #[serde(default)]
    pub result_encoding: Encoding,
    /// `reward`: the replica to use, and what to evict first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<GpuRoute>,
    /// The worker instance the scheduler placed it on (the heartbeat's `instance`). A worker
    /// refuses a dispatch addressed to an instance that was fenced (declared lost): its
    /// action has been settled already. Absent from older schedulers: not checked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance: Option<String>,
}

/// The scheduler's Evict-on-Execution decision for one reward action.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct GpuRoute {
    /// The service.
    pub service: String,
    /// The replica's GPUs on the worker.
    pub chunk: ChunkRef,
    /// True when the replica is evicted and this action restores it.
    pub restore: bool,
    /// Replicas on the same worker to put to sleep first, least recently used first.
    #[serde(default)]
    pub evict: Vec<Evict>,
}

/// A replica to evict.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Evict {
    /// Its service.
    pub service: String,
    /// Its GPUs.
    pub chunk: ChunkRef,
}

/// A change to the cores of a dispatched `sandbox_exec` while it runs (malleable policies,
/// `tangram-v2`), published on [`crate::subject::regrant`] after the dispatch is stored. The
/// worker widens or narrows the exec's cpuset and CPU quota; one that no longer runs the
/// action (or runs another attempt) ignores it. Memory is unchanged.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Regrant {
    /// The scheduler's epoch (a worker refuses one older than the newest it knows).
    pub epoch: u64,
    /// The action.
    pub id: crate::ActionId,
    /// The dispatch attempt it amends.
    pub attempt: u32,
    /// The new grant.
    pub grant: Grant,
    /// A number increasing with each re-size of this attempt: a worker applies only one
    /// newer than the last it applied.
    pub seq: u64,
}
