//! GPU inventory: from NVML when a driver is present, else only what the config declares.
//! This is the only module that calls NVML, behind [`GpuDiscovery`]; tests use [`FakeGpus`].
//!
//! NVLink topology becomes groups: GPUs joined by NVLink form one group (up to 8, the
//! largest chunk); a GPU without NVLink peers is a group of one. Chunks of 1, 2, 4 or 8 are
//! carved from a group, aligned to their size, by the scheduler's allocator.

use nvml_wrapper::Nvml;
use tangram_shared::GpuInventory;
use tracing::{info, warn};

/// How the worker finds its GPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum NvmlMode {
    /// Use NVML when it loads; fall back to the declared inventory.
    Auto,
    /// Never load NVML; use the declared inventory only.
    Off,
    /// Fail to start without NVML.
    Required,
}

/// Why the GPUs could not be found.
#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    /// NVML did not load or answer.
    #[error("NVML: {0}")]
    Nvml(#[from] nvml_wrapper::error::NvmlError),
    /// NVML loaded but reports no GPU.
    #[error("NVML reports no GPUs")]
    NoGpus,
    /// The config requires NVML and it is not usable.
    #[error("gpu.nvml = \"required\" but NVML is not usable")]
    Required(#[source] Box<GpuError>),
}

/// Where the worker learns what GPUs it has.
pub trait GpuDiscovery: Send + Sync + std::fmt::Debug {
    /// The GPUs the driver reports, grouped by NVLink.
    fn probe(&self) -> Result<GpuInventory, GpuError>;
}

/// GPUs from the NVIDIA driver.
#[derive(Debug, Clone, Copy, Default)]
pub struct NvmlDiscovery;

impl GpuDiscovery for NvmlDiscovery {
    fn probe(&self) -> Result<GpuInventory, GpuError> {
        from_nvml()
    }
}

/// A driver that reports a fixed inventory, or none (as on a host without NVML).
#[derive(Debug, Clone, Default)]
pub struct FakeGpus(pub Option<Vec<Vec<u32>>>);

impl GpuDiscovery for FakeGpus {
    fn probe(&self) -> Result<GpuInventory, GpuError> {
        match &self.0 {
            Some(groups) => Ok(GpuInventory {
                source: "nvml".into(),
                groups: groups.clone(),
                devices: Vec::new(),
            }),
            None => Err(GpuError::NoGpus),
        }
    }
}

/// Finds the inventory. `declared` is the config's explicit groups of GPU indices.
pub fn discover(
    driver: &dyn GpuDiscovery,
    mode: NvmlMode,
    declared: &[Vec<u32>],
) -> Result<Option<GpuInventory>, GpuError> {
    if mode != NvmlMode::Off {
        match driver.probe() {
            Ok(inv) => {
                if !declared.is_empty() && declared != inv.groups.as_slice() {
                    warn!(?declared, found = ?inv.groups, "NVML found a different GPU layout than the config declares; using NVML's");
                }
                info!(groups = ?inv.groups, devices = ?inv.devices, "GPU inventory from NVML");
                return Ok(Some(inv));
            }
            Err(e) if mode == NvmlMode::Required => return Err(GpuError::Required(Box::new(e))),
            Err(e) => info!(reason = %e, "NVML not available"),
        }
    }
    if declared.is_empty() {
        return Ok(None);
    }
    info!(groups = ?declared, "GPU inventory declared in the config (no NVML)");
    Ok(Some(GpuInventory {
        source: "declared".into(),
        groups: declared.to_vec(),
        devices: Vec::new(),
    }))
}

/// One GPU's use at one moment, as NVML reports it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GpuSample {
    /// NVML's device index.
    pub index: u32,
    /// Memory in use, bytes.
    pub mem_used_bytes: u64,
    /// Memory in all, bytes.
    pub mem_total_bytes: u64,
    /// Share of the last sample period in which a kernel ran, 0 to 1.
    pub utilization: f64,
}

/// Where the worker reads its GPUs' use, for the metrics. Only a driver can answer: a
/// declared inventory has no sampler, and nothing is made up for it.
pub trait GpuSampler: Send + Sync + std::fmt::Debug {
    /// Every GPU's use now.
    fn sample(&self) -> Result<Vec<GpuSample>, GpuError>;
}

/// NVML, loaded once and asked on each sample.
pub struct NvmlSampler(Nvml);

impl std::fmt::Debug for NvmlSampler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("NvmlSampler")
    }
}

impl NvmlSampler {
    /// Loads NVML.
    pub fn open() -> Result<Self, GpuError> {
        Ok(Self(Nvml::init()?))
    }
}

