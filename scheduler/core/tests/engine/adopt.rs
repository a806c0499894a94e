//! A new leader takes over what an earlier one dispatched: from heartbeats, and from a
//! stored dispatch when an action message comes back.

use super::*;
use tangram_core::PendingResize;

fn dispatch_of(action: Action, cores: u32) -> Dispatch {
    Dispatch {
        epoch: 1,
        attempt: 1,
        action,
        grant: tangram_shared::Grant { cores, mem_mb: 0 },
        submitted_at_us: 5,
        result_encoding: Encoding::Json,
        instance: None,
        gpu: None,
    }
}

fn fetches(fx: &[Effect]) -> Vec<String> {
    fx.iter()
        .filter_map(|e| match e {
            Effect::FetchDispatch { id, .. } => Some(id.to_string()),
            _ => None,
        })
        .collect()
}

/// Regression: a restarted scheduler ignored the heartbeats' running lists, so cores busy
/// with an earlier leader's actions counted as free.
#[test]
fn a_running_action_listed_by_a_heartbeat_is_adopted_with_its_cores() {
    let mut h = Harness::new(&[("w1", 4, 4096)]);
    h.open_sandbox("j", "t1");
    let fx = h.heartbeat("w1", 4, 4096, &["old-exec"], &[("j", "t1")]);
    assert_eq!(fetches(&fx), ["old-exec"]);
    // Asked once, not at every heartbeat while the fetch is out.
    let fx = h.heartbeat("w1", 4, 4096, &["old-exec"], &[("j", "t1")]);
    assert!(fetches(&fx).is_empty());
    let d = dispatch_of(exec("old-exec", "j", "t1", 3, 3), 3);
    h.step(Event::Adopt {
        worker: WorkerId::new("w1").unwrap(),
        dispatch: Box::new(d.clone()),
    });
    assert_eq!(h.engine.booked()[&WorkerId::new("w1").unwrap()].0, 3);
    // A new exec of another trajectory gets at most the one free core.
    h.open_sandbox("j", "t2");
    let (_, fx) = h.arrive(exec("new", "j", "t2", 1, 4));
    let ds = dispatched(&fx);
    assert_eq!(ds.len(), 1);
    assert_eq!(ds[0].1.grant.cores, 1, "only one core is free");
    // Its result frees the cores.
    h.complete(&d, "w1");
    assert_eq!(h.engine.booked()[&WorkerId::new("w1").unwrap()].0, 1);
}

/// Regression: a crash between publishing a dispatch and acking the action made the next
/// scheduler dispatch it again (a second run, maybe on another worker).
#[test]
fn an_action_whose_dispatch_is_stored_is_adopted_not_dispatched_again() {
    let mut h = Harness::new(&[("w1", 4, 4096), ("w2", 4, 4096)]);
    h.open_sandbox("j", "t1");
    let action = open("o-again", "j", "t9");
    let d = dispatch_of(action.clone(), 0);
    let fx = h.step(Event::Arrived(Box::new(Arrival {
        action,
        encoding: Encoding::Msgpack,
        submitted_at_us: 0,
        delivery: 77,
        seen: false,
        model: None,
        dispatched: Some(Box::new((WorkerId::new("w2").unwrap(), d.clone()))),
        bytes: 0,
        redelivered: false,
    })));
    assert!(dispatched(&fx).is_empty(), "dispatched again: {fx:?}");
    assert!(
        fx.contains(&Effect::Ack(77)),
        "the message is acked: {fx:?}"
    );
    // The worker that has it reports it; its result settles it once.
    let fx = h.heartbeat("w2", 4, 4096, &["o-again"], &[]);
    assert!(fetches(&fx).is_empty());
    let fx = h.complete(&d, "w2");
    assert!(dispatched(&fx).is_empty());
}

#[test]
fn an_adopted_action_that_its_worker_stops_reporting_is_settled_as_lost() {
    let mut h = Harness::new(&[("w1", 4, 4096)]);
    h.heartbeat("w1", 4, 4096, &["gone"], &[]);
    h.step(Event::Adopt {
        worker: WorkerId::new("w1").unwrap(),
        dispatch: Box::new(dispatch_of(exec("gone", "j", "t1", 1, 1), 1)),
    });
    let mut lost = false;
    for _ in 0..5 {
        h.now += 1_000;
        let fx = h.heartbeat("w1", 4, 4096, &[], &[]);
        lost |= fx.iter().any(
            |e| matches!(e, Effect::PublishResult { result, .. } if result.id.as_str() == "gone"),
        );
    }
    assert!(
        lost,
        "an adopted action the worker no longer has is settled"
    );
    let booked = h.engine.booked();
    assert_eq!(
        booked.get(&WorkerId::new("w1").unwrap()).map_or(0, |b| b.0),
        0
    );
}

