//! Table tests of the foundation policy (property tests for every policy: `policies.rs`).

use tangram_core::{
    Constraint, FcfsFirstFit, NeverReason, Pending, Plan, Policy, Snapshot, Unplaced, WaitReason,
    WorkerView,
};
use tangram_shared::{ActionId, CpuRange, Demand, WorkerId};

fn schedule(snap: &Snapshot, pending: &[Pending], now: u64) -> Plan {
    FcfsFirstFit.schedule(snap, pending, now)
}

fn worker(id: &str, cores: u32, free: u32, mem: u64) -> WorkerView {
    WorkerView {
        id: WorkerId::new(id).unwrap(),
        total_cores: cores,
        free_cores: free,
        total_mem_mb: mem,
        free_mem_mb: mem,
        accepting: true,
        cordoned: false,
        sandboxes: 0,
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
        model: None,
        image: None,
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
        model: None,
        image: None,
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
