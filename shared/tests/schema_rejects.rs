//! The schemas refuse what Tangram refuses: each known-bad message here is invalid against
//! its schema and is refused by the decoder or by `Action::validate` too. Identifiers follow
//! the same rule in the schema as in `check_token`, tested over random strings.

use proptest::prelude::*;
use serde_json::{json, Value};
use std::sync::OnceLock;
use tangram_shared::codec::{decode, decode_action};
use tangram_shared::ids::check_token;
use tangram_shared::RejectCode;
use tangram_shared::{schema, subject, ActionResult, Dispatch, Encoding, Heartbeat, Limits};

fn validator(name: &str) -> jsonschema::Validator {
    jsonschema::validator_for(&schema::named(name).unwrap().schema).unwrap()
}

fn exec() -> Value {
    json!({"id": "a-1", "job": "job1", "trajectory": "t1",
           "spec": {"kind": "sandbox_exec", "argv": ["true"]}})
}

/// `v` with the field at `pointer` set (added when absent).
fn with(mut v: Value, pointer: &str, value: Value) -> Value {
    let (parent, key) = pointer.rsplit_once('/').unwrap();
    v.pointer_mut(parent)
        .unwrap()
        .as_object_mut()
        .unwrap()
        .insert(key.to_string(), value);
    v
}

fn without(mut v: Value, pointer: &str) -> Value {
    let (parent, key) = pointer.rsplit_once('/').unwrap();
    v.pointer_mut(parent)
        .unwrap()
        .as_object_mut()
        .unwrap()
        .remove(key);
    v
}

/// How Tangram refuses the action: its rejection code, from decoding or from validation.
fn refusal(v: &Value) -> Option<RejectCode> {
    let bytes = serde_json::to_vec(v).unwrap();
    match decode_action(&bytes, Encoding::Json) {
        Err(f) => Some(f.rejection.code),
        Ok(a) => a.validate(&Limits::default()).err().map(|r| r.code),
    }
}

#[test]
fn a_well_formed_action_with_unknown_fields_is_accepted() {
    let v = validator("action.json");
    let a = with(exec(), "/spec/future", json!({"x": 1}));
    let a = with(a, "/priority", json!(3));
    assert!(v.is_valid(&a));
    assert_eq!(refusal(&a), None);
}

#[test]
fn known_bad_actions_are_invalid_and_refused() {
    let v = validator("action.json");
    let long = "x".repeat(129);
    let cases = [
        (
            "unknown kind",
            with(exec(), "/spec/kind", json!("teleport")),
            RejectCode::UnknownKind,
        ),
        (
            "no argv",
            without(exec(), "/spec/argv"),
            RejectCode::InvalidField,
        ),
        ("no id", without(exec(), "/id"), RejectCode::InvalidField),
        (
            "no spec",
            without(exec(), "/spec"),
            RejectCode::InvalidField,
        ),
        (
            "id too long",
            with(exec(), "/id", json!(long)),
            RejectCode::InvalidField,
        ),
        (
            "job with a dot",
            with(exec(), "/job", json!("a.b")),
            RejectCode::InvalidField,
        ),
        (
            "empty trajectory",
            with(exec(), "/trajectory", json!("")),
            RejectCode::InvalidField,
        ),
        (
            "id a number",
            with(exec(), "/id", json!(7)),
            RejectCode::InvalidField,
        ),
        (
            "timeout 0",
            with(exec(), "/timeout_ms", json!(0)),
            RejectCode::InvalidField,
        ),
        (
            "timeout negative",
            with(exec(), "/timeout_ms", json!(-1)),
            RejectCode::InvalidField,
        ),
        (
            "timeout a string",
            with(exec(), "/timeout_ms", json!("10")),
            RejectCode::InvalidField,
        ),
        (
            "timeout null",
            with(exec(), "/timeout_ms", Value::Null),
            RejectCode::InvalidField,
        ),
        (
            "empty argv",
            with(exec(), "/spec/argv", json!([])),
            RejectCode::InvalidField,
        ),
        (
            "no cores",
            with(exec(), "/spec/cpus", json!({"min": 0, "max": 1})),
            RejectCode::InvalidField,
        ),
        (
            "env null",
            with(exec(), "/spec/env", Value::Null),
            RejectCode::InvalidField,
        ),
        (
            "tiny sandbox",
            json!({"id": "o", "job": "j", "trajectory": "t",
                   "spec": {"kind": "sandbox_open", "memory_mb": 8}}),
            RejectCode::InvalidField,
        ),
        (
            "nothing to score",
            json!({"id": "r", "job": "j", "trajectory": "t",
                   "spec": {"kind": "reward", "service": "judge", "inputs": []}}),
            RejectCode::InvalidField,
        ),
    ];
    for (what, msg, code) in cases {
        assert!(!v.is_valid(&msg), "{what}: the schema accepts {msg}");
        assert_eq!(refusal(&msg), Some(code), "{what}");
    }
}

