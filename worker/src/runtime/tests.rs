//! The action path on paused time with in-memory fakes: no NATS, no Docker, no sleeps.

use super::admission::{Admissions, Verdict};
use super::intake::{AckError, Delivery, ResultSink};
use super::{serve, Worker};
use crate::config::RawConfig;
use crate::providers::{FakeProviders, ProviderConfig};
use crate::sandbox::InMemorySandboxes;
use crate::services::FakeReplicas;
use futures::future::BoxFuture;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tangram_shared::codec::{self, Encoding};
use tangram_shared::{
    Action, ActionId, ActionResult, ActionSpec, ChunkRef, CpuRange, Dispatch, GpuRoute, Grant,
    InfraCode, JobId, Outcome, RejectCode, SandboxClose, SandboxExec, SandboxOpen, TrajectoryId,
};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Far longer than anything a test waits for: reaching it means the awaited thing never came.
const NEVER: Duration = Duration::from_secs(600);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ack {
    Done,
    Progress,
}

/// Acks by delivery tag, in order.
type AckLog = Arc<Mutex<Vec<(String, Ack)>>>;

struct FakeDelivery {
    tag: String,
    subject: String,
    payload: Vec<u8>,
    redelivered: bool,
    /// Its stream sequence (0: unknown).
    seq: u64,
    acks: AckLog,
}

impl Delivery for FakeDelivery {
    fn payload(&self) -> &[u8] {
        &self.payload
    }
    fn subject(&self) -> &str {
        &self.subject
    }
    fn redelivered(&self) -> bool {
        self.redelivered
    }
    fn stream_seq(&self) -> u64 {
        self.seq
    }
    fn ack(&self) -> BoxFuture<'_, Result<(), AckError>> {
        self.acks
            .lock()
            .unwrap()
            .push((self.tag.clone(), Ack::Done));
        Box::pin(async { Ok(()) })
    }
    fn progress(&self) -> BoxFuture<'_, Result<(), AckError>> {
        self.acks
            .lock()
            .unwrap()
            .push((self.tag.clone(), Ack::Progress));
        Box::pin(async { Ok(()) })
    }
}

#[derive(Default)]
struct Results {
    all: Mutex<Vec<ActionResult>>,
    added: tokio::sync::Notify,
    /// The epoch the fake KV holds (`None`: unreadable).
    epoch: Mutex<Option<u64>>,
    /// Refusal records: (action, reason).
    refused: Mutex<Vec<(String, &'static str)>>,
    /// The instance the fake fence record names.
    fence: Mutex<Option<String>>,
    /// While set, every publish fails (NATS unreachable).
    down: std::sync::atomic::AtomicBool,
    /// Publishes that failed.
    failed: std::sync::atomic::AtomicUsize,
}

impl ResultSink for Results {
    fn cordon_record<'a>(
        &'a self,
        _worker: &'a tangram_shared::WorkerId,
    ) -> BoxFuture<'a, Option<tangram_shared::status::CordonRecord>> {
        Box::pin(async { None })
    }

    fn fence_record<'a>(
        &'a self,
        _worker: &'a tangram_shared::WorkerId,
    ) -> BoxFuture<'a, Option<String>> {
        let f = self.fence.lock().unwrap().clone();
        Box::pin(async move { f })
    }

    fn stored_epoch(&self) -> BoxFuture<'_, Option<u64>> {
        let e = *self.epoch.lock().unwrap();
        Box::pin(async move { e })
    }

    fn refuse<'a>(&'a self, r: super::intake::Refusal<'a>) -> BoxFuture<'a, ()> {
        self.refused
            .lock()
            .unwrap()
            .push((r.action.to_string(), r.reason));
        Box::pin(async {})
    }

    fn publish<'a>(
        &'a self,
        result: &'a ActionResult,
        _encoding: Encoding,
    ) -> BoxFuture<'a, Result<(), tangram_nats::PublishError>> {
        use std::sync::atomic::Ordering;
        if self.down.load(Ordering::SeqCst) {
            self.failed.fetch_add(1, Ordering::SeqCst);
            return Box::pin(async {
                // As the real sink does, after its round of tries.
                tokio::time::sleep(Duration::from_secs(25)).await;
                Err(tangram_nats::PublishError::Publish {
                    attempts: 9,
                    source: async_nats::jetstream::context::PublishError::new(
                        async_nats::jetstream::context::PublishErrorKind::TimedOut,
                    ),
                })
            });
        }
        self.all.lock().unwrap().push(result.clone());
        self.added.notify_waiters();
        Box::pin(async { Ok(()) })
    }
}

