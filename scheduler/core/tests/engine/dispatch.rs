//! Dispatches: a store that fails (the booking back, a retry on the same worker, backing off
//! when failures repeat), a result before the store's ack, a dispatch still on its way or lost
//! in transit (not settled lost by heartbeats that omit it), and a stopping engine.

use super::*;
use tangram_core::engine::lifecycle::ActionState;
use tangram_shared::InfraCode;

#[test]
fn a_failed_dispatch_gives_its_booking_back_and_the_retry_counts_as_attempt_two() {
    let mut h = Harness::new(&[("w1", 4, 4096)]);
    h.open_sandbox("j", "t1");
    let (_, fx) = h.arrive(exec("x1", "j", "t1", 4, 4));
    let (_, first) = dispatched(&fx).remove(0);
    let fx = h.step(Event::DispatchFailed {
        id: id("x1"),
        attempt: 1,
        error: "no responders".into(),
    });
    let again = dispatched(&fx);
    assert_eq!(again.len(), 1, "re-planned at once: {fx:?}");
    assert_eq!(again[0].1.attempt, 2);
    assert_eq!(booked_cores(&h.engine, "w1"), 4, "booked once, not twice");
    // A late outcome for the first attempt changes nothing.
    let fx = h.stored(&first);
    assert!(acks(&fx).is_empty());
    assert!(matches!(
        h.engine.state_of(&id("x1")),
        Some(ActionState::Dispatching { attempt: 2, .. })
    ));
}

#[test]
fn a_result_before_the_store_ack_settles_and_acks_once() {
    let mut h = Harness::new(&[("w1", 4, 4096)]);
    h.open_sandbox("j", "t1");
    let (d, fx) = h.arrive(exec("x1", "j", "t1", 1, 1));
    let (_, disp) = dispatched(&fx).remove(0);
    let fx = h.complete(&disp, "w1");
    assert_eq!(acks(&fx), vec![d]);
    let fx = h.stored(&disp);
    assert!(acks(&fx).is_empty(), "no second ack");
    assert_eq!(booked_cores(&h.engine, "w1"), 0);
}

#[test]
fn a_dispatch_that_failed_is_retried_on_the_same_worker() {
    // The store may have gone through with its acknowledgement lost: the retry must go where
    // the first copy went, under the same message id, so that only one of them runs.
    let mut h = Harness::new(&[("w1", 4, 4096), ("w2", 4, 4096)]);
    let (_, fx) = h.arrive(open("o", "j", "t1"));
    let (first, d) = dispatched(&fx).remove(0);
    let other = if first == "w1" { "w2" } else { "w1" };
    // The first worker now reports less memory: a free choice would go to the other one.
    h.heartbeat(&first, 4, 1024, &[], &[]);
    h.heartbeat(other, 4, 4096, &[], &[]);
    let fx = h.step(Event::DispatchFailed {
        id: id("o"),
        attempt: d.attempt,
        error: "PubAck timed out".into(),
    });
    let again = dispatched(&fx);
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].0, first, "the retry goes to the same worker");
}

#[test]
fn a_stopping_engine_launches_nothing_and_hands_back_what_fails() {
    let mut h = Harness::new(&[("w1", 4, 4096)]);
    h.open_sandbox("j", "t1");
    let (d, fx) = h.arrive(exec("x", "j", "t1", 1, 1));
    let (_, disp) = dispatched(&fx).remove(0);
    h.step(Event::Shutdown);
    assert_eq!(h.engine.dispatching_count(), 1);
    // A failed store is handed back, not retried.
    let fx = h.step(Event::DispatchFailed {
        id: id("x"),
        attempt: disp.attempt,
        error: "gone".into(),
    });
    assert!(fx.contains(&Effect::Nak(d)), "{fx:?}");
    assert!(dispatched(&fx).is_empty());
    assert_eq!(h.engine.dispatching_count(), 0);
    // New arrivals are handed back at once.
    let (d2, fx) = h.arrive(exec("y", "j", "t1", 1, 1));
    assert!(fx.contains(&Effect::Nak(d2)) && dispatched(&fx).is_empty());
}

