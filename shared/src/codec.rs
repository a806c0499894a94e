//! Encoding and decoding. The only module that calls `rmp-serde`.
//!
//! Messages are msgpack maps with field names (`rmp_serde::to_vec_named`), so fields can be
//! added later with defaults. JSON with the same field names is accepted wherever msgpack is;
//! the `Content-Type` header chooses.

use crate::action::{Action, ActionKind};
use crate::result::{RejectCode, Rejection};
use serde::de::{DeserializeOwned, IgnoredAny};
use serde::{Deserialize, Serialize};

/// Wire encoding of a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum Encoding {
    /// `application/msgpack`, the default.
    #[default]
    Msgpack,
    /// `application/json`.
    Json,
}

/// Content type of msgpack messages.
pub const CONTENT_TYPE_MSGPACK: &str = "application/msgpack";
/// Content type of JSON messages.
pub const CONTENT_TYPE_JSON: &str = "application/json";

impl Encoding {
    /// Picks the encoding from a `Content-Type` header value; msgpack when absent.
    pub fn from_content_type(value: Option<&str>) -> Result<Self, CodecError> {
        let Some(value) = value else {
            return Ok(Encoding::Msgpack);
        };
        let essence = value
            .split(';')
            .next()
            .unwrap_or("")
            .trim()
            .to_ascii_lowercase();
        match essence.as_str() {
            "" | CONTENT_TYPE_MSGPACK | "application/x-msgpack" | "application/vnd.msgpack" => {
                Ok(Encoding::Msgpack)
            }
            CONTENT_TYPE_JSON => Ok(Encoding::Json),
            _ => Err(CodecError::UnknownContentType(value.to_string())),
        }
    }

    /// The `Content-Type` header value for this encoding.
    pub fn content_type(self) -> &'static str {
        match self {
            Encoding::Msgpack => CONTENT_TYPE_MSGPACK,
            Encoding::Json => CONTENT_TYPE_JSON,
        }
    }
}

/// A message could not be encoded or decoded.
#[derive(Debug, thiserror::Error)]
pub enum CodecError {
    /// The `Content-Type` header names an encoding Tangram does not speak.
    #[error("unsupported content type {0:?}; use application/msgpack or application/json")]
    UnknownContentType(String),
    /// msgpack encoding failed.
    #[error("msgpack encode: {0}")]
    MsgpackEncode(#[from] rmp_serde::encode::Error),
    /// msgpack decoding failed.
    #[error("msgpack: {0}")]
    MsgpackDecode(#[from] rmp_serde::decode::Error),
    /// JSON encoding or decoding failed.
    #[error("json: {0}")]
    Json(#[from] serde_json::Error),
    /// The message does not fit in this many bytes even with its texts cut.
    #[error("the message does not fit in {0} bytes even with its texts cut")]
    TooLarge(usize),
}

/// Encodes a message.
pub fn encode<T: Serialize>(msg: &T, encoding: Encoding) -> Result<Vec<u8>, CodecError> {
    Ok(match encoding {
        Encoding::Msgpack => rmp_serde::to_vec_named(msg)?,
        Encoding::Json => serde_json::to_vec(msg)?,
    })
}

/// Decodes a message.
pub fn decode<T: DeserializeOwned>(bytes: &[u8], encoding: Encoding) -> Result<T, CodecError> {
    Ok(match encoding {
        Encoding::Msgpack => rmp_serde::from_slice(bytes)?,
        Encoding::Json => serde_json::from_slice(bytes)?,
    })
}

/// The fields of an action that can often be read even when the whole cannot be decoded.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Envelope {
    /// `id`, if present and a string.
    pub id: Option<String>,
    /// `job`, if present and a string.
    pub job: Option<String>,
    /// `trajectory`, if present and a string.
    pub trajectory: Option<String>,
    /// `spec.kind`, if present and a string.
    pub kind: Option<String>,
}

#[derive(Deserialize)]
struct SpecKind {
    #[serde(default, deserialize_with = "lenient_string")]
    kind: Option<String>,
}

#[derive(Deserialize)]
struct RawEnvelope {
    #[serde(default, deserialize_with = "lenient_string")]
    id: Option<String>,
    #[serde(default, deserialize_with = "lenient_string")]
    job: Option<String>,
    #[serde(default, deserialize_with = "lenient_string")]
    trajectory: Option<String>,
    #[serde(default)]
    spec: Option<Lenient<SpecKind>>,
}

/// Accepts any value; keeps it only if it has the expected shape.
struct Lenient<T>(Option<T>);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Lenient<T> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Either<T> {
            Good(T),
            Bad(IgnoredAny),
        }
        Ok(Lenient(match Either::<T>::deserialize(d)? {
            Either::Good(t) => Some(t),
            Either::Bad(_) => None,
        }))
    }
}

fn lenient_string<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    Ok(Lenient::<String>::deserialize(d)?.0)
}

/// Reads whatever envelope fields can be read; never fails.
pub fn read_envelope(bytes: &[u8], encoding: Encoding) -> Envelope {
    match decode::<RawEnvelope>(bytes, encoding) {
        Ok(raw) => Envelope {
            id: raw.id,
            job: raw.job,
            trajectory: raw.trajectory,
            kind: raw.spec.and_then(|s| s.0).and_then(|s| s.kind),
        },
        Err(_) => Envelope::default(),
    }
}

/// An action that could not be decoded: what could be read, and why it was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodeFailure {
    /// Fields that could be read.
    pub envelope: Envelope,
    /// The refusal.
    pub rejection: Rejection,
}

/// Decodes an action, classifying failures: undecodable payload, unknown kind, or a missing
/// or ill-typed field.
pub fn decode_action(bytes: &[u8], encoding: Encoding) -> Result<Action, Box<DecodeFailure>> {
    match decode::<Action>(bytes, encoding) {
        Ok(action) => Ok(action),
        Err(err) => {
            let envelope = read_envelope(bytes, encoding);
            let well_formed = match encoding {
                Encoding::Msgpack => rmp_serde::from_slice::<IgnoredAny>(bytes).is_ok(),
                Encoding::Json => serde_json::from_slice::<IgnoredAny>(bytes).is_ok(),
            };
            let rejection = if !well_formed {
                Rejection::new(
                    RejectCode::Undecodable,
                    format!("payload is not valid {encoding:?}: {err}").to_lowercase(),
                )
            } else if let Some(kind) = envelope
                .kind
                .as_deref()
                .filter(|k| ActionKind::parse(k).is_none())
            {
                let known: Vec<_> = ActionKind::ALL.iter().map(|k| k.as_str()).collect();
                Rejection::new(
                    RejectCode::UnknownKind,
                    format!(
                        "unknown action kind {kind:?}; known kinds: {}",
                        known.join(", ")
                    ),
                )
            } else {
                Rejection::new(
                    RejectCode::InvalidField,
                    format!("not a valid action: {err}"),
                )
            };
            Err(Box::new(DecodeFailure {
                envelope,
                rejection,
            }))
        }
    }
}
