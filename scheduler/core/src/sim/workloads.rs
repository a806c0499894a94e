//! The simulator's workloads by name: the one list `tangram simulate --workload` takes.

/// A workload generator the simulator has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkloadName {
    /// Agentic coding: closed-loop trajectories of sandbox commands ([`super::AiCoding`]).
    AiCoding,
    /// Every resource kind at once, in waves, with heavy tails ([`super::Bursty`]).
    Bursty,
    /// Multi-teacher on-policy distillation on GPU services ([`super::gpu::Mopd`]).
    Mopd,
    /// Deep search: api calls under one provider's rate ([`super::api::DeepSearch`]).
    DeepSearch,
    /// Software-engineering tasks, each with its own image ([`super::SweImages`]).
    SweImages,
    /// Jobs sharing one fleet, by weight, one of them flooding ([`super::fairness`]).
    Fairness,
}

/// Every workload, by the name it is selected with.
pub const WORKLOADS: [(&str, WorkloadName); 6] = [
    ("ai-coding", WorkloadName::AiCoding),
    ("bursty", WorkloadName::Bursty),
    ("mopd", WorkloadName::Mopd),
    ("deepsearch", WorkloadName::DeepSearch),
    ("swe-images", WorkloadName::SweImages),
    ("fairness", WorkloadName::Fairness),
];

/// A workload name that names none of [`WORKLOADS`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownWorkload(pub String);

impl std::fmt::Display for UnknownWorkload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = WORKLOADS.iter().map(|(n, _)| *n).collect();
        write!(
            f,
            "unknown workload {:?}; available: {}",
            self.0,
            names.join(", ")
        )
    }
}

impl std::error::Error for UnknownWorkload {}

impl WorkloadName {
    /// The workload called `name`.
    pub fn parse(name: &str) -> Result<Self, UnknownWorkload> {
        WORKLOADS
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, w)| *w)
            .ok_or_else(|| UnknownWorkload(name.to_string()))
    }

    /// Its name.
    pub fn as_str(self) -> &'static str {
        WORKLOADS
            .iter()
            .find(|(_, w)| *w == self)
            .map(|(n, _)| *n)
            .expect("every workload is listed")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_workload_parses_back_from_its_name_and_others_are_refused() {
        for (name, w) in WORKLOADS {
            assert_eq!(WorkloadName::parse(name), Ok(w));
            assert_eq!(w.as_str(), name);
        }
        let err = WorkloadName::parse("coding").unwrap_err();
        assert!(err.to_string().contains("ai-coding, bursty"), "{err}");
    }
}
