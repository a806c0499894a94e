//! Bad configuration stops the binary before it connects anywhere, with exit code 64.

use std::process::Command;

fn run(args: &[&str], file: Option<&str>) -> (i32, String) {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_tangram-worker"));
    if let Some(text) = file {
        let path = dir.path().join("worker.toml");
        std::fs::write(&path, text).unwrap();
        cmd.arg("--config").arg(path);
    }
    // An unreachable NATS URL: a config error must be reported before any connection.
    let out = cmd
        .args(args)
        .env("TANGRAM_NATS_URL", "nats://127.0.0.1:1")
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn isolation_weakening_config_is_refused_with_exit_64() {
    for (text, word) in [
        ("[sandbox]\nprivileged = true\n", "privileged"),
        ("[sandbox]\nnetwork = \"host\"\n", "network"),
        (
            "[sandbox]\nmounts = [\"/var/run/docker.sock:/var/run/docker.sock\"]\n",
            "docker.sock",
        ),
        ("unknown_key = 1\n", "unknown"),
    ] {
        let (code, stderr) = run(&[], Some(text));
        assert_eq!(code, 64, "{text}: {stderr}");
        assert!(stderr.contains(word), "{text}: {stderr}");
    }
    let (code, stderr) = run(&["--cores", "3-1"], None);
    assert_eq!(code, 64, "{stderr}");
    let (code, stderr) = run(&["--grant-mode", "magic"], None);
    assert_ne!(code, 0, "{stderr}");
}
