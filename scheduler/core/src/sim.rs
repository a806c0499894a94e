//! A discrete-event simulator: the same policies on a virtual clock, so that policies can be
//! compared at the paper's scale on a small machine. Pure and deterministic: the same
//! workload and policy always give the same report.
//!
//! Trajectories are closed loops: a step's action is submitted only after the previous
//! action completed plus the step's think time. Action-level policies see each action as it
//! arrives; a per-trajectory policy (`static`) first has to obtain the trajectory's sandbox
//! with its fixed cores, which the trajectory then holds until its last action completes.

use crate::elastic::{ElasticModel, Speedup};
use crate::model::{Constraint, Pending, Policy, Snapshot, WorkerView};
use std::cmp::Ordering;
use std::collections::BinaryHeap;
use tangram_shared::{ActionId, CpuRange, Demand, WorkerId};

/// What an action uses beyond (or instead of) a trajectory's cores.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum SimCall {
    /// A sandbox command: elastic cores on the trajectory's node.
    #[default]
    Cpu,
    /// A reward call on a GPU service (Evict-on-Execution for action-level policies, an even
    /// static split of the GPUs for `static`); takes `t1_ms` on a resident replica.
    Reward {
        /// The service.
        service: String,
    },
    /// An external API call under a provider's quota (pooled for action-level policies, an
    /// even per-trajectory slice of the rate for `static`); answered after `t1_ms`.
    Api {
        /// The provider.
        provider: String,
    },
}

/// One action of a trajectory.
#[derive(Debug, Clone, PartialEq)]
pub struct SimAction {
    /// What it uses.
    pub call: SimCall,
    /// The tool it runs (the learner's key, with the job).
    pub tool: String,
    /// Elastic core range.
    pub cores: CpuRange,
    /// Duration with one core, in milliseconds.
    pub t1_ms: f64,
    /// Speed-up curve.
    pub speedup: Speedup,
}

/// One step: think (LLM generation), then an action.
#[derive(Debug, Clone, PartialEq)]
pub struct SimStep {
    /// Time before the action is submitted, in milliseconds.
    pub think_ms: f64,
    /// The action.
    pub action: SimAction,
}

/// One trajectory.
#[derive(Debug, Clone, PartialEq)]
pub struct SimTrajectory {
    /// Its job.
    pub job: String,
    /// Its id.
    pub id: String,
    /// When it starts, in milliseconds.
    pub start_ms: f64,
    /// Its steps, in order.
    pub steps: Vec<SimStep>,
}

/// What the simulator runs: trajectories on nodes of the given core counts, with GPU
/// services and API providers when reward and api actions appear.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Workload {
    /// The trajectories.
    pub trajectories: Vec<SimTrajectory>,
    /// Cores per node.
    pub nodes: Vec<u32>,
    /// GPU services reward actions name.
    pub services: Vec<crate::gpu::ServiceSpec>,
    /// GPU nodes, as NVLink group sizes.
    pub gpus: Vec<Vec<u8>>,
    /// API providers api actions name.
    pub providers: Vec<crate::quota::ProviderQuota>,
}

/// Per-action record.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ActionRecord {
    /// Queueing, ms.
    pub queue_ms: f64,
    /// Execution, ms.
    pub exec_ms: f64,
    /// System overhead (a GPU service's restore), ms.
    pub overhead_ms: f64,
    /// Cores (CPU) or GPUs it ran with.
    pub cores: u32,
}

/// What a run measured.
#[derive(Debug, Clone, PartialEq)]
pub struct SimReport {
    /// Policy name.
    pub policy: String,
    /// Every action, in completion order.
    pub actions: Vec<ActionRecord>,
    /// From the first trajectory start to the last trajectory end, ms (the RL step's
    /// rollout phase).
    pub step_time_ms: f64,
    /// Core-milliseconds held: by actions (action-level) or by trajectory sandboxes (static).
    pub reserved_core_ms: f64,
    /// Core-milliseconds of useful work (sum of T1).
    pub used_core_ms: f64,
    /// (time ms, fraction of the pool's cores held), sampled at events.
    pub utilisation: Vec<(f64, f64)>,
    /// Total cores (or GPUs) in the pool.
    pub pool_cores: u32,
    /// The pooled resource: `cpu` (cores) or `gpu`.
    pub unit: &'static str,
}

