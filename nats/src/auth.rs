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
use std::path::{Path, PathBuf};
use tangram_shared::subject;

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

/// A role a NATS user plays.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Role {
    /// Everything.
    Operator,
    /// The scheduler (leader or standby).
    Scheduler,
    /// One worker.
    Worker(String),
    /// Rollouts of every job.
    Rollout,
    /// Rollouts of one job.
    RolloutOf(String),
}

/// What a user may publish and subscribe to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Permissions {
    /// Subjects it may publish to.
    pub publish: Vec<String>,
    /// Subjects it may subscribe to.
    pub subscribe: Vec<String>,
    /// Whether it may answer requests it received (on the requester's inbox, whatever the
    /// requester's role): the scheduler answers status requests.
    pub allow_responses: bool,
}

impl Role {
    /// The file stem and user name: `operator`, `scheduler`, `worker-<id>`, `rollout`,
    /// `rollout-<job>`.
    pub fn name(&self) -> String {
        match self {
            Role::Operator => "operator".into(),
            Role::Scheduler => "scheduler".into(),
            Role::Worker(id) => format!("worker-{id}"),
            Role::Rollout => "rollout".into(),
            Role::RolloutOf(job) => format!("rollout-{job}"),
        }
    }

    /// The role a file stem names.
    pub fn parse(name: &str) -> Option<Role> {
        Some(match name {
            "operator" => Role::Operator,
            "scheduler" => Role::Scheduler,
            "rollout" => Role::Rollout,
            n => {
                if let Some(id) = n.strip_prefix("worker-") {
                    Role::Worker(id.to_string())
                } else if let Some(job) = n.strip_prefix("rollout-") {
                    Role::RolloutOf(job.to_string())
                } else {
                    return None;
                }
            }
        })
    }

    /// Where this role's replies come: `_INBOX` for the operator, else a prefix of its own
    /// (`_R_<role>`), so that no other role may listen.
    pub fn inbox_prefix(&self) -> String {
        match self {
            Role::Operator => "_INBOX".into(),
            Role::Rollout => "_R_rollout".into(),
            Role::RolloutOf(job) => format!("_R_rollout.{job}"),
            r => format!("_R_{}", r.name()),
        }
    }

