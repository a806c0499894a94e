//! API admission: the cycle hands the api calls waiting in the queue to the API quota pool
//! (`pools/api.rs`) and carries out what it decides.

use super::pools::{Fleet, Pool, Waiting};
use super::{ApiBooking, Engine, Now};
use tangram_shared::{ActionId, ActionSpec, Rejection, WorkerId};

impl Engine {
    /// Admits api actions while their providers have a token and a concurrency slot free.
    /// Sets `wake_at` to when the next token comes for a provider with calls waiting.
    pub(crate) fn plan_api(
        &mut self,
        now: Now,
        rejections: &mut Vec<(ActionId, Rejection)>,
    ) -> Vec<(ActionId, WorkerId, ApiBooking)> {
        let waiting: Vec<Waiting<'_>> = self
            .queue
            .iter()
            .filter_map(|id| {
                let e = &self.actions[id];
                matches!(e.action.spec, ActionSpec::Api(_)).then_some(Waiting {
                    id,
                    job: &e.action.job,
                    trajectory: &e.action.trajectory,
                    spec: &e.action.spec,
                    pin: e.pin.as_ref(),
                })
            })
            .collect();
        let held: Vec<(&WorkerId, &ApiBooking)> = self
            .actions
            .values()
            .filter_map(|e| e.placed())
            .filter_map(|(w, b)| b.api.as_ref().map(|a| (w, a)))
            .collect();
        let accepting = |w: &WorkerId| {
            self.workers.get(w).is_some_and(|s| !s.hb.draining) && !self.cordons.contains_key(w)
        };
        let fleet = Fleet {
            accepting: &accepting,
            judges_capacity: self.judges_capacity(),
            provisioning: self.provisioning,
            job_weights: &self.config.job_weights,
            trajectories: self
                .config
                .static_trajectories
                .map_or(self.sandboxes.len(), |n| n as usize),
        };
        let planned = if waiting.is_empty() {
            Default::default()
        } else {
            self.api.plan(&waiting, &held, &fleet, now)
        };
        rejections.extend(planned.rejections);
        self.out
            .extend(planned.observations.into_iter().map(super::Effect::Observe));
        self.wake_at = planned.wake_ms;
        planned.launches
    }
}
