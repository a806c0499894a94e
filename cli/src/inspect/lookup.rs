//! Reading one action's records from the retained streams (actions, dispatches, results,
//! dead letters).

use super::*;

/// Finds everything about one action.
pub async fn lookup(
    js: &async_nats::jetstream::Context,
    id: &str,
    job: Option<&str>,
) -> anyhow::Result<Story> {
    tangram_shared::ActionId::new(id).map_err(|e| anyhow::anyhow!("action id {id:?}: {e}"))?;
    let job_or_any = job.unwrap_or("*");
    let by = |filters: Vec<String>| Scan {
        filters,
        ..Default::default()
    };
    let results = streams::scan(
        js,
        subject::RESULTS_STREAM,
        &by(vec![format!(
            "{}.result.{job_or_any}.{id}",
            subject::PREFIX
        )]),
    )
    .await?;
    let dispatches = streams::scan(
        js,
        subject::HISTORY_STREAM,
        &by(vec![format!("{}.dispatch.*.{id}", subject::PREFIX)]),
    )
    .await?;
    // The action's own subject does not hold its id: match the idempotency header over the
    // job's subjects (headers only), then fetch the one message.
    let job = job
        .map(str::to_string)
        .or_else(|| {
            results
                .first()
                .and_then(|r| job_token(&r.subject))
                .map(str::to_string)
        })
        .or_else(|| {
            dispatches
                .first()
                .and_then(|r| r.decode::<Dispatch>().ok())
                .map(|d| d.action.job.to_string())
        });
    let headers = streams::scan(
        js,
        subject::HISTORY_STREAM,
        &Scan {
            filters: vec![format!(
                "{}.action.{}.>",
                subject::PREFIX,
                job.as_deref().unwrap_or("*")
            )],
            headers_only: true,
            ..Default::default()
        },
    )
    .await?;
    let action = match headers
        .iter()
        .find(|r| r.header(subject::HEADER_MSG_ID) == Some(id))
    {
        Some(h) => Some(
            streams::get(js, subject::HISTORY_STREAM, h.seq)
                .await
                .context("fetching the action")?,
        ),
        None => None,
    };
    let deadletters: Vec<Record> = streams::scan(
        js,
        subject::DEADLETTER_STREAM,
        &Scan {
            headers_only: true,
            ..Default::default()
        },
    )
    .await?
    .into_iter()
    .filter(|r| {
        r.header(HEADER_DLQ_ACTION) == Some(id) || r.header(subject::HEADER_MSG_ID) == Some(id)
    })
    .collect();
    Ok(build(
        id,
        action.as_ref(),
        &dispatches,
        &results,
        &deadletters,
    ))
}
