//! What one container asks of GPUs, read the same way by the scheduler (to plan) and by the
//! device plugin (to recognise the container the kubelet is admitting): the handshake
//! depends on the two agreeing, so there is one reading.
//!
//! A container asks for whole devices of the GPU resource (e.g. `nvidia.com/gpu: 2`) or for
//! a share of one GPU ([`SHARE_RESOURCE`], milli-GPU). The amount is the container's request,
//! else its limit (Kubernetes defaults a missing request to the limit), as Kubernetes reads
//! a quantity.

use crate::assignment::{ContainerKind, ContainerNeed};
use crate::keys::SHARE_RESOURCE;
use crate::request::MILLI_PER_GPU;

/// A quantity Kubernetes would not accept, or a container asking for something impossible.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum NeedOfContainerError {
    #[error("quantity {0:?} is not a valid Kubernetes quantity")]
    Quantity(String),
    #[error("quantity {0:?} is negative")]
    Negative(String),
    #[error(
        "container {container:?} asks for both {resource} and {SHARE_RESOURCE}; a container asks for whole GPUs or a share of one"
    )]
    MixedShare { container: String, resource: String },
    #[error(
        "the pod's {SHARE_RESOURCE} totals {0} (counted as Kubernetes counts requests); a share is of one GPU, at most 1000"
    )]
    ShareTooLarge(i128),
}

/// A quantity in thousandths of its unit (`500m` CPU is 500; `1Gi` memory is 1073741824000),
/// rounded up as Kubernetes rounds fractional milli-units.
pub fn quantity_milli(text: &str) -> Result<i128, NeedOfContainerError> {
    let text = text.trim();
    let bad = || NeedOfContainerError::Quantity(text.to_string());
    if text.is_empty() {
        return Err(bad());
    }
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == '-'))
        .unwrap_or(text.len());
    let (number, suffix) = text.split_at(split);
    // Exponent forms like 1e3 / 1E3.
    let exponent = suffix
        .strip_prefix(['e', 'E'])
        .filter(|rest| {
            !rest.is_empty()
                && rest
                    .trim_start_matches(['+', '-'])
                    .chars()
                    .all(|c| c.is_ascii_digit())
        })
        .map(|rest| rest.parse::<i32>().map_err(|_| bad()))
        .transpose()?;
    let (multiplier, exp10) = match exponent {
        Some(e) => (1.0, e),
        None => match suffix {
            "" => (1.0, 0),
            "m" => (1.0, -3),
            "k" => (1.0, 3),
            "M" => (1.0, 6),
            "G" => (1.0, 9),
            "T" => (1.0, 12),
            "P" => (1.0, 15),
            "E" => (1.0, 18),
            "Ki" => (1024f64, 0),
            "Mi" => (1024f64.powi(2), 0),
            "Gi" => (1024f64.powi(3), 0),
            "Ti" => (1024f64.powi(4), 0),
            "Pi" => (1024f64.powi(5), 0),
            "Ei" => (1024f64.powi(6), 0),
            _ => return Err(bad()),
        },
    };
    let value: f64 = number.parse().map_err(|_| bad())?;
    if !value.is_finite() {
        return Err(bad());
    }
    if value < 0.0 {
        return Err(NeedOfContainerError::Negative(text.to_string()));
    }
    let milli = value * multiplier * 10f64.powi(exp10 + 3);
    Ok(milli.ceil() as i128)
}

/// What container `name` of `kind` asks of GPUs; `quantity(resource)` is the container's
/// request of that resource, else its limit. `None` when it asks for none; an error when it
/// asks for both whole GPUs of `gpu_resource` and a share, or for a share above one GPU.
pub fn need_of_container<'q>(
    name: &str,
    kind: ContainerKind,
    gpu_resource: &str,
    quantity: impl Fn(&str) -> Option<&'q str>,
) -> Result<Option<ContainerNeed>, NeedOfContainerError> {
    let amount = |resource: &str| -> Result<u32, NeedOfContainerError> {
        match quantity(resource) {
            Some(text) => Ok(u32::try_from(quantity_milli(text)? / 1000).unwrap_or(u32::MAX)),
            None => Ok(0),
        }
    };
    let count = amount(gpu_resource)?;
    let milli = amount(SHARE_RESOURCE)?;
    if count > 0 && milli > 0 {
        return Err(NeedOfContainerError::MixedShare {
            container: name.to_string(),
            resource: gpu_resource.to_string(),
        });
    }
    if milli > MILLI_PER_GPU {
        return Err(NeedOfContainerError::ShareTooLarge(i128::from(milli)));
    }
    if count == 0 && milli == 0 {
        return Ok(None);
    }
    Ok(Some(ContainerNeed {
        name: name.to_string(),
        kind,
        count: count.max(1),
        milli,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_parse_like_kubernetes() {
        assert_eq!(quantity_milli("500m"), Ok(500));
        assert_eq!(quantity_milli("2"), Ok(2000));
        assert_eq!(quantity_milli("1.5"), Ok(1500));
        assert_eq!(quantity_milli("1Gi"), Ok(1024 * 1024 * 1024 * 1000));
        assert_eq!(quantity_milli("129e6"), Ok(129_000_000_000));
        assert_eq!(quantity_milli("1k"), Ok(1_000_000));
        assert_eq!(quantity_milli("0.1m"), Ok(1));
        assert!(quantity_milli("ten").is_err());
        assert!(quantity_milli("1Xi").is_err());
        assert!(matches!(
            quantity_milli("-1"),
            Err(NeedOfContainerError::Negative(_))
        ));
        assert!(quantity_milli("").is_err());
    }

    #[test]
    fn whole_gpus_or_a_share_never_both() {
        let ask = |pairs: &'static [(&'static str, &'static str)]| {
            move |r: &str| pairs.iter().find(|(k, _)| *k == r).map(|(_, v)| *v)
        };
        let need = need_of_container(
            "c",
            ContainerKind::App,
            "nvidia.com/gpu",
            ask(&[("nvidia.com/gpu", "2")]),
        );
        assert_eq!(need.unwrap().map(|n| (n.count, n.milli)), Some((2, 0)));
        let need = need_of_container(
            "c",
            ContainerKind::Init,
            "nvidia.com/gpu",
            ask(&[(SHARE_RESOURCE, "1k")]),
        );
        assert_eq!(need.unwrap().map(|n| (n.count, n.milli)), Some((1, 1000)));
        assert_eq!(
            need_of_container(
                "c",
                ContainerKind::App,
                "nvidia.com/gpu",
                ask(&[("cpu", "2")])
            ),
            Ok(None)
        );
        assert!(matches!(
            need_of_container(
                "c",
                ContainerKind::App,
                "nvidia.com/gpu",
                ask(&[("nvidia.com/gpu", "1"), (SHARE_RESOURCE, "250")])
            ),
            Err(NeedOfContainerError::MixedShare { .. })
        ));
        assert!(matches!(
            need_of_container(
                "c",
                ContainerKind::App,
                "nvidia.com/gpu",
                ask(&[(SHARE_RESOURCE, "1500")])
            ),
            Err(NeedOfContainerError::ShareTooLarge(1500))
        ));
    }
}
