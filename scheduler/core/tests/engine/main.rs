//! The decision engine, stepped: one test per lifecycle transition (`transitions.rs`) and
//! property tests over random event sequences (`props.rs`).

mod admission;
mod adopt;
mod caps;
mod declarations;
mod dispatch;
mod fleet;
mod identity;
mod idle;
mod images;
mod intake;
mod observe;
mod prepull;
mod props;
mod resize;
mod shares;
mod transitions;

use std::collections::BTreeMap;
use tangram_core::engine::{Arrival, Delivery, Now};
use tangram_core::{Effect, Engine, EngineConfig, Event};
use tangram_shared::codec::Encoding;
use tangram_shared::{
    Action, ActionId, ActionResult, ActionSpec, CpuRange, Dispatch, Heartbeat, JobId, Outcome,
    Placement, SandboxClose, SandboxExec, SandboxOpen, SandboxRef, TrajectoryId, WorkerId,
};

/// An engine past its settling time, with the given workers (cores, MiB) reporting.
pub(crate) struct Harness {
    pub engine: Engine,
    pub now: u64,
    pub next_delivery: Delivery,
    pub instance: BTreeMap<String, String>,
}

pub(crate) fn cfg() -> EngineConfig {
    EngineConfig {
        settle_ms: 0,
        ..EngineConfig::default()
    }
}

impl Harness {
    pub fn new(workers: &[(&str, u32, u64)]) -> Self {
        Self::with(cfg(), workers)
    }

    pub fn with(config: EngineConfig, workers: &[(&str, u32, u64)]) -> Self {
        let mut h = Self {
            engine: Engine::new(config).expect("a known policy"),
            now: 1_000,
            next_delivery: 1,
            instance: BTreeMap::new(),
        };
        for (w, cores, mem) in workers {
            h.instance.insert(w.to_string(), "i1".into());
            h.heartbeat(w, *cores, *mem, &[], &[]);
        }
        h
    }

    pub fn at(&self) -> Now {
        Now::virtual_ms(self.now)
    }

    pub fn step(&mut self, e: Event) -> Vec<Effect> {
        self.engine.handle(e, self.at())
    }

    pub fn advance(&mut self, ms: u64) -> Vec<Effect> {
        self.now += ms;
        self.step(Event::Tick)
    }

    pub fn heartbeat(
        &mut self,
        w: &str,
        cores: u32,
        mem: u64,
        running: &[&str],
        sandboxes: &[(&str, &str)],
    ) -> Vec<Effect> {
        let hb = self.heartbeat_of(w, cores, mem, running, sandboxes);
        self.step(Event::Heartbeat(Box::new(hb)))
    }

    /// The heartbeat [`Harness::heartbeat`] sends, for a test to change before sending.
    pub fn heartbeat_of(
        &self,
        w: &str,
        cores: u32,
        mem: u64,
        running: &[&str],
        sandboxes: &[(&str, &str)],
    ) -> Heartbeat {
        Heartbeat {
            worker: WorkerId::new(w).unwrap(),
            instance: self.instance.get(w).cloned().unwrap_or_else(|| "i1".into()),
            seq: 0,
            interval_ms: 1_000,
            cores,
            mem_mb: mem,
            running: running.iter().map(|r| ActionId::new(*r).unwrap()).collect(),
            finished: vec![],
            dispatch_seq: 0,
            known_epoch: 0,
            sandboxes: sandboxes
                .iter()
                .map(|(j, t)| SandboxRef {
                    job: JobId::new(*j).unwrap(),
                    trajectory: TrajectoryId::new(*t).unwrap(),
                    mem_mb: 512,
                    open: None,
                    idle_timeout_ms: None,
                })
                .collect(),
            draining: false,
            gpus: None,
            services: vec![],
            providers: vec![],
            warm: None,
            images: Vec::new(),
            resized: Default::default(),
        }
    }

    /// Submits an action; returns its delivery and the effects.
    pub fn arrive(&mut self, action: Action) -> (Delivery, Vec<Effect>) {
        let d = self.next_delivery;
        self.next_delivery += 1;
        let fx = self.arrive_as(action, d, false);
        (d, fx)
    }

    pub fn arrive_as(&mut self, action: Action, delivery: Delivery, seen: bool) -> Vec<Effect> {
        self.step(Event::Arrived(Box::new(Arrival {
            action,
            encoding: Encoding::Msgpack,
            submitted_at_us: self.now * 1000,
            delivery,
            seen,
            model: None,
            dispatched: None,
            bytes: 0,
            redelivered: false,
        })))
    }

    pub fn stored(&mut self, d: &Dispatch) -> Vec<Effect> {
        self.step(Event::DispatchStored {
            id: d.action.id.clone(),
            attempt: d.attempt,
            seq: 0,
        })
    }

