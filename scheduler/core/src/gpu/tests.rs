//! Unit tests of Evict-on-Execution.

use super::*;

fn svc(name: &str, gpus: u8) -> ServiceSpec {
    ServiceSpec {
        name: name.into(),
        gpus,
        restore_ms: 200,
        slots: 1,
    }
}

/// The services a route evicts, in order.
fn evicted(r: &Route) -> Vec<&str> {
    r.evict.iter().map(|v| v.service.as_str()).collect()
}

fn w(s: &str) -> WorkerId {
    WorkerId::new(s).unwrap()
}

/// Services `a` and `b` of 8 slots on a node of 2 GPUs: `a` full on one GPU with a replica's
/// worth of calls waiting, `b` with one call in flight on the other, and the first routing of
/// `a` after that (which drains `b` under re-balancing).
fn a_full_and_b_light(rebalance: bool) -> (Eoe, Route, Route) {
    let eight = |n: &str| ServiceSpec {
        slots: 8,
        ..svc(n, 1)
    };
    let mut e = Eoe::new([eight("a"), eight("b")]);
    e.rebalance = rebalance;
    e.set_node(&w("g0"), &[2], true);
    let a = e.route("a", 0).unwrap();
    let b = e.route("b", 0).unwrap();
    for _ in 1..8 {
        e.route("a", 300).unwrap();
    }
    let waiting = |s: &str| if s == "a" { 8 } else { 0 };
    assert!(e.route_planned("a", 400, 8, &waiting).is_err());
    assert_eq!(e.replicas()[b.replica].is_draining(), rebalance);
    (e, a, b)
}

#[test]
fn rebalancing_drains_a_lightly_used_replica_for_a_backlogged_service() {
    let waiting = |s: &str| if s == "a" { 8 } else { 0 };
    let (mut e, a, b) = a_full_and_b_light(true);
    e.finish(b.replica, 500);
    // Idle for less than a restore: only a replica drained for a is given up at once.
    let r = e
        .route_planned("a", 550, 8, &waiting)
        .expect("b's drained GPU goes to a");
    assert!(r.restore && r.replica != a.replica);
    assert_eq!(evicted(&r), ["b"]);

    let (mut e, _, b) = a_full_and_b_light(false);
    e.finish(b.replica, 500);
    assert!(
        e.route_planned("a", 550, 8, &waiting).is_err(),
        "tangram keeps one replica per service"
    );
}

#[test]
fn a_replica_drained_for_a_service_with_nothing_waiting_is_taken_back_by_its_own_call() {
    // Before: b's lone call was refused every cycle while its idle replica drained for a
    // service whose backlog was gone, and the call could wait for ever.
    let (mut e, _, b) = a_full_and_b_light(true);
    // While a still waits, the drain holds.
    let both = |s: &str| if s == "b" { 1 } else { 8 };
    assert!(e.route_planned("b", 450, 1, &both).is_err());
    // Once a has nothing waiting, b takes its replica back.
    let waiting = |s: &str| if s == "b" { 1 } else { 0 };
    let r = e
        .route_planned("b", 460, 1, &waiting)
        .expect("b takes its replica back");
    assert_eq!((r.replica, r.restore), (b.replica, false));
    assert!(!e.replicas()[b.replica].is_draining());
}

