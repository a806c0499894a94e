//! Weighted shares between jobs: what frees up goes to the job furthest below its weighted
//! share, not to whichever job queued first; widening under `tangram-v2` stops at a job's
//! weighted share while another job wants cores.

use super::*;
use std::collections::BTreeMap;
use tangram_core::elastic::{ElasticModel, Speedup};

/// Memory no sandbox here comes near: shares are decided by cores.
const MEM: u64 = 1 << 40;

fn shared(policy: &str, weights: &[(&str, f64)], fair: bool, cores: u32) -> Harness {
    Harness::with(
        EngineConfig {
            policy: policy.into(),
            job_weights: weights
                .iter()
                .map(|(j, w)| (j.to_string(), *w))
                .collect::<BTreeMap<_, _>>(),
            fair_share: fair,
            ..cfg()
        },
        &[("w1", cores, MEM)],
    )
}

/// Arrives `a` and stores what it dispatched; returns those dispatches.
fn arrive_stored(h: &mut Harness, a: Action) -> Vec<Dispatch> {
    let (_, fx) = h.arrive(a);
    let out: Vec<Dispatch> = dispatched(&fx).into_iter().map(|(_, d)| d).collect();
    for d in &out {
        h.stored(d);
    }
    out
}

/// Completes `d` and stores what that dispatched; returns the jobs of those dispatches.
fn complete_stored(h: &mut Harness, d: &Dispatch) -> Vec<String> {
    let fx = h.complete(d, "w1");
    dispatched(&fx)
        .into_iter()
        .map(|(_, d)| {
            h.stored(&d);
            d.action.job.to_string()
        })
        .collect()
}

/// A blocker job holds all `cores` of the worker; `flood` then queues `n` one-core
/// commands, and `calm` one after them. Returns the harness and the blocker's command.
fn flooded(fair: bool, n: usize) -> (Harness, Dispatch) {
    let mut h = shared("tangram", &[], fair, 4);
    h.open_sandbox("blocker", "t0");
    let blocker = arrive_stored(&mut h, exec("z", "blocker", "t0", 4, 4))
        .pop()
        .expect("the blocker runs");
    for i in 0..n {
        let t = format!("t{i}");
        h.open_sandbox("flood", &t);
        assert!(arrive_stored(&mut h, exec(&format!("f{i}"), "flood", &t, 1, 1)).is_empty());
    }
    h.open_sandbox("calm", "t1");
    assert!(arrive_stored(&mut h, exec("c1", "calm", "t1", 1, 1)).is_empty());
    (h, blocker)
}

#[test]
fn a_flooding_jobs_backlog_does_not_hold_another_jobs_command_back() {
    let (mut h, blocker) = flooded(true, 20);
    let jobs = complete_stored(&mut h, &blocker);
    assert_eq!(jobs.len(), 4, "{jobs:?}");
    assert!(
        jobs.iter().any(|j| j == "calm"),
        "calm's one command waits behind flood's 20: {jobs:?}"
    );
}

#[test]
fn in_queue_order_the_flood_takes_every_freed_core_first() {
    // The baseline the order above replaces (first come, first served): what it measures.
    let (mut h, blocker) = flooded(false, 20);
    let jobs = complete_stored(&mut h, &blocker);
    assert_eq!(jobs, vec!["flood"; 4]);
}

#[test]
fn what_frees_up_is_shared_by_weight_three_to_one() {
    let mut h = shared("tangram", &[("a", 3.0)], true, 8);
    h.open_sandbox("blocker", "t0");
    let blocker = arrive_stored(&mut h, exec("z", "blocker", "t0", 8, 8))
        .pop()
        .expect("the blocker runs");
    // b's commands queue first; a's (weight 3) after them.
    for job in ["b", "a"] {
        for i in 0..8 {
            let t = format!("t{i}");
            h.open_sandbox(job, &t);
            let id = format!("{job}{i}");
            assert!(arrive_stored(&mut h, exec(&id, job, &t, 1, 1)).is_empty());
        }
    }
    let jobs = complete_stored(&mut h, &blocker);
    let a = jobs.iter().filter(|j| *j == "a").count();
    let b = jobs.iter().filter(|j| *j == "b").count();
    assert_eq!((a, b), (6, 2), "{jobs:?}");
}

#[test]
fn a_job_whose_share_is_wanted_widens_only_to_its_weighted_share() {
    let model = ElasticModel {
        t1_ms: 10_000.0,
        speedup: Speedup::Amdahl(0.95),
    };
    let arrive_model = |h: &mut Harness, a: Action| {
        let d = h.next_delivery;
        h.next_delivery += 1;
        let fx = h.step(Event::Arrived(Box::new(Arrival {
            action: a,
            encoding: Encoding::Msgpack,
            submitted_at_us: h.now * 1000,
            delivery: d,
            seen: false,
            model: Some(model.clone()),
            dispatched: None,
            bytes: 0,
            redelivered: false,
        })));
        for (_, d) in dispatched(&fx) {
            h.stored(&d);
        }
        fx
    };
    let mut results = Vec::new();
    for fair in [true, false] {
        let mut h = shared("tangram-v2", &[("a", 3.0)], fair, 16);
        h.open_sandbox("blocker", "t0");
        h.open_sandbox("a", "t1");
        h.open_sandbox("b", "t1");
        let fx = arrive_model(&mut h, exec("z", "blocker", "t0", 8, 8));
        let (_, z) = dispatched(&fx).pop().expect("the blocker runs");
        h.now += 100;
        arrive_model(&mut h, exec("xa", "a", "t1", 1, 16));
        h.now += 100;
        arrive_model(&mut h, exec("xb", "b", "t1", 1, 16));
        h.now += 100;
        // The blocker's 8 cores free up: a and b both want them.
        h.complete(&z, "w1");
        let a = h.engine.job_cores(&JobId::new("a").unwrap());
        let b = h.engine.job_cores(&JobId::new("b").unwrap());
        assert_eq!(a + b, 16, "fair {fair}: every core in use");
        results.push((fair, a, b));
    }
    assert_eq!(results[0], (true, 12, 4), "{results:?}");
    assert_ne!(results[1].1, 12, "{results:?}");
}
