//! The GPU pool: chunks of NVLink groups and the service replicas on them, under
//! Evict-on-Execution (`gpu/`, [`Eoe`]). Reward calls are routed to a resident replica with
//! a free slot, or one is restored (evicting idle ones when no chunk is free); under
//! re-balancing (`tangram-v2`) the longest queue goes first, with aging. Under per-trajectory
//! provisioning (`static`) the GPUs are split evenly between the services once, for good.
//!
//! A service's size (GPUs per replica) and slots are fleet-wide: the operator's definition in
//! the scheduler's configuration where there is one, else the first declaration of the
//! workers serving it now. A worker whose declaration differs is refused (the fleet's spec
//! stays) and counted, so that a worker's credential cannot resize another worker's replicas
//! or change how many calls each takes.

use super::{Fleet, Planned, Pool, Release, WorkerReport};
use crate::engine::cycle::{chunk_of, chunk_ref};
use crate::engine::{Now, Observation};
use crate::gpu::{Chunk, Eoe, ServiceSpec, Unrouted};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use tangram_shared::status::{ServiceStatus, Status};
use tangram_shared::{
    ActionSpec, Evict, GpuRoute, JobId, RejectCode, Rejection, TrajectoryId, WorkerId,
};

/// Under GPU re-balancing, a reward call waiting this long is routed ahead of the longest
/// queues.
const GPU_AGING_MS: u64 = 1_000;

/// What a reward call holds until it settles: a slot of one replica.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuBooking {
    /// The replica's service.
    pub service: String,
    /// Its GPUs.
    pub chunk: Chunk,
}

/// What happened to a replica's call, for its release.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) enum ReplicaAfter {
    /// Nothing learned.
    #[default]
    Unknown,
    /// It answered: it is on its GPUs, whatever its restore estimate said.
    Served,
    /// The service failed (restarted asleep), or the route's restore or evictions may not
    /// have reached the worker (its dispatch failed): counted evicted, so that the next
    /// route restores it rather than trust it resident.
    Evicted,
}

/// See the module docs.
#[derive(Debug)]
pub(crate) struct GpuPool {
    eoe: Eoe,
    /// `static`: the services are pinned.
    pinned: bool,
    /// The operator's definitions, by service.
    defined: BTreeMap<String, ServiceSpec>,
    /// Per service, the workers whose declaration matches the fleet's spec.
    declared_by: BTreeMap<String, BTreeSet<WorkerId>>,
    /// Declarations refused, by worker and service (each counted once, until the worker
    /// declares the service as the fleet has it again).
    refused: BTreeSet<(WorkerId, String)>,
}

impl GpuPool {
    /// An empty pool; replicas follow demand under re-balancing.
    pub(crate) fn new(rebalance: bool) -> Self {
        Self::with_definitions(rebalance, BTreeMap::new())
    }

    /// An empty pool whose services' sizes and slots are the operator's `defined` ones.
    pub(crate) fn with_definitions(
        rebalance: bool,
        defined: BTreeMap<String, ServiceSpec>,
    ) -> Self {
        let mut eoe = Eoe::new(Vec::new());
        eoe.rebalance = rebalance;
        Self {
            eoe,
            pinned: false,
            defined,
            declared_by: BTreeMap::new(),
            refused: BTreeSet::new(),
        }
    }

    /// Takes in a worker's service declarations: each that agrees with the fleet's spec (the
    /// operator's, else the one its serving workers established) declares the service;
    /// each that differs is refused, and counted once.
    fn declare_services(&mut self, hb: &tangram_shared::Heartbeat) -> Vec<Observation> {
        for workers in self.declared_by.values_mut() {
            workers.remove(&hb.worker);
        }
        let mut seen = Vec::new();
        for s in &hb.services {
            let spec = ServiceSpec {
                name: s.name.clone(),
                gpus: s.gpus,
                restore_ms: s.restore_ms,
                slots: s.slots.max(1),
            };
            let standing = match self.defined.get(&s.name) {
                Some(def) => Some(def),
                None => self
                    .declared_by
                    .get(&s.name)
                    .filter(|w| !w.is_empty())
                    .and_then(|_| self.eoe.service(&s.name)),
            };
            let key = (hb.worker.clone(), s.name.clone());
            if standing.is_some_and(|d| d.gpus != spec.gpus || d.slots != spec.slots) {
                // The operator's definition stands for the fleet even when no worker
                // declares it as written (the GPUs are pooled across services).
                if let Some(def) = self.defined.get(&s.name) {
                    if self.eoe.service(&s.name).is_none() {
                        self.eoe.declare(def.clone());
                    }
                }
                if self.refused.insert(key) {
                    seen.push(Observation::DeclarationRefused {
                        kind: "service",
                        name: s.name.clone(),
                        worker: hb.worker.clone(),
                    });
                }
                continue;
            }
            self.refused.remove(&key);
            // A service already known keeps its measured restore time (`Eoe::declare`).
            self.eoe
                .declare(self.defined.get(&s.name).cloned().unwrap_or(spec));
            self.declared_by
                .entry(s.name.clone())
                .or_default()
                .insert(hb.worker.clone());
        }
        seen
    }

