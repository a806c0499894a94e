//! What identifies a dispatch, and which of several stored dispatches of one action counts:
//! rules the engine's retries and adoption depend on, so they are decided here and the
//! shell only carries them out.

use tangram_shared::{Dispatch, WorkerId};

/// A dispatch's `Nats-Msg-Id`: `<action>:<epoch>:<worker>`, the same for every attempt of one
/// scheduler epoch to one worker. When a store went through but its acknowledgement was
/// lost, the engine retries to that same worker ([`super::Effect::Dispatch`] after a
/// `DispatchFailed`, pinned), and JetStream's duplicate window drops the retry instead of
/// running the action twice. A dispatch to another worker is a different message with its
/// own id: were it to share one, JetStream would drop it as a duplicate of the first and the
/// action would never run.
pub fn dispatch_msg_id(worker: &WorkerId, dispatch: &Dispatch) -> String {
    format!("{}:{}:{worker}", dispatch.action.id, dispatch.epoch)
}

/// Of the dispatches of one action found stored (one per worker tried, at most), the one that
/// counts: the latest epoch, then the latest attempt, then the latest submission. Earlier
/// ones were superseded by a retry the engine made after their store was refused.
pub fn latest_dispatch(
    found: impl IntoIterator<Item = (WorkerId, Dispatch)>,
) -> Option<(WorkerId, Dispatch)> {
    found
        .into_iter()
        .max_by_key(|(_, d)| (d.epoch, d.attempt, d.submitted_at_us))
}
