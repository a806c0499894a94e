//! `tangram submit` rides out what is transient: an action published while its stream cannot
//! store it (not created yet here; a stream electing a leader answers the same way) is tried
//! again with the same id until it is stored, and the one result comes back.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

struct Procs(Vec<Child>);
impl Drop for Procs {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

#[test]
fn a_submit_made_before_its_stream_can_store_it_is_retried_with_its_id() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut procs = Procs(vec![]);
    procs.0.push(
        Command::new(repo().join("tools/bin/nats-server"))
            .args(["-a", "127.0.0.1", "-p", &port.to_string(), "-js", "-sd"])
            .arg(d.join("js"))
            .stderr(std::fs::File::create(d.join("nats.log")).unwrap())
            .spawn()
            .expect("tools/bin/nats-server: run `bash deploy/install-tools.sh`"),
    );
    let began = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(began.elapsed() < Duration::from_secs(20), "nats-server never listened");
        std::thread::sleep(Duration::from_millis(50));
    }
    let url = format!("nats://127.0.0.1:{port}");
    // No scheduler yet, so no stream: the publish finds no responder.
    let submit = Command::new(env!("CARGO_BIN_EXE_tangram"))
        .args(["submit", "reward", "--service", "nope", "--input", "x"])
        .args(["--id", "retried-1", "--json", "--wait-s", "60", "--nats-url", &url])
        .env("TANGRAM_STATE_DIR", d.join("no-state"))
        .env_remove("TANGRAM_NKEY_FILE")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Past the first tries (0.1 + 0.2 + 0.4 s of waits), the scheduler creates the streams.
    std::thread::sleep(Duration::from_millis(1500));
    let scheduler: &Path = &Path::new(env!("CARGO_BIN_EXE_tangram")).with_file_name("tangram-scheduler");
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
    let r: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("submit did not print its result ({e}): {text}"));
    assert_eq!(r["id"], "retried-1", "{r}");
    assert_eq!(r["outcome"]["code"], "unknown_service", "{r}");
}
