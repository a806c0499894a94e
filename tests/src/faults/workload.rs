//! The workload: trajectories running at once, each a rollout's life: open a sandbox, then
//! steps of exec (which leaves its mark in `/effects/log` and runs for a fifth of a second, so
//! that kills land mid-exec), reward (the replica logs the input) and api (the provider logs
//! the request), then close. A lost or broken sandbox is opened again, as a rollout would.
//! Publishing retries with the same `Nats-Msg-Id` until JetStream acknowledges it; only
//! acknowledged actions are counted.

use super::fleet::{PROVIDER, SERVICE};
use super::Size;
use crate::build::{api, close, exec, open, reward};
use crate::Client;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tangram_shared::{Action, ActionId, ActionResult, ActionSpec, InfraCode, Outcome, RejectCode};
use tokio::task::JoinSet;
use tokio::time::Instant;

/// How long one action may take to get its result, faults included.
const RESULT_WAIT: Duration = Duration::from_secs(180);

/// One acknowledged action and the result its submitter saw.
#[derive(Debug, Clone)]
pub struct Submitted {
    /// The action.
    pub id: ActionId,
    /// `open`, `exec`, `reward`, `api` or `close`.
    pub kind: &'static str,
    /// The result the submitter read, if any came within [`RESULT_WAIT`].
    pub result: Option<ActionResult>,
}

/// How many results have come, and when each came.
#[derive(Debug)]
struct Progress {
    done: AtomicUsize,
    /// Publishes the backlog refused (full), retried.
    refused: AtomicUsize,
    started: Instant,
    at: Mutex<Vec<Instant>>,
    /// When set, every publish waits its turn: a steady rate whatever the lanes.
    pace: Option<tokio::sync::Mutex<tokio::time::Interval>>,
}

impl Progress {
    fn new(rate: Option<f64>) -> Arc<Self> {
        let pace = rate.filter(|r| *r > 0.0).map(|r| {
            let mut i = tokio::time::interval(Duration::from_secs_f64(1.0 / r));
            // Behind after a stall: catch up, so the rate over the run is the rate asked.
            i.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
            tokio::sync::Mutex::new(i)
        });
        Arc::new(Self {
            done: AtomicUsize::new(0),
            refused: AtomicUsize::new(0),
            started: Instant::now(),
            at: Mutex::new(Vec::new()),
            pace,
        })
    }

    /// Waits for the next publish's turn, where the rate is paced.
    async fn turn(&self) {
        if let Some(p) = &self.pace {
            p.lock().await.tick().await;
        }
    }

    fn record(&self) {
        self.done.fetch_add(1, Ordering::Relaxed);
        self.at.lock().expect("progress lock").push(Instant::now());
    }
}

/// A running workload.
#[derive(Debug)]
pub struct Workload {
    tasks: JoinSet<anyhow::Result<Vec<Submitted>>>,
    progress: Arc<Progress>,
    expected: usize,
}

/// What a finished workload leaves.
#[derive(Debug)]
pub struct Finished {
    /// Every acknowledged action.
    pub submitted: Vec<Submitted>,
    /// The longest time with no result coming, from the start to the last result.
    pub longest_stall: Duration,
}

impl Workload {
    /// Starts `size.trajectories` rollouts (no credentials, trajectory ids `t0`, `t1`...).
    pub async fn start(url: &str, job: &str, size: Size) -> anyhow::Result<Self> {
        Self::start_with(url, &Default::default(), job, "", size).await
    }

    /// Starts `size.trajectories` rollouts with credentials; trajectory (and so action) ids
    /// start with `prefix`, so that runs sharing one cluster never share a `Nats-Msg-Id`.
    pub async fn start_with(
        url: &str,
        creds: &tangram_nats::auth::Credentials,
        job: &str,
        prefix: &str,
        size: Size,
    ) -> anyhow::Result<Self> {
        let progress = Progress::new(None);
        let mut tasks = JoinSet::new();
        for t in 0..size.trajectories {
            let client = Client::connect_with(url, job, creds).await?;
            let progress = progress.clone();
            tasks.spawn(trajectory(
                client,
                format!("{prefix}t{t}"),
                size.steps,
                0,
                progress,
            ));
        }
        Ok(Self {
            tasks,
            progress,
            expected: size.trajectories * (2 + 3 * size.steps),
        })
    }

