//! The table is complete and consistent, and what is recorded renders as declared.

use super::*;
use std::collections::BTreeSet;

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
    assert!(found.len() > 15, "the scan found the names: {found:?}");
}

#[test]
fn names_are_unique_and_say_their_type_and_unit() {
    let bucketed: Vec<&str> = BUCKETS.iter().map(|(n, _)| *n).collect();
    let problems = tangram_shared::metric::table_problems(DEFS, &bucketed);
    assert!(problems.is_empty(), "{problems:#?}");
}

#[test]
fn overhead_and_exec_render_by_kind_in_buckets_that_reach_their_range() {
    let recorder = builder().unwrap().build_recorder();
    let handle = recorder.handle();
    metrics::with_local_recorder(&recorder, || {
        register();
        // A cold sandbox open: 1.6 s of overhead, nothing executed.
        action("sandbox_open", "completed", 1.6, 0.0);
        // An exec that ran for 20 minutes.
        action("sandbox_exec", "completed", 0.0002, 1200.0);
    });
    let text = handle.render();
    for line in [
        "tangram_worker_overhead_seconds_bucket{kind=\"sandbox_open\",le=\"2\"} 1",
        "tangram_worker_overhead_seconds_bucket{kind=\"sandbox_open\",le=\"1\"} 0",
        "tangram_worker_exec_duration_seconds_bucket{kind=\"sandbox_exec\",le=\"900\"} 0",
        "tangram_worker_exec_duration_seconds_bucket{kind=\"sandbox_exec\",le=\"3600\"} 1",
        "tangram_worker_dispatch_redeliveries_total 0",
        "# HELP tangram_worker_overhead_seconds",
    ] {
        assert!(text.contains(line), "missing {line:?} in\n{text}");
    }
    assert!(
        !text.contains("tangram_worker_exec_duration_seconds_bucket{kind=\"sandbox_open\""),
        "an open executes nothing"
    );
    assert!(
        text.lines()
            .any(|l| l.starts_with("tangram_build_info{") && l.contains("component=\"worker\"")),
        "{text}"
    );
}

#[test]
fn a_declared_inventory_exports_its_count_and_no_use() {
    let recorder = builder().unwrap().build_recorder();
    let handle = recorder.handle();
    let declared = tangram_shared::GpuInventory {
        source: "declared".into(),
        groups: vec![vec![0, 1]],
        devices: vec![],
    };
    metrics::with_local_recorder(&recorder, || gpu_inventory(Some(&declared)));
    let text = handle.render();
    assert!(
        text.contains("tangram_worker_gpus{source=\"declared\"} 2"),
        "{text}"
    );
    for name in [GPU_UTIL, GPU_MEM_USED, GPU_MEM_TOTAL] {
        assert!(!text.contains(name), "{name} without a driver:\n{text}");
    }
}

#[test]
fn nvml_samples_render_per_gpu_in_base_units() {
    let recorder = builder().unwrap().build_recorder();
    let handle = recorder.handle();
    let sample = crate::gpu::GpuSample {
        index: 3,
        mem_used_bytes: 1 << 30,
        mem_total_bytes: 80 << 30,
        utilization: 0.42,
    };
    metrics::with_local_recorder(&recorder, || gpu_samples(&[sample]));
    let text = handle.render();
    for line in [
        "tangram_worker_gpu_memory_used_bytes{gpu=\"3\"} 1073741824",
        "tangram_worker_gpu_memory_total_bytes{gpu=\"3\"} 85899345920",
        "tangram_worker_gpu_utilization_ratio{gpu=\"3\"} 0.42",
    ] {
        assert!(text.contains(line), "missing {line:?} in\n{text}");
    }
}
