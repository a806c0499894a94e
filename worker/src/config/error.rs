//! What a configuration error says: its kind (for the exit code and the message) and the
//! field it concerns.

/// What kind of mistake a configuration error is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConfigErrorKind {
    /// The file could not be read.
    Read,
    /// The file is not valid TOML for this schema (including unknown fields).
    Parse,
    /// A value is malformed or out of range.
    Invalid,
    /// A value would weaken sandbox isolation.
    Refused,
    /// Two settings that are alternatives are both given, or a name is declared twice.
    Conflict,
}

/// A configuration error, for a person; [`ConfigError::kind`] and [`ConfigError::field`] for
/// code.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("reading {}", path.display())]
    Read {
        /// The file.
        path: std::path::PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The file does not parse.
    #[error("{}", path.display())]
    Parse {
        /// The file.
        path: std::path::PathBuf,
        /// Where and why.
        #[source]
        source: toml::de::Error,
    },
    /// The file or an environment variable does not fit the schema (names the key and
    /// where it was set).
    #[error("{0}")]
    Layered(String),
    /// A value is malformed or out of range.
    #[error("{field}: {why}")]
    Invalid {
        /// The key.
        field: &'static str,
        /// What is wrong and what is allowed.
        why: String,
    },
    /// A value would weaken sandbox isolation.
    #[error("{field} is refused: {why}")]
    Refused {
        /// The key.
        field: &'static str,
        /// The danger, and the safe setting.
        why: String,
    },
    /// Alternatives both given, or a name declared twice.
    #[error("{field}: {why}")]
    Conflict {
        /// The key.
        field: &'static str,
        /// What clashes.
        why: String,
    },
}

impl ConfigError {
    /// The kind of mistake.
    pub fn kind(&self) -> ConfigErrorKind {
        match self {
            ConfigError::Read { .. } => ConfigErrorKind::Read,
            ConfigError::Parse { .. } | ConfigError::Layered(_) => ConfigErrorKind::Parse,
            ConfigError::Invalid { .. } => ConfigErrorKind::Invalid,
            ConfigError::Refused { .. } => ConfigErrorKind::Refused,
            ConfigError::Conflict { .. } => ConfigErrorKind::Conflict,
        }
    }

    /// The key at fault, when one is.
    pub fn field(&self) -> Option<&'static str> {
        match self {
            ConfigError::Read { .. } | ConfigError::Parse { .. } | ConfigError::Layered(_) => None,
            ConfigError::Invalid { field, .. }
            | ConfigError::Refused { field, .. }
            | ConfigError::Conflict { field, .. } => Some(field),
        }
    }
}

pub(super) fn invalid<T>(field: &'static str, why: impl Into<String>) -> Result<T, ConfigError> {
    Err(ConfigError::Invalid {
        field,
        why: why.into(),
    })
}

pub(super) fn refused<T>(field: &'static str, why: impl Into<String>) -> Result<T, ConfigError> {
    Err(ConfigError::Refused {
        field,
        why: why.into(),
    })
}

pub(super) fn conflict<T>(field: &'static str, why: impl Into<String>) -> Result<T, ConfigError> {
    Err(ConfigError::Conflict {
        field,
        why: why.into(),
    })
}

pub(super) fn bad(field: &'static str) -> impl Fn(String) -> ConfigError {
    move |why| ConfigError::Invalid { field, why }
}
