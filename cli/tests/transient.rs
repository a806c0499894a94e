//! `tangram submit` rides out what is transient: an action published while its stream cannot
//! store it (not created yet here; a stream electing a leader answers the same way) is tried
//! again with the same id until it is stored, and the one result comes back.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

mod common;
use common::{free_port, repo, wait_listening, Procs};

#[test]
fn a_submit_made_before_its_stream_can_store_it_is_retried_with_its_id() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let port = free_port();
    let mut procs = Procs(vec![]);
    // The file store sized, so that the streams fit however full the disk is.
    std::fs::write(
        d.join("nats.conf"),
        format!(
            "listen: 127.0.0.1:{port}\njetstream {{ store_dir: \"{}\", max_file_store: 20GB }}\n",
            d.join("js").display()
        ),
    )
    .unwrap();
    procs.0.push(
        Command::new(repo().join("tools/bin/nats-server"))
            .arg("-c")
            .arg(d.join("nats.conf"))
            .stderr(std::fs::File::create(d.join("nats.log")).unwrap())
            .spawn()
            .expect("tools/bin/nats-server: run `bash deploy/install-tools.sh`"),
    );
    wait_listening(port, &d.join("nats.log"));
    let url = format!("nats://127.0.0.1:{port}");
    // No scheduler yet, so no stream: the publish finds no responder.
    let submit = Command::new(env!("CARGO_BIN_EXE_tangram"))
        .args(["submit", "reward", "--service", "nope", "--input", "x"])
        .args([
            "--id",
            "retried-1",
            "--json",
            "--wait-s",
            "60",
            "--nats-url",
            &url,
        ])
        .env("TANGRAM_STATE_DIR", d.join("no-state"))
        .env_remove("TANGRAM_NKEY_FILE")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Past the first tries (0.1 + 0.2 + 0.4 s of waits), the scheduler creates the streams.
    std::thread::sleep(Duration::from_millis(1500));
    let scheduler: &Path =
        &Path::new(env!("CARGO_BIN_EXE_tangram")).with_file_name("tangram-scheduler");
    procs.0.push(
        Command::new(scheduler)
            .args(["--nats-url", &url])
            .stdout(std::fs::File::create(d.join("scheduler.log")).unwrap())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("{}: {e} (cargo build --bins)", scheduler.display())),
    );
    let out = submit.wait_with_output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "submit did not print its result ({e}): {text}\nscheduler: {}",
            std::fs::read_to_string(d.join("scheduler.log")).unwrap_or_default()
        )
    });
    assert_eq!(r["id"], "retried-1", "{r}");
    assert_eq!(r["outcome"]["code"], "unknown_service", "{r}");
}
