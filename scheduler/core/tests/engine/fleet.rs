//! The worker fleet as the engine sees it: workers lost and fenced, silence judged only on
//! evidence (a NATS gap is nobody's), cordons and drains, GPU workers' restarts, and the GPU
//! pool's choice of who gets a freed GPU.

use super::*;
use tangram_core::engine::lifecycle::ActionState;
use tangram_shared::{InfraCode, RejectCode};

fn gpu_heartbeat(instance: &str) -> Heartbeat {
    Heartbeat {
        worker: WorkerId::new("g1").unwrap(),
        instance: instance.into(),
        seq: 0,
        interval_ms: 1_000,
        cores: 0,
        mem_mb: 0,
        running: vec![],
        finished: vec![],
        dispatch_seq: 0,
        known_epoch: 0,
        sandboxes: vec![],
        draining: false,
        gpus: Some(tangram_shared::GpuInventory {
            source: "declared".into(),
            groups: vec![vec![0]],
            devices: vec![],
        }),
        services: vec![tangram_shared::ServiceReport {
            name: "judge".into(),
            gpus: 1,
            restore_ms: 10,
            slots: 1,
            replicas: vec![],
        }],
        providers: vec![],
        warm: None,
        images: Vec::new(),
        resized: Default::default(),
    }
}

fn reward(id: &str) -> Action {
    Action {
        queue_timeout_ms: None,
        id: ActionId::new(id).unwrap(),
        job: JobId::new("j").unwrap(),
        trajectory: TrajectoryId::new("t").unwrap(),
        timeout_ms: 10_000,
        spec: ActionSpec::Reward(tangram_shared::Reward {
            service: "judge".into(),
            inputs: vec!["x".into()],
            options: Default::default(),
        }),
    }
}

#[test]
fn a_reward_of_a_restarted_worker_does_not_free_a_slot_of_the_new_replica() {
    let mut h = Harness::new(&[]);
    h.step(Event::Heartbeat(Box::new(gpu_heartbeat("i1"))));
    let (_, fx) = h.arrive(reward("r1"));
    let (_, old) = dispatched(&fx).remove(0);
    h.stored(&old);
    // The worker restarts; its new replica takes the next call (one slot).
    h.now += 100;
    h.step(Event::Heartbeat(Box::new(gpu_heartbeat("i2"))));
    let (_, fx) = h.arrive(reward("r2"));
    let (_, new) = dispatched(&fx).remove(0);
    h.stored(&new);
    // The old instance's call settles: the new replica's slot stays booked.
    h.complete(&old, "g1");
    let (_, fx) = h.arrive(reward("r3"));
    assert!(
        dispatched(&fx).is_empty(),
        "a second call on a one-slot replica: {fx:?}"
    );
}

#[test]
fn a_nats_gap_longer_than_the_grace_declares_no_worker_lost() {
    let config = EngineConfig {
        reachable_every_ms: 750,
        ..cfg()
    };
    let mut h = Harness::with(config, &[("w1", 4, 4096)]);
    h.open_sandbox("j", "t1");
    let (_, fx) = h.arrive(exec("x1", "j", "t1", 1, 1));
    let (_, disp) = dispatched(&fx).remove(0);
    h.stored(&disp);
    h.step(Event::Reachable);
    // NATS stops answering for 20 s (paused): no heartbeats, no confirmations.
    let mut fx = Vec::new();
    for _ in 0..80 {
        fx.extend(h.advance(250));
    }
    assert!(
        published(&fx).is_empty(),
        "nobody is judged in the dark: {fx:?}"
    );
    // It answers again: the worker's grace starts over and its heartbeat comes within it.
    let mut fx = h.step(Event::Reachable);
    fx.extend(h.advance(250));
    h.heartbeat("w1", 4, 4096, &["x1"], &[("j", "t1")]);
    fx.extend(h.advance(250));
    assert!(published(&fx).is_empty(), "{fx:?}");
    assert!(matches!(
        h.engine.state_of(&id("x1")),
        Some(ActionState::Running { .. })
    ));
    // Its own result settles it.
    h.complete(&disp, "w1");
    assert!(h.engine.is_settled(&id("x1")));
}

