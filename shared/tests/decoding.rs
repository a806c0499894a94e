//! What readers accept beyond what writers produce, as PROTOCOL.md §2 states it: any msgpack
//! integer width whose value fits the field, `null` as absence only where a field is
//! optional (`Option`), and JSON integers written as integers.

use tangram_shared::codec::{decode, decode_action};
use tangram_shared::{ActionResult, ActionSpec, Encoding, RejectCode};

/// A msgpack string (fixstr or str8).
fn mp_str(s: &str) -> Vec<u8> {
    let mut out = if s.len() < 32 {
        vec![0xa0 | s.len() as u8]
    } else {
        vec![0xd9, s.len() as u8]
    };
    out.extend_from_slice(s.as_bytes());
    out
}

/// A msgpack map of the given keys and already-encoded values.
fn mp_map(entries: &[(&str, Vec<u8>)]) -> Vec<u8> {
    let mut out = vec![0x80 | entries.len() as u8];
    for (k, v) in entries {
        out.extend(mp_str(k));
        out.extend_from_slice(v);
    }
    out
}

/// A `sandbox_exec` action whose `timeout_ms` is encoded as `timeout` and whose `cpus.max`
/// is encoded as `max` (already-encoded msgpack values).
fn exec(timeout: &[u8], max: &[u8]) -> Vec<u8> {
    let argv = [vec![0x91], mp_str("true")].concat();
    let cpus = mp_map(&[("min", vec![0x01]), ("max", max.to_vec())]);
    let spec = mp_map(&[
        ("kind", mp_str("sandbox_exec")),
        ("argv", argv),
        ("cpus", cpus),
    ]);
    mp_map(&[
        ("id", mp_str("a-1")),
        ("job", mp_str("j")),
        ("trajectory", mp_str("t")),
        ("timeout_ms", timeout.to_vec()),
        ("spec", spec),
    ])
}

#[test]
fn every_msgpack_integer_width_decodes_when_the_value_fits() {
    let widths: [(&str, Vec<u8>, u64); 9] = [
        ("positive fixint", vec![0x7f], 127),
        ("uint8", vec![0xcc, 0xc8], 200),
        ("uint16", vec![0xcd, 0x27, 0x10], 10_000),
        ("uint32", vec![0xce, 0x00, 0x01, 0x86, 0xa0], 100_000),
        (
            "uint64",
            [vec![0xcf], 10_000u64.to_be_bytes().to_vec()].concat(),
            10_000,
        ),
        ("int8", vec![0xd0, 0x64], 100),
        ("int16", vec![0xd1, 0x27, 0x10], 10_000),
        (
            "int32",
            [vec![0xd2], 10_000i32.to_be_bytes().to_vec()].concat(),
            10_000,
        ),
        (
            "int64",
            [vec![0xd3], 10_000i64.to_be_bytes().to_vec()].concat(),
            10_000,
        ),
    ];
    for (what, timeout, want) in &widths {
        // The same encoding for a u64 field (timeout_ms) and a u32 one (cpus.max).
        let a = decode_action(&exec(timeout, timeout), Encoding::Msgpack)
            .unwrap_or_else(|f| panic!("{what}: {}", f.rejection.reason));
        assert_eq!(a.timeout_ms, *want, "{what}");
        let ActionSpec::SandboxExec(e) = a.spec else {
            panic!("{what}: not an exec")
        };
        assert_eq!(u64::from(e.cpus.max), *want, "{what}");
    }
}

#[test]
fn integers_that_do_not_fit_and_non_integers_are_invalid_fields() {
    let small = vec![0x04];
    let bad: [(&str, Vec<u8>, Vec<u8>); 5] = [
        ("negative int8", vec![0xd0, 0xff], small.clone()),
        ("negative fixint", vec![0xff], small.clone()),
        (
            "float64",
            [vec![0xcb], 10_000f64.to_be_bytes().to_vec()].concat(),
            small.clone(),
        ),
        ("a string", mp_str("10000"), small.clone()),
        // 2^32 is a u64 timeout but too large for the u32 core count.
        (
            "cpus.max over u32",
            vec![0x01],
            [vec![0xcf], (1u64 << 32).to_be_bytes().to_vec()].concat(),
        ),
    ];
    for (what, timeout, max) in bad {
        let f = decode_action(&exec(&timeout, &max), Encoding::Msgpack).unwrap_err();
        assert_eq!(f.rejection.code, RejectCode::InvalidField, "{what}");
    }
}

