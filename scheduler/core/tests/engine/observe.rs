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
