//! The fleet bench's workload: one lane per sandbox, each a trajectory that runs one action at
//! a time. Opens come first (every lane's sandbox), then actions at a paced rate across idle
//! lanes: `sandbox_exec` mostly, and every `churn`-th action of a lane ends its trajectory
//! (close) and starts the next (open), as trajectories come and go. The dispatch subjects are
//! watched too, so each action's time to its dispatch is known.

use super::cluster::{API_PROVIDER, REWARD_SERVICE};
use anyhow::Context as _;
use async_nats::jetstream;
use futures::StreamExt as _;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tangram_shared::codec::{self, Encoding};
use tangram_shared::{
    subject, Action, ActionId, ActionResult, ActionSpec, Api, CpuRange, JobId, Outcome, Reward,
    SandboxClose, SandboxExec, SandboxOpen, TrajectoryId,
};
use tokio::sync::oneshot;
use tokio::time::Instant;

/// The bench's job.
pub const JOB: &str = "fleet";
/// Memory each sandbox reserves, MiB.
pub const SANDBOX_MB: u64 = 16;
/// How long one action may take before it counts unanswered.
const ACTION_WAIT: Duration = Duration::from_secs(60);

/// `true` on one core: the exec whose round trip is all overhead.
pub fn exec_true() -> ActionSpec {
    ActionSpec::SandboxExec(SandboxExec {
        argv: vec!["true".into()],
        cpus: CpuRange { min: 1, max: 1 },
        files: BTreeMap::new(),
        env: BTreeMap::new(),
        stdin: None,
    })
}

/// One action's moments, as the client saw them.
#[derive(Debug, Clone, Copy)]
pub struct Sample {
    /// Published.
    pub published: Instant,
    /// Its PubAck arrived (stored).
    pub stored: Instant,
    /// Its dispatch was seen on the dispatch subject, if it was.
    pub dispatched: Option<Instant>,
    /// Its result arrived.
    pub answered: Instant,
    /// The result was `completed`.
    pub completed: bool,
}

type Waiters = Mutex<HashMap<String, oneshot::Sender<(Instant, bool)>>>;

/// The client side of the bench: publishes and reads results as the job's rollout would,
/// and watches dispatches, asks status and counts results as the operator.
#[derive(Debug)]
pub struct Load {
    js: jetstream::Context,
    observer: async_nats::Client,
    waiters: Arc<Waiters>,
    dispatched: Arc<Mutex<HashMap<String, Instant>>>,
    /// Every action id submitted, in order.
    pub submitted: Mutex<Vec<String>>,
    /// Publishes refused or failed.
    pub refused: std::sync::atomic::AtomicU64,
    /// Actions with no result within the wait.
    pub unanswered: std::sync::atomic::AtomicU64,
    _tasks: tokio::task::JoinSet<()>,
}

