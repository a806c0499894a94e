//! Tangram's scheduler service.
//!
//! An I/O shell around the decision engine ([`tangram_core::Engine`]): every decision is the
//! engine's; this crate turns NATS messages into engine events and the engine's effects into
//! NATS messages. One task owns the engine ([`shell`]); intake, results, heartbeats, status
//! requests and ticks feed it through one bounded channel; the dispatcher stores dispatches
//! and awaits their PubAcks concurrently. A launch is booked at once (so two cycles never
//! book the same cores) and the action is acked only once its dispatch is durable. See
//! `README.md` beside this crate for the lifecycles.
#![forbid(unsafe_code)]

mod adopt;
mod channels;
mod closes;
pub mod config;
mod cordons;
mod dispatcher;
mod effects;
mod gate;
mod heartbeats;
mod held;
mod intake;
mod lease;
pub mod metrics;
mod outbox;
mod report;
mod service;
mod shell;
mod stored;
mod term;

pub use config::Config;
pub use service::run;
