//! The soak's bounded version: a few minutes of the fault fleet at a steady load, with the
//! backlog and history streams shrunk so that the history wraps many times over. The long
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
        stream_bytes: Some(256 << 10),
        picture: None,
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
    // Memory flat after warm-up. Over minutes the bound is looser than the hour-long run's
    // 5% (allocator arenas are still settling); what it catches is growth with the
    // history or the action count.
    for (p, g) in &report.rss_growth_last_half {
        assert!(*g < 0.25, "{p} grew {:.0}%: {}", g * 100.0, report.table());
    }
    Ok(())
}
