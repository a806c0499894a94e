//! Admission per job: a job past its cap of queued actions is refused `queue_full` while
//! other jobs are admitted; an action not started within its `queue_timeout_ms` is rejected
//! `queue_timeout`; a job at its cap of reward calls running waits while others' run.

use super::*;
use tangram_core::engine::JobCaps;
use tangram_shared::RejectCode;

fn queue_capped(per_job: u32, caps: &[(&str, JobCaps)]) -> Harness {
    Harness::with(
        EngineConfig {
            max_queued_per_job: Some(per_job),
            job_caps: caps.iter().map(|(j, c)| (j.to_string(), *c)).collect(),
            ..cfg()
        },
        &[],
    )
}

#[test]
fn past_its_queued_cap_a_jobs_actions_are_refused_and_other_jobs_are_admitted() {
    // No worker: every open waits in the queue.
    let mut h = queue_capped(3, &[]);
    for i in 0..3 {
        let (_, fx) = h.arrive(open(&format!("a{i}"), "a", &format!("t{i}")));
        assert!(rejected(&fx).is_empty(), "{fx:?}");
    }
    let (d, fx) = h.arrive(open("a3", "a", "t3"));
    let (id, code, reason) = rejected(&fx).pop().expect("a's fourth is refused");
    assert_eq!((id.as_deref(), code), (Some("a3"), RejectCode::QueueFull));
    assert!(
        reason.contains("3 actions queued, its cap is 3"),
        "{reason}"
    );
    // The refusal is a result the submitter reads, for that message.
    let refusal = fx.iter().find_map(|e| match e {
        Effect::Reject(r) => Some(r),
        _ => None,
    });
    let refusal = refusal.expect("a rejection");
    assert_eq!(refusal.message.delivery, d);
    let result = refusal.result.as_ref().expect("addressed to a3");
    assert!(
        matches!(
            &result.outcome,
            Outcome::Rejected {
                code: RejectCode::QueueFull,
                ..
            }
        ),
        "{result:?}"
    );
    // Another job is admitted, and so is a close of a's.
    let (_, fx) = h.arrive(open("b0", "b", "t0"));
    assert!(rejected(&fx).is_empty(), "{fx:?}");
    let (_, fx) = h.arrive(close("a-close", "a", "t0"));
    assert!(rejected(&fx).is_empty(), "{fx:?}");
    // A worker comes: a's opens run and leave the queue, and a is admitted again.
    h.heartbeat("w1", 8, 65536, &[], &[]);
    let (_, fx) = h.arrive(open("a4", "a", "t4"));
    assert!(rejected(&fx).is_empty(), "{fx:?}");
}

#[test]
fn a_jobs_own_queued_cap_overrides_the_fleets() {
    let roomy = JobCaps {
        max_queued: Some(5),
        ..JobCaps::default()
    };
    let mut h = queue_capped(1, &[("big", roomy)]);
    for i in 0..5 {
        let (_, fx) = h.arrive(open(&format!("b{i}"), "big", &format!("t{i}")));
        assert!(rejected(&fx).is_empty(), "big's {i}: {fx:?}");
    }
    let (_, fx) = h.arrive(open("s0", "small", "t0"));
    assert!(rejected(&fx).is_empty(), "{fx:?}");
    let (_, fx) = h.arrive(open("s1", "small", "t1"));
    assert_eq!(
        rejected(&fx).pop().map(|r| r.1),
        Some(RejectCode::QueueFull)
    );
}

fn with_queue_timeout(mut a: Action, ms: u64) -> Action {
    a.queue_timeout_ms = Some(ms);
    a
}

#[test]
fn an_action_not_started_within_its_queue_timeout_is_rejected_and_a_started_one_is_not() {
    let mut h = Harness::new(&[]);
    let (_, fx) = h.arrive(with_queue_timeout(open("late", "j", "t1"), 500));
    assert!(rejected(&fx).is_empty());
    let wake = fx.iter().find_map(|e| match e {
        Effect::WakeAt(t) => Some(*t),
        _ => None,
    });
    assert_eq!(
        wake,
        Some(h.now + 500),
        "the engine asks to be woken at the deadline: {fx:?}"
    );
    h.now += 499;
    let fx = h.step(Event::Tick);
    assert!(rejected(&fx).is_empty(), "not yet: {fx:?}");
    h.now += 1;
    let fx = h.step(Event::Tick);
    let (id, code, reason) = rejected(&fx).pop().expect("past its deadline");
    assert_eq!(
        (id.as_deref(), code),
        (Some("late"), RejectCode::QueueTimeout)
    );
    assert!(reason.contains("500 ms"), "{reason}");
    // One that starts in time is not rejected when its deadline passes.
    h.heartbeat("w1", 8, 65536, &[], &[]);
    let (_, fx) = h.arrive(with_queue_timeout(open("prompt", "j", "t2"), 500));
    assert_eq!(dispatched(&fx).len(), 1, "{fx:?}");
    h.now += 1_000;
    let fx = h.step(Event::Tick);
    assert!(rejected(&fx).is_empty(), "{fx:?}");
    // The late one's trajectory can be opened again: nothing of it ran.
    let (_, fx) = h.arrive(open("again", "j", "t1"));
    assert_eq!(dispatched(&fx).len(), 1, "{fx:?}");
}

