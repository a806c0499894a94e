//! Codec tests: every message type round-trips in both encodings, and its msgpack bytes match
//! a checked-in golden file, so an accidental wire change fails here first.
//! Regenerate the golden files after an intended change with `TANGRAM_BLESS=1`.

use serde::de::DeserializeOwned;
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt::Debug;
use std::path::PathBuf;
use tangram_shared::codec::{decode, decode_action, encode};
use tangram_shared::*;

fn golden<T: Serialize + DeserializeOwned + PartialEq + Debug>(name: &str, msg: &T) {
    for enc in [Encoding::Msgpack, Encoding::Json] {
        let bytes = encode(msg, enc).unwrap();
        let back: T = decode(&bytes, enc).unwrap();
        assert_eq!(&back, msg, "{name} does not round-trip in {enc:?}");
    }
    let bytes = encode(msg, Encoding::Msgpack).unwrap();
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(format!("{name}.msgpack.hex"));
    if std::env::var_os("TANGRAM_BLESS").is_some() {
        std::fs::write(&path, format!("{hex}\n")).unwrap();
    }
    let want = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e}; run with TANGRAM_BLESS=1 to create it",
            path.display()
        )
    });
    assert_eq!(hex, want.trim(), "{name}: msgpack bytes changed");
    let from_golden: T = decode(&bytes_of(want.trim()), Encoding::Msgpack).unwrap();
    assert_eq!(&from_golden, msg);
}

fn bytes_of(hex: &str) -> Vec<u8> {
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
        .collect()
}

fn exec_action() -> Action {
    Action {
        queue_timeout_ms: None,
        id: ActionId::new("a-1").unwrap(),
        job: JobId::new("job1").unwrap(),
        trajectory: TrajectoryId::new("t17").unwrap(),
        timeout_ms: 10_000,
        spec: ActionSpec::SandboxExec(SandboxExec {
            argv: vec!["python3".into(), "main.py".into(), "-j{cpus}".into()],
            cpus: CpuRange { min: 1, max: 4 },
            files: BTreeMap::from([("main.py".into(), "print(1)\n".into())]),
            env: BTreeMap::from([("SEED".into(), "7".into())]),
            stdin: Some("hi".into()),
        }),
    }
}

#[test]
fn actions() {
    golden("action_sandbox_exec", &exec_action());
    let open = Action {
        spec: ActionSpec::SandboxOpen(SandboxOpen {
            image: Some("tangram/sandbox:py3-v1".into()),
            memory_mb: 1024,
            workdir_mb: 128,
            env: BTreeMap::new(),
            idle_timeout_ms: None,
        }),
        ..exec_action()
    };
    golden("action_sandbox_open", &open);
    golden(
        "action_sandbox_close",
        &Action {
            spec: ActionSpec::SandboxClose(SandboxClose::default()),
            ..exec_action()
        },
    );
}

#[test]
fn results() {
    let done = ActionResult {
        id: ActionId::new("a-1").unwrap(),
        job: JobId::new("job1").unwrap(),
        trajectory: Some(TrajectoryId::new("t17").unwrap()),
        kind: Some(ActionKind::SandboxExec),
        outcome: Outcome::Completed { exit_code: 3 },
        stdout: "1\n".into(),
        stderr: String::new(),
        truncated: false,
        placement: Some(Placement {
            worker: WorkerId::new("cpu-0").unwrap(),
            cores: 2,
            cpuset: "2-3".into(),
        }),
        timing: Timing::new(1200, 350, 980_000),
        attempt: 1,
        finished_at_ms: 1_790_000_000_000,
        scores: None,
        service: None,
        http: None,
    };
    golden("result_completed", &done);
    golden(
        "result_timed_out",
        &ActionResult {
            outcome: Outcome::TimedOut,
            truncated: true,
            ..done.clone()
        },
    );
    golden(
        "result_out_of_memory",
        &ActionResult {
            outcome: Outcome::OutOfMemory { exit_code: 137 },
            ..done.clone()
        },
    );
    golden(
        "result_infra_error",
        &ActionResult {
            outcome: Outcome::InfraError {
                code: InfraCode::WorkerLost,
                reason: "worker cpu-0 went silent".into(),
            },
            ..done.clone()
        },
    );
    let rejected = ActionResult::rejected(
        ActionId::new("a-2").unwrap(),
        JobId::new("job1").unwrap(),
        Rejection::new(RejectCode::UnknownKind, "unknown action kind \"teleport\""),
        1_790_000_000_000,
    );
    golden("result_rejected", &rejected);
}