impl SimReport {
    /// ACTs (queue + execution), ms, sorted.
    pub fn acts_ms(&self) -> Vec<f64> {
        let mut v: Vec<f64> = self
            .actions
            .iter()
            .map(|a| a.queue_ms + a.overhead_ms + a.exec_ms)
            .collect();
        v.sort_by(f64::total_cmp);
        v
    }
}

pub use tangram_shared::stats::quantile;

/// An event on a simulator's virtual clock. In a `BinaryHeap` (a max-heap) the earliest
/// comes out first, and events at the same time in the order they were pushed (`seq`).
#[derive(Debug, PartialEq)]
pub(crate) struct Timed<K> {
    pub(crate) at_ms: f64,
    pub(crate) seq: u64,
    pub(crate) kind: K,
}

impl<K: PartialEq> Eq for Timed<K> {}
impl<K: PartialEq> PartialOrd for Timed<K> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl<K: PartialEq> Ord for Timed<K> {
    fn cmp(&self, other: &Self) -> Ordering {
        other
            .at_ms
            .total_cmp(&self.at_ms)
            .then(other.seq.cmp(&self.seq))
    }
}

type Event = Timed<EventKind>;

#[derive(Debug, PartialEq)]
enum EventKind {
    /// Per-trajectory provisioning: trajectory `t` starts and asks for its sandbox.
    Open { t: usize },
    /// Trajectory `t` submits its next action.
    Arrive { t: usize },
    /// The running action of trajectory `t` completes.
    Complete { t: usize },
    /// A provider's next token is due: retry waiting api actions.
    Wake,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Phase {
    /// Waiting to start.
    Idle,
    /// Static: waiting for its sandbox.
    WantsSandbox,
    /// Thinking before step `next`.
    Thinking,
    /// Its action is queued.
    Queued {
        since_ms: f64,
    },
    /// Its action runs on `node` with `cores`.
    Running {
        node: usize,
        cores: u32,
        started_ms: f64,
        queued_ms: f64,
    },
    /// Its reward or api action runs (on `replica`, or under quota `quota.0` of provider
    /// `quota.1`).
    Side {
        queued_ms: f64,
        overhead_ms: f64,
        exec_ms: f64,
        replica: Option<usize>,
        quota: Option<(usize, usize)>,
    },
    Done,
}

struct TrajState {
    phase: Phase,
    next: usize,
    /// Node holding the trajectory's sandbox (action-level: memory only; static: its cores).
    home: usize,
    /// Static: sandbox obtained at.
    sandbox_since_ms: Option<f64>,
    /// When the action now waiting became due (static: before the sandbox existed).
    due_ms: f64,
}

/// Where the scheduler's elasticity models come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Elasticity {
    /// Each action's true model (the paper profiles offline).
    Oracle,
    /// Learned online per (job, tool) from completed actions; nothing known at first.
    Learned,
}

/// Runs `workload` under `policy`, with each action's true elasticity model.
pub fn simulate(workload: &Workload, policy: &dyn Policy) -> SimReport {
    simulate_with(workload, policy, Elasticity::Oracle)
}

