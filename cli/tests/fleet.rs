//! `tangram bench fleet`, bounded: 50 real workers (one worker process hosting them all) on
//! the `noop` runtime, the real scheduler with a standby and a real nats-server, 500 open
//! sandboxes, 30 s of actions at 200 a second (execs, trajectories ending and starting,
//! reward calls on a GPU worker's reference replicas, api calls through the provider quota),
//! then a failover; every process with its own role's credentials, as a secured fleet runs.
//! Fails if any action is lost or doubled or the status answer breaks. Needs the workspace's
//! binaries built and the pinned nats-server installed (deploy/test.sh does both).

mod common;

#[test]
fn fifty_workers_and_five_hundred_sandboxes_lose_nothing_and_fail_over() {
    // Lanes take turns in order, so each gets rate x duration / sandboxes turns (12 here,
    // 2 at the least this test accepts): a churn of 2 makes every lane's second turn a
    // close and an open. With the default churn (20) no lane reached its first close.
    let report = common::bench_json(&[
        "fleet",
        "--workers",
        "50",
        "--sandboxes",
        "500",
        "--rate",
        "200",
        "--duration-s",
        "30",
        "--churn",
        "2",
        "--sync",
        "default",
    ]);
    let rows = report["rows"].as_array().expect("rows");
    assert_eq!(rows.len(), 1);
    let r = &rows[0];
    // The 50 noop workers and a GPU worker, each with its own seed; the load as the job's
    // rollout role; a connection without credentials refused.
    assert_eq!(
        (r["workers"].as_u64(), r["gpu_workers"].as_u64()),
        (Some(50), Some(1))
    );
    assert_eq!(report["auth"], "per-role nkeys");
    assert_eq!(r["anonymous_connection_refused"], true);
    let res = &r["results"];
    assert_eq!(
        (res["missing"].as_u64(), res["duplicated"].as_u64()),
        (Some(0), Some(0)),
        "{res}"
    );
    assert_eq!(res["exactly_one"], res["submitted"], "{res}");
    let steady = &r["steady"];
    // Opens, execs and the churn's closes and opens all ran. The machine is shared with the
    // rest of the suite, so only a sixth of the 6,000 offered is required.
    let actions = steady["actions"].as_u64().unwrap_or(0);
    assert!(actions > 1_000, "{steady}");
    assert_eq!(steady["completed"], steady["actions"], "{steady}");
    for kind in [
        "sandbox_exec",
        "sandbox_close",
        "sandbox_open",
        "reward",
        "api",
    ] {
        assert!(
            steady["by_kind"][kind].as_u64().unwrap_or(0) > 0,
            "no {kind}: {steady}"
        );
    }
    assert_eq!(
        (steady["refused"].as_u64(), steady["unanswered"].as_u64()),
        (Some(0), Some(0))
    );
    let status = &r["status"];
    assert_eq!(status["answered"], true, "{status}");
    assert!(status["bytes"].as_u64().unwrap_or(0) > 1000, "{status}");
    let fo = &r["failover"];
    assert_eq!(fo["probe_completed"], true, "{fo}");
    assert!(
        fo["new_leader_s"]
            .as_f64()
            .is_some_and(|s| s > 0.0 && s < 30.0),
        "{fo}"
    );
    // The exec submitted at the kill is not left with the dead leader for its ack wait:
    // the new leader reads it back when its term starts.
    assert!(
        fo["exec_answered_s"].as_f64().is_some_and(|s| s < 9.0),
        "{fo}"
    );
}

/// Two scheduler groups on one server, each a NATS account with its own leader, standby,
/// workers and load: each loses nothing, sees only its own workers (the bench fails if a
/// group's status lists another's) and fails over on its own.
#[test]
fn two_scheduler_groups_share_one_server_and_neither_sees_the_other() {
    let report = common::bench_json(&[
        "fleet",
        "--workers",
        "6",
        "--groups",
        "2",
        "--sandboxes",
        "60",
        "--rate",
        "30",
        "--duration-s",
        "8",
        "--churn",
        "2",
        "--sync",
        "default",
    ]);
    let rows = report["rows"].as_array().expect("rows");
    assert_eq!(rows.len(), 2, "one row a group");
    for (g, r) in rows.iter().enumerate() {
        assert_eq!(r["group"], g);
        assert_eq!(
            (r["workers"].as_u64(), r["gpu_workers"].as_u64()),
            (Some(3), Some(1)),
            "{r}"
        );
        assert_eq!(r["anonymous_connection_refused"], true, "group {g}");
        let res = &r["results"];
        assert_eq!(
            (res["missing"].as_u64(), res["duplicated"].as_u64()),
            (Some(0), Some(0)),
            "group {g}: {res}"
        );
        assert!(
            res["submitted"].as_u64().unwrap_or(0) > 30,
            "group {g}: {res}"
        );
        assert_eq!(r["status"]["answered"], true, "group {g}");
        assert_eq!(r["failover"]["probe_completed"], true, "group {g}");
    }
}
