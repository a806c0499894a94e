//! The GPU side of the core: aligned chunk allocation over NVLink groups and the
//! Evict-on-Execution (EoE) residency manager.
//!
//! Every service is deployed ahead with its state in host memory. A *replica* is one copy of a
//! service bound to one aligned chunk of GPUs on one node; it is either **resident** (on the
//! GPUs, serving) or **evicted** (state in host memory only, chunk free for others). A reward
//! action runs on a resident replica with a free slot; when its service has none, the manager
//! restores one, evicting idle resident replicas least recently used first when no chunk is
//! free. Chunks are 1, 2, 4 or 8 GPUs, aligned to their size inside a group (a buddy layout
//! that matches NVLink domains), tracked as a bitmap per group.
//!
//! Pure: time is an argument, and the same calls give the same decisions. The scheduler
//! service and the simulator drive this same code.

use std::collections::BTreeMap;
use std::fmt;
use tangram_shared::WorkerId;

pub use group::{Chunk, GpuGroup};
pub use tangram_shared::CHUNK_SIZES;

mod group;
mod route;

/// A service as the scheduler sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceSpec {
    /// Name reward actions use.
    pub name: String,
    /// GPUs per replica: 1, 2, 4 or 8.
    pub gpus: u8,
    /// Expected time to restore an evicted replica onto its GPUs, ms (updated from measured
    /// restores).
    pub restore_ms: u64,
    /// Requests one replica serves at once (the engine batches them).
    pub slots: u32,
}

/// One replica of a service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Replica {
    /// The service.
    pub service: String,
    /// Its node.
    pub node: WorkerId,
    /// Its GPUs.
    pub chunk: Chunk,
    /// Where it is in its life (diagram: `scheduler/core/README.md`, "GPU replica").
    pub state: ReplicaState,
    /// When its last restore completes, ms (at or before now once done): a resident replica
    /// with this in the future is still restoring.
    pub ready_at_ms: u64,
    /// Actions routed to it that have not finished.
    pub busy: u32,
    /// Last time an action was routed to it or finished on it, ms.
    pub last_used_ms: u64,
    /// The order of that last use among all replicas' uses: least recently used is decided
    /// by `(last_used_ms, last_use)`, so uses within one millisecond keep their order.
    pub last_use: u64,
}

/// The static deployment's rule, in one place: a service given `gpus_per_service` GPUs
/// holds that many GPUs' worth of replicas of its size, at least one.
pub fn static_replicas(gpus_per_service: u32, service_gpus: u8) -> u32 {
    (gpus_per_service / u32::from(service_gpus.max(1))).max(1)
}

/// The GPUs the static deployment holds for services of these sizes, each given
/// `gpus_per_service`.
pub fn static_gpus(gpus_per_service: u32, service_gpus: impl IntoIterator<Item = u8>) -> u32 {
    service_gpus
        .into_iter()
        .map(|g| static_replicas(gpus_per_service, g) * u32::from(g))
        .sum()
}

/// Where a GPU replica is in its life.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplicaState {
    /// Its state in host memory; its chunk is free for others.
    Evicted,
    /// On its GPUs (restoring until [`Replica::ready_at_ms`]), taking calls up to its slots.
    Resident,
    /// On its GPUs, taking no new calls, and evicted once idle: for a service with nothing
    /// resident (`for_service: None`; any such service may take the chunk), so a popular
    /// service cannot starve the others; or, under re-balancing ([`Eoe::rebalance`]), for
    /// the backlogged service named, which alone may evict it.
    Draining {
        /// The backlogged service it drains for, under re-balancing.
        for_service: Option<String>,
    },
}

impl Replica {
    /// On its GPUs: resident or draining.
    pub fn is_resident(&self) -> bool {
        self.state != ReplicaState::Evicted
    }

    /// Draining, for whichever service.
    pub fn is_draining(&self) -> bool {
        matches!(self.state, ReplicaState::Draining { .. })
    }

    /// The service a re-balancing drain is for.
    pub fn drained_for(&self) -> Option<&str> {
        match &self.state {
            ReplicaState::Draining { for_service } => for_service.as_deref(),
            _ => None,
        }
    }
}

/// A replica taken off its GPUs to make room.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Eviction {
    /// The replica's service.
    pub service: String,
    /// Its node.
    pub node: WorkerId,
    /// The GPUs it held.
    pub chunk: Chunk,
}

/// Where a reward action goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    /// Index of the replica in [`Eoe::replicas`].
    pub replica: usize,
    /// Its node.
    pub node: WorkerId,
    /// Its GPUs.
    pub chunk: Chunk,
    /// True when this action's routing restores the replica (the worker must wake it first).
    pub restore: bool,
    /// Replicas to evict first, least recently used first.
    pub evict: Vec<Eviction>,
    /// When the replica is ready to serve (now, or when its restore completes), ms.
    pub ready_at_ms: u64,
}

