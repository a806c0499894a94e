//! A new leader takes over what an earlier one dispatched: from heartbeats, and from a
//! stored dispatch when an action message comes back.

use super::*;

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
