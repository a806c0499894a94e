//! JSON Schema (draft 2020-12) of every message and record of protocol v1, generated from
//! the types of this crate so that it cannot drift from what the code reads.
//!
//! Each schema describes what a reader accepts (serde's deserialize side): a field with a
//! default is optional, an `Option` field also accepts `null`, unknown fields are allowed.
//! Identifiers carry the rules of [`crate::ids::check_token`], and an action the bounds
//! `Action::validate` applies to single fields (`timeout_ms` and `memory_mb` minimums,
//! non-empty `argv` and `inputs`, at least one core). What depends on the scheduler's
//! config or the fleet (the longest timeout, images, providers' allow-lists) or relates two
//! fields (`cpus.min <= cpus.max`, `workdir_mb <= memory_mb`) is checked by the scheduler
//! alone, and so are file paths, environment names and an `api` action's method and path.
//! A msgpack message is checked by reading it as JSON data (maps with field names, so the
//! same schema applies). The committed copies live in `docs/schema/`;
//! `cargo run -p tangram-shared --example gen-schema` rewrites them and
//! `tests/schema.rs` fails when they are stale.

use crate::heartbeat::Heartbeat;
use crate::result::RejectCode;
use crate::status::{CordonRecord, LeaderRecord, StandbyRecord, Status};
use crate::subject;
use crate::{Action, ActionResult, Dispatch, WorkerId};
use schemars::generate::SchemaSettings;
use schemars::{JsonSchema, Schema};
use serde_json::{json, Value};

/// The command that regenerates `docs/schema/`, for messages that say it is stale.
pub const REGENERATE: &str = "cargo run -p tangram-shared --example gen-schema";

/// One schema file of `docs/schema/`.
#[derive(Debug, Clone)]
pub struct SchemaFile {
    /// File name, e.g. `action.json`.
    pub name: &'static str,
    /// The schema.
    pub schema: Value,
}

impl SchemaFile {
    /// The file's contents: pretty JSON with a trailing newline.
    pub fn contents(&self) -> String {
        let mut s = serde_json::to_string_pretty(&self.schema).expect("a schema serialises");
        s.push('\n');
        s
    }
}

/// Every schema, in a fixed order.
pub fn all() -> Vec<SchemaFile> {
    vec![
        file::<Action>(
            "action.json",
            "An action, published by a client on tangram.v1.action.<job>.<kind>.",
        ),
        file::<ActionResult>(
            "result.json",
            "A result, on tangram.v1.result.<job>.<action-id>; exactly one per action.",
        ),
        file::<Dispatch>(
            "dispatch.json",
            "A dispatch, from the scheduler on tangram.v1.dispatch.<worker>.<action-id> (msgpack).",
        ),
        file::<crate::Regrant>(
            "regrant.json",
            "A re-size of a running exec (tangram-v2), on tangram.v1.dispatch.<worker>.<action-id>.regrant (msgpack).",
        ),
        file::<Heartbeat>(
            "heartbeat.json",
            "A worker's heartbeat, on tangram.v1.heartbeat.<worker> (core NATS, msgpack).",
        ),
        file::<Status>(
            "status.json",
            "The scheduler's reply (JSON) to a request on tangram.v1.status.",
        ),
        file::<crate::status::StatusRequest>(
            "status-request.json",
            "A request on tangram.v1.status (JSON; an empty body asks for the first page).",
        ),
        file::<crate::status::CloseJobReply>(
            "close-job-reply.json",
            "The leading scheduler's reply (JSON) to a request on tangram.v1.close.<job> (empty body): it closes every sandbox of the job.",
        ),
        file::<crate::status::Lease>(
            "lease.json",
            "A rollout's renewal of its job's lease, on tangram.v1.lease.<job> (core NATS, JSON).",
        ),
        file::<LeaderRecord>(
            "kv-leader.json",
            "The leader lease: key `leader` of the tangram_scheduler bucket (JSON).",
        ),
        file::<StandbyRecord>(
            "kv-standby.json",
            "A standby scheduler's announcement: key `standby.<id>` of the tangram_scheduler bucket (JSON).",
        ),
        file::<CordonRecord>(
            "kv-cordon.json",
            "An operator's cordon or drain of a worker: key `cordon.<worker>` of the tangram_scheduler bucket (JSON).",
        ),
        SchemaFile {
            name: "deadletter-headers.json",
            schema: deadletter_headers(),
        },
    ]
}

/// The schema file of that name.
pub fn named(name: &str) -> Option<SchemaFile> {
    all().into_iter().find(|f| f.name == name)
}

