//! The decision engine's memory at scale: heap bytes held with 100,000 queued actions, and
//! after 10,000 jobs each ran a distinct program (the learner's and per-job state's bounds).
//! Run: `cargo bench -p tangram-core --bench memory` (prints a table, then one JSON line).
//! Measured as the growth of the resident memory (VmRSS) of a fresh process over each
//! scenario, so it includes allocator overhead: an upper bound on what the engine holds.

use std::collections::BTreeMap;
use tangram_core::engine::{Arrival, Delivery, Now};
use tangram_core::{Effect, Engine, EngineConfig, Event};
use tangram_shared::codec::Encoding;
use tangram_shared::{
    Action, ActionId, ActionResult, ActionSpec, CpuRange, Dispatch, Heartbeat, JobId, Outcome,
    Placement, SandboxClose, SandboxExec, SandboxOpen, TrajectoryId, WorkerId,
};

/// The process's resident memory, bytes (Linux; 0 elsewhere).
fn live() -> usize {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<usize>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

struct Bench {
    engine: Engine,
    now: u64,
    delivery: Delivery,
}

impl Bench {
    fn new(workers: &[(&str, u32)], settle_ms: u64) -> Self {
        let mut b = Self {
            engine: Engine::new(EngineConfig {
                settle_ms,
                ..EngineConfig::default()
            })
            .expect("the default policy"),
            now: 1_000,
            delivery: 1,
        };
        for (w, cores) in workers {
            b.heartbeat(w, *cores);
        }
        b
    }

    fn at(&self) -> Now {
        Now::virtual_ms(self.now)
    }

    fn heartbeat(&mut self, w: &str, cores: u32) {
        let hb = Heartbeat {
            worker: WorkerId::new(w).expect("id"),
            instance: "i1".into(),
            seq: 0,
            interval_ms: 1_000,
            cores,
            mem_mb: 1 << 30,
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
        let at = self.at();
        self.engine.handle(Event::Heartbeat(Box::new(hb)), at);
    }

    fn arrive(&mut self, action: Action) -> Vec<Effect> {
        let arrival = self.arrival(action);
        let at = self.at();
        self.engine.handle(arrival, at)
    }

    /// Arrivals handled as one batch, the way the shell hands the engine what came in
    /// together (one scheduling cycle per batch).
    fn arrive_all(&mut self, actions: Vec<Action>) -> Vec<Effect> {
        let events: Vec<Event> = actions.into_iter().map(|a| self.arrival(a)).collect();
        let at = self.at();
        self.engine.handle_all(events, at)
    }

    fn arrival(&mut self, action: Action) -> Event {
        self.delivery += 1;
        let arrival = Arrival {
            action,
            encoding: Encoding::Msgpack,
            submitted_at_us: self.now * 1000,
            delivery: self.delivery,
            seen: false,
            model: None,
            dispatched: None,
            bytes: 0,
            redelivered: false,
        };
        Event::Arrived(Box::new(arrival))
    }

    /// Runs `action` to completion: arrival, stored dispatch, a result after `exec_ms`.
    fn run(&mut self, action: Action, exec_ms: u64) {
        let fx = self.arrive(action);
        for (worker, d) in dispatched(fx) {
            let at = self.at();
            self.engine.handle(
                Event::DispatchStored {
                    id: d.action.id.clone(),
                    attempt: d.attempt,
                    seq: 0,
                },
                at,
            );
            self.now += exec_ms;
            let mut r = ActionResult::new(
                d.action.id.clone(),
                d.action.job.clone(),
                Outcome::Completed { exit_code: 0 },
                self.now,
            )
            .for_action(&d.action, d.attempt);
            r.placement = Some(Placement {
                worker,
                cores: d.grant.cores,
                cpuset: String::new(),
            });
            r.timing.exec_us = exec_ms * 1000;
            let at = self.at();
            self.engine.handle(Event::Result(Box::new(r)), at);
        }
    }
}

fn dispatched(fx: Vec<Effect>) -> Vec<(WorkerId, Dispatch)> {
    fx.into_iter()
        .filter_map(|e| match e {
            Effect::Dispatch { worker, dispatch } => Some((worker, *dispatch)),
            _ => None,
        })
        .collect()
}

fn action(id: String, job: &str, traj: &str, spec: ActionSpec) -> Action {
    Action {
        queue_timeout_ms: None,
        id: ActionId::new(id).expect("id"),
        job: JobId::new(job).expect("job"),
        trajectory: TrajectoryId::new(traj).expect("trajectory"),
        timeout_ms: 60_000,
        spec,
    }
}

/// An exec as a coding rollout sends it: a test command and a 1 KiB source file.
fn exec(id: String, job: &str, traj: &str, program: &str) -> Action {
    let mut files = BTreeMap::new();
    files.insert("solution.py".to_string(), "x = 1\n".repeat(170));
    action(
        id,
        job,
        traj,
        ActionSpec::SandboxExec(SandboxExec {
            argv: vec![program.to_string(), "-q".into(), "tests/".into()],
            cpus: CpuRange { min: 1, max: 4 },
            files,
            ..Default::default()
        }),
    )
}

/// Arrivals per batch: what one fetch of the intake brings at full speed.
const BATCH: usize = 1_000;

fn queued(n: usize) -> serde_json::Value {
    let base = live();
    // No worker, and still settling (a scheduler that just took over): every exec waits
    // for its sandbox's worker to report.
    let mut b = Bench::new(&[], u64::MAX / 2);
    for start in (0..n).step_by(BATCH) {
        let batch = (start..n.min(start + BATCH))
            .map(|i| {
                let job = format!("job-{}", i % 16);
                exec(format!("q-{i}"), &job, &format!("t-{i}"), "pytest")
            })
            .collect();
        b.arrive_all(batch);
    }
    let held = live().saturating_sub(base);
    let queued = b.engine.status(b.at()).queued.values().sum::<usize>();
    assert_eq!(queued, n, "every action is queued");
    serde_json::json!({
        "scenario": "queued",
        "actions": n,
        "engine_bytes": held,
        "bytes_per_action": held / n.max(1),
    })
}

fn distinct(n: usize) -> serde_json::Value {
    let base = live();
    let mut b = Bench::new(&[("w1", 64), ("w2", 64)], 0);
    for i in 0..n {
        let job = format!("job-{i}");
        let traj = "t";
        b.run(
            action(
                format!("o-{i}"),
                &job,
                traj,
                ActionSpec::SandboxOpen(SandboxOpen::default()),
            ),
            1_000,
        );
        b.run(
            exec(format!("e-{i}"), &job, traj, &format!("prog-{i}")),
            2_000,
        );
        b.run(
            action(
                format!("c-{i}"),
                &job,
                traj,
                ActionSpec::SandboxClose(SandboxClose::default()),
            ),
            100,
        );
    }
    let held = live().saturating_sub(base);
    let st = b.engine.status(b.at());
    assert_eq!(st.running.values().sum::<usize>(), 0, "everything settled");
    serde_json::json!({
        "scenario": "distinct-programs-and-jobs",
        "jobs": n,
        "programs": n,
        "actions": 3 * n,
        "engine_bytes": held,
        "learned_keys": b.engine.learned_keys(),
        "learner_bound": tangram_core::learn::MAX_KEYS,
    })
}

/// Runs one scenario in a fresh process (this binary again), so that memory one scenario
/// freed cannot hide what the next one takes; returns the JSON line it printed.
fn in_child(scenario: &str, n: usize) -> serde_json::Value {
    let exe = std::env::current_exe().expect("own path");
    let out = std::process::Command::new(exe)
        .args(["--scenario", scenario, "--n", &n.to_string()])
        .output()
        .expect("running a scenario");
    assert!(
        out.status.success(),
        "{scenario}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("a scenario prints one JSON object")
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arg = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    if let Some(scenario) = arg("--scenario") {
        let n: usize = arg("--n").and_then(|n| n.parse().ok()).unwrap_or(1_000);
        let r = match scenario.as_str() {
            "queued" => queued(n),
            _ => distinct(n),
        };
        println!("{r}");
        return;
    }
    // `cargo bench` passes `--bench`; anything else (`cargo test --benches`) runs it small.
    let full = args.iter().any(|a| a == "--bench");
    let (q, d) = if full {
        (100_000, 10_000)
    } else {
        (1_000, 200)
    };
    let runs = [in_child("queued", q), in_child("distinct", d)];
    println!(
        "{:<28} {:>9} {:>14} {:>12}",
        "scenario", "actions", "engine heap", "per action"
    );
    for r in &runs {
        let bytes = r["engine_bytes"].as_u64().unwrap_or(0);
        let n = r["actions"].as_u64().unwrap_or(1).max(1);
        println!(
            "{:<28} {:>9} {:>11.1} MiB {:>10} B",
            r["scenario"].as_str().unwrap_or(""),
            n,
            bytes as f64 / (1 << 20) as f64,
            bytes / n
        );
    }
    println!(
        "{}",
        serde_json::json!({ "bench": "engine-memory", "runs": runs })
    );
}
