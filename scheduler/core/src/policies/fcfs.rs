//! FCFS first-fit: the foundation policy, a stand-in until the elastic policy lands.
//!
//! Scans the queue in arrival order; each action goes to the first allowed worker (by id)
//! that has its minimum cores and its memory free, and gets as many cores as it can use up to
//! its maximum. Actions that do not fit are skipped, not blocking the ones behind them.

use super::select::{fixed_fifo, Cores, Pick};
use crate::model::{Pending, Plan, Policy, Snapshot};

/// See the module docs.
#[derive(Debug, Clone, Copy, Default)]
pub struct FcfsFirstFit;

impl FcfsFirstFit {
    /// Its name in the scheduler's config and the simulator.
    pub const NAME: &'static str = "fcfs-first-fit";
}

impl Policy for FcfsFirstFit {
    fn boxed(&self) -> Box<dyn Policy> {
        Box::new(*self)
    }
    fn name(&self) -> &'static str {
        Self::NAME
    }

    /// The shared FCFS selection with first-fit placement: feasibility and every reason for
    /// not launching are the same as for the other policies.
    fn schedule(&self, snapshot: &Snapshot, pending: &[Pending], _now_ms: u64) -> Plan {
        fixed_fifo(snapshot, pending, Pick::FirstById, Cores::UpToMax)
    }
}