#[test]
fn json_integers_must_be_written_as_integers() {
    let with_timeout = |t: &str| {
        format!(
            r#"{{"id":"a","job":"j","trajectory":"t","timeout_ms":{t},"spec":{{"kind":"sandbox_close"}}}}"#
        )
    };
    let a = decode_action(with_timeout("10000").as_bytes(), Encoding::Json).unwrap();
    assert_eq!(a.timeout_ms, 10_000);
    for t in ["10000.0", "1e4", "-1", "18446744073709551616"] {
        let f = decode_action(with_timeout(t).as_bytes(), Encoding::Json).unwrap_err();
        assert_eq!(f.rejection.code, RejectCode::InvalidField, "{t}");
    }
}

#[test]
fn null_is_absence_for_optional_fields_only() {
    let open = |extra: &str| {
        format!(
            r#"{{"id":"a","job":"j","trajectory":"t","spec":{{"kind":"sandbox_open"{extra}}}}}"#
        )
    };
    // `image` is optional: null reads as absent, the worker's default image.
    let a = decode_action(open(r#","image":null"#).as_bytes(), Encoding::Json).unwrap();
    let ActionSpec::SandboxOpen(o) = a.spec else {
        panic!("not an open")
    };
    assert_eq!(o.image, None);
    // Fields that only have a default refuse null.
    for field in ["memory_mb", "workdir_mb", "env"] {
        let msg = open(&format!(r#","{field}":null"#));
        let f = decode_action(msg.as_bytes(), Encoding::Json).unwrap_err();
        assert_eq!(f.rejection.code, RejectCode::InvalidField, "{field}");
    }
    let close = r#"{"id":"a","job":"j","trajectory":"t","timeout_ms":null,"spec":{"kind":"sandbox_close"}}"#;
    let f = decode_action(close.as_bytes(), Encoding::Json).unwrap_err();
    assert_eq!(f.rejection.code, RejectCode::InvalidField);

    // msgpack nil behaves the same: `stdin` optional, `env` not.
    let nil = vec![0xc0];
    let spec = |field: &str| {
        mp_map(&[
            ("kind", mp_str("sandbox_exec")),
            ("argv", [vec![0x91], mp_str("true")].concat()),
            (field, nil.clone()),
        ])
    };
    let action = |spec: Vec<u8>| {
        mp_map(&[
            ("id", mp_str("a")),
            ("job", mp_str("j")),
            ("trajectory", mp_str("t")),
            ("spec", spec),
        ])
    };
    let a = decode_action(&action(spec("stdin")), Encoding::Msgpack).unwrap();
    assert!(matches!(a.spec, ActionSpec::SandboxExec(e) if e.stdin.is_none()));
    let f = decode_action(&action(spec("env")), Encoding::Msgpack).unwrap_err();
    assert_eq!(f.rejection.code, RejectCode::InvalidField);

    // In a result, `trajectory`, `kind` and `placement` may be null; `stdout` may not.
    let result = |extra: &str| {
        format!(r#"{{"id":"a","job":"j","outcome":{{"status":"timed_out"}}{extra}}}"#)
    };
    let r: ActionResult = decode(
        result(r#","trajectory":null,"kind":null,"placement":null,"scores":null"#).as_bytes(),
        Encoding::Json,
    )
    .unwrap();
    assert_eq!(
        (r.trajectory, r.kind, r.placement, r.scores),
        (None, None, None, None)
    );
    assert!(
        decode::<ActionResult>(result(r#","stdout":null"#).as_bytes(), Encoding::Json).is_err()
    );
}