/// Runs `workload` under `policy`, with models from `elasticity`.
pub fn simulate_with(
    workload: &Workload,
    policy: &dyn Policy,
    elasticity: Elasticity,
) -> SimReport {
    let mut learner = crate::learn::Learner::new();
    let static_cores = policy.per_trajectory_cores();
    let node_ids: Vec<WorkerId> = (0..workload.nodes.len())
        .map(|i| WorkerId::new(format!("n{i:04}")).expect("valid id"))
        .collect();
    let mut free: Vec<u32> = workload.nodes.clone();
    let pool: u32 = workload.nodes.iter().sum();
    let n = workload.trajectories.len();
    let homes = homes(workload, policy.per_task_pools());
    let mut trajs: Vec<TrajState> = (0..n)
        .map(|i| TrajState {
            phase: Phase::Idle,
            next: 0,
            home: homes[i],
            sandbox_since_ms: None,
            due_ms: 0.0,
        })
        .collect();
    let ids: Vec<ActionId> = (0..n)
        .map(|i| ActionId::new(format!("t{i}")).expect("valid id"))
        .collect();
    let mut heap = BinaryHeap::new();
    let mut seq = 0u64;
    for (i, t) in workload.trajectories.iter().enumerate() {
        if !t.steps.is_empty() {
            let (at_ms, kind) = match static_cores {
                Some(_) => (t.start_ms, EventKind::Open { t: i }),
                None => (t.start_ms + t.steps[0].think_ms, EventKind::Arrive { t: i }),
            };
            heap.push(Event { at_ms, seq, kind });
            seq += 1;
        }
    }
    // Arrival order of waiting trajectories (FCFS queue).
    let mut queue: Vec<usize> = Vec::new();
    let mut report = SimReport {
        policy: policy.name().to_string(),
        actions: Vec::new(),
        step_time_ms: 0.0,
        reserved_core_ms: 0.0,
        used_core_ms: 0.0,
        utilisation: Vec::new(),
        pool_cores: pool,
        unit: "cpu",
    };
    let first_start = workload
        .trajectories
        .iter()
        .map(|t| t.start_ms)
        .fold(f64::INFINITY, f64::min);
    let mut last_end: f64 = 0.0;
    let mut held: u32 = 0;
    // Reward and api actions: the GPU manager and the providers' quotas.
    let mut eoe = crate::gpu::Eoe::new(workload.services.iter().cloned());
    for (i, g) in workload.gpus.iter().enumerate() {
        eoe.set_node(
            &WorkerId::new(format!("g{i:04}")).expect("valid id"),
            g,
            true,
        );
    }
    if static_cores.is_some() && !workload.services.is_empty() {
        let total: u32 = workload.gpus.iter().flatten().map(|&g| g as u32).sum();
        eoe.pin(total / workload.services.len() as u32);
    }
    let n_traj = workload.trajectories.len().max(1);
    // Pooled: one quota per provider. Static: one slice per (trajectory, provider).
    let mut quotas: Vec<crate::quota::Quota> = Vec::new();
    let quota_of = |t: usize, p: usize| {
        if static_cores.is_some() {
            t * workload.providers.len() + p
        } else {
            p
        }
    };
    if static_cores.is_some() {
        for _ in 0..workload.trajectories.len() {
            for p in &workload.providers {
                let slice = crate::quota::ProviderQuota {
                    rate_per_s: p.rate_per_s / n_traj as f64,
                    burst: 2,
                    concurrency: u32::MAX,
                    ..p.clone()
                };
                quotas.push(crate::quota::Quota::new(slice, 0));
            }
        }
    } else {
        quotas = workload
            .providers
            .iter()
            .map(|p| crate::quota::Quota::new(p.clone(), 0))
            .collect();
    }
    let mut api_inflight = vec![0u32; workload.providers.len()];
    let mut side: Vec<usize> = Vec::new();
    let mut wake_at: Option<f64> = None;

    while let Some(ev) = heap.pop() {
        let now = ev.at_ms;
        let mut batch = vec![ev];
        while heap.peek().is_some_and(|e| e.at_ms <= now) {
            batch.push(heap.pop().expect("peeked"));
        }
        for ev in batch {
            match ev.kind {
                EventKind::Open { t } => {
                    let spec = &workload.trajectories[t];
                    let st = &mut trajs[t];
                    // The first action is due after the first think time; if the sandbox comes
                    // later than that, the difference is that action's queueing.
                    st.due_ms = spec.start_ms + spec.steps[0].think_ms;
                    st.phase = Phase::WantsSandbox;
                    queue.push(t);
                }
                EventKind::Arrive { t } => {
                    let st = &mut trajs[t];
                    if st.next > 0 || static_cores.is_none() {
                        st.due_ms = now;
                    }
                    st.phase = Phase::Queued { since_ms: now };
                    if workload.trajectories[t].steps[st.next].action.call == SimCall::Cpu {
                        queue.push(t);
                    } else {
                        side.push(t);
                    }
                }
                EventKind::Wake => {
                    if wake_at.is_some_and(|w| w <= now) {
                        wake_at = None;
                    }
                }
                EventKind::Complete { t } => {
                    let spec = &workload.trajectories[t];
                    let st = &mut trajs[t];
                    match st.phase {
                        Phase::Side {
                            queued_ms,
                            overhead_ms,
                            exec_ms,
                            replica,
                            quota,
                        } => {
                            report.actions.push(ActionRecord {
                                queue_ms: queued_ms,
                                exec_ms,
                                overhead_ms,
                                cores: 0,
                            });
                            if let Some(i) = replica {
                                eoe.finish(i, now as u64);
                            }
                            if let Some((q, p)) = quota {
                                quotas[q].finish(now as u64, Some(200), exec_ms as u64);
                                api_inflight[p] -= 1;
                            }
                        }
                        Phase::Running {
                            node,
                            cores,
                            started_ms,
                            queued_ms,
                        } => {
                            let action = &spec.steps[st.next].action;
                            report.actions.push(ActionRecord {
                                queue_ms: queued_ms,
                                exec_ms: now - started_ms,
                                overhead_ms: 0.0,
                                cores,
                            });
                            report.used_core_ms += action.t1_ms;
                            learner.observe(
                                &format!("{}/{}", spec.job, action.tool),
                                cores,
                                now - started_ms,
                            );
                            if static_cores.is_none() {
                                free[node] += cores;
                                held -= cores;
                                report.reserved_core_ms += cores as f64 * (now - started_ms);
                            }
                        }
                        _ => continue,
                    }
                    st.next += 1;
                    if st.next < spec.steps.len() {
                        st.phase = Phase::Thinking;
                        heap.push(Event {
                            at_ms: now + spec.steps[st.next].think_ms,
                            seq,
                            kind: EventKind::Arrive { t },
                        });
                        seq += 1;
                    } else {
                        st.phase = Phase::Done;
                        last_end = last_end.max(now);
                        if let (Some(c), Some(since)) = (static_cores, st.sandbox_since_ms) {
                            free[st.home] += c;
                            held -= c;
                            report.reserved_core_ms += c as f64 * (now - since);
                        }
                    }
                }
            }
        }

        // Static: queued actions of trajectories that hold a sandbox start at once.
        // Everything else goes through the policy.
        let snapshot = Snapshot::new(
            workload
                .nodes
                .iter()
                .enumerate()
                .map(|(i, &c)| WorkerView {
                    id: node_ids[i].clone(),
                    total_cores: c,
                    free_cores: free[i],
                    total_mem_mb: u64::MAX / 4,
                    free_mem_mb: u64::MAX / 4,
                    accepting: true,
                })
                .collect(),
        );
        let mut pending = Vec::with_capacity(queue.len());
        let mut direct = Vec::new();
        for &t in &queue {
            let st = &trajs[t];
            let step = &workload.trajectories[t].steps[st.next];
            match (static_cores, st.phase) {
                (Some(c), Phase::WantsSandbox) => pending.push(Pending {
                    id: ids[t].clone(),
                    demand: Demand {
                        cores: Some(CpuRange { min: c, max: c }),
                        mem_mb: 0,
                    },
                    constraint: Constraint::Any,
                    model: None,
                    needs: Default::default(),
                }),
                (Some(_), Phase::Queued { .. }) => direct.push(t),
                _ => pending.push(Pending {
                    id: ids[t].clone(),
                    demand: Demand {
                        cores: Some(step.action.cores),
                        mem_mb: 0,
                    },
                    constraint: Constraint::OnWorker(node_ids[st.home].clone()),
                    model: match elasticity {
                        Elasticity::Oracle => Some(ElasticModel {
                            t1_ms: step.action.t1_ms,
                            speedup: step.action.speedup.clone(),
                        }),
                        Elasticity::Learned => learner.model(&format!(
                            "{}/{}",
                            workload.trajectories[t].job, step.action.tool
                        )),
                    },
                    needs: Default::default(),
                }),
            }
        }
        let plan = if pending.is_empty() {
            Default::default()
        } else {
            policy.schedule(&snapshot, &pending, now as u64)
        };
        let mut started: Vec<(usize, usize, u32)> = Vec::new();
        for l in &plan.launches {
            let t: usize = l.id.as_str()[1..].parse().expect("sim ids are t<index>");
            let node = node_ids.binary_search(&l.worker).expect("known node");
            started.push((t, node, l.grant.cores));
        }
        for (t, node, cores) in started {
            free[node] -= cores;
            held += cores;
            let st = &mut trajs[t];
            if st.phase == Phase::WantsSandbox {
                st.home = node;
                st.sandbox_since_ms = Some(now);
                st.phase = Phase::Thinking;
                heap.push(Event {
                    at_ms: now.max(st.due_ms),
                    seq,
                    kind: EventKind::Arrive { t },
                });
                seq += 1;
            } else {
                start_action(
                    &mut heap,
                    &mut seq,
                    &workload.trajectories[t],
                    st,
                    t,
                    node,
                    cores,
                    now,
                );
            }
        }
        for t in direct {
            let c = static_cores.unwrap_or(1);
            let st = &mut trajs[t];
            let action = &workload.trajectories[t].steps[st.next].action;
            // Inside its sandbox an action uses what it can of the sandbox's cores.
            let cores = c.min(action.cores.max).max(1);
            let home = st.home;
            start_action(
                &mut heap,
                &mut seq,
                &workload.trajectories[t],
                st,
                t,
                home,
                cores,
                now,
            );
        }
        // Reward and api actions, in arrival order.
        let mut backlog: std::collections::BTreeMap<String, u32> = Default::default();
        for &t in &side {
            if let SimCall::Reward { service } =
                &workload.trajectories[t].steps[trajs[t].next].action.call
            {
                *backlog.entry(service.clone()).or_default() += 1;
            }
        }
        let mut still = Vec::with_capacity(side.len());
        for t in std::mem::take(&mut side) {
            let action = &workload.trajectories[t].steps[trajs[t].next].action;
            let queued_ms = now - trajs[t].due_ms;
            match &action.call {
                SimCall::Reward { service } => {
                    let b = backlog.get(service).copied().unwrap_or(1);
                    match eoe.route_with_backlog(service, now as u64, b) {
                        Ok(r) => {
                            if let Some(x) = backlog.get_mut(service) {
                                *x = x.saturating_sub(1);
                            }
                            let overhead_ms = (r.ready_at_ms as f64 - now).max(0.0);
                            trajs[t].phase = Phase::Side {
                                queued_ms,
                                overhead_ms,
                                exec_ms: action.t1_ms,
                                replica: Some(r.replica),
                                quota: None,
                            };
                            heap.push(Event {
                                at_ms: now + overhead_ms + action.t1_ms,
                                seq,
                                kind: EventKind::Complete { t },
                            });
                            seq += 1;
                        }
                        Err(crate::gpu::Unrouted::Busy { .. }) => still.push(t),
                        // No such service, or it can never fit: the action is dropped from the
                        // run (a real scheduler rejects it), and its trajectory ends here.
                        Err(_) => trajs[t].phase = Phase::Done,
                    }
                }
                SimCall::Api { provider } => {
                    let Some(p) = workload.providers.iter().position(|x| &x.name == provider)
                    else {
                        trajs[t].phase = Phase::Done;
                        continue;
                    };
                    let q = quota_of(t, p);
                    let conc_ok = api_inflight[p] < workload.providers[p].concurrency;
                    match quotas[q].ready_in_ms(now as u64) {
                        Some(0) if conc_ok => {
                            quotas[q].take(&workload.trajectories[t].job, 1.0, now as u64);
                            api_inflight[p] += 1;
                            trajs[t].phase = Phase::Side {
                                queued_ms,
                                overhead_ms: 0.0,
                                exec_ms: action.t1_ms,
                                replica: None,
                                quota: Some((q, p)),
                            };
                            heap.push(Event {
                                at_ms: now + action.t1_ms,
                                seq,
                                kind: EventKind::Complete { t },
                            });
                            seq += 1;
                        }
                        Some(ms) if ms > 0 => {
                            let at = now + ms as f64;
                            if wake_at.is_none_or(|w| at < w) {
                                wake_at = Some(at);
                                heap.push(Event {
                                    at_ms: at,
                                    seq,
                                    kind: EventKind::Wake,
                                });
                                seq += 1;
                            }
                            still.push(t);
                        }
                        _ => still.push(t),
                    }
                }
                SimCall::Cpu => still.push(t),
            }
        }
        side = still;
        queue.retain(|&t| match trajs[t].phase {
            Phase::WantsSandbox => true,
            Phase::Queued { .. } => {
                workload.trajectories[t].steps[trajs[t].next].action.call == SimCall::Cpu
            }
            _ => false,
        });
        if pool > 0 {
            report.utilisation.push((now, held as f64 / pool as f64));
        }
    }
    report.step_time_ms = if first_start.is_finite() {
        last_end - first_start
    } else {
        0.0
    };
    report
}

