//! `tangram up`, `submit`, `status` and `down` against a real local cluster (nats-server,
//! scheduler, CPU workers with Docker sandboxes, a GPU worker with reference replicas, the
//! search stand-in). Needs the workspace's binaries built and the pinned nats-server
//! installed (deploy/test.sh does both).

use std::path::PathBuf;
use std::process::Command;

fn tangram(state: &std::path::Path, args: &[&str]) -> (i32, String, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_tangram"));
    cmd.env_remove("TANGRAM_NATS_URL");
    run(cmd, state, args)
}

fn run(mut cmd: Command, state: &std::path::Path, args: &[&str]) -> (i32, String, String) {
    let out = cmd
        .args(args)
        .env("TANGRAM_STATE_DIR", state)
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

struct Down(PathBuf);
impl Drop for Down {
    fn drop(&mut self) {
        let _ = tangram(&self.0, &["down"]);
    }
}

#[test]
fn up_submit_status_down_on_a_real_local_cluster() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let port = tangram_nats::local::free_port().unwrap();
    let nats = repo().join("tools/bin/nats-server");
    // A NATS URL left in the shell (say, of a compose fleet) must not send any of this
    // cluster's processes elsewhere: the GPU worker, configured by file, once followed it.
    let mut up = Command::new(env!("CARGO_BIN_EXE_tangram"));
    up.env("TANGRAM_NATS_URL", "nats://127.0.0.1:1");
    let (code, out, err) = run(
        up,
        &state,
        &[
            "up",
            "--nats-port",
            &port.to_string(),
            "--nats-server",
            nats.to_str().unwrap(),
            "--workers",
            "1",
            "--gpus",
            "2",
            "--services",
            "judge,teacher",
        ],
    );
    let _down = Down(state.clone());
    assert_eq!(code, 0, "up failed: {out}{err}");
    assert!(
        out.contains("tangram is up") && out.contains("cpu-0") && out.contains("gpu-0"),
        "{out}"
    );
    // A second `up` on the same state refuses.
    let (code, _, err) = tangram(
        &state,
        &[
            "up",
            "--nats-port",
            &port.to_string(),
            "--nats-server",
            nats.to_str().unwrap(),
        ],
    );
    assert_ne!(code, 0);
    assert!(err.contains("already up") || err.contains("taken"), "{err}");

    // Auth is on by default: one private seed per role, and no way in without one.
    use std::os::unix::fs::PermissionsExt;
    for role in [
        "operator",
        "scheduler",
        "rollout",
        "worker-cpu-0",
        "worker-gpu-0",
    ] {
        let f = state.join("creds").join(format!("{role}.nk"));
        let mode = std::fs::metadata(&f).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "{}", f.display());
    }
    let elsewhere = dir.path().join("no-creds");
    let (code, _, err) = tangram(
        &elsewhere,
        &["status", "--nats-url", &format!("nats://127.0.0.1:{port}")],
    );
    assert_eq!(code, 1, "a runtime failure exits 1: {err}");
    assert!(err.contains("requires credentials"), "{err}");
    assert!(err.contains("hint:"), "{err}");

    // `status --watch` redraws; --count bounds it.
    let (code, out, err) = tangram(
        &state,
        &["status", "--watch", "0.2", "--count", "2", "--json"],
    );
    assert_eq!(code, 0, "{err}");
    let reports: Vec<serde_json::Value> = serde_json::Deserializer::from_str(&out)
        .into_iter()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(reports.len(), 2, "{out}");
    assert!(reports[1]["uptime_s"].as_f64() >= reports[0]["uptime_s"].as_f64());
    // The metrics `up` turned on answer.
    let running: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(state.join("running.json")).unwrap())
            .unwrap();
    let metrics = running["metrics"].as_array().unwrap();
    assert!(metrics.iter().any(|m| m[0] == "scheduler"), "{running}");
    let addr = metrics[0][1].as_str().unwrap();
    let (code, _, err) = tangram(&state, &["probe", addr, "/metrics"]);
    assert_eq!(code, 0, "{addr}/metrics: {err}");
    assert!(std::fs::read_to_string(state.join("prometheus.yml"))
        .unwrap()
        .contains(addr));
    // Prometheus accepts it (promtool is installed by deploy/test.sh).
    let promtool = repo().join("tools/prometheus/bin/promtool");
    if promtool.exists() {
        let out = Command::new(&promtool)
            .args(["check", "config"])
            .arg(state.join("prometheus.yml"))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stdout)
        );
    }

    let (code, out, err) = tangram(&state, &["submit", "open", "--trajectory", "t1", "--json"]);
    assert_eq!(code, 0, "{out}{err}");
    let (code, out, err) = tangram(
        &state,
        &[
            "submit",
            "exec",
            "--trajectory",
            "t1",
            "--cpus",
            "1-2",
            "--json",
            "--",
            "python3",
            "-c",
            "print(6*7)",
        ],
    );
    assert_eq!(code, 0, "{out}{err}");
    let r: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(r["stdout"], "42\n");
    assert_eq!(r["outcome"]["status"], "completed");
    // A failing command is still `completed`, with its exit code; the CLI exits 0.
    let (code, out, _) = tangram(
        &state,
        &[
            "submit",
            "exec",
            "--trajectory",
            "t1",
            "--",
            "python3",
            "-c",
            "raise SystemExit(3)",
        ],
    );
    assert_eq!(code, 0);
    assert!(out.contains("exit code 3"), "{out}");
    let (code, out, err) = tangram(
        &state,
        &[
            "submit",
            "reward",
            "--service",
            "judge",
            "--input",
            "a",
            "--input",
            "b",
            "--json",
        ],
    );
    assert_eq!(code, 0, "{out}{err}");
    let r: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(r["scores"].as_array().map(Vec::len), Some(2));
    let (code, out, err) = tangram(
        &state,
        &[
            "submit",
            "api",
            "--provider",
            "search",
            "--path",
            "/search",
            "--query",
            "q=count words",
            "--json",
        ],
    );
    assert_eq!(code, 0, "{out}{err}");
    let r: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(r["http"]["status"], 200, "{r}");
    assert!(
        r["http"]["body"].as_str().unwrap().contains("Counter"),
        "{r}"
    );
    // Rejections exit 1 and say why.
    let (code, out, _) = tangram(
        &state,
        &["submit", "reward", "--service", "nope", "--input", "x"],
    );
    assert_eq!(code, 1);
    assert!(out.contains("unknown_service"), "{out}");
    let action = dir.path().join("close.json");
    std::fs::write(
        &action,
        r#"{"spec": {"kind": "sandbox_close"}, "trajectory": "t1"}"#,
    )
    .unwrap();
    let (code, out, err) = tangram(&state, &["submit", "file", action.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}{err}");

    let (code, out, err) = tangram(&state, &["status", "--json"]);
    assert_eq!(code, 0, "{err}");
    let st: serde_json::Value = serde_json::from_str(&out).unwrap();
    let workers: Vec<&str> = st["workers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["id"].as_str().unwrap())
        .collect();
    assert_eq!(workers, ["cpu-0", "gpu-0"]);
    assert_eq!(st["sandboxes"], 0);
    assert!(
        st["services"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s["name"] == "judge" && !s["resident"].as_array().unwrap().is_empty()),
        "{st}"
    );
    assert!(
        st["recent"]["sandbox_exec"]["count"].as_u64().unwrap() >= 2,
        "{st}"
    );
    let (code, out, _) = tangram(&state, &["status"]);
    assert_eq!(code, 0);
    assert!(
        out.contains("recent ACT") && out.contains("provider search"),
        "{out}"
    );

    let (code, out, err) = tangram(&state, &["down"]);
    assert_eq!(code, 0, "{out}{err}");
    let url = format!("nats://127.0.0.1:{port}");
    let (code, _, err) = tangram(&state, &["status", "--nats-url", &url]);
    assert_ne!(code, 0, "status after down must fail");
    assert!(err.contains("NATS") || err.contains("scheduler"), "{err}");
}