#[test]
fn a_worker_silent_while_nats_answers_is_still_declared_lost() {
    let config = EngineConfig {
        reachable_every_ms: 750,
        ..cfg()
    };
    let mut h = Harness::with(config, &[("w1", 4, 4096)]);
    h.open_sandbox("j", "t1");
    let (_, fx) = h.arrive(exec("x1", "j", "t1", 1, 1));
    let (_, disp) = dispatched(&fx).remove(0);
    h.stored(&disp);
    let mut fx = Vec::new();
    // Heartbeats stop; renewals go on every half second.
    for _ in 0..10 {
        h.now += 500;
        fx.extend(h.step(Event::Reachable));
        fx.extend(h.step(Event::Tick));
    }
    let results = published(&fx);
    assert_eq!(results.len(), 1, "{fx:?}");
    assert!(matches!(
        results[0].outcome,
        Outcome::InfraError {
            code: InfraCode::WorkerLost,
            ..
        }
    ));
}

/// A worker declared lost may come back (a healed partition) still holding what it had.
/// Its instance is fenced: the engine says so once, ignores that instance's heartbeats
/// (nothing it lists is adopted or booked again), and takes the worker back only as a new
/// instance, to which dispatches are then addressed.
#[test]
fn a_worker_declared_lost_is_fenced_until_it_rejoins_as_a_new_instance() {
    let mut h = Harness::new(&[("w1", 4, 4096)]);
    h.open_sandbox("j", "t1");
    let (_, fx) = h.arrive(exec("x1", "j", "t1", 1, 1));
    let (_, disp) = dispatched(&fx).remove(0);
    assert_eq!(
        disp.instance.as_deref(),
        Some("i1"),
        "addressed to the instance"
    );
    h.stored(&disp);
    // Silent past its grace: lost, fenced.
    let mut fx = Vec::new();
    for _ in 0..10 {
        fx.extend(h.advance(1_000));
    }
    let fences: Vec<_> = fx
        .iter()
        .filter_map(|e| match e {
            Effect::Fence { worker, instance } => Some((worker.to_string(), instance.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(fences, [("w1".to_string(), "i1".to_string())]);
    assert_eq!(published(&fx).len(), 1, "x1 settled as lost");
    // The healed instance reports its sandbox and the action it still runs: ignored.
    let fx = h.heartbeat("w1", 4, 4096, &["x1"], &[("j", "t1")]);
    assert!(fx.iter().any(|e| matches!(
        e,
        Effect::Observe(tangram_core::engine::Observation::FencedHeartbeat)
    )));
    assert!(!fx.iter().any(|e| matches!(e, Effect::FetchDispatch { .. })));
    // Still heartbeating long after: the fence is asked for again (its record may be lost).
    h.now += 11_000;
    let fx = h.heartbeat("w1", 4, 4096, &["x1"], &[("j", "t1")]);
    assert!(
        fx.iter().any(|e| matches!(e, Effect::Fence { .. })),
        "{fx:?}"
    );
    let (_, fx) = h.arrive(exec("x2", "j", "t1", 1, 1));
    assert!(
        dispatched(&fx).is_empty(),
        "nothing placed on a fenced instance"
    );
    let reason = &rejected(&fx)[0].2;
    assert!(reason.contains("lost"), "{reason}");
    // It fences itself and rejoins as a new instance: placements resume, addressed to it.
    h.instance.insert("w1".into(), "i2".into());
    h.heartbeat("w1", 4, 4096, &[], &[]);
    h.open_sandbox("j", "t1");
    let (_, fx) = h.arrive(exec("x3", "j", "t1", 1, 1));
    let (w, disp) = dispatched(&fx).remove(0);
    assert_eq!((w.as_str(), disp.instance.as_deref()), ("w1", Some("i2")));
    assert_eq!(booked_cores(&h.engine, "w1"), 1);
}

fn cordon(h: &mut Harness, w: &str, drain_by_unix_ms: Option<u64>) -> Vec<Effect> {
    h.step(Event::Cordon {
        worker: WorkerId::new(w).unwrap(),
        cordon: Some(tangram_shared::status::CordonRecord {
            drain_by_unix_ms,
            ..Default::default()
        }),
    })
}

/// A cordoned worker takes no new sandboxes while its open ones keep running commands; a
/// drain closes what is left at its deadline, and the next command there is told why;
/// uncordoning lifts it.
#[test]
fn a_cordoned_worker_takes_no_new_sandboxes_and_a_drain_closes_the_rest_at_its_deadline() {
    let mut h = Harness::new(&[("w1", 4, 4096), ("w2", 4, 4096)]);
    // Two sandboxes, one on each worker (opens spread by free memory).
    let a = h.open_sandbox("j", "t1");
    let b = h.open_sandbox("j", "t2");
    assert_ne!(a, b);
    cordon(&mut h, &a, None);
    // New opens go to the other worker only.
    for t in ["t3", "t4", "t5"] {
        assert_eq!(
            h.open_sandbox("j", t),
            b,
            "{t} opened on the cordoned worker"
        );
    }
    // Commands in the cordoned worker's sandbox still run there.
    let (_, fx) = h.arrive(exec("x1", "j", "t1", 1, 1));
    let (w, d) = dispatched(&fx).remove(0);
    assert_eq!(w, a);
    h.stored(&d);
    h.complete(&d, &w);
    let st = h.engine.status(h.at());
    let ws = st.workers.iter().find(|x| x.id == a).unwrap();
    assert!(ws.cordoned && ws.drain_by_unix_ms.is_none(), "{ws:?}");
    assert_eq!(ws.sandboxes, 1);
    // A drain with a deadline 5 s out: until then commands run; then the sandbox is closed.
    let by = h.now + 5_000; // the harness's wall clock is its virtual one
    cordon(&mut h, &a, Some(by));
    let (_, fx) = h.arrive(exec("x2", "j", "t1", 1, 1));
    let (w, d) = dispatched(&fx).remove(0);
    assert_eq!(w, a);
    h.stored(&d);
    h.complete(&d, &w);
    for _ in 0..5 {
        h.advance(1_000);
        for w in ["w1", "w2"] {
            h.heartbeat(w, 4, 4096, &[], &[]);
        }
    }
    let (_, fx) = h.arrive(exec("x3", "j", "t1", 1, 1));
    let r = rejected(&fx);
    assert_eq!(r.len(), 1, "{fx:?}");
    assert_eq!(r[0].1, RejectCode::NoSandbox);
    assert!(r[0].2.contains("drained"), "{}", r[0].2);
    let st = h.engine.status(h.at());
    assert_eq!(st.workers.iter().find(|x| x.id == a).unwrap().sandboxes, 0);
    // Uncordoned: it takes opens again (it is the emptier one now).
    h.step(Event::Cordon {
        worker: WorkerId::new(a.as_str()).unwrap(),
        cordon: None,
    });
    assert_eq!(h.open_sandbox("j", "t1"), a);
}

/// Regression: on a three-node NATS cluster under load, results reached the scheduler more
/// than a second after the worker finished; heartbeats no longer listed the action as
/// running, and it was settled `worker_lost` although its result was on its way. A worker
/// now lists what it finished lately, and that counts as reported.
#[test]
fn an_action_its_worker_finished_lately_is_not_lost_while_its_result_is_on_its_way() {
    let mut h = Harness::new(&[("w1", 4, 4096)]);
    h.open_sandbox("j", "t1");
    let (_, fx) = h.arrive(exec("x1", "j", "t1", 1, 1));
    let (w, d) = dispatched(&fx).remove(0);
    h.stored(&d);
    let mut fx = Vec::new();
    for _ in 0..10 {
        h.now += 1_000;
        let mut hb = h.heartbeat_of("w1", 4, 4096, &[], &[]);
        hb.finished = vec![id("x1")];
        fx.extend(h.step(Event::Heartbeat(Box::new(hb))));
    }
    assert!(
        published(&fx).is_empty(),
        "settled before its result: {fx:?}"
    );
    assert!(h.engine.state_of(&id("x1")).is_some());
    // The result arrives and settles it.
    let fx = h.complete(&d, &w);
    assert!(published(&fx).is_empty());
    assert!(h.engine.state_of(&id("x1")).is_none());
}

/// Regression: in a rolling restart on the compose fleet, the only GPU worker's restart
/// (lost past its grace, back as a new instance two seconds later) had every reward sent
/// in between rejected `unsatisfiable` ("the largest NVLink group in the fleet has 0").
#[test]
fn a_reward_during_the_only_gpu_workers_restart_waits_for_it_instead_of_being_rejected() {
    let mut h = Harness::new(&[]);
    h.step(Event::Heartbeat(Box::new(gpu_heartbeat("i1"))));
    // It stops, and is declared lost once its grace (three heartbeats) has passed.
    let mut fx = Vec::new();
    for _ in 0..20 {
        fx.extend(h.advance(250));
    }
    assert!(
        fx.iter().any(|e| matches!(
            e,
            Effect::Observe(tangram_core::engine::Observation::WorkerLost)
        )),
        "the worker is lost: {fx:?}"
    );
    let (_, fx) = h.arrive(reward("r1"));
    assert!(rejected(&fx).is_empty(), "it waits for the worker: {fx:?}");
    assert!(dispatched(&fx).is_empty(), "{fx:?}");
    // Back as a new instance: the waiting call goes to it.
    h.now += 2_000;
    let fx = h.step(Event::Heartbeat(Box::new(gpu_heartbeat("i2"))));
    assert_eq!(dispatched(&fx).len(), 1, "{fx:?}");

    // Lost again, and never back: what waits is rejected once `rejoin_ms` has passed.
    let mut lost_at = None;
    while lost_at.is_none() {
        let fx = h.advance(250);
        if fx.iter().any(|e| {
            matches!(
                e,
                Effect::Observe(tangram_core::engine::Observation::WorkerLost)
            )
        }) {
            lost_at = Some(h.now);
        }
        assert!(h.now < 20_000, "the worker is lost again");
    }
    let lost_at = lost_at.unwrap();
    let (_, fx) = h.arrive(reward("r2"));
    assert!(rejected(&fx).is_empty(), "{fx:?}");
    let wait = EngineConfig::default().rejoin_ms;
    let fx = h.advance(lost_at + wait - 250 - h.now);
    assert!(
        rejected(&fx).is_empty(),
        "still within the rejoin window: {fx:?}"
    );
    let fx = h.advance(250);
    let r2 = rejected(&fx);
    assert_eq!(r2.len(), 1, "{fx:?}");
    assert_eq!(r2[0].0.as_deref(), Some("r2"));
    assert_eq!(r2[0].1, tangram_shared::RejectCode::Unsatisfiable);
}

/// The wait for a lost worker ends when it comes back: an action no worker can ever take
/// is then rejected at once, not after the rest of the rejoin window.
#[test]
fn a_lost_worker_coming_back_ends_the_wait_for_it() {
    let mut h = Harness::new(&[]);
    h.step(Event::Heartbeat(Box::new(gpu_heartbeat("i1"))));
    for _ in 0..20 {
        h.advance(250);
    }
    let mut other = reward("r1");
    if let ActionSpec::Reward(r) = &mut other.spec {
        r.service = "no-such-service".into();
    }
    let (_, fx) = h.arrive(other);
    assert!(
        rejected(&fx).is_empty(),
        "waits while the worker may return: {fx:?}"
    );
    h.now += 1_000;
    let fx = h.step(Event::Heartbeat(Box::new(gpu_heartbeat("i2"))));
    let r = rejected(&fx);
    assert_eq!(r.len(), 1, "{fx:?}");
    assert_eq!(r[0].1, RejectCode::UnknownService);
}

/// One GPU and three one-slot services: `c` holds the GPU, `b` waits with one call and `a`
/// with two.
fn contended_gpu(policy: &str) -> Harness {
    let config = EngineConfig {
        policy: policy.into(),
        ..cfg()
    };
    let mut h = Harness::with(config, &[]);
    let mut hb = gpu_heartbeat("i1");
    hb.services = ["a", "b", "c"]
        .iter()
        .map(|s| tangram_shared::ServiceReport {
            name: (*s).into(),
            gpus: 1,
            restore_ms: 10,
            slots: 1,
            replicas: vec![],
        })
        .collect();
    h.step(Event::Heartbeat(Box::new(hb)));
    h
}

fn reward_for(id: &str, service: &str) -> Action {
    let mut a = reward(id);
    if let ActionSpec::Reward(r) = &mut a.spec {
        r.service = service.into();
    }
    a
}

/// Runs the scenario: `c1` on the GPU, then `b1`, `a1`, `a2` queued, `c1` ending after
/// `hold_ms`. Returns the action the freed GPU went to.
fn freed_gpu_goes_to(policy: &str, hold_ms: u64) -> String {
    let mut h = contended_gpu(policy);
    let (_, fx) = h.arrive(reward_for("c1", "c"));
    let (_, c1) = dispatched(&fx).remove(0);
    h.stored(&c1);
    for (id, s) in [("b1", "b"), ("a1", "a"), ("a2", "a")] {
        h.now += 1;
        let (_, fx) = h.arrive(reward_for(id, s));
        assert!(
            dispatched(&fx).is_empty(),
            "{id} found the GPU free: {fx:?}"
        );
    }
    h.now += hold_ms;
    let fx = h.complete(&c1, "g1");
    let mut next = dispatched(&fx);
    assert_eq!(next.len(), 1, "one GPU, one call: {fx:?}");
    next.remove(0).1.action.id.to_string()
}

#[test]
fn under_gpu_rebalancing_a_freed_gpu_goes_to_the_longest_queue_unless_a_call_has_aged() {
    // The paper's policy routes in arrival order.
    assert_eq!(freed_gpu_goes_to("tangram", 100), "b1");
    // tangram-v2: where two calls wait rather than one...
    assert_eq!(freed_gpu_goes_to("tangram-v2", 100), "a1");
    // ...unless the lone call has waited past the aging bound.
    assert_eq!(freed_gpu_goes_to("tangram-v2", 1_500), "b1");
}