/// Where each trajectory's sandbox lives: round-robin over all nodes, or, with per-task
/// pools, round-robin over its job's share of the nodes (node `i` belongs to job `i mod J`,
/// jobs numbered by first appearance).
fn homes(workload: &Workload, per_task: bool) -> Vec<usize> {
    let nodes = workload.nodes.len().max(1);
    if !per_task {
        return (0..workload.trajectories.len())
            .map(|i| i % nodes)
            .collect();
    }
    let mut jobs: Vec<&str> = Vec::new();
    for t in &workload.trajectories {
        if !jobs.contains(&t.job.as_str()) {
            jobs.push(&t.job);
        }
    }
    let mut seen = vec![0usize; jobs.len()];
    workload
        .trajectories
        .iter()
        .map(|t| {
            let j = jobs.iter().position(|&x| x == t.job).unwrap_or(0);
            let mine: Vec<usize> = (0..nodes).filter(|n| n % jobs.len() == j).collect();
            let pool = if mine.is_empty() {
                (0..nodes).collect()
            } else {
                mine
            };
            seen[j] += 1;
            pool[(seen[j] - 1) % pool.len()]
        })
        .collect()
}

#[allow(clippy::too_many_arguments)]
fn start_action(
    heap: &mut BinaryHeap<Event>,
    seq: &mut u64,
    spec: &SimTrajectory,
    st: &mut TrajState,
    t: usize,
    node: usize,
    cores: u32,
    now: f64,
) {
    let action = &spec.steps[st.next].action;
    let dur = ElasticModel {
        t1_ms: action.t1_ms,
        speedup: action.speedup.clone(),
    }
    .dur_ms(cores);
    st.phase = Phase::Running {
        node,
        cores,
        started_ms: now,
        queued_ms: now - st.due_ms,
    };
    heap.push(Event {
        at_ms: now + dur,
        seq: *seq,
        kind: EventKind::Complete { t },
    });
    *seq += 1;
}

