//! `tangram submit`: send one action, wait for its result, print it.

use anyhow::{bail, Context as _};
use futures::StreamExt as _;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;
use tangram_shared::codec::{self, Encoding};
use tangram_shared::{
    subject, Action, ActionId, ActionResult, ActionSpec, Api, CpuRange, JobId, Outcome, Reward,
    SandboxClose, SandboxExec, SandboxOpen, TrajectoryId,
};

/// Options common to every `submit`.
#[derive(Debug, clap::Args)]
pub struct SubmitArgs {
    /// What to submit.
    #[command(subcommand)]
    pub what: What,
    /// The job (a subject token).
    #[arg(long, global = true, default_value = "cli")]
    pub job: String,
    /// The trajectory.
    #[arg(long, global = true, default_value = "t0")]
    pub trajectory: String,
    /// Action id (idempotency key) [default: a fresh one].
    #[arg(long, global = true)]
    pub id: Option<String>,
    /// nkey seed file [default: TANGRAM_NKEY_FILE, else <state-dir>/creds/operator.nk when
    /// it exists].
    #[arg(long, global = true)]
    pub nkey_file: Option<std::path::PathBuf>,
    /// Execution timeout, seconds.
    #[arg(long, global = true, default_value_t = 60.0)]
    pub timeout_s: f64,
    /// How long to wait for the result, seconds.
    #[arg(long, global = true, default_value_t = 300.0)]
    pub wait_s: f64,
    /// Print the result as JSON only.
    #[arg(long, global = true)]
    pub json: bool,
    /// NATS URL [default: the cluster `tangram up` started, else nats://127.0.0.1:4222].
    #[arg(long, global = true, env = "TANGRAM_NATS_URL")]
    pub nats_url: Option<String>,
    #[command(flatten)]
    pub(crate) tls: crate::connect::TlsArgs,
}

/// The action.
#[derive(Debug, clap::Subcommand)]
pub enum What {
    /// Open the trajectory's sandbox.
    Open {
        /// Image [default: the worker's].
        #[arg(long)]
        image: Option<String>,
        /// Memory limit, MiB.
        #[arg(long, default_value_t = 512)]
        memory_mb: u64,
    },
    /// Run a command in the trajectory's sandbox: `tangram submit exec -- python3 -c 'print(1)'`.
    Exec {
        /// Elastic cores, `N` or `MIN-MAX`.
        #[arg(long, default_value = "1")]
        cpus: String,
        /// A file to write under /work first: `NAME=LOCAL_PATH` (repeatable).
        #[arg(long = "put")]
        put: Vec<String>,
        /// Text fed to standard input.
        #[arg(long)]
        stdin: Option<String>,
        /// The command.
        #[arg(last = true, required = true)]
        argv: Vec<String>,
    },
    /// Remove the trajectory's sandbox.
    Close,
    /// Score inputs with a reward service.
    Reward {
        /// The service.
        #[arg(long)]
        service: String,
        /// An input text (repeatable).
        #[arg(long = "input", required = true)]
        inputs: Vec<String>,
    },
    /// Call an external API provider.
    Api {
        /// The provider.
        #[arg(long)]
        provider: String,
        /// Path under the provider's base URL.
        #[arg(long)]
        path: String,
        /// HTTP method.
        #[arg(long, default_value = "GET")]
        method: String,
        /// A query parameter `KEY=VALUE` (repeatable).
        #[arg(long = "query")]
        query: Vec<String>,
    },
    /// An action from a JSON file (protocol v1; `id`, `job`, `trajectory` may be left out).
    File {
        /// The file.
        path: PathBuf,
    },
}

fn cpus(s: &str) -> anyhow::Result<CpuRange> {
    let (a, b) = s.split_once('-').unwrap_or((s, s));
    let r = CpuRange {
        min: a.trim().parse().context("--cpus")?,
        max: b.trim().parse().context("--cpus")?,
    };
    if r.min == 0 || r.min > r.max {
        bail!("--cpus {s}: needs 1 <= MIN <= MAX");
    }
    Ok(r)
}

#[allow(clippy::disallowed_methods)] // wall time makes ids unique across runs of the CLI
fn fresh_id() -> String {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("cli-{:x}-{:x}", t, std::process::id())
}