#[test]
fn a_fetch_that_finds_nothing_is_asked_again_later() {
    let mut h = Harness::new(&[("w1", 4, 4096)]);
    let fx = h.heartbeat("w1", 4, 4096, &["ghost"], &[]);
    assert_eq!(fetches(&fx), ["ghost"]);
    h.step(Event::AdoptFailed { id: id("ghost") });
    let fx = h.heartbeat("w1", 4, 4096, &["ghost"], &[]);
    assert_eq!(fetches(&fx), ["ghost"]);
}

/// Regression: two schedulers started at once (`standby::two_schedulers_started_at_once_
/// elect_one_leader` in CI); the first leader dispatched a trajectory's open and the second,
/// taking over, adopted it from the worker's running list. When its result came, the new
/// leader had no record of the sandbox to mark open (and heartbeats add sandboxes only when a
/// worker joins), so the trajectory's next exec was rejected `no_sandbox`. A completed open
/// that was adopted now records its sandbox.
#[test]
fn an_adopted_open_that_completes_records_its_sandbox() {
    let mut h = Harness::new(&[("w1", 4, 4096)]);
    let fx = h.heartbeat("w1", 4, 4096, &["old-open"], &[]);
    assert_eq!(fetches(&fx), ["old-open"]);
    let d = dispatch_of(open("old-open", "j", "t1"), 0);
    h.step(Event::Adopt {
        worker: WorkerId::new("w1").unwrap(),
        dispatch: Box::new(d.clone()),
    });
    h.complete(&d, "w1");
    h.now += 5_000; // settled in: an exec with no sandbox would be rejected
    let (_, fx) = h.arrive(exec("next", "j", "t1", 1, 1));
    assert!(rejected(&fx).is_empty(), "{fx:?}");
    let (w, _) = dispatched(&fx).pop().expect("the exec goes to the sandbox");
    assert_eq!(w, "w1");
}

/// Regression (found by the property test once it drove failovers): an open adopted by a
/// new leader reserved nothing until its result, so the leader placed other sandboxes into
/// the memory that open's container was taking (1,536 MiB booked on a 1,024 MiB worker).
#[test]
fn an_adopted_open_reserves_its_sandbox_memory_before_its_result() {
    let mut h = Harness::new(&[("w1", 4, 1024)]);
    h.heartbeat("w1", 4, 1024, &["old-open"], &[]);
    let mut d = dispatch_of(open("old-open", "j", "t1"), 0);
    d.grant.mem_mb = 512;
    h.step(Event::Adopt {
        worker: WorkerId::new("w1").unwrap(),
        dispatch: Box::new(d.clone()),
    });
    assert_eq!(h.engine.booked()[&WorkerId::new("w1").unwrap()].1, 512);
    // Room for one more 512 MiB sandbox, not two.
    let (_, fx) = h.arrive(open("o2", "j", "t2"));
    assert_eq!(dispatched(&fx).len(), 1);
    let (_, fx) = h.arrive(open("o3", "j", "t3"));
    assert!(
        dispatched(&fx).is_empty(),
        "placed past the worker's memory: {fx:?}"
    );
    // Its result opens the sandbox it reserved: the trajectory's exec goes there.
    h.complete(&d, "w1");
    assert_eq!(h.engine.booked()[&WorkerId::new("w1").unwrap()].1, 1024);
    let (_, fx) = h.arrive(exec("e1", "j", "t1", 1, 1));
    assert_eq!(dispatched(&fx).len(), 1, "{fx:?}");
}

