//! `tangram-v2`: the reference policy's launches, with malleable grants. Running elastic
//! execs are re-sized after every cycle (`engine/resize.rs`): widened when cores free up,
//! narrowed when arrivals need them, so that cores are shared by what runs now rather than
//! by what happened to arrive together. On GPUs it lets replicas follow demand between
//! services (`Eoe::rebalance`).

use crate::model::{Pending, Plan, Policy, Snapshot};
use crate::policies::Tangram;

/// See the module docs.
#[derive(Debug, Clone, Copy, Default)]
pub struct TangramV2 {
    /// Launch decisions.
    pub base: Tangram,
}

impl Policy for TangramV2 {
    fn name(&self) -> &'static str {
        "tangram-v2"
    }
    fn schedule(&self, snapshot: &Snapshot, pending: &[Pending], now_ms: u64) -> Plan {
        self.base.schedule(snapshot, pending, now_ms)
    }
    fn malleable(&self) -> bool {
        true
    }
    fn rebalances_gpus(&self) -> bool {
        true
    }
    fn boxed(&self) -> Box<dyn Policy> {
        Box::new(*self)
    }
}
