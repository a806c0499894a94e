//! Which workers pull an image ahead of the opens that will name it.

use tangram_core::engine::prepull_targets;
use tangram_shared::status::WorkerStatus;

fn w(id: &str, sandboxes: u32, images: &[&str]) -> WorkerStatus {
    let mut s: WorkerStatus = serde_json::from_value(serde_json::json!({
        "id": id, "cores": 4, "cores_used": 0, "mem_mb": 1024, "mem_used_mb": 0,
        "gpus": 0, "last_seen_s": 0.1, "draining": false, "running": 0,
        "sandboxes": sandboxes,
    }))
    .unwrap();
    s.images = images
        .iter()
        .map(|r| tangram_shared::ImageReport {
            reference: r.to_string(),
            id: "sha256:1".into(),
            size_bytes: 1,
        })
        .collect();
    s
}

#[test]
fn holders_count_first_then_the_least_loaded_workers_taking_work() {
    let mut cordoned = w("e", 0, &[]);
    cordoned.cordoned = true;
    let mut gpu = w("g", 0, &[]);
    gpu.cores = 0;
    let fleet = [
        w("a", 5, &[]),
        w("b", 1, &[]),
        w("c", 9, &["docker.io/library/app:1"]),
        w("d", 1, &[]),
        cordoned,
        gpu,
    ];
    assert_eq!(prepull_targets(&fleet, "app:1", Some(2)), ["c", "b"]);
    assert_eq!(prepull_targets(&fleet, "other:2", Some(3)), ["b", "d", "a"]);
    assert_eq!(prepull_targets(&fleet, "app:1", None), ["c", "b", "d", "a"]);
}
