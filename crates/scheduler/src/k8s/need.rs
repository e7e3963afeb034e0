//! A pod's GPU requirements from its annotations (documented in docs/scheduler.md):
//!
//! | annotation | meaning |
//! |---|---|
//! | `gpuplace.io/topology` | required: `nvlink`, `pcie-switch`, `numa` or `any` |
//! | `gpuplace.io/topology-preference` | preferred (same values); `nvidia.com/gpu-topology` is read as one |
//! | `gpuplace.io/gpu-model` | comma list of allowed models; alias HAMi's `nvidia.com/use-gputype` |
//! | `gpuplace.io/gpu-model-exclude` | comma list of refused models; alias `nvidia.com/nouse-gputype` |
//! | `gpuplace.io/gpu-memory-min` | a quantity (`40Gi`) every GPU must have |
//!
//! Models match as case-insensitive substrings of the GPU model (GFD's product name, e.g.
//! `NVIDIA-A100-SXM4-80GB`), as HAMi matches `use-gputype`.

use std::collections::BTreeMap;

use gpuplace_model::{GpuNeed, GpuTopology};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use crate::k8s::demand_error::{DemandError, milli_value};

pub use gpuplace_model::keys::{
    HAMI_NOUSE_ANNOTATION, HAMI_USE_ANNOTATION, MEMORY_MIN_ANNOTATION, MODEL_ANNOTATION,
    MODEL_EXCLUDE_ANNOTATION, NVIDIA_TOPOLOGY_ANNOTATION, TOPOLOGY_ANNOTATION,
    TOPOLOGY_PREFERENCE_ANNOTATION,
};

fn bad(annotation: &'static str, message: String) -> DemandError {
    DemandError::Annotation {
        annotation,
        message,
    }
}

fn topology(
    annotations: &BTreeMap<String, String>,
    key: &'static str,
) -> Result<Option<GpuTopology>, DemandError> {
    annotations
        .get(key)
        .map(|v| v.parse().map_err(|e| bad(key, format!("{e}"))))
        .transpose()
}

fn models(annotations: &BTreeMap<String, String>, keys: [&'static str; 2]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for key in keys {
        for m in annotations.get(key).into_iter().flat_map(|v| v.split(',')) {
            let m = m.trim();
            if !m.is_empty() && !out.iter().any(|o| o.eq_ignore_ascii_case(m)) {
                out.push(m.to_string());
            }
        }
    }
    out
}

/// The requirements a pod's annotations declare; an unknown value, a bad quantity or a
/// contradiction is an error naming the annotation.
pub fn gpu_need(annotations: Option<&BTreeMap<String, String>>) -> Result<GpuNeed, DemandError> {
    let Some(annotations) = annotations else {
        return Ok(GpuNeed::default());
    };
    let required = topology(annotations, TOPOLOGY_ANNOTATION)?.unwrap_or_default();
    let prefer = match topology(annotations, TOPOLOGY_PREFERENCE_ANNOTATION)? {
        Some(t) => t,
        None => topology(annotations, NVIDIA_TOPOLOGY_ANNOTATION)?.unwrap_or_default(),
    };
    let min_memory_mib = match annotations.get(MEMORY_MIN_ANNOTATION) {
        None => 0,
        Some(text) if text.trim_start().starts_with('-') => {
            return Err(bad(MEMORY_MIN_ANNOTATION, format!("{text:?} is negative")));
        }
        Some(text) => {
            let milli = milli_value(&Quantity(text.clone())).map_err(|_| {
                bad(
                    MEMORY_MIN_ANNOTATION,
                    format!("{text:?} is not a quantity such as 40Gi"),
                )
            })?;
            if milli < 0 {
                return Err(bad(MEMORY_MIN_ANNOTATION, format!("{text:?} is negative")));
            }
            let bytes = milli.div_euclid(1000) + i128::from(milli.rem_euclid(1000) > 0);
            u64::try_from((bytes + (1 << 20) - 1) >> 20).unwrap_or(u64::MAX)
        }
    };
    let need = GpuNeed {
        topology: required,
        prefer,
        models: models(annotations, [MODEL_ANNOTATION, HAMI_USE_ANNOTATION]),
        exclude_models: models(
            annotations,
            [MODEL_EXCLUDE_ANNOTATION, HAMI_NOUSE_ANNOTATION],
        ),
        min_memory_mib,
    };
    need.validate()
        .map_err(|e| bad(MODEL_EXCLUDE_ANNOTATION, e.to_string()))?;
    Ok(need)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn of(pairs: &[(&str, &str)]) -> Result<GpuNeed, String> {
        let map: BTreeMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        gpu_need(Some(&map)).map_err(|e| e.to_string())
    }

    #[test]
    fn annotations_and_aliases() {
        let need = of(&[
            (TOPOLOGY_ANNOTATION, "nvlink"),
            (NVIDIA_TOPOLOGY_ANNOTATION, "numa"),
            (HAMI_USE_ANNOTATION, "A100,H100"),
            (MODEL_ANNOTATION, "a100"),
            (HAMI_NOUSE_ANNOTATION, "40GB"),
            (MEMORY_MIN_ANNOTATION, "40Gi"),
        ])
        .unwrap();
        assert_eq!(need.topology, GpuTopology::Nvlink);
        assert_eq!(need.prefer, GpuTopology::Numa);
        assert_eq!(need.models, vec!["a100".to_string(), "H100".to_string()]);
        assert_eq!(need.exclude_models, vec!["40GB".to_string()]);
        assert_eq!(need.min_memory_mib, 40 * 1024);
        // gpuplace's own preference wins over NVIDIA's form.
        let need = of(&[
            (TOPOLOGY_PREFERENCE_ANNOTATION, "pcie-switch"),
            (NVIDIA_TOPOLOGY_ANNOTATION, "nvlink"),
        ])
        .unwrap();
        assert_eq!(need.prefer, GpuTopology::PcieSwitch);
        assert_eq!(
            of(&[(MEMORY_MIN_ANNOTATION, "80G")])
                .unwrap()
                .min_memory_mib,
            76294
        );
        assert!(gpu_need(None).unwrap().is_empty());
    }

    #[test]
    fn bad_values_name_the_annotation() {
        assert_eq!(
            of(&[(TOPOLOGY_ANNOTATION, "nvswitch")]).unwrap_err(),
            "annotation gpuplace.io/topology: unknown value \"nvswitch\"; expected one of any, nvlink, pcie-switch, numa"
        );
        assert_eq!(
            of(&[(MEMORY_MIN_ANNOTATION, "lots")]).unwrap_err(),
            "annotation gpuplace.io/gpu-memory-min: \"lots\" is not a quantity such as 40Gi"
        );
        assert!(
            of(&[(MEMORY_MIN_ANNOTATION, "-1Gi")])
                .unwrap_err()
                .contains("negative")
        );
        assert_eq!(
            of(&[(MODEL_ANNOTATION, "A100"), (HAMI_NOUSE_ANNOTATION, "a100")]).unwrap_err(),
            "annotation gpuplace.io/gpu-model-exclude: model \"A100\" is both allowed and excluded"
        );
    }
}
