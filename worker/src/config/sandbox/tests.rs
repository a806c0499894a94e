//! The `[sandbox]` table's checks: what is refused, and why.

use super::*;
use crate::config::ConfigErrorKind;

fn sandbox(text: &str) -> Result<SandboxConfig, ConfigError> {
    validate_sandbox(toml::from_str(text).unwrap())
}

fn kind(text: &str) -> ConfigErrorKind {
    sandbox(text).unwrap_err().kind()
}

#[test]
fn docker_host_takes_a_local_socket_only() {
    let c = sandbox("docker_host = \"unix:///run/d2/docker.sock\"").unwrap();
    assert_eq!(c.docker_host.as_deref(), Some("unix:///run/d2/docker.sock"));
    assert_eq!(sandbox("").unwrap().docker_host, None);
    for bad in [
        "tcp://10.0.0.2:2375",
        "/var/run/docker.sock",
        "unix://relative",
    ] {
        let e = sandbox(&format!("docker_host = {bad:?}")).unwrap_err();
        assert!(e.to_string().contains("sandbox.docker_host"), "{bad}: {e}");
    }
}

#[test]
fn runtime_socket_mounts_are_refused_however_the_path_is_spelled() {
    for m in [
        "/var/run/docker.sock:/s",
        "/var/run/../run/docker.sock:/s",
        "//var//run/./docker.sock:/s",
        "/var/lib/docker/volumes:/v:ro",
        "/var:/host-var:ro",
        "/run:/r",
        "/:/host",
        "/proc/1/root:/x",
        "/etc/shadow:/x:ro",
    ] {
        let text = format!("mounts = [{m:?}]");
        assert_eq!(kind(&text), ConfigErrorKind::Refused, "{m}");
    }
}

#[test]
fn a_symlink_to_the_runtime_socket_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let link = dir.path().join("innocent");
    std::os::unix::fs::symlink("/var/run", &link).unwrap();
    let text = format!("mounts = [\"{}/docker.sock:/s\"]", link.display());
    assert_eq!(kind(&text), ConfigErrorKind::Refused);
}

#[test]
fn an_ordinary_data_mount_is_kept_with_its_canonical_path() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir(&data).unwrap();
    let spelled = format!("{}/./data/../data", dir.path().display());
    let c = sandbox(&format!("mounts = [\"{spelled}:/data:ro\"]")).unwrap();
    let canon = std::fs::canonicalize(&data).unwrap();
    assert_eq!(c.mounts, vec![format!("{}:/data:ro", canon.display())]);
}

#[test]
fn malformed_mounts_and_guarded_targets_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display();
    assert_eq!(kind("mounts = [\"data:/data\"]"), ConfigErrorKind::Invalid);
    assert_eq!(kind("mounts = [\"/srv\"]"), ConfigErrorKind::Invalid);
    assert_eq!(
        kind(&format!("mounts = [\"{d}:/data:shared\"]")),
        ConfigErrorKind::Invalid
    );
    for target in ["/", "/proc", "/etc/passwd", "/dev/../dev/x"] {
        assert_eq!(
            kind(&format!("mounts = [\"{d}:{target}\"]")),
            ConfigErrorKind::Refused,
            "{target}"
        );
    }
}

#[test]
fn an_open_names_the_default_image_or_one_the_rules_allow_never_an_id() {
    let rule = |r: &str| tangram_shared::image::ImageRule::parse(r).unwrap();
    let c = PullConfig {
        allow: vec![rule("127.0.0.1:5000/team/*")],
        local: vec![rule("docker.io/local/*")],
        ..Default::default()
    };
    let default = "tangram/sandbox:poly-v2";
    for ok in [
        default,
        "docker.io/tangram/sandbox:poly-v2",
        "127.0.0.1:5000/team/app:1",
        "local/app:2",
    ] {
        assert_eq!(c.open_refusal(ok, default), None, "{ok}");
    }
    for refused in [
        "tangram/nats:latest",
        "other/app:1",
        "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
        "0123456789ab",
    ] {
        let why = c.open_refusal(refused, default).expect(refused);
        assert!(
            why.contains("allow-list") || why.contains("image id"),
            "{why}"
        );
    }
}

#[test]
fn pull_rules_and_registry_credentials_are_checked_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let auth = dir.path().join("auth.json");
    std::fs::write(
        &auth,
        r#"{"127.0.0.1:5000": {"username": "u", "password": "pw"}}"#,
    )
    .unwrap();
    let c = sandbox(&format!(
        "pull = [\"127.0.0.1:5000/team/*\"]\nregistry_auth_file = {:?}\npull_timeout_ms = 5000",
        auth.display().to_string()
    ))
    .unwrap();
    assert!(c.pull.refusal("127.0.0.1:5000/team/app:1").is_none());
    assert_eq!(c.pull.auth["127.0.0.1:5000"].username, "u");
    assert!(
        !format!("{c:?}").contains("pw"),
        "the password shows in Debug"
    );
    for bad in [
        "pull = [\"no-registry\"]",
        "pull = [\"reg.example/a*b\"]",
        "pull_timeout_ms = 5",
    ] {
        assert_eq!(kind(bad), ConfigErrorKind::Invalid, "{bad}");
    }
    std::fs::write(&auth, "{not json").unwrap();
    let text = format!("registry_auth_file = {:?}", auth.display().to_string());
    assert_eq!(kind(&text), ConfigErrorKind::Invalid);
    assert_eq!(
        kind("registry_auth_file = \"/no/such/auth.json\""),
        ConfigErrorKind::Invalid
    );
}

#[test]
fn root_is_refused_by_any_spelling() {
    for user in ["0", "00", "0:1000", "root", "root:root", ""] {
        assert_eq!(
            kind(&format!("user = {user:?}")),
            ConfigErrorKind::Refused,
            "{user}"
        );
    }
    assert!(sandbox("user = \"1000:1000\"").is_ok());
    assert!(sandbox("user = \"nobody\"").is_ok());
}

#[test]
fn the_runtime_must_be_in_the_allow_list() {
    assert_eq!(sandbox("").unwrap().runtime, None);
    assert_eq!(
        sandbox("runtime = \"runsc\"").unwrap().runtime.as_deref(),
        Some("runsc")
    );
    assert_eq!(kind("runtime = \"sysbox-runc\""), ConfigErrorKind::Refused);
    assert_eq!(
        kind("runtime = \"runsc\"\nallowed_runtimes = [\"runc\"]"),
        ConfigErrorKind::Refused
    );
    let c = sandbox("runtime = \"my-vm\"\nallowed_runtimes = [\"my-vm\"]").unwrap();
    assert_eq!(c.runtime.as_deref(), Some("my-vm"));
}
