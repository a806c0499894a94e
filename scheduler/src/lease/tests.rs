//! When a lease may be taken, and when the fence falls.

use super::*;

fn held(revision: u64, holder: &str) -> Seen {
    Seen::Held {
        revision,
        holder: holder.into(),
    }
}

#[test]
fn a_vacant_lease_is_created_at_once() {
    assert_eq!(
        Watcher::default().observe(&Seen::Vacant, "a", 0, 2000),
        Move::Create
    );
}

#[test]
fn a_lease_is_taken_over_only_after_a_whole_ttl_without_a_renewal() {
    let mut w = Watcher::default();
    assert_eq!(w.observe(&held(5, "b"), "a", 1000, 2000), Move::Wait);
    assert_eq!(w.observe(&held(5, "b"), "a", 2999, 2000), Move::Wait);
    // Renewed: the clock starts again.
    assert_eq!(w.observe(&held(6, "b"), "a", 3000, 2000), Move::Wait);
    assert_eq!(w.observe(&held(6, "b"), "a", 4999, 2000), Move::Wait);
    assert_eq!(w.observe(&held(6, "b"), "a", 5000, 2000), Move::TakeOver(6));
}

#[test]
fn a_scheduler_takes_back_its_own_lease_without_waiting() {
    let mut w = Watcher::default();
    assert_eq!(w.observe(&held(9, "a"), "a", 0, 2000), Move::TakeOver(9));
}

#[test]
fn the_fence_falls_when_renewals_stop() {
    let f = Fence::since(Duration::from_millis(30), Instant::now());
    assert!(f.holds());
    std::thread::sleep(Duration::from_millis(40));
    assert!(!f.holds(), "no renewal for longer than the margin");
    f.renewed_at(f.mark());
    assert!(f.holds());
    f.revoke();
    assert!(!f.holds());
}

#[test]
fn a_late_answer_counts_from_when_the_renewal_was_sent() {
    let f = Fence::since(Duration::from_millis(30), Instant::now());
    let sent = f.mark();
    std::thread::sleep(Duration::from_millis(40));
    f.renewed_at(sent);
    assert!(
        !f.holds(),
        "the answer came after the margin: the lease may be another's already"
    );
    let sent = f.mark();
    f.renewed_at(sent);
    assert!(f.holds());
}
