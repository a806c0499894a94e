//! One test per lifecycle transition of the engine.

use super::*;
use tangram_core::engine::lifecycle::{ActionState, SandboxState};
use tangram_shared::{InfraCode, RejectCode};

#[test]
fn an_exec_goes_queued_dispatching_running_settled_and_frees_its_cores() {
    let mut h = Harness::new(&[("w1", 8, 4096)]);
    h.open_sandbox("j", "t1");
    let (d, fx) = h.arrive(exec("x1", "j", "t1", 1, 4));
    let sent = dispatched(&fx);
    assert_eq!(sent.len(), 1);
    let (w, disp) = &sent[0];
    assert_eq!(w, "w1");
    assert_eq!(disp.attempt, 1, "the first dispatch is attempt 1");
    assert!(matches!(
        h.engine.state_of(&id("x1")),
        Some(ActionState::Dispatching { .. })
    ));
    assert!(
        acks(&fx).is_empty(),
        "no ack before the dispatch is durable"
    );
    assert_eq!(
        booked_cores(&h.engine, "w1"),
        disp.grant.cores,
        "assumed on send"
    );

    let fx = h.stored(disp);
    assert_eq!(acks(&fx), vec![d], "acked once the dispatch is durable");
    assert!(matches!(
        h.engine.state_of(&id("x1")),
        Some(ActionState::Running { .. })
    ));

    let fx = h.complete(disp, "w1");
    assert!(acks(&fx).is_empty(), "acked once only");
    assert!(h.engine.state_of(&id("x1")).is_none());
    assert!(h.engine.is_settled(&id("x1")));
    assert_eq!(booked_cores(&h.engine, "w1"), 0);
}

#[test]
fn a_redelivery_keeps_one_entry_and_a_resubmission_is_acked_as_a_duplicate() {
    let mut h = Harness::new(&[("w1", 1, 4096)]);
    h.open_sandbox("j", "t1");
    let (_, fx) = h.arrive(exec("busy", "j", "t1", 1, 1));
    assert_eq!(dispatched(&fx).len(), 1);
    let (d, fx) = h.arrive(exec("x1", "j", "t1", 1, 1));
    assert!(dispatched(&fx).is_empty(), "waits for the core");
    // The same message again (its ack wait ran out): nothing to ack, still one entry.
    let fx = h.arrive_as(exec("x1", "j", "t1", 1, 1), d, false);
    assert!(acks(&fx).is_empty());
    assert_eq!(h.engine.queued().len(), 1);
    // The same id in another message: acked and dropped.
    let fx = h.arrive_as(exec("x1", "j", "t1", 1, 1), d + 100, false);
    assert_eq!(acks(&fx), vec![d + 100]);
    assert_eq!(h.engine.queued().len(), 1);
    // An id whose result is stored already: acked and dropped.
    let fx = h.arrive_as(exec("old", "j", "t1", 1, 1), d + 101, true);
    assert_eq!(acks(&fx), vec![d + 101]);
    assert!(h.engine.state_of(&id("old")).is_none());
}

#[test]
fn a_redelivery_of_a_running_action_is_acked_again_and_not_run_twice() {
    let mut h = Harness::new(&[("w1", 4, 4096)]);
    h.open_sandbox("j", "t1");
    let (d, fx) = h.arrive(exec("x1", "j", "t1", 1, 1));
    let (_, disp) = dispatched(&fx).remove(0);
    assert_eq!(acks(&h.stored(&disp)), vec![d]);
    // The ack was lost and the server delivers the message again.
    let fx = h.arrive_as(exec("x1", "j", "t1", 1, 1), d, false);
    assert_eq!(acks(&fx), vec![d]);
    assert!(dispatched(&fx).is_empty());
    assert!(matches!(
        h.engine.state_of(&id("x1")),
        Some(ActionState::Running { .. })
    ));
}

#[test]
fn a_result_for_a_queued_action_from_an_earlier_scheduler_settles_it_without_a_second_run() {
    let mut h = Harness::new(&[("w1", 1, 4096)]);
    h.open_sandbox("j", "t1");
    let (_, fx) = h.arrive(exec("busy", "j", "t1", 1, 1));
    let (_, busy) = dispatched(&fx).remove(0);
    h.stored(&busy);
    let (d, fx) = h.arrive(exec("x1", "j", "t1", 1, 1));
    assert!(dispatched(&fx).is_empty());
    let mut earlier = busy.clone();
    earlier.action = exec("x1", "j", "t1", 1, 1);
    let fx = h.complete(&earlier, "w1");
    assert_eq!(acks(&fx), vec![d]);
    assert!(h.engine.queued().is_empty());
    let fx = h.complete(&busy, "w1");
    assert!(dispatched(&fx).is_empty(), "x1 is never dispatched again");
}