    pub fn complete(&mut self, d: &Dispatch, worker: &str) -> Vec<Effect> {
        let mut r = ActionResult::new(
            d.action.id.clone(),
            d.action.job.clone(),
            Outcome::Completed { exit_code: 0 },
            self.now,
        )
        .for_action(&d.action, d.attempt);
        r.placement = Some(Placement {
            worker: WorkerId::new(worker).unwrap(),
            cores: d.grant.cores,
            cpuset: String::new(),
        });
        self.step(Event::Result(Box::new(r)))
    }

    /// Arrival, dispatch, stored, result: an open sandbox for (job, trajectory) on a worker.
    pub fn open_sandbox(&mut self, job: &str, traj: &str) -> String {
        let n = self.next_delivery;
        let (_, fx) = self.arrive(open(&format!("open-{traj}-{n}"), job, traj));
        let (w, d) = dispatched(&fx).into_iter().next().expect("open dispatched");
        self.stored(&d);
        self.complete(&d, &w);
        w
    }
}

pub(crate) fn id(s: &str) -> ActionId {
    ActionId::new(s).unwrap()
}

fn action(id: &str, job: &str, traj: &str, spec: ActionSpec) -> Action {
    Action {
        queue_timeout_ms: None,
        id: ActionId::new(id).unwrap(),
        job: JobId::new(job).unwrap(),
        trajectory: TrajectoryId::new(traj).unwrap(),
        timeout_ms: 10_000,
        spec,
    }
}

pub(crate) fn open(id: &str, job: &str, traj: &str) -> Action {
    action(
        id,
        job,
        traj,
        ActionSpec::SandboxOpen(SandboxOpen::default()),
    )
}

pub(crate) fn exec(id: &str, job: &str, traj: &str, min: u32, max: u32) -> Action {
    action(
        id,
        job,
        traj,
        ActionSpec::SandboxExec(SandboxExec {
            argv: vec!["make".into()],
            cpus: CpuRange { min, max },
            ..Default::default()
        }),
    )
}

pub(crate) fn close(id: &str, job: &str, traj: &str) -> Action {
    action(
        id,
        job,
        traj,
        ActionSpec::SandboxClose(SandboxClose::default()),
    )
}

/// The dispatches among `fx`, with their workers.
pub(crate) fn dispatched(fx: &[Effect]) -> Vec<(String, Dispatch)> {
    fx.iter()
        .filter_map(|e| match e {
            Effect::Dispatch { worker, dispatch } => {
                Some((worker.to_string(), (**dispatch).clone()))
            }
            _ => None,
        })
        .collect()
}

pub(crate) fn acks(fx: &[Effect]) -> Vec<Delivery> {
    fx.iter()
        .filter_map(|e| match e {
            Effect::Ack(d) => Some(*d),
            _ => None,
        })
        .collect()
}

pub(crate) fn published(fx: &[Effect]) -> Vec<ActionResult> {
    fx.iter()
        .filter_map(|e| match e {
            Effect::PublishResult { result, .. } => Some((**result).clone()),
            _ => None,
        })
        .collect()
}

pub(crate) fn rejected(fx: &[Effect]) -> Vec<(Option<String>, tangram_shared::RejectCode, String)> {
    fx.iter()
        .filter_map(|e| match e {
            Effect::Reject(r) => Some((
                r.message.id.clone(),
                r.message.rejection.code,
                r.message.rejection.reason.clone(),
            )),
            _ => None,
        })
        .collect()
}

/// Cores booked on `w` by actions and sandboxes.
pub(crate) fn booked_cores(engine: &Engine, w: &str) -> u32 {
    engine
        .booked()
        .get(&WorkerId::new(w).unwrap())
        .map_or(0, |b| b.0)
}

/// A worker's heartbeat with `gpus` GPUs (one group; none for 0) serving `judge` at `size`
/// GPUs per replica and `slots` calls at once.
pub(crate) fn judge_heartbeat(
    h: &Harness,
    w: &str,
    gpus: usize,
    size: u8,
    slots: u32,
) -> Heartbeat {
    let mut hb = h.heartbeat_of(w, 0, 0, &[], &[]);
    hb.gpus = (gpus > 0).then(|| tangram_shared::GpuInventory {
        source: "declared".into(),
        groups: vec![(0..gpus as u32).collect()],
        devices: vec![],
    });
    hb.services = vec![tangram_shared::ServiceReport {
        name: "judge".into(),
        gpus: size,
        restore_ms: 10,
        slots,
        replicas: vec![],
    }];
    hb
}

/// A reward call of `job` on `judge`.
pub(crate) fn score(id: &str, job: &str) -> Action {
    let mut a = open(id, job, "t");
    a.spec = ActionSpec::Reward(tangram_shared::Reward {
        service: "judge".into(),
        inputs: vec!["x".into()],
        options: Default::default(),
    });
    a
}
