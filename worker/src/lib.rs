//! Tangram's CPU worker: runs dispatched sandbox actions in hardened Docker containers with
//! Allocate-on-Execution core grants, and reports results.
//!
//! A sandbox holds memory, not cores: it sits parked on a parking cpuset at 1% of a core.
//! Each `sandbox_exec` is granted its cores (cpuset and CFS quota) just before the command
//! starts and parked again right after; the grant goes through the cgroup files directly or
//! Docker's update API (`grant_mode`).
//!
//! On GPU hosts the same binary serves model services instead (`sandboxes = false`, a
//! `[gpu]` table and `[[service]]` entries): replicas deployed asleep, restored and evicted
//! as the scheduler's Evict-on-Execution routes say, scoring `reward` actions.
#![forbid(unsafe_code)]

pub mod cgroup;
pub mod config;
pub mod containment;
pub mod cpuset;
pub mod docker;
pub mod gpu;
pub mod memcg;
pub mod metrics;
pub mod pacer;
pub mod pool;
pub mod providers;
mod runtime;
pub mod sandbox;
pub mod services;
pub mod warm;

pub use config::Config;
pub use runtime::run;
