//! The fault suite, bounded for CI: each fault strikes one run of the mixed workload, and
//! every acknowledged action must end ok: none lost, none duplicated. About 2,300 actions
//! in all; `cargo run --release -p tangram-tests --bin tangram-faults -- --actions 10000`
//! runs the large version (docs/RELIABILITY.md).

use tangram_tests::faults::{run, Fault, Size};

/// Actions per fault in CI (eight faults: about 2,300 in all).
const ACTIONS: usize = 290;

async fn counted(fault: Fault) -> anyhow::Result<()> {
    let report = run(fault, Size::about(ACTIONS, 12)).await?;
    println!("{}", serde_json::to_string(&report)?);
    assert!(
        report.total.acked >= ACTIONS * 9 / 10,
        "only {} actions acknowledged: {report:#?}",
        report.total.acked
    );
    assert!(report.clean(), "{report:#?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn leader_sigkill_with_a_standby_loses_and_doubles_nothing() -> anyhow::Result<()> {
    counted(Fault::LeaderKill).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn scheduler_sigkill_and_restart_loses_and_doubles_nothing() -> anyhow::Result<()> {
    counted(Fault::SchedulerRestart).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn nats_sigkill_and_restart_loses_and_doubles_nothing() -> anyhow::Result<()> {
    counted(Fault::NatsKill).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn nats_sigstop_for_twenty_seconds_loses_and_doubles_nothing() -> anyhow::Result<()> {
    counted(Fault::NatsPause).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn worker_sigkill_mid_exec_loses_and_doubles_nothing() -> anyhow::Result<()> {
    counted(Fault::WorkerKill).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn worker_partition_and_heal_loses_and_doubles_nothing() -> anyhow::Result<()> {
    counted(Fault::WorkerPartition).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_schedulers_started_at_once_lose_and_double_nothing() -> anyhow::Result<()> {
    counted(Fault::TwoSchedulers).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_worker_drained_under_load_loses_and_doubles_nothing() -> anyhow::Result<()> {
    counted(Fault::WorkerDrain).await
}
