//! The bench's load: its actions, a reader of their results, the ways it submits them
//! (concurrently, or trajectory by trajectory) and what the stream stored for them.

use super::*;

pub(super) fn exec_action(id: &str, trajectory: &str) -> Action {
    Action {
        queue_timeout_ms: None,
        id: ActionId(id.into()),
        job: JobId(JOB.into()),
        trajectory: TrajectoryId(trajectory.into()),
        timeout_ms: ACTION_WAIT.as_millis() as u64,
        spec: ActionSpec::SandboxExec(SandboxExec {
            argv: vec!["true".into()],
            cpus: CpuRange { min: 1, max: 1 },
            files: BTreeMap::new(),
            env: BTreeMap::new(),
            stdin: None,
        }),
    }
}

pub(super) fn open_action(id: &str, trajectory: &str) -> Action {
    Action {
        queue_timeout_ms: None,
        id: ActionId(id.into()),
        job: JobId(JOB.into()),
        trajectory: TrajectoryId(trajectory.into()),
        timeout_ms: ACTION_WAIT.as_millis() as u64,
        spec: ActionSpec::SandboxOpen(SandboxOpen {
            memory_mb: SANDBOX_MB,
            workdir_mb: 16,
            ..Default::default()
        }),
    }
}

type Waiters = Arc<Mutex<HashMap<ActionId, oneshot::Sender<(Instant, ActionResult)>>>>;

/// One subscription to the bench job's results, handing each to whoever waits for it, with the
/// moment it arrived.
#[derive(Debug)]
pub(super) struct ResultReader {
    waiters: Waiters,
    _task: tokio::task::JoinSet<()>,
}

impl ResultReader {
    pub(super) async fn start(client: &async_nats::Client) -> anyhow::Result<Self> {
        let mut sub = client
            .subscribe(format!("{}.result.{JOB}.>", subject::PREFIX))
            .await?;
        let waiters: Waiters = Arc::default();
        let w = waiters.clone();
        let mut task = tokio::task::JoinSet::new();
        task.spawn(async move {
            while let Some(m) = sub.next().await {
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
                let waiter = w.lock().expect("lock").remove(&r.id);
                if let Some(tx) = waiter {
                    let _ = tx.send((at, r));
                }
            }
        });
        Ok(Self {
            waiters,
            _task: task,
        })
    }

    fn expect(&self, id: &ActionId) -> oneshot::Receiver<(Instant, ActionResult)> {
        let (tx, rx) = oneshot::channel();
        self.waiters.lock().expect("lock").insert(id.clone(), tx);
        rx
    }
}

/// Publishes `a` (waiting for JetStream to store it) and waits for its result; returns the
/// time from publishing to the result in hand.
pub(super) async fn submit_and_wait(
    js: &jetstream::Context,
    results: &ResultReader,
    a: &Action,
) -> anyhow::Result<(Duration, ActionResult)> {
    let rx = results.expect(&a.id);
    let mut headers = async_nats::HeaderMap::new();
    headers.insert(subject::HEADER_MSG_ID, a.id.as_str());
    let t0 = Instant::now();
    js.publish_with_headers(
        subject::action(&a.job, a.kind()),
        headers,
        codec::encode(a, Encoding::Msgpack)?.into(),
    )
    .await?
    .await
    .context("the action was not stored")?;
    let (at, r) = tokio::time::timeout(ACTION_WAIT, rx)
        .await
        .with_context(|| format!("no result for {} within {ACTION_WAIT:?}", a.id))?
        .context("the result reader stopped")?;
    Ok((at - t0, r))
}

/// Runs `actions` with at most `limit` in flight, in any order.
pub(super) async fn run_concurrently(
    js: &jetstream::Context,
    results: &ResultReader,
    actions: Vec<Action>,
    limit: usize,
    within: Duration,
) -> anyhow::Result<Vec<(Duration, ActionResult)>> {
    let deadline = Instant::now() + within;
    let mut pending = actions.into_iter();
    let mut running = FuturesUnordered::new();
    let mut out = Vec::new();
    loop {
        while running.len() < limit {
            let Some(a) = pending.next() else { break };
            running.push(async move { submit_and_wait(js, results, &a).await });
        }
        match tokio::time::timeout_at(deadline, running.next()).await {
            Ok(Some(r)) => out.push(r?),
            Ok(None) => return Ok(out),
            Err(_) => bail!("{} actions still running after {within:?}", running.len()),
        }
    }
}

/// Runs `actions`, one at a time per trajectory, `trajectories` at once: a trajectory's
/// sandbox takes one command at a time, as a rollout would send them.
pub(super) async fn run_by_trajectory(
    js: &jetstream::Context,
    results: &ResultReader,
    actions: Vec<Action>,
    trajectories: usize,
    within: Duration,
) -> anyhow::Result<Vec<(Duration, ActionResult)>> {
    let mut lanes: Vec<Vec<Action>> = vec![Vec::new(); trajectories];
    for (i, a) in actions.into_iter().enumerate() {
        lanes[i % trajectories].push(a);
    }
    let deadline = Instant::now() + within;
    let lanes = lanes.into_iter().map(|lane| async move {
        let mut out = Vec::with_capacity(lane.len());
        for a in lane {
            if Instant::now() > deadline {
                break;
            }
            out.push(submit_and_wait(js, results, &a).await?);
        }
        anyhow::Ok(out)
    });
    let mut out = Vec::new();
    for lane in futures::future::join_all(lanes).await {
        out.extend(lane?);
    }
    Ok(out)
}

/// Messages each Tangram stream has taken so far (its last sequence).
pub(super) async fn stream_writes(
    js: &jetstream::Context,
) -> anyhow::Result<BTreeMap<&'static str, u64>> {
    let mut out = BTreeMap::new();
    for name in [
        subject::ACTIONS_STREAM,
        subject::DISPATCH_STREAM,
        subject::RESULTS_STREAM,
        subject::DEADLETTER_STREAM,
    ] {
        let mut s = js.get_stream(name).await?;
        out.insert(name, s.info().await?.state.last_sequence);
    }
    Ok(out)
}

/// How many results the results stream holds per action id of the bench job.
pub(super) async fn results_in_stream(
    js: &jetstream::Context,
    job: &JobId,
    within: Duration,
) -> anyhow::Result<HashMap<String, usize>> {
    let stream = js.get_stream(subject::RESULTS_STREAM).await?;
    let prefix = format!("{}.result.{job}.", subject::PREFIX);
    let consumer = stream
        .create_consumer(consumer::pull::OrderedConfig {
            filter_subject: format!("{prefix}>"),
            ..Default::default()
        })
        .await?;
    let mut counts = HashMap::new();
    if consumer.cached_info().num_pending == 0 {
        return Ok(counts);
    }
    let mut messages = consumer.messages().await?;
    let deadline = Instant::now() + within;
    loop {
        let m = tokio::time::timeout_at(deadline, messages.next())
            .await
            .context("reading the results stream back took too long")?
            .context("the results stream ended")??;
        let id = m.subject.as_str().strip_prefix(&prefix).unwrap_or_default();
        *counts.entry(id.to_string()).or_insert(0) += 1;
        if m.info().map_err(|e| anyhow::anyhow!("{e}"))?.pending == 0 {
            return Ok(counts);
        }
    }
}