impl Load {
    /// Subscribes to the job's results as `rollout` (the seed of the job's rollout role) and,
    /// as `observer` (the operator's), to every dispatch; without seeds, unauthenticated.
    pub async fn start(
        url: &str,
        rollout: Option<&std::path::Path>,
        observer: Option<&std::path::Path>,
    ) -> anyhow::Result<Arc<Self>> {
        let connect = |seed: Option<&std::path::Path>, name: &'static str| {
            let url = url.to_string();
            let creds = seed
                .map(tangram_nats::auth::Credentials::from_seed_file)
                .unwrap_or_default();
            async move {
                let options = creds.options(name)?;
                anyhow::Ok(options.connect(url).await?)
            }
        };
        let client = connect(rollout, "fleet-load").await?;
        let observer = connect(observer, "fleet-observer").await?;
        let js = jetstream::new(client.clone());
        let waiters: Arc<Waiters> = Arc::default();
        let dispatched: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
        let mut tasks = tokio::task::JoinSet::new();
        let mut results = client
            .subscribe(format!("{}.result.{JOB}.>", subject::PREFIX))
            .await?;
        let w = waiters.clone();
        tasks.spawn(async move {
            while let Some(m) = results.next().await {
                let at = Instant::now();
                let enc = Encoding::from_content_type(
                    m.headers
                        .as_ref()
                        .and_then(|h| h.get(subject::HEADER_CONTENT_TYPE))
                        .map(|v| v.as_str()),
                )
                .unwrap_or(Encoding::Msgpack);
                let Ok(r) = codec::decode::<ActionResult>(&m.payload, enc) else {
                    continue;
                };
                let ok = matches!(r.outcome, Outcome::Completed { .. });
                let waiter = w.lock().expect("lock").remove(r.id.as_str());
                if let Some(tx) = waiter {
                    let _ = tx.send((at, ok));
                }
            }
        });
        let mut dispatches = observer
            .subscribe(format!("{}.dispatch.>", subject::PREFIX))
            .await?;
        let d = dispatched.clone();
        tasks.spawn(async move {
            while let Some(m) = dispatches.next().await {
                let at = Instant::now();
                // tangram.v1.dispatch.<worker>.<action-id>; a re-size adds `.regrant`.
                let s = m.subject.as_str();
                if s.ends_with(".regrant") {
                    continue;
                }
                if let Some((_, id)) = s.rsplit_once('.') {
                    d.lock().expect("lock").entry(id.to_string()).or_insert(at);
                }
            }
        });
        client.flush().await?;
        observer.flush().await?;
        Ok(Arc::new(Self {
            js,
            observer,
            waiters,
            dispatched,
            submitted: Mutex::new(Vec::new()),
            refused: Default::default(),
            unanswered: Default::default(),
            _tasks: tasks,
        }))
    }

    /// The operator's connection: status requests, the scheduler's bucket.
    pub fn client(&self) -> &async_nats::Client {
        &self.observer
    }

    /// Publishes `a`, waits for it to be stored and for its result; `None` when it was
    /// refused or got no result in time (both counted).
    pub async fn submit(&self, a: Action) -> Option<Sample> {
        use std::sync::atomic::Ordering::Relaxed;
        let id = a.id.as_str().to_string();
        let (tx, rx) = oneshot::channel();
        self.waiters.lock().expect("lock").insert(id.clone(), tx);
        self.submitted.lock().expect("lock").push(id.clone());
        let mut headers = async_nats::HeaderMap::new();
        headers.insert(subject::HEADER_MSG_ID, id.as_str());
        let published = Instant::now();
        let stored = async {
            let payload = codec::encode(&a, Encoding::Msgpack)?;
            self.js
                .publish_with_headers(subject::action(&a.job, a.kind()), headers, payload.into())
                .await?
                .await?;
            anyhow::Ok(Instant::now())
        }
        .await;
        let Ok(stored) = stored else {
            self.refused.fetch_add(1, Relaxed);
            self.waiters.lock().expect("lock").remove(&id);
            return None;
        };
        let Ok(Ok((answered, completed))) = tokio::time::timeout(ACTION_WAIT, rx).await else {
            self.unanswered.fetch_add(1, Relaxed);
            self.waiters.lock().expect("lock").remove(&id);
            return None;
        };
        let dispatched = self.dispatched.lock().expect("lock").remove(&id);
        Some(Sample {
            published,
            stored,
            dispatched,
            answered,
            completed,
        })
    }

    /// How many results the results stream holds for each submitted id: (exactly one,
    /// none, more than one).
    pub async fn count_results(&self, within: Duration) -> anyhow::Result<(usize, usize, usize)> {
        use async_nats::jetstream::consumer;
        let js = jetstream::new(self.observer.clone());
        let stream = js.get_stream(subject::RESULTS_STREAM).await?;
        let prefix = format!("{}.result.{JOB}.", subject::PREFIX);
        let consumer = stream
            .create_consumer(consumer::pull::OrderedConfig {
                filter_subject: format!("{prefix}>"),
                ..Default::default()
            })
            .await?;
        let mut counts: HashMap<String, usize> = HashMap::new();
        if consumer.cached_info().num_pending > 0 {
            let mut messages = consumer.messages().await?;
            let deadline = Instant::now() + within;
            loop {
                let m = tokio::time::timeout_at(deadline, messages.next())
                    .await
                    .context("reading the results back took too long")?
                    .context("the results stream ended")??;
                let id = m.subject.as_str().strip_prefix(&prefix).unwrap_or_default();
                *counts.entry(id.to_string()).or_insert(0) += 1;
                if m.info().map_err(|e| anyhow::anyhow!("{e}"))?.pending == 0 {
                    break;
                }
            }
        }
        let submitted = self.submitted.lock().expect("lock");
        let one = submitted
            .iter()
            .filter(|id| counts.get(*id) == Some(&1))
            .count();
        let none = submitted
            .iter()
            .filter(|id| !counts.contains_key(*id))
            .count();
        let more = submitted
            .iter()
            .filter(|id| counts.get(*id).is_some_and(|&n| n > 1))
            .count();
        Ok((one, none, more))
    }
}