#[test]
fn a_running_action_left_out_of_two_heartbeats_is_settled_lost_and_frees_its_cores() {
    let mut h = Harness::new(&[("w1", 4, 4096)]);
    h.open_sandbox("j", "t1");
    let (_, fx) = h.arrive(exec("x1", "j", "t1", 4, 4));
    let (_, disp) = dispatched(&fx).remove(0);
    h.stored(&disp);
    // Within the grace after the store, a heartbeat without it is not a miss.
    h.now += 500;
    let fx = h.heartbeat("w1", 4, 4096, &[], &[("j", "t1")]);
    assert!(published(&fx).is_empty());
    h.now += 3_000;
    let fx = h.heartbeat("w1", 4, 4096, &["x1"], &[("j", "t1")]);
    assert!(published(&fx).is_empty(), "listed: still running");
    h.now += 1_000;
    let fx = h.heartbeat("w1", 4, 4096, &[], &[("j", "t1")]);
    assert!(published(&fx).is_empty(), "one miss is not enough");
    assert_eq!(booked_cores(&h.engine, "w1"), 4);
    h.now += 1_000;
    let fx = h.heartbeat("w1", 4, 4096, &[], &[("j", "t1")]);
    let results = published(&fx);
    assert_eq!(results.len(), 1, "{fx:?}");
    assert!(matches!(
        results[0].outcome,
        Outcome::InfraError {
            code: InfraCode::WorkerLost,
            ..
        }
    ));
    assert_eq!(results[0].attempt, 1);
    assert_eq!(booked_cores(&h.engine, "w1"), 0);
    // The worker's own result, if it ever comes, changes nothing.
    let fx = h.complete(&disp, "w1");
    assert!(published(&fx).is_empty() && acks(&fx).is_empty());
}

#[test]
fn a_running_action_past_its_deadline_is_settled_with_an_infra_error() {
    let mut h = Harness::new(&[("w1", 4, 4096)]);
    h.open_sandbox("j", "t1");
    let (_, fx) = h.arrive(exec("x1", "j", "t1", 1, 1));
    let (_, disp) = dispatched(&fx).remove(0);
    let fx = h.stored(&disp);
    let wake = fx.iter().find_map(|e| match e {
        Effect::WakeAt(t) => Some(*t),
        _ => None,
    });
    assert!(wake.is_some(), "the engine asks to be woken: {fx:?}");
    // Keep the worker alive and listing it; only the deadline can settle it.
    let deadline = h.now + disp.action.timeout_ms + cfg().result_grace_ms;
    while h.now + 1_000 < deadline {
        h.now += 1_000;
        let fx = h.heartbeat("w1", 4, 4096, &["x1"], &[("j", "t1")]);
        assert!(published(&fx).is_empty());
    }
    let fx = h.advance(2_000);
    let results = published(&fx);
    assert_eq!(results.len(), 1);
    assert_eq!(results[0].id, id("x1"));
}

#[test]
fn a_silent_worker_is_lost_its_actions_settled_its_sandboxes_lost_and_their_execs_rejected() {
    let mut h = Harness::new(&[("w1", 4, 4096), ("w2", 4, 4096)]);
    let home = h.open_sandbox("j", "t1");
    let other = if home == "w1" { "w2" } else { "w1" };
    let (_, fx) = h.arrive(exec("x1", "j", "t1", 2, 2));
    let (_, disp) = dispatched(&fx).remove(0);
    h.stored(&disp);
    // Only the other worker keeps reporting.
    for _ in 0..4 {
        h.now += 1_000;
        h.heartbeat(other, 4, 4096, &[], &[]);
    }
    let fx = h.advance(10);
    let results = published(&fx);
    assert_eq!(results.len(), 1, "{fx:?}");
    assert!(matches!(
        results[0].outcome,
        Outcome::InfraError {
            code: InfraCode::WorkerLost,
            ..
        }
    ));
    assert_eq!(
        h.engine
            .sandbox(&JobId::new("j").unwrap(), &TrajectoryId::new("t1").unwrap())
            .map(|s| s.state),
        Some(SandboxState::Lost)
    );
    let (_, fx) = h.arrive(exec("x2", "j", "t1", 1, 1));
    let r = rejected(&fx);
    assert_eq!(r.len(), 1);
    assert_eq!(r[0].1, RejectCode::NoSandbox);
    assert!(r[0].2.contains("lost"), "{}", r[0].2);
    // A new open replaces the lost sandbox.
    let w = h.open_sandbox("j", "t1");
    assert_eq!(w, other);
}