#[test]
fn known_bad_results_dispatches_and_heartbeats_are_invalid_and_undecodable() {
    let result = json!({"id": "a", "job": "j", "outcome": {"status": "completed", "exit_code": 0}});
    let dispatch = json!({"epoch": 1, "attempt": 1, "grant": {"cores": 1, "mem_mb": 0},
                          "submitted_at_us": 1, "action": exec()});
    let heartbeat = json!({"worker": "w", "instance": "i", "seq": 1, "interval_ms": 1000,
                           "cores": 1, "mem_mb": 1});
    type Decodes = fn(&Value) -> bool;
    fn ok<T: serde::de::DeserializeOwned>(v: &Value) -> bool {
        decode::<T>(&serde_json::to_vec(v).unwrap(), Encoding::Json).is_ok()
    }
    let cases: [(&str, &str, Value, Decodes); 8] = [
        (
            "result.json",
            "good result",
            result.clone(),
            ok::<ActionResult>,
        ),
        (
            "result.json",
            "unknown status",
            with(result.clone(), "/outcome/status", json!("exploded")),
            ok::<ActionResult>,
        ),
        (
            "result.json",
            "exit code over i32",
            with(result.clone(), "/outcome/exit_code", json!(1u64 << 31)),
            ok::<ActionResult>,
        ),
        (
            "result.json",
            "no outcome",
            without(result, "/outcome"),
            ok::<ActionResult>,
        ),
        (
            "dispatch.json",
            "good dispatch",
            dispatch.clone(),
            ok::<Dispatch>,
        ),
        (
            "dispatch.json",
            "unknown encoding",
            with(dispatch, "/result_encoding", json!("xml")),
            ok::<Dispatch>,
        ),
        (
            "heartbeat.json",
            "good heartbeat",
            heartbeat.clone(),
            ok::<Heartbeat>,
        ),
        (
            "heartbeat.json",
            "no worker",
            without(heartbeat, "/worker"),
            ok::<Heartbeat>,
        ),
    ];
    for (schema, what, msg, decodes) in cases {
        let good = what.starts_with("good");
        assert_eq!(validator(schema).is_valid(&msg), good, "{what}: {msg}");
        assert_eq!(decodes(&msg), good, "{what}: the decoder disagrees");
    }
}

#[test]
fn dead_letter_headers_carry_every_code_and_nothing_else() {
    let v = validator("deadletter-headers.json");
    let codes: Vec<String> = schema::named("deadletter-headers.json").unwrap().schema["$defs"]
        ["RejectCode"]["oneOf"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["const"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(codes.len(), 13, "{codes:?}");
    for code in &codes {
        // The schema's value is the code's wire name, also its dead-letter subject token.
        let parsed: RejectCode = serde_json::from_value(json!(code)).unwrap();
        assert_eq!(
            subject::deadletter(parsed),
            format!("tangram.v1.deadletter.{code}")
        );
        let rejection = json!({"Tangram-Reject-Code": code, "Tangram-Reject-Reason": "why",
            "Tangram-Original-Subject": "tangram.v1.action.j.api", "Content-Type": "application/json"});
        assert!(v.is_valid(&rejection), "{code}");
    }
    for code in subject::DISPATCH_REFUSALS {
        let refusal = json!({"Tangram-Reject-Code": code, "Tangram-Reject-Reason": "why",
            "Tangram-Worker": "cpu-0", "Tangram-Action-Id": "a-1", "Content-Type": "application/msgpack"});
        assert!(v.is_valid(&refusal), "{code}");
        // A refusal is a worker's: without the worker it matches neither form.
        let anonymous = without(refusal, "/Tangram-Worker");
        assert!(!v.is_valid(&anonymous), "{code} without a worker");
    }
    let unknown = json!({"Tangram-Reject-Code": "teleport", "Tangram-Reject-Reason": "why",
        "Tangram-Original-Subject": "s", "Content-Type": "application/json"});
    assert!(!v.is_valid(&unknown));
}

fn id_validator() -> &'static jsonschema::Validator {
    static V: OnceLock<jsonschema::Validator> = OnceLock::new();
    V.get_or_init(|| {
        let s = schema::named("action.json").unwrap().schema;
        let mut id = s["$defs"]["ActionId"].clone();
        id["$schema"] = s["$schema"].clone();
        jsonschema::validator_for(&id).unwrap()
    })
}

proptest! {
    #[test]
    fn the_id_schema_accepts_exactly_what_check_token_accepts(
        // Mostly short strings with a few bad characters, and valid ones around the limit.
        s in prop_oneof!["[A-Za-z0-9_.*> \u{e9}-]{0,12}", "[A-Za-z0-9_-]{120,135}"]
    ) {
        let by_schema = id_validator().is_valid(&json!(s));
        prop_assert_eq!(by_schema, check_token("id", &s).is_ok(), "{:?}", s);
    }
}