    /// The permissions of this role.
    pub fn permissions(&self) -> Option<Permissions> {
        let inbox = format!("{}.>", self.inbox_prefix());
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        Some(match self {
            Role::Operator => return None,
            Role::Scheduler => Permissions {
                publish: s(&[
                    "tangram.v1.>",
                    "$JS.API.>",
                    "$JS.ACK.>",
                    "$KV.tangram_scheduler.>",
                    &inbox,
                ]),
                subscribe: s(&["tangram.v1.>", &inbox]),
                allow_responses: true,
            },
            Role::Worker(id) => {
                let consumer = format!("worker-{id}");
                let d = subject::DISPATCH_STREAM;
                let kv = format!("KV_{}", subject::SCHEDULER_BUCKET);
                Permissions {
                    publish: vec![
                        "tangram.v1.result.>".into(),
                        format!("tangram.v1.heartbeat.{id}"),
                        "tangram.v1.deadletter.stale_epoch".into(),
                        "tangram.v1.deadletter.unknown_epoch".into(),
                        "tangram.v1.deadletter.fenced_instance".into(),
                        "$JS.API.INFO".into(),
                        "$JS.API.STREAM.INFO.*".into(),
                        format!("$JS.API.CONSUMER.CREATE.{d}.{consumer}"),
                        format!("$JS.API.CONSUMER.CREATE.{d}.{consumer}.>"),
                        format!("$JS.API.CONSUMER.DURABLE.CREATE.{d}.{consumer}"),
                        format!("$JS.API.CONSUMER.INFO.{d}.{consumer}"),
                        format!("$JS.API.CONSUMER.MSG.NEXT.{d}.{consumer}"),
                        format!("$JS.ACK.{d}.{consumer}.>"),
                        format!(
                            "$JS.API.DIRECT.GET.{kv}.$KV.{}.{}",
                            subject::SCHEDULER_BUCKET,
                            subject::EPOCH_KEY
                        ),
                        format!(
                            "$JS.API.DIRECT.GET.{kv}.$KV.{}.{}",
                            subject::SCHEDULER_BUCKET,
                            format!("{}{id}", subject::FENCE_PREFIX)
                        ),
                        format!(
                            "$JS.API.DIRECT.GET.{kv}.$KV.{}.{}",
                            subject::SCHEDULER_BUCKET,
                            format!("{}{id}", subject::CORDON_PREFIX)
                        ),
                        format!("$JS.API.DIRECT.GET.{kv}"),
                        format!("$JS.API.STREAM.MSG.GET.{kv}"),
                        inbox.clone(),
                    ],
                    // Pre-pull requests addressed to it, answered on the asker's inbox.
                    subscribe: vec![inbox, subject::prepull_of(id)],
                    allow_responses: true,
                }
            }
            Role::Rollout => Permissions {
                publish: s(&[
                    "tangram.v1.action.*.*",
                    subject::STATUS,
                    // Pre-pulls ahead of a step (a worker's allow-list bounds what it pulls).
                    "tangram.v1.prepull.*",
                    "$JS.API.INFO",
                    // Looking a stream up by subject (nats-py's and nats.go's subscribe):
                    // the answer names streams, nothing they hold.
                    "$JS.API.STREAM.NAMES",
                    "$JS.API.STREAM.INFO.*",
                    "$JS.API.STREAM.MSG.GET.TANGRAM_RESULTS",
                    "$JS.API.DIRECT.GET.TANGRAM_RESULTS.>",
                    // Ordered consumers over results (replaying what was missed): named ones
                    // with their filter in the subject (async-nats, our client), and the
                    // unnamed form nats-py and nats.go use, whose filter is in the body.
                    // This role reads every job's results, so the body's filter widens
                    // nothing; the per-job role below is not given the unnamed form.
                    "$JS.API.CONSUMER.CREATE.TANGRAM_RESULTS",
                    "$JS.API.CONSUMER.CREATE.TANGRAM_RESULTS.>",
                    // Flow-control answers of those consumers.
                    "$JS.FC.TANGRAM_RESULTS.>",
                    "$JS.API.CONSUMER.MSG.NEXT.TANGRAM_RESULTS.*",
                    "$JS.API.CONSUMER.INFO.TANGRAM_RESULTS.*",
                    "$JS.API.CONSUMER.DELETE.TANGRAM_RESULTS.*",
                    &inbox,
                ]),
                subscribe: s(&["tangram.v1.result.>", &inbox]),
                allow_responses: false,
            },
            Role::RolloutOf(job) => Permissions {
                publish: vec![
                    format!("tangram.v1.action.{job}.*"),
                    subject::STATUS.into(),
                    "tangram.v1.prepull.*".into(),
                    "$JS.API.INFO".into(),
                    // Last-message reads name the subject in the request subject, so the
                    // server can hold them to this job (a MSG.GET names it in the body).
                    format!("$JS.API.DIRECT.GET.TANGRAM_RESULTS.tangram.v1.result.{job}.>"),
                    "$JS.API.STREAM.NAMES".into(),
                    "$JS.API.STREAM.INFO.*".into(),
                    // Ordered consumers over this job's results: the filter is in the
                    // request subject, so the server holds them to the job.
                    // The unnamed form (`CONSUMER.CREATE.TANGRAM_RESULTS`, nats-py's and
                    // nats.go's ordered consumers) carries its filter only in the body, which
                    // the server does not check against permissions: allowed, it would read
                    // every job's results. PROTOCOL.md shows the per-job forms instead.
                    format!("$JS.API.CONSUMER.CREATE.TANGRAM_RESULTS.*.tangram.v1.result.{job}.>"),
                    "$JS.FC.TANGRAM_RESULTS.>".into(),
                    "$JS.API.CONSUMER.MSG.NEXT.TANGRAM_RESULTS.*".into(),
                    "$JS.API.CONSUMER.INFO.TANGRAM_RESULTS.*".into(),
                    "$JS.API.CONSUMER.DELETE.TANGRAM_RESULTS.*".into(),
                    inbox.clone(),
                ],
                subscribe: vec![format!("tangram.v1.result.{job}.>"), inbox],
                allow_responses: false,
            },
        })
    }
}