/// A small seeded generator (splitmix64), so workloads are reproducible without a
/// dependency.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// Seeds it.
    pub fn new(seed: u64) -> Self {
        Self(seed ^ 0x5851_f42d_4c95_7f2d)
    }
    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
    /// Log-normal with the given median and sigma.
    pub fn lognormal(&mut self, median: f64, sigma: f64) -> f64 {
        // Box-Muller.
        let u1 = self.unit().max(1e-12);
        let u2 = self.unit();
        let z = (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos();
        median * (sigma * z).exp()
    }
}

/// Parameters of the `ai-coding` generator.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AiCoding {
    /// Concurrent trajectories (the RL batch).
    pub batch: usize,
    /// Seed.
    pub seed: u64,
    /// RL jobs sharing the cluster (1: one job named `ai-coding`). With more, job `k` gets a
    /// share of the trajectories proportional to `2^-k` (uneven, as real jobs are).
    pub jobs: usize,
}

/// Cores each `static` sandbox gets in the baseline: a common per-pod request; also the DoP
/// at which the generator's ~1 s action durations are defined.
pub const STATIC_CORES: u32 = 4;

impl AiCoding {
    /// The paper's cluster for AI coding: 15 nodes of 256 cores.
    pub fn nodes() -> Vec<u32> {
        vec![256; 15]
    }

