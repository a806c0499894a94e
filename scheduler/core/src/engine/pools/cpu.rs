//! The CPU pool: workers' cores and memory, planned by the CPU policy. The pool keeps what
//! each worker offers (from its reports and cordons), the policy, and what the policy's last
//! plan said of the actions it did not start (the status report's wait reasons). What is
//! held of it comes from the engine's ledger each cycle ([`CpuHold`]): launched actions'
//! counted cores and held sandboxes' cores and memory, so a settled action or a closed
//! sandbox frees its share by leaving the ledger, and `release` has nothing to do.
//!
//! The engine resolves each sandbox action's constraint from the trajectory's sandbox (a
//! ledger matter: open, lost, closing) and hands it over as a [`Pending`]; the pool applies
//! the policy's provisioning (under `PerTrajectory` an open takes the trajectory's fixed
//! cores and an exec runs at once on them) and its plan.

use super::{Fleet, Planned, Pool, Release, Waiting, WorkerReport};
use crate::engine::lifecycle::CpuBooking;
use crate::engine::{Now, Observation};
use crate::model::{Constraint, Policy, Provisioning, Snapshot, Unplaced, WorkerView};
use std::collections::{BTreeMap, HashMap};
use tangram_shared::status::Status;
use tangram_shared::{
    ActionId, ActionSpec, CpuRange, Grant, JobId, RejectCode, Rejection, TrajectoryId, WorkerId,
};

/// What a worker offers the pool, as it last reported.
#[derive(Debug, Clone, Copy)]
struct Capacity {
    cores: u32,
    mem_mb: u64,
    /// Draining: no new work at all.
    draining: bool,
    /// Cordoned by an operator: only work pinned to it.
    cordoned: bool,
}

/// What is held of the pool on a worker: a launched action's counted cores, or a held
/// sandbox's cores and memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CpuHold {
    pub(crate) cores: u32,
    pub(crate) mem_mb: u64,
    /// A sandbox (counted per worker for image-aware placement's load).
    pub(crate) sandbox: bool,
}

impl CpuHold {
    /// What a launched sandbox action holds: its counted cores.
    pub(crate) fn of_action(b: &CpuBooking) -> Self {
        CpuHold {
            cores: b.counted_cores,
            mem_mb: 0,
            sandbox: false,
        }
    }
}

/// See the module docs.
#[derive(Debug)]
pub(crate) struct CpuPool {
    policy: Box<dyn Policy>,
    provisioning: Provisioning,
    workers: BTreeMap<WorkerId, Capacity>,
    /// The policy's last word on what it did not start, as its plan gave it.
    unplaced: Vec<(ActionId, Unplaced)>,
}

impl CpuPool {
    pub(crate) fn new(policy: Box<dyn Policy>) -> Self {
        Self {
            provisioning: policy.provisioning(),
            policy,
            workers: BTreeMap::new(),
            unplaced: Vec::new(),
        }
    }

    /// An empty pool that stands in while the engine's own is out planning (allocates
    /// nothing).
    pub(crate) fn placeholder() -> Self {
        Self::new(Box::new(crate::policies::FcfsFirstFit))
    }

    /// The policy's name.
    pub(crate) fn policy_name(&self) -> &'static str {
        self.policy.name()
    }

    /// How the policy provisions cores.
    pub(crate) fn provisioning(&self) -> Provisioning {
        self.provisioning
    }

    /// What the last plan said of the actions it did not start.
    pub(crate) fn unplaced(&self) -> &[(ActionId, Unplaced)] {
        &self.unplaced
    }

    /// The workers as the policy sees them: what they offer minus what is held.
    pub(crate) fn snapshot(&self, held: &[(&WorkerId, &CpuHold)]) -> Snapshot {
        let mut used: HashMap<&WorkerId, (u32, u64, u32)> = HashMap::new();
        for (w, h) in held {
            let u = used.entry(*w).or_default();
            u.0 += h.cores;
            u.1 += h.mem_mb;
            u.2 += u32::from(h.sandbox);
        }
        Snapshot::new(
            self.workers
                .iter()
                .map(|(id, c)| {
                    let (cores, mem, sandboxes) = used.get(id).copied().unwrap_or_default();
                    WorkerView {
                        id: id.clone(),
                        total_cores: c.cores,
                        free_cores: c.cores.saturating_sub(cores),
                        total_mem_mb: c.mem_mb,
                        free_mem_mb: c.mem_mb.saturating_sub(mem),
                        accepting: !c.draining,
                        cordoned: c.cordoned,
                        sandboxes,
                    }
                })
                .collect(),
        )
    }

    fn offer(&mut self, report: &WorkerReport<'_>) {
        let hb = report.hb;
        self.workers.insert(
            hb.worker.clone(),
            Capacity {
                cores: hb.cores,
                mem_mb: hb.mem_mb,
                draining: hb.draining,
                // Not accepting though not draining: cordoned.
                cordoned: !report.accepting && !hb.draining,
            },
        );
    }
}

