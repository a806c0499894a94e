//! The API quota pool: each external provider's pooled quota for the whole fleet (a token
//! bucket, a concurrency cap, an adaptive rate; `quota.rs`), shared between jobs by weighted
//! fair share, or under per-trajectory provisioning (`static`) cut into even per-trajectory
//! slices of each provider's rate. Providers are declared by the workers that can call them;
//! their quota is the operator's definition in the scheduler's configuration where there is
//! one, else the one the workers serving the provider declared first. A worker whose
//! declaration differs is refused (it is not given the provider's calls) and counted: a
//! worker's credential cannot redefine a fleet-wide quota or draw another worker's calls by
//! declaring a larger one.

use super::{Fleet, Planned, Pool, Release, Waiting, WorkerReport};
use crate::engine::{Now, Observation};
use crate::quota::{ProviderQuota, Quota};
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use tangram_shared::status::{ProviderStatus, Status};
use tangram_shared::{
    ActionSpec, JobId, ProviderReport, RejectCode, Rejection, TrajectoryId, WorkerId,
};

/// What an api call holds until it settles: its provider's quota (or its trajectory's slice
/// of it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiBooking {
    /// The provider.
    pub provider: String,
}

/// An external API provider: its pooled quota, what may be called, who can call it.
#[derive(Debug, Clone)]
struct Provider {
    quota: Quota,
    report: ProviderReport,
    workers: BTreeSet<WorkerId>,
}

/// See the module docs.
#[derive(Debug, Default)]
pub(crate) struct ApiPool {
    providers: BTreeMap<String, Provider>,
    /// The operator's definitions, by provider.
    defined: BTreeMap<String, ProviderQuota>,
    /// Declarations refused, by worker and provider (each is counted once, until the
    /// worker declares the provider as defined again).
    refused: BTreeSet<(WorkerId, String)>,
    /// Per-trajectory provisioning: each trajectory's slice of each provider's rate.
    slices: HashMap<(JobId, TrajectoryId, String), Quota>,
}

impl ApiPool {
    /// A pool whose providers' quotas are the operator's `defined` ones.
    pub(crate) fn with_definitions(defined: BTreeMap<String, ProviderQuota>) -> Self {
        Self {
            defined,
            ..Self::default()
        }
    }
}

/// Whether two declarations of a provider's quota say the same.
fn same_quota(a: &ProviderQuota, b: &ProviderQuota) -> bool {
    (a.rate_per_s - b.rate_per_s).abs() <= 1e-9 * a.rate_per_s.abs().max(1.0)
        && a.burst == b.burst
        && a.concurrency == b.concurrency
        && a.slow_ms == b.slow_ms
}

impl Pool for ApiPool {
    type Booking = ApiBooking;
    type Ticket = ApiBooking;

    fn ingest(&mut self, report: &WorkerReport<'_>, now: Now) -> Vec<Observation> {
        let hb = report.hb;
        for p in self.providers.values_mut() {
            p.workers.remove(&hb.worker);
        }
        let mut seen = Vec::new();
        for r in &hb.providers {
            let spec = ProviderQuota {
                name: r.name.clone(),
                rate_per_s: r.rate_per_s,
                burst: r.burst,
                concurrency: r.concurrency,
                slow_ms: r.slow_ms,
            };
            let standing = match self.defined.get(&r.name) {
                Some(def) => Some(def),
                // Established by the workers that serve it now.
                None => self
                    .providers
                    .get(&r.name)
                    .filter(|p| !p.workers.is_empty())
                    .map(|p| p.quota.spec()),
            };
            let key = (hb.worker.clone(), r.name.clone());
            if standing.is_some_and(|s| !same_quota(s, &spec)) {
                if self.refused.insert(key) {
                    seen.push(Observation::DeclarationRefused {
                        kind: "provider",
                        name: r.name.clone(),
                        worker: hb.worker.clone(),
                    });
                }
                continue;
            }
            self.refused.remove(&key);
            let spec = self.defined.get(&r.name).cloned().unwrap_or(spec);
            let p = self
                .providers
                .entry(r.name.clone())
                .or_insert_with(|| Provider {
                    quota: Quota::new(spec.clone(), now.ms),
                    report: r.clone(),
                    workers: Default::default(),
                });
            p.quota.redeclare(spec, now.ms);
            p.report = r.clone();
            p.workers.insert(hb.worker.clone());
        }
        seen
    }

    fn forget_worker(&mut self, worker: &WorkerId) {
        for p in self.providers.values_mut() {
            p.workers.remove(worker);
        }
        self.refused.retain(|(w, _)| w != worker);
    }

    fn forget_trajectory(&mut self, job: &JobId, trajectory: &TrajectoryId) {
        self.slices
            .retain(|(j, t, _), _| !(j == job && t == trajectory));
    }

