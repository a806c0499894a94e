//! Asking the leading scheduler for its status, every page of it: the reply lists the
//! workers a page at a time when one listing would be too large (`next_after`), and this
//! follows the pages to the end, so callers see every worker.

use std::time::Duration;
use tangram_shared::status::{Status, StatusRequest};
use tangram_shared::subject;

/// The whole status and the bytes its pages took.
#[derive(Debug)]
pub struct Fetched {
    /// Every page's workers in one report; the rest is the first page's.
    pub status: Status,
    /// Replies it took.
    pub pages: usize,
    /// Their sizes, summed.
    pub bytes: usize,
}

/// Why the status could not be read.
#[derive(Debug, thiserror::Error)]
pub enum StatusError {
    /// No answer in time (no leader, or it is busy).
    #[error("the scheduler did not answer its status within {0:?} (is it running?)")]
    Timeout(Duration),
    /// NATS refused the request (no responders: no leader yet).
    #[error("asking the scheduler for its status: {0}")]
    Request(#[source] async_nats::RequestError),
    /// The answer was not a status report.
    #[error("the status answer could not be read: {0}")]
    Decode(String),
}

/// Asks for the status, page after page, each within `per_page`.
pub async fn fetch(
    client: &async_nats::Client,
    per_page: Duration,
) -> Result<Fetched, StatusError> {
    fetch_pages(client, per_page, None).await
}

/// As [`fetch`], asking for at most `page_workers` workers a page.
pub async fn fetch_pages(
    client: &async_nats::Client,
    per_page: Duration,
    page_workers: Option<usize>,
) -> Result<Fetched, StatusError> {
    let mut req = StatusRequest {
        workers_limit: page_workers,
        ..Default::default()
    };
    let mut out: Option<Status> = None;
    let (mut pages, mut bytes) = (0, 0);
    loop {
        let body = serde_json::to_vec(&req).map_err(|e| StatusError::Decode(e.to_string()))?;
        let m = tokio::time::timeout(per_page, client.request(subject::STATUS, body.into()))
            .await
            .map_err(|_| StatusError::Timeout(per_page))?
            .map_err(StatusError::Request)?;
        pages += 1;
        bytes += m.payload.len();
        let page: Status = serde_json::from_slice(&m.payload).map_err(|e| {
            StatusError::Decode(format!("{e}: {}", String::from_utf8_lossy(&m.payload)))
        })?;
        let next = page.next_after.clone();
        match &mut out {
            None => out = Some(page),
            Some(s) => s.workers.extend(page.workers),
        }
        // A page that moves nothing on ends it (a scheduler answering without pages).
        match next {
            Some(after) if req.workers_after.as_ref() != Some(&after) => {
                req.workers_after = Some(after)
            }
            _ => break,
        }
    }
    let mut status = out.expect("one page at least");
    status.next_after = None;
    Ok(Fetched {
        status,
        pages,
        bytes,
    })
}
