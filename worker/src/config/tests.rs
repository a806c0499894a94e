use super::*;

#[test]
fn every_key_can_be_set_from_the_environment_over_the_file() {
    // nextest runs each test in a process of its own: the variables stay here.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("c.toml");
    std::fs::write(
        &file,
        "nats_url = \"nats://file:1\"\nmetrics_addr = \"127.0.0.1:1\"\n",
    )
    .unwrap();
    std::env::set_var(format!("{ENV_PREFIX}METRICS_ADDR"), "127.0.0.1:2");
    std::env::set_var(format!("{ENV_PREFIX}NATS__NKEY_FILE"), "/x/seed.nk");
    std::env::set_var(format!("{ENV_PREFIX}SANDBOX__WARM_POOL"), "6");
    let raw = load_layered(Some(&file)).unwrap();
    assert_eq!(raw.sandbox.as_ref().and_then(|s| s.warm_pool), Some(6));
    assert_eq!(raw.nats_url.as_deref(), Some("nats://file:1"));
    assert_eq!(raw.metrics_addr.as_deref(), Some("127.0.0.1:2"));
    let shown = effective(&raw);
    assert!(shown.contains("nkey_file = \"/x/seed.nk\""), "{shown}");
    std::env::set_var(format!("{ENV_PREFIX}NO_SUCH_KEY"), "1");
    let e = load_layered(Some(&file)).unwrap_err().to_string();
    assert!(e.contains("no_such_key"), "{e}");
    std::env::remove_var(format!("{ENV_PREFIX}NO_SUCH_KEY"));
}

fn parse(text: &str) -> Result<Config, ConfigError> {
    toml::from_str::<RawConfig>(text)
        .map_err(|source| ConfigError::Parse {
            path: "test.toml".into(),
            source,
        })?
        .validate()
}

#[test]
fn a_pooled_worker_takes_id_and_seed_from_the_pool_and_refuses_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let seeds = dir.path().join("creds");
    std::fs::create_dir(&seeds).unwrap();
    std::fs::write(seeds.join("worker-cpu-1.nk"), "SU...\n").unwrap();
    let pool = format!(
        "[pool]\nseeds = \"{}\"\nlocks = \"{}\"\nprefix = \"cpu-\"\n",
        seeds.display(),
        dir.path().join("locks").display()
    );
    let raw: RawConfig = toml::from_str(&pool).unwrap();
    let (raw, claim) = raw.claim_from_pool().unwrap();
    let claim = claim.expect("a claim");
    let config = raw.validate().unwrap();
    assert_eq!(config.id.as_str(), "cpu-1");
    assert_eq!(
        config.credentials.nkey_file.as_deref(),
        Some(seeds.join("worker-cpu-1.nk").as_path())
    );
    drop(claim);
    for own in ["id = \"cpu-9\"\n", "[nats]\nnkey_file = \"/x.nk\"\n"] {
        let raw: RawConfig = toml::from_str(&format!("{own}{pool}")).unwrap();
        let e = raw.claim_from_pool().unwrap_err();
        assert_eq!(
            (e.kind(), e.field()),
            (ConfigErrorKind::Conflict, Some("pool")),
            "{e}"
        );
    }
}

fn fault(text: &str) -> (ConfigErrorKind, Option<&'static str>) {
    let e = parse(text).unwrap_err();
    (e.kind(), e.field())
}

#[test]
fn weakening_isolation_is_refused_with_a_reason() {
    use ConfigErrorKind::Refused;
    for (text, field) in [
        ("[sandbox]\nprivileged = true", "sandbox.privileged"),
        ("[sandbox]\nnetwork = \"host\"", "sandbox.network"),
        (
            "[sandbox]\nmounts = [\"/var/run/docker.sock:/var/run/docker.sock\"]",
            "sandbox.mounts",
        ),
        ("[sandbox]\nuser = \"0:0\"", "sandbox.user"),
        ("[sandbox]\ncap_add = [\"SYS_ADMIN\"]", "sandbox.cap_add"),
    ] {
        assert_eq!(fault(text), (Refused, Some(field)), "{text}");
        assert!(!parse(text).unwrap_err().to_string().is_empty());
    }
    assert!(parse("[sandbox]\nnetwork = \"none\"").is_ok());
}

#[test]
fn unknown_fields_and_bad_values_are_refused() {
    use ConfigErrorKind::*;
    assert_eq!(fault("cors = \"0-1\""), (Parse, None));
    assert_eq!(fault("cores = \"1-0\""), (Invalid, Some("cores")));
    assert_eq!(fault("id = \"a.b\""), (Invalid, Some("id")));
    assert_eq!(fault("mem_mb = 1"), (Invalid, Some("mem_mb")));
    assert_eq!(
        fault("[gpu]\ncount = 2\ngroups = [[0]]"),
        (Conflict, Some("gpu"))
    );
    assert_eq!(fault("sandbox_runtime = \"podman\""), (Parse, None));
    assert_eq!(
        fault("[sandbox]\nwarm_pool = 2\nwarm_pool_min = 3"),
        (Invalid, Some("sandbox.warm_pool_min"))
    );
    assert_eq!(
        fault("[sandbox]\nwarm_pool = 100000"),
        (Invalid, Some("sandbox.warm_pool"))
    );
    // Docker cannot update a gVisor container: its grants would all fail.
    assert_eq!(
        fault("grant_mode = \"docker\"\n[sandbox]\nruntime = \"runsc\""),
        (Conflict, Some("grant_mode"))
    );
    assert!(parse("[sandbox]\nruntime = \"runsc\"")
        .unwrap()
        .sandbox
        .gvisor());
    assert!(!parse("[sandbox]\nruntime = \"runc\"")
        .unwrap()
        .sandbox
        .gvisor());
    let c = parse("id = \"w7\"\ncores = \"0-1\"\ngrant_mode = \"docker\"").unwrap();
    assert_eq!(
        (c.cores, c.grant_mode, c.parking_cores.as_str()),
        (vec![0, 1], GrantMode::Docker, "0")
    );
}

#[test]
fn the_sandbox_runtime_is_docker_unless_noop_is_asked_for() {
    assert_eq!(parse("").unwrap().sandbox_runtime, RuntimeKind::Docker);
    let c = parse("sandbox_runtime = \"noop\"").unwrap();
    assert_eq!(c.sandbox_runtime, RuntimeKind::Noop);
    // A flag or variable wins over the file.
    let file: RawConfig = toml::from_str("sandbox_runtime = \"noop\"").unwrap();
    let flags = RawConfig {
        sandbox_runtime: Some(RuntimeKind::Docker),
        ..Default::default()
    };
    assert_eq!(
        file.merge(flags).validate().unwrap().sandbox_runtime,
        RuntimeKind::Docker
    );
}
