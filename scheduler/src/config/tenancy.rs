//! The scheduler's tenancy settings as written: caps per job (`[job_caps.<job>]`) and the
//! fleet's provider definitions (`[[provider]]`), and their validation.

use super::raw::invalid;
use super::ConfigError;
use serde::Deserialize;
use std::collections::BTreeMap;
use tangram_core::engine::JobCaps;
use tangram_core::quota::ProviderQuota;

/// Checks the caps per job and turns them into the engine's.
pub(super) fn job_caps(
    raw: BTreeMap<String, RawJobCaps>,
) -> Result<BTreeMap<String, JobCaps>, ConfigError> {
    let mut job_caps = BTreeMap::new();
    for (job, c) in raw {
        if job != tangram_core::engine::EVERY_JOB
            && tangram_shared::JobId::new(job.clone()).is_err()
        {
            return Err(invalid(
                "job_caps",
                format!("{job:?} is neither a job id nor \"*\" (every job not listed)"),
            ));
        }
        let zero = c.max_sandboxes == Some(0)
            || c.max_sandbox_mem_mb == Some(0)
            || c.max_cores == Some(0)
            || c.max_queued == Some(0)
            || c.max_gpu_calls == Some(0);
        if zero {
            return Err(invalid(
                "job_caps",
                format!("{job}: a cap of 0 would stop the job; leave the cap out for none"),
            ));
        }
        job_caps.insert(
            job,
            JobCaps {
                max_sandboxes: c.max_sandboxes,
                max_sandbox_mem_mb: c.max_sandbox_mem_mb,
                max_cores: c.max_cores,
                max_queued: c.max_queued,
                max_gpu_calls: c.max_gpu_calls,
            },
        );
    }
    Ok(job_caps)
}

/// The queued actions and bytes one job may hold: as written, else a quarter of the whole
/// (so that one job's backlog leaves room for others'); at least 1 and at most the whole.
pub(super) fn queued_per_job(
    count: Option<u64>,
    bytes: Option<u64>,
    max_count: u64,
    max_bytes: u64,
) -> Result<(u32, u64), ConfigError> {
    let count = count.unwrap_or((max_count / 4).max(1));
    if !(1..=max_count).contains(&count) {
        return Err(invalid(
            "max_queued_per_job",
            format!("{count} is outside 1 to max_queued_actions ({max_count})"),
        ));
    }
    let bytes = bytes.unwrap_or((max_bytes / 4).max(8 << 20));
    if !(8 << 20..=max_bytes).contains(&bytes) {
        return Err(invalid(
            "max_queued_bytes_per_job",
            format!("{bytes} is outside 8 MiB (one action may be that large) to max_queued_bytes ({max_bytes})"),
        ));
    }
    Ok((u32::try_from(count).unwrap_or(u32::MAX), bytes))
}

/// Checks the provider definitions and turns them into the engine's quotas.
pub(super) fn providers(
    raw: Vec<RawProvider>,
) -> Result<BTreeMap<String, ProviderQuota>, ConfigError> {
    let mut providers = BTreeMap::new();
    for p in raw {
        if !(p.rate_per_s > 0.0 && p.rate_per_s.is_finite()) || p.burst == 0 || p.concurrency == 0 {
            return Err(invalid(
                "provider",
                format!(
                    "{}: rate_per_s must be above 0, burst and concurrency at least 1",
                    p.name
                ),
            ));
        }
        let quota = ProviderQuota {
            name: p.name.clone(),
            rate_per_s: p.rate_per_s,
            burst: p.burst,
            concurrency: p.concurrency,
            slow_ms: p.slow_ms,
        };
        if providers.insert(p.name.clone(), quota).is_some() {
            return Err(invalid("provider", format!("{} is defined twice", p.name)));
        }
    }
    Ok(providers)
}

/// Checks the GPU service definitions and turns them into the engine's specs.
pub(super) fn services(
    raw: Vec<RawService>,
) -> Result<BTreeMap<String, tangram_core::gpu::ServiceSpec>, ConfigError> {
    let mut services = BTreeMap::new();
    for s in raw {
        if s.name.is_empty() || s.name.len() > 128 {
            return Err(invalid(
                "service",
                "a service's name has 1 to 128 characters, as on a worker",
            ));
        }
        if !tangram_shared::CHUNK_SIZES.contains(&s.gpus) || s.slots == 0 {
            return Err(invalid(
                "service",
                format!("{}: gpus must be 1, 2, 4 or 8 and slots at least 1", s.name),
            ));
        }
        let spec = tangram_core::gpu::ServiceSpec {
            name: s.name.clone(),
            gpus: s.gpus,
            restore_ms: s.restore_ms,
            slots: s.slots,
        };
        if services.insert(s.name.clone(), spec).is_some() {
            return Err(invalid("service", format!("{} is defined twice", s.name)));
        }
    }
    Ok(services)
}

/// The fleet's definition of a GPU service's size and slots, as written (`[[service]]`): the
/// same fields, and defaults, as a worker's `[[service]]` has for them.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawService {
    /// Its name.
    pub name: String,
    /// GPUs per replica: 1, 2, 4 or 8.
    #[serde(default = "one_gpu")]
    pub gpus: u8,
    /// Requests one replica serves at once.
    #[serde(default = "eight")]
    pub slots: u32,
    /// The first estimate of a restore, ms.
    #[serde(default = "five_hundred")]
    pub restore_ms: u64,
}

fn one_gpu() -> u8 {
    1
}

fn eight() -> u32 {
    8
}

fn five_hundred() -> u64 {
    500
}

/// One job's caps as written (`[job_caps.<job>]`); absent fields are no cap.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawJobCaps {
    /// Sandboxes open or opening at once.
    pub max_sandboxes: Option<u32>,
    /// Memory of those sandboxes, MiB.
    pub max_sandbox_mem_mb: Option<u64>,
    /// Cores its commands hold at once.
    pub max_cores: Option<u32>,
    /// Actions queued at the scheduler (else the fleet's `max_queued_per_job`).
    pub max_queued: Option<u32>,
    /// Reward calls running at once.
    pub max_gpu_calls: Option<u32>,
}

/// The fleet's definition of an external API provider's quota, as written (`[[provider]]`):
/// the same fields, and defaults, as a worker's `[[provider]]`.
#[derive(Debug, Clone, PartialEq, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawProvider {
    /// Its name.
    pub name: String,
    /// Requests per second for the whole fleet.
    pub rate_per_s: f64,
    /// Burst, requests.
    #[serde(default = "one")]
    pub burst: u32,
    /// Requests in flight at most, fleet-wide.
    #[serde(default = "sixteen")]
    pub concurrency: u32,
    /// Replies slower than this count as overload, ms.
    #[serde(default)]
    pub slow_ms: Option<u64>,
}

fn one() -> u32 {
    1
}

fn sixteen() -> u32 {
    16
}