#[test]
fn dispatch_and_heartbeat() {
    golden(
        "dispatch",
        &Dispatch {
            epoch: 3,
            attempt: 1,
            action: exec_action(),
            grant: Grant {
                cores: 2,
                mem_mb: 0,
            },
            submitted_at_us: 1_790_000_000_000_000,
            result_encoding: Encoding::Json,
            instance: None,
            gpu: None,
        },
    );
    golden(
        "dispatch_reward",
        &Dispatch {
            epoch: 3,
            attempt: 1,
            action: reward_action(),
            grant: Grant::default(),
            submitted_at_us: 1_790_000_000_000_000,
            result_encoding: Encoding::Msgpack,
            instance: None,
            gpu: Some(GpuRoute {
                service: "judge".into(),
                chunk: ChunkRef {
                    group: 0,
                    start: 1,
                    len: 1,
                },
                restore: true,
                evict: vec![Evict {
                    service: "teacher-3".into(),
                    chunk: ChunkRef {
                        group: 0,
                        start: 1,
                        len: 1,
                    },
                }],
            }),
        },
    );
    golden(
        "heartbeat_gpu",
        &Heartbeat {
            worker: WorkerId::new("gpu-0").unwrap(),
            instance: "77aa".into(),
            seq: 1,
            interval_ms: 1000,
            cores: 0,
            mem_mb: 0,
            running: vec![],
            finished: vec![],
            dispatch_seq: 0,
            known_epoch: 0,
            sandboxes: vec![],
            draining: false,
            gpus: Some(GpuInventory {
                source: "declared".into(),
                groups: vec![vec![0, 1]],
                devices: vec![],
            }),
            services: vec![ServiceReport {
                name: "judge".into(),
                gpus: 1,
                restore_ms: 200,
                slots: 8,
                replicas: vec![ReplicaReport {
                    chunk: ChunkRef {
                        group: 0,
                        start: 0,
                        len: 1,
                    },
                    resident: false,
                    healthy: true,
                }],
            }],
            providers: vec![ProviderReport {
                name: "search".into(),
                rate_per_s: 20.0,
                burst: 5,
                concurrency: 4,
                allow: vec!["GET /search".into()],
                allow_headers: vec!["accept".into()],
                slow_ms: Some(2000),
            }],
            warm: None,
            images: Vec::new(),
            resized: Default::default(),
        },
    );
    golden(
        "heartbeat",
        &Heartbeat {
            worker: WorkerId::new("cpu-0").unwrap(),
            instance: "9f2c".into(),
            seq: 42,
            interval_ms: 1000,
            cores: 2,
            mem_mb: 8192,
            running: vec![ActionId::new("a-1").unwrap()],
            finished: vec![],
            dispatch_seq: 0,
            known_epoch: 0,
            sandboxes: vec![SandboxRef {
                job: JobId::new("job1").unwrap(),
                trajectory: TrajectoryId::new("t17").unwrap(),
                mem_mb: 512,
                open: None,
                idle_timeout_ms: None,
            }],
            draining: false,
            gpus: None,
            services: vec![],
            providers: vec![],
            warm: None,
            images: Vec::new(),
            resized: Default::default(),
        },
    );
}

fn api_action() -> Action {
    Action {
        queue_timeout_ms: None,
        id: ActionId::new("q-1").unwrap(),
        job: JobId::new("job1").unwrap(),
        trajectory: TrajectoryId::new("t17").unwrap(),
        timeout_ms: 5_000,
        spec: ActionSpec::Api(Api {
            provider: "search".into(),
            method: "GET".into(),
            path: "/search".into(),
            query: BTreeMap::from([("q".into(), "rust async".into())]),
            body: None,
            headers: BTreeMap::from([("Accept".into(), "application/json".into())]),
        }),
    }
}

#[test]
fn regrant() {
    golden(
        "regrant",
        &Regrant {
            epoch: 3,
            id: ActionId::new("a-1").unwrap(),
            attempt: 1,
            grant: Grant {
                cores: 4,
                mem_mb: 0,
            },
            seq: 2,
        },
    );
}

#[test]
fn api_action_and_result() {
    golden("action_api", &api_action());
    let mut done = ActionResult::new(
        ActionId::new("q-1").unwrap(),
        JobId::new("job1").unwrap(),
        Outcome::Completed { exit_code: 0 },
        1_790_000_000_456,
    )
    .for_action(&api_action(), 1);
    done.http = Some(HttpReply {
        status: 200,
        headers: BTreeMap::from([("content-type".into(), "application/json".into())]),
        body: "{\"hits\": []}".into(),
        truncated: false,
    });
    golden("result_api", &done);
    for bad in [
        "search",
        "//evil.example/x",
        "/a/../b",
        "/a?b=1",
        "/a b",
        "/x@y",
    ] {
        let mut a = api_action();
        if let ActionSpec::Api(api) = &mut a.spec {
            api.path = bad.into();
        }
        assert_eq!(
            a.validate(&Limits::default()).unwrap_err().code,
            RejectCode::InvalidField,
            "{bad}"
        );
    }
    let p = ProviderReport {
        name: "s".into(),
        rate_per_s: 1.0,
        burst: 1,
        concurrency: 1,
        allow: vec!["GET /search".into(), "POST /v1/*".into()],
        allow_headers: vec![],
        slow_ms: None,
    };
    assert!(p.allows("GET", "/search") && p.allows("POST", "/v1/chat/completions"));
    assert!(
        !p.allows("POST", "/search") && !p.allows("GET", "/search/x") && !p.allows("GET", "/v1/x")
    );
}