impl Results {
    fn of(&self, id: &str) -> Vec<ActionResult> {
        let all = self.all.lock().unwrap();
        all.iter()
            .filter(|r| r.id.as_str() == id)
            .cloned()
            .collect()
    }

    /// The result of `id`, once published.
    async fn wait(&self, id: &str) -> ActionResult {
        let deadline = Instant::now() + NEVER;
        loop {
            let added = self.added.notified();
            if let Some(r) = self.of(id).pop() {
                return r;
            }
            tokio::time::timeout_at(deadline, added)
                .await
                .unwrap_or_else(|_| panic!("no result for {id}"));
        }
    }
}

struct Harness {
    worker: Arc<Worker>,
    sandboxes: Arc<InMemorySandboxes>,
    results: Arc<Results>,
    acks: AckLog,
    intake: mpsc::Sender<Box<dyn Delivery>>,
    shutdown: CancellationToken,
    tasks: TaskTracker,
}

fn config(extra: RawConfig) -> crate::Config {
    RawConfig {
        id: Some("w-test".into()),
        cores: Some("0-1".into()),
        shutdown_grace_ms: Some(5_000),
        ..Default::default()
    }
    .merge(extra)
    .validate()
    .expect("test config")
}

impl Harness {
    fn start() -> Self {
        Self::with(RawConfig::default(), None, None)
    }

