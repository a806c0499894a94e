//! What the CLI's integration tests share: where the repository is, free ports, processes
//! that go when the test does, and waiting (bounded) for a server to listen.
#![allow(dead_code)] // each test binary uses its own part

use std::path::PathBuf;
use std::process::Child;
use std::time::Duration;
use tokio::time::Instant;

/// The repository's root.
pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// A loopback port nothing listens on now.
pub fn free_port() -> u16 {
    tangram_nats::local::free_port().unwrap()
}

/// Child processes killed and reaped when the test ends, however it ends.
#[derive(Debug, Default)]
pub struct Procs(pub Vec<Child>);

impl Drop for Procs {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Waits until something accepts connections on the loopback `port`; panics with `log`'s
/// text after 20 s.
pub fn wait_listening(port: u16, log: &std::path::Path) {
    let began = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            began.elapsed() < Duration::from_secs(20),
            "nothing listened on {port}: {}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The pinned nats-server (`deploy/install-tools.sh` installs it).
pub fn nats_server() -> PathBuf {
    let p = repo().join("tools/bin/nats-server");
    assert!(
        p.exists(),
        "nats-server not found at {}: run `bash deploy/install-tools.sh` first",
        p.display()
    );
    p
}

/// Runs `tangram bench <args> --json` on the pinned nats-server; its report, once it has
/// exited 0 (the test fails with its output otherwise).
pub fn bench_json(args: &[&str]) -> serde_json::Value {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tangram"))
        .arg("bench")
        .args(args)
        .arg("--json")
        .arg("--nats-server")
        .arg(nats_server())
        .env_remove("TANGRAM_NATS_URL")
        .output()
        .expect("running tangram");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "bench failed: {stdout}{stderr}");
    serde_json::from_str(&stdout).expect("one JSON object")
}
