//! The configuration's loading, layering and validation.

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
    let raw = load_layered(Some(&file)).unwrap();
    assert_eq!(raw.nats_url.as_deref(), Some("nats://file:1"));
    assert_eq!(raw.metrics_addr.as_deref(), Some("127.0.0.1:2"));
    let shown = effective(&raw);
    assert!(shown.contains("nkey_file = \"/x/seed.nk\""), "{shown}");
    std::env::set_var(format!("{ENV_PREFIX}NO_SUCH_KEY"), "1");
    let e = load_layered(Some(&file)).unwrap_err().to_string();
    assert!(e.contains("no_such_key"), "{e}");
    std::env::remove_var(format!("{ENV_PREFIX}NO_SUCH_KEY"));
}

#[test]
fn images_table_sets_placement_and_refuses_a_zero_pull_rate() {
    let c = toml::from_str::<RawConfig>("[images]\nlocality = false\nload_ms = 5000")
        .unwrap()
        .validate()
        .unwrap();
    assert!(!c.image_locality);
    assert_eq!(c.image_load_ms, 5_000);
    assert_eq!(c.pull_mb_per_s, 100.0);
    assert!(RawConfig::default().validate().unwrap().image_locality);
    let err = toml::from_str::<RawConfig>("[images]\npull_mb_per_s = 0.0")
        .unwrap()
        .validate()
        .unwrap_err();
    assert_eq!(err.field(), Some("images.pull_mb_per_s"));
    assert!(toml::from_str::<RawConfig>("[images]\nlocalty = true").is_err());
}

#[test]
fn job_caps_and_idle_timeouts_are_read_and_bad_ones_refused() {
    let text = "sandbox_idle_timeout_ms = 60000\n\
                [job_caps.\"*\"]\nmax_sandboxes = 64\n\
                [job_caps.big]\nmax_cores = 32\nmax_sandbox_mem_mb = 65536\n";
    let c = toml::from_str::<RawConfig>(text)
        .unwrap()
        .validate()
        .unwrap();
    assert_eq!(c.sandbox_idle_timeout, std::time::Duration::from_secs(60));
    assert_eq!(c.job_caps["*"].max_sandboxes, Some(64));
    assert_eq!(c.job_caps["big"].max_cores, Some(32));
    assert_eq!(c.job_caps["big"].max_sandboxes, None);
    let defaults = RawConfig::default().validate().unwrap();
    assert_eq!(
        defaults.sandbox_idle_timeout,
        std::time::Duration::from_secs(1800)
    );
    assert!(defaults.job_caps.is_empty());
    for (bad, field) in [
        ("[job_caps.a]\nmax_cores = 0", "job_caps"),
        ("[job_caps.\"a b\"]\nmax_cores = 2", "job_caps"),
        ("sandbox_idle_timeout_ms = 500", "sandbox_idle_timeout_ms"),
        (
            "sandbox_idle_timeout_ms = 7200000\nmax_sandbox_idle_timeout_ms = 3600000",
            "sandbox_idle_timeout_ms",
        ),
    ] {
        let err = toml::from_str::<RawConfig>(bad)
            .unwrap()
            .validate()
            .unwrap_err();
        assert_eq!(err.field(), Some(field), "{bad}");
    }
    assert!(toml::from_str::<RawConfig>("[job_caps.a]\nmax_core = 2").is_err());
}

#[test]
fn provider_definitions_are_read_with_the_workers_defaults_and_checked() {
    let c = toml::from_str::<RawConfig>("[[provider]]\nname = \"search\"\nrate_per_s = 20.0")
        .unwrap()
        .validate()
        .unwrap();
    let p = &c.providers["search"];
    assert_eq!(
        (p.rate_per_s, p.burst, p.concurrency, p.slow_ms),
        (20.0, 1, 16, None)
    );
    for bad in [
        "[[provider]]\nname = \"s\"\nrate_per_s = 0.0",
        "[[provider]]\nname = \"s\"\nrate_per_s = 1.0\n[[provider]]\nname = \"s\"\nrate_per_s = 2.0",
    ] {
        let err = toml::from_str::<RawConfig>(bad).unwrap().validate().unwrap_err();
        assert_eq!(err.field(), Some("provider"), "{bad}");
    }
}

