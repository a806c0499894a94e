//! Heartbeats: a worker's inventory and liveness, on `tangram.v1.heartbeat.<worker>`.

use crate::ids::{ActionId, JobId, TrajectoryId, WorkerId};
use serde::{Deserialize, Serialize};

/// A sandbox a worker holds.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct SandboxRef {
    /// Owning job.
    pub job: JobId,
    /// Owning trajectory.
    pub trajectory: TrajectoryId,
    /// Memory it reserves, in MiB.
    pub mem_mb: u64,
}

/// Sent by every worker every `interval_ms`, and once with `draining = true` when it stops.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
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
    /// Sandboxes held now.
    #[serde(default)]
    pub sandboxes: Vec<SandboxRef>,
    /// True when the worker takes no new work (shutting down).
    #[serde(default)]
    pub draining: bool,
}
