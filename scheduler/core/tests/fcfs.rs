//! Table and property tests of the foundation policy.

use proptest::prelude::*;
use std::collections::BTreeMap;
use tangram_core::{
    schedule, Constraint, NeverReason, Pending, Plan, Snapshot, Unplaced, WaitReason, WorkerView,
};
use tangram_shared::{ActionId, CpuRange, Demand, WorkerId};

fn worker(id: &str, cores: u32, free: u32, mem: u64) -> WorkerView {
    WorkerView {
        id: WorkerId::new(id).unwrap(),
        total_cores: cores,
        free_cores: free,
        total_mem_mb: mem,
        free_mem_mb: mem,
        accepting: true,
    }
}

fn exec(id: &str, min: u32, max: u32) -> Pending {
    Pending {
        id: ActionId::new(id).unwrap(),
        demand: Demand {
            cores: Some(CpuRange { min, max }),
            mem_mb: 0,
        },
        constraint: Constraint::Any,
    }
}

fn open(id: &str, mem: u64) -> Pending {
    Pending {
        id: ActionId::new(id).unwrap(),
        demand: Demand {
            cores: None,
            mem_mb: mem,
        },
        constraint: Constraint::Any,
    }
}

#[test]
fn first_fit_grants_up_to_max_and_skips_what_does_not_fit() {
    let snap = Snapshot::new(vec![worker("w2", 4, 4, 1024), worker("w1", 2, 2, 1024)]);
    let plan = schedule(
        &snap,
        &[exec("a", 1, 8), exec("b", 3, 3), exec("c", 1, 1)],
        0,
    );
    let got: Vec<_> = plan
        .launches
        .iter()
        .map(|l| (l.id.as_str(), l.worker.as_str(), l.grant.cores))
        .collect();
    // a takes all of w1 (first by id), b goes to w2, c takes one of w2's remaining core.
    assert_eq!(got, vec![("a", "w1", 2), ("b", "w2", 3), ("c", "w2", 1)]);
    assert!(plan.unplaced.is_empty());

    let plan = schedule(
        &snap,
        &[exec("a", 4, 4), exec("b", 4, 4), exec("c", 1, 1)],
        0,
    );
    assert_eq!(plan.launches.len(), 2, "{plan:?}");
    assert_eq!(
        plan.unplaced,
        vec![(
            ActionId::new("b").unwrap(),
            Unplaced::MayFitLater(WaitReason::Cores {
                need: 4,
                best_free: 2
            })
        )]
    );
}

#[test]
fn impossible_demand_never_fits_and_missing_workers_wait() {
    let snap = Snapshot::new(vec![worker("w1", 2, 2, 1024)]);
    let plan = schedule(&snap, &[exec("big", 3, 3), open("fat", 4096)], 0);
    assert!(plan.launches.is_empty());
    assert!(plan.unplaced.iter().all(|(_, u)| matches!(
        u,
        Unplaced::NeverFits(NeverReason::ExceedsEveryWorker { .. })
    )));

    let plan = schedule(&Snapshot::default(), &[exec("a", 1, 1)], 0);
    assert_eq!(
        plan.unplaced[0].1,
        Unplaced::MayFitLater(WaitReason::NoWorkers)
    );

    let mut pinned = exec("p", 1, 1);
    pinned.constraint = Constraint::OnWorker(WorkerId::new("gone").unwrap());
    let plan = schedule(&snap, &[pinned], 0);
    assert!(matches!(
        plan.unplaced[0].1,
        Unplaced::NeverFits(NeverReason::WorkerGone(_))
    ));
}

#[test]
fn pinned_actions_wait_for_their_worker_and_draining_workers_get_nothing() {
    let mut w1 = worker("w1", 2, 0, 1024);
    let w2 = worker("w2", 2, 2, 1024);
    let mut pinned = exec("p", 1, 1);
    pinned.constraint = Constraint::OnWorker(w1.id.clone());
    let plan = schedule(
        &Snapshot::new(vec![w1.clone(), w2.clone()]),
        &[pinned.clone()],
        0,
    );
    assert!(
        plan.launches.is_empty(),
        "pinned action moved off its worker: {plan:?}"
    );

    w1.free_cores = 2;
    w1.accepting = false;
    let plan = schedule(&Snapshot::new(vec![w1, w2]), &[pinned, exec("x", 1, 1)], 0);
    assert_eq!(plan.launches.len(), 1);
    assert_eq!(plan.launches[0].worker.as_str(), "w2");
    assert!(matches!(
        plan.unplaced[0].1,
        Unplaced::MayFitLater(WaitReason::NotAccepting(_))
    ));
}

