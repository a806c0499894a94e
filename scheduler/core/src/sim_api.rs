//! The simulator's API side: DeepSearch-style trajectories calling a rate-limited search
//! provider, then an LLM judge on GPUs. The provider's quota is either pooled across all
//! trajectories ([`crate::quota::Quota`], the scheduler's own code) or sliced evenly per
//! trajectory (the per-trajectory limiters frameworks use today, the paper's baseline).

use crate::gpu::{Eoe, ServiceSpec};
use crate::quota::{ProviderQuota, Quota};
use crate::sim::{ActionRecord, Rng, SimReport, Timed};
use std::collections::{BinaryHeap, VecDeque};
use tangram_shared::WorkerId;

/// What a step calls.
#[derive(Debug, Clone, PartialEq)]
pub enum ApiCall {
    /// One request to the search provider, answered after `latency_ms`.
    Search {
        /// The provider's latency, ms.
        latency_ms: f64,
    },
    /// One judge call on the GPU service.
    Judge {
        /// Execution on a resident replica, ms.
        exec_ms: f64,
    },
}

/// One step: think, then call.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiStep {
    /// Generation time before the call, ms.
    pub think_ms: f64,
    /// The call.
    pub call: ApiCall,
}

/// One trajectory.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiTrajectory {
    /// Its job.
    pub job: String,
    /// When it starts, ms.
    pub start_ms: f64,
    /// Its steps.
    pub steps: Vec<ApiStep>,
}

/// A DeepSearch-style workload.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiWorkload {
    /// The trajectories.
    pub trajectories: Vec<ApiTrajectory>,
    /// The search provider's quota.
    pub provider: ProviderQuota,
    /// The judge service.
    pub judge: ServiceSpec,
    /// GPUs for the judge (NVLink groups per node); the judge is deployed on all of them.
    pub gpus: Vec<Vec<u8>>,
}

/// How the provider's quota is shared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuotaMode {
    /// One pool for every trajectory (Tangram).
    Pooled,
    /// Each trajectory gets rate / N and a burst of 1 of its own; the provider's
    /// concurrency cap still holds for everyone (the provider enforces it), first come first
    /// served.
    PerTrajectory,
}

type Ev = Timed<EvKind>;
#[derive(Debug, PartialEq)]
enum EvKind {
    Arrive(usize),
    Done {
        t: usize,
        search: bool,
        replica: usize,
    },
    Retry(Option<usize>),
}

