//! `tangram bench pipeline` in its shortest mode against a real nats-server, scheduler and
//! worker (the benchmark-only `noop` sandbox runtime, so no Docker). Needs the workspace's
//! binaries built and the pinned nats-server installed (deploy/test.sh does both).

mod common;

use serde_json::Value;

#[test]
fn pipeline_bench_quick_reports_both_sync_settings_and_one_result_per_action() {
    let report = common::bench_json(&[
        "pipeline",
        "--quick",
        "--sandbox-runtime",
        "noop",
        "--phase-s",
        "60",
    ]);
    assert_eq!(report["bench"], "pipeline");
    assert_eq!(report["sandbox_runtime"], "noop");
    let settings = report["settings"].as_array().expect("settings");
    let syncs: Vec<&str> = settings.iter().filter_map(|s| s["sync"].as_str()).collect();
    assert_eq!(syncs, ["default", "always"]);
    let positive = |v: &Value, what: &str| {
        assert!(v.as_f64().is_some_and(|x| x > 0.0), "{what} = {v}");
    };
    for s in settings {
        let sync = s["sync"].as_str().unwrap_or_default();
        for key in [
            "publish_ack_p50_us",
            "publish_ack_p99_us",
            "three_hop_p50_us",
            "three_hop_p99_us",
            "three_hop_processes_p50_us",
            "persisted_writes_per_s",
        ] {
            positive(&s["floor"][key], &format!("{sync} floor.{key}"));
        }
        // Quick mode: 20 sequential samples, 200 actions 8 at a time (one sandbox each).
        let c1 = &s["concurrency_1"];
        assert_eq!(c1["actions"], 20, "{sync}: {c1}");
        positive(&c1["orchestration_p50_us"], "orchestration p50");
        positive(&c1["orchestration_over_three_hop_p50"], "ratio");
        positive(
            &c1["orchestration_over_three_hop_processes_p50"],
            "ratio to the cross-process chain",
        );
        assert!(c1["target"]["met"].is_boolean());
        let tp = &s["throughput"];
        assert_eq!(tp["concurrency"], 8, "{sync}: {tp}");
        assert_eq!(tp["actions"], 200, "{sync}: {tp}");
        assert_eq!(tp["completed"], 200, "{sync}: {tp}");
        positive(&tp["actions_per_s"], "actions/s");
        // At least the action, its dispatch and its result are persisted.
        assert!(
            tp["persisted_writes_per_action"]
                .as_f64()
                .is_some_and(|w| w >= 3.0),
            "{sync}: {tp}"
        );
        assert!(tp["target"]["met"].is_boolean());
        // Every action submitted (8 opens, 20 sequential, 200 concurrent) has exactly one
        // result in the results stream.
        let r = &s["results"];
        assert_eq!(r["submitted"], 228, "{sync}: {r}");
        assert_eq!(r["exactly_one"], 228, "{sync}: {r}");
        assert_eq!(r["missing"], 0, "{sync}: {r}");
        assert_eq!(r["duplicated"], 0, "{sync}: {r}");
    }
}
