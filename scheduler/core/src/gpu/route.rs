//! Routing one reward action under Evict-on-Execution: the replica that takes it, the
//! chunk a restore goes to (a free one, best fit, or one freed by evicting idle replicas
//! least recently used first), and the draining of a lightly used service's replica for one
//! whose calls wait (`tangram-v2`'s rebalance).

use super::*;

impl Eoe {
    /// A free chunk of `len` GPUs on an accepting node, best fit; prefers a chunk where
    /// `service` already has an evicted replica (the index is then returned).
    pub(super) fn free_chunk(
        &self,
        len: u8,
        service: &str,
    ) -> Option<(WorkerId, Chunk, Option<usize>)> {
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
            .flat_map(|n| n.groups.iter().map(|g| g.size()))
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
}
