//! An in-memory [`Outbox`] for the shell's tests: it records every call in order, stores
//! what it is given, and refuses as many results or fence records as a test asks.

use super::{Answer, Boxed, DeadLetter, NotStored, Outbox};
use crate::held::Incoming;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;
use tangram_shared::codec::Encoding;
use tangram_shared::{ActionId, ActionResult, Dispatch, RejectCode, WorkerId};
use tokio::sync::Notify;

/// One call, as the fake saw it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Call {
    /// An answer to the message at this stream sequence.
    Answer(u64, Answer),
    /// A dead-letter record: its code and action id.
    DeadLetter(RejectCode, Option<String>),
    /// A result: its action, and whether it was stored.
    StoreResult(ActionId, bool),
    /// Stored dispatches forgotten.
    Forget(ActionId),
    /// A stored dispatch looked up.
    DispatchTo(WorkerId, ActionId),
    /// A fence record: the worker, its instance, and whether it was stored.
    PutFence(WorkerId, String, bool),
    /// An action of the scheduler's own, published.
    Submit(ActionId),
}

/// See the module docs.
#[derive(Default)]
pub(crate) struct Fake {
    calls: Mutex<Vec<Call>>,
    changed: Notify,
    /// Results to refuse (`NotNow`) before storing one.
    pub(crate) refuse_results: AtomicU32,
    /// Fence records to refuse before storing one.
    pub(crate) refuse_fences: AtomicU32,
    /// Stored dispatches, by worker and action.
    pub(crate) dispatches: Mutex<HashMap<(WorkerId, ActionId), Dispatch>>,
}

impl Fake {
    /// The calls so far, in order.
    pub(crate) fn calls(&self) -> Vec<Call> {
        self.calls.lock().unwrap().clone()
    }

    /// Waits until `done` holds of the calls (under paused time, timers run meanwhile).
    pub(crate) async fn until(&self, done: impl Fn(&[Call]) -> bool) -> Vec<Call> {
        loop {
            let changed = self.changed.notified();
            {
                let calls = self.calls.lock().unwrap();
                if done(&calls) {
                    return calls.clone();
                }
            }
            changed.await;
        }
    }

    fn record(&self, call: Call) {
        self.calls.lock().unwrap().push(call);
        self.changed.notify_waiters();
    }

    /// Takes one refusal from `counter`, if any are left.
    fn refuse(counter: &AtomicU32) -> bool {
        counter
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
    }
}

impl Outbox for Fake {
    fn answer<'a>(&'a self, msg: &'a Incoming, answer: Answer) -> Boxed<'a, Result<(), String>> {
        Box::pin(async move {
            self.record(Call::Answer(msg.position().sequence, answer));
            Ok(())
        })
    }

    fn dead_letter(&self, record: DeadLetter) -> Boxed<'_, Result<(), String>> {
        Box::pin(async move {
            self.record(Call::DeadLetter(record.code, record.action));
            Ok(())
        })
    }

    fn store_result<'a>(
        &'a self,
        result: &'a ActionResult,
        _encoding: Encoding,
    ) -> Boxed<'a, Result<(), NotStored>> {
        Box::pin(async move {
            // A real store retries for a while before it gives up.
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            let refused = Self::refuse(&self.refuse_results);
            self.record(Call::StoreResult(result.id.clone(), !refused));
            if refused {
                Err(NotStored::NotNow("refused by the test".into()))
            } else {
                Ok(())
            }
        })
    }

    fn forget_dispatches<'a>(&'a self, id: &'a ActionId) -> Boxed<'a, ()> {
        Box::pin(async move {
            self.dispatches.lock().unwrap().retain(|(_, a), _| a != id);
            self.record(Call::Forget(id.clone()));
        })
    }

    fn dispatch_to<'a>(
        &'a self,
        worker: &'a WorkerId,
        id: &'a ActionId,
    ) -> Boxed<'a, Option<Dispatch>> {
        Box::pin(async move {
            self.record(Call::DispatchTo(worker.clone(), id.clone()));
            self.dispatches
                .lock()
                .unwrap()
                .get(&(worker.clone(), id.clone()))
                .cloned()
        })
    }

    fn submit<'a>(&'a self, action: &'a tangram_shared::Action) -> Boxed<'a, Result<(), String>> {
        Box::pin(async move {
            self.record(Call::Submit(action.id.clone()));
            Ok(())
        })
    }

    fn put_fence<'a>(
        &'a self,
        worker: &'a WorkerId,
        instance: &'a str,
    ) -> Boxed<'a, Result<(), String>> {
        Box::pin(async move {
            let refused = Self::refuse(&self.refuse_fences);
            self.record(Call::PutFence(
                worker.clone(),
                instance.to_string(),
                !refused,
            ));
            if refused {
                Err("refused by the test".into())
            } else {
                Ok(())
            }
        })
    }
}