#[test]
fn a_sandbox_goes_opening_open_closing_gone() {
    let mut h = Harness::new(&[("w1", 4, 4096)]);
    let (j, t) = (JobId::new("j").unwrap(), TrajectoryId::new("t1").unwrap());
    let (_, fx) = h.arrive(open("o", "j", "t1"));
    let (_, o) = dispatched(&fx).remove(0);
    assert_eq!(
        h.engine.sandbox(&j, &t).map(|s| s.state),
        Some(SandboxState::Opening)
    );
    // An exec waits for the open.
    let (_, fx) = h.arrive(exec("x", "j", "t1", 1, 1));
    assert!(dispatched(&fx).is_empty() && rejected(&fx).is_empty());
    h.stored(&o);
    let fx = h.complete(&o, "w1");
    assert_eq!(
        h.engine.sandbox(&j, &t).map(|s| s.state),
        Some(SandboxState::Open)
    );
    let (_, x) = dispatched(&fx).remove(0);
    h.stored(&x);
    h.complete(&x, "w1");
    let (_, fx) = h.arrive(close("c", "j", "t1"));
    let (_, c) = dispatched(&fx).remove(0);
    assert_eq!(
        h.engine.sandbox(&j, &t).map(|s| s.state),
        Some(SandboxState::Closing)
    );
    h.stored(&c);
    h.complete(&c, "w1");
    assert!(h.engine.sandbox(&j, &t).is_none());
    assert_eq!(
        h.engine
            .booked()
            .get(&WorkerId::new("w1").unwrap())
            .copied()
            .unwrap_or_default(),
        (0, 0)
    );
}

#[test]
fn a_second_open_is_rejected_and_an_exec_without_a_sandbox_is_rejected() {
    let mut h = Harness::new(&[("w1", 4, 4096)]);
    h.open_sandbox("j", "t1");
    let (_, fx) = h.arrive(open("o2", "j", "t1"));
    assert_eq!(rejected(&fx)[0].1, RejectCode::SandboxExists);
    let (_, fx) = h.arrive(exec("x", "j", "nope", 1, 1));
    assert_eq!(rejected(&fx)[0].1, RejectCode::NoSandbox);
    let r = match fx.iter().find(|e| matches!(e, Effect::Reject(_))) {
        Some(Effect::Reject(r)) => r.clone(),
        _ => unreachable!(),
    };
    assert!(r.result.is_some(), "the submitter hears");
}

#[test]
fn nothing_is_rejected_for_want_of_cluster_knowledge_while_settling() {
    let mut config = cfg();
    config.settle_ms = 2_000;
    let mut h = Harness::with(config, &[]);
    let (_, fx) = h.arrive(exec("x", "j", "t1", 1, 1));
    assert!(rejected(&fx).is_empty());
    let fx = h.advance(2_500);
    assert_eq!(rejected(&fx).len(), 1, "{fx:?}");
}

#[test]
fn queued_actions_get_progress_acks_and_are_handed_back_at_shutdown() {
    let mut h = Harness::new(&[("w1", 1, 4096)]);
    h.open_sandbox("j", "t1");
    let (_, fx) = h.arrive(exec("busy", "j", "t1", 1, 1));
    let (_, busy) = dispatched(&fx).remove(0);
    h.stored(&busy);
    let (d, fx) = h.arrive(exec("x", "j", "t1", 1, 1));
    assert!(dispatched(&fx).is_empty(), "{fx:?}");
    assert_eq!(h.engine.queued(), &[id("x")]);
    h.advance(2_000);
    h.heartbeat("w1", 1, 4096, &["busy"], &[("j", "t1")]);
    let fx = h.advance(cfg().progress_every_ms - 2_000 + 1);
    assert!(fx.contains(&Effect::Progress(d)), "{fx:?}");
    let fx = h.step(Event::Shutdown);
    assert!(fx.contains(&Effect::Nak(d)), "{fx:?}");
    assert!(
        !fx.contains(&Effect::Nak(1)),
        "running actions stay with their worker"
    );
}

#[test]
fn a_bad_message_is_rejected_with_a_dead_letter_and_a_result() {
    let mut h = Harness::new(&[]);
    let raw = tangram_core::engine::RawMessage {
        subject: "tangram.v1.action.j.sandbox_exec",
        msg_id: Some("a1"),
        content_type: Some("application/json"),
        payload: b"{not json",
    };
    let bad = tangram_core::engine::check(&raw, &Default::default(), 1 << 20, 7).unwrap_err();
    assert_eq!(bad.id.as_deref(), Some("a1"));
    let fx = h.step(Event::Bad(bad));
    let r = rejected(&fx);
    assert_eq!(r.len(), 1);
    assert_eq!(r[0].1, RejectCode::Undecodable);
}

