//! Bad configuration stops the binary before it connects anywhere, with exit code 64.

use std::process::Command;

#[test]
fn bad_config_exits_64_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("scheduler.toml");
    std::fs::write(&path, "max_action_bytes = 12\n").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_tangram-scheduler"))
        .arg("--config")
        .arg(&path)
        .env("TANGRAM_NATS_URL", "nats://127.0.0.1:1")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&out.stderr).contains("max_action_bytes"));

    std::fs::write(&path, "nats_url = \"nats://127.0.0.1:1\"\nbogus = true\n").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_tangram-scheduler"))
        .arg("--config")
        .arg(&path)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));

    // The flag beats the environment, which beats the file.
    let out = Command::new(env!("CARGO_BIN_EXE_tangram-scheduler"))
        .args(["--nats-url", "http://wrong"])
        .env("TANGRAM_NATS_URL", "nats://127.0.0.1:1")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&out.stderr).contains("http://wrong"));
}
