//! A fault suite that counts. A mixed workload (sandbox execs, reward and api calls, with
//! the opens and closes around them) runs against a [`Fleet`] of separate processes while
//! one [`Fault`] strikes; afterwards every action the stream acknowledged is classified by
//! its stored results and by its effects where they happen (marks the execs leave in a
//! directory the sandboxes mount, the replica's request log, the provider's request log):
//!
//! - **ok**: exactly one result, and at most one effect (exactly one when the result says
//!   it completed);
//! - **lost**: no result, or a result saying it completed with no effect;
//! - **duplicated**: two results, or two effects.
//!
//! The suite passes only with zero lost and zero duplicated. See docs/RELIABILITY.md.

mod check;
pub mod compose;
mod fleet;
pub mod nemesis;
pub mod proxy;
pub mod soak;
mod workload;

pub use check::{Report, Tally};
pub use fleet::Fleet;
pub use proxy::Proxy;
pub use workload::Workload;

use std::time::Duration;

/// One fault, struck once the workload is a quarter done.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Two schedulers; the leader is SIGKILLed and the standby takes over (a fresh standby
    /// is started after).
    LeaderKill,
    /// One scheduler, SIGKILLed, restarted two seconds later.
    SchedulerRestart,
    /// nats-server SIGKILLed and restarted on its store.
    NatsKill,
    /// nats-server SIGSTOPped for `pause_s`, then continued.
    NatsPause,
    /// A CPU worker SIGKILLed mid-exec, restarted a second later.
    WorkerKill,
    /// A CPU worker cut off from NATS for five seconds (longer than the scheduler waits
    /// before declaring it lost), then healed.
    WorkerPartition,
    /// Two schedulers started at the same moment, before any leads.
    TwoSchedulers,
    /// A CPU worker drained (SIGTERM) under load, restarted once it exited.
    WorkerDrain,
}

impl Fault {
    /// Every fault, in the order the suite runs them.
    pub const ALL: [Fault; 8] = [
        Fault::LeaderKill,
        Fault::SchedulerRestart,
        Fault::NatsKill,
        Fault::NatsPause,
        Fault::WorkerKill,
        Fault::WorkerPartition,
        Fault::TwoSchedulers,
        Fault::WorkerDrain,
    ];

    /// A short name, for tables and flags.
    pub fn name(self) -> &'static str {
        match self {
            Fault::LeaderKill => "leader-kill",
            Fault::SchedulerRestart => "scheduler-restart",
            Fault::NatsKill => "nats-kill",
            Fault::NatsPause => "nats-pause",
            Fault::WorkerKill => "worker-kill",
            Fault::WorkerPartition => "worker-partition",
            Fault::TwoSchedulers => "two-schedulers",
            Fault::WorkerDrain => "worker-drain",
        }
    }

    /// The fault of this name.
    pub fn parse(name: &str) -> Option<Fault> {
        Fault::ALL.into_iter().find(|f| f.name() == name)
    }
}

/// How big a run is.
#[derive(Debug, Clone, Copy)]
pub struct Size {
    /// Trajectories running at once.
    pub trajectories: usize,
    /// Exec, reward and api steps per trajectory (three actions each).
    pub steps: usize,
    /// How long nats-server stays stopped in [`Fault::NatsPause`].
    pub pause_s: u64,
}

impl Size {
    /// About `actions` actions in all.
    pub fn about(actions: usize, trajectories: usize) -> Self {
        let per = actions / trajectories.max(1);
        Self {
            trajectories,
            steps: per.saturating_sub(2).div_ceil(3).max(1),
            pause_s: 20,
        }
    }
}

/// Runs the workload against a fresh fleet while `fault` strikes; returns the counts.
/// Log lines kept as evidence for a run that lost or duplicated something.
pub(super) const EVIDENCE_LINES: usize = 200;

