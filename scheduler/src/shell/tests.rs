//! The state task through its seam: a real engine, the in-memory outbox, the test playing
//! the intake (messages held in the gate) and the dispatcher (stores reported back), on
//! paused time. What is checked is how the shell carries out the engine's effects: the
//! order of a rejection's dead letter, result and ack; the gate given back; results and
//! fence records tried while the lease holds and not after; queued actions handed back and
//! dispatches seen through at shutdown.

use super::*;
use crate::channels::Publish;
use crate::gate::Gate;
use crate::outbox::fake::{Call, Fake};
use tangram_core::engine::Arrival;
use tangram_core::EngineConfig;
use tangram_shared::codec::Encoding;
use tangram_shared::{
    Action, ActionId, ActionSpec, CpuRange, Heartbeat, JobId, RejectCode, SandboxExec, SandboxOpen,
    TrajectoryId, WorkerId,
};
use tokio::task::JoinHandle;

/// A shell running on a fake outbox.
struct Rig {
    fake: Arc<Fake>,
    tx: mpsc::Sender<Input>,
    dispatched: mpsc::UnboundedReceiver<Publish>,
    gate: Arc<Gate>,
    fence: Arc<Fence>,
    shutdown: CancellationToken,
    shell: JoinHandle<()>,
}

fn rig() -> Rig {
    let engine = Engine::new(EngineConfig {
        settle_ms: 0,
        ..EngineConfig::default()
    })
    .expect("a known policy");
    let fake = Arc::new(Fake::default());
    let (tx, rx) = mpsc::channel(1024);
    let (dispatches, dispatched) = mpsc::unbounded_channel();
    // Renewed for the test's whole length unless a test revokes it.
    let fence = Fence::since(Duration::from_secs(24 * 3600), Instant::now());
    let gate = Arc::new(Gate::new(100, 1 << 20));
    let mut shell = Shell::new(
        engine,
        ShellIo {
            outbox: fake.clone(),
            to_self: tx.clone(),
            dispatches,
            fence: fence.clone(),
            tasks: TaskTracker::new(),
            gate: gate.clone(),
        },
    );
    let shutdown = CancellationToken::new();
    let stop = shutdown.clone();
    let shell = tokio::spawn(async move { shell.run(rx, stop).await });
    Rig {
        fake,
        tx,
        dispatched,
        gate,
        fence,
        shutdown,
        shell,
    }
}

fn action(id: &str, trajectory: &str, spec: ActionSpec) -> Action {
    Action {
        queue_timeout_ms: None,
        id: ActionId::new(id).unwrap(),
        job: JobId::new("j").unwrap(),
        trajectory: TrajectoryId::new(trajectory).unwrap(),
        timeout_ms: 60_000,
        spec,
    }
}

fn open(id: &str, trajectory: &str) -> Action {
    action(
        id,
        trajectory,
        ActionSpec::SandboxOpen(SandboxOpen::default()),
    )
}

fn exec(id: &str, trajectory: &str) -> Action {
    action(
        id,
        trajectory,
        ActionSpec::SandboxExec(SandboxExec {
            argv: vec!["true".into()],
            cpus: CpuRange { min: 1, max: 1 },
            files: Default::default(),
            env: Default::default(),
            stdin: None,
        }),
    )
}

fn heartbeat(worker: &str, mem_mb: u64) -> Event {
    Event::Heartbeat(Box::new(Heartbeat {
        worker: WorkerId::new(worker).unwrap(),
        instance: "i1".into(),
        seq: 0,
        interval_ms: 1_000,
        cores: 4,
        mem_mb,
        running: vec![],
        finished: vec![],
        dispatch_seq: 0,
        known_epoch: 0,
        sandboxes: vec![],
        draining: false,
        gpus: None,
        services: vec![],
        providers: vec![],
        warm: None,
        images: vec![],
        resized: Default::default(),
    }))
}

impl Rig {
    /// Hands the shell an action message at stream sequence `seq`, held in the gate as the
    /// intake holds it.
    async fn submit(&self, seq: u64, a: Action) {
        let payload = bytes::Bytes::from(serde_json::to_vec(&a).unwrap());
        self.gate.hold(payload.len());
        let msg = Incoming::Fake {
            sequence: seq,
            subject: format!("tangram.v1.action.{}.{}", a.job, a.id),
            payload,
        };
        let event = Event::Arrived(Box::new(Arrival {
            action: a,
            encoding: Encoding::Json,
            submitted_at_us: 0,
            delivery: seq,
            seen: false,
            model: None,
            dispatched: None,
            bytes: 0,
            redelivered: false,
        }));
        self.tx
            .send(Input::Message(Box::new(msg), event))
            .await
            .unwrap();
    }

