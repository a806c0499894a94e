//! What the simulator runs: a live policy, and the delays it models around one. The `k8s`
//! baseline is `static` plus each pod's start, a delay only a simulation has (a live sandbox
//! takes what its container takes), so it lives here and not among the engine's policies.

use crate::model::Policy;
use crate::policies::{Static, NAMES, REGISTRY, STATIC_CORES};

/// Policies only the simulator runs: their difference from a live policy is a modelled delay.
pub const SIM_ONLY: [&str; 1] = [K8s::NAME];

/// A policy as the simulator runs it.
pub trait Simulated {
    /// The policy the decision engine runs.
    fn policy(&self) -> Box<dyn Policy>;
    /// The name its report carries.
    fn label(&self) -> &'static str;
    /// The median time from a sandbox's placement until it can run commands, ms, for a
    /// baseline that models a pod's start; `None`: no delay beyond the engine's.
    fn pod_start_ms(&self) -> Option<f64> {
        None
    }
}

impl<P: Policy> Simulated for P {
    fn policy(&self) -> Box<dyn Policy> {
        self.boxed()
    }
    fn label(&self) -> &'static str {
        self.name()
    }
}

impl Simulated for dyn Policy {
    fn policy(&self) -> Box<dyn Policy> {
        self.boxed()
    }
    fn label(&self) -> &'static str {
        self.name()
    }
}

/// The paper's Kubernetes baseline with its pod start: [`Static`] (per-trajectory pods of
/// `cores` cores, placed on the node with the most free cores, as the default
/// `LeastAllocated` score does), and each pod starts `start_ms` (median) after it is placed
/// before its trajectory's first command can run. The simulator draws each pod's start from a
/// log-normal of that median and sigma [`K8s::START_SIGMA`]; docs/CALIBRATION.md gives the
/// sources.
#[derive(Debug, Clone, Copy)]
pub struct K8s {
    /// Cores per pod.
    pub cores: u32,
    /// Median pod start, ms.
    pub start_ms: f64,
}

impl K8s {
    /// Its name in the simulator.
    pub const NAME: &'static str = "k8s";
    /// Median pod start with the image already on the node: 1.6 s, the container creation
    /// this project measures for a hardened sandbox (1.6 to 2.2 s).
    pub const START_MS: f64 = 1_600.0;
    /// Spread of pod starts: with the median above, p99 is 5.1 s, at Kubernetes' published
    /// pod-startup SLO (p99 at most 5 s, image pulls excluded).
    pub const START_SIGMA: f64 = 0.5;
}

impl Default for K8s {
    fn default() -> Self {
        Self {
            cores: STATIC_CORES,
            start_ms: Self::START_MS,
        }
    }
}

impl Simulated for K8s {
    fn policy(&self) -> Box<dyn Policy> {
        Box::new(Static { cores: self.cores })
    }
    fn label(&self) -> &'static str {
        Self::NAME
    }
    fn pod_start_ms(&self) -> Option<f64> {
        Some(self.start_ms)
    }
}

/// What the simulator runs for `name`: a live policy ([`REGISTRY`]) or a simulator-only one
/// ([`SIM_ONLY`]), each with its defaults; `None` for any other name.
pub fn by_name(name: &str) -> Option<Box<dyn Simulated>> {
    if name == K8s::NAME {
        return Some(Box::new(K8s::default()));
    }
    let (_, make) = REGISTRY.iter().find(|(n, _)| *n == name)?;
    Some(Box::new(Live(make(STATIC_CORES))))
}

/// A boxed live policy as a [`Simulated`].
struct Live(Box<dyn Policy>);

impl Simulated for Live {
    fn policy(&self) -> Box<dyn Policy> {
        self.0.boxed()
    }
    fn label(&self) -> &'static str {
        self.0.name()
    }
}

/// Every name [`by_name`] knows: the live policies, then the simulator-only ones.
pub fn names() -> impl Iterator<Item = &'static str> {
    NAMES.iter().chain(SIM_ONLY.iter()).copied()
}
