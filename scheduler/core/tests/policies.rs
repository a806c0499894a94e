//! Property tests over every policy, and table tests of the reference policy and baselines.

use proptest::prelude::*;
use std::collections::BTreeMap;
use tangram_core::elastic::{allocate_dp, allocate_greedy, total_ms, Claim};
use tangram_core::policies::NAMES;
use tangram_core::{
    by_name, Constraint, ElasticModel, Pending, Plan, Snapshot, Speedup, Unplaced, WorkerView,
};
use tangram_shared::{ActionId, CpuRange, Demand, WorkerId};

fn arb_model() -> impl Strategy<Value = Option<ElasticModel>> {
    prop_oneof![
        Just(None),
        (100.0f64..5000.0, 0.0f64..=1.0).prop_map(|(t1, p)| Some(ElasticModel {
            t1_ms: t1,
            speedup: Speedup::Amdahl(p)
        })),
        (100.0f64..5000.0, 0.0f64..=1.0).prop_map(|(t1, a)| Some(ElasticModel {
            t1_ms: t1,
            speedup: Speedup::Power(a)
        })),
        (100.0f64..5000.0, prop::collection::vec(0.05f64..=1.0, 1..5)).prop_map(|(t1, effs)| Some(
            ElasticModel {
                t1_ms: t1,
                speedup: Speedup::Table(
                    effs.into_iter()
                        .enumerate()
                        .map(|(i, e)| (1 + 3 * i as u32, e))
                        .collect()
                ),
            }
        )),
    ]
}

fn arb_cluster() -> impl Strategy<Value = (Vec<WorkerView>, Vec<Pending>)> {
    let workers = prop::collection::vec(
        (1u32..32, 0u32..=32, 0u64..4096, prop::bool::weighted(0.9)),
        0..5,
    )
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
                cordoned: false,
                sandboxes: 0,
            })
            .collect::<Vec<_>>()
    });
    let pending = prop::collection::vec(
        (
            0u8..4,
            1u32..8,
            0u32..16,
            0u64..2048,
            0usize..7,
            arb_model(),
        ),
        0..40,
    )
    .prop_map(|ps| {
        ps.into_iter()
            .enumerate()
            .map(|(i, (kind, min, extra, mem, pin, model))| Pending {
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
                model,
                image: None,
            })
            .collect::<Vec<_>>()
    });
    (workers, pending)
}

