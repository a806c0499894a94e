//! The nemesis: a randomised schedule of overlapping faults while the workload runs, in the
//! manner of Jepsen's combined nemeses. From a seed, faults are drawn at random moments for
//! random lengths, and each runs as its own task, so that they overlap: the leader or the
//! standby SIGKILLed or SIGSTOPped, a CPU worker SIGKILLed or SIGSTOPped, the partition
//! proxy cutting a worker off (connections reset) or dropping everything it sends and
//! receives (connections kept, nothing crossing), nats-server SIGKILLed (down for a while) or SIGSTOPped for
//! longer than the publish retry budgets of earlier releases (25 to 30 s). The results
//! stream's duplicate window is shortened to 10 s, so that a second result for an action
//! would be stored and counted rather than dropped by the server. Afterwards every
//! acknowledged action is classified (ok, lost, duplicated), and nothing may be left
//! running, booked or leaked.

use super::check::{self, Report};
use super::{fleet, Fleet, Size, Workload};
use std::sync::Arc;
use std::time::Duration;
use tangram_shared::subject;
use tokio::sync::Mutex;
use tokio::time::Instant;

/// One fault of a schedule.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub enum Strike {
    /// SIGKILL the leader; a fresh standby is started at once.
    KillLeader,
    /// SIGKILL a standby; a fresh one is started at once.
    KillStandby,
    /// SIGSTOP the leader for `for_s`, then SIGCONT.
    PauseLeader,
    /// SIGKILL a CPU worker; restarted after `for_s`.
    KillWorker,
    /// SIGSTOP a CPU worker for `for_s`.
    PauseWorker,
    /// Cut the partitioned worker off for `for_s`: its connections reset, new ones refused.
    Partition,
    /// Drop the partitioned worker's packets for `for_s`: connections kept, nothing crossing
    /// either way until the heal.
    DropPackets,
    /// SIGKILL nats-server; restarted on its store after `for_s`.
    KillNats,
    /// SIGSTOP nats-server for `for_s`.
    PauseNats,
}

/// A fault at a moment, for a while.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct Planned {
    /// Seconds after the workload starts.
    pub at_s: f64,
    /// What.
    pub strike: Strike,
    /// How long it lasts, seconds.
    pub for_s: f64,
    /// The CPU worker it strikes, where it strikes one.
    pub worker: &'static str,
}

/// The seed of the bounded run in CI (tests/tests/nemesis.rs).
pub const CI_SEED: u64 = 20_261_202;
/// The span of the bounded run in CI, seconds.
pub const CI_SPAN_S: f64 = 90.0;

/// The schedule a seed gives: a fault every 3 to 12 s over `span_s`, each lasting 1 to
/// 8 s, except NATS pauses of 30 to 40 s (past the retry budgets) one time in four.
pub fn schedule(seed: u64, span_s: f64) -> Vec<Planned> {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut out = Vec::new();
    let mut at = 3.0 + rng.f64() * 5.0;
    while at < span_s {
        let strike = match rng.u32(0..16) {
            0..=1 => Strike::KillLeader,
            2 => Strike::KillStandby,
            3..=4 => Strike::PauseLeader,
            5..=7 => Strike::KillWorker,
            8..=9 => Strike::PauseWorker,
            10 => Strike::Partition,
            11..=12 => Strike::DropPackets,
            13 => Strike::KillNats,
            _ => Strike::PauseNats,
        };
        let for_s = match strike {
            Strike::PauseNats if rng.u32(0..4) == 0 => 30.0 + rng.f64() * 10.0,
            _ => 1.0 + rng.f64() * 7.0,
        };
        let worker = if matches!(strike, Strike::Partition | Strike::DropPackets) {
            fleet::PARTITIONED
        } else {
            fleet::CPU_WORKERS[rng.usize(0..fleet::CPU_WORKERS.len())]
        };
        out.push(Planned {
            at_s: at,
            strike,
            for_s,
            worker,
        });
        at += 3.0 + rng.f64() * 9.0;
    }
    out
}

/// What a nemesis run found.
#[derive(Debug, Clone, serde::Serialize)]
pub struct NemesisReport {
    /// The seed.
    pub seed: u64,
    /// ok, lost, duplicated by kind.
    pub report: Report,
    /// The faults struck.
    pub struck: Vec<Planned>,
    /// After the drain: actions still counted running, cores booked, sandboxes listed.
    pub left_running: usize,
    /// Cores still booked on any worker.
    pub left_cores: u32,
    /// Sandboxes the scheduler still listed.
    pub left_sandboxes: usize,
    /// Containers of the fleet's CPU workers left after they stopped.
    pub leaked_containers: usize,
}