    fn with(
        extra: RawConfig,
        services: Option<Arc<FakeReplicas>>,
        providers: Option<Arc<FakeProviders>>,
    ) -> Self {
        let sandboxes = Arc::new(InMemorySandboxes::with_sleep());
        let results = Arc::new(Results::default());
        let worker = Arc::new(Worker::new(
            config(extra),
            Some(sandboxes.clone()),
            services.map(|s| s as _),
            providers.map(|p| p as _),
            results.clone(),
            None,
        ));
        let (tx, rx) = mpsc::channel::<Box<dyn Delivery>>(16);
        let intake =
            futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|d| (d, rx)) });
        let shutdown = CancellationToken::new();
        let tasks = TaskTracker::new();
        tasks.spawn(serve(worker.clone(), Box::pin(intake), shutdown.clone()));
        tasks.close();
        Self {
            worker,
            sandboxes,
            results,
            acks: AckLog::default(),
            intake: tx,
            shutdown,
            tasks,
        }
    }

    async fn deliver(&self, tag: &str, d: &Dispatch, redelivered: bool) {
        let delivery = FakeDelivery {
            tag: tag.to_string(),
            subject: format!("tangram.v1.dispatch.w.{}", d.action.id),
            payload: codec::encode(d, Encoding::Msgpack).unwrap(),
            redelivered,
            seq: 0,
            acks: self.acks.clone(),
        };
        self.intake
            .send(Box::new(delivery))
            .await
            .unwrap_or_else(|_| panic!("intake closed"));
    }

    /// Delivers a re-size on its dispatch subject, as the worker's consumer reads it.
    async fn deliver_regrant(&self, tag: &str, r: &tangram_shared::Regrant) {
        self.deliver_regrant_at(tag, r, 0).await;
    }

    /// Delivers a re-size at stream sequence `seq`.
    async fn deliver_regrant_at(&self, tag: &str, r: &tangram_shared::Regrant, seq: u64) {
        let delivery = FakeDelivery {
            tag: tag.to_string(),
            subject: format!("tangram.v1.dispatch.w.{}.regrant", r.id),
            payload: codec::encode(r, Encoding::Msgpack).unwrap(),
            redelivered: false,
            seq,
            acks: self.acks.clone(),
        };
        self.intake
            .send(Box::new(delivery))
            .await
            .unwrap_or_else(|_| panic!("intake closed"));
    }

    /// Delivers and waits for the result.
    async fn run(&self, d: &Dispatch) -> ActionResult {
        self.deliver(d.action.id.as_str(), d, false).await;
        self.results.wait(d.action.id.as_str()).await
    }

    fn acks_of(&self, tag: &str) -> Vec<Ack> {
        let acks = self.acks.lock().unwrap();
        acks.iter()
            .filter(|(t, a)| t == tag && *a == Ack::Done)
            .map(|(_, a)| *a)
            .collect()
    }

    fn running(&self) -> usize {
        self.worker.state.lock().unwrap().admissions.running.len()
    }

    /// Waits until `n` actions are running, on tokio's clock.
    async fn until_running(&self, n: usize) {
        let deadline = Instant::now() + NEVER;
        while self.running() != n {
            assert!(Instant::now() < deadline, "never {n} running");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    async fn stop(&self) {
        self.shutdown.cancel();
        tokio::time::timeout(NEVER, self.tasks.wait())
            .await
            .expect("the worker stops");
    }
}

fn action(id: &str, traj: &str, spec: ActionSpec) -> Action {
    Action {
        id: ActionId::new(id).unwrap(),
        job: JobId::new("job1").unwrap(),
        trajectory: TrajectoryId::new(traj).unwrap(),
        timeout_ms: 120_000,
        spec,
    }
}

fn dispatch(epoch: u64, cores: u32, action: Action) -> Dispatch {
    Dispatch {
        epoch,
        attempt: 1,
        action,
        grant: Grant { cores, mem_mb: 256 },
        submitted_at_us: super::unix_us(),
        result_encoding: Encoding::Msgpack,
        instance: None,
        gpu: None,
    }
}

fn open(id: &str, traj: &str) -> Dispatch {
    dispatch(
        1,
        0,
        action(id, traj, ActionSpec::SandboxOpen(SandboxOpen::default())),
    )
}

fn exec(id: &str, traj: &str, argv: &[&str], cores: u32) -> Dispatch {
    let spec = ActionSpec::SandboxExec(SandboxExec {
        argv: argv.iter().map(|s| s.to_string()).collect(),
        cpus: CpuRange {
            min: cores,
            max: cores,
        },
        files: BTreeMap::new(),
        env: BTreeMap::new(),
        stdin: None,
    });
    dispatch(1, cores, action(id, traj, spec))
}

fn completed(r: &ActionResult) -> i32 {
    match &r.outcome {
        Outcome::Completed { exit_code } => *exit_code,
        other => panic!("{}: expected completed, got {other:?}", r.id),
    }
}

fn infra_code(r: &ActionResult) -> InfraCode {
    match &r.outcome {
        Outcome::InfraError { code, .. } => *code,
        other => panic!("{}: expected an infra error, got {other:?}", r.id),
    }
}

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
        action("c1", "t1", ActionSpec::SandboxClose(SandboxClose {})),
    );
    assert_eq!(completed(&h.run(&close).await), 0);
    assert_eq!(h.sandboxes.open_count(), 0);
    let r = h.run(&exec("e2", "t1", &["true"], 1)).await;
    assert_eq!(infra_code(&r), InfraCode::SandboxLost);
    h.stop().await;
}

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
    let hb = super::heartbeat::heartbeat_of(&h.worker, 1, false);
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
    let hb = super::heartbeat::heartbeat_of(&h.worker, 2, false);
    assert_eq!(hb.running, [ActionId::new("long").unwrap()]);
    assert_eq!(
        hb.resized.get(&ActionId::new("long").unwrap()),
        Some(&2),
        "{hb:?}"
    );
    // Taken in: a new leader that found the re-size in the backlog reads this report as
    // the width after it.
    assert_eq!(hb.dispatch_seq, 7, "{hb:?}");
    // One of an older epoch is dropped, and counts as taken in all the same.
    let mut old = widen.clone();
    old.epoch = 0;
    old.grant.cores = 1;
    old.seq = 2;
    h.deliver_regrant_at("old", &old, 9).await;
    h.until_acked("old").await;
    let hb = super::heartbeat::heartbeat_of(&h.worker, 3, false);
    assert_eq!(hb.resized.get(&ActionId::new("long").unwrap()), Some(&2));
    assert_eq!(hb.dispatch_seq, 9, "{hb:?}");
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn shutdown_stops_intake_lets_short_actions_finish_and_kills_the_rest_at_the_deadline() {
    let h = Harness::start(); // grace 5 s
    h.run(&open("o1", "t1")).await;
    h.run(&open("o2", "t2")).await;
    h.deliver("short", &exec("short", "t1", &["sleep", "2"], 1), false)
        .await;
    h.deliver("long", &exec("long", "t2", &["sleep", "60"], 1), false)
        .await;
    h.until_running(2).await;
    let t0 = Instant::now();
    h.shutdown.cancel();
    // Intake stops at once: the worker lets go of its dispatch feed.
    tokio::time::timeout(NEVER, h.intake.closed())
        .await
        .expect("intake closes");
    assert!(h
        .intake
        .send(Box::new(FakeDelivery {
            tag: "late".into(),
            subject: "tangram.v1.dispatch.w.late".into(),
            payload: Vec::new(),
            redelivered: false,
            seq: 0,
            acks: h.acks.clone(),
        }))
        .await
        .is_err());
    tokio::time::timeout(NEVER, h.tasks.wait())
        .await
        .expect("the worker stops");
    assert_eq!(t0.elapsed(), Duration::from_secs(5), "the drain deadline");
    let short = h.results.wait("short").await;
    assert_eq!(completed(&short), 0);
    let long = h.results.wait("long").await;
    assert_eq!(infra_code(&long), InfraCode::Shutdown);
    assert_eq!(h.acks_of("short"), [Ack::Done]);
    assert_eq!(h.acks_of("long"), [Ack::Done]);
    assert!(h.acks_of("late").is_empty());
    // The killed command's sandbox was stopped; every sandbox is gone.
    assert_eq!(h.sandboxes.stopped().len(), 1);
    assert_eq!(h.sandboxes.open_count(), 0);
    assert_eq!(h.running(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_drain_with_nothing_running_ends_at_once() {
    let h = Harness::start();
    h.run(&open("o1", "t1")).await;
    let t0 = Instant::now();
    h.stop().await;
    assert_eq!(t0.elapsed(), Duration::ZERO);
    assert_eq!(h.sandboxes.open_count(), 0);
}

#[tokio::test(start_paused = true)]
async fn reward_and_api_actions_go_through_their_seams() {
    let provider: ProviderConfig = toml::from_str(
        "name = \"search\"\nbase_url = \"http://127.0.0.1:1\"\nrate_per_s = 10.0\nallow = [\"GET /search\"]",
    )
    .unwrap();
    let providers = Arc::new(FakeProviders::new(
        vec![provider],
        200,
        Duration::from_millis(40),
    ));
    let replicas = Arc::new(FakeReplicas::new(
        &["judge"],
        0.5,
        Duration::from_millis(30),
    ));
    let h = Harness::with(
        RawConfig::default(),
        Some(replicas.clone()),
        Some(providers.clone()),
    );
    let api = |id: &str, path: &str| {
        dispatch(
            1,
            0,
            action(
                id,
                "t1",
                ActionSpec::Api(tangram_shared::Api {
                    provider: "search".into(),
                    method: "GET".into(),
                    path: path.into(),
                    query: BTreeMap::new(),
                    body: None,
                    headers: BTreeMap::new(),
                }),
            ),
        )
    };
    let r = h.run(&api("a1", "/search")).await;
    assert_eq!(r.http.as_ref().map(|h| h.status), Some(200), "{r:?}");
    let r = h.run(&api("a2", "/admin")).await;
    assert!(
        matches!(
            r.outcome,
            Outcome::Rejected {
                code: RejectCode::NotAllowed,
                ..
            }
        ),
        "{r:?}"
    );
    assert_eq!(providers.calls(), 1);
    let mut reward = dispatch(
        1,
        0,
        action(
            "r1",
            "t1",
            ActionSpec::Reward(tangram_shared::Reward {
                service: "judge".into(),
                inputs: vec!["x".into(), "y".into()],
                options: BTreeMap::new(),
            }),
        ),
    );
    reward.gpu = Some(GpuRoute {
        service: "judge".into(),
        chunk: ChunkRef {
            group: 0,
            start: 0,
            len: 1,
        },
        restore: false,
        evict: Vec::new(),
    });
    let r = h.run(&reward).await;
    assert_eq!(r.scores, Some(vec![0.5, 0.5]), "{r:?}");
    h.stop().await;
    assert!(replicas.stopped());
}

#[tokio::test(start_paused = true)]
async fn an_action_starts_without_waiting_for_the_timer_wheel() {
    // Regression: the in-progress ack interval's first tick ("now") was awaited before every
    // action ran, which waits for the timer's next millisecond: about 1 ms on every action.
    // Off a millisecond boundary, any such wait shows as time passing on the paused clock.
    let h = Harness::start();
    tokio::time::advance(Duration::from_micros(300)).await;
    let t0 = Instant::now();
    h.run(&open("o1", "t1")).await;
    let r = h.run(&exec("e1", "t1", &["true"], 1)).await;
    assert_eq!(completed(&r), 0);
    assert_eq!(Instant::now(), t0, "an action waited on a timer");
    h.stop().await;
}

impl Harness {
    /// Waits until the delivery tagged `tag` is acked, on tokio's clock.
    async fn until_acked(&self, tag: &str) {
        let deadline = Instant::now() + NEVER;
        while self.acks_of(tag).is_empty() {
            assert!(Instant::now() < deadline, "{tag} never acked");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_fenced_instance_drops_its_sandboxes_and_results_and_refuses_dispatches_addressed_to_it()
{
    let h = Harness::start();
    h.run(&open("o1", "t1")).await;
    let old = h.worker.instance();
    let long = exec("long", "t1", &["sleep", "10"], 1);
    h.deliver("long", &long, false).await;
    h.until_running(1).await;
    // A record naming another (earlier) instance fences nothing that runs.
    assert!(!h.worker.fence("an-earlier-instance").await);
    assert_eq!(h.running(), 1);
    assert!(h.worker.fence(&old).await);
    assert_ne!(h.worker.instance(), old);
    assert_eq!(
        h.sandboxes.open_count(),
        0,
        "the fenced sandboxes are removed"
    );
    assert_eq!(
        h.running(),
        0,
        "heartbeats no longer list what the fenced instance ran"
    );
    // A redelivery of the orphaned action while it still runs is not run again.
    h.deliver("long#2", &long, true).await;
    h.until_acked("long").await;
    assert!(
        h.results.of("long").is_empty(),
        "the scheduler settled it: no second result"
    );
    // Addressed to the fenced instance: refused and recorded, not run.
    let mut stale = exec("stale", "t1", &["true"], 1);
    stale.instance = Some(old.clone());
    h.deliver("stale", &stale, false).await;
    h.until_acked("stale").await;
    assert!(h.results.of("stale").is_empty());
    assert!(h
        .results
        .refused
        .lock()
        .unwrap()
        .contains(&("stale".to_string(), "fenced_instance")));
    // So is one addressed to the earlier instance named before.
    let mut earlier = exec("earlier", "t1", &["true"], 1);
    earlier.instance = Some("an-earlier-instance".into());
    h.deliver("earlier", &earlier, false).await;
    h.until_acked("earlier").await;
    assert!(h.results.of("earlier").is_empty());
    // The new instance runs what is addressed to it.
    let mut fresh = open("o2", "t1");
    fresh.instance = Some(h.worker.instance());
    assert_eq!(completed(&h.run(&fresh).await), 0);
    assert_eq!(h.sandboxes.open_count(), 1);
    h.stop().await;
}

/// Regression: an open whose image pull outlived the open's deadline was settled
/// `worker_lost` by the scheduler, yet the container was created afterwards, listed in
/// heartbeats with its memory never booked, and its late completion stored as a second
/// result. The open's timeout now covers the pull: past it the open is answered `timed_out`
/// and what the creation makes is removed.
#[tokio::test(start_paused = true)]
async fn an_open_whose_creation_outlives_its_timeout_times_out_and_leaves_nothing() {
    let sandboxes = Arc::new(InMemorySandboxes::with_start_delay(Duration::from_secs(5)));
    let results = Arc::new(Results::default());
    let worker = Arc::new(Worker::new(
        config(RawConfig::default()),
        Some(sandboxes.clone()),
        None,
        None,
        results.clone(),
        None,
    ));
    let (tx, rx) = mpsc::channel::<Box<dyn Delivery>>(16);
    let intake =
        futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|d| (d, rx)) });
    let shutdown = CancellationToken::new();
    let tasks = TaskTracker::new();
    tasks.spawn(serve(worker.clone(), Box::pin(intake), shutdown.clone()));
    tasks.close();
    let mut slow = open("slow-open", "t1");
    slow.action.timeout_ms = 1_000;
    let acks = AckLog::default();
    tx.send(Box::new(FakeDelivery {
        tag: "slow-open".into(),
        subject: "tangram.v1.dispatch.w.slow-open".into(),
        payload: codec::encode(&slow, Encoding::Msgpack).unwrap(),
        redelivered: false,
        seq: 0,
        acks: acks.clone(),
    }))
    .await
    .unwrap();
    let t0 = Instant::now();
    let r = results.wait("slow-open").await;
    assert_eq!(r.outcome, Outcome::TimedOut, "{r:?}");
    assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
    // The creation finishes later: what it made is removed, and the worker holds nothing.
    let deadline = Instant::now() + NEVER;
    while sandboxes.open_count() > 0 || Instant::now() < t0 + Duration::from_secs(6) {
        assert!(
            Instant::now() < deadline,
            "the late sandbox was never removed"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(worker.state.lock().unwrap().sandboxes.is_empty());
    assert_eq!(results.of("slow-open").len(), 1, "one result");
    shutdown.cancel();
    tasks.wait().await;
}

/// Regression: a worker gave up a result after about 25 s of failed publishing and acked the
/// dispatch, so an outage longer than that turned a real completion into `worker_lost` (or
/// nothing). Now it keeps trying, keeps the result on disk, leaves the dispatch unacked, and
/// a worker started again on the same state directory publishes the kept result first.
#[tokio::test(start_paused = true)]
async fn a_result_not_stored_before_the_worker_dies_is_kept_on_disk_and_published_at_the_next_start(
) {
    use std::sync::atomic::Ordering;
    let state = tempfile::tempdir().unwrap();
    let raw = || RawConfig {
        state_dir: Some(state.path().display().to_string()),
        ..RawConfig::default()
    };
    let h = Harness::with(raw(), None, None);
    h.results.down.store(true, Ordering::SeqCst);
    let o = open("kept-open", "t1");
    h.deliver("kept-open", &o, false).await;
    // Far past the old 25 s budget: still trying, the dispatch not acked.
    let deadline = Instant::now() + NEVER;
    while h.results.failed.load(Ordering::SeqCst) < 5 {
        assert!(Instant::now() < deadline, "no publishing tries");
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    assert!(
        h.acks_of("kept-open").is_empty(),
        "acked without a stored result"
    );
    let kept = std::fs::read_dir(state.path().join("results"))
        .unwrap()
        .count();
    assert_eq!(kept, 1, "the result is kept on disk");
    // The process dies (its tasks end without storing anything).
    h.worker.hard_stop.cancel();
    h.stop().await;
    assert!(h.results.of("kept-open").is_empty());

    // Started again on the same state directory, NATS back: the kept result goes first.
    let again = Harness::with(raw(), None, None);
    assert_eq!(again.worker.publish_kept().await, 1);
    let r = again.results.wait("kept-open").await;
    assert_eq!(completed(&r), 0, "the real result, not worker_lost: {r:?}");
    assert_eq!(
        std::fs::read_dir(state.path().join("results"))
            .unwrap()
            .count(),
        0,
        "forgotten once stored"
    );
    again.stop().await;
}