fn build(a: &SubmitArgs) -> anyhow::Result<Action> {
    let id = a.id.clone().unwrap_or_else(fresh_id);
    let timeout_ms = (a.timeout_s * 1e3) as u64;
    let spec = match &a.what {
        What::Open { image, memory_mb } => ActionSpec::SandboxOpen(SandboxOpen {
            image: image.clone(),
            memory_mb: *memory_mb,
            ..Default::default()
        }),
        What::Exec {
            cpus: c,
            put,
            stdin,
            argv,
        } => {
            let mut files = BTreeMap::new();
            for p in put {
                let (name, local) = p
                    .split_once('=')
                    .with_context(|| format!("--put {p}: expected NAME=LOCAL_PATH"))?;
                files.insert(
                    name.to_string(),
                    std::fs::read_to_string(local).with_context(|| format!("reading {local}"))?,
                );
            }
            ActionSpec::SandboxExec(SandboxExec {
                argv: argv.clone(),
                cpus: cpus(c)?,
                files,
                env: BTreeMap::new(),
                stdin: stdin.clone(),
            })
        }
        What::Close => ActionSpec::SandboxClose(SandboxClose::default()),
        What::Reward { service, inputs } => ActionSpec::Reward(Reward {
            service: service.clone(),
            inputs: inputs.clone(),
            options: BTreeMap::new(),
        }),
        What::Api {
            provider,
            path,
            method,
            query,
        } => {
            let mut q = BTreeMap::new();
            for kv in query {
                let (k, v) = kv
                    .split_once('=')
                    .with_context(|| format!("--query {kv}: expected KEY=VALUE"))?;
                q.insert(k.to_string(), v.to_string());
            }
            ActionSpec::Api(Api {
                provider: provider.clone(),
                method: method.clone(),
                path: path.clone(),
                query: q,
                body: None,
                headers: BTreeMap::new(),
            })
        }
        What::File { path } => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading {}", path.display()))?;
            let mut v: serde_json::Value = serde_json::from_str(&text)
                .with_context(|| format!("{} is not JSON", path.display()))?;
            let obj = v
                .as_object_mut()
                .context("the file must hold one JSON object (an action)")?;
            obj.entry("id").or_insert_with(|| id.clone().into());
            obj.entry("job").or_insert_with(|| a.job.clone().into());
            obj.entry("trajectory")
                .or_insert_with(|| a.trajectory.clone().into());
            return serde_json::from_value(v)
                .with_context(|| format!("{} is not a valid action", path.display()));
        }
    };
    Ok(Action {
        queue_timeout_ms: None,
        id: ActionId(id.into()),
        job: JobId(a.job.clone()),
        trajectory: TrajectoryId(a.trajectory.clone()),
        timeout_ms,
        spec,
    })
}

/// Tries at storing an action: with waits of 0.1 s doubling to 2 s, about 12 s in all.
const PUBLISH_TRIES: u32 = 10;

/// Submits and waits; returns the result.
pub async fn submit_and_wait(
    url: &str,
    creds: &tangram_nats::auth::Credentials,
    action: &Action,
    wait: Duration,
) -> anyhow::Result<ActionResult> {
    let client = crate::errors::connect(url, "tangram-submit", creds).await?;
    let js = async_nats::jetstream::new(client.clone());
    let result_subject = subject::result(&action.job, &action.id);
    // Listen first, so the result cannot slip by; then look for an earlier one (a resubmitted id).
    let mut sub = client.subscribe(result_subject.clone()).await?;
    let mut headers = async_nats::HeaderMap::new();
    headers.insert(subject::HEADER_MSG_ID, action.id.as_str());
    headers.insert(subject::HEADER_CONTENT_TYPE, Encoding::Json.content_type());
    let body: bytes::Bytes = codec::encode(action, Encoding::Json)?.into();
    // What is transient (no answer in time, no responder while a stream elects a leader or is
    // not there yet) is tried again with the same id, so at most one copy is stored.
    let mut attempt = 0;
    let stored = loop {
        attempt += 1;
        let tried = async {
            js.publish_with_headers(
                subject::action(&action.job, action.kind()),
                headers.clone(),
                body.clone(),
            )
            .await?
            .await
        }
        .await;
        match tried {
            Err(e) if attempt < PUBLISH_TRIES && tangram_nats::publish_is_transient(&e) => {
                tokio::time::sleep(tangram_nats::backoff::backoff(
                    attempt,
                    Duration::from_millis(100),
                    Duration::from_secs(2),
                ))
                .await;
            }
            other => break other,
        }
    };
    match stored {
        Err(e) if tangram_nats::stream_full(&e) => anyhow::bail!(
            "the cluster refused {}: the action stream is full ({e}); work arrives faster than \
             it is processed, so slow down (`tangram status` shows the queue) and resubmit later",
            action.id
        ),
        other => other.context("JetStream did not store the action (is the cluster up?)")?,
    };
    // No stream info (a job's role may not read it): the last result by subject, directly.
    if let Ok(stream) = js.get_stream_no_info(subject::RESULTS_STREAM).await {
        if let Ok(m) = stream
            .direct_get_last_for_subject(result_subject.clone())
            .await
        {
            let enc = if m
                .headers
                .get(subject::HEADER_CONTENT_TYPE)
                .is_some_and(|v| v.as_str().contains("json"))
            {
                Encoding::Json
            } else {
                Encoding::Msgpack
            };
            return Ok(codec::decode(&m.payload, enc)?);
        }
    }
    let msg = tokio::time::timeout(wait, sub.next())
        .await
        .with_context(|| format!("no result for {} within {} s (it stays queued; its result will be on {result_subject})", action.id, wait.as_secs()))?
        .context("subscription closed")?;
    let enc = msg
        .headers
        .as_ref()
        .and_then(|h| h.get(subject::HEADER_CONTENT_TYPE))
        .map_or(Encoding::Msgpack, |v| {
            if v.as_str().contains("json") {
                Encoding::Json
            } else {
                Encoding::Msgpack
            }
        });
    Ok(codec::decode(&msg.payload, enc)?)
}

