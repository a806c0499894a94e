//! `tangram replay deadletter`: the rejected messages, verbatim, with their reasons; one can
//! be shown in full and a corrected version re-submitted.

use crate::inspect::HEADER_DLQ_ACTION;
use crate::streams::{self, Record, Scan};
use anyhow::{bail, Context as _};
use serde::Serialize;
use std::path::PathBuf;
use tangram_shared::codec::{self, Encoding};
use tangram_shared::{subject, Action};

/// `tangram replay deadletter`'s subcommands.
#[derive(Debug, clap::Subcommand)]
pub(crate) enum DeadletterWhat {
    /// List the records, oldest first.
    List {
        /// Only this code (the last token of the subject: undecodable, invalid_field,
        /// stale_epoch, ...).
        #[arg(long)]
        code: Option<String>,
        /// Only records whose original subject is this job's.
        #[arg(long)]
        job: Option<String>,
        /// Only records stored at or after this time (RFC 3339, Unix seconds or an age).
        #[arg(long)]
        since: Option<String>,
        /// Print JSON lines.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        cluster: crate::connect::ClusterArgs,
    },
    /// Print one record in full: its headers and its body (as JSON when it decodes).
    Show {
        /// The record's sequence number (from `list`).
        seq: u64,
        #[command(flatten)]
        cluster: crate::connect::ClusterArgs,
    },
    /// Submit a corrected action in place of a dead-lettered one: the file holds the action
    /// as JSON (start from `show`'s body). It goes to its job's and kind's subject with its id
    /// as the idempotency key, and the command waits for its result.
    Resubmit {
        /// The record being corrected (its sequence number), for the log line.
        seq: u64,
        /// The corrected action, JSON (`-` reads standard input).
        #[arg(long)]
        file: PathBuf,
        /// Seconds to wait for the result.
        #[arg(long, default_value_t = 300.0)]
        wait_s: f64,
        #[command(flatten)]
        cluster: crate::connect::ClusterArgs,
    },
}

/// One record, for listing.
#[derive(Debug, Serialize, PartialEq)]
pub struct Entry {
    pub seq: u64,
    pub stored_at: String,
    pub code: String,
    pub reason: String,
    pub original_subject: Option<String>,
    pub action_id: Option<String>,
    pub worker: Option<String>,
    pub bytes: usize,
}

/// A record as a list entry (pure).
pub fn entry(r: &Record) -> Entry {
    Entry {
        seq: r.seq,
        stored_at: super::utc(r.at_us),
        code: r.subject.rsplit('.').next().unwrap_or_default().to_string(),
        reason: r
            .header(subject::HEADER_DLQ_REASON)
            .unwrap_or_default()
            .to_string(),
        original_subject: r.header(subject::HEADER_DLQ_SUBJECT).map(str::to_string),
        action_id: r.header(HEADER_DLQ_ACTION).map(str::to_string),
        worker: r.header(subject::HEADER_DLQ_WORKER).map(str::to_string),
        bytes: r
            .header("Nats-Msg-Size")
            .and_then(|s| s.parse().ok())
            .unwrap_or(r.payload.len()),
    }
}

/// One dead-letter record, with its payload.
async fn fetch(
    url: &str,
    creds: &tangram_nats::auth::Credentials,
    seq: u64,
) -> anyhow::Result<Record> {
    let client = crate::errors::connect(url, "tangram-replay", creds).await?;
    streams::get(
        &async_nats::jetstream::new(client),
        subject::DEADLETTER_STREAM,
        seq,
    )
    .await
}

/// Whether an entry passes the filters.
fn keep(e: &Entry, code: Option<&str>, job: Option<&str>) -> bool {
    code.is_none_or(|c| e.code == c)
        && job.is_none_or(|j| {
            e.original_subject
                .as_deref()
                .and_then(subject::parse_action)
                .is_some_and(|(sj, _)| sj == j)
        })
}