/// A term that awaits its backlog places nothing until the backlog is read, so that what it
/// adopts from there is booked first. Without the hold, the property test placed new execs
/// beside adopted ones on a worker that had no room for both (10 cores booked of 8).
#[test]
fn a_new_term_places_nothing_until_its_backlog_is_read() {
    let config = EngineConfig {
        await_backlog: true,
        ..cfg()
    };
    let mut h = Harness::with(config, &[]);
    // The worker joins the term with two sandboxes.
    let fx = h.heartbeat("w1", 2, 4096, &[], &[("j", "t1"), ("j", "t2")]);
    assert!(fetches(&fx).is_empty());
    let (_, fx) = h.arrive(exec("new", "j", "t2", 1, 2));
    assert!(
        dispatched(&fx).is_empty(),
        "placed before the backlog was read: {fx:?}"
    );
    let status = h.engine.status(h.at());
    assert_eq!(
        status.waiting.keys().collect::<Vec<_>>(),
        ["the dispatch backlog to be read (the term just started)"]
    );
    // The backlog holds an exec of the earlier leader on both cores.
    h.step(Event::AdoptStored {
        worker: WorkerId::new("w1").unwrap(),
        dispatch: Box::new(dispatch_of(exec("old", "j", "t1", 2, 2), 2)),
        seq: 4,
        resize: None,
    });
    let fx = h.step(Event::BacklogRead);
    assert!(dispatched(&fx).is_empty(), "no free core: {fx:?}");
    assert_eq!(booked_cores(&h.engine, "w1"), 2);
    // Its result frees them.
    h.heartbeat("w1", 2, 4096, &["old"], &[("j", "t1"), ("j", "t2")]);
    let fx = h.complete(&dispatch_of(exec("old", "j", "t1", 2, 2), 2), "w1");
    assert_eq!(dispatched(&fx).len(), 1, "{fx:?}");
}

/// Regression (found in review of the failover work): a new leader asked for the dispatch of
/// an open a heartbeat listed, the open's result arrived before the answer, and the late
/// adoption then booked it as running: the worker no longer listed it, so it was settled
/// again as lost and its sandbox, which exists, was forgotten (the trajectory's next exec
/// rejected `no_sandbox`, its memory unbooked). A result for an action the engine never saw
/// now settles it (a late adoption is dropped) and records an open's sandbox.
#[test]
fn a_result_that_comes_before_its_adoption_keeps_the_sandbox_and_drops_the_adoption() {
    let mut h = Harness::new(&[("w1", 4, 4096)]);
    let fx = h.heartbeat("w1", 4, 4096, &["old-open"], &[]);
    assert_eq!(fetches(&fx), ["old-open"]);
    let mut d = dispatch_of(open("old-open", "j", "t1"), 0);
    d.grant.mem_mb = 512;
    h.complete(&d, "w1");
    assert_eq!(h.engine.booked()[&WorkerId::new("w1").unwrap()].1, 512);
    h.step(Event::Adopt {
        worker: WorkerId::new("w1").unwrap(),
        dispatch: Box::new(d.clone()),
    });
    assert_eq!(
        h.engine.state_of(&id("old-open")),
        None,
        "adopted after its result"
    );
    for _ in 0..5 {
        h.now += 1_000;
        h.heartbeat("w1", 4, 4096, &[], &[]);
    }
    assert_eq!(h.engine.booked()[&WorkerId::new("w1").unwrap()].1, 512);
    let (_, fx) = h.arrive(exec("next", "j", "t1", 1, 1));
    assert!(rejected(&fx).is_empty(), "{fx:?}");
    assert_eq!(dispatched(&fx).len(), 1, "{fx:?}");
    // The close's result, unseen too: the sandbox and its memory go.
    let c = dispatch_of(close("old-close", "j", "t1"), 0);
    h.complete(&c, "w1");
    assert_eq!(
        h.engine
            .booked()
            .get(&WorkerId::new("w1").unwrap())
            .map_or(0, |b| b.1),
        0
    );
}