/// Why a reward action could not be routed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unrouted {
    /// No service of that name is declared.
    UnknownService(String),
    /// No node has a group large enough for one replica.
    NeverFits {
        /// The service.
        service: String,
        /// GPUs per replica.
        gpus: u8,
        /// Largest group in the fleet.
        largest_group: u8,
    },
    /// Static deployment left this service without GPUs.
    NotDeployed {
        /// The service.
        service: String,
    },
    /// Every replica is busy and no chunk can be freed now: wait for one to finish.
    Busy {
        /// The service.
        service: String,
    },
}

impl fmt::Display for Unrouted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Unrouted::UnknownService(s) => write!(f, "no service named {s:?} is declared in the fleet"),
            Unrouted::NeverFits { service, gpus, largest_group } => write!(
                f,
                "service {service:?} needs {gpus} GPUs per replica; the largest NVLink group in the fleet has {largest_group}"
            ),
            Unrouted::NotDeployed { service } => write!(
                f,
                "the static deployment split the GPUs between the services and left {service:?} without any"
            ),
            Unrouted::Busy { service } => write!(
                f,
                "every replica of {service:?} is busy and every GPU chunk is held by busy replicas"
            ),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Node {
    groups: Vec<GpuGroup>,
    accepting: bool,
}

/// The Evict-on-Execution manager: GPU chunks per node, replicas and their residency.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Eoe {
    services: BTreeMap<String, ServiceSpec>,
    nodes: BTreeMap<WorkerId, Node>,
    replicas: Vec<Replica>,
    /// False for static deployment: resident replicas are never evicted and no new ones are
    /// restored after [`Eoe::pin`].
    elastic: bool,
    /// A service that already has resident replicas, all busy, may evict another service's
    /// idle replica to add one only when at least this many of its actions wait
    /// (`backlog` in [`Eoe::route_with_backlog`]) and the victim has been idle at least as
    /// long as a restore of it would take.
    pub scale_out_backlog: u32,
    /// `tangram-v2`: a service with a replica's worth of calls waiting may drain a lightly
    /// used replica of a service with none waiting (see [`Eoe::route_planned`]), and calls
    /// are packed onto the fullest replica with a free slot, so that surplus replicas go
    /// idle: the pool follows demand instead of keeping one replica per service.
    pub rebalance: bool,
    /// Uses counted so far (see [`Replica::last_use`]).
    uses: u64,
}

impl Eoe {
    /// A manager for these services, with no nodes yet.
    pub fn new(services: impl IntoIterator<Item = ServiceSpec>) -> Self {
        Self {
            services: services.into_iter().map(|s| (s.name.clone(), s)).collect(),
            nodes: BTreeMap::new(),
            replicas: Vec::new(),
            elastic: true,
            scale_out_backlog: 2,
            rebalance: false,
            uses: 0,
        }
    }

    /// Declares a service, or updates its shape (GPUs per replica, slots); a restore-time
    /// estimate already refined by measurements is kept.
    pub fn declare(&mut self, spec: ServiceSpec) {
        match self.services.get_mut(&spec.name) {
            Some(s) => {
                s.gpus = spec.gpus;
                s.slots = spec.slots;
            }
            None => {
                self.services.insert(spec.name.clone(), spec);
            }
        }
    }

    /// The declared services.
    pub fn services(&self) -> impl Iterator<Item = &ServiceSpec> {
        self.services.values()
    }

    /// One service.
    pub fn service(&self, name: &str) -> Option<&ServiceSpec> {
        self.services.get(name)
    }

    /// Updates the expected restore time of a service from a measurement (a moving average
    /// that weighs the new figure by a quarter).
    pub fn observe_restore(&mut self, service: &str, ms: u64) {
        if let Some(s) = self.services.get_mut(service) {
            s.restore_ms = (s.restore_ms * 3 + ms) / 4;
        }
    }

    /// Declares or updates a node's GPU groups (sizes of its NVLink domains). Replicas on
    /// groups that no longer exist are dropped.
    pub fn set_node(&mut self, node: &WorkerId, groups: &[u8], accepting: bool) {
        let fresh: Vec<GpuGroup> = groups.iter().map(|&g| GpuGroup::new(g)).collect();
        let changed = self
            .nodes
            .get(node)
            .map(|n| {
                n.groups
                    .iter()
                    .map(|g| g.size())
                    .ne(fresh.iter().map(|g| g.size()))
            })
            .unwrap_or(true);
        if changed {
            self.replicas.retain(|r| &r.node != node);
            self.nodes.insert(
                node.clone(),
                Node {
                    groups: fresh,
                    accepting,
                },
            );
        } else if let Some(n) = self.nodes.get_mut(node) {
            n.accepting = accepting;
        }
    }

    /// Forgets a node and its replicas.
    pub fn remove_node(&mut self, node: &WorkerId) {
        self.nodes.remove(node);
        self.replicas.retain(|r| &r.node != node);
    }

    /// Every replica known, resident or evicted.
    pub fn replicas(&self) -> &[Replica] {
        &self.replicas
    }

    /// GPUs in the fleet and GPUs held by resident replicas.
    pub fn gpus(&self) -> (u32, u32) {
        self.nodes
            .values()
            .flat_map(|n| &n.groups)
            .fold((0, 0), |(t, u), g| {
                (t + g.size() as u32, u + g.used() as u32)
            })
    }

