//! Dispatch intake: epochs, redeliveries, admission verdicts, a dispatch without its sandbox.

use super::*;

/// Regression: finished ids were remembered 10,000 deep, so a finished dispatch whose ack
/// never reached the server, redelivered after 10,000 others had finished, ran again.
#[test]
fn a_finished_dispatch_whose_ack_was_not_confirmed_never_runs_again() {
    let mut a = Admissions::default();
    let first = open("first", "t");
    assert_eq!(a.admit(&first, false, true), Verdict::Run);
    a.settle(&first.action.id, true, false);
    for i in 0..10_001 {
        let d = open(&format!("n{i}"), "t");
        assert_eq!(a.admit(&d, false, true), Verdict::Run);
        a.settle(&d.action.id, true, true);
    }
    // Addressed to this instance: without the memory it would run again.
    assert_eq!(a.admit(&first, true, true), Verdict::AlreadyFinished);
    // Once a later ack is confirmed it cannot come again, and is forgotten.
    a.ack_confirmed(&first.action.id);
    assert_eq!(a.admit(&first, true, true), Verdict::Run);
}

#[test]
fn admission_verdicts() {
    let mut a = Admissions::default();
    let d = |id: &str, epoch| {
        let mut d = open(id, "t");
        d.epoch = epoch;
        d
    };
    assert_eq!(a.admit(&d("a", 2), false, false), Verdict::Run);
    assert_eq!(a.admit(&d("a", 2), true, true), Verdict::AlreadyRunning);
    assert_eq!(
        a.admit(&d("b", 1), false, false),
        Verdict::StaleEpoch {
            epoch: 1,
            newest: 2
        }
    );
    a.settle(&ActionId::new("a").unwrap(), true, true);
    assert_eq!(a.admit(&d("a", 2), true, true), Verdict::AlreadyFinished);
    assert_eq!(
        a.admit(&d("c", 2), true, false),
        Verdict::LostByEarlierInstance
    );
    // Addressed to this instance and never seen here: lost in transit, it runs.
    assert_eq!(a.admit(&d("d", 2), true, true), Verdict::Run);
    // A newer scheduler moves the floor up.
    assert_eq!(a.admit(&d("e", 3), false, false), Verdict::Run);
    assert!(matches!(
        a.admit(&d("f", 2), false, false),
        Verdict::StaleEpoch { .. }
    ));
}

