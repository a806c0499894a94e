//! Who may say what on NATS: the roles, their permissions, their credentials, and the one
//! place every Tangram process connects.
//!
//! Each role is a NATS user authenticated by an nkey (an Ed25519 key pair; the server holds
//! only the public key, the process holds the seed in a file). Permissions are subject
//! allow-lists the server enforces:
//!
//! - `operator`: everything (the CLI, an operator's `nats` CLI).
//! - `scheduler`: the actions and results it consumes, dispatches, dead letters, status,
//!   heartbeats, its KV bucket and the JetStream API.
//! - `worker-<id>`: only its own dispatch consumer, results, its heartbeats, refusal records,
//!   a read of the scheduler epoch, and answers to pre-pull requests addressed to it; no
//!   stream administration, no other worker's work.
//! - `rollout` (every job) or `rollout-<job>` (one job): publish actions and read results of
//!   its job(s), ask for status; never dispatches, heartbeats, stream administration or
//!   other jobs' results and inboxes.
//!
//! Every role replies on its own inbox prefix, so inboxes can be permissioned: a rollout
//! cannot subscribe to another role's (or another job's) replies.

use async_nats::ConnectOptions;
pub use roles::{server_authorization, server_users, Permissions, Role, User};
use std::path::{Path, PathBuf};
use tangram_shared::subject;

mod roles;

/// How a process proves who it is, and how it checks the server.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Credentials {
    /// A file holding the nkey seed (`SU...`), as `tangram up` writes under
    /// `<state-dir>/creds/<role>.nk`. None: connect without authentication.
    pub nkey_file: Option<PathBuf>,
    /// CA certificate(s) to verify the server with (PEM); setting it requires TLS.
    pub tls_ca: Option<PathBuf>,
    /// Client certificate and key (PEM) for servers that verify clients.
    pub tls_cert: Option<PathBuf>,
    /// The client certificate's key.
    pub tls_key: Option<PathBuf>,
    /// Inbox prefix for replies (the role's; see [`Role::inbox_prefix`]). None: NATS's
    /// default `_INBOX`, which only an unauthenticated server or the operator allows.
    pub inbox_prefix: Option<String>,
}

/// The `[nats]` table of a config file (and the matching flags): credentials as written.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawCredentials {
    /// nkey seed file (`--nkey-file`, `TANGRAM_NKEY_FILE`).
    pub nkey_file: Option<PathBuf>,
    /// CA certificate(s) to verify the server (`--tls-ca`, `TANGRAM_TLS_CA`).
    pub tls_ca: Option<PathBuf>,
    /// Client certificate (`--tls-cert`, `TANGRAM_TLS_CERT`).
    pub tls_cert: Option<PathBuf>,
    /// Client key (`--tls-key`, `TANGRAM_TLS_KEY`).
    pub tls_key: Option<PathBuf>,
    /// Reply inbox prefix [default: the role's, from the seed file's name].
    pub inbox_prefix: Option<String>,
}

/// The credential flags every Tangram binary takes (`#[command(flatten)]`).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct CredentialFlags {
    /// nkey seed file for NATS (`tangram up` writes <state-dir>/creds/<role>.nk).
    #[arg(long, env = "TANGRAM_NKEY_FILE")]
    pub nkey_file: Option<PathBuf>,
    /// CA certificate(s) to verify the NATS server with (requires TLS).
    #[arg(long, env = "TANGRAM_TLS_CA")]
    pub tls_ca: Option<PathBuf>,
    /// Client certificate for NATS servers that verify clients.
    #[arg(long, env = "TANGRAM_TLS_CERT")]
    pub tls_cert: Option<PathBuf>,
    /// Key of the client certificate.
    #[arg(long, env = "TANGRAM_TLS_KEY")]
    pub tls_key: Option<PathBuf>,
}

impl From<CredentialFlags> for RawCredentials {
    fn from(f: CredentialFlags) -> Self {
        Self {
            nkey_file: f.nkey_file,
            tls_ca: f.tls_ca,
            tls_cert: f.tls_cert,
            tls_key: f.tls_key,
            inbox_prefix: None,
        }
    }
}

impl RawCredentials {
    /// Fields set in `over` win.
    pub fn merge(self, over: RawCredentials) -> Self {
        Self {
            nkey_file: over.nkey_file.or(self.nkey_file),
            tls_ca: over.tls_ca.or(self.tls_ca),
            tls_cert: over.tls_cert.or(self.tls_cert),
            tls_key: over.tls_key.or(self.tls_key),
            inbox_prefix: over.inbox_prefix.or(self.inbox_prefix),
        }
    }