#[test]
fn a_rebalancing_drain_is_called_off_when_its_service_has_nothing_waiting() {
    let eight = |n: &str| ServiceSpec {
        slots: 8,
        ..svc(n, 1)
    };
    let mut e = Eoe::new([eight("a"), eight("b"), eight("c")]);
    e.rebalance = true;
    e.set_node(&w("g0"), &[4], true);
    let a = e.route("a", 0).unwrap().replica;
    let b = e.route("b", 0).unwrap().replica;
    let c = e.route("c", 0).unwrap().replica;
    e.route("c", 0).unwrap();
    for _ in 1..8 {
        e.route("a", 0).unwrap();
    }
    // A free GPU is left: take it for a second replica of a, and fill it.
    let a2 = e.route("a", 0).unwrap().replica;
    for _ in 1..8 {
        e.route("a", 0).unwrap();
    }
    assert_ne!(a, a2);
    // a drains b, the least busy.
    let only_a = |s: &str| if s == "a" { 8 } else { 0 };
    assert!(e.route_planned("a", 400, 8, &only_a).is_err());
    assert!(e.replicas()[b].is_draining());
    // a's backlog is gone; c is full with a backlog of its own: a's drain is called off, and
    // the drain goes to c (b is again the least busy other replica, so it drains for c).
    for _ in 2..8 {
        e.route("c", 400).unwrap();
    }
    let only_c = |s: &str| if s == "c" { 8 } else { 0 };
    assert!(e.route_planned("c", 500, 8, &only_c).is_err());
    assert_eq!(e.replicas()[b].drained_for(), Some("c"));
    assert!(!e.replicas()[c].is_draining());
}

#[test]
fn chunks_are_aligned_and_best_fit_keeps_large_chunks_whole() {
    let mut g = GpuGroup::new(8);
    assert_eq!(g.best_fit(1), Some(0));
    g.take(0, 1);
    // The next single card goes beside the first, not into an empty half.
    assert_eq!(g.best_fit(1), Some(1));
    g.take(1, 1);
    assert_eq!(g.best_fit(2), Some(2));
    assert_eq!(g.best_fit(4), Some(4));
    g.take(4, 4);
    assert_eq!(g.best_fit(4), None);
    assert!(!g.is_free(3, 2), "a 2-chunk must start at an even card");
    assert_eq!(g.starts(8).count(), 1);
    assert_eq!(GpuGroup::new(2).starts(4).count(), 0);
}

#[test]
fn lru_replica_is_evicted_first_and_restore_only_when_not_resident() {
    let mut e = Eoe::new(["a", "b", "c"].map(|n| svc(n, 1)));
    e.set_node(&w("g0"), &[2], true);
    let ra = e.route("a", 0).unwrap();
    assert!(ra.restore && ra.evict.is_empty());
    e.finish(ra.replica, 300);
    let rb = e.route("b", 400).unwrap();
    assert!(rb.restore);
    e.finish(rb.replica, 700);
    // a is resident: no restore.
    let ra2 = e.route("a", 800).unwrap();
    assert!(!ra2.restore);
    e.finish(ra2.replica, 900);
    // c evicts the least recently used: b (last used at 700), not a (900).
    let rc = e.route("c", 1000).unwrap();
    assert!(rc.restore);
    assert_eq!(evicted(&rc), ["b"]);
    // Busy replicas are never evicted.
    let ra3 = e.route("a", 1100).unwrap();
    assert!(!ra3.restore);
    assert!(matches!(e.route("b", 1200), Err(Unrouted::Busy { .. })));
    assert!(matches!(
        e.route("zzz", 0),
        Err(Unrouted::UnknownService(_))
    ));
}

#[test]
fn lru_breaks_ties_within_a_millisecond_by_order_of_use() {
    // Two fast calls finish in the same millisecond: the one used last stays.
    let mut e = Eoe::new(["a", "b", "c"].map(|n| svc(n, 1)));
    e.set_node(&w("g0"), &[2], true);
    let ra = e.route("a", 0).unwrap();
    let rb = e.route("b", 0).unwrap();
    e.finish(ra.replica, 300);
    e.finish(rb.replica, 300);
    let rb2 = e.route("b", 300).unwrap();
    e.finish(rb2.replica, 300);
    let ra2 = e.route("a", 300).unwrap();
    e.finish(ra2.replica, 300);
    // a was used after b, within the same millisecond: b goes.
    let rc = e.route("c", 300).unwrap();
    assert_eq!(evicted(&rc), ["b"]);
}

