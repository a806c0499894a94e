//! `tangram-v2`: the reference policy's launches, with malleable grants. Running elastic
//! execs are re-sized after every cycle (`engine/resize.rs`): widened when cores free up,
//! narrowed when arrivals need them, so that cores are shared by what runs now rather than
//! by what happened to arrive together. On GPUs it lets replicas follow demand between
//! services (`Eoe::rebalance`).

use super::tangram::Tangram;
use crate::model::{Pending, Plan, Policy, Provisioning, Snapshot};

/// See the module docs.
#[derive(Debug, Clone, Copy, Default)]
pub struct TangramV2 {
    /// Launch decisions.
    pub base: Tangram,
}

impl TangramV2 {
    /// Its name in the scheduler's config and the simulator.
    pub const NAME: &'static str = "tangram-v2";
}

impl Policy for TangramV2 {
    fn name(&self) -> &'static str {
        Self::NAME
    }
    fn schedule(&self, snapshot: &Snapshot, pending: &[Pending], now_ms: u64) -> Plan {
        self.base.schedule(snapshot, pending, now_ms)
    }
    fn provisioning(&self) -> Provisioning {
        Provisioning::Malleable
    }
    fn boxed(&self) -> Box<dyn Policy> {
        Box::new(*self)
    }
}
