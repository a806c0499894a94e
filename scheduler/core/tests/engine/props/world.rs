//! The world's own steps: how workers, streams and the ledger answer each step and effect,
//! and the invariants checked after each.

use super::*;

impl World {
    /// What worker `name` runs now.
    pub(super) fn runs_on<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a Dispatch> + 'a {
        self.running
            .iter()
            .filter(move |(x, _)| x == name)
            .map(|(_, d)| d)
    }

    /// The ids of what worker `name` runs now, for its heartbeat.
    pub(super) fn running_ids(&self, name: &str) -> Vec<String> {
        self.runs_on(name)
            .map(|d| d.action.id.to_string())
            .collect()
    }

    pub(super) fn new(policy: &str) -> Self {
        let config = EngineConfig {
            policy: policy.into(),
            ..cfg()
        };
        Self {
            h: Harness::with(config, &WORKERS),
            policy: policy.into(),
            alive: [true; 3],
            handed: vec![],
            running: vec![],
            sent: Map::new(),
            ends: Map::new(),
            calls: 0,
            messages: Map::new(),
            acked: BTreeSet::new(),
            stored: Map::new(),
            results: BTreeSet::new(),
            sandboxes: Map::new(),
            cordons: Map::new(),
            seq: 0,
            stored_seq: Map::new(),
            taken: Map::new(),
            terms: 1,
            resized: BTreeSet::new(),
            regrants: Vec::new(),
            instances: 0,
            adoptions: 0,
            fetches: Vec::new(),
            epochs: Map::new(),
            late: Vec::new(),
        }
    }

    /// A result for `id` is stored: it ends there (the first result only, as the results
    /// stream keeps one per action), and its dispatches leave the backlog.
    pub(super) fn result_stored(&mut self, id: &ActionId, counted: bool) {
        if counted {
            *self.ends.entry(id.clone()).or_default() += 1;
        }
        self.results.insert(id.clone());
        self.stored.retain(|(_, a), _| a != id);
        self.stored_seq.retain(|(_, a), _| a != id);
        self.regrants.retain(|(_, r, _)| &r.id != id);
    }

    /// Submits `a` as a new message.
    pub(super) fn submit(&mut self, a: Action) -> Vec<Effect> {
        self.ends.entry(a.id.clone()).or_default();
        let (d, fx) = self.h.arrive(a.clone());
        self.messages.insert(d, a);
        fx
    }

    /// Worker `w` loses everything it ran and held (re-sizes waiting for it amend nothing
    /// a new instance runs).
    pub(super) fn wipe(&mut self, name: &str) {
        self.running.retain(|(x, _)| x != name);
        self.sandboxes.remove(name);
        self.regrants.retain(|(x, _, _)| x != name);
    }

    /// The dispatch stream's next sequence.
    pub(super) fn next_seq(&mut self) -> u64 {
        self.seq += 1;
        self.seq
    }

    /// Dispatch `d` is stored for worker `w`, at the stream's next sequence.
    pub(super) fn store(&mut self, w: &str, d: &Dispatch) -> u64 {
        let seq = self.next_seq();
        let key = (w.to_string(), d.action.id.clone());
        self.stored.insert(key.clone(), d.clone());
        self.stored_seq.insert(key, seq);
        seq
    }

    /// Worker `name` has taken its subject in as far as `seq`.
    pub(super) fn took(&mut self, name: &str, seq: u64) {
        let t = self.taken.entry(name.to_string()).or_default();
        *t = (*t).max(seq);
    }

    /// A name for a worker's new instance, never used before (two restarts at one instant
    /// once had the same name, and the second instance ran what was addressed to the first).
    pub(super) fn new_instance(&mut self) -> String {
        self.instances += 1;
        format!("r{}", self.instances)
    }

    /// Worker `name` takes a re-size from the stream: it applies to the dispatch it runs,
    /// unless a leader of a later epoch has dispatched to the worker since.
    pub(super) fn take_regrant(&mut self, name: &str, r: &tangram_shared::Regrant, seq: u64) {
        self.took(name, seq);
        if self.epochs.get(name).is_some_and(|e| r.epoch < *e) {
            return;
        }
        for (x, d) in self.running.iter_mut() {
            if x == name && d.action.id == r.id && d.attempt == r.attempt {
                d.grant = r.grant;
                self.resized.insert(r.id.clone());
            }
        }
    }

    /// Worker `name` takes every re-size waiting for it (before a dispatch stored later).
    pub(super) fn take_regrants_of(&mut self, name: &str) {
        let (mine, rest): (Vec<_>, Vec<_>) = std::mem::take(&mut self.regrants)
            .into_iter()
            .partition(|(x, _, _)| x == name);
        self.regrants = rest;
        for (_, r, seq) in mine {
            self.take_regrant(name, &r, seq);
        }
    }

    pub(super) fn absorb(&mut self, fx: Vec<Effect>) {
        for e in fx {
            match e {
                Effect::Dispatch { worker, dispatch } => {
                    self.handed.push((worker.to_string(), *dispatch))
                }
                // A re-size follows its dispatch on the worker's subject: one still in flight
                // is amended; a stored one's re-size waits in the stream for its worker.
                Effect::Regrant { worker, regrant: r } => {
                    let mut amended = false;
                    for (_, d) in self.handed.iter_mut() {
                        if d.action.id == r.id && d.attempt == r.attempt {
                            d.grant = r.grant;
                            self.resized.insert(r.id.clone());
                            amended = true;
                        }
                    }
                    if !amended {
                        let seq = self.next_seq();
                        self.regrants.push((worker.to_string(), r, seq));
                    }
                }
                // Every result the engine publishes counts: a second one for an action is
                // the bug this test looks for, whatever the stream would make of it.
                Effect::PublishResult { result, .. } => self.result_stored(&result.id, true),
                Effect::Reject(r) => {
                    if let Some(id) = r.message.id.as_deref().and_then(|i| ActionId::new(i).ok()) {
                        self.result_stored(&id, true);
                    }
                }
                Effect::Ack(d) => {
                    self.acked.insert(d);
                }
                // The worker reads its fence: what it ran is dropped (results included) and
                // it rejoins as a new instance.
                // Dispatches addressed to the fenced instance are refused (no result: the
                // engine settled them) and leave the backlog.
                Effect::Fence { worker, instance } => {
                    let name = worker.to_string();
                    self.wipe(&name);
                    self.stored.retain(|(x, _), d| {
                        !(x == &name && d.instance.as_deref() == Some(instance.as_str()))
                    });
                    let inst = self.new_instance();
                    self.h.instance.insert(name, inst);
                }
                Effect::FetchDispatch { worker, id } => self.fetches.push((worker, id)),
                Effect::Observe(tangram_core::engine::Observation::Adopted(_)) => {
                    self.adoptions += 1;
                }
                _ => {}
            }
        }
    }

    pub(super) fn apply(&mut self, s: Step) {
        let fx = match s {
            Step::Submit { t, min, max } => {
                let n = self.sent.entry(t).or_default();
                *n += 1;
                let traj = format!("t{t}");
                let id = format!("t{t}-{n}");
                let a = match *n % 6 {
                    1 => open(&id, "j", &traj),
                    0 => close(&id, "j", &traj),
                    _ => exec(&id, "j", &traj, min, max),
                };
                self.submit(a)
            }
            Step::Store { k, ok } => {
                if self.handed.is_empty() {
                    return;
                }
                let (w, d) = self.handed.remove(k % self.handed.len());
                if ok {
                    let seq = self.store(&w, &d);
                    let mut fx = self.h.step(Event::DispatchStored {
                        id: d.action.id.clone(),
                        attempt: d.attempt,
                        seq,
                    });
                    let wi = WORKERS.iter().position(|x| x.0 == w).unwrap();
                    if self.alive[wi] {
                        fx.extend(self.take_in(&w, d));
                    }
                    fx
                } else {
                    self.h.step(Event::DispatchFailed {
                        id: d.action.id.clone(),
                        attempt: d.attempt,
                        error: "test".into(),
                    })
                }
            }
            Step::Finish { k } => {
                if self.running.is_empty() {
                    return;
                }
                let (w, d) = self.running.remove(k % self.running.len());
                // The worker stores its result unless one is stored already (the stream
                // keeps one per action), then acks its dispatch.
                let first = !self.results.contains(&d.action.id);
                let traj = d.action.trajectory.to_string();
                match &d.action.spec {
                    ActionSpec::SandboxOpen(_) if first => {
                        self.sandboxes.entry(w.clone()).or_default().insert(traj);
                    }
                    ActionSpec::SandboxClose(_) => {
                        self.sandboxes.entry(w.clone()).or_default().remove(&traj);
                    }
                    _ => {}
                }
                self.result_stored(&d.action.id, first);
                self.h.complete(&d, &w)
            }
            Step::Beat { w } => {
                if !self.alive[w] {
                    return;
                }
                let running = self.running_ids(WORKERS[w].0);
                let running: Vec<&str> = running.iter().map(String::as_str).collect();
                self.beat(w, &running)
            }
            Step::Kill { w } => {
                self.alive[w] = false;
                self.wipe(WORKERS[w].0);
                return;
            }
            Step::Restart { w } => {
                self.alive[w] = true;
                let name = WORKERS[w].0;
                self.wipe(name);
                // A new process: it knows no epoch and has taken nothing in yet.
                self.epochs.remove(name);
                self.taken.remove(name);
                let inst = self.new_instance();
                self.h.instance.insert(name.to_string(), inst);
                // The new instance reads what waits in its backlog (all of it addressed to
                // earlier instances), then reports.
                let mut fx = self.take_backlog(w);
                fx.extend(self.beat(w, &[]));
                fx
            }
            Step::Wait { ms } => self.h.advance(ms),
            Step::Call { gpu } => {
                self.calls += 1;
                let id = format!("c{}", self.calls);
                let spec = if gpu {
                    ActionSpec::Reward(tangram_shared::Reward {
                        service: "rm".into(),
                        inputs: vec!["x".into()],
                        options: Default::default(),
                    })
                } else {
                    ActionSpec::Api(tangram_shared::Api {
                        provider: "search".into(),
                        method: "GET".into(),
                        path: "/q".into(),
                        query: Default::default(),
                        body: None,
                        headers: Default::default(),
                    })
                };
                let a = Action {
                    queue_timeout_ms: None,
                    id: ActionId::new(id).unwrap(),
                    job: JobId::new("j").unwrap(),
                    trajectory: TrajectoryId::new("calls").unwrap(),
                    timeout_ms: 10_000,
                    spec,
                };
                self.submit(a)
            }
            Step::Failover {
                published,
                backlog_first,
                late_regrants,
            } => return self.failover(published, backlog_first, late_regrants),
            Step::Fetch { k } => return self.answer_fetch(k),
            Step::TakeRegrant { w } => {
                let name = WORKERS[w].0;
                if !self.alive[w] {
                    return;
                }
                if let Some(i) = self.regrants.iter().position(|(x, _, _)| x == name) {
                    let (_, r, seq) = self.regrants.remove(i);
                    self.take_regrant(name, &r, seq);
                }
                return;
            }
            Step::Cordon { w, drain_ms, off } => {
                if off {
                    self.cordons.remove(&w);
                } else {
                    self.cordons.insert(w, drain_ms.map(|ms| self.h.now + ms));
                }
                let worker = WorkerId::new(WORKERS[w].0).unwrap();
                let cordon = (!off).then(|| tangram_shared::status::CordonRecord {
                    drain_by_unix_ms: drain_ms.map(|ms| self.h.now + ms),
                    by: "props".into(),
                    at_unix_ms: self.h.now,
                });
                self.h.step(Event::Cordon { worker, cordon })
            }
        };
        self.absorb(fx);
        // A worker removes its sandboxes at its drain deadline.
        let drained: Vec<usize> = self
            .cordons
            .iter()
            .filter(|(_, at)| at.is_some_and(|t| self.h.now >= t))
            .map(|(w, _)| *w)
            .collect();
        for w in drained {
            self.sandboxes.remove(WORKERS[w].0);
        }
    }

    /// Worker `w`'s heartbeat, listing `running`; the GPU worker reports its GPUs, the
    /// service and the provider too.
    pub(super) fn beat(&mut self, w: usize, running: &[&str]) -> Vec<Effect> {
        self.beat_with(w, running, &[])
    }

    pub(super) fn beat_with(
        &mut self,
        w: usize,
        running: &[&str],
        sandboxes: &[(&str, &str)],
    ) -> Vec<Effect> {
        let (name, cores, mem) = WORKERS[w];
        let mut hb = self.h.heartbeat_of(name, cores, mem, running, sandboxes);
        hb.dispatch_seq = self.taken.get(name).copied().unwrap_or(0);
        hb.known_epoch = self.epochs.get(name).copied().unwrap_or(0);
        // What it runs at a re-sized width, at that width.
        hb.resized = self
            .runs_on(name)
            .filter(|d| self.resized.contains(&d.action.id))
            .map(|d| (d.action.id.clone(), d.grant.cores))
            .collect();
        if w == GPU_WORKER {
            hb.gpus = Some(tangram_shared::GpuInventory {
                source: "declared".into(),
                groups: vec![vec![0, 1]],
                devices: vec![],
            });
            hb.services = vec![tangram_shared::ServiceReport {
                name: "rm".into(),
                gpus: 1,
                restore_ms: 10,
                slots: SLOTS,
                replicas: vec![],
            }];
            hb.providers = vec![tangram_shared::ProviderReport {
                name: "search".into(),
                rate_per_s: 20.0,
                burst: 2,
                concurrency: CONCURRENCY,
                allow: vec!["GET /*".into()],
                allow_headers: vec![],
                slow_ms: None,
            }];
        }
        self.h.step(Event::Heartbeat(Box::new(hb)))
    }

    pub(super) fn check_capacity(&self) -> Result<(), TestCaseError> {
        let booked = self.h.engine.booked();
        for (id, hb) in self.h.engine.workers() {
            let (cores, mem) = booked.get(id).copied().unwrap_or_default();
            prop_assert!(
                cores <= hb.cores,
                "{id}: {cores} cores booked of {}",
                hb.cores
            );
            prop_assert!(mem <= hb.mem_mb, "{id}: {mem} MiB booked of {}", hb.mem_mb);
        }
        // As the workers see it: what they run, at the grants they were last told, fits, and
        // so do their sandboxes with the ones being opened (512 MiB each).
        for (name, cores, mem) in WORKERS {
            let held: u32 = self.runs_on(name).map(|d| d.grant.cores).sum();
            prop_assert!(held <= cores, "{name} runs {held} cores of {cores}");
            let opening = self
                .runs_on(name)
                .filter(|d| matches!(d.action.spec, ActionSpec::SandboxOpen(_)))
                .count() as u64;
            let open = self.sandboxes.get(name).map_or(0, |s| s.len()) as u64;
            prop_assert!(
                (open + opening) * 512 <= mem,
                "{name} holds {open} sandboxes and opens {opening} more in {mem} MiB"
            );
        }
        // GPUs: no replica past its slots, no two resident replicas on one GPU.
        let mut held: BTreeSet<(String, u16, u8)> = BTreeSet::new();
        for r in self.h.engine.gpus().replicas() {
            prop_assert!(
                r.busy <= SLOTS,
                "{} on {} has {} calls",
                r.service,
                r.node,
                r.busy
            );
            if r.is_resident() {
                for g in r.chunk.start..r.chunk.start + r.chunk.len {
                    prop_assert!(
                        held.insert((r.node.to_string(), r.chunk.group, g)),
                        "GPU {g} of {} held twice",
                        r.node
                    );
                }
            }
        }
        // Quota: never more calls in flight than the provider allows.
        let status = self.h.engine.status(self.h.at());
        for p in &status.providers {
            prop_assert!(
                p.inflight <= CONCURRENCY,
                "{} calls in flight on {}",
                p.inflight,
                p.name
            );
        }
        Ok(())
    }

    /// Ends the run: every handed dispatch stored, every live worker finishes and keeps
    /// reporting, time runs past every deadline.
    pub(super) fn drain(&mut self) {
        for _ in 0..200 {
            if self.h.engine.unsettled() == 0 {
                break;
            }
            while !self.fetches.is_empty() {
                self.apply(Step::Fetch { k: 0 });
            }
            while !self.handed.is_empty() {
                self.apply(Step::Store { k: 0, ok: true });
            }
            for w in 0..3 {
                self.apply(Step::TakeRegrant { w });
            }
            while !self.running.is_empty() {
                self.apply(Step::Finish { k: 0 });
            }
            // Queued actions that can never run now (their worker died) wait for capacity;
            // the trajectories close: every queued action is given time.
            for w in 0..3 {
                self.apply(Step::Beat { w });
            }
            self.apply(Step::Wait { ms: 1_000 });
        }
    }
}