/// Lanes: one trajectory each, the generation counting the trajectories it has run.
#[derive(Debug)]
pub struct Lanes {
    gens: Mutex<Vec<u32>>,
    steps: Mutex<Vec<u32>>,
    idle: Mutex<VecDeque<usize>>,
    seq: std::sync::atomic::AtomicU64,
    /// Every this many actions a lane's trajectory ends and the next begins.
    churn: u32,
    /// What the other turns are.
    mix: Mix,
    turns: std::sync::atomic::AtomicU64,
}

/// Of the turns that do not end a trajectory, the share of each kind; the rest are execs.
#[derive(Debug, Clone, Copy, Default)]
pub struct Mix {
    /// `reward` actions on the GPU workers' reward service, percent.
    pub reward_pct: u32,
    /// `api` calls through the fleet's provider quota, percent.
    pub api_pct: u32,
}

/// What a paced phase did.
#[derive(Debug, Default)]
pub struct Phase {
    /// Samples of every answered action.
    pub samples: Vec<Sample>,
    /// By kind: actions answered.
    pub by_kind: BTreeMap<&'static str, usize>,
    /// By kind: stored to result, ms.
    pub by_kind_ms: BTreeMap<&'static str, Vec<f64>>,
    /// Ticks that found no idle lane (the fleet was behind the rate).
    pub behind: u64,
    /// Wall time, seconds.
    pub seconds: f64,
}

impl Lanes {
    /// `n` lanes, none open yet.
    pub fn new(n: usize, churn: u32, mix: Mix) -> Arc<Self> {
        Arc::new(Self {
            gens: Mutex::new(vec![0; n]),
            steps: Mutex::new(vec![0; n]),
            idle: Mutex::new((0..n).collect()),
            seq: Default::default(),
            churn: churn.max(2),
            mix,
            turns: Default::default(),
        })
    }

    fn trajectory(&self, lane: usize) -> TrajectoryId {
        let g = self.gens.lock().expect("lock")[lane];
        TrajectoryId(format!("l{lane}-g{g}"))
    }

    fn next_id(&self, what: &str) -> ActionId {
        let n = self.seq.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        ActionId(format!("{what}-{n}").into())
    }

    fn action(&self, lane: usize, what: &str, spec: ActionSpec) -> Action {
        Action {
            queue_timeout_ms: None,
            id: self.next_id(what),
            job: JobId(JOB.into()),
            trajectory: self.trajectory(lane),
            timeout_ms: ACTION_WAIT.as_millis() as u64,
            spec,
        }
    }

    fn open(&self, lane: usize) -> Action {
        self.action(
            lane,
            "open",
            ActionSpec::SandboxOpen(SandboxOpen {
                memory_mb: SANDBOX_MB,
                workdir_mb: 16,
                ..Default::default()
            }),
        )
    }

    fn exec(&self, lane: usize) -> Action {
        self.action(lane, "exec", exec_true())
    }

    /// A reward action scoring one text of the lane's trajectory.
    fn reward(&self, lane: usize) -> Action {
        let text = format!("the answer of trajectory {}", self.trajectory(lane).0);
        self.action(
            lane,
            "reward",
            ActionSpec::Reward(Reward {
                service: REWARD_SERVICE.into(),
                inputs: vec![text],
                options: BTreeMap::new(),
            }),
        )
    }