    /// Admits calls while a token and a concurrency slot are free: per provider, the next
    /// call by weighted fair share between jobs (or from the trajectory's own slice).
    fn plan(
        &mut self,
        waiting: &[Waiting<'_>],
        held: &[(&WorkerId, &ApiBooking)],
        fleet: &Fleet<'_>,
        now: Now,
    ) -> Planned<ApiBooking> {
        let now_ms = now.ms;
        let mut out = Planned::default();
        // Per provider, the waiting calls in arrival order.
        let mut by_provider: BTreeMap<String, Vec<&Waiting<'_>>> = BTreeMap::new();
        for w in waiting {
            let ActionSpec::Api(api) = w.spec else {
                continue;
            };
            let Some(p) = self.providers.get(&api.provider) else {
                if fleet.judges_capacity {
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
                    out.rejections.push((
                        w.id.clone(),
                        Rejection::new(RejectCode::UnknownProvider, reason),
                    ));
                }
                continue;
            };
            if let Err(reason) = p.report.permits(api) {
                out.rejections
                    .push((w.id.clone(), Rejection::new(RejectCode::NotAllowed, reason)));
                continue;
            }
            by_provider.entry(api.provider.clone()).or_default().push(w);
        }
        let mut next_ms: Option<u64> = None;
        let mut soonest = |ms: u64| next_ms = Some(next_ms.map_or(ms, |n: u64| n.min(ms)));
        let mut load: BTreeMap<WorkerId, usize> = BTreeMap::new();
        let mut inflight_of: BTreeMap<&str, u32> = BTreeMap::new();
        for (w, b) in held {
            *load.entry((*w).clone()).or_default() += 1;
            *inflight_of.entry(b.provider.as_str()).or_default() += 1;
        }
        let sandboxes = fleet.trajectories.max(1) as f64;
        for (name, list) in by_provider {
            let Some(p) = self.providers.get_mut(&name) else {
                continue;
            };
            let accepting: Vec<WorkerId> = p
                .workers
                .iter()
                .filter(|w| (fleet.accepting)(w))
                .cloned()
                .collect();
            if accepting.is_empty() {
                continue;
            }
            let booking = || ApiBooking {
                provider: name.clone(),
            };
            if fleet.provisioning.trajectory_cores().is_some() {
                // Per-trajectory provisioning: each trajectory has its own even slice of the
                // rate (rate / open sandboxes, burst 2); the provider's connection cap holds.
                let mut inflight = inflight_of.get(name.as_str()).copied().unwrap_or(0);
                for w in list {
                    let slice = self
                        .slices
                        .entry((w.job.clone(), w.trajectory.clone(), name.clone()))
                        .or_insert_with(|| {
                            Quota::new(
                                ProviderQuota {
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
                            slice.take(w.job.as_str(), 1.0, now_ms);
                            inflight += 1;
                            if let Some(worker) = worker_for(w.pin, &accepting, &mut load) {
                                out.launches.push((w.id.clone(), worker, booking()));
                            }
                        }
                        Some(ms) if ms > 0 => soonest(ms),
                        _ => {}
                    }
                }
                continue;
            }
            // Fair share picks among the jobs' oldest waiting calls: one queue per job, in
            // arrival order. `pick` takes (position, job) pairs; positions index `list`.
            let mut by_job: BTreeMap<String, VecDeque<usize>> = BTreeMap::new();
            for (i, w) in list.iter().enumerate() {
                by_job.entry(w.job.0.clone()).or_default().push_back(i);
            }
            let mut left = list.len();
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
                        let job = list[i].job.0.clone();
                        by_job.get_mut(&job).and_then(|q| q.pop_front());
                        left -= 1;
                        let weight = fleet.job_weights.get(&job).copied().unwrap_or(1.0);
                        p.quota.take(&job, weight, now_ms);
                        if let Some(worker) = worker_for(list[i].pin, &accepting, &mut load) {
                            out.launches.push((list[i].id.clone(), worker, booking()));
                        }
                    }
                    Some(ms) => {
                        soonest(ms);
                        break;
                    }
                    None => break, // at the concurrency cap: a reply will wake us
                }
            }
            out.observations.push(Observation::Provider {
                name: name.clone(),
                rate: p.quota.effective_rate(),
                inflight: p.quota.inflight(),
                waiting: left,
            });
        }
        out.wake_ms = next_ms.map(|ms| now_ms + ms);
        out
    }

    fn release(
        &mut self,
        _worker: &WorkerId,
        job: &JobId,
        trajectory: &TrajectoryId,
        booking: &ApiBooking,
        release: &Release,
        now: Now,
    ) {
        let key = (job.clone(), trajectory.clone(), booking.provider.clone());
        if let Some(slice) = self.slices.get_mut(&key) {
            slice.finish(now.ms, release.http_status, release.latency_ms);
        } else if let Some(p) = self.providers.get_mut(&booking.provider) {
            // A provider that does not answer is overloaded.
            let status = if release.timed_out {
                Some(429)
            } else {
                release.http_status
            };
            p.quota.finish(now.ms, status, release.latency_ms);
        }
    }

    fn report(&self, held: &[(&WorkerId, &ApiBooking)], status: &mut Status) {
        for (name, p) in &self.providers {
            let inflight = held.iter().filter(|(_, b)| &b.provider == name).count() as u32;
            status.providers.push(ProviderStatus {
                name: name.clone(),
                rate_per_s: p.report.rate_per_s,
                effective_rate_per_s: p.quota.effective_rate(),
                inflight,
                concurrency: p.report.concurrency,
                admitted: p.quota.admitted().clone(),
            });
        }
    }
}

/// The worker for an admitted call: the one an earlier, unconfirmed dispatch went to when it
/// still takes work (so a stored copy and the retry are one message), else the least loaded.
fn worker_for(
    pin: Option<&WorkerId>,
    accepting: &[WorkerId],
    load: &mut BTreeMap<WorkerId, usize>,
) -> Option<WorkerId> {
    match pin {
        Some(w) if accepting.contains(w) => {
            *load.entry(w.clone()).or_default() += 1;
            Some(w.clone())
        }
        _ => crate::engine::cycle::least_loaded(accepting, load),
    }
}