/// Regression (found in review of the failover work): an earlier leader widened an exec and
/// ended before its worker took the re-size from the backlog. The new leader booked the
/// exec at its dispatch's width, placed another exec in the cores the widening takes, and
/// the worker then applied it: more cores in use than the worker has. A re-size found in the
/// backlog is booked with the exec until the worker reports running at it.
#[test]
fn a_widening_still_in_the_backlog_is_booked_until_the_worker_runs_at_it() {
    // Dispatched at one core, re-sized to two and then to three by the earlier leader; the
    // last not applied yet.
    let old = dispatch_of(exec("old", "j", "t1", 1, 3), 1);
    let mut h = term_with_resize(
        &old,
        PendingResize {
            cores: 3,
            seq: 5,
            epoch: 1,
        },
    );
    assert_eq!(booked_cores(&h.engine, "w1"), 3);
    // The worker still runs it at one core: the widening stays booked.
    let mut hb = h.heartbeat_of("w1", 4, 4096, &["old"], &[("j", "t1"), ("j", "t2")]);
    hb.dispatch_seq = 4;
    h.step(Event::Heartbeat(Box::new(hb.clone())));
    assert_eq!(booked_cores(&h.engine, "w1"), 3);
    // An earlier re-size to two, applied, reported: still the widening's three.
    hb.resized.insert(id("old"), 2);
    h.step(Event::Heartbeat(Box::new(hb.clone())));
    assert_eq!(booked_cores(&h.engine, "w1"), 3);
    let (_, fx) = h.arrive(exec("new", "j", "t2", 2, 2));
    assert!(
        dispatched(&fx).is_empty(),
        "placed in the widening's cores: {fx:?}"
    );
    // It applies the widening and says so; then the result frees the cores.
    hb.resized.insert(id("old"), 3);
    h.step(Event::Heartbeat(Box::new(hb.clone())));
    assert_eq!(booked_cores(&h.engine, "w1"), 3);
    let fx = h.complete(&old, "w1");
    assert_eq!(dispatched(&fx).len(), 1, "{fx:?}");
}

/// A narrowing still in the backlog is what the exec holds at once: the worker takes its
/// subject in stream order, so it narrows before it takes anything this leader sends, and
/// the cores it gives back can go to a new exec. (Booking the larger of the two widths
/// booked those cores twice: 9 cores on an 8-core worker in the property test.)
#[test]
fn a_narrowing_still_in_the_backlog_frees_its_cores_for_the_next_exec() {
    let old = dispatch_of(exec("old", "j", "t1", 1, 4), 4);
    let mut h = term_with_resize(
        &old,
        PendingResize {
            cores: 1,
            seq: 5,
            epoch: 1,
        },
    );
    assert_eq!(booked_cores(&h.engine, "w1"), 1);
    // The worker still runs it at four: the narrowing stays booked.
    let mut hb = h.heartbeat_of("w1", 4, 4096, &["old"], &[("j", "t1"), ("j", "t2")]);
    hb.dispatch_seq = 4;
    hb.resized.insert(id("old"), 4);
    h.step(Event::Heartbeat(Box::new(hb.clone())));
    assert_eq!(booked_cores(&h.engine, "w1"), 1);
    let (_, fx) = h.arrive(exec("new", "j", "t2", 3, 3));
    assert_eq!(dispatched(&fx).len(), 1, "{fx:?}");
}

/// A heartbeat's fetch may adopt the exec before the backlog scan reaches it: the re-size
/// the scan then finds is booked all the same.
#[test]
fn a_re_size_found_after_a_fetch_adopted_the_exec_is_booked() {
    let config = EngineConfig {
        await_backlog: true,
        ..cfg()
    };
    let mut h = Harness::with(config, &[]);
    let fx = h.heartbeat("w1", 4, 4096, &["old"], &[("j", "t1"), ("j", "t2")]);
    assert_eq!(fetches(&fx), ["old"]);
    let old = dispatch_of(exec("old", "j", "t1", 1, 3), 1);
    h.step(Event::Adopt {
        worker: WorkerId::new("w1").unwrap(),
        dispatch: Box::new(old.clone()),
    });
    assert_eq!(booked_cores(&h.engine, "w1"), 1);
    h.step(Event::AdoptStored {
        worker: WorkerId::new("w1").unwrap(),
        dispatch: Box::new(old),
        seq: 4,
        resize: Some(PendingResize {
            cores: 3,
            seq: 5,
            epoch: 1,
        }),
    });
    h.step(Event::BacklogRead);
    assert_eq!(booked_cores(&h.engine, "w1"), 3);
    let (_, fx) = h.arrive(exec("new", "j", "t2", 2, 2));
    assert!(
        dispatched(&fx).is_empty(),
        "placed in the widening's cores: {fx:?}"
    );
}

