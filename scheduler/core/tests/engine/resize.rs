//! Malleable grants (`tangram-v2`): a burst narrows what runs to launch what waits, and
//! cores freed by a completion widen what still runs.

use super::*;
use tangram_core::elastic::{ElasticModel, Speedup};

/// An exec that scales well (Amdahl 0.95, 10 s on one core), its model known.
fn arrive_parallel(h: &mut Harness, id: &str, traj: &str) -> Vec<Effect> {
    let d = h.next_delivery;
    h.next_delivery += 1;
    h.step(Event::Arrived(Box::new(Arrival {
        action: exec(id, "j", traj, 1, 8),
        encoding: Encoding::Msgpack,
        submitted_at_us: h.now * 1000,
        delivery: d,
        seen: false,
        model: Some(ElasticModel {
            t1_ms: 10_000.0,
            speedup: Speedup::Amdahl(0.95),
        }),
        dispatched: None,
        bytes: 0,
        redelivered: false,
    })))
}

fn regrants(fx: &[Effect]) -> Vec<(ActionId, u32)> {
    fx.iter()
        .filter_map(|e| match e {
            Effect::Regrant { regrant, .. } => Some((regrant.id.clone(), regrant.grant.cores)),
            _ => None,
        })
        .collect()
}

fn harness(policy: &str) -> Harness {
    let config = EngineConfig {
        policy: policy.into(),
        ..cfg()
    };
    let mut h = Harness::with(config, &[("w0", 8, 4096)]);
    h.open_sandbox("j", "t1");
    h.open_sandbox("j", "t2");
    h
}

#[test]
fn an_arrival_narrows_the_running_exec_and_its_completion_widens_it_again() {
    let mut h = harness("tangram-v2");
    let fx = arrive_parallel(&mut h, "a", "t1");
    let (_, a) = dispatched(&fx).pop().expect("a launched");
    assert_eq!(a.grant.cores, 8, "alone, it takes the whole worker");
    h.stored(&a);
    h.now += 100;
    let fx = arrive_parallel(&mut h, "b", "t2");
    let narrowed = regrants(&fx);
    assert_eq!(narrowed.len(), 1, "{fx:?}");
    assert_eq!(narrowed[0].0, id("a"));
    let (_, b) = dispatched(&fx)
        .pop()
        .expect("b launched at once, not queued");
    assert_eq!(narrowed[0].1 + b.grant.cores, 8, "the two share the worker");
    // The narrowing is handed out before the launch that uses its cores.
    let at = |want: &dyn Fn(&Effect) -> bool| fx.iter().position(want).unwrap();
    assert!(
        at(&|e| matches!(e, Effect::Regrant { .. }))
            < at(&|e| matches!(e, Effect::Dispatch { .. })),
        "{fx:?}"
    );
    h.stored(&b);
    h.now += 100;
    let fx = h.complete(&b, "w0");
    assert_eq!(regrants(&fx), vec![(id("a"), 8)], "b's cores go back to a");
    let booked = h.engine.booked();
    assert_eq!(
        booked.get(&WorkerId::new("w0").unwrap()).map(|b| b.0),
        Some(8)
    );
}

#[test]
fn the_paper_policy_never_resizes_and_the_arrival_waits() {
    let mut h = harness("tangram");
    let fx = arrive_parallel(&mut h, "a", "t1");
    let (_, a) = dispatched(&fx).pop().expect("a launched");
    h.stored(&a);
    h.now += 100;
    let fx = arrive_parallel(&mut h, "b", "t2");
    assert!(
        regrants(&fx).is_empty() && dispatched(&fx).is_empty(),
        "{fx:?}"
    );
    let fx = h.complete(&a, "w0");
    assert!(regrants(&fx).is_empty());
    assert_eq!(dispatched(&fx).len(), 1, "b runs once a is done");
}

#[test]
fn a_dispatch_not_yet_stored_is_not_resized() {
    let mut h = harness("tangram-v2");
    let fx = arrive_parallel(&mut h, "a", "t1");
    let (_, a) = dispatched(&fx).pop().expect("a launched");
    h.now += 100;
    // a's dispatch is still in flight: a re-size could reach the worker before it.
    let fx = arrive_parallel(&mut h, "b", "t2");
    assert!(regrants(&fx).is_empty(), "{fx:?}");
    assert!(dispatched(&fx).is_empty(), "no core is free for b: {fx:?}");
    let fx = h.stored(&a);
    let (_, b) = dispatched(&fx)
        .pop()
        .expect("once a is stored, it is narrowed for b");
    assert_eq!(regrants(&fx)[0].1 + b.grant.cores, 8);
}

/// Regression: a re-size's sequence was the engine's clock in milliseconds, so a narrowing
/// and a widening of one exec in the same millisecond carried the same number and the worker
/// ignored the second; had the second been the narrowing, the worker would have kept cores
/// the engine had given to another exec. Every re-size now has a sequence of its own.
#[test]
fn two_resizes_of_one_exec_in_one_millisecond_are_ordered() {
    let mut h = harness("tangram-v2");
    let (_, a) = dispatched(&arrive_parallel(&mut h, "a", "t1"))
        .pop()
        .expect("a launched");
    h.stored(&a);
    h.now += 100;
    let fx = arrive_parallel(&mut h, "b", "t2");
    let (_, b) = dispatched(&fx).pop().expect("b launched");
    h.stored(&b);
    // b ends in the same millisecond: a is widened again.
    let fx2 = h.complete(&b, "w0");
    let seqs: Vec<u64> = fx
        .iter()
        .chain(&fx2)
        .filter_map(|e| match e {
            Effect::Regrant { regrant, .. } if regrant.id == id("a") => Some(regrant.seq),
            _ => None,
        })
        .collect();
    assert_eq!(seqs.len(), 2, "{fx:?} {fx2:?}");
    assert!(seqs[0] < seqs[1], "{seqs:?}");
}
