//! Identifiers. Each one appears as a token in a NATS subject, so each is restricted to
//! `[A-Za-z0-9_-]`, 1 to 128 characters: no dots, wildcards or whitespace.

use serde::{Deserialize, Serialize};
use std::fmt;

/// Longest identifier accepted, in bytes.
pub const MAX_ID_LEN: usize = 128;

/// The characters [`check_token`] allows, as a regular expression over the whole identifier
/// (the `pattern` of every identifier in the JSON Schema; the length is checked apart).
pub const TOKEN_PATTERN: &str = "^[A-Za-z0-9_-]+$";

/// Why a string is not a valid identifier.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdError {
    /// The identifier is empty.
    #[error("{what} is empty")]
    Empty {
        /// Which identifier.
        what: &'static str,
    },
    /// The identifier is longer than [`MAX_ID_LEN`].
    #[error("{what} is {len} bytes long; the limit is {MAX_ID_LEN}")]
    TooLong {
        /// Which identifier.
        what: &'static str,
        /// Its length.
        len: usize,
    },
    /// The identifier holds a character outside `[A-Za-z0-9_-]`.
    #[error("{what} {value:?} holds {bad:?}; only letters, digits, '_' and '-' are allowed")]
    BadChar {
        /// Which identifier.
        what: &'static str,
        /// The identifier, cut to the limit.
        value: String,
        /// The first offending character.
        bad: char,
    },
}

/// Checks that `value` can be used as a subject token.
pub fn check_token(what: &'static str, value: &str) -> Result<(), IdError> {
    if value.is_empty() {
        return Err(IdError::Empty { what });
    }
    if value.len() > MAX_ID_LEN {
        return Err(IdError::TooLong {
            what,
            len: value.len(),
        });
    }
    if let Some(bad) = value
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || *c == '_' || *c == '-'))
    {
        return Err(IdError::BadChar {
            what,
            value: value.chars().take(MAX_ID_LEN).collect(),
            bad,
        });
    }
    Ok(())
}

/// The JSON Schema of an identifier: what [`check_token`] accepts.
#[cfg(feature = "schema")]
fn token_schema(what: &str) -> schemars::Schema {
    schemars::json_schema!({
        "description": format!("Identifier ({what}): 1 to {MAX_ID_LEN} characters of [A-Za-z0-9_-], usable as a NATS subject token."),
        "type": "string",
        "minLength": 1,
        "maxLength": MAX_ID_LEN,
        "pattern": TOKEN_PATTERN,
    })
}

macro_rules! id_type {
    ($(#[$doc:meta])* $name:ident, $what:literal, $inner:ty) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        #[serde(transparent)]
        pub struct $name(pub $inner);

        impl $name {
            /// Builds the identifier, checking that it is a valid subject token.
            pub fn new(value: impl Into<String>) -> Result<Self, IdError> {
                let value: String = value.into();
                check_token($what, &value)?;
                Ok(Self(value.into()))
            }
            /// Checks an identifier that arrived unchecked (for example, decoded from the wire).
            pub fn check(&self) -> Result<(), IdError> {
                check_token($what, &self.0)
            }
            /// The identifier as a string slice.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        // Serde sees a plain string; the schema adds the rules `check` applies.
        #[cfg(feature = "schema")]
        impl schemars::JsonSchema for $name {
            fn schema_name() -> std::borrow::Cow<'static, str> {
                stringify!($name).into()
            }
            fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
                token_schema($what)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }
    };
}

id_type!(
    /// An action's id, chosen by the submitter. It is the idempotency key: it is sent as
    /// `Nats-Msg-Id`, and one id yields at most one execution and exactly one result.
    ActionId,
    "action id",
    // Shared, so that plans and bookkeeping copy a pointer rather than the string.
    std::sync::Arc<str>
);
id_type!(
    /// An RL job (a training run) that submits actions.
    JobId,
    "job",
    String
);
id_type!(
    /// A trajectory (one rollout) within a job. A trajectory owns at most one sandbox.
    TrajectoryId,
    "trajectory",
    String
);
id_type!(
    /// A worker process, unique in the fleet.
    WorkerId,
    "worker id",
    std::sync::Arc<str>
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_reject_subject_syntax() {
        assert!(ActionId::new("a-1_B").is_ok());
        for bad in ["", "a.b", "a*", ">", "a b", "é"] {
            assert!(ActionId::new(bad).is_err(), "{bad:?} accepted");
        }
        assert!(matches!(
            JobId::new("x".repeat(129)),
            Err(IdError::TooLong { len: 129, .. })
        ));
    }
}
