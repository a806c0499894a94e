//! Gives the crate the git revision it is built from: `TANGRAM_GIT_SHA` when the build sets
//! it (a release pipeline, or a developer pinning it to stop commits from rebuilding the
//! workspace), else `git rev-parse` on the checkout, else none (a source tree without git).
//! `tangram_shared::build` turns it into the `--version` line and `tangram_build_info`.

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=TANGRAM_GIT_SHA");
    println!("cargo:rerun-if-changed=build.rs");
    let given = std::env::var("TANGRAM_GIT_SHA")
        .ok()
        .filter(|s| !s.trim().is_empty());
    let sha = given.or_else(from_git);
    let version = std::env::var("CARGO_PKG_VERSION").unwrap_or_default();
    match &sha {
        Some(sha) => {
            println!("cargo:rustc-env=TANGRAM_GIT_SHA={sha}");
            println!("cargo:rustc-env=TANGRAM_VERSION={version} (git {sha})");
        }
        None => println!("cargo:rustc-env=TANGRAM_VERSION={version} (git unknown)"),
    }
}

/// The short revision of HEAD, watching the files that change when HEAD moves (a commit, a
/// checkout, a fetch that packs refs).
fn from_git() -> Option<String> {
    let git = |args: &[&str]| -> Option<String> {
        let out = Command::new("git").args(args).output().ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
            .filter(|s| !s.is_empty())
    };
    let sha = git(&["rev-parse", "--short=12", "HEAD"])?;
    let absolute = |p: String| -> PathBuf {
        let p = PathBuf::from(p);
        if p.is_absolute() {
            p
        } else {
            Path::new(&std::env::var("CARGO_MANIFEST_DIR").unwrap_or_default()).join(p)
        }
    };
    if let Some(dir) = git(&["rev-parse", "--git-dir"]).map(absolute) {
        watch(&dir.join("HEAD"));
    }
    if let Some(common) = git(&["rev-parse", "--git-common-dir"]).map(absolute) {
        watch(&common.join("packed-refs"));
        if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
            watch(&common.join(branch));
        }
    }
    Some(sha)
}

fn watch(path: &Path) {
    if path.exists() {
        println!("cargo:rerun-if-changed={}", path.display());
    }
}