    /// Generates the workload. Calibration (from the paper's published characteristics):
    /// actions take about 1 s at the baseline's 4 cores (log-normal, median 0.8 s); their
    /// parallelism is mixed (Amdahl parallel fraction 0, 0.5, 0.9 or 0.98, elastic range
    /// [1, 16]); think time between actions is drawn so that a sandbox is busy about 47% of
    /// a trajectory's life under per-trajectory provisioning; 8 to 16 turns per trajectory;
    /// trajectories start within the first 2 s of the step.
    pub fn generate(&self) -> Workload {
        let mut rng = Rng::new(self.seed);
        let jobs = self.jobs.max(1);
        // Job k's share is proportional to 2^-k; trajectory i goes to the job whose
        // cumulative share covers i / batch.
        let weights: Vec<f64> = (0..jobs).map(|k| 0.5f64.powi(k as i32)).collect();
        let total: f64 = weights.iter().sum();
        let batch = self.batch.max(1) as f64;
        let job_name = |i: usize| -> String {
            if jobs == 1 {
                return "ai-coding".into();
            }
            let x = i as f64 / batch * total;
            let mut acc = 0.0;
            for (k, w) in weights.iter().enumerate() {
                acc += w;
                if x < acc {
                    return format!("ai-coding-{k}");
                }
            }
            format!("ai-coding-{}", jobs - 1)
        };
        // (parallel fraction, share, tool): lint and single-file scripts are serial, unit
        // tests partly parallel, builds and parallel test runners scale well.
        let fractions = [
            (0.0, 0.3, "lint"),
            (0.5, 0.2, "unit-test"),
            (0.9, 0.3, "pytest-xdist"),
            (0.98, 0.2, "build"),
        ];
        let trajectories = (0..self.batch)
            .map(|i| {
                let turns = 8 + (rng.next_u64() % 9) as usize;
                let steps = (0..turns)
                    .map(|_| {
                        let mut pick = rng.unit();
                        let (p, _, tool) = *fractions
                            .iter()
                            .find(|(_, w, _)| {
                                pick -= w;
                                pick < 0.0
                            })
                            .unwrap_or(&fractions[3]);
                        let speedup = Speedup::Amdahl(p);
                        let exec_at_static = rng.lognormal(800.0, 0.6);
                        let t1_ms = exec_at_static * speedup.at(STATIC_CORES);
                        // Busy 47%: mean think = mean exec * 53/47.
                        let think_ms = rng.lognormal(800.0 * 53.0 / 47.0, 0.6);
                        SimStep {
                            think_ms,
                            action: SimAction {
                                call: SimCall::Cpu,
                                tool: tool.into(),
                                cores: CpuRange { min: 1, max: 16 },
                                t1_ms,
                                speedup,
                            },
                        }
                    })
                    .collect();
                SimTrajectory {
                    job: job_name(i),
                    id: format!("t{i}"),
                    start_ms: rng.unit() * 2000.0,
                    steps,
                }
            })
            .collect();
        Workload {
            trajectories,
            nodes: Self::nodes(),
            ..Default::default()
        }
    }
}