impl GpuSampler for NvmlSampler {
    fn sample(&self) -> Result<Vec<GpuSample>, GpuError> {
        let mut out = Vec::new();
        for index in 0..self.0.device_count()? {
            let d = self.0.device_by_index(index)?;
            let mem = d.memory_info()?;
            let util = d.utilization_rates()?;
            out.push(GpuSample {
                index,
                mem_used_bytes: mem.used,
                mem_total_bytes: mem.total,
                utilization: f64::from(util.gpu.min(100)) / 100.0,
            });
        }
        Ok(out)
    }
}

fn from_nvml() -> Result<GpuInventory, GpuError> {
    let nvml = Nvml::init()?;
    let count = nvml.device_count()?;
    if count == 0 {
        return Err(GpuError::NoGpus);
    }
    let mut devices = Vec::new();
    let mut peers: Vec<Vec<u32>> = vec![Vec::new(); count as usize];
    for i in 0..count {
        let d = nvml.device_by_index(i)?;
        let name = d.name().unwrap_or_else(|_| "unknown".into());
        let mem = d.memory_info().map(|m| m.total >> 20).unwrap_or(0);
        devices.push(format!("{name}, {mem} MiB"));
        let pci_i = d.pci_info().ok().map(|p| p.bus_id);
        // Each active NVLink link that leads to another GPU of this host joins them.
        for link in 0..18u32 {
            let l = d.link_wrapper_for(link);
            if !l.is_active().unwrap_or(false) {
                continue;
            }
            let Ok(remote) = l.remote_pci_info() else {
                continue;
            };
            for j in 0..count {
                if j == i {
                    continue;
                }
                let other = nvml.device_by_index(j)?.pci_info().ok().map(|p| p.bus_id);
                if other.is_some() && other == Some(remote.bus_id.clone()) && pci_i.is_some() {
                    peers[i as usize].push(j);
                }
            }
        }
    }
    Ok(GpuInventory {
        source: "nvml".into(),
        groups: groups_from_peers(&peers),
        devices,
    })
}

/// Connected components of the NVLink graph, split into aligned runs of at most 8, in index
/// order. An NVSwitch system (every GPU reaches every other) gives groups of 8.
pub fn groups_from_peers(peers: &[Vec<u32>]) -> Vec<Vec<u32>> {
    let n = peers.len();
    let mut comp = vec![usize::MAX; n];
    let mut groups: Vec<Vec<u32>> = Vec::new();
    for start in 0..n {
        if comp[start] != usize::MAX {
            continue;
        }
        let id = groups.len();
        let mut stack = vec![start];
        let mut members = Vec::new();
        comp[start] = id;
        while let Some(v) = stack.pop() {
            members.push(v as u32);
            for &p in &peers[v] {
                let p = p as usize;
                if p < n && comp[p] == usize::MAX {
                    comp[p] = id;
                    stack.push(p);
                }
            }
        }
        members.sort_unstable();
        groups.push(members);
    }
    groups
        .into_iter()
        .flat_map(|g| g.chunks(8).map(<[u32]>::to_vec).collect::<Vec<_>>())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nvlink_components_become_groups_of_at_most_eight() {
        // 0-1 linked, 2 alone, 3-4 linked.
        let peers = vec![vec![1], vec![0], vec![], vec![4], vec![3]];
        assert_eq!(
            groups_from_peers(&peers),
            vec![vec![0, 1], vec![2], vec![3, 4]]
        );
        // An NVSwitch box of 16: two groups of 8.
        let all: Vec<Vec<u32>> = (0..16)
            .map(|i| (0..16).filter(|&j| j != i).collect())
            .collect();
        assert_eq!(groups_from_peers(&all).len(), 2);
    }

    #[test]
    fn without_nvml_only_declared_gpus_are_advertised() {
        // NVML is off: nothing declared means no GPUs, never invented ones.
        let driver = FakeGpus(Some(vec![vec![0, 1, 2, 3]]));
        assert_eq!(discover(&driver, NvmlMode::Off, &[]).unwrap(), None);
        let inv = discover(&driver, NvmlMode::Off, &[vec![0, 1]])
            .unwrap()
            .unwrap();
        assert_eq!(inv.source, "declared");
        assert_eq!(inv.groups, vec![vec![0, 1]]);
    }

    #[test]
    fn nvml_wins_when_present_and_its_absence_fails_only_when_required() {
        let found = FakeGpus(Some(vec![vec![0, 1, 2, 3]]));
        let inv = discover(&found, NvmlMode::Auto, &[vec![0, 1]])
            .unwrap()
            .unwrap();
        assert_eq!(
            (inv.source.as_str(), inv.groups),
            ("nvml", vec![vec![0, 1, 2, 3]])
        );
        let none = FakeGpus(None);
        let inv = discover(&none, NvmlMode::Auto, &[vec![0]])
            .unwrap()
            .unwrap();
        assert_eq!(inv.source, "declared");
        assert!(matches!(
            discover(&none, NvmlMode::Required, &[vec![0]]),
            Err(GpuError::Required(_))
        ));
    }
}