fn reward_action() -> Action {
    Action {
        queue_timeout_ms: None,
        id: ActionId::new("r-1").unwrap(),
        job: JobId::new("job1").unwrap(),
        trajectory: TrajectoryId::new("t17").unwrap(),
        timeout_ms: 30_000,
        spec: ActionSpec::Reward(Reward {
            service: "judge".into(),
            inputs: vec!["def add(a, b): return a + b".into()],
            options: BTreeMap::from([("model".into(), "judge-small".into())]),
        }),
    }
}

#[test]
fn reward_action_and_result() {
    golden("action_reward", &reward_action());
    let mut done = ActionResult::new(
        ActionId::new("r-1").unwrap(),
        JobId::new("job1").unwrap(),
        Outcome::Completed { exit_code: 0 },
        1_790_000_000_123,
    )
    .for_action(&reward_action(), 1);
    done.scores = Some(vec![0.25, -1.5]);
    done.service = Some(ServiceUse {
        service: "judge".into(),
        gpus: vec![1],
        restored: true,
        evicted: vec!["teacher-3".into()],
    });
    done.timing = Timing::new(1_000, 200_000, 30_000);
    golden("result_reward", &done);
    // An unknown service is a rejection with its own code.
    assert_eq!(RejectCode::UnknownService.as_str(), "unknown_service");
    let mut bad = reward_action();
    if let ActionSpec::Reward(r) = &mut bad.spec {
        r.inputs.clear();
    }
    assert_eq!(
        bad.validate(&Limits::default()).unwrap_err().code,
        RejectCode::InvalidField
    );
}

#[test]
fn json_from_another_language_decodes_with_defaults() {
    // What a Python client with only `json` would send (the PROTOCOL.md example).
    let json = br#"{"id":"a-1","job":"job1","trajectory":"t17",
        "spec":{"kind":"sandbox_exec","argv":["python3","-c","print(6*7)"]}}"#;
    let a = decode_action(json, Encoding::Json).unwrap();
    assert_eq!(a.timeout_ms, 60_000);
    match a.spec {
        ActionSpec::SandboxExec(e) => assert_eq!(e.cpus, CpuRange { min: 1, max: 1 }),
        other => panic!("{other:?}"),
    }
}

#[test]
fn decode_failures_are_classified_and_keep_the_envelope() {
    let garbage = decode_action(b"\xc1\xc1not msgpack", Encoding::Msgpack).unwrap_err();
    assert_eq!(garbage.rejection.code, RejectCode::Undecodable);

    let unknown = br#"{"id":"a-9","job":"j","trajectory":"t","spec":{"kind":"teleport"}}"#;
    let f = decode_action(unknown, Encoding::Json).unwrap_err();
    assert_eq!(f.rejection.code, RejectCode::UnknownKind);
    assert!(f.rejection.reason.contains("teleport") && f.rejection.reason.contains("sandbox_exec"));
    assert_eq!(f.envelope.id.as_deref(), Some("a-9"));

    let missing = br#"{"id":"a-9","job":"j","trajectory":"t","spec":{"kind":"sandbox_exec"}}"#;
    let f = decode_action(missing, Encoding::Json).unwrap_err();
    assert_eq!(f.rejection.code, RejectCode::InvalidField);
    assert!(
        f.rejection.reason.contains("argv"),
        "{}",
        f.rejection.reason
    );

    let wrong_type = br#"{"id":7,"job":"j","trajectory":"t","spec":{"kind":"sandbox_close"}}"#;
    let f = decode_action(wrong_type, Encoding::Json).unwrap_err();
    assert_eq!(f.rejection.code, RejectCode::InvalidField);
    assert_eq!(f.envelope.id, None);
    assert_eq!(f.envelope.job.as_deref(), Some("j"));
}

#[test]
fn content_type_selects_encoding() {
    assert_eq!(
        Encoding::from_content_type(None).unwrap(),
        Encoding::Msgpack
    );
    assert_eq!(
        Encoding::from_content_type(Some("application/json; charset=utf-8")).unwrap(),
        Encoding::Json
    );
    assert!(Encoding::from_content_type(Some("text/xml")).is_err());
}