#[tokio::test(start_paused = true)]
async fn a_stale_epoch_dispatch_is_answered_not_dropped() {
    let h = Harness::start();
    let mut o = open("o1", "t1");
    o.epoch = 5;
    assert_eq!(completed(&h.run(&o).await), 0);
    let mut old = exec("old", "t1", &["true"], 1);
    old.epoch = 4;
    h.deliver("old", &old, false).await;
    // Intake is sequential: once a later dispatch has its result, the stale one was judged.
    let mut next = exec("next", "t1", &["true"], 1);
    next.epoch = 5;
    assert_eq!(completed(&h.run(&next).await), 0);
    // Not run, acked, and recorded for an operator; no result under the action's id (the
    // current scheduler owns the action).
    assert!(h.results.of("old").is_empty());
    assert_eq!(h.acks_of("old"), [Ack::Done]);
    assert_eq!(
        *h.results.refused.lock().unwrap(),
        [("old".to_string(), "stale_epoch")]
    );
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_forged_high_epoch_dispatch_does_not_block_real_ones() {
    let h = Harness::start();
    *h.results.epoch.lock().unwrap() = Some(5);
    let mut o = open("o1", "t1");
    o.epoch = 5;
    assert_eq!(completed(&h.run(&o).await), 0);
    // Anyone who can publish on the dispatch subject sends epoch 2^63.
    let mut forged = exec("forged", "t1", &["true"], 1);
    forged.epoch = 1 << 63;
    h.deliver("forged", &forged, false).await;
    // The real scheduler's next dispatch still runs.
    let mut real = exec("real", "t1", &["true"], 1);
    real.epoch = 5;
    assert_eq!(completed(&h.run(&real).await), 0);
    assert!(h.results.of("forged").is_empty());
    assert_eq!(h.acks_of("forged"), [Ack::Done]);
    assert_eq!(
        *h.results.refused.lock().unwrap(),
        [("forged".to_string(), "unknown_epoch")]
    );
    // A new leader's epoch, once stored, is accepted.
    *h.results.epoch.lock().unwrap() = Some(6);
    let mut next = exec("next", "t1", &["true"], 1);
    next.epoch = 6;
    assert_eq!(completed(&h.run(&next).await), 0);
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_redelivered_dispatch_runs_once_and_one_lost_by_an_earlier_instance_is_reported() {
    let h = Harness::start();
    h.run(&open("o1", "t1")).await;
    let long = exec("long", "t1", &["sleep", "10"], 1);
    h.deliver("long#1", &long, false).await;
    h.until_running(1).await;
    // While it runs: the running copy owns the ack.
    h.deliver("long#2", &long, true).await;
    let r = h.results.wait("long").await;
    assert_eq!(completed(&r), 0);
    // After it finished: acked, no second result.
    h.deliver("long#3", &long, true).await;
    let lost = exec("lost", "t1", &["true"], 1);
    h.deliver("lost", &lost, true).await;
    assert_eq!(
        infra_code(&h.results.wait("lost").await),
        InfraCode::WorkerLost
    );
    assert_eq!(h.results.of("long").len(), 1);
    assert_eq!(h.acks_of("long#1"), [Ack::Done]);
    assert!(h.acks_of("long#2").is_empty());
    assert_eq!(h.acks_of("long#3"), [Ack::Done]);
    assert_eq!(h.acks_of("lost"), [Ack::Done]);
    // Ten seconds of running were covered by in-progress acks.
    let progress = h
        .acks
        .lock()
        .unwrap()
        .iter()
        .filter(|(t, a)| t == "long#1" && *a == Ack::Progress)
        .count();
    assert_eq!(progress, 3);
    h.stop().await;
}

/// Regression: a NATS node died carrying a dispatch to this worker; JetStream delivered it
/// again after its ack wait, and the worker, seeing a redelivery it did not know, reported it
/// lost by an earlier instance although none had had it (`nats_cluster` in CI). A redelivery
/// addressed to the current instance and never seen here runs.
#[tokio::test(start_paused = true)]
async fn a_redelivery_of_a_dispatch_lost_in_transit_runs_when_addressed_to_this_instance() {
    let h = Harness::start();
    h.run(&open("o1", "t1")).await;
    let mut here = exec("here", "t1", &["true"], 1);
    here.instance = Some(h.worker.instance());
    h.deliver("here", &here, true).await;
    assert_eq!(completed(&h.results.wait("here").await), 0);
    // One addressed to another instance of this worker may have run there: reported lost.
    let mut there = exec("there", "t1", &["true"], 1);
    there.instance = Some("an-earlier-instance".into());
    h.deliver("there", &there, true).await;
    assert_eq!(
        infra_code(&h.results.wait("there").await),
        InfraCode::WorkerLost
    );
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn an_exec_without_its_sandbox_is_reported_lost() {
    let h = Harness::start();
    let r = h.run(&exec("e1", "nowhere", &["true"], 1)).await;
    assert_eq!(infra_code(&r), InfraCode::SandboxLost);
    // After a close the sandbox is gone too.
    h.run(&open("o1", "t1")).await;
    let close = dispatch(
        1,
        0,
        action(
            "c1",
            "t1",
            ActionSpec::SandboxClose(SandboxClose::default()),
        ),
    );
    assert_eq!(completed(&h.run(&close).await), 0);
    assert_eq!(h.sandboxes.open_count(), 0);
    let r = h.run(&exec("e2", "t1", &["true"], 1)).await;
    assert_eq!(infra_code(&r), InfraCode::SandboxLost);
    h.stop().await;
}
