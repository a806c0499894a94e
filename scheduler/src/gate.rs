//! The intake gate: a bound on the action messages the scheduler holds in memory (queued or
//! being dispatched), by count and by bytes. When either is reached the intake stops pulling
//! from the stream until the engine lets some go; what is not pulled stays stored in
//! JetStream, in order, and is counted as the stream backlog. Nothing is refused or dropped.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use tokio::sync::Notify;

/// Shared by the state task (which holds the messages) and the intake (which waits).
#[derive(Debug)]
pub(crate) struct Gate {
    max_count: usize,
    max_bytes: u64,
    count: AtomicUsize,
    bytes: AtomicU64,
    room: Notify,
}

impl Gate {
    pub(crate) fn new(max_count: usize, max_bytes: u64) -> Self {
        Self {
            max_count: max_count.max(1),
            max_bytes: max_bytes.max(1),
            count: AtomicUsize::new(0),
            bytes: AtomicU64::new(0),
            room: Notify::new(),
        }
    }

    /// Whether one more message may be taken in.
    pub(crate) fn has_room(&self) -> bool {
        self.count.load(Ordering::Acquire) < self.max_count
            && self.bytes.load(Ordering::Acquire) < self.max_bytes
    }

    /// Waits until one more message may be taken in. Returns whether it had to wait.
    pub(crate) async fn wait_for_room(&self) -> bool {
        let mut waited = false;
        loop {
            let notified = self.room.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.has_room() {
                return waited;
            }
            waited = true;
            notified.await;
        }
    }

    /// A message of `bytes` is held.
    pub(crate) fn hold(&self, bytes: usize) {
        self.count.fetch_add(1, Ordering::AcqRel);
        self.bytes.fetch_add(bytes as u64, Ordering::AcqRel);
        crate::metrics::held(self.count(), self.bytes());
    }

    /// A message of `bytes` is let go.
    pub(crate) fn release(&self, bytes: usize) {
        let _ = self
            .count
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |c| {
                Some(c.saturating_sub(1))
            });
        let _ = self
            .bytes
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |b| {
                Some(b.saturating_sub(bytes as u64))
            });
        crate::metrics::held(self.count(), self.bytes());
        if self.has_room() {
            self.room.notify_waiters();
        }
    }

    pub(crate) fn count(&self) -> usize {
        self.count.load(Ordering::Acquire)
    }

    pub(crate) fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::Gate;
    use std::sync::Arc;
    use std::time::Duration;

    #[tokio::test]
    async fn a_full_gate_makes_the_intake_wait_until_a_message_is_let_go() {
        let gate = Arc::new(Gate::new(2, 1 << 20));
        gate.hold(10);
        gate.hold(10);
        assert!(!gate.has_room());
        let waiter = tokio::spawn({
            let gate = gate.clone();
            async move { gate.wait_for_room().await }
        });
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        gate.release(10);
        let waited = tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("woken")
            .expect("joined");
        assert!(waited);
    }

    #[tokio::test]
    async fn the_byte_bound_holds_as_well_as_the_count() {
        let gate = Gate::new(100, 1_000);
        gate.hold(600);
        assert!(gate.has_room());
        gate.hold(600);
        assert!(!gate.has_room());
        gate.release(600);
        assert!(gate.has_room());
        assert_eq!((gate.count(), gate.bytes()), (1, 600));
        assert!(
            !tokio::time::timeout(Duration::from_secs(1), gate.wait_for_room())
                .await
                .expect("room")
        );
    }
}