/// `tangram submit`. Exit status: 0 when the action completed (whatever its exit code), 1
/// otherwise.
pub fn submit(a: SubmitArgs, state: &std::path::Path) -> anyhow::Result<bool> {
    let action = build(&a)?;
    action
        .validate(&tangram_shared::Limits::default())
        .map_err(|r| anyhow::anyhow!("invalid action: {}", r.reason))?;
    let url = crate::cluster::nats_url(a.nats_url.clone(), state);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let creds = crate::cluster::credentials(a.nkey_file.clone(), &a.tls, state);
    let spinner =
        crate::progress::Spinner::start(format!("{} submitted; waiting for its result", action.id));
    let r = rt.block_on(submit_and_wait(
        &url,
        &creds,
        &action,
        Duration::from_secs_f64(a.wait_s),
    ));
    spinner.finish();
    let r = r?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&r)?);
    } else {
        let t = &r.timing;
        let outcome = match &r.outcome {
            Outcome::Completed { exit_code } => format!("completed, exit code {exit_code}"),
            Outcome::TimedOut => "timed out".into(),
            Outcome::OutOfMemory { exit_code } => {
                format!("out of memory (the sandbox's memory limit; exit code {exit_code})")
            }
            Outcome::Rejected { code, reason } => format!("rejected ({}): {reason}", code.as_str()),
            Outcome::InfraError { code, reason } => format!("infra_error ({code:?}): {reason}"),
        };
        println!("{} {}: {outcome}", action.kind().as_str(), r.id);
        if let Some(p) = &r.placement {
            println!("  on {} with {} cores {}", p.worker, p.cores, p.cpuset);
        }
        println!(
            "  ACT {:.3} s = queued {:.3} + overhead {:.3} + exec {:.3}",
            t.act_us as f64 / 1e6,
            t.queued_us as f64 / 1e6,
            t.overhead_us as f64 / 1e6,
            t.exec_us as f64 / 1e6
        );
        if !r.stdout.is_empty() {
            println!(
                "--- stdout{}\n{}",
                if r.truncated { " (truncated)" } else { "" },
                r.stdout.trim_end()
            );
        }
        if !r.stderr.is_empty() {
            println!("--- stderr\n{}", r.stderr.trim_end());
        }
        if let Some(s) = &r.scores {
            println!("  scores: {s:?}");
        }
        if let Some(u) = &r.service {
            println!(
                "  service {} on GPUs {:?}{}{}",
                u.service,
                u.gpus,
                if u.restored {
                    ", restored"
                } else {
                    ", resident"
                },
                if u.evicted.is_empty() {
                    String::new()
                } else {
                    format!(", evicted {:?}", u.evicted)
                }
            );
        }
        if let Some(h) = &r.http {
            println!(
                "  HTTP {}{}\n{}",
                h.status,
                if h.truncated { " (body truncated)" } else { "" },
                h.body.trim_end()
            );
        }
    }
    Ok(matches!(r.outcome, Outcome::Completed { .. }))
}
