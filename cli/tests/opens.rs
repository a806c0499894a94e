//! `tangram bench opens`, bounded: one real Docker worker with a warm pool, two rounds of the
//! held-out open shapes (default, 256 MB, 1 GiB, an `env`, a task image) at one open every
//! two seconds. Every open after the task image's first is a claim: fails if any other open
//! created its container, or if any open, exec or close failed. Needs the workspace's binaries,
//! the pinned nats-server and the sandbox image (deploy/test.sh makes all three).

mod common;

#[test]
fn every_shape_of_open_claims_a_warm_sandbox_after_the_first_of_a_new_image() {
    let report = common::bench_json(&[
        "opens",
        "--rounds",
        "2",
        "--cold-rounds",
        "0",
        "--rate",
        "0.5",
    ]);
    let runs = report["runs"].as_array().expect("runs");
    assert_eq!(runs.len(), 1, "the warm run only: {report}");
    let warm = &runs[0]["shapes"];
    let opens = warm["opens_ms"].as_object().expect("opens by shape");
    assert_eq!(opens.len(), 5, "{warm}");
    for (shape, v) in opens {
        assert_eq!(v["n"], 2, "{shape}: {v}");
    }
    // Three passes of five shapes (one to learn, two measured): 15 opens, and the one that
    // found nothing parked was the task image's first.
    let pool = &warm["pool"];
    assert_eq!(
        (pool["hits"].as_u64(), pool["misses"].as_u64()),
        (Some(14), Some(1)),
        "{pool}"
    );
}
