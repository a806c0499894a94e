//! `tangram streams upgrade`: converts the streams of a cluster made by an earlier release
//! to the backlog/history layout, in place (see `tangram_nats::upgrade`).

use crate::connect::ClusterArgs;
use anyhow::Context as _;
use clap::{Args, Subcommand};
use std::path::PathBuf;
use std::time::Duration;
use tangram_nats::streams::StreamSettings;

/// `tangram streams ...`.
#[derive(Debug, Subcommand)]
pub(crate) enum StreamsCommand {
    /// Convert TANGRAM_ACTIONS and TANGRAM_DISPATCH made by an earlier release (limits
    /// retention: they kept history and filled up) into work queues beside TANGRAM_HISTORY,
    /// keeping their history and their unprocessed work. Stop the schedulers and workers
    /// first; NATS stays up.
    Upgrade(UpgradeArgs),
}

/// `tangram streams upgrade`'s options.
#[derive(Debug, Args)]
pub(crate) struct UpgradeArgs {
    /// The scheduler's config file, for its `[streams]` limits [default: the bundled ones].
    #[arg(long)]
    config: Option<PathBuf>,
    /// How long to wait for stopped processes' pull requests to expire, seconds.
    #[arg(long, default_value_t = 40)]
    idle_within_s: u64,
    /// Print one JSON object instead of a sentence.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    cluster: ClusterArgs,
}

/// Runs a `tangram streams` command.
pub(crate) fn run(what: StreamsCommand) -> anyhow::Result<()> {
    let StreamsCommand::Upgrade(args) = what;
    let settings = match &args.config {
        Some(path) => settings_from(path)?,
        None => StreamSettings::default(),
    };
    settings.validate().map_err(|e| anyhow::anyhow!("{e}"))?;
    let (url, creds) = args.cluster.resolve();
    let done = crate::replay::runtime()?.block_on(async {
        let client = crate::errors::connect(&url, "tangram-streams-upgrade", &creds).await?;
        let js = async_nats::jetstream::new(client);
        tangram_nats::upgrade::upgrade(&js, &settings, Duration::from_secs(args.idle_within_s))
            .await
            .map_err(anyhow::Error::from)
    })?;
    if args.json {
        println!("{}", serde_json::to_string(&done)?);
    } else if done.already_current {
        println!("the streams have the current layout already; nothing to do");
    } else {
        println!(
            "upgraded: {} messages kept in TANGRAM_HISTORY; {} unprocessed actions and {} dispatches in flight carried into the new backlog ({} actions past the ack floor were processed already)",
            done.history_messages, done.actions_carried, done.dispatches_carried, done.actions_processed
        );
    }
    Ok(())
}

/// The `[streams]` table of a scheduler config file.
fn settings_from(path: &std::path::Path) -> anyhow::Result<StreamSettings> {
    #[derive(serde::Deserialize)]
    struct File {
        #[serde(default)]
        streams: StreamSettings,
    }
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let f: File = toml::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
    Ok(f.streams)
}