    /// Evict-on-Execution, read only.
    pub(crate) fn eoe(&self) -> &Eoe {
        &self.eoe
    }

    /// The GPU booking a route makes.
    pub(crate) fn booking_of(route: &GpuRoute) -> GpuBooking {
        GpuBooking {
            service: route.service.clone(),
            chunk: chunk_of(route.chunk),
        }
    }

    /// `static`: once settled, split the GPUs evenly between the services, resident for good.
    fn pin_static(&mut self, fleet: &Fleet<'_>) {
        if fleet.provisioning.trajectory_cores().is_none() || self.pinned || !fleet.settled_in {
            return;
        }
        let (total, _) = self.eoe.gpus();
        let n = self.eoe.services().count() as u32;
        if total > 0 && n > 0 {
            self.eoe.pin(total / n);
            self.pinned = true;
        }
    }
}

impl Pool for GpuPool {
    type Booking = GpuBooking;
    type Ticket = GpuRoute;

    /// GPU inventory and services from a heartbeat. The engine's view of residency is
    /// authoritative while a worker instance lives; a new instance's report replaces it.
    fn ingest(&mut self, report: &WorkerReport<'_>, now: Now) -> Vec<Observation> {
        let hb = report.hb;
        let mut seen = self.declare_services(hb);
        let Some(inv) = &hb.gpus else {
            if report.fresh {
                self.eoe.remove_node(&hb.worker);
            }
            return seen;
        };
        let sizes: Vec<u8> = inv.groups.iter().map(|g| g.len().min(8) as u8).collect();
        if report.fresh {
            self.eoe.remove_node(&hb.worker);
        }
        self.eoe.set_node(&hb.worker, &sizes, report.accepting);
        if report.fresh {
            for s in &hb.services {
                for r in &s.replicas {
                    self.eoe
                        .adopt(&s.name, &hb.worker, chunk_of(r.chunk), r.resident, now.ms);
                }
            }
        }
        let (total, resident) = self.eoe.gpus();
        seen.push(Observation::Gpus { total, resident });
        seen
    }

    fn accepting(&mut self, report: &WorkerReport<'_>) {
        if let Some(inv) = &report.hb.gpus {
            let sizes: Vec<u8> = inv.groups.iter().map(|g| g.len().min(8) as u8).collect();
            self.eoe
                .set_node(&report.hb.worker, &sizes, report.accepting);
        }
    }

    fn forget_worker(&mut self, worker: &WorkerId) {
        self.eoe.remove_node(worker);
        for workers in self.declared_by.values_mut() {
            workers.remove(worker);
        }
        self.refused.retain(|(w, _)| w != worker);
    }

    fn forget_trajectory(&mut self, _job: &JobId, _trajectory: &TrajectoryId) {}