fn arb_cluster() -> impl Strategy<Value = (Vec<WorkerView>, Vec<Pending>)> {
    let workers = prop::collection::vec((1u32..16, 0u32..=16, 0u64..4096, any::<bool>()), 0..5)
        .prop_map(|ws| {
            ws.into_iter()
                .enumerate()
                .map(|(i, (total, free, mem, accepting))| WorkerView {
                    id: WorkerId::new(format!("w{i}")).unwrap(),
                    total_cores: total,
                    free_cores: free.min(total),
                    total_mem_mb: mem,
                    free_mem_mb: mem / 2,
                    accepting,
                })
                .collect::<Vec<_>>()
        });
    let pending = prop::collection::vec((0u8..3, 1u32..8, 0u32..8, 0u64..2048, 0usize..6), 0..40)
        .prop_map(|ps| {
            ps.into_iter()
                .enumerate()
                .map(|(i, (kind, min, extra, mem, pin))| Pending {
                    id: ActionId::new(format!("a{i}")).unwrap(),
                    demand: match kind {
                        0 => Demand {
                            cores: None,
                            mem_mb: mem,
                        },
                        _ => Demand {
                            cores: Some(CpuRange {
                                min,
                                max: min + extra,
                            }),
                            mem_mb: 0,
                        },
                    },
                    constraint: if pin < 5 && kind != 0 {
                        Constraint::OnWorker(WorkerId::new(format!("w{pin}")).unwrap())
                    } else {
                        Constraint::Any
                    },
                })
                .collect::<Vec<_>>()
        });
    (workers, pending)
}

fn check_invariants(snap: &Snapshot, pending: &[Pending], plan: &Plan) {
    // Every action launched once or explained once, and nothing else.
    let mut seen: BTreeMap<&str, usize> = BTreeMap::new();
    for l in &plan.launches {
        *seen.entry(l.id.as_str()).or_default() += 1;
    }
    for (id, _) in &plan.unplaced {
        *seen.entry(id.as_str()).or_default() += 1;
    }
    assert_eq!(seen.len(), pending.len());
    assert!(seen.values().all(|&n| n == 1), "{seen:?}");

    // Capacity never exceeded; grants within the declared range; constraints respected.
    let mut used: BTreeMap<&str, (u32, u64)> = BTreeMap::new();
    for l in &plan.launches {
        let p = pending.iter().find(|p| p.id == l.id).unwrap();
        let w = snap.worker(&l.worker).unwrap();
        assert!(w.accepting);
        if let Constraint::OnWorker(pin) = &p.constraint {
            assert_eq!(pin, &l.worker);
        }
        match p.demand.cores {
            Some(r) => assert!(r.min <= l.grant.cores && l.grant.cores <= r.max),
            None => assert_eq!(l.grant.cores, 0),
        }
        let u = used.entry(l.worker.as_str()).or_default();
        u.0 += l.grant.cores;
        u.1 += l.grant.mem_mb;
    }
    for (w, (cores, mem)) in used {
        let w = snap.worker(&WorkerId::new(w).unwrap()).unwrap();
        assert!(
            cores <= w.free_cores && mem <= w.free_mem_mb,
            "{w:?} over-booked"
        );
    }
}

proptest! {
    #[test]
    fn plans_respect_capacity_and_explain_everything((workers, pending) in arb_cluster()) {
        let snap = Snapshot::new(workers);
        let plan = schedule(&snap, &pending, 0);
        check_invariants(&snap, &pending, &plan);
    }

    #[test]
    fn same_input_same_plan((workers, pending) in arb_cluster()) {
        let mut reversed = workers.clone();
        reversed.reverse();
        let a = schedule(&Snapshot::new(workers), &pending, 7);
        let b = schedule(&Snapshot::new(reversed), &pending, 7);
        prop_assert_eq!(a, b);
    }
}
