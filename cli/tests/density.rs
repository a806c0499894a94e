//! `tangram bench density`, bounded: one real Docker worker with the default hardening opens
//! 12 sandboxes with its pool off, runs `true` at 10 and at 12 open, closes them all, then
//! claims 4 from a full pool. Fails if any open, exec or close failed, if a container was
//! left behind, if the pool missed, or if the host's memory could not be accounted. Needs the
//! workspace's binaries, the pinned nats-server and the sandbox image (deploy/test.sh makes
//! all three).

mod common;

#[test]
fn a_docker_worker_parks_opens_runs_and_closes_every_sandbox_and_claims_from_a_full_pool() {
    let r = common::bench_json(&[
        "density",
        "--sandboxes",
        "12",
        "--in-flight",
        "4",
        "--execs",
        "20",
        "--warm-pool",
        "4",
    ]);
    let cold = &r["cold"];
    // The bulk opens exclude the first ten (opened before the exec at ten).
    assert_eq!(cold["opens"]["n"], 2, "{cold}");
    assert_eq!(cold["closes"]["n"], 12, "{cold}");
    assert_eq!(cold["exec_true_ms"]["10"]["n"], 20, "{cold}");
    assert_eq!(cold["exec_true_ms"]["12"]["n"], 20, "{cold}");
    // Every parked container is charged to its cgroup and has a shim beside it.
    let m = &cold["memory"];
    assert!(m["cgroup_kib"].as_u64().is_some_and(|k| k > 0), "{m}");
    assert!(m["shim_kib"].as_u64().is_some_and(|k| k > 0), "{m}");
    let warm = &r["warm"];
    assert_eq!(warm["opens"]["n"], 4, "{warm}");
    assert_eq!(
        (
            warm["pool"]["hits"].as_u64(),
            warm["pool"]["misses"].as_u64()
        ),
        (Some(4), Some(0)),
        "every open from a full pool is a claim: {warm}"
    );
}