    /// Starts `lanes` rollouts that come and go until `until`: each lane runs trajectories
    /// of `steps` steps one after another (open, steps, close; ids `<lane>g<n>`), every
    /// exec carrying a file of `file_bytes`. With a `rate`, publishes are paced to that many
    /// a second across all lanes (lanes then only bound how many wait at once).
    pub async fn start_soak(
        url: &str,
        job: &str,
        lanes: usize,
        steps: usize,
        file_bytes: usize,
        rate: Option<f64>,
        until: Instant,
    ) -> anyhow::Result<Self> {
        let progress = Progress::new(rate);
        let mut tasks = JoinSet::new();
        for lane in 0..lanes {
            let client = Client::connect(url, job).await?;
            let progress = progress.clone();
            tasks.spawn(async move {
                let mut log = Vec::new();
                let mut n = 0;
                while Instant::now() < until {
                    let traj = format!("l{lane}g{n}");
                    let c = client.clone();
                    log.extend(trajectory(c, traj, steps, file_bytes, progress.clone()).await?);
                    n += 1;
                }
                Ok(log)
            });
        }
        Ok(Self {
            tasks,
            progress,
            expected: usize::MAX,
        })
    }

    /// Results come so far.
    pub fn done(&self) -> usize {
        self.progress.done.load(Ordering::Relaxed)
    }

    /// Publishes refused by a full backlog so far.
    pub fn refused(&self) -> usize {
        self.progress.refused.load(Ordering::Relaxed)
    }