impl NemesisReport {
    /// Zero lost, zero duplicated, nothing left.
    pub fn clean(&self) -> bool {
        self.report.clean()
            && self.left_running == 0
            && self.left_cores == 0
            && self.left_sandboxes == 0
            && self.leaked_containers == 0
    }
}

/// Runs the workload of `size` on a fresh fleet with two schedulers while the seed's
/// schedule strikes (faults planned over `span_s`; the workload may outlast them).
pub async fn run(seed: u64, size: Size, span_s: f64) -> anyhow::Result<NemesisReport> {
    let mut fleet = Fleet::start("nemesis").await?;
    fleet.start_scheduler()?;
    fleet.start_scheduler()?;
    let job = "nemesis";
    let client = crate::Client::connect(&fleet.nats.url(), job).await?;
    // A second result must be stored, and so seen, rather than dropped as a duplicate.
    let mut results = client.js.get_stream(subject::RESULTS_STREAM).await?;
    let mut c = results.info().await?.config.clone();
    c.duplicate_window = Duration::from_secs(10);
    client.js.update_stream(c).await?;
    let workers = fleet.worker_ids();
    let ids: Vec<&str> = workers.iter().map(String::as_str).collect();
    client
        .wait_for_workers(&ids, Duration::from_secs(60))
        .await?;
    client
        .wait_for_scheduler_to_know(&ids, Duration::from_secs(60))
        .await?;

    let plan = schedule(seed, span_s);
    let workload = Workload::start(&fleet.nats.url(), job, size).await?;
    let started = Instant::now();
    let fleet = Arc::new(Mutex::new(fleet));
    let mut strikes = tokio::task::JoinSet::new();
    for p in plan.clone() {
        let fleet = fleet.clone();
        let client = client.clone();
        strikes.spawn(async move {
            tokio::time::sleep_until(started + Duration::from_secs_f64(p.at_s)).await;
            if let Err(e) = strike(&fleet, &client, p).await {
                eprintln!("nemesis: strike {p:?} failed: {e}");
            }
        });
    }
    let finished = workload.finish(Duration::from_secs(1800)).await?;
    // Whatever is still planned is called off; what is under way is undone.
    strikes.abort_all();
    while strikes.join_next().await.is_some() {}
    let mut fleet = Arc::try_unwrap(fleet)
        .map_err(|_| anyhow::anyhow!("a strike still holds the fleet"))?
        .into_inner();
    heal(&mut fleet).await?;
    let effects = check::Effects::read(
        Some(&fleet.effects_log()),
        &fleet.replica_log(),
        fleet.api.seen().into_iter().map(|s| s.target),
    );
    let client = crate::Client::connect(&fleet.nats.url(), job).await?;
    let mut report = check::classify("nemesis", &effects, &client, finished.submitted).await?;
    if !report.clean() {
        report.evidence = fleet.log_lines_naming(&report.flagged, super::EVIDENCE_LINES);
    }
    let status = match client
        .wait_for_status(Duration::from_secs(120), "nothing left running", |s| {
            s.running.values().sum::<usize>() == 0
                && s.workers.iter().all(|w| w.cores_used == 0)
                && s.sandboxes == 0
        })
        .await
    {
        Ok(s) => s,
        Err(_) => client.status().await?,
    };
    let mut leaked = 0;
    for short in fleet::CPU_WORKERS {
        fleet.signal_worker(short, crate::Signal::TERM)?;
        fleet
            .wait_worker_exit(short, Duration::from_secs(60))
            .await?;
        leaked += crate::containers_of(&fleet.id(short));
    }
    let report = report.timed(
        started,
        Duration::ZERO,
        Duration::ZERO,
        finished.longest_stall,
    );
    Ok(NemesisReport {
        seed,
        report,
        struck: plan
            .into_iter()
            .filter(|p| p.at_s <= started.elapsed().as_secs_f64())
            .collect(),
        left_running: status.running.values().sum(),
        left_cores: status.workers.iter().map(|w| w.cores_used).sum(),
        left_sandboxes: status.sandboxes,
        leaked_containers: leaked,
    })
}

