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
        queue_timeout_ms: None,
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

mod cores;
mod dispatch;
mod lifecycle;
