//! Admission: whether a delivered dispatch runs here. The worker has the last word: the
//! scheduler may be stale (an older epoch), JetStream may deliver twice, and an earlier
//! instance of this worker may have died holding the action.

use super::{infra, unix_us, Worker};
use crate::metrics as m;
use crate::runtime::intake::Delivery;
use std::collections::{HashSet, VecDeque};
use tangram_shared::codec::{self, Encoding};
use tangram_shared::{subject, ActionId, ActionKind, ActionResult, Dispatch, InfraCode, Timing};
use tracing::{debug, warn};

/// How many finished action ids are remembered to recognise a redelivered dispatch whose
/// ack the server confirmed (it cannot come again: the dispatch stream is a work queue, and
/// a confirmed ack removes the message). Ids whose ack was not confirmed are kept apart,
/// without this bound, until a later ack of theirs is.
const RECENT: usize = 10_000;
/// Unconfirmed acks past which a warning is logged (each is an action id, kept all the same).
const UNCONFIRMED_WARN: usize = 100_000;
/// Finished actions that heartbeats keep listing, at most, and for how long.
const FINISHED_LISTED: usize = 1_000;
const FINISHED_FOR: std::time::Duration = std::time::Duration::from_secs(30);
/// How many fenced instances of this worker are remembered.
const MAX_FENCED: usize = 64;

/// What admission decided about one dispatch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Run it.
    Run,
    /// From a scheduler older than the current one: refused, recorded, not run.
    StaleEpoch {
        /// The dispatch's epoch.
        epoch: u64,
        /// The newest epoch known.
        newest: u64,
    },
    /// From an epoch no leader has held (above the stored epoch), as a forged dispatch
    /// would be: refused, recorded, not run. Refusing it raises nothing, so real dispatches
    /// keep running.
    UnknownEpoch {
        /// The dispatch's epoch.
        epoch: u64,
        /// The stored epoch.
        stored: u64,
    },
    /// Addressed to an instance of this worker that was fenced (declared lost): its action
    /// was settled by the scheduler. Refused, recorded, not run.
    FencedInstance {
        /// The instance it was addressed to.
        instance: String,
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
    /// Running in the current instance (what heartbeats list).
    pub(crate) running: HashSet<ActionId>,
    /// Still running from a fenced instance: recognised, never listed, results dropped.
    orphaned: HashSet<ActionId>,
    /// Instances of this worker known to be fenced.
    fenced: HashSet<String>,
    /// The highest dispatch stream sequence taken in (heartbeats report it).
    pub(crate) dispatch_seq: u64,
    /// The latest finished actions, with when (heartbeats list them for a while).
    finished: VecDeque<(ActionId, tokio::time::Instant)>,
    recent: VecDeque<ActionId>,
    recent_set: HashSet<ActionId>,
    /// Finished here, the dispatch's ack not confirmed: it may come again, however many
    /// others finish meanwhile.
    unconfirmed: HashSet<ActionId>,
    /// The newest epoch known: read from the leaders' store when `authority`, else the
    /// newest seen on a dispatch.
    known_epoch: u64,
    /// True once the stored epoch has been read: dispatches above it are refused.
    authority: bool,
}

impl Admissions {
    /// Decides, and on [`Verdict::Run`] counts the action as running. `here`: the dispatch
    /// is addressed to this instance, so no earlier instance can have had it; a redelivery
    /// of one this instance never saw was lost in transit (a NATS node died carrying it)
    /// and runs now.
    pub(crate) fn admit(&mut self, d: &Dispatch, redelivered: bool, here: bool) -> Verdict {
        let id = &d.action.id;
        if let Some(instance) = d.instance.as_ref().filter(|i| self.fenced.contains(*i)) {
            Verdict::FencedInstance {
                instance: instance.clone(),
            }
        } else if d.epoch < self.known_epoch {
            Verdict::StaleEpoch {
                epoch: d.epoch,
                newest: self.known_epoch,
            }
        } else if self.authority && d.epoch > self.known_epoch {
            Verdict::UnknownEpoch {
                epoch: d.epoch,
                stored: self.known_epoch,
            }
        } else if self.running.contains(id) || self.orphaned.contains(id) {
            Verdict::AlreadyRunning
        } else if self.recent_set.contains(id) || self.unconfirmed.contains(id) {
            Verdict::AlreadyFinished
        } else if !here && (redelivered || d.instance.is_some()) {
            // Delivered before, or addressed to another instance of this worker (its
            // consumer may have been created again, which counts deliveries afresh).
            Verdict::LostByEarlierInstance
        } else {
            self.known_epoch = self.known_epoch.max(d.epoch);
            self.running.insert(id.clone());
            Verdict::Run
        }
    }