    /// Checked credentials: a client certificate comes with its key.
    pub fn validate(self) -> Result<Credentials, ConnectError> {
        if self.tls_cert.is_some() != self.tls_key.is_some() {
            return Err(ConnectError::HalfTls);
        }
        let mut c = match self.nkey_file {
            Some(f) => Credentials::from_seed_file(f),
            None => Credentials::default(),
        };
        c.tls_ca = self.tls_ca;
        c.tls_cert = self.tls_cert;
        c.tls_key = self.tls_key;
        if self.inbox_prefix.is_some() {
            c.inbox_prefix = self.inbox_prefix;
        }
        Ok(c)
    }
}

/// Connecting failed before or at the server.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// The seed file could not be read.
    #[error("reading the nkey seed file {path}: {source}")]
    SeedFile {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The file does not hold a user seed.
    #[error("{path} does not hold an nkey user seed (a line starting with SU)")]
    BadSeed {
        /// The file.
        path: PathBuf,
    },
    /// TLS client certificate without its key, or the reverse.
    #[error("tls_cert and tls_key go together")]
    HalfTls,
    /// The server refused or could not be reached.
    #[error("connecting to NATS at {url}: {source}{hint}")]
    Connect {
        /// The URL.
        url: String,
        /// The client's error.
        #[source]
        source: async_nats::ConnectError,
        /// What to try.
        hint: &'static str,
    },
}

impl Credentials {
    /// Credentials from a seed file, with the inbox prefix of the role it names
    /// (`<dir>/<role>.nk`).
    pub fn from_seed_file(path: impl Into<PathBuf>) -> Self {
        let path = path.into();
        let inbox_prefix = path
            .file_stem()
            .and_then(|s| s.to_str())
            .and_then(Role::parse)
            .map(|r| r.inbox_prefix());
        Self {
            nkey_file: Some(path),
            inbox_prefix,
            ..Default::default()
        }
    }

    /// The connect options these credentials give, named `name`.
    pub fn options(&self, name: &str) -> Result<ConnectOptions, ConnectError> {
        let mut o = ConnectOptions::new()
            .name(name)
            // A connection whose packets vanish (a partition that drops rather than resets)
            // is noticed within a few pings, not the 60 s default, and the reconnects that
            // follow each give up after 2 s and come again within a second: after the heal
            // the next one gets through in about that time, instead of waiting out TCP's
            // retransmission backoff on a dead connection.
            .ping_interval(LIVENESS_PING)
            .connection_timeout(CONNECT_TIMEOUT)
            .reconnect_delay_callback(reconnect_delay);
        if let Some(path) = &self.nkey_file {
            o = o.nkey(read_seed(path)?);
        }
        if let Some(prefix) = &self.inbox_prefix {
            o = o.custom_inbox_prefix(prefix);
        }
        if let Some(ca) = &self.tls_ca {
            o = o.add_root_certificates(ca.clone()).require_tls(true);
        }
        match (&self.tls_cert, &self.tls_key) {
            (Some(c), Some(k)) => {
                o = o
                    .add_client_certificate(c.clone(), k.clone())
                    .require_tls(true)
            }
            (None, None) => {}
            _ => return Err(ConnectError::HalfTls),
        }
        Ok(o)
    }
}

/// Connects with these credentials; the error says what to check. `url` may list several
/// servers of a cluster, comma-separated (`nats://nats-1:4222,nats://nats-2:4222`): the
/// client starts with any that answers and learns the rest from the cluster.
pub async fn connect(
    url: &str,
    name: &str,
    creds: &Credentials,
) -> Result<async_nats::Client, ConnectError> {
    let options = creds.options(name)?;
    let urls: Vec<&str> = url
        .split(',')
        .map(str::trim)
        .filter(|u| !u.is_empty())
        .collect();
    options.connect(urls).await.map_err(|source| {
        use async_nats::ConnectErrorKind as K;
        let hint = match source.kind() {
            K::AuthorizationViolation | K::Authentication if creds.nkey_file.is_none() => {
                " (the server requires credentials: pass --nkey-file <state-dir>/creds/<role>.nk)"
            }
            K::AuthorizationViolation | K::Authentication => {
                " (the server does not accept this nkey: is it from this cluster's state dir?)"
            }
            _ => tls_hint(&source).unwrap_or(match source.kind() {
                K::Tls => " (TLS failed: check --tls-ca, and --tls-cert/--tls-key where the server verifies clients)",
                _ => "",
            }),
        };
        ConnectError::Connect {
            url: url.to_string(),
            source,
            hint,
        }
    })
}

