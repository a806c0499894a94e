//! The leader lease: one scheduler leads, the others wait as standbys.
//!
//! The lease is one key (`leader`) in the scheduler's KV bucket, written only by
//! compare-and-set on its revision. The leader renews it every `ttl / 4`; a standby that has
//! seen the same revision for a whole `ttl` (by its own clock, so clocks need not agree)
//! takes it over with a compare-and-set on that revision: of several standbys exactly one
//! wins. The new leader then bumps the epoch, and workers refuse dispatches of older epochs,
//! which fences a leader that was paused rather than dead.
//!
//! A leader fences itself too: it publishes a dispatch only while its last successful
//! renewal is younger than `ttl / 2` ([`Fence`]), and it steps down when a renewal finds
//! the revision moved (someone else leads) or when no renewal succeeded for that long.

use async_nats::jetstream::kv::{self, Operation, UpdateErrorKind};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tangram_shared::status::{LeaderRecord, StandbyRecord};
use tangram_shared::subject;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// What a standby sees under the lease key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seen {
    /// No lease: never written, or deleted by a leader that stopped cleanly.
    Vacant,
    /// A lease at this revision, held by this id.
    Held { revision: u64, holder: String },
}

/// What a standby should do next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Move {
    /// Write the lease as a new key.
    Create,
    /// Overwrite the lease at this revision.
    TakeOver(u64),
    /// Look again later.
    Wait,
}

/// A standby's memory of the lease: which revision it saw and since when. Pure; time is an
/// argument (milliseconds on a monotonic clock).
#[derive(Debug, Default)]
pub struct Watcher {
    seen: Option<(u64, u64)>,
}

impl Watcher {
    /// Decides, from the lease as seen at `now_ms`, whether to try for it. `me` is this
    /// process's [`holder`] string.
    pub fn observe(&mut self, seen: &Seen, me: &str, now_ms: u64, ttl_ms: u64) -> Move {
        match seen {
            Seen::Vacant => Move::Create,
            // Ours from an earlier term of this process: nobody took it since.
            Seen::Held { revision, holder } if holder == me => Move::TakeOver(*revision),
            Seen::Held { revision, .. } => match self.seen {
                Some((rev, since)) if rev == *revision => {
                    if now_ms.saturating_sub(since) >= ttl_ms {
                        Move::TakeOver(*revision)
                    } else {
                        Move::Wait
                    }
                }
                _ => {
                    self.seen = Some((*revision, now_ms));
                    Move::Wait
                }
            },
        }
    }
}

/// Whether this process may still act as leader: true while its last renewal is younger
/// than the margin. Shared with the dispatcher, which checks it before every publish.
#[derive(Debug)]
pub struct Fence {
    base: Instant,
    valid_until_ms: AtomicU64,
    margin: Duration,
    renewals: AtomicU64,
}

impl Fence {
    /// A fence valid for `margin` from `at` (when the lease was won).
    pub fn since(margin: Duration, at: Instant) -> Arc<Self> {
        let f = Arc::new(Self {
            base: at,
            valid_until_ms: AtomicU64::new(0),
            margin,
            renewals: AtomicU64::new(0),
        });
        f.renewed_at(0);
        f
    }

    /// A renewal sent at `sent_ms` (from [`Fence::mark`]) succeeded. The margin counts from
    /// the sending: the server stored the renewal after that, so a standby cannot have seen
    /// the lease unrenewed for its whole TTL before `sent_ms + TTL`, however late the answer
    /// came back. The margin being under the TTL keeps this leader fenced before then.
    pub fn renewed_at(&self, sent_ms: u64) {
        let until = sent_ms + self.margin.as_millis() as u64;
        self.valid_until_ms.fetch_max(until, Ordering::AcqRel);
        self.renewals.fetch_add(1, Ordering::Release);
    }

    /// Now, on the fence's clock (milliseconds since the lease was won), for
    /// [`Fence::renewed_at`].
    pub fn mark(&self) -> u64 {
        self.base.elapsed().as_millis() as u64
    }

    /// How long it holds after a renewal is sent.
    pub fn margin(&self) -> Duration {
        self.margin
    }

    /// How many renewals have succeeded: each is a round trip to NATS that worked.
    pub fn renewals(&self) -> u64 {
        self.renewals.load(Ordering::Acquire)
    }

