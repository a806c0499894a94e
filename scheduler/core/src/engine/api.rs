//! API admission: api actions under their providers' pooled quotas (weighted fair shares
//! between jobs), or, under `static`, under per-trajectory slices of each provider's rate.

use super::cycle::least_loaded;
use super::{Engine, Now, Observation};
use std::collections::{BTreeMap, VecDeque};
use tangram_shared::{ActionId, ActionSpec, JobId, RejectCode, Rejection, WorkerId};

impl Engine {
    /// Admits api actions while a token and a concurrency slot are free: per provider, the
    /// next call by weighted fair share between jobs. Sets `wake_at` to when the next token
    /// comes for a provider with calls waiting.
    pub(crate) fn plan_api(
        &mut self,
        now: Now,
        rejections: &mut Vec<(ActionId, Rejection)>,
    ) -> Vec<(ActionId, WorkerId, String)> {
        let now_ms = now.ms;
        // Per provider, the waiting calls in arrival order: (id, job, trajectory).
        let mut waiting: BTreeMap<String, Vec<(ActionId, JobId, tangram_shared::TrajectoryId)>> =
            BTreeMap::new();
        for id in &self.queue {
            let a = &self.actions[id].action;
            let ActionSpec::Api(api) = &a.spec else {
                continue;
            };
            let Some(p) = self.providers.get(&api.provider) else {
                if self.judges_capacity() {
                    let known: Vec<&str> = self.providers.keys().map(String::as_str).collect();
                    let reason = if known.is_empty() {
                        format!(
                            "no worker calls a provider named {:?}; none are declared",
                            api.provider
                        )
                    } else {
                        format!(
                            "no worker calls a provider named {:?}; providers: {}",
                            api.provider,
                            known.join(", ")
                        )
                    };
                    rejections.push((
                        id.clone(),
                        Rejection::new(RejectCode::UnknownProvider, reason),
                    ));
                }
                continue;
            };
            if let Err(reason) = p.report.permits(api) {
                rejections.push((id.clone(), Rejection::new(RejectCode::NotAllowed, reason)));
                continue;
            }
            waiting.entry(api.provider.clone()).or_default().push((
                id.clone(),
                a.job.clone(),
                a.trajectory.clone(),
            ));
        }
        let mut admitted = Vec::new();
        let mut next_ms: Option<u64> = None;
        let mut soonest = |ms: u64| next_ms = Some(next_ms.map_or(ms, |n: u64| n.min(ms)));
        let mut load: BTreeMap<WorkerId, usize> = BTreeMap::new();
        let mut inflight_of: BTreeMap<String, u32> = BTreeMap::new();
        for e in self.actions.values() {
            if let Some((w, b)) = e.placed() {
                if let Some(p) = &b.provider {
                    *load.entry(w.clone()).or_default() += 1;
                    *inflight_of.entry(p.clone()).or_default() += 1;
                }
            }
        }
        let sandboxes = self
            .config
            .static_trajectories
            .map_or(self.sandboxes.len(), |n| n as usize)
            .max(1) as f64;
        for (name, list) in waiting {
            let Some(p) = self.providers.get_mut(&name) else {
                continue;
            };
            let accepting: Vec<WorkerId> = p
                .workers
                .iter()
                .filter(|w| {
                    self.workers.get(*w).is_some_and(|s| !s.hb.draining)
                        && !self.cordons.contains_key(*w)
                })
                .cloned()
                .collect();
            if accepting.is_empty() {
                continue;
            }
            if self.provisioning.trajectory_cores().is_some() {
                // Per-trajectory provisioning: each trajectory has its own even slice of the
                // rate (rate / open sandboxes, burst 2); the provider's connection cap holds.
                let mut inflight = inflight_of.get(&name).copied().unwrap_or(0);
                for (id, job, traj) in list {
                    let slice = self
                        .slices
                        .entry((job.clone(), traj, name.clone()))
                        .or_insert_with(|| {
                            crate::quota::Quota::new(
                                crate::quota::ProviderQuota {
                                    name: name.clone(),
                                    rate_per_s: p.report.rate_per_s / sandboxes,
                                    burst: 2,
                                    concurrency: u32::MAX,
                                    slow_ms: None,
                                },
                                now_ms,
                            )
                        });
                    match slice.ready_in_ms(now_ms) {
                        Some(0) if inflight < p.report.concurrency => {
                            slice.take(job.as_str(), 1.0, now_ms);
                            inflight += 1;
                            if let Some(w) = worker_for(&self.actions, &id, &accepting, &mut load) {
                                admitted.push((id, w, name.clone()));
                            }
                        }
                        Some(ms) if ms > 0 => soonest(ms),
                        _ => {}
                    }
                }
                continue;
            }
            // Fair share picks among the jobs' oldest waiting calls: one queue per job, in
            // arrival order. `pick` takes (position, job) pairs; positions index `order`.
            let order: Vec<ActionId> = list.iter().map(|(id, _, _)| id.clone()).collect();
            let mut by_job: BTreeMap<String, VecDeque<usize>> = BTreeMap::new();
            for (i, (_, job, _)) in list.iter().enumerate() {
                by_job.entry(job.0.clone()).or_default().push_back(i);
            }
            let mut left = order.len();
            while left > 0 {
                match p.quota.ready_in_ms(now_ms) {
                    Some(0) => {
                        let mut heads: Vec<(usize, &str)> = by_job
                            .iter()
                            .filter_map(|(j, q)| q.front().map(|&i| (i, j.as_str())))
                            .collect();
                        heads.sort_unstable();
                        let Some(i) = p.quota.pick(&heads) else {
                            break;
                        };
                        let job = list[i].1 .0.clone();
                        by_job.get_mut(&job).and_then(|q| q.pop_front());
                        left -= 1;
                        let weight = self.config.job_weights.get(&job).copied().unwrap_or(1.0);
                        p.quota.take(&job, weight, now_ms);
                        if let Some(w) = worker_for(&self.actions, &order[i], &accepting, &mut load)
                        {
                            admitted.push((order[i].clone(), w, name.clone()));
                        }
                    }
                    Some(ms) => {
                        soonest(ms);
                        break;
                    }
                    None => break, // at the concurrency cap: a reply will wake us
                }
            }
            self.out.push(super::Effect::Observe(Observation::Provider {
                name: name.clone(),
                rate: p.quota.effective_rate(),
                inflight: p.quota.inflight(),
                waiting: left,
            }));
        }
        self.wake_at = next_ms.map(|ms| now_ms + ms);
        admitted
    }