/// What to do about a failed TLS handshake, from the TLS library's error in the chain.
fn tls_hint(e: &(dyn std::error::Error + 'static)) -> Option<&'static str> {
    use async_nats::rustls::{AlertDescription as A, CertificateError as C, Error as T};
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(c) = cause {
        let tls = c.downcast_ref::<T>().or_else(|| {
            c.downcast_ref::<std::io::Error>()
                .and_then(|io| io.get_ref())
                .and_then(|inner| inner.downcast_ref::<T>())
        });
        if let Some(t) = tls {
            return Some(match t {
                T::AlertReceived(A::CertificateRequired) => {
                    " (the server verifies clients: pass --tls-cert and --tls-key, a certificate its CA signed)"
                }
                T::AlertReceived(A::BadCertificate | A::UnknownCA | A::CertificateUnknown) => {
                    " (the server refused the client certificate: is it signed by the CA the server trusts, with clientAuth usage?)"
                }
                T::InvalidCertificate(C::UnknownIssuer) => {
                    " (the server's certificate is not signed by a CA you trust: pass --tls-ca with the fleet's CA)"
                }
                T::InvalidCertificate(C::NotValidForName | C::NotValidForNameContext { .. }) => {
                    " (the server's certificate does not name the address dialled: an IP needs an IP SAN, a host name a DNS SAN)"
                }
                _ => " (TLS failed: check --tls-ca, and --tls-cert/--tls-key where the server verifies clients)",
            });
        }
        cause = c.source();
    }
    None
}

/// Reads a seed file: the first line starting with `SU`.
pub fn read_seed(path: &Path) -> Result<String, ConnectError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConnectError::SeedFile {
        path: path.to_path_buf(),
        source,
    })?;
    text.lines()
        .map(str::trim)
        .find(|l| l.starts_with("SU"))
        .map(str::to_string)
        .ok_or_else(|| ConnectError::BadSeed {
            path: path.to_path_buf(),
        })
}

/// How often a client pings its server (two unanswered pings end the connection).
pub const LIVENESS_PING: std::time::Duration = std::time::Duration::from_secs(2);
/// How long one connection attempt may take.
pub const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// The wait before reconnection attempt `attempts`: none for the first, then doubling from
/// 50 ms up to 1 s, spread (half to one and a half times) so that a fleet does not come back
/// in step.
fn reconnect_delay(attempts: usize) -> std::time::Duration {
    if attempts <= 1 {
        return std::time::Duration::ZERO;
    }
    crate::backoff::backoff(
        attempts.min(32) as u32,
        std::time::Duration::from_millis(50),
        std::time::Duration::from_secs(1),
    )
}

/// Replaces every value whose key names a secret (`token`, `secret`, `password`, `seed`,
/// `key`, `credential`, but not a `*_file` or `*_env` that only says where one is) with
/// `"<redacted>"`, at any depth: for printing a configuration.
pub fn redact(value: &mut serde_json::Value) {
    const SECRET: [&str; 6] = ["token", "secret", "password", "seed", "key", "credential"];
    match value {
        serde_json::Value::Object(map) => {
            for (k, v) in map.iter_mut() {
                let k = k.to_ascii_lowercase();
                let names_a_place =
                    k.ends_with("_file") || k.ends_with("_env") || k.ends_with("_dir");
                if !names_a_place && SECRET.iter().any(|s| k.contains(s)) && !v.is_null() {
                    *v = serde_json::Value::String("<redacted>".into());
                } else {
                    redact(v);
                }
            }
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(redact),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redact_hides_secrets_at_any_depth_and_keeps_where_they_are() {
        let mut v = serde_json::json!({"nats": {"nkey_file": "/etc/x.nk", "token": "abc"},
            "provider": [{"name": "s", "credential_file": "/k", "headers": {"api_key": "zz"}}]});
        redact(&mut v);
        assert_eq!(v["nats"]["token"], "<redacted>");
        assert_eq!(v["nats"]["nkey_file"], "/etc/x.nk");
        assert_eq!(v["provider"][0]["credential_file"], "/k");
        assert_eq!(v["provider"][0]["headers"]["api_key"], "<redacted>");
        assert_eq!(v["provider"][0]["name"], "s");
    }
}