    async fn engine(&self, event: Event) {
        self.tx.send(Input::Engine(event)).await.unwrap();
    }

    /// The next dispatch handed to the dispatcher.
    async fn next_dispatch(&mut self) -> Outgoing {
        loop {
            match self.dispatched.recv().await.expect("the shell runs") {
                Publish::Dispatch(out) => return out,
                Publish::Regrant { .. } => {}
            }
        }
    }

    /// Reports a dispatch stored, as the dispatcher does.
    async fn stored(&self, out: &Outgoing) {
        self.engine(Event::DispatchStored {
            id: out.dispatch.action.id.clone(),
            attempt: out.dispatch.attempt,
            seq: 1,
        })
        .await;
    }
}

fn count(calls: &[Call], f: impl Fn(&Call) -> bool) -> usize {
    calls.iter().filter(|c| f(c)).count()
}

#[tokio::test(start_paused = true)]
async fn a_rejection_is_dead_lettered_and_its_result_stored_before_the_message_is_acked() {
    let r = rig();
    // An exec for a trajectory with no sandbox: rejected at once.
    r.submit(7, exec("x1", "t1")).await;
    let calls = r
        .fake
        .until(|c| c.contains(&Call::Answer(7, Answer::Ack)))
        .await;
    assert_eq!(
        calls,
        vec![
            Call::DeadLetter(RejectCode::NoSandbox, Some("x1".into())),
            Call::StoreResult(ActionId::new("x1").unwrap(), true),
            Call::Answer(7, Answer::Ack),
        ]
    );
    // The message left the gate.
    assert_eq!((r.gate.count(), r.gate.bytes()), (0, 0));
}

#[tokio::test(start_paused = true)]
async fn a_rejection_whose_result_is_not_stored_is_handed_back_not_acked() {
    let r = rig();
    r.fake
        .refuse_results
        .store(1, std::sync::atomic::Ordering::SeqCst);
    r.submit(3, exec("x1", "t1")).await;
    let calls = r
        .fake
        .until(|c| c.iter().any(|x| matches!(x, Call::Answer(3, _))))
        .await;
    assert_eq!(
        calls,
        vec![
            Call::DeadLetter(RejectCode::NoSandbox, Some("x1".into())),
            Call::StoreResult(ActionId::new("x1").unwrap(), false),
            Call::Answer(3, Answer::Nak),
        ]
    );
    assert_eq!(r.gate.count(), 0);
}

/// A worker lost while an open it was given runs: the engine settles the open on its behalf
/// and fences the instance. The shell stores the result until it is taken (then forgets the
/// dispatch), and retries the fence record with backoff.
#[tokio::test(start_paused = true)]
async fn results_and_fence_records_for_a_lost_worker_are_retried_until_stored() {
    let mut r = rig();
    r.fake
        .refuse_results
        .store(2, std::sync::atomic::Ordering::SeqCst);
    r.fake
        .refuse_fences
        .store(2, std::sync::atomic::Ordering::SeqCst);
    r.engine(heartbeat("w1", 4096)).await;
    r.submit(1, open("o1", "t1")).await;
    let out = r.next_dispatch().await;
    assert_eq!(out.worker.as_str(), "w1");
    r.stored(&out).await;
    // Stored: the message is acked and leaves the gate.
    r.fake
        .until(|c| c.contains(&Call::Answer(1, Answer::Ack)))
        .await;
    assert_eq!(r.gate.count(), 0);
    // No more heartbeats: past its grace (3 s) the worker is lost.
    let o1 = ActionId::new("o1").unwrap();
    let calls = r
        .fake
        .until(|c| {
            c.contains(&Call::Forget(o1.clone()))
                && c.iter().any(|x| matches!(x, Call::PutFence(_, _, true)))
        })
        .await;
    let results: Vec<&Call> = calls
        .iter()
        .filter(|c| matches!(c, Call::StoreResult(..)))
        .collect();
    assert_eq!(
        results,
        vec![
            &Call::StoreResult(o1.clone(), false),
            &Call::StoreResult(o1.clone(), false),
            &Call::StoreResult(o1.clone(), true),
        ]
    );
    let fences: Vec<bool> = calls
        .iter()
        .filter_map(|c| match c {
            Call::PutFence(w, i, ok) if w.as_str() == "w1" && i == "i1" => Some(*ok),
            _ => None,
        })
        .collect();
    assert_eq!(fences, vec![false, false, true]);
}

