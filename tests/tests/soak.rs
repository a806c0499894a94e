//! The soak's bounded version: a few minutes of the fault fleet at a steady load, with the
//! history stream shrunk so that it wraps many times over (and the backlog to 8 MiB). The long
//! run is a documented command (docs/RELIABILITY.md, Soak).

use std::time::Duration;
use tangram_tests::faults::soak::{self, SoakConfig};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_few_minutes_of_soak_lose_nothing_refuse_nothing_and_leave_nothing() -> anyhow::Result<()>
{
    let report = soak::run(SoakConfig {
        duration: Duration::from_secs(150),
        lanes: 8,
        steps: 4,
        file_bytes: 4096,
        sample_every: Duration::from_secs(5),
        history_bytes: Some(256 << 10),
        // Above the processed work a sourced work queue holds until its sweep (about 1 MB
        // here).
        backlog_bytes: Some(8 << 20),
        picture: None,
        rate: None,
        noop_sandboxes: false,
    })
    .await?;
    eprintln!("{}", report.table());
    let t = &report.report.total;
    assert!(t.acked > 500, "{}", report.table());
    assert_eq!((t.lost, t.duplicated), (0, 0), "{}", report.table());
    assert_eq!(report.refusals, 0, "{}", report.table());
    assert!(
        report.history_turnovers > 5.0,
        "the history wrapped many times: {}",
        report.table()
    );
    assert_eq!(
        (
            report.left_running,
            report.left_cores,
            report.left_sandboxes,
            report.leaked_containers
        ),
        (0, 0, 0, 0),
        "{}",
        report.table()
    );
    // Tangram's processes flat after warm-up (their memory must not follow the action
    // count or the history). nats-server's follows what its streams hold, and the results
    // stream (a 7-day window, not shrunk here so that every result can be counted) grows
    // for the whole run: it is bounded, not judged flat.
    for (p, g) in &report.rss_growth_last_half {
        if p == soak::NATS_SERVER {
            continue;
        }
        assert!(*g < 0.10, "{p} grew {:.0}%: {}", g * 100.0, report.table());
    }
    let nats_end = report
        .samples
        .last()
        .and_then(|s| s.rss_mib.get(soak::NATS_SERVER))
        .copied()
        .unwrap_or(0.0);
    assert!(
        nats_end < 512.0,
        "nats-server at {nats_end} MiB: {}",
        report.table()
    );
    Ok(())
}