impl Pool for CpuPool {
    type Booking = CpuHold;
    type Ticket = CpuBooking;

    fn ingest(&mut self, report: &WorkerReport<'_>, _now: Now) -> Vec<Observation> {
        self.offer(report);
        Vec::new()
    }

    fn accepting(&mut self, report: &WorkerReport<'_>) {
        self.offer(report);
    }

    fn forget_worker(&mut self, worker: &WorkerId) {
        self.workers.remove(worker);
    }

    fn forget_trajectory(&mut self, _job: &JobId, _trajectory: &TrajectoryId) {}

    /// The sandbox actions in `waiting` (each with its [`Waiting::cpu`]), provisioned as
    /// the policy says and planned by it: launches in the policy's order, then the execs
    /// that run at once on their sandbox's own cores; rejections for what can never fit.
    fn plan(
        &mut self,
        waiting: &[Waiting<'_>],
        held: &[(&WorkerId, &CpuHold)],
        fleet: &Fleet<'_>,
        now: Now,
    ) -> Planned<CpuBooking> {
        let mut out = Planned::default();
        let mut pending = Vec::with_capacity(waiting.len());
        let mut direct = Vec::new();
        for w in waiting {
            let Some(p) = w.cpu else {
                continue;
            };
            let mut p = p.clone();
            if let Some(c) = self.provisioning.trajectory_cores() {
                match w.spec {
                    // The trajectory's sandbox takes its fixed cores for its whole life.
                    ActionSpec::SandboxOpen(_) => {
                        p.demand.cores = Some(CpuRange { min: c, max: c })
                    }
                    // Its commands run at once on those cores.
                    ActionSpec::SandboxExec(_) => {
                        let max = p.demand.cores.map_or(1, |r| r.max);
                        if let Constraint::OnWorker(worker) = &p.constraint {
                            let grant = Grant {
                                cores: c.min(max).max(1),
                                mem_mb: 0,
                            };
                            let booking = CpuBooking {
                                grant,
                                counted_cores: 0,
                            };
                            direct.push((p.id, worker.clone(), booking));
                        }
                        continue;
                    }
                    _ => {}
                }
            }
            pending.push(p);
        }
        let plan = if pending.is_empty() {
            Default::default()
        } else {
            self.policy.schedule(&self.snapshot(held), &pending, now.ms)
        };
        let opens: std::collections::HashSet<&ActionId> = waiting
            .iter()
            .filter(|w| matches!(w.spec, ActionSpec::SandboxOpen(_)))
            .map(|w| w.id)
            .collect();
        for l in plan.launches {
            // An open's cores (under `static`) are held by its sandbox from the launch on,
            // as an adopted open's are: counting them on the open too booked them twice
            // until its result.
            let counted_cores = if opens.contains(&l.id) {
                0
            } else {
                l.grant.cores
            };
            let booking = CpuBooking {
                grant: l.grant,
                counted_cores,
            };
            out.launches.push((l.id, l.worker, booking));
        }
        out.launches.extend(direct);
        for (id, why) in &plan.unplaced {
            // Just started: a worker large enough may not have reported yet.
            if matches!(why, Unplaced::NeverFits(_)) && fleet.judges_capacity {
                let rejection = Rejection::new(RejectCode::Unsatisfiable, why.to_string());
                out.rejections.push((id.clone(), rejection));
            }
        }
        self.unplaced = plan.unplaced;
        out
    }

    /// Nothing to give back: what is held is read from the ledger each cycle.
    fn release(
        &mut self,
        _worker: &WorkerId,
        _job: &JobId,
        _trajectory: &TrajectoryId,
        _booking: &CpuHold,
        _release: &Release,
        _now: Now,
    ) {
    }

    /// Each worker's cores and memory in use.
    fn report(&self, held: &[(&WorkerId, &CpuHold)], status: &mut Status) {
        let snapshot = self.snapshot(held);
        for w in &mut status.workers {
            let Some(view) = WorkerId::new(&w.id)
                .ok()
                .and_then(|id| snapshot.worker(&id))
            else {
                continue;
            };
            w.cores_used = view.total_cores - view.free_cores;
            w.mem_used_mb = view.total_mem_mb - view.free_mem_mb;
        }
    }
}
