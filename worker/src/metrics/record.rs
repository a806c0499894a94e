//! Recording: one function per event, each writing the names of the table in `metrics.rs`.

use super::*;
use metrics::{counter, gauge, histogram};

pub(crate) fn action(kind: &'static str, outcome: &'static str, overhead_s: f64, exec_s: f64) {
    counter!(ACTIONS, "kind" => kind, "outcome" => outcome).increment(1);
    histogram!(OVERHEAD_SECONDS, "kind" => kind).record(overhead_s);
    // An open or a close executes nothing: its time is all overhead.
    if kind != "sandbox_open" && kind != "sandbox_close" {
        histogram!(EXEC_SECONDS, "kind" => kind).record(exec_s);
    }
}
pub(crate) fn dispatch_redelivered() {
    counter!(DISPATCH_REDELIVERIES).increment(1);
}
pub(crate) fn grant(mode: &'static str, direction: &'static str, seconds: f64) {
    histogram!(GRANT_SECONDS, "mode" => mode, "direction" => direction).record(seconds);
}
pub(crate) fn sandboxes(n: usize) {
    gauge!(SANDBOXES).set(n as f64);
}
pub(crate) fn leftovers(n: usize) {
    counter!(LEFTOVERS).increment(n as u64);
}
pub(crate) fn fenced() {
    counter!(FENCED).increment(1);
}
pub(crate) fn fenced_result() {
    counter!(FENCED_RESULTS).increment(1);
}
pub(crate) fn result_retry() {
    counter!(RESULT_RETRIES).increment(1);
}
pub(crate) fn regrant(direction: &'static str) {
    counter!(REGRANTS, "direction" => direction).increment(1);
}
/// An exec that waited for its cores: `granted` or `timed_out`.
pub(crate) fn core_wait(result: &'static str) {
    counter!(CORE_WAITS, "result" => result).increment(1);
}
/// An image pull: how it ended (`ok`, `refused`, `failed`) and, when it went through, how
/// long it took (µs).
pub(crate) fn image_pull(outcome: &'static str, took_us: Option<u64>) {
    if let Some(us) = took_us {
        histogram!(IMAGE_PULL_SECONDS).record(us as f64 / 1e6);
    }
    counter!(IMAGE_PULLS, "outcome" => outcome).increment(1);
}
pub(crate) fn warm_claim(hit: bool) {
    counter!(WARM_CLAIMS, "result" => if hit { "hit" } else { "miss" }).increment(1);
}
pub(crate) fn warm_pool(ready: u32, mem_mb: u64) {
    gauge!(WARM_READY).set(ready as f64);
    gauge!(WARM_MEMORY).set((mem_mb << 20) as f64);
}
pub(crate) fn refused(reason: &'static str) {
    counter!(REFUSED, "reason" => reason).increment(1);
}
pub(crate) fn replica_started(service: &str) {
    counter!(REPLICAS_STARTED, "service" => service.to_string()).increment(1);
}
pub(crate) fn replica_crashed(service: &str) {
    counter!(REPLICAS_CRASHED, "service" => service.to_string()).increment(1);
}
pub(crate) fn eviction(service: &str) {
    counter!(EVICTIONS, "service" => service.to_string()).increment(1);
}
pub(crate) fn restore(service: &str, seconds: f64) {
    histogram!(RESTORE_SECONDS, "service" => service.to_string()).record(seconds);
}
pub(crate) fn api_call(provider: &str, status: u16, seconds: f64) {
    let class = match status {
        429 => "429",
        200..=299 => "2xx",
        300..=399 => "3xx",
        400..=499 => "4xx",
        _ => "5xx",
    };
    counter!(API_CALLS, "provider" => provider.to_string(), "status" => class).increment(1);
    histogram!(API_SECONDS, "provider" => provider.to_string()).record(seconds);
}

/// The GPUs this worker offers: their count by source, once at start.
pub(crate) fn gpu_inventory(inventory: Option<&tangram_shared::GpuInventory>) {
    if let Some(inv) = inventory {
        let n: usize = inv.groups.iter().map(Vec::len).sum();
        gauge!(GPUS, "source" => inv.source.clone()).set(n as f64);
    }
}

/// One NVML reading of every GPU.
pub(crate) fn gpu_samples(samples: &[crate::gpu::GpuSample]) {
    for s in samples {
        let gpu = s.index.to_string();
        gauge!(GPU_MEM_USED, "gpu" => gpu.clone()).set(s.mem_used_bytes as f64);
        gauge!(GPU_MEM_TOTAL, "gpu" => gpu.clone()).set(s.mem_total_bytes as f64);
        gauge!(GPU_UTIL, "gpu" => gpu).set(s.utilization);
    }
}