    /// Records a replica deployed ahead (evicted, state in host memory) on `chunk`, or
    /// resident when `resident`; used when a worker reports what it holds. Returns false when
    /// the chunk does not exist, or is taken while `resident` is asked.
    pub fn adopt(
        &mut self,
        service: &str,
        node: &WorkerId,
        chunk: Chunk,
        resident: bool,
        now_ms: u64,
    ) -> bool {
        let Some(n) = self.nodes.get_mut(node) else {
            return false;
        };
        let Some(g) = n.groups.get_mut(chunk.group as usize) else {
            return false;
        };
        if let Some(i) = self
            .replicas
            .iter()
            .position(|r| r.service == service && &r.node == node && r.chunk == chunk)
        {
            if resident && !self.replicas[i].is_resident() {
                if !g.is_free(chunk.start, chunk.len) {
                    return false;
                }
                g.take(chunk.start, chunk.len);
                self.replicas[i].state = ReplicaState::Resident;
            }
            return true;
        }
        if resident {
            if !g.is_free(chunk.start, chunk.len) {
                return false;
            }
            g.take(chunk.start, chunk.len);
        } else if !CHUNK_SIZES.contains(&chunk.len)
            || !chunk.start.is_multiple_of(chunk.len)
            || chunk.start + chunk.len > g.size()
        {
            return false;
        }
        self.replicas.push(Replica {
            service: service.to_string(),
            node: node.clone(),
            chunk,
            state: if resident {
                ReplicaState::Resident
            } else {
                ReplicaState::Evicted
            },
            ready_at_ms: now_ms,
            busy: 0,
            last_used_ms: now_ms,
            last_use: 0,
        });
        let i = self.replicas.len() - 1;
        self.touch(i, now_ms);
        true
    }

    /// Static deployment: gives every service `gpus_per_service` GPUs as resident replicas
    /// (at least one replica; in name order, best fit), then freezes residency: nothing is
    /// evicted or restored afterwards. Returns the services that did not get all their
    /// replicas.
    pub fn pin(&mut self, gpus_per_service: u32) -> Vec<String> {
        let names: Vec<String> = self.services.keys().cloned().collect();
        let mut short = Vec::new();
        for name in names {
            let len = self.services[&name].gpus;
            let replicas = static_replicas(gpus_per_service, len);
            for _ in 0..replicas {
                match self.free_chunk(len, &name) {
                    Some((node, chunk, reuse)) => {
                        self.nodes.get_mut(&node).expect("node").groups[chunk.group as usize]
                            .take(chunk.start, chunk.len);
                        match reuse {
                            // A replica deployed there already (evicted): make it resident.
                            Some(i) => self.replicas[i].state = ReplicaState::Resident,
                            None => self.replicas.push(Replica {
                                service: name.clone(),
                                node,
                                chunk,
                                state: ReplicaState::Resident,
                                ready_at_ms: 0,
                                busy: 0,
                                last_used_ms: 0,
                                last_use: 0,
                            }),
                        }
                    }
                    None => {
                        short.push(name.clone());
                        break;
                    }
                }
            }
        }
        self.elastic = false;
        short
    }

    /// Ends one action on replica `i` at `now_ms`.
    pub fn finish(&mut self, i: usize, now_ms: u64) {
        if let Some(r) = self.replicas.get_mut(i) {
            r.busy = r.busy.saturating_sub(1);
        }
        self.touch(i, now_ms);
    }

    /// Replica `i` answered a call at `now_ms`: whatever its restore was estimated to take,
    /// it is on its GPUs now (and so may be evicted once idle).
    pub fn served(&mut self, i: usize, now_ms: u64) {
        if let Some(r) = self.replicas.get_mut(i) {
            r.ready_at_ms = r.ready_at_ms.min(now_ms);
        }
    }

    /// Records a use of replica `i` at `now_ms`.
    fn touch(&mut self, i: usize, now_ms: u64) {
        if let Some(r) = self.replicas.get_mut(i) {
            self.uses += 1;
            r.last_used_ms = r.last_used_ms.max(now_ms);
            r.last_use = self.uses;
        }
    }

    /// Index of the replica of `service` on `node` at `chunk`.
    pub fn find(&self, service: &str, node: &WorkerId, chunk: Chunk) -> Option<usize> {
        self.replicas
            .iter()
            .position(|r| r.service == service && &r.node == node && r.chunk == chunk)
    }

    /// Marks a replica evicted (its process died or was put to sleep outside a route); its
    /// in-flight count is kept so that their results still settle it.
    pub fn mark_evicted(&mut self, i: usize) {
        if let Some(r) = self.replicas.get_mut(i) {
            if r.is_resident() {
                r.state = ReplicaState::Evicted;
                if let Some(n) = self.nodes.get_mut(&r.node) {
                    if let Some(g) = n.groups.get_mut(r.chunk.group as usize) {
                        g.release(r.chunk.start, r.chunk.len);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
