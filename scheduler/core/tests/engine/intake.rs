//! The order of the intake checks, as PROTOCOL.md states it: content type, size, decoding
//! (well-formed, kind, fields), the action's own rules, then subject, header and body
//! agreement (job, kind, id). The first failing check names the rejection.

use tangram_core::engine::{check, RawMessage};
use tangram_shared::{Limits, RejectCode};

const MAX: usize = 256;

fn rejected(
    subject: &str,
    msg_id: Option<&str>,
    content_type: &str,
    body: &str,
) -> (RejectCode, String, Option<String>) {
    let raw = RawMessage {
        subject,
        msg_id,
        content_type: Some(content_type),
        payload: body.as_bytes(),
    };
    let bad = check(&raw, &Limits::default(), MAX, 1).unwrap_err();
    (bad.rejection.code, bad.rejection.reason, bad.id)
}

fn action(id: &str, job: &str, timeout_ms: i64, kind: &str) -> String {
    format!(
        r#"{{"id":"{id}","job":"{job}","trajectory":"t","timeout_ms":{timeout_ms},"spec":{{"kind":"{kind}"}}}}"#
    )
}

const JSON: &str = "application/json";
const SUBJECT: &str = "tangram.v1.action.j.sandbox_close";

#[test]
fn content_type_is_checked_before_size_and_size_before_decoding() {
    let huge = "x".repeat(MAX + 1);
    let (code, ..) = rejected(SUBJECT, Some("a"), "text/xml", &huge);
    assert_eq!(code, RejectCode::Undecodable);
    let (code, ..) = rejected(SUBJECT, Some("a"), JSON, &huge);
    assert_eq!(code, RejectCode::Oversized);
}

#[test]
fn decoding_and_field_rules_come_before_agreement_with_the_subject() {
    // Wrong job in the body as well in each case: the earlier check still wins.
    let (code, ..) = rejected(SUBJECT, None, JSON, "{not json");
    assert_eq!(code, RejectCode::Undecodable);
    let (code, ..) = rejected(SUBJECT, None, JSON, &action("a", "other", 1, "teleport"));
    assert_eq!(code, RejectCode::UnknownKind);
    let (code, reason, _) = rejected(
        SUBJECT,
        None,
        JSON,
        &action("a", "other", 0, "sandbox_close"),
    );
    assert_eq!(code, RejectCode::InvalidField);
    assert!(reason.contains("timeout_ms"), "{reason}");
}

#[test]
fn agreement_is_checked_job_then_kind_then_message_id() {
    let (code, reason, id) = rejected(
        SUBJECT,
        Some("h"),
        JSON,
        &action("a", "other", 1, "sandbox_open"),
    );
    assert_eq!(code, RejectCode::Mismatch);
    assert!(reason.contains("job"), "{reason}");
    // The rejection is addressed with the body's id once the body decoded.
    assert_eq!(id.as_deref(), Some("a"));
    let (_, reason, _) = rejected(
        SUBJECT,
        Some("h"),
        JSON,
        &action("a", "j", 1, "sandbox_open"),
    );
    assert!(reason.contains("kind"), "{reason}");
    let (_, reason, _) = rejected(
        SUBJECT,
        Some("h"),
        JSON,
        &action("a", "j", 1, "sandbox_close"),
    );
    assert!(reason.contains("Nats-Msg-Id"), "{reason}");
    let body = action("a", "j", 1, "sandbox_close");
    let raw = RawMessage {
        subject: SUBJECT,
        msg_id: None,
        content_type: Some(JSON),
        payload: body.as_bytes(),
    };
    assert!(
        check(&raw, &Limits::default(), MAX, 1).is_ok(),
        "no header is no disagreement"
    );
}

#[test]
fn an_undecodable_message_is_addressed_by_its_header() {
    let (code, _, id) = rejected(SUBJECT, Some("h-1"), JSON, r#"{"id":"b","job":"j"}"#);
    assert_eq!(code, RejectCode::InvalidField);
    assert_eq!(id.as_deref(), Some("h-1"));
    let (_, _, id) = rejected(SUBJECT, None, JSON, r#"{"id":"b","job":"j"}"#);
    assert_eq!(id.as_deref(), Some("b"));
}