pub(crate) fn deadletter(what: DeadletterWhat) -> anyhow::Result<()> {
    let rt = super::runtime()?;
    match what {
        DeadletterWhat::List {
            code,
            job,
            since,
            json,
            cluster,
        } => {
            let (url, creds) = cluster.resolve();
            let since_us = since
                .as_deref()
                .map(|s| super::parse_time(s, super::now_us()))
                .transpose()?;
            let records = rt.block_on(async {
                let client = crate::errors::connect(&url, "tangram-replay", &creds).await?;
                let js = async_nats::jetstream::new(client);
                streams::scan(
                    &js,
                    subject::DEADLETTER_STREAM,
                    &Scan {
                        since_us,
                        headers_only: true,
                        ..Default::default()
                    },
                )
                .await
            })?;
            let entries: Vec<Entry> = records
                .iter()
                .map(entry)
                .filter(|e| keep(e, code.as_deref(), job.as_deref()))
                .collect();
            if json {
                for e in &entries {
                    println!("{}", serde_json::to_string(e)?);
                }
            } else {
                let mut t = crate::table::new(["seq", "stored (UTC)", "code", "action", "reason"]);
                // The sequence number is the only number here.
                crate::table::left(&mut t, &[1, 2, 3, 4]);
                crate::table::right(&mut t, &[0]);
                for e in &entries {
                    t.add_row([
                        e.seq.to_string(),
                        e.stored_at.to_string(),
                        e.code.to_string(),
                        e.action_id.as_deref().unwrap_or("-").to_string(),
                        e.reason.to_string(),
                    ]);
                }
                print!("{}", crate::table::render(&t, ""));
                println!("{} records", entries.len());
            }
            Ok(())
        }
        DeadletterWhat::Show { seq, cluster } => {
            let (url, creds) = cluster.resolve();
            let r = rt.block_on(fetch(&url, &creds, seq))?;
            let e = entry(&r);
            println!("{}", serde_json::to_string_pretty(&e)?);
            match r.decode::<serde_json::Value>() {
                Ok(v) => println!("{}", serde_json::to_string_pretty(&v)?),
                Err(_) => println!(
                    "(body, {} bytes, does not decode; as text:)\n{}",
                    r.payload.len(),
                    String::from_utf8_lossy(&r.payload)
                ),
            }
            Ok(())
        }
        DeadletterWhat::Resubmit {
            seq,
            file,
            wait_s,
            cluster,
        } => {
            let text = if file.as_os_str() == "-" {
                std::io::read_to_string(std::io::stdin())?
            } else {
                std::fs::read_to_string(&file)
                    .with_context(|| format!("reading {}", file.display()))?
            };
            let mut action: Action = codec::decode(text.as_bytes(), Encoding::Json)
                .context("the corrected action does not decode")?;
            if let Err(r) = action.validate(&tangram_shared::Limits::default()) {
                bail!(
                    "the corrected action is still invalid: {:?}: {}",
                    r.code,
                    r.reason
                );
            }
            let (url, creds) = cluster.resolve();
            let record = rt.block_on(fetch(&url, &creds, seq))?;
            // The old id already has its result (the rejection), and the actions stream
            // would drop a second message under it inside the duplicate window: the
            // correction gets an id of its own.
            if entry(&record).action_id.as_deref() == Some(action.id.as_str()) {
                let fresh = format!("{}-fix{}", action.id, super::now_us() / 1_000_000);
                action.id = tangram_shared::ActionId::new(fresh)
                    .map_err(|e| anyhow::anyhow!("the corrected action's new id: {e}"))?;
                eprintln!(
                    "the correction is submitted as {} (its old id has a result already)",
                    action.id
                );
            }
            eprintln!(
                "re-submitting {} (correcting dead letter #{seq}) on {}",
                action.id,
                subject::action(&action.job, action.kind())
            );
            let result = rt.block_on(crate::submit::submit_and_wait(
                &url,
                &creds,
                &action,
                std::time::Duration::from_secs_f64(wait_s),
            ))?;
            println!("{}", serde_json::to_string_pretty(&result)?);
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use async_nats::HeaderMap;

    #[test]
    fn entries_read_the_headers_and_filter_by_code_and_job() {
        let mut headers = HeaderMap::new();
        headers.insert(subject::HEADER_DLQ_REASON, "spec.kind names no kind");
        headers.insert(
            subject::HEADER_DLQ_SUBJECT,
            "tangram.v1.action.j7.sandbox_exec",
        );
        headers.insert(HEADER_DLQ_ACTION, "a9");
        let r = Record {
            seq: 4,
            subject: "tangram.v1.deadletter.unknown_kind".into(),
            at_us: 1_700_000_000_000_000,
            headers,
            payload: bytes::Bytes::from_static(b"{}"),
        };
        let e = entry(&r);
        assert_eq!(e.code, "unknown_kind");
        assert_eq!(e.action_id.as_deref(), Some("a9"));
        assert_eq!(e.stored_at, "2023-11-14T22:13:20Z");
        assert!(keep(&e, Some("unknown_kind"), Some("j7")));
        assert!(!keep(&e, Some("oversized"), None));
        assert!(!keep(&e, None, Some("j8")));
    }
}
