//! Admission: whether a delivered dispatch runs here. The worker has the last word: the
//! scheduler may be stale (an older epoch), JetStream may deliver twice, and an earlier
//! instance of this worker may have died holding the action.

use super::{infra, unix_us, Worker};
use crate::metrics as m;
use crate::runtime::intake::Delivery;
use std::collections::{HashSet, VecDeque};
use tangram_shared::codec::{self, Encoding};
use tangram_shared::{ActionId, ActionResult, Dispatch, InfraCode, Timing};
use tracing::{debug, warn};

/// How many finished action ids are remembered to recognise a redelivered dispatch.
const RECENT: usize = 10_000;

/// What admission decided about one dispatch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Run it.
    Run,
    /// From a scheduler older than one already heard from: dropped, no result.
    StaleEpoch {
        /// The dispatch's epoch.
        epoch: u64,
        /// The newest epoch seen.
        newest: u64,
    },
    /// A redelivery of an action running here now: the running copy acks it.
    AlreadyRunning,
    /// A redelivery of an action this instance finished: its result is already out.
    AlreadyFinished,
    /// Delivered before, yet neither running nor finished here: an earlier instance of this
    /// worker had it when it died. Reported lost, never run half-blind.
    LostByEarlierInstance,
}

/// What admission remembers: actions running now, recently finished ones, the newest epoch.
#[derive(Debug, Default)]
pub(crate) struct Admissions {
    pub(crate) running: HashSet<ActionId>,
    recent: VecDeque<ActionId>,
    recent_set: HashSet<ActionId>,
    max_epoch: u64,
}

impl Admissions {
    /// Decides, and on [`Verdict::Run`] counts the action as running.
    pub(crate) fn admit(&mut self, d: &Dispatch, redelivered: bool) -> Verdict {
        let id = &d.action.id;
        if d.epoch < self.max_epoch {
            Verdict::StaleEpoch {
                epoch: d.epoch,
                newest: self.max_epoch,
            }
        } else if self.running.contains(id) {
            Verdict::AlreadyRunning
        } else if self.recent_set.contains(id) {
            Verdict::AlreadyFinished
        } else if redelivered {
            Verdict::LostByEarlierInstance
        } else {
            self.max_epoch = d.epoch;
            self.running.insert(id.clone());
            Verdict::Run
        }
    }

    /// The action's result is out: it is remembered as finished, for a while.
    pub(crate) fn settle(&mut self, id: &ActionId) {
        self.running.remove(id);
        self.recent.push_back(id.clone());
        self.recent_set.insert(id.clone());
        while self.recent.len() > RECENT {
            if let Some(old) = self.recent.pop_front() {
                self.recent_set.remove(&old);
            }
        }
    }
}

impl Worker {
    /// Decodes a dispatch and decides whether to run it; acks what will not run.
    pub(crate) async fn admit(&self, delivery: &dyn Delivery) -> Option<Dispatch> {
        let dispatch = match codec::decode::<Dispatch>(delivery.payload(), Encoding::Msgpack) {
            Ok(d) => d,
            Err(e) => {
                warn!(error = %e, "undecodable dispatch dropped");
                let _ = delivery.ack().await;
                return None;
            }
        };
        let verdict = self
            .state
            .lock()
            .expect("state lock")
            .admissions
            .admit(&dispatch, delivery.redelivered());
        let id = &dispatch.action.id;
        match verdict {
            Verdict::Run => return Some(dispatch),
            Verdict::AlreadyRunning => return None,
            Verdict::StaleEpoch { epoch, newest } => {
                m::stale();
                debug!(action = %id, epoch, newest, "stale dispatch dropped");
            }
            Verdict::AlreadyFinished => debug!(action = %id, "finished dispatch dropped"),
            Verdict::LostByEarlierInstance => {
                warn!(action = %id, "reporting an action lost by an earlier instance");
                let a = &dispatch.action;
                let outcome = infra(
                    InfraCode::WorkerLost,
                    format!(
                        "worker {} restarted while this action was in flight",
                        self.config.id
                    ),
                );
                let mut result =
                    ActionResult::new(a.id.clone(), a.job.clone(), outcome, unix_us() / 1000)
                        .for_action(a, dispatch.attempt);
                result.timing =
                    Timing::new(unix_us().saturating_sub(dispatch.submitted_at_us), 0, 0);
                self.publish_result(&result, dispatch.result_encoding).await;
            }
        }
        let _ = delivery.ack().await;
        None
    }
}
