//! The reference policy (`tangram`, after ARL-Tangram) and the baselines it is compared with,
//! all behind [`Policy`], all selectable by name from one registry ([`REGISTRY`]).
//!
//! Files: `select.rs` (the FCFS selection and reasons every policy shares), `tangram.rs`,
//! `v2.rs` (`tangram-v2`), `baselines.rs`, `fcfs.rs`. The simulator-only `k8s` lives in the
//! simulator (`sim/k8s.rs`).

mod baselines;
mod fcfs;
mod select;
mod tangram;
pub mod v2;

pub use baselines::{EqualSplit, FixedDop, KubeFirstFit, PerTask, Static};
pub use fcfs::FcfsFirstFit;
pub use tangram::Tangram;
pub use v2::TangramV2;

use crate::model::Policy;

/// The cores a trajectory's sandbox holds under `static` unless configured otherwise (the
/// paper's 4).
pub const STATIC_CORES: u32 = 4;

/// How a registered policy is made, given the cores a trajectory holds under `static`.
type Make = fn(u32) -> Box<dyn Policy>;

/// Every live policy, by name, in the order the simulator lists them: the one place a name
/// is tied to what it makes (each name is its type's `NAME`, which its `Policy::name` returns).
pub const REGISTRY: [(&str, Make); 11] = [
    (Tangram::NAME, |_| Box::new(Tangram::default())),
    (TangramV2::NAME, |_| Box::new(TangramV2::default())),
    (Static::NAME, |cores| Box::new(Static { cores })),
    (PerTask::NAME, |_| Box::new(PerTask { dop: 4 })),
    (FixedDop::FIFO_1.name(), |_| Box::new(FixedDop::FIFO_1)),
    (FixedDop::FIFO_4.name(), |_| Box::new(FixedDop::FIFO_4)),
    (FixedDop::FIFO_16.name(), |_| Box::new(FixedDop::FIFO_16)),
    (KubeFirstFit::NAME, |_| Box::new(KubeFirstFit)),
    (FixedDop::SJF.name(), |_| Box::new(FixedDop::SJF)),
    (EqualSplit::NAME, |_| Box::new(EqualSplit)),
    (FcfsFirstFit::NAME, |_| Box::new(FcfsFirstFit)),
];

/// Every policy name, in the registry's order.
pub const NAMES: [&str; REGISTRY.len()] = {
    let mut names = [""; REGISTRY.len()];
    let mut i = 0;
    while i < REGISTRY.len() {
        names[i] = REGISTRY[i].0;
        i += 1;
    }
    names
};

/// A policy name that names none of [`NAMES`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownPolicy(pub String);

impl std::fmt::Display for UnknownPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "unknown policy {:?}; choose one of {}",
            self.0,
            NAMES.join(", ")
        )
    }
}

impl std::error::Error for UnknownPolicy {}

/// The policy an engine runs for `name`, `static` with `static_cores` a trajectory. An
/// unknown name is an error, never another policy.
pub fn configured(name: &str, static_cores: u32) -> Result<Box<dyn Policy>, UnknownPolicy> {
    REGISTRY
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, make)| make(static_cores))
        .ok_or_else(|| UnknownPolicy(name.to_string()))
}

/// The policy called `name`, with its defaults; `None` for a name not in [`REGISTRY`].
pub fn by_name(name: &str) -> Option<Box<dyn Policy>> {
    configured(name, STATIC_CORES).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_registered_policy_answers_to_its_registered_name() {
        for (name, make) in REGISTRY {
            assert_eq!(make(STATIC_CORES).name(), name);
        }
        let mut unique = NAMES.to_vec();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), NAMES.len(), "a name registered twice");
    }
}
