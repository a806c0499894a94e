//! Tangram's decision engine ([`Engine`]: `handle(event, now) -> effects`) and, inside it,
//! the scheduling core (a pure function from a cluster snapshot, the pending queue and the
//! current time to a plan). See `README.md` beside this crate for the vocabulary and the
//! invariants, and `scheduler/README.md` for the lifecycles.
//!
//! No channels, locks, clocks or I/O live here, so the same code runs in the scheduler
//! service, in tests and in the simulator, and its decisions are reproducible.
#![forbid(unsafe_code)]

pub mod elastic;
pub mod engine;
pub mod gpu;
pub mod learn;
mod model;
pub mod policies;
pub mod quota;
pub mod sim;
/// The API workloads' simulation (`sim/api.rs`), by its older path.
pub use sim::api as sim_api;
/// The GPU workloads' simulation (`sim/gpu.rs`), by its older path.
pub use sim::gpu as sim_gpu;

pub use elastic::{ElasticModel, Speedup};
pub use engine::{Effect, Engine, EngineConfig, Event, Now, PendingResize};
pub use gpu::{Chunk, Eoe, GpuGroup, Route, ServiceSpec, Unrouted};
pub use model::{
    Constraint, ImageNeed, Launch, NeverReason, Pending, Plan, Policy, Provisioning, Snapshot,
    Unplaced, WaitReason, WorkerView,
};
pub use policies::{by_name, Tangram};
pub use policies::{v2, FcfsFirstFit};
pub use v2::TangramV2;

/// Runs the default policy (`tangram`).
pub fn schedule(snapshot: &Snapshot, pending: &[Pending], now_ms: u64) -> Plan {
    Tangram::default().schedule(snapshot, pending, now_ms)
}
