//! The systemd path: `deploy/install-systemd.sh` lays down binaries, units and configuration
//! templates, the units pass `systemd-analyze verify`, and the NATS configuration template,
//! filled in with `tangram creds`' authorization block, is one nats-server accepts.

use std::path::Path;
use std::process::Command;
use tangram_tests::{built_binary, nats_server_bin, repo_root};

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().expect("running a command");
    let text = tangram_tests::output_text(&out);
    assert!(out.status.success(), "{cmd:?}: {text}");
    text
}

#[test]
fn the_systemd_units_install_and_verify_and_the_nats_template_is_valid() {
    let dir = tempfile::tempdir().unwrap();
    let (prefix, etc, units) = (
        dir.path().join("usr"),
        dir.path().join("etc/tangram"),
        dir.path().join("units"),
    );
    let bin_dir = built_binary("tangram").parent().unwrap().to_path_buf();
    install(&bin_dir, &prefix, &etc, &units);
    for b in [
        "tangram",
        "tangram-scheduler",
        "tangram-worker",
        "nats-server",
    ] {
        assert!(prefix.join("bin").join(b).exists(), "{b} not installed");
    }
    for f in ["nats.conf", "scheduler.toml", "worker.toml.example"] {
        assert!(etc.join(f).exists(), "{f} not laid down");
    }
    // A second run keeps an edited configuration.
    std::fs::write(etc.join("scheduler.toml"), "# edited\n").unwrap();
    install(&bin_dir, &prefix, &etc, &units);
    assert_eq!(
        std::fs::read_to_string(etc.join("scheduler.toml")).unwrap(),
        "# edited\n"
    );

    // The units, the worker template through an instance of it.
    let instance = units.join("tangram-worker@cpu-1.service");
    std::os::unix::fs::symlink(units.join("tangram-worker@.service"), &instance).unwrap();
    let text = run(Command::new("systemd-analyze")
        .args(["verify", "--man=no"])
        .arg(units.join("tangram-nats.service"))
        .arg(units.join("tangram-scheduler.service"))
        .arg(&instance));
    // Warnings would be printed; units on this machine's systemd must raise none of ours.
    let ours: Vec<&str> = text.lines().filter(|l| l.contains("tangram")).collect();
    assert!(ours.is_empty(), "{text}");

    // The NATS template, filled in for one host of three, with the fleet's authorization.
    let creds = dir.path().join("creds");
    run(Command::new(built_binary("tangram"))
        .args([
            "creds",
            "--workers",
            "cpu-1,gpu-1",
            "--jobs",
            "job1",
            "--dir",
        ])
        .arg(&creds));
    let conf = std::fs::read_to_string(etc.join("nats.conf"))
        .unwrap()
        .replace("@SERVER_NAME@", "nats-1")
        .replace("@ROUTES@", "nats://nats-2:6222, nats://nats-3:6222")
        .replace(
            "store_dir: /var/lib/tangram/nats",
            &format!("store_dir: {}", dir.path().join("store").display()),
        );
    let conf_path = etc.join("nats-1.conf");
    std::fs::write(&conf_path, conf).unwrap();
    std::fs::copy(
        creds.join("authorization.conf"),
        etc.join("authorization.conf"),
    )
    .unwrap();
    check_nats_config(&conf_path);
}

/// `deploy/install-systemd.sh` into these folders, without a user or a daemon reload.
fn install(bin_dir: &Path, prefix: &Path, etc: &Path, units: &Path) {
    let mut cmd = Command::new("bash");
    cmd.arg(repo_root().join("deploy/install-systemd.sh"));
    for (flag, dir) in [
        ("--bin-dir", bin_dir),
        ("--prefix", prefix),
        ("--etc", etc),
        ("--units", units),
    ] {
        cmd.arg(flag).arg(dir);
    }
    run(cmd.args(["--no-user", "--no-reload"]));
}

fn check_nats_config(conf: &Path) {
    let out = Command::new(nats_server_bin())
        .arg("-t")
        .arg("-c")
        .arg(conf)
        .output()
        .expect("nats-server -t");
    let text = tangram_tests::output_text(&out);
    assert!(
        out.status.success(),
        "nats-server rejects the template: {text}"
    );
}
