//! `tangram inspect` and `tangram replay` against real clusters: the main job's rollout runs
//! on one cluster (`tangram up`); one of its actions is inspected; the job is exported as a
//! trace and re-simulated under three policies; it is replayed into a second, fresh cluster
//! with a diff report; a rejected action is found in the dead letters and a corrected one
//! re-submitted. Needs the workspace's binaries built, the pinned nats-server and the sandbox
//! image (deploy/test.sh does all three).

use std::path::{Path, PathBuf};
use std::process::Command;

fn tangram(state: &Path, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_tangram"))
        .args(args)
        .env("TANGRAM_STATE_DIR", state)
        .env_remove("TANGRAM_NATS_URL")
        .env_remove("TANGRAM_NKEY_FILE")
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn free_port() -> u16 {
    tangram_nats::local::free_port().unwrap()
}

struct Down(PathBuf);
impl Drop for Down {
    fn drop(&mut self) {
        let _ = tangram(&self.0, &["down"]);
    }
}

/// Brings a cluster up; returns its URL and the guard that takes it down.
fn up(state: &Path) -> (String, Down) {
    let port = free_port();
    let nats = repo().join("tools/bin/nats-server");
    let (code, out, err) = tangram(
        state,
        &[
            "up",
            "--nats-port",
            &port.to_string(),
            "--nats-server",
            nats.to_str().unwrap(),
            "--workers",
            "1",
            "--gpus",
            "1",
            "--services",
            "judge",
        ],
    );
    let down = Down(state.to_path_buf());
    assert_eq!(code, 0, "up failed: {out}{err}");
    (format!("nats://127.0.0.1:{port}"), down)
}

/// Publishes a message as a client in another language might: no validation first.
fn publish_raw(url: &str, seed: &Path, body: &str) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let creds = tangram_nats::auth::Credentials::from_seed_file(seed.to_path_buf());
        let client = tangram_nats::auth::connect(url, "test", &creds)
            .await
            .unwrap();
        let js = async_nats::jetstream::new(client);
        let mut headers = async_nats::HeaderMap::new();
        headers.insert("Nats-Msg-Id", "bad1");
        headers.insert("Content-Type", "application/json");
        js.publish_with_headers(
            "tangram.v1.action.night.sandbox_open",
            headers,
            body.to_string().into(),
        )
        .await
        .unwrap()
        .await
        .unwrap();
    });
}

/// A job exported as a trace: each trajectory's steps as (kind, think seconds).
fn export_steps(state: &Path, job: &str, out: &Path) -> Vec<(String, Vec<(String, f64)>)> {
    let (code, _, err) = tangram(
        state,
        &[
            "replay",
            "export",
            "--job",
            job,
            "--out",
            out.to_str().unwrap(),
        ],
    );
    assert_eq!(code, 0, "{err}");
    let mut lines: Vec<(String, Vec<(String, f64)>)> = std::fs::read_to_string(out)
        .unwrap()
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(json)
        .map(|l| {
            let steps = l["steps"].as_array().unwrap().iter().map(|s| {
                let kind = s["action"]["kind"].as_str().unwrap().to_string();
                (kind, s["think_s"].as_f64().unwrap())
            });
            (
                l["trajectory"].as_str().unwrap().to_string(),
                steps.collect(),
            )
        })
        .collect();
    lines.sort_by(|a, b| a.0.cmp(&b.0));
    lines
}

fn json(text: &str) -> serde_json::Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"))
}