#[test]
fn a_job_at_its_cap_of_reward_calls_waits_and_another_jobs_calls_run() {
    let one = JobCaps {
        max_gpu_calls: Some(1),
        ..JobCaps::default()
    };
    let mut h = queue_capped(100, &[("a", one)]);
    let hb = judge_heartbeat(&h, "g1", 1, 1, 4);
    h.step(Event::Heartbeat(Box::new(hb)));
    let mut out = Vec::new();
    for id in ["a1", "a2", "a3"] {
        let (_, fx) = h.arrive(score(id, "a"));
        out.extend(dispatched(&fx));
    }
    let ids: Vec<String> = out.iter().map(|(_, d)| d.action.id.to_string()).collect();
    assert_eq!(ids, vec!["a1"], "a runs one call at a time");
    let (_, fx) = h.arrive(score("b1", "b"));
    assert_eq!(
        dispatched(&fx).len(),
        1,
        "b is not held back by a's cap: {fx:?}"
    );
    // a's call ends: its next one runs.
    let (_, a1) = out.pop().expect("a1");
    h.stored(&a1);
    let fx = h.complete(&a1, "g1");
    let next: Vec<String> = dispatched(&fx)
        .iter()
        .map(|(_, d)| d.action.id.to_string())
        .collect();
    assert_eq!(next, vec!["a2"]);
}

#[test]
fn a_freed_replica_slot_goes_to_the_job_with_fewer_calls_running() {
    for (fair, want) in [(true, "b1"), (false, "a3")] {
        let mut h = Harness::with(
            EngineConfig {
                fair_share: fair,
                ..cfg()
            },
            &[],
        );
        let hb = judge_heartbeat(&h, "g1", 1, 1, 2);
        h.step(Event::Heartbeat(Box::new(hb)));
        let mut running = Vec::new();
        for id in ["a1", "a2"] {
            let (_, fx) = h.arrive(score(id, "a"));
            let (_, d) = dispatched(&fx).pop().expect("runs");
            h.stored(&d);
            running.push(d);
        }
        for (id, job) in [("a3", "a"), ("a4", "a"), ("b1", "b")] {
            let (_, fx) = h.arrive(score(id, job));
            assert!(dispatched(&fx).is_empty(), "two slots: {fx:?}");
        }
        // a1 ends: a still has a2 running, b nothing.
        let fx = h.complete(&running[0], "g1");
        let next: Vec<String> = dispatched(&fx)
            .iter()
            .map(|(_, d)| d.action.id.to_string())
            .collect();
        assert_eq!(next, vec![want], "fair order {fair}");
    }
}

#[test]
fn a_queue_timeout_outside_one_ms_to_the_longest_timeout_is_an_invalid_field() {
    let limits = tangram_shared::Limits::default();
    for bad in [0, limits.max_timeout_ms + 1] {
        let r = with_queue_timeout(open("o", "j", "t"), bad)
            .validate(&limits)
            .unwrap_err();
        assert_eq!(r.code, RejectCode::InvalidField);
        assert!(r.reason.contains("queue_timeout_ms"), "{}", r.reason);
    }
    assert!(with_queue_timeout(open("o", "j", "t"), 1)
        .validate(&limits)
        .is_ok());
}

/// Found in review: after a change of leader, an action the earlier leader had admitted came
/// back after newer ones had filled its job's cap, and was refused.
#[test]
fn a_message_delivered_before_is_not_refused_for_its_jobs_queued_cap() {
    let mut h = queue_capped(1, &[]);
    let (_, fx) = h.arrive(open("a0", "a", "t0"));
    assert!(rejected(&fx).is_empty());
    let d = h.next_delivery;
    h.next_delivery += 1;
    let fx = h.step(Event::Arrived(Box::new(Arrival {
        action: open("a1", "a", "t1"),
        encoding: Encoding::Msgpack,
        submitted_at_us: h.now * 1000,
        delivery: d,
        seen: false,
        model: None,
        dispatched: None,
        bytes: 0,
        redelivered: true,
    })));
    assert!(
        rejected(&fx).is_empty(),
        "admitted once, admitted again: {fx:?}"
    );
    let (_, fx) = h.arrive(open("a2", "a", "t2"));
    assert_eq!(
        rejected(&fx).pop().map(|r| r.1),
        Some(RejectCode::QueueFull)
    );
}

/// Found in review: while a new term read the dispatch backlog, a passed queueing deadline
/// asked for a wake-up at once, again and again (no cycle runs then to act on it).
#[test]
fn a_passed_deadline_asks_for_no_wake_up_until_the_backlog_is_read() {
    let mut h = Harness::with(
        EngineConfig {
            await_backlog: true,
            ..cfg()
        },
        &[],
    );
    let (_, fx) = h.arrive(with_queue_timeout(open("late", "j", "t1"), 100));
    assert!(rejected(&fx).is_empty());
    h.now += 200;
    let fx = h.step(Event::Tick);
    let now = h.now;
    assert!(
        !fx.iter()
            .any(|e| matches!(e, Effect::WakeAt(t) if *t <= now)),
        "a wake-up it would not act on: {fx:?}"
    );
    let fx = h.step(Event::BacklogRead);
    let (id, code, _) = rejected(&fx).pop().expect("rejected once the term plans");
    assert_eq!(
        (id.as_deref(), code),
        (Some("late"), RejectCode::QueueTimeout)
    );
}