async fn strike(fleet: &Mutex<Fleet>, client: &crate::Client, p: Planned) -> anyhow::Result<()> {
    use crate::Signal;
    let lasting = Duration::from_secs_f64(p.for_s);
    eprintln!("nemesis: {p:?}");
    match p.strike {
        Strike::KillLeader | Strike::PauseLeader | Strike::KillStandby => {
            let leader = client.leader().await.ok().flatten().map(|l| l.id);
            let mut f = fleet.lock().await;
            let all = f.schedulers();
            let target = match p.strike {
                Strike::KillStandby => all.into_iter().find(|s| Some(s) != leader.as_ref()),
                _ => leader.filter(|l| all.contains(l)),
            };
            let Some(target) = target else {
                return Ok(());
            };
            if p.strike == Strike::PauseLeader {
                f.signal_scheduler(&target, Signal::STOP)?;
                drop(f);
                tokio::time::sleep(lasting).await;
                fleet.lock().await.signal_scheduler(&target, Signal::CONT)?;
            } else {
                f.kill_scheduler(&target)?;
                f.start_scheduler()?;
            }
        }
        Strike::KillWorker => {
            fleet.lock().await.kill_worker(p.worker)?;
            tokio::time::sleep(lasting).await;
            fleet.lock().await.start_worker(p.worker)?;
        }
        Strike::PauseWorker => {
            fleet.lock().await.signal_worker(p.worker, Signal::STOP)?;
            tokio::time::sleep(lasting).await;
            fleet.lock().await.signal_worker(p.worker, Signal::CONT)?;
        }
        Strike::Partition => {
            fleet.lock().await.proxy().cut();
            tokio::time::sleep(lasting).await;
            fleet.lock().await.proxy().heal();
        }
        Strike::DropPackets => {
            fleet.lock().await.proxy().black_hole();
            tokio::time::sleep(lasting).await;
            fleet.lock().await.proxy().heal();
        }
        Strike::KillNats => {
            fleet.lock().await.nats.kill();
            tokio::time::sleep(lasting).await;
            fleet.lock().await.nats.restart();
        }
        Strike::PauseNats => {
            fleet.lock().await.signal_nats(Signal::STOP)?;
            tokio::time::sleep(lasting).await;
            fleet.lock().await.signal_nats(Signal::CONT)?;
        }
    }
    Ok(())
}

/// Undoes whatever a called-off strike left: every process continued, NATS up, the proxy
/// healed, every worker running, a leader and a standby.
async fn heal(fleet: &mut Fleet) -> anyhow::Result<()> {
    use crate::Signal;
    fleet.proxy().heal();
    if fleet.nats.pid().is_none() {
        fleet.nats.restart();
    } else {
        let _ = fleet.signal_nats(Signal::CONT);
    }
    for id in fleet.schedulers() {
        let _ = fleet.signal_scheduler(&id, Signal::CONT);
    }
    while fleet.schedulers().len() < 2 {
        fleet.start_scheduler()?;
    }
    for short in fleet::CPU_WORKERS {
        if fleet.signal_worker(short, Signal::CONT).is_err() {
            fleet.start_worker(short)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_gives_one_schedule() {
        let (a, b) = (schedule(7, 900.0), schedule(7, 900.0));
        assert_eq!(format!("{a:?}"), format!("{b:?}"));
        assert_ne!(format!("{a:?}"), format!("{:?}", schedule(8, 900.0)));
    }

    #[test]
    fn the_recorded_schedule_strikes_every_kind_of_fault() {
        let plan = schedule(7, 900.0);
        for kind in [
            Strike::KillLeader,
            Strike::KillStandby,
            Strike::PauseLeader,
            Strike::KillWorker,
            Strike::PauseWorker,
            Strike::Partition,
            Strike::DropPackets,
            Strike::KillNats,
            Strike::PauseNats,
        ] {
            assert!(
                plan.iter().any(|p| p.strike == kind),
                "no {kind:?} in {plan:?}"
            );
        }
        assert!(
            plan.iter()
                .any(|p| p.strike == Strike::PauseNats && p.for_s >= 30.0),
            "no NATS outage past the old retry budgets"
        );
    }

    #[test]
    fn the_ci_schedule_strikes_packets_nats_the_leader_and_a_worker_early() {
        // The bounded workload ends after about 55 s: what it must meet comes before 42 s.
        let plan: Vec<Planned> = schedule(CI_SEED, CI_SPAN_S)
            .into_iter()
            .filter(|p| p.at_s < 42.0)
            .collect();
        let has = |kinds: &[Strike]| plan.iter().any(|p| kinds.contains(&p.strike));
        assert!(has(&[Strike::DropPackets]), "{plan:?}");
        assert!(
            has(&[Strike::PauseNats]) && has(&[Strike::KillNats]),
            "{plan:?}"
        );
        assert!(
            has(&[Strike::KillLeader]) && has(&[Strike::PauseLeader]),
            "{plan:?}"
        );
        assert!(has(&[Strike::KillWorker]), "{plan:?}");
    }
}