    /// An api call: a search, as a research agent's tool would make.
    fn api(&self, lane: usize) -> Action {
        let query = [
            ("q".to_string(), format!("sorting lists lane {lane}")),
            ("k".to_string(), "3".to_string()),
        ];
        self.action(
            lane,
            "api",
            ActionSpec::Api(Api {
                provider: API_PROVIDER.into(),
                method: "GET".into(),
                path: "/search".into(),
                query: query.into_iter().collect(),
                body: None,
                headers: BTreeMap::new(),
            }),
        )
    }

    fn close(&self, lane: usize) -> Action {
        self.action(
            lane,
            "close",
            ActionSpec::SandboxClose(SandboxClose::default()),
        )
    }

    /// Opens every lane's sandbox, `in_flight` at a time; the opens' samples.
    pub async fn open_all(self: &Arc<Self>, load: &Arc<Load>, in_flight: usize) -> Vec<Sample> {
        let lanes: Vec<usize> = self.idle.lock().expect("lock").iter().copied().collect();
        let opens = futures::stream::iter(lanes.into_iter().map(|lane| {
            let (load, me) = (load.clone(), self.clone());
            async move { load.submit(me.open(lane)).await }
        }))
        .buffer_unordered(in_flight.max(1));
        opens.filter_map(|s| async move { s }).collect().await
    }

    /// One lane's next turn: an exec, or (every `churn`-th) a close and the next open.
    async fn turn(self: Arc<Self>, load: Arc<Load>, lane: usize) -> Vec<(&'static str, Sample)> {
        let step = {
            let mut steps = self.steps.lock().expect("lock");
            steps[lane] += 1;
            steps[lane]
        };
        let mut out = Vec::new();
        if step % self.churn == 0 {
            if let Some(s) = load.submit(self.close(lane)).await {
                out.push(("sandbox_close", s));
            }
            self.gens.lock().expect("lock")[lane] += 1;
            if let Some(s) = load.submit(self.open(lane)).await {
                out.push(("sandbox_open", s));
            }
        } else {
            let n = self
                .turns
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
                % 100;
            let (kind, action) = if n < u64::from(self.mix.reward_pct) {
                ("reward", self.reward(lane))
            } else if n < u64::from(self.mix.reward_pct + self.mix.api_pct) {
                ("api", self.api(lane))
            } else {
                ("sandbox_exec", self.exec(lane))
            };
            if let Some(s) = load.submit(action).await {
                out.push((kind, s));
            }
        }
        self.idle.lock().expect("lock").push_back(lane);
        out
    }

    /// Starts a turn on an idle lane `rate` times a second for `duration`, then waits for
    /// the turns under way.
    pub async fn run(self: &Arc<Self>, load: &Arc<Load>, rate: f64, duration: Duration) -> Phase {
        const TICK: Duration = Duration::from_millis(10);
        let per_tick = rate * TICK.as_secs_f64();
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
        let mut turns = tokio::task::JoinSet::new();
        let mut phase = Phase::default();
        let mut owed = 0.0;
        let started = Instant::now();
        let take = |phase: &mut Phase, done: Vec<(&'static str, Sample)>| {
            for (kind, s) in done {
                *phase.by_kind.entry(kind).or_insert(0) += 1;
                let took = s.answered.saturating_duration_since(s.stored);
                phase
                    .by_kind_ms
                    .entry(kind)
                    .or_default()
                    .push(took.as_secs_f64() * 1e3);
                phase.samples.push(s);
            }
        };
        while started.elapsed() < duration {
            tick.tick().await;
            owed += per_tick;
            while owed >= 1.0 {
                owed -= 1.0;
                let lane = self.idle.lock().expect("lock").pop_front();
                match lane {
                    Some(lane) => {
                        turns.spawn(self.clone().turn(load.clone(), lane));
                    }
                    None => phase.behind += 1,
                }
            }
            while let Some(Ok(done)) = turns.try_join_next() {
                take(&mut phase, done);
            }
        }
        while let Some(done) = turns.join_next().await {
            if let Ok(done) = done {
                take(&mut phase, done);
            }
        }
        phase.seconds = started.elapsed().as_secs_f64();
        phase
    }

    /// One exec on lane 0, for probing a new leader.
    pub async fn probe(self: &Arc<Self>, load: &Load) -> Option<Sample> {
        load.submit(self.exec(0)).await
    }
}
