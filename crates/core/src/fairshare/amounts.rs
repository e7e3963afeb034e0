//! A queue's guarantee or limit as people write it (`nvidia.com/gpu: "4"`, `cpu: 32`,
//! `memory: 64Gi`, `nvidia.com/gpu.A100: "2"`, or a percent of the cluster where the caller
//! knows the cluster), read into [`Bounds`]: one reader for the Queue objects the scheduler
//! watches and the tenants files of the simulator.

use super::tree::Bounds;

/// Why an amount of a queue's list cannot be read.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum AmountError {
    #[error("unknown resource {resource:?} (nvidia.com/gpu, nvidia.com/gpu.<model>, cpu, memory)")]
    Resource { resource: String },
    #[error("{resource}: {value} is not a quantity{}", if *.percent_allowed { " or a percent" } else { "" })]
    Amount {
        resource: String,
        value: String,
        percent_allowed: bool,
    },
}

/// How amounts are read.
#[derive(Clone, Copy, Debug)]
pub struct AmountRules<'a> {
    /// The scheduler's GPU resource name, accepted beside `nvidia.com/gpu` (and its
    /// `<name>.<model>` form).
    pub gpu_resource: &'a str,
    /// The cluster's capacity (GPU milli, CPU milli, memory MiB) when a percent of it may be
    /// given; `None`: quantities only.
    pub capacity: Option<&'a [u64]>,
}

/// Reads `(resource, amount)` pairs: GPUs in milli-GPU (`"1.5"` is 1,500), CPU in milli-CPU,
/// memory in MiB (rounded up), per-model GPUs by their model.
pub fn read_bounds<'t>(
    list: impl IntoIterator<Item = (&'t str, &'t str)>,
    rules: AmountRules<'_>,
) -> Result<Bounds, AmountError> {
    let mut out = Bounds::default();
    for (resource, text) in list {
        let text = text.trim();
        let model = resource
            .strip_prefix("nvidia.com/gpu.")
            .or_else(|| resource.strip_prefix(rules.gpu_resource)?.strip_prefix('.'))
            .filter(|m| !m.is_empty());
        let dim = match resource {
            r if r == "nvidia.com/gpu" || r == rules.gpu_resource => Some(0),
            "cpu" => Some(1),
            "memory" => Some(2),
            _ if model.is_some() => None,
            _ => {
                return Err(AmountError::Resource {
                    resource: resource.to_string(),
                });
            }
        };
        let amount = amount(text, dim, rules).ok_or_else(|| AmountError::Amount {
            resource: resource.to_string(),
            value: text.to_string(),
            percent_allowed: rules.capacity.is_some(),
        })?;
        match (dim, model) {
            (Some(d), _) => out.dims[d] = Some(amount),
            (None, Some(model)) => {
                let at = out.models.partition_point(|(m, _)| m.as_str() < model);
                out.models.insert(at, (model.to_string(), amount));
            }
            (None, None) => {}
        }
    }
    Ok(out)
}

/// One amount in its resource's unit (`dim`: `None` for a GPU model's milli-GPU).
fn amount(text: &str, dim: Option<usize>, rules: AmountRules<'_>) -> Option<u64> {
    if let (Some(pct), Some(capacity)) = (text.strip_suffix('%'), rules.capacity) {
        let pct: f64 = pct.trim().parse().ok()?;
        if !(pct.is_finite() && pct >= 0.0) {
            return None;
        }
        let of = capacity.get(dim.unwrap_or(0)).copied().unwrap_or(0) as f64;
        return Some((of * pct / 100.0).round() as u64);
    }
    let milli = gpuplace_model::quantity_milli(text)
        .ok()
        .filter(|m| *m >= 0)?;
    let milli = u64::try_from(milli).ok()?;
    // Milli-bytes to MiB, rounded up.
    Some(if dim == Some(2) {
        milli.div_ceil(1000 * 1024 * 1024)
    } else {
        milli
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const PLAIN: AmountRules<'static> = AmountRules {
        gpu_resource: "nvidia.com/gpu",
        capacity: None,
    };

    #[test]
    fn quantities_models_percents_and_refusals() {
        let b = read_bounds(
            [
                ("nvidia.com/gpu", "8.5"),
                ("cpu", "32"),
                ("memory", "64Gi"),
                ("nvidia.com/gpu.A100", "2"),
            ],
            PLAIN,
        )
        .unwrap();
        assert_eq!(b.dims, [Some(8500), Some(32_000), Some(65_536)]);
        assert_eq!(b.models, vec![("A100".to_string(), 2000)]);
        let custom = AmountRules {
            gpu_resource: "example.com/gpu",
            capacity: Some(&[16_000, 64_000, 1 << 20]),
        };
        let b = read_bounds(
            [("example.com/gpu", " 25% "), ("example.com/gpu.T4", "1")],
            custom,
        )
        .unwrap();
        assert_eq!(b.dims[0], Some(4_000));
        assert_eq!(b.models, vec![("T4".to_string(), 1000)]);
        assert_eq!(
            read_bounds([("nvidia.com/gpu", "25%")], PLAIN)
                .unwrap_err()
                .to_string(),
            "nvidia.com/gpu: 25% is not a quantity"
        );
        assert_eq!(
            read_bounds([("nvidia.com/gpu", "lots")], custom)
                .unwrap_err()
                .to_string(),
            "nvidia.com/gpu: lots is not a quantity or a percent"
        );
        assert!(matches!(
            read_bounds([("pods", "3")], PLAIN),
            Err(AmountError::Resource { .. })
        ));
        assert!(read_bounds([("nvidia.com/gpu.", "3")], PLAIN).is_err());
        assert!(read_bounds([("cpu", "-1")], PLAIN).is_err());
        assert!(read_bounds([("cpu", "-1%")], custom).is_err());
    }
}
