//! What the scheduler's tasks send each other: the state task's input (from the intake,
//! the feeds, the dispatcher and its own lookups) and the dispatcher's. A leaf: it names
//! the messages, no task.

use crate::held::Incoming;
use tangram_core::Event;
use tangram_shared::{Dispatch, WorkerId};
use tokio::sync::oneshot;

/// What the other tasks send the state task.
#[derive(Debug)]
pub(crate) enum Input {
    /// An action message and what the intake made of it.
    Message(Box<Incoming>, Event),
    /// Anything else for the engine.
    Engine(Event),
    /// Someone asked for the status report.
    Status(oneshot::Sender<tangram_shared::status::Status>),
    /// Someone asked to close every sandbox of a job: the answer is how many are closing.
    CloseJob(tangram_shared::JobId, oneshot::Sender<u64>),
}

/// One dispatch to publish.
#[derive(Debug)]
pub(crate) struct Outgoing {
    pub(crate) worker: WorkerId,
    pub(crate) dispatch: Box<Dispatch>,
}

/// What the dispatcher publishes, one channel for both so their order holds on the wire.
#[derive(Debug)]
pub(crate) enum Publish {
    /// A dispatch: its store is reported to the engine.
    Dispatch(Outgoing),
    /// A re-size of a running exec, sent once.
    Regrant {
        worker: WorkerId,
        regrant: tangram_shared::Regrant,
    },
}