#[test]
fn a_replica_that_served_a_call_can_be_evicted_before_its_restore_estimate_ends() {
    let mut e = Eoe::new(["a", "b", "c"].map(|n| svc(n, 1)));
    e.set_node(&w("g0"), &[2], true);
    // Restores estimated at 200 ms that took 10: both answered by 20 ms.
    let ra = e.route("a", 0).unwrap();
    e.served(ra.replica, 10);
    e.finish(ra.replica, 10);
    let rb = e.route("b", 15).unwrap();
    e.served(rb.replica, 20);
    e.finish(rb.replica, 20);
    // At 30 ms, c evicts the least recently used, a, though a's estimate ran to 200 ms.
    let rc = e.route("c", 30).unwrap();
    assert_eq!(evicted(&rc), ["a"]);
}

#[test]
fn a_service_larger_than_every_group_never_fits() {
    let mut e = Eoe::new([svc("big", 8)]);
    e.set_node(&w("g0"), &[4], true);
    assert!(matches!(
        e.route("big", 0),
        Err(Unrouted::NeverFits {
            largest_group: 4,
            ..
        })
    ));
}

#[test]
fn static_pinning_never_evicts() {
    let mut e = Eoe::new(["a", "b"].map(|n| svc(n, 1)));
    e.set_node(&w("g0"), &[4], true);
    assert!(e.pin(2).is_empty(), "2 GPUs each: 2 one-GPU replicas each");
    let r = e.route("a", 0).unwrap();
    assert!(!r.restore);
    let r2 = e.route("a", 0).unwrap();
    assert!(!r2.restore);
    assert!(matches!(e.route("a", 0), Err(Unrouted::Busy { .. })));
}

#[test]
fn static_pinning_reuses_deployed_replicas_and_refuses_services_left_without_gpus() {
    // Regression: pinning pushed a second record for a replica already deployed on the
    // chunk, so results settled the evicted twin and the resident one filled up forever.
    let mut e = Eoe::new(["a", "b", "c"].map(|n| svc(n, 1)));
    e.set_node(&w("g0"), &[2], true);
    let c0 = Chunk {
        group: 0,
        start: 0,
        len: 1,
    };
    assert!(e.adopt("a", &w("g0"), c0, false, 0));
    let short = e.pin(0);
    assert_eq!(short, vec!["c".to_string()]);
    assert_eq!(e.replicas().iter().filter(|r| r.service == "a").count(), 1);
    for t in 0..10 {
        let r = e.route("a", t).unwrap();
        e.finish(e.find("a", &w("g0"), r.chunk).unwrap(), t);
    }
    assert!(matches!(e.route("c", 0), Err(Unrouted::NotDeployed { .. })));
}

#[test]
fn rebalancing_packs_calls_onto_the_fullest_replica_so_surplus_ones_go_idle() {
    let run = |rebalance: bool| {
        let mut e = Eoe::new([ServiceSpec {
            slots: 8,
            ..svc("a", 1)
        }]);
        e.rebalance = rebalance;
        e.set_node(&w("g0"), &[2], true);
        // Two replicas, both ready: the second is taken when the first is full.
        let first = e.route("a", 0).unwrap().replica;
        for _ in 1..8 {
            e.route("a", 0).unwrap();
        }
        let second = e.route("a", 0).unwrap().replica;
        assert_ne!(first, second);
        e.served(first, 300);
        e.served(second, 300);
        for _ in 0..5 {
            e.finish(first, 400);
        }
        // first: 3 busy, second: 1 busy.
        e.route("a", 500).unwrap().replica == first
    };
    assert!(run(true), "packed onto the fuller replica");
    assert!(!run(false), "tangram spreads onto the less busy one");
}

#[test]
fn a_reported_replica_on_a_chunk_of_no_size_is_refused_not_a_panic() {
    // Regression: a heartbeat listing an evicted replica on a chunk of length 0 divided by
    // zero in the alignment check and took the scheduler down.
    let mut e = Eoe::new([svc("a", 1)]);
    e.set_node(&w("g0"), &[2], true);
    for len in [0, 3] {
        let bad = Chunk {
            group: 0,
            start: 0,
            len,
        };
        assert!(!e.adopt("a", &w("g0"), bad, false, 0), "len {len}");
        assert!(!e.adopt("a", &w("g0"), bad, true, 0), "len {len}");
    }
    assert!(e.replicas().is_empty());
}
