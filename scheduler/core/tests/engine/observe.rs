//! What the engine reports to the metrics: one ACT per action, and the live workers.

use super::*;
use tangram_core::engine::{Observation, WorkerGauge};
use tangram_shared::{ActionKind, Timing};

fn acts(fx: &[Effect]) -> Vec<(ActionKind, Timing)> {
    fx.iter()
        .filter_map(|e| match e {
            Effect::Observe(Observation::Act { kind, timing }) => Some((*kind, *timing)),
            _ => None,
        })
        .collect()
}

fn workers(fx: &[Effect]) -> Option<Vec<WorkerGauge>> {
    fx.iter().find_map(|e| match e {
        Effect::Observe(Observation::Workers(w)) => Some(w.clone()),
        _ => None,
    })
}

#[test]
fn a_result_reports_its_act_by_kind_once_and_a_repeat_reports_nothing() {
    let mut h = Harness::new(&[("w1", 8, 4096)]);
    h.open_sandbox("j", "t1");
    let (_, fx) = h.arrive(exec("x1", "j", "t1", 1, 4));
    let (w, d) = dispatched(&fx).into_iter().next().expect("dispatched");
    h.stored(&d);
    let mut r = ActionResult::new(
        d.action.id.clone(),
        d.action.job.clone(),
        Outcome::Completed { exit_code: 0 },
        h.now,
    )
    .for_action(&d.action, d.attempt);
    r.timing = Timing::new(2_000, 300, 40_000);
    r.placement = Some(Placement {
        worker: WorkerId::new(&w).unwrap(),
        cores: d.grant.cores,
        cpuset: String::new(),
    });
    let fx = h.step(Event::Result(Box::new(r.clone())));
    assert_eq!(
        acts(&fx),
        vec![(ActionKind::SandboxExec, Timing::new(2_000, 300, 40_000))]
    );
    // The same result again (a redelivery of the results feed): counted once only.
    let fx = h.step(Event::Result(Box::new(r)));
    assert!(acts(&fx).is_empty(), "{fx:?}");
}

#[test]
fn a_failed_action_reports_its_act_too() {
    let mut h = Harness::new(&[("w1", 8, 4096)]);
    h.open_sandbox("j", "t1");
    let (_, fx) = h.arrive(exec("x2", "j", "t1", 1, 4));
    let (_, d) = dispatched(&fx).into_iter().next().expect("dispatched");
    h.stored(&d);
    let r = ActionResult::new(
        d.action.id.clone(),
        d.action.job.clone(),
        Outcome::Completed { exit_code: 3 },
        h.now,
    )
    .for_action(&d.action, d.attempt);
    let fx = h.step(Event::Result(Box::new(r)));
    assert_eq!(acts(&fx).len(), 1);
}

#[test]
fn live_workers_are_reported_with_their_heartbeat_age_and_bookings() {
    let mut h = Harness::new(&[("w1", 8, 4096), ("w2", 4, 2048)]);
    // The first report came with the first event; the next is due a second later.
    h.now += 1_500;
    h.heartbeat("w2", 4, 2048, &[], &[]);
    h.open_sandbox("j", "t1");
    let fx = h.advance(1_000);
    let w = workers(&fx).expect("reported once a second");
    let ids: Vec<&str> = w.iter().map(|g| g.worker.as_str()).collect();
    assert_eq!(ids, ["w1", "w2"]);
    // w1 was last heard at the start, w2 1.5 s later.
    assert!((w[0].heartbeat_age_s - 2.5).abs() < 1e-9, "{w:?}");
    assert!((w[1].heartbeat_age_s - 1.0).abs() < 1e-9, "{w:?}");
    assert_eq!((w[0].cores, w[0].mem_mb), (8, 4096));
    let booked: u64 = w.iter().map(|g| g.mem_booked_mb).sum();
    assert!(booked > 0, "the open sandbox reserves memory: {w:?}");
    // Not again within the second.
    assert!(workers(&h.advance(10)).is_none());
}

/// The status report says why queued actions wait, grouped by reason: the CPU policy's
/// reason for each action it saw (its need, whatever the best worker has free), and what
/// the others wait on. It used to drop the policy's reasons, so `tangram status` could only
/// count what waited.
#[test]
fn status_says_why_queued_actions_wait() {
    let mut h = crate::Harness::new(&[("w1", 2, 1024)]);
    h.open_sandbox("j", "t1");
    // Both cores taken by one exec; two more wait for cores.
    let (_, fx) = h.arrive(crate::exec("x1", "j", "t1", 2, 2));
    assert_eq!(crate::dispatched(&fx).len(), 1);
    h.arrive(crate::exec("x2", "j", "t1", 2, 2));
    h.arrive(crate::exec("x3", "j", "t1", 2, 2));
    // An open asking for all the worker's memory waits for the first sandbox to close.
    let mut big = crate::open("o2", "j", "t2");
    if let tangram_shared::ActionSpec::SandboxOpen(o) = &mut big.spec {
        o.memory_mb = 1024;
    }
    h.arrive(big);
    // An exec whose trajectory's open is queued ahead of it.
    h.arrive(crate::exec("x4", "j", "t2", 1, 1));
    let st = h.engine.status(h.at());
    let expected: std::collections::BTreeMap<String, usize> = [
        ("no worker with 2 free cores", 2),
        ("no worker with 1 GiB free", 1),
        ("its sandbox's open, queued ahead of it", 1),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    assert_eq!(st.waiting, expected);
    assert_eq!(st.queued.values().sum::<usize>(), 4);
}

/// The status report says which job holds the sandboxes and their memory (what an operator
/// looks for when a rollout leaks them): opens being placed count, closed ones do not.
#[test]
fn status_lists_each_jobs_sandboxes_and_their_memory() {
    let mut h = crate::Harness::new(&[("w1", 4, 8192)]);
    h.open_sandbox("a", "t1");
    h.open_sandbox("a", "t2");
    h.open_sandbox("b", "t1");
    let mut big = crate::open("o-big", "b", "t2");
    if let tangram_shared::ActionSpec::SandboxOpen(o) = &mut big.spec {
        o.memory_mb = 2048;
    }
    let (_, fx) = h.arrive(big);
    assert_eq!(crate::dispatched(&fx).len(), 1, "{fx:?}");
    let st = h.engine.status(h.at());
    let default = tangram_shared::SandboxOpen::default().memory_mb;
    let job = |n, mem| tangram_shared::status::JobStatus {
        sandboxes: n,
        mem_mb: mem,
    };
    let expected = std::collections::BTreeMap::from([
        ("a".to_string(), job(2, 2 * default)),
        ("b".to_string(), job(2, default + 2048)),
    ]);
    assert_eq!(st.jobs, expected);
    assert_eq!(st.sandboxes, 4);
}
