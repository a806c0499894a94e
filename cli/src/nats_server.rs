//! Finding the nats-server `tangram up` and the benches start, and refusing one too old to
//! run Tangram's streams (multi-subject filters, direct gets and the JetStream API we use
//! need 2.10 or newer) with a message that says what to do.

use anyhow::{bail, Context as _};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The version deploy/install-tools.sh pins (and CI tests against).
pub const PINNED: &str = "2.15.1";
/// The oldest version that runs Tangram.
pub const OLDEST: (u32, u32) = (2, 10);

/// The binary to run: the explicit one, else the pinned one in `tools/bin` above the working
/// directory or beside the build, else `nats-server` on PATH. Its version is checked.
pub(crate) fn find(explicit: Option<&PathBuf>) -> anyhow::Result<PathBuf> {
    let found = explicit
        .cloned()
        .or_else(pinned)
        .unwrap_or_else(|| PathBuf::from("nats-server"));
    check(&found)?;
    Ok(found)
}

fn pinned() -> Option<PathBuf> {
    let mut dir = std::env::current_dir().ok()?;
    loop {
        let c = dir.join("tools/bin/nats-server");
        if c.exists() {
            return Some(c);
        }
        if !dir.pop() {
            break;
        }
    }
    // target/<profile>/tangram -> the repository root.
    let exe = std::env::current_exe().ok()?;
    let root = exe.parent().and_then(Path::parent).and_then(Path::parent)?;
    let c = root.join("tools/bin/nats-server");
    c.exists().then_some(c)
}

/// Parses `nats-server: v2.15.1` (or `v2.10.0-beta.3`) into (major, minor, patch).
pub fn parse_version(text: &str) -> Option<(u32, u32, u32)> {
    let v = text.split_whitespace().find_map(|w| w.strip_prefix('v'))?;
    let mut parts = v.split(['.', '-']).map(|p| p.parse::<u32>());
    Some((
        parts.next()?.ok()?,
        parts.next()?.ok()?,
        parts.next()?.unwrap_or(0),
    ))
}

fn check(bin: &Path) -> anyhow::Result<()> {
    let out = Command::new(bin).arg("--version").output().with_context(|| {
        format!(
            "running {} --version: no nats-server there; run deploy/install-tools.sh (it installs the pinned {PINNED} into tools/bin) or pass --nats-server",
            bin.display()
        )
    })?;
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    match parse_version(&text) {
        Some((major, minor, patch)) if (major, minor) < OLDEST => bail!(
            "{} is nats-server {major}.{minor}.{patch}; Tangram needs {}.{} or newer (tested with {PINNED}): run deploy/install-tools.sh, or pass --nats-server with a newer one",
            bin.display(),
            OLDEST.0,
            OLDEST.1
        ),
        Some(_) => Ok(()),
        None => bail!(
            "{} --version printed {:?}, not a nats-server version; pass --nats-server with the pinned {PINNED} (deploy/install-tools.sh)",
            bin.display(),
            text.trim()
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_parse_and_an_old_server_is_refused_with_the_next_step() {
        assert_eq!(parse_version("nats-server: v2.15.1\n"), Some((2, 15, 1)));
        assert_eq!(
            parse_version("nats-server: v2.10.0-beta.3"),
            Some((2, 10, 0))
        );
        assert_eq!(parse_version("command not found"), None);
        let dir = tempfile::tempdir().unwrap();
        let old = dir.path().join("nats-server");
        std::fs::write(&old, "#!/bin/sh\necho 'nats-server: v2.9.25'\n").unwrap();
        std::fs::set_permissions(&old, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        let e = find(Some(&old)).unwrap_err().to_string();
        assert!(
            e.contains("2.9.25") && e.contains("install-tools.sh"),
            "{e}"
        );
        let e = find(Some(&dir.path().join("absent")))
            .unwrap_err()
            .to_string();
        assert!(e.contains("no nats-server there"), "{e}");
    }
}