/// Summary statistics of a report, in seconds.
#[derive(Debug, Clone, PartialEq)]
pub struct Summary {
    /// Policy.
    pub name: String,
    /// Mean ACT.
    pub mean_act_s: f64,
    /// Median ACT.
    pub p50_act_s: f64,
    /// 99th percentile ACT.
    pub p99_act_s: f64,
    /// Mean queueing.
    pub mean_queue_s: f64,
    /// Mean execution.
    pub mean_exec_s: f64,
    /// Mean overhead (GPU restores; CPU actions are charged none).
    pub mean_overhead_s: f64,
    /// Step time (rollout phase).
    pub step_time_s: f64,
    /// Core-seconds (or GPU-seconds, see `unit`) held.
    pub reserved_cpu_s: f64,
    /// Core-seconds (or GPU-seconds) of useful work.
    pub used_cpu_s: f64,
    /// `cpu` or `gpu`.
    pub unit: &'static str,
    /// Actions simulated.
    pub actions: usize,
}

impl SimReport {
    /// Summarises the run.
    pub fn summary(&self) -> Summary {
        let acts = self.acts_ms();
        let n = self.actions.len().max(1) as f64;
        Summary {
            name: self.policy.clone(),
            mean_act_s: acts.iter().sum::<f64>() / n / 1e3,
            p50_act_s: quantile(&acts, 0.5) / 1e3,
            p99_act_s: quantile(&acts, 0.99) / 1e3,
            mean_queue_s: self.actions.iter().map(|a| a.queue_ms).sum::<f64>() / n / 1e3,
            mean_exec_s: self.actions.iter().map(|a| a.exec_ms).sum::<f64>() / n / 1e3,
            mean_overhead_s: self.actions.iter().map(|a| a.overhead_ms).sum::<f64>() / n / 1e3,
            step_time_s: self.step_time_ms / 1e3,
            reserved_cpu_s: self.reserved_core_ms / 1e3,
            used_cpu_s: self.used_core_ms / 1e3,
            unit: self.unit,
            actions: self.actions.len(),
        }
    }
}

/// Counts actions per trajectory (for checks).
pub fn actions_in(workload: &Workload) -> usize {
    workload.trajectories.iter().map(|t| t.steps.len()).sum()
}
