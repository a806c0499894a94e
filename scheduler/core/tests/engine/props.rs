//! Property tests: random event sequences (sandbox actions, reward calls on a GPU service,
//! api calls on a rate-limited provider, dispatch outcomes, results, heartbeats, worker loss
//! and restarts, cordons and drains, time) against the engine's invariants.

use super::*;
use proptest::prelude::*;
use std::collections::{BTreeMap as Map, BTreeSet};

#[derive(Debug, Clone)]
enum Step {
    /// Trajectory `t` sends its next action (open, exec or close by its state).
    Submit { t: usize, min: u32, max: u32 },
    /// The `k`-th dispatch handed out is stored (or fails).
    Store { k: usize, ok: bool },
    /// The `k`-th action a worker runs completes.
    Finish { k: usize },
    /// Worker `w` reports (alive workers only).
    Beat { w: usize },
    /// Worker `w` dies: no more heartbeats or results.
    Kill { w: usize },
    /// Worker `w` comes back as a new instance, with nothing running.
    Restart { w: usize },
    /// Time passes.
    Wait { ms: u64 },
    /// A reward call (`gpu`) or an api call, outside any sandbox.
    Call { gpu: bool },
    /// Worker `w` is cordoned, drained (its sandboxes lost `ms` from now), or uncordoned.
    Cordon {
        w: usize,
        drain_ms: Option<u64>,
        off: bool,
    },
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => (0..6usize, 1..3u32, 0..4u32).prop_map(|(t, min, extra)| Step::Submit { t, min, max: min + extra }),
        3 => (0..8usize, prop::bool::weighted(0.85)).prop_map(|(k, ok)| Step::Store { k, ok }),
        3 => (0..8usize).prop_map(|k| Step::Finish { k }),
        3 => (0..3usize).prop_map(|w| Step::Beat { w }),
        1 => (0..3usize).prop_map(|w| Step::Kill { w }),
        1 => (0..3usize).prop_map(|w| Step::Restart { w }),
        2 => (1..4_000u64).prop_map(|ms| Step::Wait { ms }),
        2 => prop::bool::ANY.prop_map(|gpu| Step::Call { gpu }),
        1 => (0..3usize, prop::option::of(0..3_000u64), prop::bool::weighted(0.5))
            .prop_map(|(w, drain_ms, off)| Step::Cordon { w, drain_ms, off }),
    ]
}

const WORKERS: [(&str, u32, u64); 3] = [("w0", 4, 2048), ("w1", 2, 1024), ("w2", 8, 4096)];
/// The worker that also has two GPUs (service `rm`, one GPU a replica, two calls at once) and
/// serves the provider `search` (2 calls in flight at most).
const GPU_WORKER: usize = 2;
const SLOTS: u32 = 2;
const CONCURRENCY: u32 = 2;

/// The world around the engine: workers that run what was stored, and a ledger of how each
/// accepted action ended.
struct World {
    h: Harness,
    alive: [bool; 3],
    /// Dispatches handed out, not yet stored or failed.
    handed: Vec<(String, Dispatch)>,
    /// Stored dispatches the workers run: (worker, dispatch).
    running: Vec<(String, Dispatch)>,
    /// Per trajectory: how many actions it sent.
    sent: Map<usize, u32>,
    /// Accepted ids and how many times each ended (a result it was settled by).
    ends: Map<ActionId, u32>,
    /// Calls sent.
    calls: u32,
}

impl World {
    fn new(policy: &str) -> Self {
        let config = EngineConfig {
            policy: policy.into(),
            ..cfg()
        };
        Self {
            h: Harness::with(config, &WORKERS),
            alive: [true; 3],
            handed: vec![],
            running: vec![],
            sent: Map::new(),
            ends: Map::new(),
            calls: 0,
        }
    }

    fn absorb(&mut self, fx: Vec<Effect>) {
        for e in fx {
            match e {
                Effect::Dispatch { worker, dispatch } => {
                    self.handed.push((worker.to_string(), *dispatch))
                }
                // A re-size follows its dispatch on the worker's subject: it applies to the
                // dispatch wherever that is (still in flight, or running).
                Effect::Regrant { regrant: r, .. } => {
                    for (_, d) in self.handed.iter_mut().chain(self.running.iter_mut()) {
                        if d.action.id == r.id && d.attempt == r.attempt {
                            d.grant = r.grant;
                        }
                    }
                }
                Effect::PublishResult { result, .. } => {
                    *self.ends.entry(result.id.clone()).or_default() += 1;
                }
                Effect::Reject(r) => {
                    if let Some(id) = r.message.id.as_deref().and_then(|i| ActionId::new(i).ok()) {
                        *self.ends.entry(id).or_default() += 1;
                    }
                }
                // The worker reads its fence: what it ran is dropped (results included) and
                // it rejoins as a new instance.
                Effect::Fence { worker, .. } => {
                    let name = worker.to_string();
                    self.running.retain(|(x, _)| x != &name);
                    let inst = format!("f{}", self.h.now);
                    self.h.instance.insert(name, inst);
                }
                _ => {}
            }
        }
    }

