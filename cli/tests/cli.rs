//! The CLI's own behaviour, no cluster needed: exit codes, errors with their next step,
//! configuration layering and its check, shell completions.

use std::process::Command;

fn tangram(args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_tangram"))
        .args(args)
        .current_dir(dir.path())
        .env_remove("TANGRAM_NATS_URL")
        .env_remove("TANGRAM_NKEY_FILE")
        .envs(env.iter().copied())
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_refused_connection_exits_1_with_its_cause_once_and_the_next_step() {
    let port = tangram_nats::local::free_port().unwrap();
    let url = format!("nats://127.0.0.1:{port}");
    for args in [
        vec!["status", "--nats-url", &url],
        vec!["inspect", "a1", "--nats-url", &url],
        vec!["replay", "jobs", "--nats-url", &url],
    ] {
        let (code, _, err) = tangram(&args, &[]);
        assert_eq!(code, 1, "{args:?}: {err}");
        assert_eq!(
            err.matches("Connection refused").count(),
            1,
            "{args:?}: {err}"
        );
        assert!(err.contains("hint: is the cluster up?"), "{args:?}: {err}");
    }
    let (code, _, err) = tangram(&["inspect", "a.b"], &[]);
    assert_eq!(code, 2, "a bad id is a usage error: {err}");
    assert!(err.contains("a.b"), "{err}");
    let (code, _, _) = tangram(&["status", "--no-such-flag"], &[]);
    assert_eq!(code, 2, "usage errors exit 2");
}

#[test]
fn check_config_prints_up_as_flags_env_and_file_merge_it() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("t.toml");
    std::fs::write(&file, "[up]\nworkers = 4\ngpus = 0\nsearch_rate = 7\n").unwrap();
    let f = file.to_str().unwrap();
    // The file over the defaults, the environment over the file, flags over both.
    let (code, out, err) = tangram(
        &["--config", f, "check-config", "--search-rate", "9"],
        &[("TANGRAM_UP_GPUS", "3")],
    );
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("workers = 4"), "{out}");
    assert!(out.contains("gpus = 3"), "{out}");
    assert!(out.contains("search_rate = 9.0"), "{out}");
    // What `up` resolves when unset is shown as it would take effect.
    assert!(out.contains("nats_monitor_port = 8222"), "{out}");
    let (code, out, err) = tangram(
        &[
            "check-config",
            "--nats-port",
            "4300",
            "--nats-server",
            "/no/such/nats-server",
        ],
        &[],
    );
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("nats_server = \"/no/such/nats-server\""),
        "{out}"
    );
    assert!(out.contains("# nats_server: not usable"), "{out}");
    assert!(out.contains("# nats_monitor_port: a free port"), "{out}");
    // `--metrics` wins over a file's `no_metrics = true`; a file's `metrics = false` is
    // `no_metrics = true`.
    std::fs::write(&file, "[up]\nno_metrics = true\n").unwrap();
    let (_, out, _) = tangram(&["--config", f, "check-config"], &[]);
    assert!(out.contains("no_metrics = true"), "{out}");
    let (_, out, _) = tangram(&["--config", f, "check-config", "--metrics"], &[]);
    assert!(out.contains("no_metrics = false"), "{out}");
    std::fs::write(&file, "[up]\nmetrics = false\n").unwrap();
    let (_, out, _) = tangram(&["--config", f, "check-config"], &[]);
    assert!(out.contains("no_metrics = true"), "{out}");
    std::fs::write(&file, "[up]\nworkerz = 4\n").unwrap();
    let (code, _, err) = tangram(&["--config", f, "check-config"], &[]);
    assert_eq!(code, 64, "{err}");
    assert!(
        err.contains("unknown key up.workerz") && err.contains("`workers`"),
        "{err}"
    );
}

#[test]
fn check_config_of_a_scheduler_or_worker_file_merges_its_environment_and_redacts() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("s.toml");
    std::fs::write(
        &file,
        "nats_url = \"nats://a:4222\"\npolicy = \"tangram\"\n",
    )
    .unwrap();
    let f = file.to_str().unwrap();
    let (code, out, err) = tangram(
        &["check-config", "--scheduler", f],
        &[
            ("TANGRAM_SCHEDULER_MAX_QUEUED_ACTIONS", "77"),
            ("TANGRAM_SCHEDULER_STREAMS__REPLICAS", "3"),
        ],
    );
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("max_queued_actions = 77"), "{out}");
    assert!(out.contains("replicas = 3"), "{out}");
    let (code, _, err) = tangram(
        &["check-config", "--scheduler", f],
        &[("TANGRAM_SCHEDULER_POLICY", "magic")],
    );
    assert_eq!(code, 64, "{err}");
    assert!(err.contains("magic"), "{err}");
    let (code, out, err) = tangram(
        &["check-config", "--worker", f],
        &[("TANGRAM_WORKER_ID", "w7")],
    );
    // The scheduler's `policy` is no worker key.
    assert_eq!(code, 64, "{out}{err}");
    assert!(err.contains("policy"), "{err}");
}

#[test]
fn completions_are_printed_for_each_shell() {
    for shell in ["bash", "zsh", "fish"] {
        let (code, out, err) = tangram(&["completions", shell], &[]);
        assert_eq!(code, 0, "{err}");
        assert!(
            out.contains("replay") && out.contains("inspect"),
            "{shell}: {out}"
        );
    }
    let (code, _, _) = tangram(&["completions", "tcsh"], &[]);
    assert_eq!(code, 2);
    let (_, out, _) = tangram(&["--help"], &[]);
    assert!(out.starts_with("The tangram command"), "{out}");
    assert!(!out.contains("come next"), "{out}");
}
