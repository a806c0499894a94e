//! Cores: granted at most once, given back, re-sized while an exec runs, and reported in
//! heartbeats.

use super::*;

#[tokio::test(start_paused = true)]
async fn cores_are_granted_at_most_once_and_come_back() {
    let h = Harness::start(); // two cores
    h.run(&open("o1", "t1")).await;
    h.run(&open("o2", "t2")).await;
    h.deliver("wide", &exec("wide", "t1", &["sleep", "10"], 2), false)
        .await;
    h.until_running(1).await;
    let r = h.run(&exec("more", "t2", &["true"], 1)).await;
    assert_eq!(infra_code(&r), InfraCode::Grant);
    let wide = h.results.wait("wide").await;
    assert_eq!(completed(&wide), 0);
    assert_eq!(wide.placement.as_ref().unwrap().cpuset, "0-1");
    // Given back: the same exec fits now.
    let r = h.run(&exec("again", "t2", &["true"], 1)).await;
    assert_eq!(completed(&r), 0);
    h.stop().await;
}

/// Regression: under `tangram-v2` a widening read from the dispatch subject took the free
/// core the scheduler had booked for an exec admitted just before it, whose task had not
/// taken its cores yet; that exec failed `infra_error: grant` ("1 cores are not free").
/// Admission now promises an exec its cores, and a widening leaves promised cores alone.
#[tokio::test(start_paused = true)]
async fn a_widening_read_before_an_admitted_exec_starts_leaves_that_exec_its_cores() {
    let h = Harness::start(); // two cores
    h.run(&open("o1", "t1")).await;
    h.run(&open("o2", "t2")).await;
    h.deliver("long", &exec("long", "t1", &["sleep", "10"], 1), false)
        .await;
    h.until_running(1).await;
    // Back to back, before the serve loop runs again: an exec for the free core, then a
    // re-size of the running one to both cores.
    h.deliver("next", &exec("next", "t2", &["true"], 1), false)
        .await;
    let widen = tangram_shared::Regrant {
        epoch: 1,
        id: ActionId::new("long").unwrap(),
        attempt: 1,
        grant: Grant {
            cores: 2,
            mem_mb: 256,
        },
        seq: 1,
    };
    h.deliver_regrant("widen", &widen).await;
    let next = h.results.wait("next").await;
    assert_eq!(completed(&next), 0, "{next:?}");
    assert_eq!(h.acks_of("widen"), [Ack::Done], "the re-size is acked");
    let long = h.results.wait("long").await;
    assert_eq!(completed(&long), 0);
    assert!(h.worker.state.lock().unwrap().reserved.is_empty());
    h.stop().await;
}

/// Regression (found by the engine's property test once it drove failovers): a scheduler that
/// took over booked an exec an earlier leader had re-sized at its dispatch's grant, since
/// nothing said otherwise, and placed work into cores the exec held. Heartbeats now list the
/// cores of every re-sized exec.
#[tokio::test(start_paused = true)]
async fn a_heartbeat_reports_the_cores_of_a_re_sized_exec() {
    let h = Harness::start(); // two cores
    h.run(&open("o1", "t1")).await;
    h.deliver("long", &exec("long", "t1", &["sleep", "10"], 1), false)
        .await;
    h.until_running(1).await;
    let hb = crate::runtime::heartbeat::heartbeat_of(&h.worker, 1, false);
    assert!(
        hb.resized.is_empty(),
        "nothing re-sized yet: {:?}",
        hb.resized
    );
    let widen = tangram_shared::Regrant {
        epoch: 1,
        id: ActionId::new("long").unwrap(),
        attempt: 1,
        grant: Grant {
            cores: 2,
            mem_mb: 256,
        },
        seq: 1,
    };
    h.deliver_regrant_at("widen", &widen, 7).await;
    h.until_acked("widen").await;
    let hb = crate::runtime::heartbeat::heartbeat_of(&h.worker, 2, false);
    assert_eq!(hb.running, [ActionId::new("long").unwrap()]);
    assert_eq!(
        hb.resized.get(&ActionId::new("long").unwrap()),
        Some(&2),
        "{hb:?}"
    );
    // Taken in: a new leader that found the re-size in the backlog reads this report as
    // the width after it.
    assert_eq!(hb.dispatch_seq, 7, "{hb:?}");
    // The epoch its dispatches came with, which a new leader compares a re-size's with.
    assert_eq!(hb.known_epoch, 1, "{hb:?}");
    // One of an older epoch is dropped, and counts as taken in all the same.
    let mut old = widen.clone();
    old.epoch = 0;
    old.grant.cores = 1;
    old.seq = 2;
    h.deliver_regrant_at("old", &old, 9).await;
    h.until_acked("old").await;
    let hb = crate::runtime::heartbeat::heartbeat_of(&h.worker, 3, false);
    assert_eq!(hb.resized.get(&ActionId::new("long").unwrap()), Some(&2));
    assert_eq!(hb.dispatch_seq, 9, "{hb:?}");
    assert_eq!(
        hb.known_epoch, 1,
        "an older epoch's re-size teaches nothing: {hb:?}"
    );
    h.stop().await;
}
