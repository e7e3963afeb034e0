//! What a pod requires of its GPUs beyond their number: how they are linked, which models,
//! how much memory each. Read from pod annotations by the scheduler; met by `core` in the
//! scheduler, the simulator and every other placement path alike.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// How the GPUs of one container must (or should) be connected.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum GpuTopology {
    /// No constraint.
    #[default]
    Any,
    /// Every pair of the container's GPUs linked by at least one NVLink.
    Nvlink,
    /// Every pair behind one PCIe switch (or on one board).
    PcieSwitch,
    /// Every GPU on one NUMA node.
    Numa,
}

impl GpuTopology {
    pub const VALUES: [&'static str; 4] = ["any", "nvlink", "pcie-switch", "numa"];

    pub fn name(self) -> &'static str {
        match self {
            GpuTopology::Any => "any",
            GpuTopology::Nvlink => "nvlink",
            GpuTopology::PcieSwitch => "pcie-switch",
            GpuTopology::Numa => "numa",
        }
    }

    /// How the phrase "`k` GPUs ..." ends in explanations.
    pub fn phrase(self) -> &'static str {
        match self {
            GpuTopology::Any => "free",
            GpuTopology::Nvlink => "linked by NVLink",
            GpuTopology::PcieSwitch => "behind one PCIe switch",
            GpuTopology::Numa => "on one NUMA node",
        }
    }
}

impl fmt::Display for GpuTopology {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A topology value that is not known.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("unknown value {0:?}; expected one of any, nvlink, pcie-switch, numa")]
pub struct UnknownTopology(pub String);

impl FromStr for GpuTopology {
    type Err = UnknownTopology;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "" | "any" => Ok(GpuTopology::Any),
            "nvlink" => Ok(GpuTopology::Nvlink),
            "pcie-switch" | "pcie" | "pix" => Ok(GpuTopology::PcieSwitch),
            "numa" => Ok(GpuTopology::Numa),
            _ => Err(UnknownTopology(s.to_string())),
        }
    }
}

/// Requirements on every GPU of a pod's GPU containers.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct GpuNeed {
    /// Required: a node that cannot offer such a set is not a candidate.
    #[serde(default)]
    pub topology: GpuTopology,
    /// Preferred: nodes that can offer such a set score higher; others remain candidates.
    #[serde(default)]
    pub prefer: GpuTopology,
    /// Model patterns allowed (case-insensitive substrings of the GPU model, as HAMi's
    /// `use-gputype`); empty: any.
    #[serde(default)]
    pub models: Vec<String>,
    /// Model patterns refused (case-insensitive substrings).
    #[serde(default)]
    pub exclude_models: Vec<String>,
    /// Memory every GPU must have, MiB; 0: any.
    #[serde(default)]
    pub min_memory_mib: u64,
}

/// A contradiction inside one pod's requirements.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum NeedError {
    #[error("model {0:?} is both allowed and excluded")]
    ModelBothWays(String),
}

/// Whether `pattern` occurs in `model`, ASCII case ignored (no allocation: fit checks call
/// it once per node class and decision).
fn contains_ci(model: &str, pattern: &str) -> bool {
    let (m, p) = (model.as_bytes(), pattern.as_bytes());
    p.is_empty() || m.windows(p.len()).any(|w| w.eq_ignore_ascii_case(p))
}

impl GpuNeed {
    /// True when nothing is asked.
    pub fn is_empty(&self) -> bool {
        *self == GpuNeed::default()
    }

    /// Whether GPUs of `model` may be used.
    pub fn allows_model(&self, model: &str) -> bool {
        (self.models.is_empty() || self.models.iter().any(|p| contains_ci(model, p)))
            && !self.exclude_models.iter().any(|p| contains_ci(model, p))
    }

    /// Whether a GPU with `memory_mib` is large enough (unknown memory, 0, never is when a
    /// minimum is asked).
    pub fn allows_memory(&self, memory_mib: u64) -> bool {
        memory_mib >= self.min_memory_mib
    }

    /// Contradictions a pod cannot be placed with anywhere.
    pub fn validate(&self) -> Result<(), NeedError> {
        for m in &self.models {
            if self
                .exclude_models
                .iter()
                .any(|x| x.eq_ignore_ascii_case(m))
            {
                return Err(NeedError::ModelBothWays(m.clone()));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_parse_and_unknown_ones_are_named() {
        assert_eq!("NVLink".parse::<GpuTopology>(), Ok(GpuTopology::Nvlink));
        assert_eq!(
            "pcie-switch".parse::<GpuTopology>(),
            Ok(GpuTopology::PcieSwitch)
        );
        assert_eq!("".parse::<GpuTopology>(), Ok(GpuTopology::Any));
        assert_eq!(
            "nvswitch".parse::<GpuTopology>().unwrap_err().to_string(),
            "unknown value \"nvswitch\"; expected one of any, nvlink, pcie-switch, numa"
        );
        for v in GpuTopology::VALUES {
            assert_eq!(v.parse::<GpuTopology>().map(|t| t.name()), Ok(v));
        }
    }

    #[test]
    fn models_match_like_hami_and_contradictions_are_refused() {
        let need = GpuNeed {
            models: vec!["a100".into()],
            exclude_models: vec!["40GB".into()],
            ..Default::default()
        };
        assert!(need.allows_model("NVIDIA-A100-SXM4-80GB"));
        assert!(!need.allows_model("NVIDIA-A100-SXM4-40GB"));
        assert!(!need.allows_model("Tesla-V100-SXM2-32GB"));
        assert!(need.validate().is_ok());
        let both = GpuNeed {
            models: vec!["A100".into()],
            exclude_models: vec!["a100".into()],
            ..Default::default()
        };
        assert_eq!(
            both.validate().unwrap_err().to_string(),
            "model \"A100\" is both allowed and excluded"
        );
        let memory = GpuNeed {
            min_memory_mib: 40 * 1024,
            ..Default::default()
        };
        assert!(memory.allows_memory(81920));
        assert!(!memory.allows_memory(16384));
        assert!(GpuNeed::default().allows_memory(0));
    }
}