    /// Whether the lease is surely still ours.
    pub fn holds(&self) -> bool {
        self.mark() < self.valid_until_ms.load(Ordering::Acquire)
    }

    /// Ends it now (stepping down).
    pub fn revoke(&self) {
        self.valid_until_ms.store(0, Ordering::Release);
    }
}

/// Lease timing and identity.
#[derive(Debug, Clone)]
pub struct LeaseConfig {
    /// This scheduler's id.
    pub id: String,
    /// How long a lease holds without renewal.
    pub ttl: Duration,
}

impl LeaseConfig {
    fn renew_every(&self) -> Duration {
        self.ttl / 4
    }
    fn poll_every(&self) -> Duration {
        (self.ttl / 10).max(Duration::from_millis(50))
    }
}

/// A won lease.
pub struct Held {
    pub store: kv::Store,
    pub record: LeaderRecord,
    pub revision: u64,
    /// When the write that won it was sent: the term's fence counts from here.
    pub taken_at: Instant,
}

/// Wall-clock Unix milliseconds, for records people read.
#[allow(clippy::disallowed_methods)] // wall time is what the record shows people
pub fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Who holds a lease: id, host and process, so that a second process configured with the
/// same id is not mistaken for this one.
pub fn holder(r: &LeaderRecord) -> String {
    format!("{}@{}:{}", r.id, r.host, r.pid)
}

/// The host name, for records people read.
pub fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}

fn seen_from(entry: Option<kv::Entry>) -> Seen {
    match entry {
        Some(e) if e.operation == Operation::Put => {
            let holder = serde_json::from_slice::<LeaderRecord>(&e.value)
                .map(|r| holder(&r))
                .unwrap_or_default();
            Seen::Held {
                revision: e.revision,
                holder,
            }
        }
        _ => Seen::Vacant,
    }
}

/// Waits as a standby until this scheduler holds the lease (announcing itself under
/// `standby.<id>` meanwhile), or `stop` is cancelled (None).
pub async fn campaign(
    store: &kv::Store,
    config: &LeaseConfig,
    stop: &CancellationToken,
) -> Option<Held> {
    let base = Instant::now();
    let mut watcher = Watcher::default();
    let standby_key = format!("{}{}", subject::STANDBY_PREFIX, config.id);
    let mut announced_at: Option<Instant> = None;
    let mut waiting_logged = false;
    let mut record = LeaderRecord {
        id: config.id.clone(),
        pid: std::process::id(),
        host: host_name(),
        epoch: 0,
        since_unix_ms: 0,
        renewed_unix_ms: 0,
        ttl_ms: config.ttl.as_millis() as u64,
    };
    loop {
        let seen = match store.entry(subject::LEADER_KEY).await {
            Ok(e) => Some(seen_from(e)),
            Err(e) => {
                warn!(error = %e, "reading the leader lease");
                None
            }
        };
        if let Some(seen) = seen {
            let now_ms = base.elapsed().as_millis() as u64;
            let me = holder(&record);
            let mv = watcher.observe(&seen, &me, now_ms, config.ttl.as_millis() as u64);
            if mv != Move::Wait {
                let sent = Instant::now();
                record.since_unix_ms = unix_ms();
                record.renewed_unix_ms = record.since_unix_ms;
                let body = serde_json::to_vec(&record).expect("a record serialises");
                let won = match mv {
                    Move::Create => store.create(subject::LEADER_KEY, body.into()).await.ok(),
                    Move::TakeOver(rev) => store
                        .update(subject::LEADER_KEY, body.into(), rev)
                        .await
                        .ok(),
                    Move::Wait => None,
                };
                if let Some(revision) = won {
                    if announced_at.is_some() {
                        let _ = store.delete(&standby_key).await;
                    }
                    if let Seen::Held { holder, .. } = &seen {
                        if holder != &me {
                            info!(previous = %holder, "took over the leader lease");
                        }
                    }
                    return Some(Held {
                        store: store.clone(),
                        record,
                        revision,
                        taken_at: sent,
                    });
                }
            } else if !waiting_logged {
                if let Seen::Held { holder, .. } = &seen {
                    info!(leader = %holder, "standing by: another scheduler leads");
                    waiting_logged = true;
                }
            }
            if announced_at.is_none_or(|t| t.elapsed() >= Duration::from_secs(1)) {
                let me = StandbyRecord {
                    id: config.id.clone(),
                    pid: record.pid,
                    host: record.host.clone(),
                    seen_unix_ms: unix_ms(),
                };
                let body = serde_json::to_vec(&me).expect("a record serialises");
                if let Err(e) = store.put(&standby_key, body.into()).await {
                    warn!(error = %e, "announcing this standby");
                }
                announced_at = Some(Instant::now());
            }
        }
        tokio::select! {
            _ = stop.cancelled() => {
                if announced_at.is_some() {
                    let _ = store.delete(&standby_key).await;
                }
                return None;
            }
            _ = tokio::time::sleep(config.poll_every()) => {}
        }
    }
}