    /// Actions finished within the last [`FINISHED_FOR`], for heartbeats.
    pub(crate) fn lately_finished(&self) -> Vec<ActionId> {
        let now = tokio::time::Instant::now();
        self.finished
            .iter()
            .filter(|(_, at)| now.duration_since(*at) < FINISHED_FOR)
            .map(|(id, _)| id.clone())
            .collect()
    }

    /// The newest scheduler epoch known (reported in heartbeats).
    pub(crate) fn known_epoch(&self) -> u64 {
        self.known_epoch
    }

    /// Whether an epoch is below the newest known (its scheduler was deposed).
    pub(crate) fn is_older(&self, epoch: u64) -> bool {
        epoch < self.known_epoch
    }

    /// Whether a dispatch's epoch is above what is known (the store should be read first).
    pub(crate) fn is_newer(&self, epoch: u64) -> bool {
        epoch > self.known_epoch
    }

    /// The leaders' stored epoch, just read: the authority from now on.
    pub(crate) fn learn_stored_epoch(&mut self, stored: u64) {
        self.known_epoch = self.known_epoch.max(stored);
        self.authority = true;
    }

    /// An instance of this worker is fenced: dispatches addressed to it are refused from
    /// now on. When it is the current one, what runs becomes orphaned (its results are
    /// dropped, heartbeats no longer list it).
    pub(crate) fn fence(&mut self, instance: &str, current: bool) {
        if self.fenced.len() >= MAX_FENCED && !self.fenced.contains(instance) {
            self.fenced.clear(); // old instances' dispatches are long acked or refused
        }
        self.fenced.insert(instance.to_string());
        if current {
            self.orphaned.extend(self.running.drain());
        }
    }

    /// The action is done here: it is remembered as finished, for a while; heartbeats list
    /// it as finished lately only when its result was `stored` (one that was not is for the
    /// scheduler to settle as lost). `acked`: the server confirmed the dispatch's ack; until
    /// it does, the id is remembered whatever the bound.
    pub(crate) fn settle(&mut self, id: &ActionId, stored: bool, acked: bool) {
        if !acked {
            self.unconfirmed.insert(id.clone());
            if self.unconfirmed.len().is_multiple_of(UNCONFIRMED_WARN) {
                warn!(
                    unconfirmed = self.unconfirmed.len(),
                    "dispatch acks not confirmed by the server; their ids are kept"
                );
            }
        }
        if self.running.remove(id) && stored {
            self.finished
                .push_back((id.clone(), tokio::time::Instant::now()));
            while self.finished.len() > FINISHED_LISTED {
                self.finished.pop_front();
            }
        }
        self.orphaned.remove(id);
        self.recent.push_back(id.clone());
        self.recent_set.insert(id.clone());
        while self.recent.len() > RECENT {
            if let Some(old) = self.recent.pop_front() {
                self.recent_set.remove(&old);
            }
        }
    }
}

impl Admissions {
    /// A finished action's dispatch was acked and the server confirmed it: it cannot come
    /// again.
    pub(crate) fn ack_confirmed(&mut self, id: &ActionId) {
        self.unconfirmed.remove(id);
    }
}