/// A generated user: its role, public key and seed.
#[derive(Debug, Clone)]
pub struct User {
    /// Its role.
    pub role: Role,
    /// The public key the server knows (`U...`).
    pub public: String,
    /// The seed the process holds (`SU...`).
    pub seed: String,
}

impl User {
    /// A fresh key pair for `role`.
    pub fn generate(role: Role) -> Self {
        let kp = nkeys::KeyPair::new_user();
        Self {
            role,
            public: kp.public_key(),
            seed: kp.seed().expect("a generated key has a seed"),
        }
    }

    /// The user of an existing seed.
    pub fn from_seed(role: Role, seed: &str) -> Result<Self, String> {
        let kp = nkeys::KeyPair::from_seed(seed.trim()).map_err(|e| e.to_string())?;
        Ok(Self {
            role,
            public: kp.public_key(),
            seed: seed.trim().to_string(),
        })
    }
}

/// The `authorization { users = [...] }` block of a nats-server config for these users.
pub fn server_authorization(users: &[User]) -> String {
    format!("authorization {{\n  users = {}}}\n", server_users(users))
}

/// The `[...]` list of these users with their permissions, as an `authorization` block or an
/// account's `users` takes it.
pub fn server_users(users: &[User]) -> String {
    let list = |v: &[String]| {
        v.iter()
            .map(|s| format!("\"{s}\""))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut out = String::from("[\n");
    for u in users {
        out.push_str(&format!(
            "    # {}\n    {{ nkey: \"{}\"",
            u.role.name(),
            u.public
        ));
        if let Some(p) = u.role.permissions() {
            out.push_str(&format!(
                ", permissions: {{ publish: {{ allow: [{}] }}, subscribe: {{ allow: [{}] }}{} }}",
                list(&p.publish),
                list(&p.subscribe),
                // One answer per request, within an hour: the server's default of two
                // minutes would drop the answer to a slow pre-pull.
                if p.allow_responses {
                    ", allow_responses: { max: 1, expires: \"1h\" }"
                } else {
                    ""
                }
            ));
        }
        out.push_str(" }\n");
    }
    out.push_str("  ]\n");
    out
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
    use super::*;

    #[test]
    fn role_names_round_trip_and_inboxes_are_apart() {
        for r in [
            Role::Operator,
            Role::Scheduler,
            Role::Worker("cpu-0".into()),
            Role::Rollout,
            Role::RolloutOf("job1".into()),
        ] {
            assert_eq!(Role::parse(&r.name()), Some(r.clone()));
        }
        // No role's inbox lies under another's, but one job's under all jobs'.
        assert!(!Role::Scheduler.inbox_prefix().starts_with("_R_rollout"));
        assert!(Role::RolloutOf("a".into())
            .inbox_prefix()
            .starts_with(&Role::Rollout.inbox_prefix()));
    }

    #[test]
    fn a_generated_user_round_trips_through_its_seed_and_renders() {
        let u = User::generate(Role::Worker("w1".into()));
        assert!(u.public.starts_with('U') && u.seed.starts_with("SU"));
        let back = User::from_seed(u.role.clone(), &u.seed).unwrap();
        assert_eq!(back.public, u.public);
        let conf = server_authorization(&[u.clone(), User::generate(Role::Operator)]);
        assert!(conf.contains(&u.public));
        assert!(conf.contains("tangram.v1.heartbeat.w1"));
        assert!(!conf.contains("tangram.v1.dispatch"), "{conf}");
    }
}