    /// Gives an api action's quota back when it settles (or its dispatch failed: `None`
    /// status, zero latency).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn release_quota(
        &mut self,
        job: &JobId,
        trajectory: &tangram_shared::TrajectoryId,
        provider: &str,
        http_status: Option<u16>,
        timed_out: bool,
        latency_ms: u64,
        now_ms: u64,
    ) {
        let key = (job.clone(), trajectory.clone(), provider.to_string());
        if let Some(slice) = self.slices.get_mut(&key) {
            slice.finish(now_ms, http_status, latency_ms);
        } else if let Some(p) = self.providers.get_mut(provider) {
            // A provider that does not answer is overloaded.
            let status = if timed_out { Some(429) } else { http_status };
            p.quota.finish(now_ms, status, latency_ms);
        }
    }
}

/// The worker for an admitted call: the one an earlier, unconfirmed dispatch went to when it
/// still takes work (so a stored copy and the retry are one message), else the least loaded.
fn worker_for(
    actions: &std::collections::HashMap<ActionId, super::lifecycle::Entry>,
    id: &ActionId,
    accepting: &[WorkerId],
    load: &mut BTreeMap<WorkerId, usize>,
) -> Option<WorkerId> {
    match actions.get(id).and_then(|e| e.pin.as_ref()) {
        Some(w) if accepting.contains(w) => {
            *load.entry(w.clone()).or_default() += 1;
            Some(w.clone())
        }
        _ => least_loaded(accepting, load),
    }
}
