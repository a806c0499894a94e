//! The guard on a sandbox's bind mounts: no container runtime's socket or state, no host
//! tree such as `/proc` or `/etc` (nor a directory holding one), no mount over a guarded
//! place inside the sandbox. Paths are compared canonical, component by component.

use super::{invalid, refused, ConfigError};
use std::path::{Component, Path, PathBuf};

/// Host paths a sandbox may not see, nor any directory holding them: the container
/// runtimes' sockets and state.
const RUNTIME_PATHS: &[&str] = &[
    "/var/run/docker.sock",
    "/run/docker.sock",
    "/run/containerd",
    "/var/run/containerd",
    "/run/crio",
    "/var/run/crio",
    "/run/podman",
    "/var/lib/docker",
    "/var/lib/containerd",
];

/// Host trees a sandbox may not see any part of (or any directory holding them).
const HOST_TREES: &[&str] = &["/proc", "/sys", "/dev", "/etc", "/boot", "/root"];

/// Places inside the sandbox a mount may not cover.
const GUARDED_TARGETS: &[&str] = &["/proc", "/sys", "/dev", "/etc"];

/// Checks one `host:container[:mode]` bind and returns it with the host path canonical.
pub(super) fn check_mount(m: &str) -> Result<String, ConfigError> {
    let mut parts = m.split(':');
    let (Some(host), Some(target)) = (parts.next(), parts.next()) else {
        return invalid(
            "sandbox.mounts",
            format!("{m:?}: a mount is host_path:container_path[:ro|rw]"),
        );
    };
    let mode = parts.next();
    if parts.next().is_some() || !matches!(mode, None | Some("ro") | Some("rw")) {
        return invalid(
            "sandbox.mounts",
            format!("{m:?}: the only mount modes are ro and rw"),
        );
    }
    if !host.starts_with('/') || !target.starts_with('/') {
        return invalid(
            "sandbox.mounts",
            format!("{m:?}: both paths must be absolute"),
        );
    }
    let host_path = canonical(Path::new(host));
    if let Some(why) = host_path_refusal(&host_path) {
        return refused("sandbox.mounts", format!("{m:?}: {why}"));
    }
    let target_path = lexical(Path::new(target));
    if target_path == Path::new("/")
        || GUARDED_TARGETS
            .iter()
            .any(|g| target_path.starts_with(g) || Path::new(g).starts_with(&target_path))
    {
        return refused(
            "sandbox.mounts",
            format!("{m:?}: a mount may not cover / or the sandbox's /proc, /sys, /dev or /etc"),
        );
    }
    let mut out = format!("{}:{}", host_path.display(), target_path.display());
    if let Some(mode) = mode {
        out.push(':');
        out.push_str(mode);
    }
    Ok(out)
}

/// Why a canonical host path may not be mounted, if it may not.
fn host_path_refusal(host: &Path) -> Option<String> {
    if host == Path::new("/") {
        return Some("the host's root holds everything the sandbox must not see".into());
    }
    if let Some(p) = RUNTIME_PATHS
        .iter()
        .find(|p| Path::new(p).starts_with(host) || host.starts_with(p))
    {
        return Some(format!(
            "{} would give model-generated code control of the host's container runtime ({p})",
            host.display()
        ));
    }
    if let Some(p) = HOST_TREES
        .iter()
        .find(|p| Path::new(p).starts_with(host) || host.starts_with(p))
    {
        return Some(format!(
            "{} exposes the host's {p} to model-generated code",
            host.display()
        ));
    }
    if is_socket(host) {
        return Some(format!(
            "{} is a socket; sandboxes get no channel to host services",
            host.display()
        ));
    }
    None
}

#[cfg(unix)]
fn is_socket(p: &Path) -> bool {
    use std::os::unix::fs::FileTypeExt;
    std::fs::metadata(p).is_ok_and(|m| m.file_type().is_socket())
}

#[cfg(not(unix))]
fn is_socket(_: &Path) -> bool {
    false
}

/// The path with symlinks resolved where it exists; else the longest existing ancestor
/// resolved and the rest normalised lexically.
fn canonical(p: &Path) -> PathBuf {
    let p = lexical(p);
    if let Ok(c) = std::fs::canonicalize(&p) {
        return c;
    }
    let mut rest = Vec::new();
    let mut cur = p.as_path();
    while let Some(parent) = cur.parent() {
        if let Some(name) = cur.file_name() {
            rest.push(name.to_owned());
        }
        if let Ok(c) = std::fs::canonicalize(parent) {
            let mut out = c;
            for name in rest.iter().rev() {
                out.push(name);
            }
            return out;
        }
        cur = parent;
    }
    p
}

/// `.` and `..` resolved and repeated slashes dropped, without touching the file system.
fn lexical(p: &Path) -> PathBuf {
    let mut out = PathBuf::from("/");
    for c in p.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::Normal(n) => out.push(n),
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
        }
    }
    out
}