fn check_invariants(name: &str, snap: &Snapshot, pending: &[Pending], plan: &Plan) {
    let mut seen: BTreeMap<&str, usize> = BTreeMap::new();
    for l in &plan.launches {
        *seen.entry(l.id.as_str()).or_default() += 1;
    }
    for (id, _) in &plan.unplaced {
        *seen.entry(id.as_str()).or_default() += 1;
    }
    assert_eq!(
        seen.len(),
        pending.len(),
        "{name}: an action was neither launched nor explained"
    );
    assert!(seen.values().all(|&n| n == 1), "{name}: {seen:?}");
    let mut used: BTreeMap<&str, (u32, u64)> = BTreeMap::new();
    for l in &plan.launches {
        let p = pending.iter().find(|p| p.id == l.id).unwrap();
        let w = snap.worker(&l.worker).unwrap();
        assert!(
            w.accepting,
            "{name}: launched on a worker that is not accepting"
        );
        if let Constraint::OnWorker(pin) = &p.constraint {
            assert_eq!(pin, &l.worker, "{name}: constraint broken");
        }
        if let Some(r) = p.demand.cores {
            assert!(
                r.min <= l.grant.cores && l.grant.cores <= r.max,
                "{name}: grant {} outside {r:?}",
                l.grant.cores
            );
        }
        let u = used.entry(l.worker.as_str()).or_default();
        u.0 += l.grant.cores;
        u.1 += l.grant.mem_mb;
    }
    for (w, (cores, mem)) in used {
        let w = snap.worker(&WorkerId::new(w).unwrap()).unwrap();
        assert!(
            cores <= w.free_cores && mem <= w.free_mem_mb,
            "{name}: {w:?} over-booked ({cores} cores, {mem} MiB)"
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn every_policy_respects_capacity_and_explains_everything((workers, pending) in arb_cluster()) {
        let snap = Snapshot::new(workers);
        for name in NAMES {
            let plan = by_name(name).unwrap().schedule(&snap, &pending, 0);
            check_invariants(name, &snap, &pending, &plan);
        }
    }

    #[test]
    fn same_input_same_plan(
        (workers, pending, shuffled) in arb_cluster()
            .prop_flat_map(|(ws, ps)| (Just(ws.clone()), Just(ps), Just(ws).prop_shuffle())),
    ) {
        // Two snapshots built independently from the same workers listed in different orders,
        // and two copies of the queue: every policy must plan both alike, and a second call on
        // the same input must repeat the first plan.
        let a = Snapshot::new(workers);
        let b = Snapshot::new(shuffled);
        let queue = pending.clone();
        for name in NAMES {
            let policy = by_name(name).unwrap();
            let first = policy.schedule(&a, &pending, 7);
            prop_assert_eq!(&first, &by_name(name).unwrap().schedule(&b, &queue, 7), "{}: worker order changed the plan", name);
            prop_assert_eq!(&first, &policy.schedule(&a, &pending, 7), "{}: a second run changed the plan", name);
        }
    }

    #[test]
    fn replanning_after_a_plan_launches_nothing_new((workers, pending) in arb_cluster()) {
        let snap = Snapshot::new(workers);
        for name in NAMES {
            let policy = by_name(name).unwrap();
            let plan = policy.schedule(&snap, &pending, 0);
            let after = snap.after(&plan.launches);
            let waiting: Vec<Pending> = pending
                .iter()
                .filter(|p| plan.unplaced.iter().any(|(id, u)| id == &p.id && matches!(u, Unplaced::MayFitLater(_))))
                .cloned()
                .collect();
            let again = policy.schedule(&after, &waiting, 0);
            prop_assert!(again.launches.is_empty(), "{}: second run launched {:?}", name, again.launches);
        }
    }

    #[test]
    fn dp_and_greedy_agree_on_convex_models(
        specs in prop::collection::vec((1u32..4, 0u32..12, 50.0f64..3000.0, 0.0f64..=1.0, any::<bool>()), 1..10),
        units in 1u32..64,
    ) {
        let models: Vec<ElasticModel> = specs
            .iter()
            .map(|&(_, _, t1, p, amdahl)| ElasticModel {
                t1_ms: t1,
                speedup: if amdahl { Speedup::Amdahl(p) } else { Speedup::Power(p) },
            })
            .collect();
        let claims: Vec<Claim<'_>> =
            specs.iter().zip(&models).map(|(&(min, extra, ..), m)| Claim { min, max: min + extra, model: m }).collect();
        prop_assume!(claims.iter().all(|c| c.model.is_convex(c.min, c.max)));
        let dp = allocate_dp(&claims, units);
        let greedy = allocate_greedy(&claims, units);
        prop_assert_eq!(dp.is_some(), greedy.is_some());
        if let (Some(dp), Some(greedy)) = (dp, greedy) {
            let (a, b) = (total_ms(&claims, &dp), total_ms(&claims, &greedy));
            prop_assert!((a - b).abs() <= 1e-6 * a.max(1.0), "dp {a} greedy {b}");
            prop_assert!(dp.iter().sum::<u32>() <= units && greedy.iter().sum::<u32>() <= units);
        }
    }
}

fn w(id: &str, cores: u32) -> WorkerView {
    WorkerView {
        id: WorkerId::new(id).unwrap(),
        total_cores: cores,
        free_cores: cores,
        total_mem_mb: 1 << 20,
        free_mem_mb: 1 << 20,
        accepting: true,
        cordoned: false,
        sandboxes: 0,
    }
}

fn elastic(id: &str, min: u32, max: u32, t1_ms: f64, p: f64) -> Pending {
    Pending {
        id: ActionId::new(id).unwrap(),
        demand: Demand {
            cores: Some(CpuRange { min, max }),
            mem_mb: 0,
        },
        constraint: Constraint::OnWorker(WorkerId::new("n").unwrap()),
        model: Some(ElasticModel {
            t1_ms,
            speedup: Speedup::Amdahl(p),
        }),
        image: None,
    }
}

#[test]
fn tangram_gives_cores_where_they_shorten_most() {
    let snap = Snapshot::new(vec![w("n", 16)]);
    let plan = by_name("tangram").unwrap().schedule(
        &snap,
        &[
            elastic("serial", 1, 16, 1000.0, 0.0),
            elastic("parallel", 1, 16, 1000.0, 0.95),
        ],
        0,
    );
    let grants: BTreeMap<&str, u32> = plan
        .launches
        .iter()
        .map(|l| (l.id.as_str(), l.grant.cores))
        .collect();
    assert_eq!(
        grants["serial"], 1,
        "a serial action gains nothing from more cores"
    );
    assert_eq!(grants["parallel"], 15);
}

#[test]
fn tangram_holds_back_the_tail_when_that_finishes_everything_sooner() {
    // Two perfectly parallel actions on 4 cores that each want 4: running them one after the
    // other (1 s + 2 s) beats sharing (2 s + 2 s).
    let snap = Snapshot::new(vec![w("n", 4)]);
    let plan = by_name("tangram").unwrap().schedule(
        &snap,
        &[
            elastic("first", 1, 4, 4000.0, 1.0),
            elastic("second", 1, 4, 4000.0, 1.0),
        ],
        0,
    );
    assert_eq!(plan.launches.len(), 1, "{plan:?}");
    assert_eq!(
        (plan.launches[0].id.as_str(), plan.launches[0].grant.cores),
        ("first", 4)
    );
    assert!(matches!(plan.unplaced[0].1, Unplaced::MayFitLater(_)));

    // Serial actions gain nothing from waiting: both run at once.
    let plan = by_name("tangram").unwrap().schedule(
        &snap,
        &[
            elastic("first", 1, 4, 4000.0, 0.0),
            elastic("second", 1, 4, 4000.0, 0.0),
        ],
        0,
    );
    assert_eq!(plan.launches.len(), 2);
}

#[test]
fn baselines_grant_what_they_promise() {
    let snap = Snapshot::new(vec![w("n", 32)]);
    let queue = [
        elastic("a", 1, 16, 1000.0, 0.9),
        elastic("b", 2, 8, 500.0, 0.9),
        elastic("c", 1, 2, 100.0, 0.9),
    ];
    let grants = |name: &str| -> Vec<u32> {
        by_name(name)
            .unwrap()
            .schedule(&snap, &queue, 0)
            .launches
            .iter()
            .map(|l| l.grant.cores)
            .collect()
    };
    assert_eq!(grants("fifo-dop-1"), vec![1, 2, 1]);
    assert_eq!(grants("fifo-dop-4"), vec![4, 4, 2]);
    assert_eq!(grants("fifo-dop-16"), vec![16, 8, 2]);
    assert_eq!(grants("first-fit"), vec![16, 8, 2]);
    assert_eq!(grants("equal-split"), vec![16, 8, 2]);
    let small = Snapshot::new(vec![w("n", 6)]);
    let eq: Vec<u32> = by_name("equal-split")
        .unwrap()
        .schedule(&small, &queue, 0)
        .launches
        .iter()
        .map(|l| l.grant.cores)
        .collect();
    assert_eq!(eq, vec![2, 2, 2]);
    let sjf = by_name("sjf")
        .unwrap()
        .schedule(&Snapshot::new(vec![w("n", 4)]), &queue, 0);
    assert_eq!(sjf.launches[0].id.as_str(), "c", "shortest first");
}