#[test]
fn a_simulator_only_policy_is_refused_with_its_live_equivalent() {
    let err = RawConfig {
        policy: Some("k8s".into()),
        ..Default::default()
    }
    .validate()
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("simulator baseline") && err.contains("static"),
        "{err}"
    );
}

#[test]
fn later_layers_win_and_bad_values_are_explained() {
    let file: RawConfig =
        toml::from_str("nats_url = \"nats://file:1\"\nmax_action_bytes = 4096").unwrap();
    let flags = RawConfig {
        nats_url: Some("nats://flag:2".into()),
        ..Default::default()
    };
    let c = file.merge(flags).validate().unwrap();
    assert_eq!(c.nats_url, "nats://flag:2");
    assert_eq!(c.max_action_bytes, 4096);

    assert!(
        toml::from_str::<RawConfig>("nats_urll = \"x\"").is_err(),
        "unknown field accepted"
    );
    let err = RawConfig {
        max_action_bytes: Some(10),
        ..Default::default()
    }
    .validate()
    .unwrap_err();
    assert_eq!(err.field(), Some("max_action_bytes"));
    let err = RawConfig {
        metrics_addr: Some("nope".into()),
        ..Default::default()
    }
    .validate()
    .unwrap_err();
    assert_eq!(err.field(), Some("metrics_addr"));
    let err = RawConfig {
        policy: Some("fastest".into()),
        ..Default::default()
    }
    .validate()
    .unwrap_err();
    assert_eq!(err.field(), Some("policy"));
    assert!(
        err.to_string().contains("tangram"),
        "names the choices: {err}"
    );
}

#[test]
fn unreadable_and_unparsable_files_are_told_apart() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope.toml");
    assert!(matches!(
        RawConfig::from_file(&missing),
        Err(ConfigError::Read { .. })
    ));
    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, "policy = \"tangram\"\nunknown_key = 1\n").unwrap();
    let err = RawConfig::from_file(&bad).unwrap_err();
    assert!(matches!(err, ConfigError::Parse { .. }), "{err}");
    assert!(err.to_string().contains("unknown_key"), "{err}");
}

#[test]
fn admission_per_job_gpu_caps_and_service_definitions_are_read_and_bad_ones_refused() {
    let text = "max_queued_per_job = 500\n\
                [job_caps.eval]\nmax_queued = 50\nmax_gpu_calls = 4\n\
                [[service]]\nname = \"judge\"\nslots = 32\nrestore_ms = 2000\n";
    let c = toml::from_str::<RawConfig>(text)
        .unwrap()
        .validate()
        .unwrap();
    assert_eq!(c.max_queued_per_job, 500);
    assert_eq!(c.job_caps["eval"].max_queued, Some(50));
    assert_eq!(c.job_caps["eval"].max_gpu_calls, Some(4));
    let judge = &c.services["judge"];
    assert_eq!((judge.gpus, judge.slots, judge.restore_ms), (1, 32, 2000));
    // By default a job may hold a quarter of what the scheduler holds.
    let defaults = RawConfig::default().validate().unwrap();
    assert_eq!(defaults.max_queued_per_job, 25_000);
    assert_eq!(defaults.max_queued_bytes_per_job, 256 << 20);
    assert!(defaults.services.is_empty());
    for (bad, field) in [
        ("max_queued_per_job = 0", "max_queued_per_job"),
        ("max_queued_per_job = 200000", "max_queued_per_job"),
        (
            "max_queued_bytes_per_job = 1024",
            "max_queued_bytes_per_job",
        ),
        ("[job_caps.a]\nmax_gpu_calls = 0", "job_caps"),
        ("[[service]]\nname = \"j\"\ngpus = 3", "service"),
        ("[[service]]\nname = \"\"", "service"),
        (
            "[[service]]\nname = \"j\"\n[[service]]\nname = \"j\"",
            "service",
        ),
    ] {
        let err = toml::from_str::<RawConfig>(bad)
            .unwrap()
            .validate()
            .unwrap_err();
        assert_eq!(err.field(), Some(field), "{bad}");
    }
    assert!(toml::from_str::<RawConfig>("[[service]]\nname = \"j\"\ndriver = \"vllm\"").is_err());
}
