//! `tangram bench fleet`, bounded: 50 real workers (one worker process hosting them all) on
//! the `noop` runtime, the real scheduler with a standby and a real nats-server, 500 open
//! sandboxes, 30 s of actions at 200 a second, then a failover.
//! Fails if any action is lost or doubled or the status answer breaks. Needs the workspace's
//! binaries built and the pinned nats-server installed (deploy/test.sh does both).

use serde_json::Value;
use std::path::PathBuf;
use std::process::Command;

fn nats_server() -> PathBuf {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("cli/ has a parent")
        .join("tools/bin/nats-server");
    assert!(
        p.exists(),
        "nats-server not found at {}: run `bash deploy/install-tools.sh` first",
        p.display()
    );
    p
}

#[test]
fn fifty_workers_and_five_hundred_sandboxes_lose_nothing_and_fail_over() {
    let out = Command::new(env!("CARGO_BIN_EXE_tangram"))
        .args([
            "bench",
            "fleet",
            "--json",
            "--workers",
            "50",
            "--sandboxes",
            "500",
        ])
        // Lanes take turns in order, so each gets rate x duration / sandboxes turns (12 here,
        // 2 at the least this test accepts): a churn of 2 makes every lane's second turn a
        // close and an open. With the default churn (20) no lane reached its first close.
        .args(["--rate", "200", "--duration-s", "30", "--churn", "2"])
        .args(["--sync", "default"])
        .arg("--nats-server")
        .arg(nats_server())
        .env_remove("TANGRAM_NATS_URL")
        .output()
        .expect("running tangram");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "bench failed: {stdout}{stderr}");
    let report: Value = serde_json::from_str(&stdout).expect("one JSON object");
    let rows = report["rows"].as_array().expect("rows");
    assert_eq!(rows.len(), 1);
    let r = &rows[0];
    assert_eq!(r["workers"], 50);
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
    for kind in ["sandbox_exec", "sandbox_close", "sandbox_open"] {
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
}

/// Two scheduler groups on one server, each a NATS account with its own leader, standby,
/// workers and load: each loses nothing, sees only its own workers (the bench fails if a
/// group's status lists another's) and fails over on its own.
#[test]
fn two_scheduler_groups_share_one_server_and_neither_sees_the_other() {
    let out = Command::new(env!("CARGO_BIN_EXE_tangram"))
        .args([
            "bench",
            "fleet",
            "--json",
            "--workers",
            "6",
            "--groups",
            "2",
        ])
        .args(["--sandboxes", "60", "--rate", "30", "--duration-s", "8"])
        .args(["--churn", "2", "--sync", "default"])
        .arg("--nats-server")
        .arg(nats_server())
        .env_remove("TANGRAM_NATS_URL")
        .output()
        .expect("running tangram");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "bench failed: {stdout}{stderr}");
    let report: Value = serde_json::from_str(&stdout).expect("one JSON object");
    let rows = report["rows"].as_array().expect("rows");
    assert_eq!(rows.len(), 2, "one row a group");
    for (g, r) in rows.iter().enumerate() {
        assert_eq!(r["group"], g);
        assert_eq!(r["workers"], 3, "{r}");
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