    /// Waits until this fraction of the planned actions has results.
    pub async fn wait_progress(&self, fraction: f64, within: Duration) -> anyhow::Result<()> {
        let want = (self.expected as f64 * fraction) as usize;
        let deadline = Instant::now() + within;
        while self.progress.done.load(Ordering::Relaxed) < want {
            anyhow::ensure!(
                Instant::now() < deadline,
                "the workload made no progress to {want} results within {within:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(())
    }

    /// Waits for every trajectory to end; returns every acknowledged action.
    pub async fn finish(mut self, within: Duration) -> anyhow::Result<Finished> {
        let mut out = Vec::new();
        let deadline = Instant::now() + within;
        while let Some(r) = tokio::time::timeout_at(deadline, self.tasks.join_next())
            .await
            .map_err(|_| anyhow::anyhow!("the workload did not finish within {within:?}"))?
        {
            out.extend(r??);
        }
        let mut at = self.progress.at.lock().expect("progress lock").clone();
        at.sort();
        let mut last = self.progress.started;
        let mut longest_stall = Duration::ZERO;
        for t in at {
            longest_stall = longest_stall.max(t.saturating_duration_since(last));
            last = t;
        }
        Ok(Finished {
            submitted: out,
            longest_stall,
        })
    }
}

async fn trajectory(
    c: Client,
    traj: String,
    steps: usize,
    file_bytes: usize,
    progress: Arc<Progress>,
) -> anyhow::Result<Vec<Submitted>> {
    let job = c.job.to_string();
    let mut log = Vec::new();
    let mut opens = 0;
    let mut need_open = true;
    for step in 0..steps {
        if need_open {
            need_open = !open_sandbox(&c, &job, &traj, &mut opens, &mut log, &progress).await?;
        }
        let id = format!("{traj}-x{step}");
        let script = format!("echo {id} >> /effects/log && sleep 0.2");
        let mut a = exec(&id, &job, &traj, &["sh", "-c", &script], 1, 1);
        if file_bytes > 0 {
            if let ActionSpec::SandboxExec(x) = &mut a.spec {
                x.files.insert("input.txt".into(), "y".repeat(file_bytes));
            }
        }
        let r = submit_and_wait(&c, a, "exec", &mut log, &progress).await?;
        if r.as_ref().is_some_and(sandbox_gone) {
            need_open = true;
        }
        let id = format!("{traj}-r{step}");
        let a = reward(&id, &job, &traj, SERVICE, &[&id]);
        submit_and_wait(&c, a, "reward", &mut log, &progress).await?;
        let id = format!("{traj}-a{step}");
        let mut a = api(&id, &job, &traj, PROVIDER, "/search");
        if let ActionSpec::Api(call) = &mut a.spec {
            call.query.insert("id".into(), id.clone());
        }
        submit_and_wait(&c, a, "api", &mut log, &progress).await?;
    }
    let id = format!("{traj}-close");
    submit_and_wait(&c, close(&id, &job, &traj), "close", &mut log, &progress).await?;
    Ok(log)
}

/// Opens the trajectory's sandbox; true when it is open.
async fn open_sandbox(
    c: &Client,
    job: &str,
    traj: &str,
    opens: &mut u32,
    log: &mut Vec<Submitted>,
    progress: &Progress,
) -> anyhow::Result<bool> {
    *opens += 1;
    let id = format!("{traj}-open{opens}");
    let r = submit_and_wait(c, open(&id, job, traj), "open", log, progress).await?;
    Ok(match r.map(|r| r.outcome) {
        Some(Outcome::Completed { exit_code: 0 }) => true,
        // Still open from before (the loss that prompted this open was of a command).
        Some(Outcome::Rejected {
            code: RejectCode::SandboxExists,
            ..
        }) => true,
        _ => false,
    })
}

/// Whether a result says the sandbox is gone and must be opened again.
fn sandbox_gone(r: &ActionResult) -> bool {
    matches!(
        &r.outcome,
        Outcome::Rejected {
            code: RejectCode::NoSandbox,
            ..
        } | Outcome::InfraError {
            code: InfraCode::SandboxLost | InfraCode::WorkerLost | InfraCode::Shutdown,
            ..
        }
    )
}

/// Publishes until acknowledged (the same `Nats-Msg-Id` each time, so a retry of a publish
/// that was stored is a duplicate JetStream drops), then waits for the result.
async fn submit_and_wait(
    c: &Client,
    a: Action,
    kind: &'static str,
    log: &mut Vec<Submitted>,
    progress: &Progress,
) -> anyhow::Result<Option<ActionResult>> {
    progress.turn().await;
    let deadline = Instant::now() + RESULT_WAIT;
    loop {
        match tokio::time::timeout(Duration::from_secs(5), c.submit(&a)).await {
            Ok(Ok(())) => break,
            Ok(Err(e)) if e.to_string().contains("maximum") => {
                if progress.refused.fetch_add(1, Ordering::Relaxed) == 0 {
                    eprintln!("workload: a publish was refused: {e:#}");
                }
                if Instant::now() >= deadline {
                    return Ok(None);
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            _ if Instant::now() < deadline => tokio::time::sleep(Duration::from_millis(250)).await,
            // Never acknowledged: not counted (it may still run; nobody was promised it).
            _ => return Ok(None),
        }
    }
    let mut result = None;
    while Instant::now() < deadline {
        let left = deadline.saturating_duration_since(Instant::now());
        match c.result(&a.id, left.min(Duration::from_secs(20))).await {
            Ok(r) => {
                result = Some(r);
                break;
            }
            // NATS may be down or the read may time out; read again until the deadline.
            Err(_) => tokio::time::sleep(Duration::from_millis(250)).await,
        }
    }
    progress.record();
    log.push(Submitted {
        id: a.id.clone(),
        kind,
        result: result.clone(),
    });
    Ok(result)
}