/// Runs the workload with the quota shared as `mode` says.
pub fn simulate_api(w: &ApiWorkload, mode: QuotaMode, name: &str) -> SimReport {
    let n = w.trajectories.len().max(1);
    let mut pooled = Quota::new(w.provider.clone(), 0);
    let slice = ProviderQuota {
        name: w.provider.name.clone(),
        rate_per_s: w.provider.rate_per_s / n as f64,
        // A slice of one token: Quota keeps at least one token of headroom below a burst of 2.
        burst: 2,
        concurrency: u32::MAX,
        slow_ms: None,
    };
    let mut slices: Vec<Quota> = match mode {
        QuotaMode::Pooled => Vec::new(),
        QuotaMode::PerTrajectory => (0..w.trajectories.len())
            .map(|_| Quota::new(slice.clone(), 0))
            .collect(),
    };
    let mut eoe = Eoe::new([w.judge.clone()]);
    for (i, g) in w.gpus.iter().enumerate() {
        eoe.set_node(&WorkerId::new(format!("g{i}")).expect("id"), g, true);
    }
    let gpus: u32 = w.gpus.iter().flatten().map(|&g| g as u32).sum();
    eoe.pin(gpus);
    let mut heap = BinaryHeap::new();
    let mut seq = 0u64;
    let mut push = |heap: &mut BinaryHeap<Ev>, at: f64, kind: EvKind| {
        heap.push(Ev {
            at_ms: at,
            seq,
            kind,
        });
        seq += 1;
    };
    let mut next = vec![0usize; w.trajectories.len()];
    let mut due = vec![0f64; w.trajectories.len()];
    for (i, t) in w.trajectories.iter().enumerate() {
        if let Some(s) = t.steps.first() {
            push(&mut heap, t.start_ms + s.think_ms, EvKind::Arrive(i));
        }
    }
    let mut search_q: VecDeque<usize> = VecDeque::new();
    let mut judge_q: VecDeque<usize> = VecDeque::new();
    let mut retry_pending = false;
    let mut inflight = 0u32;
    let mut slice_retry = vec![false; w.trajectories.len()];
    let mut report = SimReport {
        policy: name.to_string(),
        actions: Vec::new(),
        step_time_ms: 0.0,
        reserved_core_ms: 0.0,
        used_core_ms: 0.0,
        utilisation: Vec::new(),
        pool_cores: w.provider.concurrency,
        unit: "api",
    };
    let first = w
        .trajectories
        .iter()
        .map(|t| t.start_ms)
        .fold(f64::INFINITY, f64::min);
    let mut last_end = 0f64;
    while let Some(ev) = heap.pop() {
        let now = ev.at_ms;
        match ev.kind {
            EvKind::Arrive(t) => {
                due[t] = now;
                match w.trajectories[t].steps[next[t]].call {
                    ApiCall::Search { .. } => search_q.push_back(t),
                    ApiCall::Judge { .. } => judge_q.push_back(t),
                }
            }
            EvKind::Done { t, search, replica } => {
                if search {
                    match mode {
                        QuotaMode::Pooled => pooled.finish(now as u64, Some(200), 0),
                        QuotaMode::PerTrajectory => {
                            slices[t].finish(now as u64, Some(200), 0);
                            inflight -= 1;
                        }
                    }
                } else {
                    eoe.finish(replica, now as u64);
                }
                next[t] += 1;
                match w.trajectories[t].steps.get(next[t]) {
                    Some(s) => push(&mut heap, now + s.think_ms, EvKind::Arrive(t)),
                    None => last_end = last_end.max(now),
                }
            }
            EvKind::Retry(None) => retry_pending = false,
            EvKind::Retry(Some(t)) => slice_retry[t] = false,
        }
        // Search calls.
        let now_ms = now as u64;
        let mut started: Vec<usize> = Vec::new();
        match mode {
            QuotaMode::Pooled => {
                while let Some(&t) = search_q.front() {
                    match pooled.ready_in_ms(now_ms) {
                        Some(0) => {
                            pooled.take(&w.trajectories[t].job, 1.0, now_ms);
                            search_q.pop_front();
                            started.push(t);
                        }
                        Some(ms) => {
                            if !retry_pending {
                                retry_pending = true;
                                push(&mut heap, now + ms as f64, EvKind::Retry(None));
                            }
                            break;
                        }
                        None => break,
                    }
                }
            }
            QuotaMode::PerTrajectory => {
                let mut keep = VecDeque::new();
                while let Some(t) = search_q.pop_front() {
                    if inflight >= w.provider.concurrency {
                        keep.push_back(t);
                        continue;
                    }
                    match slices[t].ready_in_ms(now_ms) {
                        Some(0) => {
                            inflight += 1;
                            slices[t].take(&w.trajectories[t].job, 1.0, now_ms);
                            started.push(t);
                        }
                        Some(ms) => {
                            if !slice_retry[t] {
                                slice_retry[t] = true;
                                push(&mut heap, now + ms as f64, EvKind::Retry(Some(t)));
                            }
                            keep.push_back(t);
                        }
                        None => keep.push_back(t),
                    }
                }
                search_q = keep;
            }
        }
        for t in started {
            let ApiCall::Search { latency_ms } = w.trajectories[t].steps[next[t]].call else {
                continue;
            };
            report.actions.push(ActionRecord {
                queue_ms: now - due[t],
                exec_ms: latency_ms,
                overhead_ms: 0.0,
                cores: 0,
            });
            report.used_core_ms += 1.0;
            push(
                &mut heap,
                now + latency_ms,
                EvKind::Done {
                    t,
                    search: true,
                    replica: 0,
                },
            );
        }
        // Judge calls.
        while let Some(&t) = judge_q.front() {
            match eoe.route(&w.judge.name, now_ms) {
                Ok(r) => {
                    judge_q.pop_front();
                    let ApiCall::Judge { exec_ms } = w.trajectories[t].steps[next[t]].call else {
                        continue;
                    };
                    report.actions.push(ActionRecord {
                        queue_ms: now - due[t],
                        exec_ms,
                        overhead_ms: 0.0,
                        cores: 1,
                    });
                    push(
                        &mut heap,
                        now + exec_ms,
                        EvKind::Done {
                            t,
                            search: false,
                            replica: r.replica,
                        },
                    );
                }
                Err(_) => break,
            }
        }
    }
    report.step_time_ms = if first.is_finite() {
        last_end - first
    } else {
        0.0
    };
    report
}