pub async fn run(fault: Fault, size: Size) -> anyhow::Result<Report> {
    let mut fleet = Fleet::start(fault.name()).await?;
    let schedulers = match fault {
        Fault::LeaderKill | Fault::TwoSchedulers => 2,
        _ => 1,
    };
    for _ in 0..schedulers {
        fleet.start_scheduler()?;
    }
    let job = format!("faults-{}", fault.name());
    let client = crate::Client::connect(&fleet.nats.url(), &job).await?;
    let workers = fleet.worker_ids();
    let ids: Vec<&str> = workers.iter().map(String::as_str).collect();
    client
        .wait_for_workers(&ids, Duration::from_secs(60))
        .await?;
    let workload = Workload::start(&fleet.nats.url(), &job, size).await?;
    let started = tokio::time::Instant::now();
    workload
        .wait_progress(0.25, Duration::from_secs(300))
        .await?;
    let struck_at = started.elapsed();
    strike(&mut fleet, &client, fault, size).await?;
    let recovered_at = started.elapsed();
    let finished = workload.finish(Duration::from_secs(600)).await?;
    let effects = check::Effects::read(
        Some(&fleet.effects_log()),
        &fleet.replica_log(),
        fleet.api.seen().into_iter().map(|s| s.target),
    );
    let mut report = check::classify(fault.name(), &effects, &client, finished.submitted).await?;
    if !report.clean() {
        report.evidence = fleet.log_lines_naming(&report.flagged, EVIDENCE_LINES);
    }
    Ok(report.timed(started, struck_at, recovered_at, finished.longest_stall))
}

async fn strike(
    fleet: &mut Fleet,
    client: &crate::Client,
    fault: Fault,
    size: Size,
) -> anyhow::Result<()> {
    const CPU: &str = fleet::CPU_WORKERS[0];
    match fault {
        Fault::LeaderKill => {
            let leader = client
                .leader()
                .await?
                .ok_or_else(|| anyhow::anyhow!("no leader to kill"))?;
            fleet.kill_scheduler(&leader.id)?;
            // Wait for the standby to lead before restoring redundancy, so that the fresh
            // standby does not race it for the lease.
            let standby = fleet
                .schedulers()
                .into_iter()
                .next()
                .ok_or_else(|| anyhow::anyhow!("no standby"))?;
            client
                .wait_for_leader(&standby, Duration::from_secs(10))
                .await?;
            fleet.start_scheduler()?;
        }
        Fault::SchedulerRestart => {
            let id = fleet
                .schedulers()
                .into_iter()
                .next()
                .ok_or_else(|| anyhow::anyhow!("no scheduler"))?;
            fleet.kill_scheduler(&id)?;
            tokio::time::sleep(Duration::from_secs(2)).await;
            fleet.start_scheduler()?;
        }
        Fault::NatsKill => fleet.nats.restart(),
        Fault::NatsPause => {
            fleet.signal_nats(crate::Signal::STOP)?;
            tokio::time::sleep(Duration::from_secs(size.pause_s)).await;
            fleet.signal_nats(crate::Signal::CONT)?;
        }
        Fault::WorkerKill => {
            fleet.kill_worker(CPU)?;
            tokio::time::sleep(Duration::from_secs(1)).await;
            fleet.start_worker(CPU)?;
        }
        Fault::WorkerPartition => {
            fleet.proxy().cut();
            tokio::time::sleep(Duration::from_secs(5)).await;
            fleet.proxy().heal();
        }
        Fault::TwoSchedulers => {
            // Both were started together before the workload; the fault is that neither
            // knew of the other. Kill whichever leads now, to show the other was a true
            // standby and not a second leader.
            if let Some(leader) = client.leader().await? {
                fleet.kill_scheduler(&leader.id)?;
            }
        }
        Fault::WorkerDrain => {
            fleet.signal_worker(CPU, crate::Signal::TERM)?;
            fleet.wait_worker_exit(CPU, Duration::from_secs(30)).await?;
            fleet.start_worker(CPU)?;
        }
    }
    Ok(())
}