/// Regression: while a NATS cluster moved its stream leaders, every dispatch store failed
/// and each failure re-queued the action at once: one action reached attempt 645 in a few
/// seconds. The first retry still goes at once; later ones wait, twice as long each time.
#[test]
fn repeated_dispatch_failures_back_off_instead_of_retrying_at_once() {
    let mut h = Harness::new(&[("w1", 4, 4096)]);
    h.open_sandbox("j", "t1");
    let (_, fx) = h.arrive(exec("x1", "j", "t1", 1, 1));
    let mut d = dispatched(&fx).remove(0).1;
    let fail = |h: &mut Harness, attempt: u32| {
        h.step(Event::DispatchFailed {
            id: id("x1"),
            attempt,
            error: "no stream leader".into(),
        })
    };
    // First failure: again at once.
    let fx = fail(&mut h, d.attempt);
    d = dispatched(&fx).remove(0).1;
    assert_eq!(d.attempt, 2);
    // Second: nothing until 50 ms have passed, then attempt 3.
    let fx = fail(&mut h, d.attempt);
    assert!(dispatched(&fx).is_empty(), "{fx:?}");
    // It shows as backing off, not as queued nor as running.
    let until = h.now + 50;
    assert!(
        matches!(
            h.engine.state_of(&id("x1")),
            Some(ActionState::Backoff { until_ms, .. }) if *until_ms == until
        ),
        "{:?}",
        h.engine.state_of(&id("x1"))
    );
    assert!(!h.engine.queued().contains(&id("x1")));
    assert!(fx
        .iter()
        .any(|e| matches!(e, Effect::WakeAt(t) if *t <= h.now + 50)));
    assert!(dispatched(&h.advance(40)).is_empty());
    let fx = h.advance(10);
    d = dispatched(&fx).remove(0).1;
    assert_eq!(d.attempt, 3);
    // Third: 100 ms.
    fail(&mut h, d.attempt);
    assert!(dispatched(&h.advance(90)).is_empty());
    d = dispatched(&h.advance(10)).remove(0).1;
    assert_eq!(d.attempt, 4);
    // A store resets the count: the next failure retries at once again.
    h.stored(&d);
    assert_eq!(booked_cores(&h.engine, "w1"), 1);
    // A stopping engine hands back what waits to be retried.
    let (_, fx) = h.arrive(exec("x2", "j", "t1", 1, 1));
    let mut attempt = dispatched(&fx).remove(0).1.attempt;
    let fx = h.step(Event::DispatchFailed {
        id: id("x2"),
        attempt,
        error: "no stream leader".into(),
    });
    attempt = dispatched(&fx).remove(0).1.attempt;
    let fx = h.step(Event::DispatchFailed {
        id: id("x2"),
        attempt,
        error: "no stream leader".into(),
    });
    assert!(dispatched(&fx).is_empty(), "x2 waits to be retried");
    let fx = h.step(Event::Shutdown);
    assert_eq!(
        fx.iter().filter(|e| matches!(e, Effect::Nak(_))).count(),
        1,
        "{fx:?}"
    );
}

/// Regression: a dispatch that reached its worker later than a grace of three heartbeat
/// periods (a NATS cluster moving a stream leader) was settled `worker_lost` because
/// heartbeats did not list it yet, and never ran. An omission now counts only once the
/// worker reports having taken in the dispatch stream past the action's sequence.
#[test]
fn a_dispatch_still_on_its_way_is_not_settled_lost_by_heartbeats_that_omit_it() {
    let mut h = Harness::new(&[("w1", 4, 4096)]);
    h.open_sandbox("j", "t1");
    let (_, fx) = h.arrive(exec("x1", "j", "t1", 1, 1));
    let d = dispatched(&fx).remove(0).1;
    h.step(Event::DispatchStored {
        id: d.action.id.clone(),
        attempt: d.attempt,
        seq: 100,
    });
    let beat = |h: &mut Harness, seq: u64| {
        let mut hb = h.heartbeat_of("w1", 4, 4096, &[], &[]);
        hb.dispatch_seq = seq;
        h.step(Event::Heartbeat(Box::new(hb)))
    };
    // Ten seconds of heartbeats from a worker that has not got that far: still running.
    let mut fx = Vec::new();
    for _ in 0..10 {
        h.now += 1_000;
        fx.extend(beat(&mut h, 90));
    }
    assert!(published(&fx).is_empty(), "{fx:?}");
    // Taken in and not listed: lost, but not before a redelivery window has passed.
    let seen = h.now + 1_000;
    let mut r = Vec::new();
    for _ in 0..20 {
        h.now += 1_000;
        r = published(&beat(&mut h, 101));
        if !r.is_empty() {
            break;
        }
    }
    assert_eq!(r.len(), 1);
    assert!(
        h.now >= seen + tangram_shared::DISPATCH_REDELIVERY_MS,
        "{}",
        h.now - seen
    );
    assert!(matches!(
        r[0].outcome,
        Outcome::InfraError {
            code: InfraCode::WorkerLost,
            ..
        }
    ));
}

/// Regression: a NATS node died while carrying a dispatch to its worker; later dispatches
/// reached the worker first, its heartbeats reported the stream taken in past the lost one,
/// and the engine settled that action `worker_lost` 400 ms later, before JetStream delivered
/// it again (after the consumer's ack wait) and it ran. An omission now counts only after a
/// redelivery window from when the worker was seen past the action.
#[test]
fn a_dispatch_lost_in_transit_is_not_settled_lost_before_its_redelivery() {
    let mut h = Harness::new(&[("w1", 4, 4096)]);
    h.open_sandbox("j", "t1");
    let (_, fx) = h.arrive(exec("x1", "j", "t1", 1, 1));
    let (w, d) = dispatched(&fx).remove(0);
    h.step(Event::DispatchStored {
        id: d.action.id.clone(),
        attempt: d.attempt,
        seq: 100,
    });
    let beat = |h: &mut Harness, seq: u64, running: &[&str]| {
        let mut hb = h.heartbeat_of("w1", 4, 4096, &[], &[]);
        hb.dispatch_seq = seq;
        hb.running = running.iter().map(|s| id(s)).collect();
        h.step(Event::Heartbeat(Box::new(hb)))
    };
    // 200 ms heartbeats past its sequence that omit it, until the redelivery is due.
    let mut fx = Vec::new();
    let until = h.now + tangram_shared::DISPATCH_REDELIVERY_MS;
    while h.now < until {
        h.now += 200;
        fx.extend(beat(&mut h, 140, &[]));
    }
    assert!(
        published(&fx).is_empty(),
        "settled before its redelivery: {fx:?}"
    );
    // Redelivered: the worker lists it, and its result settles it.
    h.now += 200;
    assert!(published(&beat(&mut h, 140, &["x1"])).is_empty());
    let fx = h.complete(&d, &w);
    assert!(published(&fx).is_empty(), "{fx:?}");
    assert!(h.engine.state_of(&id("x1")).is_none());
}