/// Parameters of the `deepsearch` generator.
///
/// Calibrated to the paper's published characteristics: batch 2048, agentic web search with
/// an LLM judge as reward (GRPO). Each trajectory makes 4 to 12 search calls, each after a
/// generation time (log-normal, median 6 s, sigma 0.6), the search answering in a log-normal
/// median 0.8 s (sigma 0.5); then one judge call (0.6 s on a resident replica). The default
/// provider allows 200 requests/s, burst 50, 256 concurrent connections (enough that the
/// rate, not the connections, is the limit); the judge has 8 GPUs (one node).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DeepSearch {
    /// Trajectories.
    pub batch: usize,
    /// Seed.
    pub seed: u64,
}

impl DeepSearch {
    /// The default provider.
    pub fn provider() -> ProviderQuota {
        ProviderQuota {
            name: "search".into(),
            rate_per_s: 200.0,
            burst: 50,
            concurrency: 256,
            slow_ms: None,
        }
    }

    /// Generates the workload.
    pub fn generate(&self) -> ApiWorkload {
        let mut rng = Rng::new(self.seed ^ 0x0064_7365_6172_6368);
        let trajectories = (0..self.batch)
            .map(|_| {
                let calls = 4 + (rng.next_u64() % 9) as usize;
                let mut steps: Vec<ApiStep> = (0..calls)
                    .map(|_| ApiStep {
                        think_ms: rng.lognormal(6_000.0, 0.6),
                        call: ApiCall::Search {
                            latency_ms: rng.lognormal(800.0, 0.5),
                        },
                    })
                    .collect();
                steps.push(ApiStep {
                    think_ms: rng.lognormal(6_000.0, 0.6),
                    call: ApiCall::Judge {
                        exec_ms: rng.lognormal(600.0, 0.25),
                    },
                });
                ApiTrajectory {
                    job: "deepsearch".into(),
                    start_ms: 0.0,
                    steps,
                }
            })
            .collect();
        ApiWorkload {
            trajectories,
            provider: Self::provider(),
            judge: ServiceSpec {
                name: "judge".into(),
                gpus: 1,
                restore_ms: 200,
                slots: 16,
            },
            gpus: vec![vec![8]],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deterministic_and_pooled_quota_beats_per_trajectory_slices() {
        let w = DeepSearch {
            batch: 400,
            seed: 2,
        }
        .generate();
        let a = simulate_api(&w, QuotaMode::Pooled, "tangram");
        assert_eq!(a, simulate_api(&w, QuotaMode::Pooled, "tangram"));
        let b = simulate_api(&w, QuotaMode::PerTrajectory, "static");
        let calls: usize = w.trajectories.iter().map(|t| t.steps.len()).sum();
        assert_eq!(a.actions.len(), calls);
        assert_eq!(b.actions.len(), calls);
        // Pooled quota lets a trajectory borrow what others leave idle.
        assert!(
            a.step_time_ms < b.step_time_ms,
            "{} vs {}",
            a.step_time_ms,
            b.step_time_ms
        );
    }
}