/// Gives the lease up at once (a term that could not start), so that a standby need not
/// wait it out.
pub async fn release(held: Held) {
    if let Err(e) = held
        .store
        .delete_expect_revision(subject::LEADER_KEY, Some(held.revision))
        .await
    {
        warn!(error = %e, "releasing the leader lease");
    }
}

/// Keeps the lease renewed until `stop` (a clean stop: the lease is deleted so a standby
/// takes over at once) or until it is lost (`lost` is cancelled and the fence revoked).
pub async fn hold(
    mut held: Held,
    config: LeaseConfig,
    fence: Arc<Fence>,
    lost: CancellationToken,
    stop: CancellationToken,
) {
    let mut tick = tokio::time::interval(config.renew_every());
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The first tick is at once: the record gains its epoch without waiting a period.
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tick.tick() => {}
        }
        if !fence.holds() {
            // No renewal for the whole margin (a pause, or NATS unreachable): the lease may
            // be someone else's by now.
            warn!("leader lease not renewed in time; stepping down");
            fence.revoke();
            lost.cancel();
            return;
        }
        held.record.renewed_unix_ms = unix_ms();
        let body = serde_json::to_vec(&held.record).expect("a record serialises");
        // A slow answer still counts while the fence holds: on a loaded server a renewal
        // that took longer than the renewal period was abandoned, and two in a row ended
        // the term (regression: at 500 workers the leadership changed every few seconds).
        let sent = fence.mark();
        let renewal = tokio::time::timeout(
            fence.margin(),
            held.store
                .update(subject::LEADER_KEY, body.into(), held.revision),
        )
        .await;
        match renewal {
            Ok(Ok(revision)) => {
                held.revision = revision;
                fence.renewed_at(sent);
            }
            Ok(Err(e)) if e.kind() == UpdateErrorKind::WrongLastRevision => {
                // A renewal that timed out here may have gone through on the server after
                // all, moving the revision on: the record then is still ours, and the term
                // goes on (regression: on a loaded server every such renewal ended the
                // term, and the leadership passed back and forth every few seconds).
                if let Some(revision) = still_ours(&held, config.renew_every()).await {
                    warn!("a renewal that timed out went through; the lease is still ours");
                    held.revision = revision;
                    continue;
                }
                warn!("another scheduler took the leader lease; stepping down");
                fence.revoke();
                lost.cancel();
                return;
            }
            Ok(Err(e)) => warn!(error = %e, "renewing the leader lease"),
            Err(_) => warn!("renewing the leader lease timed out"),
        }
    }
    fence.revoke();
    // Handing over: a standby need not wait out the lease.
    if let Err(e) = held
        .store
        .delete_expect_revision(subject::LEADER_KEY, Some(held.revision))
        .await
    {
        warn!(error = %e, "releasing the leader lease");
    }
}

/// The lease's revision when the stored record is this very term's (same holder, same
/// epoch); `None` when it is another's, gone, or could not be read in time.
async fn still_ours(held: &Held, within: Duration) -> Option<u64> {
    let entry = tokio::time::timeout(within, held.store.entry(subject::LEADER_KEY))
        .await
        .ok()?
        .ok()??;
    if entry.operation != Operation::Put {
        return None;
    }
    let record: LeaderRecord = serde_json::from_slice(&entry.value).ok()?;
    let ours = holder(&record) == holder(&held.record) && record.epoch == held.record.epoch;
    ours.then_some(entry.revision)
}

#[cfg(test)]
mod tests;