    fn apply(&mut self, s: Step) {
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
                self.ends.entry(a.id.clone()).or_default();
                self.h.arrive(a).1
            }
            Step::Store { k, ok } => {
                if self.handed.is_empty() {
                    return;
                }
                let (w, d) = self.handed.remove(k % self.handed.len());
                if ok {
                    let fx = self.h.stored(&d);
                    let wi = WORKERS.iter().position(|x| x.0 == w).unwrap();
                    // A worker refuses a dispatch addressed to an instance it no longer is.
                    let addressed =
                        d.instance.is_none() || d.instance.as_ref() == self.h.instance.get(&w);
                    if self.alive[wi] && addressed {
                        self.running.push((w, d));
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
                let unsettled = self.h.engine.state_of(&d.action.id).is_some();
                let fx = self.h.complete(&d, &w);
                if unsettled {
                    *self.ends.entry(d.action.id.clone()).or_default() += 1;
                }
                fx
            }
            Step::Beat { w } => {
                if !self.alive[w] {
                    return;
                }
                let name = WORKERS[w].0;
                let running: Vec<String> = self
                    .running
                    .iter()
                    .filter(|(x, _)| x == name)
                    .map(|(_, d)| d.action.id.to_string())
                    .collect();
                let running: Vec<&str> = running.iter().map(String::as_str).collect();
                self.beat(w, &running)
            }
            Step::Kill { w } => {
                self.alive[w] = false;
                let name = WORKERS[w].0;
                self.running.retain(|(x, _)| x != name);
                return;
            }
            Step::Restart { w } => {
                self.alive[w] = true;
                let name = WORKERS[w].0;
                self.running.retain(|(x, _)| x != name);
                let inst = format!("i{}", self.h.now);
                self.h.instance.insert(name.to_string(), inst);
                self.beat(w, &[])
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
                    id: ActionId::new(id).unwrap(),
                    job: JobId::new("j").unwrap(),
                    trajectory: TrajectoryId::new("calls").unwrap(),
                    timeout_ms: 10_000,
                    spec,
                };
                self.ends.entry(a.id.clone()).or_default();
                self.h.arrive(a).1
            }
            Step::Cordon { w, drain_ms, off } => {
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
    }

    /// Worker `w`'s heartbeat, listing `running`; the GPU worker reports its GPUs, the
    /// service and the provider too.
    fn beat(&mut self, w: usize, running: &[&str]) -> Vec<Effect> {
        let (name, cores, mem) = WORKERS[w];
        let mut hb = self.h.heartbeat_of(name, cores, mem, running, &[]);
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

    fn check_capacity(&self) -> Result<(), TestCaseError> {
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
        // As the workers see it: what they run, at the grants they were last told, fits.
        for (name, cores, _) in WORKERS {
            let held: u32 = self
                .running
                .iter()
                .filter(|(w, _)| w == name)
                .map(|(_, d)| d.grant.cores)
                .sum();
            prop_assert!(held <= cores, "{name} runs {held} cores of {cores}");
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
    fn drain(&mut self) {
        for _ in 0..200 {
            if self.h.engine.unsettled() == 0 {
                break;
            }
            while !self.handed.is_empty() {
                self.apply(Step::Store { k: 0, ok: true });
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

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn capacity_holds_every_action_ends_once_and_nothing_outlives_its_worker(
        steps in prop::collection::vec(step(), 1..120)
    ) {
        run("tangram", steps)?;
    }

    #[test]
    fn re_sizing_running_actions_keeps_every_invariant(
        steps in prop::collection::vec(step(), 1..120)
    ) {
        run("tangram-v2", steps)?;
    }
}

/// One random run under `policy`, checked against every invariant.
fn run(policy: &str, steps: Vec<Step>) -> Result<(), TestCaseError> {
    let mut world = World::new(policy);
    for s in steps {
        world.apply(s);
        world.check_capacity()?;
    }
    // Nothing stays placed on a worker that stopped reporting, once its grace is over.
    world.apply(Step::Wait { ms: 5_000 });
    for _ in 0..3 {
        for w in 0..3 {
            world.apply(Step::Beat { w });
        }
        world.apply(Step::Wait { ms: 1_000 });
    }
    let dead: BTreeSet<String> = WORKERS
        .iter()
        .zip(world.alive)
        .filter(|(_, a)| !a)
        .map(|(w, _)| w.0.to_string())
        .collect();
    for (id, _) in world.h.engine.workers() {
        prop_assert!(
            !dead.contains(id.as_str()),
            "{id} is dead but still in the cluster"
        );
    }
    // Bring every worker back and let everything finish: every accepted action must
    // end exactly once (a worker's result, a rejection, or a result published for it).
    for w in 0..3 {
        if !world.alive[w] {
            world.apply(Step::Restart { w });
        }
        world.apply(Step::Cordon {
            w,
            drain_ms: None,
            off: true,
        });
    }
    world.drain();
    for (id, n) in &world.ends {
        let state = world.h.engine.state_of(id);
        prop_assert!(state.is_none(), "{id} never settled: {state:?}");
        prop_assert!(world.h.engine.is_settled(id));
        prop_assert_eq!(*n, 1, "{} ended {} times", id, n);
    }
    Ok(())
}

/// Regression (found by the property test in a CI run): an open whose store failed was pinned
/// to that worker for good; the worker filled up with other sandboxes and the open waited
/// forever while two workers were free. The pin is now lifted once the worker has reported
/// for two redelivery windows without the action.
#[test]
fn a_failed_store_does_not_pin_an_open_to_a_full_worker_forever() {
    use Step::*;
    let s = |t| Submit { t, min: 1, max: 1 };
    let steps = vec![
        s(4),
        s(4),
        s(4),
        s(4),
        Store { k: 0, ok: false },
        s(5),
        s(5),
        Wait { ms: 3001 },
        s(5),
        Kill { w: 0 },
        s(0),
        s(5),
        s(3),
        s(5),
        s(5),
        s(0),
        s(0),
        s(1),
        s(2),
        s(5),
        Beat { w: 1 },
        Store { k: 2, ok: false },
    ];
    run("tangram", steps).unwrap();
}