    /// Reward calls through Evict-on-Execution: in queue order, or under re-balancing the
    /// longest queue first with aging.
    fn plan(
        &mut self,
        waiting: &[super::Waiting<'_>],
        _held: &[(&WorkerId, &GpuBooking)],
        fleet: &Fleet<'_>,
        now: Now,
    ) -> Planned<GpuRoute> {
        self.pin_static(fleet);
        let mut out = Planned::default();
        let mut backlog: HashMap<String, u32> = HashMap::new();
        let mut rewards: Vec<(&super::Waiting<'_>, String)> = waiting
            .iter()
            .filter_map(|w| match w.spec {
                ActionSpec::Reward(r) => Some((w, r.service.clone())),
                _ => None,
            })
            .collect();
        for (_, s) in &rewards {
            *backlog.entry(s.clone()).or_default() += 1;
        }
        if self.eoe.rebalance {
            // The longest queue first, so that a GPU that frees up goes where the most calls
            // wait; a call waiting past GPU_AGING_MS goes ahead of every queue (no service
            // starves). Stable: queue order within each rank.
            rewards.sort_by_key(|(w, s)| {
                let aged = now.ms.saturating_sub(w.arrived_ms) >= GPU_AGING_MS;
                // Aged calls keep their queue order among themselves.
                let queue = if aged {
                    0
                } else {
                    backlog.get(s).copied().unwrap_or(0)
                };
                (!aged, std::cmp::Reverse(queue))
            });
        }
        let mut busy: HashSet<String> = HashSet::new();
        let mut room = fleet.gpu_room.clone();
        for (w, service) in rewards {
            if busy.contains(&service) || room.get(w.job) == Some(&0) {
                // Its service is taken this cycle, or its job is at its cap of calls
                // running (it waits; other jobs' calls go on).
                continue;
            }
            let left = backlog.get(&service).copied().unwrap_or(1);
            let waiting = |s: &str| backlog.get(s).copied().unwrap_or(0);
            match self.eoe.route_planned(&service, now.ms, left, &waiting) {
                Ok(route) => {
                    if let Some(b) = backlog.get_mut(&service) {
                        *b = b.saturating_sub(1);
                    }
                    if let Some(n) = room.get_mut(w.job) {
                        *n = n.saturating_sub(1);
                    }
                    let evict = route
                        .evict
                        .iter()
                        .map(|e| Evict {
                            service: e.service.clone(),
                            chunk: chunk_ref(e.chunk),
                        })
                        .collect();
                    out.launches.push((
                        w.id.clone(),
                        route.node.clone(),
                        GpuRoute {
                            service,
                            chunk: chunk_ref(route.chunk),
                            restore: route.restore,
                            evict,
                        },
                    ));
                }
                Err(Unrouted::Busy { .. }) => {
                    busy.insert(service);
                }
                Err(why) if fleet.judges_capacity => {
                    let code = match why {
                        Unrouted::UnknownService(_) => RejectCode::UnknownService,
                        _ => RejectCode::Unsatisfiable,
                    };
                    let known: Vec<String> = self.eoe.services().map(|s| s.name.clone()).collect();
                    let reason = if known.is_empty() {
                        format!("{why}; no worker serves any model service")
                    } else {
                        format!("{why}; services: {}", known.join(", "))
                    };
                    out.rejections
                        .push((w.id.clone(), Rejection::new(code, reason)));
                }
                // Settling: the worker serving it may not have reported yet.
                Err(_) => {}
            }
        }
        out
    }

    fn release(
        &mut self,
        worker: &WorkerId,
        _job: &JobId,
        _trajectory: &TrajectoryId,
        booking: &GpuBooking,
        release: &Release,
        now: Now,
    ) {
        if let Some(i) = self.eoe.find(&booking.service, worker, booking.chunk) {
            self.eoe.finish(i, release.gpu_idle_at_ms);
            match release.replica {
                ReplicaAfter::Unknown => {}
                ReplicaAfter::Served => self.eoe.served(i, now.ms),
                ReplicaAfter::Evicted => self.eoe.mark_evicted(i),
            }
        }
        if let Some(ms) = release.restored_ms {
            self.eoe.observe_restore(&booking.service, ms);
        }
    }

    fn report(&self, _held: &[(&WorkerId, &GpuBooking)], status: &mut Status) {
        for s in self.eoe.services() {
            let mut svc = ServiceStatus {
                name: s.name.clone(),
                gpus: s.gpus,
                restore_ms: s.restore_ms,
                ..Default::default()
            };
            for r in self.eoe.replicas().iter().filter(|r| r.service == s.name) {
                svc.busy += r.busy;
                if r.is_resident() {
                    svc.resident.push(format!(
                        "{}:{}/{}+{}",
                        r.node, r.chunk.group, r.chunk.start, r.chunk.len
                    ));
                }
            }
            status.services.push(svc);
        }
    }
}
