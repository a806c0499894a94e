//! The simulated workers' side of the driver: their one report each, a stored dispatch
//! carried out (an exec for its true duration at its granted cores, an image pulled first
//! where the node lacks it, a reward call on its replica, an api call after its latency), a
//! re-size applied to a running exec, and a result handed back to its trajectory.

use super::*;

impl Driver<'_> {
    /// Every simulated worker's one report: its cores and memory, and for GPU nodes and the
    /// api worker the services and providers they serve.
    pub(super) fn heartbeats(&self) -> Vec<Event> {
        let hb = |id: String, cores: u32, mem_mb: u64| Heartbeat {
            worker: WorkerId::new(id).expect("valid id"),
            instance: "sim".into(),
            seq: 0,
            interval_ms: 1_000,
            cores,
            mem_mb,
            running: vec![],
            finished: vec![],
            dispatch_seq: 0,
            known_epoch: 0,
            sandboxes: vec![],
            draining: false,
            gpus: None,
            services: vec![],
            providers: vec![],
            warm: None,
            images: Vec::new(),
            resized: Default::default(),
        };
        let mut out = Vec::new();
        for (i, &cores) in self.w.nodes.iter().enumerate() {
            // Memory is never the limit in these workloads.
            out.push(hb(format!("n{i:04}"), cores, 1 << 40));
        }
        for (i, groups) in self.w.gpus.iter().enumerate() {
            let mut h = hb(format!("g{i:04}"), 0, 0);
            let mut next = 0u32;
            h.gpus = Some(GpuInventory {
                source: "declared".into(),
                groups: groups
                    .iter()
                    .map(|&g| {
                        let ids = (next..next + g as u32).collect();
                        next += g as u32;
                        ids
                    })
                    .collect(),
                devices: vec![],
            });
            h.services = self
                .w
                .services
                .iter()
                .map(|s| ServiceReport {
                    name: s.name.clone(),
                    gpus: s.gpus,
                    restore_ms: s.restore_ms,
                    slots: s.slots,
                    replicas: vec![],
                })
                .collect();
            out.push(h);
        }
        if !self.w.providers.is_empty() {
            let mut h = hb("api".into(), 0, 0);
            h.providers = self
                .w
                .providers
                .iter()
                .map(|p| ProviderReport {
                    name: p.name.clone(),
                    rate_per_s: p.rate_per_s,
                    burst: p.burst,
                    concurrency: p.concurrency,
                    allow: vec!["* /*".into()],
                    allow_headers: vec![],
                    slow_ms: p.slow_ms,
                })
                .collect();
            out.push(h);
        }
        out.into_iter()
            .map(|h| Event::Heartbeat(Box::new(h)))
            .collect()
    }

    /// A worker runs a stored dispatch: when does it complete, and with what result?
    pub(super) fn execute(&mut self, worker: &WorkerId, d: &Dispatch, now: f64) {
        let t = Self::traj_of(&d.action.id);
        let mut result = ActionResult::new(
            d.action.id.clone(),
            d.action.job.clone(),
            Outcome::Completed { exit_code: 0 },
            now as u64,
        )
        .for_action(&d.action, d.attempt);
        result.placement = Some(Placement {
            worker: worker.clone(),
            cores: d.grant.cores,
            cpuset: String::new(),
        });
        let mut exec_model = None;
        let (overhead_ms, exec_ms, cores) = match d.action.kind() {
            ActionKind::SandboxOpen => {
                if self.static_cores.is_some() {
                    self.trajs[t].held = Some((d.grant.cores, now));
                }
                // A pod holds its cores from its placement; its trajectory's first command
                // waits for it to start. Each trajectory draws its own start from its index,
                // the same in every run (and for every workload seed: the starts are a fixed
                // sample, so that maps over other settings compare like with like).
                let start = self.pod_start_ms.map_or(0.0, |median| {
                    crate::sim::Rng::new(0x706f_6400 ^ t as u64)
                        .lognormal(median, crate::sim::K8s::START_SIGMA)
                });
                (0.0, start + self.pull(worker, t, now), 0)
            }
            ActionKind::SandboxClose => (0.0, 0.0, 0),
            ActionKind::SandboxExec => {
                let a = &self.w.trajectories[t].steps[self.trajs[t].next].action;
                let model = ElasticModel {
                    t1_ms: a.t1_ms,
                    speedup: a.speedup.clone(),
                };
                let exec = model.dur_ms(d.grant.cores);
                exec_model = Some(model);
                (0.0, exec, d.grant.cores)
            }
            ActionKind::Reward => {
                let a = &self.w.trajectories[t].steps[self.trajs[t].next].action;
                let route = d.gpu.as_ref().expect("reward dispatches carry a route");
                for e in &route.evict {
                    self.ready
                        .remove(&(e.service.clone(), worker.clone(), e.chunk));
                    self.stats.evictions += 1;
                    self.report.timeline.count(Track::Evictions, now, 1.0);
                }
                let key = (route.service.clone(), worker.clone(), route.chunk);
                let ready = if route.restore {
                    self.stats.restores += 1;
                    self.report.timeline.count(Track::Restores, now, 1.0);
                    let at = now + self.restore_ms.get(&route.service).copied().unwrap_or(0.0);
                    self.ready.insert(key, at);
                    at
                } else {
                    *self.ready.entry(key).or_insert(now)
                };
                let overhead = (ready - now).max(0.0);
                result.service = Some(ServiceUse {
                    service: route.service.clone(),
                    gpus: vec![],
                    restored: route.restore,
                    evicted: route.evict.iter().map(|e| e.service.clone()).collect(),
                });
                let slots = self.slots.get(&route.service).copied().unwrap_or(1);
                self.stats.gpu_used_ms += a.t1_ms * route.chunk.len as f64 / slots as f64;
                (overhead, a.t1_ms, route.chunk.len as u32)
            }
            ActionKind::Api => {
                let a = &self.w.trajectories[t].steps[self.trajs[t].next].action;
                if let SimCall::Api { provider } = &a.call {
                    let track = Track::Admitted {
                        provider: provider.clone(),
                        job: self.w.trajectories[t].job.clone(),
                    };
                    self.report.timeline.count(track, now, 1.0);
                }
                result.http = Some(HttpReply {
                    status: 200,
                    headers: Default::default(),
                    body: String::new(),
                    truncated: false,
                });
                (0.0, a.t1_ms, 0)
            }
        };
        result.timing = Timing::new(0, (overhead_ms * 1e3) as u64, (exec_ms * 1e3) as u64);
        if matches!(
            d.action.kind(),
            ActionKind::SandboxExec | ActionKind::Reward | ActionKind::Api
        ) {
            self.started.insert(
                d.action.id.clone(),
                Started {
                    t,
                    at_ms: now,
                    cores,
                    overhead_ms,
                    exec: exec_model.map(|model| ExecRun {
                        model,
                        done: 0.0,
                        since_ms: now,
                        core_ms: 0.0,
                        result: result.clone(),
                    }),
                    version: 0,
                },
            );
        }
        self.push(now + overhead_ms + exec_ms, Kind::Done(Box::new(result), 0));
    }

    /// Trajectory `t`'s sandbox opens on `worker` at `now`: how long it waits for its image.
    fn pull(&mut self, worker: &WorkerId, t: usize, now: f64) -> f64 {
        let Some(i) = self.w.images.of_trajectory.get(t).copied().flatten() else {
            return 0.0;
        };
        let Some(&(_, mb)) = self.w.images.images.get(i) else {
            return 0.0;
        };
        let node = worker
            .as_str()
            .strip_prefix('n')
            .and_then(|n| n.parse::<usize>().ok());
        let Some(images) = node.and_then(|n| self.node_images.get_mut(n)) else {
            return 0.0;
        };
        let (wait, pulled) = images.open(i, mb, now, &self.w.images);
        if pulled {
            self.stats.pulls += 1;
            self.stats.pulled_mb += mb;
        }
        self.stats.pull_wait_ms += wait;
        wait
    }

    /// A running exec gets `cores` from now on: its remaining work runs at the new size, and
    /// its completion moves.
    pub(super) fn resize(&mut self, id: &ActionId, cores: u32, now: f64) {
        let Some(s) = self.started.get_mut(id) else {
            return; // finished already: a worker ignores a late re-size too
        };
        let Some(run) = s.exec.as_mut() else {
            return;
        };
        let elapsed = (now - run.since_ms).max(0.0);
        run.done = (run.done + elapsed / run.model.dur_ms(s.cores)).min(1.0);
        run.core_ms += s.cores as f64 * elapsed;
        run.since_ms = now;
        s.cores = cores;
        s.version += 1;
        let left = (1.0 - run.done) * run.model.dur_ms(cores);
        let mut result = run.result.clone();
        if let Some(p) = result.placement.as_mut() {
            p.cores = cores;
        }
        let exec_ms = now + left - s.at_ms - s.overhead_ms;
        result.timing = Timing::new(0, (s.overhead_ms * 1e3) as u64, (exec_ms * 1e3) as u64);
        let version = s.version;
        self.push(now + left, Kind::Done(Box::new(result), version));
    }

    /// The driver's side of a completion: records, and the trajectory's next move (a close
    /// to submit now, when it was the last step).
    pub(super) fn completed(&mut self, r: &ActionResult, now: f64) -> Option<Event> {
        let t = Self::traj_of(&r.id);
        match r.kind {
            Some(ActionKind::SandboxOpen) => {
                let due = self.trajs[t].due_ms.max(now);
                self.push(due, Kind::Submit(t));
                None
            }
            Some(ActionKind::SandboxClose) => {
                self.finish(t, now);
                None
            }
            _ => {
                let s = self.started.remove(&r.id)?;
                let spec = &self.w.trajectories[s.t];
                let step = &spec.steps[self.trajs[s.t].next];
                let exec_ms = now - s.at_ms - s.overhead_ms;
                // Re-sized execs held each size for part of their run.
                let core_ms = match (&step.action.call, &s.exec) {
                    (SimCall::Cpu, Some(run)) => {
                        run.core_ms + s.cores as f64 * (now - run.since_ms)
                    }
                    (SimCall::Cpu, None) => s.cores as f64 * exec_ms,
                    _ => 0.0,
                };
                self.report.actions.push(ActionRecord {
                    queue_ms: s.at_ms - self.trajs[s.t].due_ms,
                    exec_ms,
                    overhead_ms: s.overhead_ms,
                    cores: s.cores,
                    trajectory: s.t,
                    start_ms: s.at_ms,
                    core_ms,
                });
                if step.action.call == SimCall::Cpu {
                    self.report.used_core_ms += step.action.t1_ms;
                    if self.static_cores.is_none() {
                        self.report.reserved_core_ms += core_ms;
                    }
                }
                let tr = &mut self.trajs[s.t];
                tr.next += 1;
                if let Some(next) = spec.steps.get(tr.next) {
                    tr.due_ms = now + next.think_ms;
                    let due = tr.due_ms;
                    self.push(due, Kind::Submit(s.t));
                    None
                } else {
                    self.last_end = self.last_end.max(now);
                    if self.has_cpu[s.t] {
                        let a = self.action(
                            s.t,
                            "close",
                            ActionSpec::SandboxClose(SandboxClose::default()),
                        );
                        Some(self.arrival(a, None))
                    } else {
                        self.finish(s.t, now);
                        None
                    }
                }
            }
        }
    }
}