/// A widening the worker could apply only in part (its other cores were taken), or a re-size
/// it dropped (of an older epoch than one it knew): once its dispatch sequence is past the
/// re-size, the exec is booked as it runs, not at the width it was sent.
#[test]
fn a_re_size_the_worker_took_in_is_booked_as_it_runs_whatever_it_asked() {
    let old = dispatch_of(exec("old", "j", "t1", 1, 4), 1);
    let mut h = term_with_resize(
        &old,
        PendingResize {
            cores: 4,
            seq: 5,
            epoch: 1,
        },
    );
    assert_eq!(booked_cores(&h.engine, "w1"), 4);
    // Past the re-size, running at two of the four asked.
    let mut hb = h.heartbeat_of("w1", 4, 4096, &["old"], &[("j", "t1"), ("j", "t2")]);
    hb.dispatch_seq = 5;
    hb.resized.insert(id("old"), 2);
    h.step(Event::Heartbeat(Box::new(hb)));
    assert_eq!(booked_cores(&h.engine, "w1"), 2);
    let (_, fx) = h.arrive(exec("new", "j", "t2", 2, 2));
    assert_eq!(dispatched(&fx).len(), 1, "{fx:?}");

    // Dropped: never re-sized, so it runs at its dispatch's grant.
    let old = dispatch_of(exec("old", "j", "t1", 1, 4), 3);
    let mut h = term_with_resize(
        &old,
        PendingResize {
            cores: 1,
            seq: 5,
            epoch: 1,
        },
    );
    assert_eq!(booked_cores(&h.engine, "w1"), 1);
    let mut hb = h.heartbeat_of("w1", 4, 4096, &["old"], &[("j", "t1"), ("j", "t2")]);
    hb.dispatch_seq = 6;
    h.step(Event::Heartbeat(Box::new(hb)));
    assert_eq!(booked_cores(&h.engine, "w1"), 3);
}

/// A re-size of an epoch older than its worker knows, found in the backlog behind the
/// worker's later dispatch: the worker drops it if it has not applied it, so the exec is
/// booked as the worker reports it, and the cores the re-size would take go to new work.
#[test]
fn a_re_size_of_an_epoch_its_worker_has_left_behind_is_booked_as_the_worker_runs() {
    let old = dispatch_of(exec("old", "j", "t1", 1, 4), 1);
    let config = EngineConfig {
        await_backlog: true,
        epoch: 3,
        ..cfg()
    };
    let mut h = Harness::with(config, &[]);
    // The worker has taken a dispatch of epoch 2, not yet the re-size (epoch 1, sequence 9).
    let mut hb = h.heartbeat_of("w1", 4, 4096, &["old"], &[("j", "t1"), ("j", "t2")]);
    hb.dispatch_seq = 6;
    hb.known_epoch = 2;
    h.step(Event::Heartbeat(Box::new(hb.clone())));
    h.step(Event::AdoptStored {
        worker: WorkerId::new("w1").unwrap(),
        dispatch: Box::new(old.clone()),
        seq: 4,
        resize: Some(PendingResize {
            cores: 4,
            seq: 9,
            epoch: 1,
        }),
    });
    h.step(Event::BacklogRead);
    assert_eq!(booked_cores(&h.engine, "w1"), 1);
    let (_, fx) = h.arrive(exec("new", "j", "t2", 3, 3));
    assert_eq!(dispatched(&fx).len(), 1, "{fx:?}");
    // A worker that knew no newer epoch would apply it: booked at its width.
    let mut h = term_with_resize(
        &old,
        PendingResize {
            cores: 4,
            seq: 9,
            epoch: 1,
        },
    );
    hb.known_epoch = 1;
    h.step(Event::Heartbeat(Box::new(hb)));
    assert_eq!(booked_cores(&h.engine, "w1"), 4);
}

/// A term that awaits its backlog, worker `w1` (4 cores, sandboxes of `t1` and `t2`) heard
/// from, and `old` adopted from the backlog (stream sequence 4) with a re-size of it still
/// there; the backlog read.
fn term_with_resize(old: &Dispatch, resize: PendingResize) -> Harness {
    let config = EngineConfig {
        await_backlog: true,
        ..cfg()
    };
    let mut h = Harness::with(config, &[]);
    h.heartbeat("w1", 4, 4096, &[], &[("j", "t1"), ("j", "t2")]);
    h.step(Event::AdoptStored {
        worker: WorkerId::new("w1").unwrap(),
        dispatch: Box::new(old.clone()),
        seq: 4,
        resize: Some(resize),
    });
    h.step(Event::BacklogRead);
    h
}
