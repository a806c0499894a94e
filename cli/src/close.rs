//! `tangram close --job J`: asks the leading scheduler to close every sandbox of a job (a
//! crashed rollout's, say). The scheduler submits a `sandbox_close` for each, whose result
//! reaches the job's results subject with `reason: job_closed`.

use crate::connect::ClusterArgs;
use clap::Args;
use std::time::Duration;
use tangram_shared::status::CloseJobReply;
use tangram_shared::{subject, JobId};

/// `tangram close`'s options.
#[derive(Debug, Args)]
pub(crate) struct CloseArgs {
    /// The job whose sandboxes to close.
    #[arg(long)]
    job: String,
    #[command(flatten)]
    cluster: ClusterArgs,
}

/// `tangram close --job J`.
pub(crate) fn close(a: CloseArgs) -> anyhow::Result<()> {
    let job = JobId::new(a.job.clone()).map_err(|e| anyhow::anyhow!("job {:?}: {e}", a.job))?;
    let (url, creds) = a.cluster.resolve();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let reply = rt.block_on(async {
        let client = crate::errors::connect(&url, "tangram-cli", &creds).await?;
        let ask = client.request(subject::close_job(&job), Vec::new().into());
        match tokio::time::timeout(Duration::from_secs(10), ask).await {
            Ok(Ok(m)) => Ok(m.payload),
            Ok(Err(e)) => Err(anyhow::anyhow!(
                "asking the scheduler at {url} to close job {job}'s sandboxes: {e} (is a scheduler leading?)"
            )),
            Err(_) => Err(anyhow::anyhow!(
                "no scheduler at {url} answered within 10 s (is one leading?)"
            )),
        }
    })?;
    let reply: CloseJobReply = serde_json::from_slice(&reply).map_err(|e| {
        anyhow::anyhow!(
            "the scheduler's answer did not read ({e}): {}",
            String::from_utf8_lossy(&reply)
        )
    })?;
    println!(
        "closing {} sandbox{} of job {job}; each close's result reaches the job's results subject with reason job_closed",
        reply.closing,
        if reply.closing == 1 { "" } else { "es" }
    );
    Ok(())
}
