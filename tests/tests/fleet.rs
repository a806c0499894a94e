//! The multi-host fault tests, on the docker-compose fleet (`deploy/fleet.sh`): one fleet
//! (three clustered NATS servers with R3 streams, two schedulers, CPU workers from the id
//! pool, a GPU worker, the search stand-in, each a container) meets five faults in turn,
//! each under its own run of the mixed workload: a NATS node killed, a worker cut off the
//! network, the leader's container killed, a rolling restart of every worker, and scaling
//! from two CPU workers to six and back. Every acknowledged action must end ok: none lost,
//! none duplicated. First the main job's rollout runs on it as a user would run it; the longest stall of each run is reported (docs/RELIABILITY.md).
//! `cargo run -p tangram-tests --bin tangram-faults -- --fleet --actions 2000` runs larger
//! versions.

use tangram_tests::faults::compose::{self, ComposeFleet, FleetFault};
use tangram_tests::faults::Size;

/// Actions per fault (five faults).
const ACTIONS: usize = 240;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_compose_fleet_loses_and_doubles_nothing_through_five_faults() -> anyhow::Result<()> {
    let fleet = tokio::task::spawn_blocking(|| ComposeFleet::up("fleettest")).await??;
    // The main job's rollout runs against it as a user would run it.
    let out = match fleet.script(&["rollout", "--trajectories", "4", "--turns", "2"]) {
        Ok(out) => out,
        Err(e) => anyhow::bail!(
            "{e:#}\n--- the fleet's logs, last lines:\n{}",
            fleet.log_tail(120)
        ),
    };
    let expected = out
        .lines()
        .find_map(|l| l.split("passed; ").nth(1)?.split(' ').next())
        .and_then(|f| f.split_once('/'))
        .map(|(a, b)| (a.to_string(), b.to_string()));
    assert!(
        matches!(&expected, Some((a, b)) if a == b && b != "0"),
        "every test of the rollout must come out as expected: {out}"
    );
    let mut unclean = Vec::new();
    for fault in FleetFault::ALL {
        let report = compose::run(&fleet, fault, Size::about(ACTIONS, 12)).await?;
        println!("{}", serde_json::to_string(&report)?);
        let unexpected = unexpected_outcomes(fault, &report.outcomes);
        if !report.clean() || report.total.acked < ACTIONS * 9 / 10 || !unexpected.is_empty() {
            unclean.push(format!(
                "unexpected outcomes {unexpected:?}: {report:#?}\n--- the fleet's logs, last lines:\n{}",
                fleet.log_tail(60)
            ));
        }
    }
    assert!(unclean.is_empty(), "{}", unclean.join("\n"));
    Ok(())
}

/// Outcomes a fault should not produce, although the checker counts them as ok (one result,
/// no second effect): a rejection for want of capacity (the fleet has it, or gets it back)
/// or an infrastructure error other than what the fault itself causes.
fn unexpected_outcomes(
    fault: FleetFault,
    outcomes: &std::collections::BTreeMap<String, usize>,
) -> Vec<String> {
    let caused: &[&str] = match fault {
        // The execs running on the cut-off worker, and its sandboxes, which the fence ends.
        FleetFault::WorkerDisconnect => &["infra_error:worker_lost", "infra_error:sandbox_lost"],
        // A dispatch whose delivery died with the server is answered conservatively
        // (RELIABILITY.md, "What the fleet runs showed").
        FleetFault::NatsNodeKill => &["infra_error:worker_lost"],
        // Drains close the sandboxes still open at their deadline.
        FleetFault::RollingRestart | FleetFault::ScaleOutAndIn => &["infra_error:sandbox_lost"],
        FleetFault::LeaderKill => &[],
    };
    outcomes
        .keys()
        .filter(|o| {
            let fine = o.as_str() == "completed"
                || o.as_str() == "rejected:no_sandbox"
                || o.as_str() == "rejected:sandbox_exists"
                || caused.contains(&o.as_str());
            !fine
        })
        .cloned()
        .collect()
}
