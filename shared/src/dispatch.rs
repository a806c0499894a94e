//! Dispatches: the scheduler's decision to run an action on a worker.

use crate::action::Action;
use crate::codec::Encoding;
use serde::{Deserialize, Serialize};

/// What the scheduler granted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
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
}
