//! The nemesis' bounded version: one run of the mixed workload under a randomised schedule
//! of overlapping faults (docs/RELIABILITY.md, Nemesis). The seed is fixed so that a
//! failure can be run again; `TANGRAM_NEMESIS_SEED` picks another.

use tangram_tests::faults::nemesis;
use tangram_tests::faults::Size;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn overlapping_random_faults_lose_nothing_duplicate_nothing_and_leave_nothing(
) -> anyhow::Result<()> {
    let seed = std::env::var("TANGRAM_NEMESIS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(nemesis::CI_SEED);
    let r = nemesis::run(seed, Size::about(1_200, 16), nemesis::CI_SPAN_S).await?;
    let t = &r.report.total;
    let struck: Vec<String> = r
        .struck
        .iter()
        .map(|p| format!("{:?}@{:.0}s/{:.0}s", p.strike, p.at_s, p.for_s))
        .collect();
    eprintln!("seed {seed}: {t:?}; struck {struck:?}");
    assert!(r.struck.len() >= 5, "faults struck: {struck:?}");
    assert!(t.acked > 1_000, "{t:?}");
    assert_eq!(
        (t.lost, t.duplicated),
        (0, 0),
        "seed {seed}: {:?}\n{}",
        r.report.examples,
        r.report.evidence.join("\n")
    );
    assert_eq!(
        (
            r.left_running,
            r.left_cores,
            r.left_sandboxes,
            r.leaked_containers
        ),
        (0, 0, 0, 0),
        "seed {seed}: something was left"
    );
    Ok(())
}
