//! Cordons and drains, set by operators (`tangram cordon`, `uncordon`, `drain`).
//!
//! A cordoned worker takes no new sandboxes and no unpinned work (api, reward), while the
//! commands of its open sandboxes keep running there, so trajectories finish where they
//! are. A drain is a cordon with a deadline: at that time the sandboxes still open there are
//! lost, and commands sent to them are rejected (`no_sandbox`, saying the worker was
//! drained); the worker removes them itself. Uncordoning lifts both.

use super::lifecycle::SandboxState;
use super::{Effect, Engine, Now, Observation};
use tangram_shared::WorkerId;

/// One cordoned worker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Cordon {
    /// Drained: when its remaining sandboxes are closed, on the engine's clock.
    pub(crate) drain_at_ms: Option<u64>,
    /// The same, in Unix milliseconds, for the status report.
    pub(crate) drain_by_unix_ms: Option<u64>,
    /// True once the deadline has passed and the sandboxes were closed.
    pub(crate) drained: bool,
}

impl Engine {
    /// An operator cordoned (`Some`, with a drain deadline in Unix ms or none) or uncordoned
    /// (`None`) a worker.
    pub(crate) fn on_cordon(
        &mut self,
        worker: WorkerId,
        drain_by_unix_ms: Option<Option<u64>>,
        now: Now,
    ) {
        match drain_by_unix_ms {
            None => {
                self.cordons.remove(&worker);
            }
            Some(by) => {
                let now_unix_ms = now.unix_us / 1000;
                let drain_at_ms = by.map(|t| now.ms + t.saturating_sub(now_unix_ms));
                let drained = self
                    .cordons
                    .get(&worker)
                    .is_some_and(|c| c.drained && c.drain_by_unix_ms == by);
                self.cordons.insert(
                    worker.clone(),
                    Cordon {
                        drain_at_ms,
                        drain_by_unix_ms: by,
                        drained,
                    },
                );
            }
        }
        self.out
            .push(Effect::Observe(Observation::Cordons(self.cordons.len())));
        self.refresh_node(&worker);
        self.on_drain_deadlines(now);
        self.dirty = true;
    }

    /// Drains whose deadline has passed: the sandboxes still open on those workers are lost.
    pub(crate) fn on_drain_deadlines(&mut self, now: Now) {
        let due: Vec<WorkerId> = self
            .cordons
            .iter()
            .filter(|(_, c)| !c.drained && c.drain_at_ms.is_some_and(|t| now.ms >= t))
            .map(|(w, _)| w.clone())
            .collect();
        for worker in due {
            for s in self.sandboxes.values_mut() {
                if s.worker == worker && s.state == SandboxState::Open {
                    s.state = SandboxState::Lost;
                }
            }
            if let Some(c) = self.cordons.get_mut(&worker) {
                c.drained = true;
            }
            self.dirty = true;
        }
    }

    /// The next drain deadline still to come.
    pub(crate) fn next_drain_ms(&self) -> Option<u64> {
        self.cordons
            .values()
            .filter(|c| !c.drained)
            .filter_map(|c| c.drain_at_ms)
            .min()
    }

    /// Why a lost sandbox on `worker` is gone, for the rejection of its next command.
    pub(crate) fn sandbox_loss(&self, worker: &WorkerId) -> &'static str {
        if self.cordons.get(worker).is_some_and(|c| c.drained) {
            "was closed when its worker was drained"
        } else {
            "was lost with its worker"
        }
    }
}
