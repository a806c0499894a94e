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
                needs: Default::default(),
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
    fn same_input_same_plan((workers, pending) in arb_cluster()) {
        let mut reversed = workers.clone();
        reversed.reverse();
        for name in NAMES {
            let p = by_name(name).unwrap();
            prop_assert_eq!(p.schedule(&Snapshot::new(workers.clone()), &pending, 7), p.schedule(&Snapshot::new(reversed.clone()), &pending, 7));
        }
    }

    #[test]
    fn replanning_after_a_plan_launches_nothing_new((workers, pending) in arb_cluster()) {
        let snap = Snapshot::new(workers);
        for name in NAMES {
            let policy = by_name(name).unwrap();
            let plan = policy.schedule(&snap, &pending, 0);
            let after = snap.after(&plan.launches, &pending, 0);
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
        needs: Default::default(),
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

fn with_needs(mut p: Pending, units: &[(&str, u64)], rates: &[&str]) -> Pending {
    p.needs.units = units.iter().map(|(n, u)| (n.to_string(), *u)).collect();
    p.needs.rates = rates.iter().map(|r| r.to_string()).collect();
    p
}

fn any_action(id: &str) -> Pending {
    Pending::new(
        ActionId::new(id).unwrap(),
        Demand {
            cores: None,
            mem_mb: 0,
        },
        Constraint::Any,
    )
}

fn bucket(rate_per_s: f64, burst: f64, tokens: f64) -> tangram_core::TokenBucket {
    tangram_core::TokenBucket {
        rate_per_s,
        burst,
        tokens,
        at_ms: 0,
    }
}

#[test]
fn rate_limited_actions_wait_for_tokens_and_say_when() {
    // 2 tokens now, 10 per second after that.
    let snap = Snapshot::new(vec![w("n", 4)]).with_rate("search", bucket(10.0, 5.0, 2.0));
    let q: Vec<Pending> = (0..3)
        .map(|i| with_needs(any_action(&format!("q{i}")), &[], &["search"]))
        .collect();
    for name in NAMES {
        let plan = by_name(name).unwrap().schedule(&snap, &q, 0);
        assert_eq!(plan.launches.len(), 2, "{name}: {plan:?}");
        match &plan.unplaced[0].1 {
            Unplaced::MayFitLater(tangram_core::WaitReason::Rate {
                name: r,
                ready_in_ms,
            }) => {
                assert_eq!((r.as_str(), *ready_in_ms), ("search", 100), "{name}");
            }
            other => panic!("{name}: {other:?}"),
        }
        // 100 ms later the bucket has refilled one token.
        let later =
            by_name(name)
                .unwrap()
                .schedule(&snap.after(&plan.launches, &q, 0), &q[2..], 100);
        assert_eq!(later.launches.len(), 1, "{name}: {later:?}");
    }
    // A limit that does not exist can never be met.
    let plan = by_name("tangram").unwrap().schedule(
        &snap,
        &[with_needs(any_action("x"), &[], &["maps"])],
        0,
    );
    assert!(
        matches!(&plan.unplaced[0].1, Unplaced::NeverFits(tangram_core::NeverReason::NoSuchResource(r)) if r == "maps")
    );
}

#[test]
fn named_resources_are_held_per_worker() {
    let snap = Snapshot::new(vec![w("a", 8), w("b", 8)]).with_resource(
        &WorkerId::new("a").unwrap(),
        "gpu",
        2,
        2,
    );
    let q: Vec<Pending> = (0..3)
        .map(|i| with_needs(any_action(&format!("g{i}")), &[("gpu", 1)], &[]))
        .collect();
    for name in NAMES {
        let plan = by_name(name).unwrap().schedule(&snap, &q, 0);
        assert_eq!(plan.launches.len(), 2, "{name}: {plan:?}");
        assert!(
            plan.launches.iter().all(|l| l.worker.as_str() == "a"),
            "{name}: only a has GPUs"
        );
        assert!(
            matches!(
                &plan.unplaced[0].1,
                Unplaced::MayFitLater(tangram_core::WaitReason::Resource {
                    need: 1,
                    best_free: 0,
                    ..
                })
            ),
            "{name}: {:?}",
            plan.unplaced
        );
        let four = by_name(name).unwrap().schedule(
            &snap,
            &[with_needs(any_action("g4"), &[("gpu", 4)], &[])],
            0,
        );
        assert!(
            matches!(four.unplaced[0].1, Unplaced::NeverFits(_)),
            "{name}"
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn every_policy_respects_named_resources_and_rate_limits(
        gpus in prop::collection::vec(0u64..4, 1..4),
        tokens in 0.0f64..6.0,
        needs in prop::collection::vec((0u64..3, any::<bool>(), 0u32..4), 0..24),
        now_ms in 0u64..2000,
    ) {
        let workers: Vec<WorkerView> = (0..gpus.len()).map(|i| w(&format!("w{i}"), 8)).collect();
        let mut snap = Snapshot::new(workers).with_rate("api", bucket(2.0, 6.0, tokens));
        for (i, &g) in gpus.iter().enumerate() {
            snap = snap.with_resource(&WorkerId::new(format!("w{i}")).unwrap(), "gpu", g, g);
        }
        let pending: Vec<Pending> = needs
            .iter()
            .enumerate()
            .map(|(i, &(g, api, cores))| {
                let mut p = any_action(&format!("p{i}"));
                if cores > 0 {
                    p.demand.cores = Some(CpuRange { min: 1, max: cores });
                }
                let units: Vec<(&str, u64)> = if g > 0 { vec![("gpu", g)] } else { vec![] };
                with_needs(p, &units, if api { &["api"] } else { &[] })
            })
            .collect();
        for name in NAMES {
            let plan = by_name(name).unwrap().schedule(&snap, &pending, now_ms);
            check_invariants(name, &snap, &pending, &plan);
            let mut used: BTreeMap<&str, u64> = BTreeMap::new();
            let mut tokens_used = 0.0;
            for l in &plan.launches {
                let p = pending.iter().find(|p| p.id == l.id).unwrap();
                *used.entry(l.worker.as_str()).or_default() += p.needs.units.get("gpu").copied().unwrap_or(0);
                tokens_used += p.needs.rates.len() as f64;
            }
            for (wk, g) in used {
                let free = snap.resource(&WorkerId::new(wk).unwrap(), "gpu").map_or(0, |r| r.1);
                prop_assert!(g <= free, "{}: {} gpus on {} with {} free", name, g, wk, free);
            }
            prop_assert!(tokens_used <= snap.rate("api").unwrap().available(now_ms) + 1e-9, "{}: {} tokens", name, tokens_used);
            let waiting: Vec<Pending> = pending
                .iter()
                .filter(|p| plan.unplaced.iter().any(|(id, u)| id == &p.id && matches!(u, Unplaced::MayFitLater(_))))
                .cloned()
                .collect();
            let again = by_name(name).unwrap().schedule(&snap.after(&plan.launches, &pending, now_ms), &waiting, now_ms);
            prop_assert!(again.launches.is_empty(), "{}: second run launched {:?}", name, again.launches);
        }
    }
}
