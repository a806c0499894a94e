//! Re-sizes of running execs (malleable policies, `tangram-v2`): a `Regrant` read from the
//! dispatch subject widens or narrows an exec's cores while it runs.
//!
//! The core accounting changes at once, in intake order: a narrowing gives its cores back
//! before the next dispatch (which may need them) is admitted, a widening takes what is free
//! and not promised to an admitted exec that has not started (`State::reserved`).
//! The cgroup write follows under the exec's gate (which its start and its parking hold
//! too), writing the exec's latest cores, and never after the exec has ended.

use super::execute::Sandbox;
use super::intake::Delivery;
use super::Worker;
use crate::cgroup::PERIOD_US;
use crate::cpuset;
use std::sync::Arc;
use tangram_shared::codec::{self, Encoding};
use tangram_shared::{ActionId, Regrant};
use tracing::{debug, warn};

/// Re-sizes that arrived for admitted execs not yet holding their cores, at most.
const EARLY: usize = 1024;

/// What a running exec holds.
pub(crate) struct Sizing {
    /// The dispatch attempt.
    pub(crate) attempt: u32,
    /// Its cores now.
    pub(crate) cores: Vec<u32>,
    /// The sandbox it runs in.
    pub(crate) sandbox: Arc<Sandbox>,
    /// The newest re-size applied: its epoch and sequence (a new leader numbers afresh).
    pub(crate) epoch: u64,
    pub(crate) seq: u64,
    /// Held while its cgroup is written (and while it is parked at the end).
    pub(crate) gate: Arc<tokio::sync::Mutex<()>>,
}

impl Worker {
    /// Applies one re-size message, then acks it (a re-size is advisory: one that cannot be
    /// applied is dropped with a log line).
    /// Its stream sequence counts as taken in (`dispatch_seq` in heartbeats) under the lock
    /// its accounting takes: a heartbeat past it reports the exec's width after it (what a
    /// new leader that found it in the backlog waits for).
    pub(crate) async fn regrant(self: &Arc<Self>, delivery: &dyn Delivery) {
        let seq = delivery.stream_seq();
        match codec::decode::<Regrant>(delivery.payload(), Encoding::Msgpack) {
            Ok(r) => {
                if let Some((gate, sandbox, widening)) = self.account_regrant(&r, seq) {
                    self.write_cores(&r.id, &gate, &sandbox, widening).await;
                }
            }
            Err(e) => {
                warn!(error = %e, "undecodable re-size dropped");
                let mut st = self.state.lock().expect("state lock");
                st.admissions.dispatch_seq = st.admissions.dispatch_seq.max(seq);
            }
        }
        let _ = delivery.ack().await;
    }

    /// The accounting half, under the state lock: what to write, if anything changed.
    fn account_regrant(
        &self,
        r: &Regrant,
        seq: u64,
    ) -> Option<(Arc<tokio::sync::Mutex<()>>, Arc<Sandbox>, bool)> {
        let mut st = self.state.lock().expect("state lock");
        st.admissions.dispatch_seq = st.admissions.dispatch_seq.max(seq);
        if st.admissions.is_older(r.epoch) {
            debug!(action = %r.id, epoch = r.epoch, "re-size of an older epoch dropped");
            return None;
        }
        let want = r.grant.cores.max(1) as usize;
        let st = &mut *st;
        let Some(s) = st.execs.get_mut(&r.id) else {
            if st.admissions.running.contains(&r.id) {
                // Admitted, not yet holding its cores: it starts at this size.
                if st.early.len() >= EARLY {
                    st.early.clear();
                }
                let keep = st
                    .early
                    .get(&r.id)
                    .is_none_or(|e| e.attempt != r.attempt || (e.epoch, e.seq) < (r.epoch, r.seq));
                if keep {
                    st.early.insert(r.id.clone(), r.clone());
                    if let Some(n) = st.reserved.get_mut(&r.id) {
                        *n = want as u32;
                    }
                    // It may be waiting for its cores (`execute::CORE_WAIT`): it needs fewer
                    // now, or more.
                    self.cores_freed.notify_waiters();
                }
            }
            return None;
        };
        if s.attempt != r.attempt || (r.epoch, r.seq) <= (s.epoch, s.seq) {
            return None;
        }
        (s.epoch, s.seq) = (r.epoch, r.seq);
        let have = s.cores.len();
        if want < have {
            let back = s.cores.split_off(want);
            st.cores.give_back(&back);
        } else if want > have {
            // Never the cores promised to an admitted exec that has not taken them yet.
            let promised: u32 = st.reserved.values().sum();
            let spare = st.cores.free().saturating_sub(promised as usize);
            let more = (want - have).min(spare);
            if let Some(extra) = st.cores.take(more) {
                s.cores.extend(extra);
                s.cores.sort_unstable();
            }
        }
        if s.cores.len() == have {
            return None;
        }
        let widening = s.cores.len() > have;
        if !widening {
            self.cores_freed.notify_waiters();
        }
        crate::metrics::regrant(if widening { "widen" } else { "narrow" });
        Some((s.gate.clone(), s.sandbox.clone(), widening))
    }

    /// Writes an exec's latest cores to its cgroup, under its gate.
    async fn write_cores(
        &self,
        id: &ActionId,
        gate: &tokio::sync::Mutex<()>,
        sandbox: &Sandbox,
        widening: bool,
    ) {
        let _g = gate.lock().await;
        let Some(list) = self.current_cores(id) else {
            return; // ended meanwhile: its sandbox is parked
        };
        let n = cpuset::parse(&list).map_or(1, |c| c.len().max(1));
        let runtime = self
            .sandboxes
            .as_deref()
            .expect("execs run only where sandboxes do");
        if let Err(e) = runtime
            .grant(&sandbox.handle, &list, n as i64 * PERIOD_US, widening)
            .await
        {
            warn!(action = %id, error = %e, "re-sizing the exec's cores failed");
        }
    }

    /// A running exec's cores now, as a cpuset list.
    fn current_cores(&self, id: &ActionId) -> Option<String> {
        let st = self.state.lock().expect("state lock");
        st.execs.get(id).map(|s| cpuset::format(&s.cores))
    }
}
