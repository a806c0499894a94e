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

pub use tangram_shared::CHUNK_SIZES;

/// One NVLink domain of at most 8 GPUs, as a bitmap of the cards in use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuGroup {
    size: u8,
    used: u8,
}

fn mask(start: u8, len: u8) -> u8 {
    let bits = if len >= 8 { 0xffu16 } else { (1u16 << len) - 1 };
    ((bits << start) & 0xff) as u8
}

impl GpuGroup {
    /// A group of `size` GPUs (clamped to 8), all free.
    pub fn new(size: u8) -> Self {
        Self {
            size: size.min(8),
            used: 0,
        }
    }
    /// GPUs in the group.
    pub fn size(&self) -> u8 {
        self.size
    }
    /// GPUs in use.
    pub fn used(&self) -> u8 {
        self.used.count_ones() as u8
    }
    /// Aligned starts for a chunk of `len` GPUs that fit in the group.
    pub fn starts(&self, len: u8) -> impl Iterator<Item = u8> + '_ {
        let ok = CHUNK_SIZES.contains(&len) && len <= self.size;
        (0..self.size)
            .step_by(len.max(1) as usize)
            .filter(move |s| ok && s + len <= self.size)
    }
    /// True when the chunk is inside the group, aligned and entirely free.
    pub fn is_free(&self, start: u8, len: u8) -> bool {
        CHUNK_SIZES.contains(&len)
            && start.is_multiple_of(len)
            && start + len <= self.size
            && self.used & mask(start, len) == 0
    }
    /// The free aligned chunk of `len` GPUs that keeps larger chunks whole: among the free
    /// starts, the one whose enclosing buddy blocks are the most used (best fit), lowest
    /// start on ties.
    pub fn best_fit(&self, len: u8) -> Option<u8> {
        self.starts(len)
            .filter(|&s| self.is_free(s, len))
            .max_by_key(|&s| {
                let mut score = 0u32;
                let mut block = len * 2;
                while block <= 8 {
                    let b = s - s % block;
                    let used =
                        (self.used & mask(b, block.min(self.size.saturating_sub(b)))).count_ones();
                    score = score * 16 + used;
                    block *= 2;
                }
                (score, std::cmp::Reverse(s))
            })
    }
    /// Marks a chunk used. Panics in debug builds if any card was already used.
    pub fn take(&mut self, start: u8, len: u8) {
        debug_assert!(self.is_free(start, len), "chunk {start}+{len} is not free");
        self.used |= mask(start, len);
    }
    /// Marks a chunk free.
    pub fn release(&mut self, start: u8, len: u8) {
        self.used &= !mask(start, len);
    }
}

/// Where a replica lives: GPUs `start .. start + len` of group `group` on a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Chunk {
    /// Index of the NVLink group on the node.
    pub group: u16,
    /// First GPU, counted inside the group.
    pub start: u8,
    /// GPUs in the chunk: 1, 2, 4 or 8.
    pub len: u8,
}

