//! Bad configuration stops the binary before it connects anywhere, with exit code 64; the
//! library says which kind of mistake it is and which key.

use std::process::Command;
use tangram_worker::config::{ConfigErrorKind, RawConfig};

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

/// The same file, judged by the library.
fn fault(text: &str) -> (ConfigErrorKind, Option<&'static str>) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("worker.toml");
    std::fs::write(&path, text).unwrap();
    let e = RawConfig::from_file(&path)
        .and_then(RawConfig::validate)
        .unwrap_err();
    (e.kind(), e.field())
}

#[test]
fn isolation_weakening_config_is_refused_with_exit_64() {
    use ConfigErrorKind::{Parse, Refused};
    for (text, kind, field) in [
        (
            "[sandbox]\nprivileged = true\n",
            Refused,
            Some("sandbox.privileged"),
        ),
        (
            "[sandbox]\nnetwork = \"host\"\n",
            Refused,
            Some("sandbox.network"),
        ),
        (
            "[sandbox]\nmounts = [\"/var/run/docker.sock:/var/run/docker.sock\"]\n",
            Refused,
            Some("sandbox.mounts"),
        ),
        (
            "[sandbox]\nruntime = \"sysbox-runc\"\n",
            Refused,
            Some("sandbox.runtime"),
        ),
        (
            "[sandbox]\nmounts = [\"/var/run/../run/docker.sock:/s\"]\n",
            Refused,
            Some("sandbox.mounts"),
        ),
        ("[sandbox]\nuser = \"00\"\n", Refused, Some("sandbox.user")),
        ("unknown_key = 1\n", Parse, None),
    ] {
        assert_eq!(fault(text), (kind, field), "{text}");
        let (code, stderr) = run(&[], Some(text));
        assert_eq!(code, 64, "{text}: {stderr}");
    }
    let (code, stderr) = run(&["--cores", "3-1"], None);
    assert_eq!(code, 64, "{stderr}");
    let (code, stderr) = run(&["--grant-mode", "magic"], None);
    assert_ne!(code, 0, "{stderr}");
    let (code, stderr) = run(&["--sandbox-runtime", "podman"], None);
    assert_ne!(code, 0, "{stderr}");
}
