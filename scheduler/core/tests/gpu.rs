//! Property tests of the Evict-on-Execution manager: whatever the sequence of routes and
//! finishes, resident replicas never share a GPU, chunks stay aligned, slots are never
//! over-booked and busy replicas are never evicted, with and without `tangram-v2`'s
//! re-balancing.

use proptest::prelude::*;
use tangram_core::gpu::{Eoe, ServiceSpec, Unrouted};
use tangram_shared::WorkerId;

fn check(e: &Eoe) {
    let res: Vec<_> = e.replicas().iter().filter(|r| r.is_resident()).collect();
    for (i, a) in res.iter().enumerate() {
        assert_eq!(a.chunk.start % a.chunk.len, 0, "unaligned chunk {a:?}");
        assert!(
            a.busy <= e.service(&a.service).unwrap().slots,
            "over-booked {a:?}"
        );
        for b in &res[i + 1..] {
            assert!(
                a.node != b.node || !a.chunk.overlaps(&b.chunk),
                "{a:?} overlaps {b:?}"
            );
        }
    }
    let held: u32 = res.iter().map(|r| r.chunk.len as u32).sum();
    assert_eq!(
        e.gpus().1,
        held,
        "bitmap disagrees with the resident replicas"
    );
}

proptest! {
    #[test]
    fn residency_invariants_hold(
        groups in prop::collection::vec(prop::sample::select(vec![1u8, 2, 4, 8]), 1..4),
        sizes in prop::collection::vec(prop::sample::select(vec![1u8, 2, 4]), 1..10),
        ops in prop::collection::vec((0usize..10, any::<bool>(), 0u32..12), 1..200),
        rebalance in any::<bool>(),
    ) {
        let specs: Vec<ServiceSpec> = sizes.iter().enumerate().map(|(i, &g)| ServiceSpec {
            name: format!("s{i}"), gpus: g, restore_ms: 50, slots: 1 + (i as u32 % 3),
        }).collect();
        let mut e = Eoe::new(specs.clone());
        // tangram-v2's re-balancing, told random backlogs: the same invariants hold.
        e.rebalance = rebalance;
        e.set_node(&WorkerId::new("n0").unwrap(), &groups, true);
        let mut inflight: Vec<usize> = Vec::new();
        for (t, (s, finish, backlog)) in ops.into_iter().enumerate() {
            let now = t as u64 * 100;
            if finish && !inflight.is_empty() {
                let i = inflight.remove(s % inflight.len());
                e.finish(i, now);
            } else {
                let name = &specs[s % specs.len()].name;
                let busy_before: Vec<_> = e.replicas().iter().map(|r| (r.busy, r.is_resident())).collect();
                let waiting = |svc: &str| {
                    let last = svc.bytes().last().unwrap_or(0) as u32;
                    if last % 3 == backlog % 3 { backlog } else { 0 }
                };
                match e.route_planned(name, now, backlog.max(1), &waiting) {
                    Ok(r) => {
                        for v in &r.evict {
                            let i = e.find(&v.service, &v.node, v.chunk).unwrap();
                            prop_assert_eq!(busy_before[i].0, 0, "evicted a busy replica");
                            prop_assert!(busy_before[i].1, "evicted a replica that was not resident");
                        }
                        prop_assert_eq!(&e.replicas()[r.replica].service, name);
                        inflight.push(r.replica);
                    }
                    Err(Unrouted::Busy { .. }) | Err(Unrouted::NeverFits { .. }) => {}
                    Err(other) => prop_assert!(false, "unexpected {other:?}"),
                }
            }
            check(&e);
        }
    }
}