#[test]
fn a_recorded_job_is_inspected_exported_resimulated_and_replayed_into_a_fresh_cluster() {
    let dir = tempfile::tempdir().unwrap();
    let (state_a, state_b) = (dir.path().join("a"), dir.path().join("b"));
    let (url_a, _down_a) = up(&state_a);

    // The main job's workload, recorded on cluster A.
    let rollout = Path::new(env!("CARGO_BIN_EXE_tangram")).with_file_name("tangram-rollout");
    let out = Command::new("timeout")
        .arg("180")
        .arg(&rollout)
        .args([
            "--nats-url",
            &url_a,
            "--job",
            "night",
            "--trajectories",
            "2",
        ])
        .args(["--turns", "2", "--think-ms", "400", "--report"])
        .arg(dir.path().join("report.json"))
        .env("TANGRAM_NKEY_FILE", state_a.join("creds/rollout.nk"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "rollout failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );

    let (code, out, err) = tangram(&state_a, &["replay", "jobs", "--json"]);
    assert_eq!(code, 0, "{err}");
    let recorded = json(&out)["night"]["actions"].as_u64().unwrap();
    // Per trajectory: open, 2 turns of exec + search + judge, close.
    assert_eq!(recorded, 2 * (2 + 2 * 3), "{out}");

    // One action's story.
    let (code, out, err) = tangram(&state_a, &["inspect", "night-t0-turn0", "--json"]);
    assert_eq!(code, 0, "{err}");
    let story = json(&out);
    assert_eq!(story["job"], "night");
    assert_eq!(story["action"]["body"]["spec"]["kind"], "sandbox_exec");
    assert!(!story["dispatches"].as_array().unwrap().is_empty(), "{out}");
    assert_eq!(story["dispatches"][0]["worker"], "cpu-0");
    assert_eq!(story["results"].as_array().unwrap().len(), 1, "{out}");
    let act = &story["act"];
    assert_eq!(
        act["act_us"].as_u64().unwrap(),
        act["queued_us"].as_u64().unwrap()
            + act["overhead_us"].as_u64().unwrap()
            + act["exec_us"].as_u64().unwrap()
    );
    assert!(story["notes"].as_array().unwrap().is_empty(), "{out}");
    let (code, text, _) = tangram(&state_a, &["inspect", "night-t0-turn0"]);
    assert_eq!(code, 0);
    assert!(
        text.contains("timeline:") && text.contains("dispatched to cpu-0"),
        "{text}"
    );
    let (code, _, err) = tangram(&state_a, &["inspect", "no-such-action"]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("nothing about no-such-action"), "{err}");

    // Exported, and re-simulated under three policies on the cluster it ran on.
    let (trace, cluster) = (
        dir.path().join("night.jsonl"),
        dir.path().join("cluster.json"),
    );
    let (code, _, err) = tangram(
        &state_a,
        &[
            "replay",
            "export",
            "--job",
            "night",
            "--out",
            trace.to_str().unwrap(),
            "--cluster-out",
            cluster.to_str().unwrap(),
        ],
    );
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("exported 2 trajectories"), "{err}");
    let svg = dir.path().join("night.svg");
    let (code, out, err) = tangram(
        &state_a,
        &[
            "simulate",
            "--trace",
            trace.to_str().unwrap(),
            "--cluster",
            cluster.to_str().unwrap(),
            "--policies",
            "tangram,static,first-fit",
            "--static-cores",
            "1",
            "--elasticity",
            "oracle",
            "--json",
            "--svg",
            svg.to_str().unwrap(),
        ],
    );
    assert_eq!(code, 0, "{err}");
    let sim = json(&out);
    let policies = sim["policies"].as_array().unwrap();
    assert_eq!(policies.len(), 3, "{out}");
    assert!(sim["notes"].as_array().unwrap().is_empty(), "{out}");
    for p in policies {
        // Two turns of exec, search and judge per trajectory.
        assert_eq!(p["actions"], 12, "{p}");
    }

    // Replayed into a fresh cluster: every outcome and exit code as recorded.
    let (url_b, _down_b) = up(&state_b);
    let into_nk = state_b.join("creds/operator.nk");
    let replay_into_b = |more: &[&str]| {
        let base = ["replay", "run", "--job", "night", "--into", &url_b];
        let creds = ["--into-nkey-file", into_nk.to_str().unwrap()];
        tangram(&state_a, &[&base[..], &creds, more].concat())
    };
    let report = dir.path().join("replay.json");
    let (code, out, err) = replay_into_b(&[
        "--as",
        "night-again",
        "--speed",
        "4",
        "--report",
        report.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "replay differs: {out}{err}");
    assert!(
        out.contains("16 actions, 16 the same, 0 different"),
        "{out}"
    );
    let r = json(&std::fs::read_to_string(&report).unwrap());
    assert_eq!(r["differ"], 0);
    let (code, out, _) = tangram(&state_b, &["replay", "jobs", "--json"]);
    assert_eq!(code, 0);
    assert_eq!(json(&out)["night-again"]["actions"], 16, "{out}");
    // Each trajectory kept its order and its think gaps, four times shorter: the rollout
    // thinks 200 to 600 ms between turns (`--think-ms 400`); the replay waits a quarter of
    // each recorded gap after the previous result, never less.
    let recorded = export_steps(&state_a, "night", &dir.path().join("rec.jsonl"));
    let replayed = export_steps(&state_b, "night-again", &dir.path().join("rep.jsonl"));
    assert_eq!(
        recorded
            .iter()
            .map(|(t, s)| (t, s.len()))
            .collect::<Vec<_>>(),
        replayed
            .iter()
            .map(|(t, s)| (t, s.len()))
            .collect::<Vec<_>>(),
    );
    for ((traj, rec), (_, rep)) in recorded.iter().zip(&replayed) {
        for (i, ((rk, rt), (pk, pt))) in rec.iter().zip(rep).enumerate() {
            assert_eq!(rk, pk, "{traj} step {i}: order kept");
            if i == 0 {
                // Its think runs from the open's submission: the open's own time is in it,
                // not scaled.
                continue;
            }
            assert!(
                *pt >= rt / 4.0 * 0.95 - 0.002,
                "{traj} step {i}: think {pt} s, recorded {rt} s"
            );
        }
        let longest = |s: &[(String, f64)]| s.iter().map(|x| x.1).fold(0.0, f64::max);
        assert!(
            longest(rec) >= 0.2,
            "{traj}: the rollout's think of at least 200 ms: {rec:?}"
        );
        assert!(
            longest(rep) < longest(rec),
            "{traj}: not sped up: {rep:?} vs {rec:?}"
        );
    }

    // Selected by trajectory and kind: t0's execs alone, with no sandbox opened for them
    // under the new job, so each is refused, reported as a difference, and the run exits 1.
    let (code, out, err) = replay_into_b(&[
        "--trajectory",
        "t0",
        "--kind",
        "sandbox_exec",
        "--as",
        "night-execs",
    ]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(out.contains("2 actions, 0 the same, 2 different"), "{out}");
    assert_eq!(out.matches("no_sandbox").count(), 2, "{out}");
    assert!(!out.contains(" t1 "), "only t0 was selected: {out}");

    // A rejected action is in the dead letters; a corrected one goes through.
    let bad = r#"{"id": "bad1", "job": "night", "trajectory": "t9", "timeout_ms": 0,
        "spec": {"kind": "sandbox_open"}}"#;
    publish_raw(&url_a, &state_a.join("creds/operator.nk"), bad);
    let (code, out, err) = tangram(&state_a, &["replay", "deadletter", "list", "--json"]);
    assert_eq!(code, 0, "{err}");
    let entry = out
        .lines()
        .map(json)
        .find(|e| e["action_id"] == "bad1")
        .unwrap_or_else(|| panic!("no dead letter for bad1: {out}"));
    assert_eq!(entry["code"], "invalid_field");
    assert!(
        entry["reason"].as_str().unwrap().contains("timeout_ms"),
        "{entry}"
    );
    let seq = entry["seq"].as_u64().unwrap().to_string();
    let (code, out, _) = tangram(&state_a, &["replay", "deadletter", "show", &seq]);
    assert_eq!(code, 0);
    assert!(out.contains("\"timeout_ms\": 0"), "{out}");
    let fixed = dir.path().join("fixed.json");
    std::fs::write(
        &fixed,
        bad.replace("\"timeout_ms\": 0", "\"timeout_ms\": 60000"),
    )
    .unwrap();
    let (code, out, err) = tangram(
        &state_a,
        &[
            "replay",
            "deadletter",
            "resubmit",
            &seq,
            "--file",
            fixed.to_str().unwrap(),
        ],
    );
    assert_eq!(code, 0, "{out}{err}");
    assert!(err.contains("submitted as bad1-fix"), "{err}");
    assert_eq!(json(&out)["outcome"]["status"], "completed", "{out}");
}
