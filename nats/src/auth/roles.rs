//! The roles, what each may publish and subscribe to, and their users (nkey pairs) as the
//! server's configuration lists them.

use super::*;

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
    /// Subjects it may not publish to, though `publish` covers them (the scheduler's own
    /// consumers, under a rollout's wildcard over consumer names).
    pub deny_publish: Vec<String>,
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
                deny_publish: Vec::new(),
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
                        // Its own consumer, only with its own dispatches as the filter, which
                        // this form carries in the request subject for the server to check
                        // (the forms with the filter only in the body would let it read
                        // every worker's dispatches).
                        format!(
                            "$JS.API.CONSUMER.CREATE.{d}.{consumer}.tangram.v1.dispatch.{id}.>"
                        ),
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
                    deny_publish: Vec::new(),
                    allow_responses: true,
                }
            }
            Role::Rollout => Permissions {
                publish: s(&[
                    "tangram.v1.action.*.*",
                    subject::STATUS,
                    // Closing a job's sandboxes, and renewing a job's lease.
                    subject::CLOSE_JOB_ALL,
                    subject::LEASE_ALL,
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
                deny_publish: schedulers_consumers(),
                allow_responses: false,
            },
            Role::RolloutOf(job) => Permissions {
                publish: vec![
                    format!("tangram.v1.action.{job}.*"),
                    subject::STATUS.into(),
                    subject::close_job_of(job),
                    subject::lease_of(job),
                    "tangram.v1.prepull.*".into(),
                    "$JS.API.INFO".into(),
                    // Last-message reads name the subject in the request subject, so the
                    // server can hold them to this job (a MSG.GET names it in the body).
                    format!("$JS.API.DIRECT.GET.TANGRAM_RESULTS.tangram.v1.result.{job}.>"),
                    // Looking a stream up by subject names streams, nothing they hold. Not
                    // STREAM.INFO: its subjects filter, in the request body, lists every
                    // job's stored subjects (job names and action ids).
                    "$JS.API.STREAM.NAMES".into(),
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
                deny_publish: schedulers_consumers(),
                allow_responses: false,
            },
        })
    }
}

/// The consumer API subjects that name the scheduler's results consumer. A rollout's
/// consumer permissions cover any name (nats-py's and nats.go's ordered consumers have
/// random ones), so these are denied by name: pulling from it read every job's results, and
/// deleting or redefining it stopped result intake for the rest of the term.
fn schedulers_consumers() -> Vec<String> {
    let (stream, name) = (subject::RESULTS_STREAM, subject::SCHEDULER_RESULTS_CONSUMER);
    vec![
        format!("$JS.API.CONSUMER.*.{stream}.{name}"),
        format!("$JS.API.CONSUMER.*.{stream}.{name}.>"),
        format!("$JS.API.CONSUMER.MSG.NEXT.{stream}.{name}"),
        format!("$JS.API.CONSUMER.DURABLE.CREATE.{stream}.{name}"),
        format!("$JS.ACK.{stream}.{name}.>"),
    ]
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
            let deny = if p.deny_publish.is_empty() {
                String::new()
            } else {
                format!(", deny: [{}]", list(&p.deny_publish))
            };
            out.push_str(&format!(
                ", permissions: {{ publish: {{ allow: [{}]{deny} }}, subscribe: {{ allow: [{}] }}{} }}",
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

#[cfg(test)]
mod tests {
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
        // Its own consumer's filter names its dispatches; it may publish none.
        assert!(!conf.contains("\"tangram.v1.dispatch"), "{conf}");
        assert!(conf.contains("tangram.v1.dispatch.w1.>"), "{conf}");
    }
}
