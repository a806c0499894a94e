//! `deploy/build-images.sh` builds the four images locally, and each starts.

use std::process::Command;
use tangram_tests::repo_root;

fn docker(args: &[&str]) -> (bool, String) {
    let out = Command::new("docker").args(args).output().expect("docker");
    (out.status.success(), tangram_tests::output_text(&out))
}

#[test]
fn the_images_build_from_the_workspace_binaries_and_start() {
    let root = repo_root();
    // The binaries `cargo build --bins` made for the suite (the script strips them).
    let out = Command::new("bash")
        .arg(root.join("deploy/build-images.sh"))
        .env("TANGRAM_BIN_DIR", root.join("target/debug"))
        .env("TANGRAM_IMAGE_TAG", "test")
        .output()
        .expect("running build-images.sh");
    let log = tangram_tests::output_text(&out);
    assert!(out.status.success(), "{log}");
    let nats = log
        .lines()
        .find_map(|l| l.strip_prefix("built tangram/nats:"))
        .and_then(|l| l.split(':').next())
        .expect("the nats image is named in the log")
        .to_string();
    // Each starts and speaks; the CLI is in every image (health checks use it).
    let (ok, text) = docker(&[
        "run",
        "--rm",
        "--network",
        "none",
        &format!("tangram/nats:{nats}"),
        "--version",
    ]);
    assert!(ok && text.contains("nats-server"), "{text}");
    for image in [
        "tangram/scheduler:test",
        "tangram/worker:test",
        "tangram/gpu-worker:test",
    ] {
        let (ok, text) = docker(&["run", "--rm", "--network", "none", image, "--help"]);
        assert!(ok && text.contains("Usage"), "{image}: {text}");
        let (ok, text) = docker(&[
            "run",
            "--rm",
            "--network",
            "none",
            "--entrypoint",
            "/usr/local/bin/tangram",
            image,
            "--version",
        ]);
        assert!(ok && text.contains("tangram"), "{image}: {text}");
    }
    // Non-root where it can be: all but the CPU worker (host Docker and cgroups).
    for (image, user) in [
        (format!("tangram/nats:{nats}"), "65534:65534"),
        ("tangram/scheduler:test".to_string(), "65534:65534"),
        ("tangram/gpu-worker:test".to_string(), "65534:65534"),
        ("tangram/worker:test".to_string(), ""),
    ] {
        let (_, got) = docker(&["image", "inspect", "-f", "{{.Config.User}}", &image]);
        assert_eq!(got.trim(), user, "{image}");
    }
    // Small: the scheduler's image is its binary, the CLI and the C runtime (about 20 MB
    // from a release build, 80 MB from the suite's stripped debug build).
    let (_, size) = docker(&[
        "image",
        "inspect",
        "-f",
        "{{.Size}}",
        "tangram/scheduler:test",
    ]);
    let mb = size.trim().parse::<u64>().unwrap() / 1_000_000;
    assert!(mb < 150, "the scheduler image is {mb} MB");
}