fn settings() -> SchemaSettings {
    SchemaSettings::draft2020_12().for_deserialize()
}

fn file<T: JsonSchema>(name: &'static str, what: &str) -> SchemaFile {
    let mut schema = settings().into_generator().into_root_schema_for::<T>();
    stamp(&mut schema, what);
    let mut schema = schema.to_value();
    bound_integers(&mut schema);
    SchemaFile { name, schema }
}

/// Gives every integer the range of its Rust type: the generator names the width in
/// `format` but leaves the wider bounds out, and a reader rejects a value that does not fit.
fn bound_integers(v: &mut Value) {
    match v {
        Value::Object(map) => {
            let range: Option<(Value, Value)> = match map.get("format").and_then(Value::as_str) {
                Some("int32") => Some((i32::MIN.into(), i32::MAX.into())),
                Some("int64") => Some((i64::MIN.into(), i64::MAX.into())),
                Some("uint32") => Some((0.into(), u32::MAX.into())),
                Some("uint64") | Some("uint") => Some((0.into(), u64::MAX.into())),
                _ => None,
            };
            if let Some((min, max)) = range {
                map.entry("minimum").or_insert(min);
                map.entry("maximum").or_insert(max);
            }
            map.values_mut().for_each(bound_integers);
        }
        Value::Array(items) => items.iter_mut().for_each(bound_integers),
        _ => {}
    }
}

fn stamp(schema: &mut Schema, what: &str) {
    schema.insert("$comment".into(), json!(generated_note(what)));
}

fn generated_note(what: &str) -> String {
    format!("{what} Generated from the tangram-shared types; do not edit: run `{REGENERATE}`.")
}

/// A dead-letter record's headers, as a map from header name to value. Its body is the
/// refused message itself (the first 64 KiB), which no schema describes: it was refused for
/// not being a valid message, or, from a worker, it is a dispatch (see `dispatch.json`).
fn deadletter_headers() -> Value {
    let mut generator = settings().into_generator();
    let reject_code = generator.subschema_for::<RejectCode>().to_value();
    let worker = generator.subschema_for::<WorkerId>().to_value();
    let defs = generator.take_definitions(true);
    let text = json!({ "type": "string" });
    let content_type = json!({ "enum": ["application/msgpack", "application/json"] });
    json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "DeadLetterHeaders",
        "$comment": generated_note(
            "The headers of a record on tangram.v1.deadletter.<code>, as a map from header name to value."
        ),
        "description": "The scheduler records every action message it rejects under the reject code; a worker records every dispatch it refuses under the refusal. The body is the refused message, cut to its first 64 KiB.",
        "type": "object",
        "additionalProperties": { "type": "string" },
        "oneOf": [
            {
                "title": "Rejection",
                "description": "An action message the scheduler rejected. Tangram-Action-Id is present when an id could be read (the Nats-Msg-Id header, else the body); it is cut to 256 characters and need not be a valid id.",
                "properties": {
                    (subject::HEADER_DLQ_CODE): reject_code,
                    (subject::HEADER_DLQ_REASON): text,
                    (subject::HEADER_DLQ_SUBJECT): text,
                    (subject::HEADER_DLQ_ACTION): { "type": "string", "maxLength": 256 },
                    (subject::HEADER_CONTENT_TYPE): content_type,
                },
                "required": [
                    subject::HEADER_DLQ_CODE,
                    subject::HEADER_DLQ_REASON,
                    subject::HEADER_DLQ_SUBJECT,
                    subject::HEADER_CONTENT_TYPE,
                ],
                "not": { "required": [subject::HEADER_DLQ_WORKER] },
            },
            {
                "title": "Refusal",
                "description": "A dispatch a worker refused; its body is the dispatch (msgpack).",
                "properties": {
                    (subject::HEADER_DLQ_CODE): { "enum": subject::DISPATCH_REFUSALS },
                    (subject::HEADER_DLQ_REASON): text,
                    (subject::HEADER_DLQ_WORKER): worker,
                    (subject::HEADER_DLQ_ACTION): { "type": "string" },
                    (subject::HEADER_CONTENT_TYPE): { "const": "application/msgpack" },
                },
                "required": [
                    subject::HEADER_DLQ_CODE,
                    subject::HEADER_DLQ_REASON,
                    subject::HEADER_DLQ_WORKER,
                    subject::HEADER_DLQ_ACTION,
                    subject::HEADER_CONTENT_TYPE,
                ],
            },
        ],
        "$defs": defs,
    })
}
