//! Every binary says which commit it was built from: `NAME 0.1.0 (git 0123456789ab)`.

use std::process::Command;
use tangram_tests::{built_binary, output_text, repo_root};

#[test]
fn every_binary_prints_its_version_and_git_revision() {
    for name in [
        "tangram",
        "tangram-scheduler",
        "tangram-worker",
        "tangram-faults",
        "tangram-rollout",
    ] {
        let out = Command::new(built_binary(name))
            .arg("--version")
            .output()
            .unwrap_or_else(|e| panic!("running {name} --version: {e}"));
        let text = output_text(&out);
        assert!(out.status.success(), "{name} --version: {text}");
        assert_eq!(
            text.trim(),
            format!("{name} {}", tangram_shared::build::VERSION),
            "{name} --version: not the revision these tests were built at (a binary older than \
             the last commit: `cargo build --bins`)"
        );
    }
    // Built from this checkout (and not told otherwise): the revision is the checkout's.
    let head = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .current_dir(repo_root())
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    if std::env::var_os("TANGRAM_GIT_SHA").is_none() {
        if let Some(head) = head {
            assert_eq!(tangram_shared::build::GIT_SHA, Some(head.as_str()));
            assert!(
                tangram_shared::build::VERSION.ends_with(&format!("(git {head})")),
                "{}",
                tangram_shared::build::VERSION
            );
        }
    }
}
