//! API admission: the cycle hands the api calls waiting in the queue to the API quota pool
//! (`pools/api.rs`) and carries out what it decides.

use super::lifecycle::Booking;
use super::pools::Pool;
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
        // The pool is out of the engine while it plans on a read of the ledger.
        let mut pool = std::mem::take(&mut self.pools.api);
        let waiting = self.waiting_for(|s| matches!(s, ActionSpec::Api(_)));
        let held: Vec<(&WorkerId, &ApiBooking)> = self
            .actions
            .values()
            .filter_map(|e| e.placed())
            .filter_map(|(w, b)| match b {
                Booking::Api(a) => Some((w, a)),
                _ => None,
            })
            .collect();
        let accepting = |w: &WorkerId| self.takes_work(w);
        let fleet = self.fleet(&accepting);
        let planned = if waiting.is_empty() {
            Default::default()
        } else {
            pool.plan(&waiting, &held, &fleet, now)
        };
        drop((waiting, held, fleet));
        self.pools.api = pool;
        rejections.extend(planned.rejections);
        self.out
            .extend(planned.observations.into_iter().map(super::Effect::Observe));
        self.wake_at = planned.wake_ms;
        planned.launches
    }
}