impl Worker {
    /// Decodes a dispatch and decides whether to run it; acks what will not run.
    /// On [`Verdict::Run`], also the instance generation it was admitted in (see
    /// [`Worker::era`]).
    pub(crate) async fn admit(&self, delivery: &dyn Delivery) -> Option<(Dispatch, u64)> {
        if delivery.redelivered() {
            m::dispatch_redelivered();
        }
        let dispatch = match codec::decode::<Dispatch>(delivery.payload(), Encoding::Msgpack) {
            Ok(d) => d,
            Err(e) => {
                warn!(error = %e, "undecodable dispatch dropped");
                let _ = delivery.ack().await;
                return None;
            }
        };
        // A dispatch from an epoch above what is known: the new leader's first, or a forgery.
        // The leaders' store says which.
        let newer = self
            .state
            .lock()
            .expect("state lock")
            .admissions
            .is_newer(dispatch.epoch);
        if newer {
            if let Some(stored) = self.results.stored_epoch().await {
                let mut st = self.state.lock().expect("state lock");
                st.admissions.learn_stored_epoch(stored);
            }
        }
        let (verdict, era) = {
            let mut st = self.state.lock().expect("state lock");
            // Read under the lock a fence takes, so an action is of exactly one instance.
            let era = self.era.load(std::sync::atomic::Ordering::SeqCst);
            let here = dispatch
                .instance
                .as_ref()
                .is_some_and(|i| *i == *self.instance.lock().expect("instance lock"));
            let verdict = st.admissions.admit(&dispatch, delivery.redelivered(), here);
            // Under the same lock as the verdict: a heartbeat that reports this sequence
            // lists the action too if it runs.
            st.admissions.dispatch_seq = st.admissions.dispatch_seq.max(delivery.stream_seq());
            // An exec's cores are promised at admission, in intake order, as the scheduler
            // booked them; its task takes them when it starts.
            if verdict == Verdict::Run && dispatch.action.kind() == ActionKind::SandboxExec {
                st.reserved
                    .insert(dispatch.action.id.clone(), dispatch.grant.cores.max(1));
            }
            (verdict, era)
        };
        let id = &dispatch.action.id;
        match verdict {
            Verdict::Run => {
                debug!(action = %id, epoch = dispatch.epoch, attempt = dispatch.attempt,
                    redelivered = delivery.redelivered(), "admitted");
                return Some((dispatch, era));
            }
            Verdict::FencedInstance { instance } => {
                let detail = format!(
                    "dispatch addressed to instance {instance} refused: the scheduler declared that instance lost and settled its actions"
                );
                self.refuse(
                    subject::REFUSED_FENCED_INSTANCE,
                    &detail,
                    delivery.payload(),
                    &dispatch,
                )
                .await;
            }
            Verdict::AlreadyRunning => return None,
            Verdict::StaleEpoch { epoch, newest } => {
                let detail = format!(
                    "dispatch of epoch {epoch} refused: the scheduler of epoch {newest} has taken over"
                );
                self.refuse(
                    subject::REFUSED_STALE_EPOCH,
                    &detail,
                    delivery.payload(),
                    &dispatch,
                )
                .await;
            }
            Verdict::UnknownEpoch { epoch, stored } => {
                let detail = format!(
                    "dispatch of epoch {epoch} refused: no scheduler has held it (the stored epoch is {stored}); a forged dispatch?"
                );
                self.refuse(
                    subject::REFUSED_UNKNOWN_EPOCH,
                    &detail,
                    delivery.payload(),
                    &dispatch,
                )
                .await;
            }
            Verdict::AlreadyFinished => {
                debug!(action = %id, "finished dispatch dropped");
                if delivery.ack().await.is_ok() {
                    let mut st = self.state.lock().expect("state lock");
                    st.admissions.ack_confirmed(id);
                }
                return None;
            }
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

    /// A refused dispatch is answered with a dead-letter record, a metric and a log line,
    /// never with a result: a result under the action's id would claim an action the
    /// current scheduler owns (and its `Nats-Msg-Id` would shadow the real result).
    async fn refuse(&self, reason: &'static str, detail: &str, payload: &[u8], d: &Dispatch) {
        m::refused(reason);
        warn!(action = %d.action.id, reason, "{detail}");
        self.results
            .refuse(super::intake::Refusal {
                reason,
                detail,
                payload,
                action: d.action.id.as_str(),
                worker: self.config.id.as_str(),
            })
            .await;
    }
}