#[test]
fn elasticity_is_learned_per_job_and_program() {
    let key = |argv: &[&str]| {
        let mut a = exec("a", "j", "t", 1, 1);
        if let ActionSpec::SandboxExec(e) = &mut a.spec {
            e.argv = argv.iter().map(|s| s.to_string()).collect();
        }
        tangram_core::engine::learn_key(&a)
    };
    assert_eq!(key(&["/usr/bin/make", "-j4"]).as_deref(), Some("j/make"));
    assert_eq!(
        key(&["python3", "-m", "pytest", "-n", "{cpus}"]).as_deref(),
        Some("j/python3 -m pytest")
    );
    assert_eq!(key(&["python3", "main.py"]).as_deref(), Some("j/python3"));
}

#[test]
fn an_open_completed_for_an_earlier_scheduler_registers_its_sandbox() {
    // Room for one sandbox: the second open waits, and meanwhile the dispatch an earlier
    // scheduler made of it completes.
    let mut h = Harness::new(&[("w1", 1, 600)]);
    let w = h.open_sandbox("j", "busy");
    let (d, fx) = h.arrive(open("o2", "j", "t2"));
    assert!(dispatched(&fx).is_empty());
    assert_eq!(h.engine.queued(), &[id("o2")]);
    let mut earlier = dispatched(&h.arrive(exec("probe", "j", "busy", 1, 1)).1)
        .remove(0)
        .1;
    earlier.action = open("o2", "j", "t2");
    let fx = h.complete(&earlier, &w);
    assert_eq!(acks(&fx), vec![d]);
    let s = h
        .engine
        .sandbox(&JobId::new("j").unwrap(), &TrajectoryId::new("t2").unwrap())
        .expect("the sandbox is known");
    assert_eq!(s.state, SandboxState::Open);
    assert_eq!(s.mem_mb, 512, "its memory is booked");
}

/// Regression: an unknown policy name made an engine running `tangram` without a word (the
/// service's config check was the only guard).
#[test]
fn an_unknown_policy_name_is_an_error_not_another_policy() {
    let config = EngineConfig {
        policy: "tangram-v3".into(),
        ..cfg()
    };
    let err = tangram_core::Engine::new(config).expect_err("an unknown policy is refused");
    assert_eq!(
        err,
        tangram_core::policies::UnknownPolicy("tangram-v3".into())
    );
    assert!(err.to_string().contains("tangram-v2"), "{err}");
    let config = EngineConfig {
        policy: "static".into(),
        static_cores: 3,
        ..cfg()
    };
    assert!(tangram_core::Engine::new(config).is_ok());
}

/// Regression: under `static` an open's cores were counted twice from its launch to its
/// result, once on the open and once on the sandbox it creates: a 4-core worker looked full
/// after one 2-core open, so a second trajectory's open waited for the first one's result.
/// (Found by the cycle's debug post-condition: 8 cores booked of 4.)
#[test]
fn a_static_open_books_its_cores_once() {
    let config = EngineConfig {
        policy: "static".into(),
        static_cores: 2,
        ..cfg()
    };
    let mut h = Harness::with(config, &[("w1", 4, 4096)]);
    let (_, fx) = h.arrive(open("o1", "j", "t1"));
    assert_eq!(dispatched(&fx).len(), 1);
    assert_eq!(booked_cores(&h.engine, "w1"), 2);
    let (_, fx) = h.arrive(open("o2", "j", "t2"));
    assert_eq!(dispatched(&fx).len(), 1, "the second open waited: {fx:?}");
    assert_eq!(booked_cores(&h.engine, "w1"), 4);
}

/// Leadership is an engine event: a leader whose fence fell plans nothing (it used to keep
/// launching, each dispatch refused by the fenced dispatcher and backed off, thousands of
/// times at 500 workers), keeps what waits in its place, and plans it once the lease is
/// confirmed again.
#[test]
fn a_leader_whose_fence_fell_plans_nothing_until_it_holds_the_lease_again() {
    let mut h = Harness::new(&[("w1", 4, 4096)]);
    h.open_sandbox("j", "t1");
    let fx = h.step(Event::Leadership { held: false });
    assert!(dispatched(&fx).is_empty());
    assert!(!h.engine.is_leading());
    let (_, fx) = h.arrive(exec("x1", "j", "t1", 1, 1));
    assert!(dispatched(&fx).is_empty(), "{fx:?}");
    // Time passes with the worker reporting; still acked in progress while it waits.
    let mut progress = 0;
    for _ in 0..4 {
        let mut fx = h.advance(1_000);
        fx.extend(h.heartbeat("w1", 4, 4096, &[], &[("j", "t1")]));
        assert!(dispatched(&fx).is_empty(), "{fx:?}");
        progress += fx
            .iter()
            .filter(|e| matches!(e, Effect::Progress(_)))
            .count();
    }
    assert_eq!(h.engine.queued(), &[id("x1")]);
    assert_eq!(progress, 1);
    let fx = h.step(Event::Leadership { held: true });
    let d = dispatched(&fx);
    assert_eq!(d.len(), 1, "{fx:?}");
    assert_eq!(d[0].1.action.id, id("x1"));
}