/// A scheduler whose lease may have passed stops trying: a result or fence record refused
/// once is left to the next leader.
#[tokio::test(start_paused = true)]
async fn a_scheduler_that_lost_its_fence_stops_storing_for_workers() {
    let mut r = rig();
    r.fake
        .refuse_results
        .store(1_000, std::sync::atomic::Ordering::SeqCst);
    r.fake
        .refuse_fences
        .store(1_000, std::sync::atomic::Ordering::SeqCst);
    r.engine(heartbeat("w1", 4096)).await;
    r.submit(1, open("o1", "t1")).await;
    let out = r.next_dispatch().await;
    r.stored(&out).await;
    let both = |c: &[Call]| {
        count(c, |x| matches!(x, Call::StoreResult(..))) >= 1
            && count(c, |x| matches!(x, Call::PutFence(..))) >= 1
    };
    r.fake.until(both).await;
    r.fence.revoke();
    let before = r.fake.calls();
    tokio::time::sleep(Duration::from_secs(120)).await;
    let after = r.fake.calls();
    // At most the attempt under way when the fence fell finishes; none starts after.
    let tries = |c: &[Call], f: fn(&Call) -> bool| count(c, f);
    let is_result: fn(&Call) -> bool = |x| matches!(x, Call::StoreResult(..));
    let is_fence: fn(&Call) -> bool = |x| matches!(x, Call::PutFence(..));
    assert!(
        tries(&after, is_result) <= tries(&before, is_result) + 1,
        "{after:?}"
    );
    assert_eq!(
        tries(&after, is_fence),
        tries(&before, is_fence),
        "{after:?}"
    );
    assert!(!after.iter().any(|c| matches!(c, Call::Forget(_))));
}

/// At shutdown, what waits is handed back at once (nak) and a dispatch already handed out
/// is seen through: its store, reported within the drain, acks its message.
#[tokio::test(start_paused = true)]
async fn stopping_hands_back_what_waits_and_sees_dispatches_through() {
    let mut r = rig();
    // Room for one sandbox: the second open waits.
    r.engine(heartbeat("w1", 512)).await;
    r.submit(1, open("o1", "t1")).await;
    let out = r.next_dispatch().await;
    r.submit(2, open("o2", "t2")).await;
    r.shutdown.cancel();
    r.fake
        .until(|c| c.contains(&Call::Answer(2, Answer::Nak)))
        .await;
    assert!(
        !r.shell.is_finished(),
        "the shell waits for the dispatch handed out"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    r.stored(&out).await;
    r.shell.await.unwrap();
    let calls = r.fake.calls();
    assert_eq!(
        calls
            .iter()
            .filter(|c| matches!(c, Call::Answer(..)))
            .collect::<Vec<_>>(),
        vec![&Call::Answer(2, Answer::Nak), &Call::Answer(1, Answer::Ack)]
    );
    assert_eq!((r.gate.count(), r.gate.bytes()), (0, 0));
}

/// A dispatch whose outcome never comes does not hold a stopping scheduler for ever.
#[tokio::test(start_paused = true)]
async fn stopping_waits_at_most_the_drain_for_a_dispatch_outcome() {
    let mut r = rig();
    r.engine(heartbeat("w1", 4096)).await;
    r.submit(1, open("o1", "t1")).await;
    let _out = r.next_dispatch().await;
    let t0 = Instant::now();
    r.shutdown.cancel();
    r.shell.await.unwrap();
    let waited = t0.elapsed();
    assert!(
        waited >= DISPATCH_DRAIN && waited < DISPATCH_DRAIN + Duration::from_secs(1),
        "{waited:?}"
    );
    // Its message is neither acked nor handed back: the next leader finds its dispatch.
    assert!(!r
        .fake
        .calls()
        .iter()
        .any(|c| matches!(c, Call::Answer(1, _))));
}
