//! Cores: granted at most once, given back, re-sized while an exec runs, and reported in
//! heartbeats.

use super::*;

#[tokio::test(start_paused = true)]
async fn cores_are_granted_at_most_once_and_come_back() {
    let h = Harness::start(); // two cores
    h.run(&open("o1", "t1")).await;
    h.run(&open("o2", "t2")).await;
    h.deliver("wide", &exec("wide", "t1", &["sleep", "60"], 2), false)
        .await;
    h.until_running(1).await;
    // Nothing frees a core while it waits for one (see the next test): it fails after the
    // wait, never sharing a core.
    let t0 = Instant::now();
    let r = h.run(&exec("more", "t2", &["true"], 1)).await;
    assert_eq!(infra_code(&r), InfraCode::Grant);
    assert!(
        t0.elapsed() >= crate::runtime::execute::CORE_WAIT,
        "{:?}",
        t0.elapsed()
    );
    assert!(h.worker.state.lock().unwrap().reserved.is_empty());
    let wide = h.results.wait("wide").await;
    assert_eq!(completed(&wide), 0);
    assert_eq!(wide.placement.as_ref().unwrap().cpuset, "0-1");
    // Given back: the same exec fits now.
    let r = h.run(&exec("again", "t2", &["true"], 1)).await;
    assert_eq!(completed(&r), 0);
    h.stop().await;
}

/// Regression (left open by the re-size reviews): a narrowing that reached the worker after
/// the dispatch relying on the core it frees (redelivered after its ack wait, as when a NATS
/// node dies carrying it) made that exec fail `infra_error: grant` at once. The exec now
/// waits for the cores it was booked.
#[tokio::test(start_paused = true)]
async fn an_exec_whose_core_a_late_narrowing_frees_waits_for_it() {
    let h = Harness::start(); // two cores
    h.run(&open("o1", "t1")).await;
    h.run(&open("o2", "t2")).await;
    h.deliver("long", &exec("long", "t1", &["sleep", "60"], 2), false)
        .await;
    h.until_running(1).await;
    // The scheduler narrowed `long` to one core and placed `next` on the other; `next`
    // comes first, the narrowing five seconds later.
    let t0 = Instant::now();
    h.deliver("next", &exec("next", "t2", &["true"], 1), false)
        .await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(
        h.results.of("next").is_empty(),
        "{:?}",
        h.results.of("next")
    );
    let narrow = tangram_shared::Regrant {
        epoch: 1,
        id: ActionId::new("long").unwrap(),
        attempt: 1,
        grant: Grant {
            cores: 1,
            mem_mb: 256,
        },
        seq: 1,
    };
    h.deliver_regrant("narrow", &narrow).await;
    let next = h.results.wait("next").await;
    assert_eq!(completed(&next), 0, "{next:?}");
    assert!(t0.elapsed() >= Duration::from_secs(5), "{:?}", t0.elapsed());
    assert!(t0.elapsed() < crate::runtime::execute::CORE_WAIT);
    // On the core the narrowing gave back, never on the one `long` keeps.
    let long_core = h.worker.state.lock().unwrap().execs[&ActionId::new("long").unwrap()]
        .cores
        .clone();
    assert_eq!(long_core.len(), 1);
    assert_ne!(
        next.placement.as_ref().unwrap().cpuset,
        crate::cpuset::format(&long_core)
    );
    assert!(h.worker.state.lock().unwrap().reserved.is_empty());
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
