//! The local-cluster launcher (`tangram_nats::local`) that `tangram up`, the benches and the
//! tests start their processes with: every flag it renders is one the binaries take, with
//! the meaning it was given. Each binary is asked (`--check-config`) for its configuration as
//! it takes effect from the rendered command line alone. (The worker's benchmark-only replica
//! flags are not part of its configuration; the fleet bench's bounded run starts them.)

use std::process::Command;
use tangram_nats::local::{SchedulerProcess, WorkerProcess};
use tangram_tests::{built_binary, output_text};

/// The configuration `cmd --check-config` prints, or why it failed. The environment is
/// cleared of the binaries' variables, so that only the command line speaks.
fn effective(mut cmd: Command) -> String {
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("TANGRAM_") {
            cmd.env_remove(k);
        }
    }
    let out = cmd.arg("--check-config").output().expect("running it");
    let text = output_text(&out);
    assert!(out.status.success(), "--check-config failed: {text}");
    text
}

/// Whether the printed configuration sets `key` to `value` (TOML, a value quoted or not).
fn sets(text: &str, key: &str, value: &str) -> bool {
    text.lines().any(|l| {
        let Some((k, v)) = l.split_once('=') else {
            return false;
        };
        k.trim() == key && v.trim().trim_matches('"') == value
    })
}

#[test]
fn every_scheduler_flag_the_launcher_renders_takes_effect() {
    let s = SchedulerProcess {
        id: Some("launched-1".into()),
        nats_url: Some("nats://127.0.0.1:4399".into()),
        policy: Some("static".into()),
        static_cores: Some(3),
        metrics_addr: Some("127.0.0.1:9599".into()),
        stream_replicas: Some(3),
    };
    let text = effective(s.command(&built_binary("tangram-scheduler")));
    for (key, value) in [
        ("id", "launched-1"),
        ("nats_url", "nats://127.0.0.1:4399"),
        ("policy", "static"),
        ("static_cores", "3"),
        ("metrics_addr", "127.0.0.1:9599"),
        ("replicas", "3"),
    ] {
        assert!(sets(&text, key, value), "{key} is not {value}:\n{text}");
    }
}

#[test]
fn every_worker_flag_the_launcher_renders_takes_effect() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("worker.toml");
    // Flags win over the file, as a caller that passes both expects.
    std::fs::write(&file, "id = \"from-file\"\nmem_mb = 1024\n").unwrap();
    let w = WorkerProcess {
        config: Some(file),
        id: Some("launched-cpu".into()),
        nats_url: Some("nats://127.0.0.1:4399".into()),
        cores: Some("0-1".into()),
        mem_mb: Some(3_072),
        heartbeat_ms: Some(250),
        sandbox_runtime: Some("noop".into()),
        metrics_addr: Some("127.0.0.1:9598".into()),
        ..Default::default()
    };
    let text = effective(w.command(&built_binary("tangram-worker")));
    for (key, value) in [
        ("id", "launched-cpu"),
        ("nats_url", "nats://127.0.0.1:4399"),
        ("cores", "0-1"),
        ("mem_mb", "3072"),
        ("heartbeat_ms", "250"),
        ("sandbox_runtime", "noop"),
        ("metrics_addr", "127.0.0.1:9598"),
    ] {
        assert!(sets(&text, key, value), "{key} is not {value}:\n{text}");
    }
}

#[test]
fn a_worker_from_a_file_alone_takes_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("worker.toml");
    std::fs::write(&file, "id = \"from-file\"\nmem_mb = 1024\n").unwrap();
    let w = WorkerProcess {
        config: Some(file),
        ..Default::default()
    };
    let text = effective(w.command(&built_binary("tangram-worker")));
    assert!(sets(&text, "id", "from-file"), "{text}");
    assert!(sets(&text, "mem_mb", "1024"), "{text}");
}
