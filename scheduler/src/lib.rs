//! Tangram's scheduler service.
//!
//! One task owns the cluster state ([`state::Scheduler`]); intake, result and heartbeat tasks
//! feed it through one bounded channel. Each cycle it builds a snapshot, calls the pure core
//! (the configured policy, `tangram` by default) and carries out the plan: a launch is published as a dispatch,
//! counted against the worker at once (so two cycles never book the same cores), and the
//! action is acked only after the dispatch publish is acknowledged by JetStream.
#![forbid(unsafe_code)]

pub mod config;
pub mod metrics;
mod service;
mod state;

pub use config::Config;
pub use service::run;
