//! What a pod asks for and where it was put.

use serde::{Deserialize, Serialize};

use crate::need::GpuNeed;

/// Milli-GPU units in one whole GPU.
pub const MILLI_PER_GPU: u32 = 1000;

/// A pod's resource request as placement sees it.
///
/// A fractional pod asks for one GPU with `gpu_milli < 1000`; a whole-GPU pod asks for
/// `gpu_count` GPUs with `gpu_milli == 1000`; a CPU-only pod has `gpu_count == 0`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Request {
    pub cpu_milli: u64,
    pub memory_mib: u64,
    pub gpu_count: u32,
    /// Milli-GPU wanted on each GPU (1..=1000); 0 when `gpu_count` is 0.
    pub gpu_milli: u32,
    /// GPU models the pod accepts; empty means any.
    #[serde(default)]
    pub allowed_models: Vec<String>,
    /// Requirements on each GPU and on how a container's GPUs are linked.
    #[serde(default, skip_serializing_if = "GpuNeed::is_empty")]
    pub need: GpuNeed,
}

/// Why a request cannot be placed anywhere, whatever the cluster.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RequestError {
    #[error("gpu_milli {0} is out of range 0..=1000")]
    MilliOutOfRange(u32),
    #[error("a fractional share ({0} milli) can only be asked of one gpu, not {1}")]
    FractionalMultiGpu(u32, u32),
    #[error("gpu count is {0} but gpu_milli is 0")]
    ZeroMilli(u32),
    #[error("gpu_milli is {0} but gpu count is 0")]
    MilliWithoutGpu(u32),
}

impl Request {
    /// Checks the request is internally consistent.
    pub fn validate(&self) -> Result<(), RequestError> {
        if self.gpu_milli > MILLI_PER_GPU {
            return Err(RequestError::MilliOutOfRange(self.gpu_milli));
        }
        match (self.gpu_count, self.gpu_milli) {
            (0, 0) => Ok(()),
            (0, m) => Err(RequestError::MilliWithoutGpu(m)),
            (n, 0) => Err(RequestError::ZeroMilli(n)),
            (n, m) if n > 1 && m < MILLI_PER_GPU => Err(RequestError::FractionalMultiGpu(m, n)),
            _ => Ok(()),
        }
    }

    /// Total milli-GPU requested (count times per-GPU share).
    pub fn total_gpu_milli(&self) -> u64 {
        u64::from(self.gpu_count) * u64::from(self.gpu_milli)
    }

    /// True for a share of a single GPU.
    pub fn is_fractional(&self) -> bool {
        self.gpu_count == 1 && self.gpu_milli < MILLI_PER_GPU
    }

    /// True when the pod accepts GPUs of `model`.
    pub fn allows_model(&self, model: &str) -> bool {
        self.allowed_models.is_empty() || self.allowed_models.iter().any(|m| m == model)
    }
}

/// Milli-GPU taken on one GPU.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceShare {
    /// GPU index on the node.
    pub index: u32,
    /// Device ID (what the kubelet sees).
    pub id: String,
    pub milli: u32,
}

/// A decision: the node and the exact GPUs, with the policy's score.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Placement {
    pub node: String,
    pub devices: Vec<DeviceShare>,
    pub score: i64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation_catches_inconsistent_requests() {
        let ok = Request {
            gpu_count: 1,
            gpu_milli: 500,
            ..Default::default()
        };
        assert!(ok.validate().is_ok());
        assert!(ok.is_fractional());
        let bad = Request {
            gpu_count: 2,
            gpu_milli: 500,
            ..Default::default()
        };
        assert_eq!(
            bad.validate().unwrap_err().to_string(),
            "a fractional share (500 milli) can only be asked of one gpu, not 2"
        );
        let bad = Request {
            gpu_count: 1,
            gpu_milli: 1001,
            ..Default::default()
        };
        assert_eq!(bad.validate(), Err(RequestError::MilliOutOfRange(1001)));
        let bad = Request {
            gpu_milli: 10,
            ..Default::default()
        };
        assert_eq!(bad.validate(), Err(RequestError::MilliWithoutGpu(10)));
    }

    #[test]
    fn model_constraint() {
        let any = Request::default();
        assert!(any.allows_model("T4"));
        let some = Request {
            allowed_models: vec!["V100M16".into(), "V100M32".into()],
            ..Default::default()
        };
        assert!(some.allows_model("V100M32"));
        assert!(!some.allows_model("T4"));
    }
}
