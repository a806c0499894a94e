//! The table is complete and consistent, and what is recorded renders as declared.

use super::*;
use std::collections::BTreeSet;
use tangram_shared::{ActionKind, Timing};

#[test]
fn every_metric_name_in_the_source_is_in_the_table() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut found = tangram_shared::metric::names_used_in(&dir).unwrap();
    let declared: BTreeSet<String> = DEFS.iter().map(|d| d.name.to_string()).collect();
    // The build-info name lives in the shared crate.
    found.insert(BUILD_INFO.to_string());
    let missing: Vec<_> = found.difference(&declared).collect();
    assert!(
        missing.is_empty(),
        "names used but not declared: {missing:?}"
    );
    assert!(found.len() > 40, "the scan found the names: {found:?}");
}

#[test]
fn names_are_unique_and_say_their_type_and_unit() {
    let bucketed: Vec<&str> = BUCKETS.iter().map(|(n, _)| *n).collect();
    let problems = tangram_shared::metric::table_problems(DEFS, &bucketed);
    assert!(problems.is_empty(), "{problems:#?}");
}

#[test]
fn act_renders_by_kind_and_phase_in_buckets_up_to_an_hour() {
    let recorder = builder().unwrap().build_recorder();
    let handle = recorder.handle();
    metrics::with_local_recorder(&recorder, || {
        register();
        act(ActionKind::SandboxOpen, Timing::new(1_000, 1_600_000, 0));
        dispatched("sandbox_exec", 0.002);
        api_admitted("search", "job-a");
        leader(true, 7);
    });
    let text = handle.render();
    for line in [
        "# TYPE tangram_scheduler_act_seconds histogram",
        "tangram_scheduler_act_seconds_bucket{kind=\"sandbox_open\",le=\"2.5\"} 1",
        "tangram_scheduler_act_seconds_bucket{kind=\"sandbox_open\",le=\"1\"} 0",
        "tangram_scheduler_act_phase_seconds_bucket{kind=\"sandbox_open\",phase=\"overhead\",le=\"3600\"} 1",
        "tangram_scheduler_queue_wait_seconds_bucket{kind=\"sandbox_exec\",le=\"0.005\"} 1",
        "tangram_scheduler_api_admitted_total{provider=\"search\",rl_job=\"job-a\"} 1",
        "tangram_scheduler_epoch 7",
        "tangram_scheduler_workers_lost_total 0",
        "# HELP tangram_scheduler_act_seconds",
    ] {
        assert!(text.contains(line), "missing {line:?} in\n{text}");
    }
    assert!(
        text.lines().any(|l| l.starts_with("tangram_build_info{")
            && l.contains("component=\"scheduler\"")
            && l.contains(&format!("version=\"{}\"", env!("CARGO_PKG_VERSION")))
            && l.ends_with(" 1")),
        "{text}"
    );
}

#[test]
fn a_worker_that_leaves_reads_nan_and_the_pool_drops_its_cores() {
    let recorder = builder().unwrap().build_recorder();
    let handle = recorder.handle();
    let gauge = |id: &str, age: f64| tangram_core::engine::WorkerGauge {
        worker: tangram_shared::WorkerId::new(id).unwrap(),
        heartbeat_age_s: age,
        cores: 4,
        cores_booked: 1,
        mem_mb: 1024,
        mem_booked_mb: 512,
    };
    metrics::with_local_recorder(&recorder, || {
        workers(&[gauge("m-a", 0.25), gauge("m-b", 0.5)]);
        workers(&[gauge("m-b", 0.75)]);
    });
    let text = handle.render();
    for line in [
        "tangram_scheduler_worker_heartbeat_age_seconds{worker=\"m-a\"} NaN",
        "tangram_scheduler_worker_heartbeat_age_seconds{worker=\"m-b\"} 0.75",
        "tangram_scheduler_pool_cores{state=\"total\"} 4",
        "tangram_scheduler_pool_memory_bytes{state=\"booked\"} 536870912",
    ] {
        assert!(text.contains(line), "missing {line:?} in\n{text}");
    }
}