impl Chunk {
    /// True when the two chunks share a GPU.
    pub fn overlaps(&self, other: &Chunk) -> bool {
        self.group == other.group
            && self.start < other.start + other.len
            && other.start < self.start + self.len
    }
}

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
                    .map(|g| g.size)
                    .ne(fresh.iter().map(|g| g.size))
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
            .fold((0, 0), |(t, u), g| (t + g.size as u32, u + g.used() as u32))
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
            || chunk.start + chunk.len > g.size
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

    /// A free chunk of `len` GPUs on an accepting node, best fit; prefers a chunk where
    /// `service` already has an evicted replica (the index is then returned).
    fn free_chunk(&self, len: u8, service: &str) -> Option<(WorkerId, Chunk, Option<usize>)> {
        for (i, r) in self.replicas.iter().enumerate() {
            if !r.is_resident() && r.service == service && r.chunk.len == len {
                if let Some(n) = self.nodes.get(&r.node) {
                    if n.accepting && n.groups[r.chunk.group as usize].is_free(r.chunk.start, len) {
                        return Some((r.node.clone(), r.chunk, Some(i)));
                    }
                }
            }
        }
        for (id, n) in &self.nodes {
            if !n.accepting {
                continue;
            }
            for (gi, g) in n.groups.iter().enumerate() {
                if let Some(start) = g.best_fit(len) {
                    let chunk = Chunk {
                        group: gi as u16,
                        start,
                        len,
                    };
                    return Some((id.clone(), chunk, None));
                }
            }
        }
        None
    }

    /// The chunk to free by evicting idle resident replicas, least recently used first: among
    /// aligned chunks on accepting nodes whose every resident occupant is idle and ready, the
    /// one whose most recently used occupant is the oldest (fewest evictions on ties).
    /// `min_idle_ms` excludes occupants used more recently than that, except a replica that a
    /// re-balancing drain empties for `service` itself.
    fn evictable_chunk(
        &self,
        len: u8,
        now_ms: u64,
        min_idle_ms: u64,
        service: &str,
    ) -> Option<(WorkerId, Chunk, Vec<usize>)> {
        self.lru_chunk(len, |r| {
            let drained_for_it = r.is_draining() && r.drained_for() == Some(service);
            r.busy == 0
                && r.ready_at_ms <= now_ms
                && (drained_for_it || now_ms.saturating_sub(r.last_used_ms) >= min_idle_ms)
        })
    }

    /// Among aligned chunks of `len` GPUs on accepting nodes that hold at least one resident
    /// replica, all of them passing `take`, the one whose most recently used occupant is the
    /// oldest (fewest occupants on ties), with its node and occupants.
    fn lru_chunk(
        &self,
        len: u8,
        take: impl Fn(&Replica) -> bool,
    ) -> Option<(WorkerId, Chunk, Vec<usize>)> {
        type Candidate = (((u64, u64), usize), WorkerId, Chunk, Vec<usize>);
        let mut best: Option<Candidate> = None;
        for (id, n) in self.nodes.iter().filter(|(_, n)| n.accepting) {
            for (gi, g) in n.groups.iter().enumerate() {
                for start in g.starts(len) {
                    let chunk = Chunk {
                        group: gi as u16,
                        start,
                        len,
                    };
                    let occupants = self.replicas.iter().enumerate().filter(|(_, r)| {
                        r.is_resident() && &r.node == id && r.chunk.overlaps(&chunk)
                    });
                    let mut victims = Vec::new();
                    let mut newest = (0u64, 0u64);
                    let mut ok = true;
                    for (i, r) in occupants {
                        if !take(r) {
                            ok = false;
                            break;
                        }
                        newest = newest.max((r.last_used_ms, r.last_use));
                        victims.push(i);
                    }
                    if !ok || victims.is_empty() {
                        continue;
                    }
                    let key = (newest, victims.len());
                    if best.as_ref().is_none_or(|(k, ..)| key < *k) {
                        best = Some((key, id.clone(), chunk, victims));
                    }
                }
            }
        }
        best.map(|(_, n, c, v)| (n, c, v))
    }

    /// Routes one reward action of `service` at `now_ms`, booking a slot on the chosen
    /// replica (and restoring or evicting as the route says). Call [`Eoe::finish`] with the
    /// route's replica when the action ends.
    pub fn route(&mut self, service: &str, now_ms: u64) -> Result<Route, Unrouted> {
        self.route_with_backlog(service, now_ms, 1)
    }

    /// [`Eoe::route`], told how many actions of `service` wait (this one included), which
    /// decides whether scaling out by eviction is worth a restore.
    pub fn route_with_backlog(
        &mut self,
        service: &str,
        now_ms: u64,
        backlog: u32,
    ) -> Result<Route, Unrouted> {
        self.route_planned(service, now_ms, backlog, &|_| 0)
    }

    /// [`Eoe::route_with_backlog`], told how many calls wait for every service. With
    /// [`Eoe::rebalance`], a service whose replicas are all full with at least a replica's
    /// slots of calls waiting, and no chunk to take, marks the least busy replica of a service
    /// with nothing waiting draining (one at a time, only one at most a quarter full): it takes
    /// no new calls and once idle it is evicted for this service. The drain is called off once
    /// this service has no calls waiting (its own service may then take the replica back).
    pub fn route_planned(
        &mut self,
        service: &str,
        now_ms: u64,
        backlog: u32,
        waiting: &dyn Fn(&str) -> u32,
    ) -> Result<Route, Unrouted> {
        let spec = self
            .services
            .get(service)
            .cloned()
            .ok_or_else(|| Unrouted::UnknownService(service.to_string()))?;
        let largest = self
            .nodes
            .values()
            .flat_map(|n| n.groups.iter().map(|g| g.size))
            .max()
            .unwrap_or(0);
        if spec.gpus > largest || !CHUNK_SIZES.contains(&spec.gpus) {
            return Err(Unrouted::NeverFits {
                service: service.to_string(),
                gpus: spec.gpus,
                largest_group: largest,
            });
        }
        // 1. A resident replica with a free slot: the least busy, earliest ready.
        let accepting = |r: &Replica| self.nodes.get(&r.node).is_some_and(|n| n.accepting);
        let resident = self
            .replicas
            .iter()
            .enumerate()
            .filter(|(_, r)| {
                // Under re-balancing a service takes back its own replica drained for a
                // service that no longer has calls waiting, rather than wait while its
                // replica sits idle.
                let stale = r.drained_for().is_some_and(|f| waiting(f) == 0);
                let usable = !r.is_draining() || (self.rebalance && stale);
                r.is_resident()
                    && usable
                    && r.service == service
                    && r.busy < spec.slots
                    && accepting(r)
            })
            .min_by_key(|(i, r)| {
                if self.rebalance {
                    // Pack: the fullest ready replica first, so that a service's surplus
                    // replicas go idle and can be given up when its demand falls; one being
                    // drained only when no other has a slot.
                    (
                        r.is_draining(),
                        r.ready_at_ms > now_ms,
                        u32::MAX - r.busy,
                        r.ready_at_ms,
                        *i,
                    )
                } else {
                    (false, false, r.busy, r.ready_at_ms, *i)
                }
            })
            .map(|(i, _)| i);
        if let Some(i) = resident {
            self.replicas[i].state = ReplicaState::Resident;
            self.touch(i, now_ms);
            let r = &mut self.replicas[i];
            r.busy += 1;
            return Ok(Route {
                replica: i,
                node: r.node.clone(),
                chunk: r.chunk,
                restore: false,
                evict: Vec::new(),
                ready_at_ms: r.ready_at_ms.max(now_ms),
            });
        }
        if !self.elastic {
            // Static deployment: a service that got no GPUs never will.
            if !self
                .replicas
                .iter()
                .any(|r| r.is_resident() && r.service == service)
            {
                return Err(Unrouted::NotDeployed {
                    service: service.to_string(),
                });
            }
            return Err(Unrouted::Busy {
                service: service.to_string(),
            });
        }
        let has_resident = self
            .replicas
            .iter()
            .any(|r| r.is_resident() && r.service == service);
        // 2. A free chunk. 3. Evict idle replicas, least recently used first; a service that
        // already has a resident replica only takes chunks idle for a while (no thrash).
        let (node, chunk, reuse, victims) = if let Some((n, c, reuse)) =
            self.free_chunk(spec.gpus, service)
        {
            (n, c, reuse, Vec::new())
        } else {
            let found = if !has_resident {
                self.evictable_chunk(spec.gpus, now_ms, 0, service)
            } else if backlog >= self.scale_out_backlog {
                self.evictable_chunk(spec.gpus, now_ms, spec.restore_ms, service)
            } else {
                None
            };
            match found {
                Some((n, c, v)) => (n, c, None, v),
                None => {
                    if !has_resident {
                        self.drain_for(spec.gpus, now_ms, waiting);
                    } else if self.rebalance && backlog >= spec.slots.max(self.scale_out_backlog) {
                        self.drain_light(&spec, now_ms, waiting);
                    }
                    return Err(Unrouted::Busy {
                        service: service.to_string(),
                    });
                }
            }
        };
        let mut victims = victims;
        victims.sort_by_key(|&i| (self.replicas[i].last_used_ms, self.replicas[i].last_use, i));
        let mut evict = Vec::with_capacity(victims.len());
        for &v in &victims {
            let r = &mut self.replicas[v];
            r.state = ReplicaState::Evicted;
            self.nodes.get_mut(&r.node).expect("node").groups[r.chunk.group as usize]
                .release(r.chunk.start, r.chunk.len);
            evict.push(Eviction {
                service: r.service.clone(),
                node: r.node.clone(),
                chunk: r.chunk,
            });
        }
        self.nodes.get_mut(&node).expect("node").groups[chunk.group as usize]
            .take(chunk.start, chunk.len);
        let ready_at_ms = now_ms + spec.restore_ms;
        let existing = reuse.or_else(|| {
            self.replicas.iter().position(|r| {
                !r.is_resident() && r.service == service && r.node == node && r.chunk == chunk
            })
        });
        let i = match existing {
            Some(i) => i,
            None => {
                self.replicas.push(Replica {
                    service: service.to_string(),
                    node: node.clone(),
                    chunk,
                    state: ReplicaState::Evicted,
                    ready_at_ms,
                    busy: 0,
                    last_used_ms: now_ms,
                    last_use: 0,
                });
                self.replicas.len() - 1
            }
        };
        self.touch(i, now_ms);
        let r = &mut self.replicas[i];
        r.state = ReplicaState::Resident;
        r.ready_at_ms = ready_at_ms;
        r.busy = 1;
        Ok(Route {
            replica: i,
            node,
            chunk,
            restore: true,
            evict,
            ready_at_ms,
        })
    }

    /// [`Eoe::rebalance`]: marks the least busy replica of another service, with no calls
    /// waiting and at most a quarter of its slots busy, draining, unless one already drains.
    fn drain_light(&mut self, spec: &ServiceSpec, now_ms: u64, waiting: &dyn Fn(&str) -> u32) {
        // A drain for a service that no longer has calls waiting is called off.
        for r in &mut self.replicas {
            if r.drained_for().is_some_and(|s| waiting(s) == 0) {
                r.state = ReplicaState::Resident;
            }
        }
        if self
            .replicas
            .iter()
            .any(|r| r.is_resident() && r.drained_for().is_some())
        {
            return;
        }
        let victim = self
            .replicas
            .iter()
            .enumerate()
            .filter(|(_, r)| {
                let slots = self.services.get(&r.service).map_or(1, |s| s.slots);
                r.is_resident()
                    && !r.is_draining()
                    && r.service != spec.name
                    && r.chunk.len == spec.gpus
                    && r.ready_at_ms <= now_ms
                    && r.busy * 4 <= slots
                    && waiting(&r.service) == 0
                    && self.nodes.get(&r.node).is_some_and(|n| n.accepting)
            })
            .min_by_key(|(i, r)| (r.busy, r.last_used_ms, r.last_use, *i))
            .map(|(i, _)| i);
        if let Some(v) = victim {
            self.replicas[v].state = ReplicaState::Draining {
                for_service: Some(spec.name.clone()),
            };
        }
    }

    /// A service with no resident replica found no chunk to free: unless enough chunks are
    /// already draining, marks the least recently used chunk of `len` GPUs whose occupants are
    /// all ready and not yet draining as draining, so that it empties and can be evicted.
    fn drain_for(&mut self, len: u8, now_ms: u64, waiting: &dyn Fn(&str) -> u32) {
        // A re-balancing drain counts while the service it is for still has calls waiting:
        // the chunk it frees may serve a starving service too.
        let draining = self
            .replicas
            .iter()
            .filter(|r| {
                r.is_resident() && r.is_draining() && r.drained_for().is_none_or(|f| waiting(f) > 0)
            })
            .count();
        let starving = self
            .services
            .values()
            .filter(|s| {
                !self
                    .replicas
                    .iter()
                    .any(|r| r.is_resident() && r.service == s.name)
            })
            .count();
        if draining >= starving {
            return;
        }
        let best = self.lru_chunk(len, |r| !r.is_draining() && r.ready_at_ms <= now_ms);
        if let Some((_, _, victims)) = best {
            for v in victims {
                self.replicas[v].state = ReplicaState::Draining { for_service: None };
            }
        }
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
