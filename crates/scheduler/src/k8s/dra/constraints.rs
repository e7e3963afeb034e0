//! What a claim's `constraints` ask of gpuplace's GPUs: `matchAttribute` as a topology
//! (linked, one PCIe switch, one NUMA node), `distinctAttribute` as met by construction or
//! by claims of one GPU only.

use gpuplace_model::GpuTopology;

/// A `distinctAttribute` on an attribute several GPUs share: met only where the requests
/// it names (all when it names none) ask one device in all.
#[derive(Clone, Debug)]
pub struct Spread {
    /// Why a way of more devices cannot be had.
    pub why: String,
    /// The requests it names (a `firstAvailable` request's name covers its subrequests).
    pub requests: Vec<String>,
}

/// What one request of a way asks, as a [`Spread`] counts it.
#[derive(Clone, Copy, Debug)]
pub struct Asks<'a> {
    /// The request's name (`<request>/<subrequest>` for a `firstAvailable` choice).
    pub name: &'a str,
    pub count: u32,
    /// `allocationMode: All`: every GPU of its node.
    pub all: bool,
}

impl Spread {
    /// Whether a way whose requests ask `asks` meets it.
    pub fn met_by<'a>(&self, asks: impl IntoIterator<Item = Asks<'a>>) -> bool {
        let named = asks.into_iter().filter(|r| {
            self.requests.is_empty()
                || self
                    .requests
                    .iter()
                    .any(|n| n == r.name || r.name.split_once('/').is_some_and(|(req, _)| req == n))
        });
        let mut devices = 0;
        for r in named {
            if r.all {
                return false;
            }
            devices += r.count;
        }
        devices <= 1
    }
}

/// Two topologies asked at once: one may be none; two different ones are refused (gpuplace
/// meets one topology per pod), rather than one silently dropped.
pub fn both(a: GpuTopology, b: GpuTopology) -> Result<GpuTopology, String> {
    match (a, b) {
        (GpuTopology::Any, x) | (x, GpuTopology::Any) => Ok(x),
        (x, y) if x == y => Ok(x),
        (x, y) => Err(format!(
            "its constraints ask GPUs {} and {} at once; gpuplace meets one such constraint a pod",
            x.phrase(),
            y.phrase()
        )),
    }
}

/// The topology a `matchAttribute` constraint asks: GPUs in one NVLink clique or domain
/// (linked), behind one PCIe switch, on one NUMA node; attributes every GPU of a node
/// shares (model, driver version, type) ask nothing more.
pub fn match_topology(attribute: &str, driver: &str) -> Result<GpuTopology, String> {
    let (domain, name) = attribute.split_once('/').unwrap_or((driver, attribute));
    if domain != driver {
        return Err(format!(
            "constraint matchAttribute {attribute:?} is not an attribute of driver {driver}"
        ));
    }
    match name {
        "nvlinkClique" | "nvlinkDomain" => Ok(GpuTopology::Nvlink),
        "pcieSwitch" => Ok(GpuTopology::PcieSwitch),
        "numaNode" => Ok(GpuTopology::Numa),
        "model" | "driverVersion" | "type" => Ok(GpuTopology::Any),
        _ => Err(format!(
            "constraint matchAttribute {attribute:?}: gpuplace matches nvlinkClique, nvlinkDomain, pcieSwitch, numaNode, model, driverVersion and type"
        )),
    }
}

/// What a `distinctAttribute` constraint leaves gpuplace: nothing more where the attribute
/// is a GPU's own (`uuid`, `index`: the devices of one claim are always different GPUs,
/// as a share is one device of a claim of one request), else claims of one device only
/// (`Some`: why more cannot be had), as gpuplace does not spread a claim's GPUs.
pub fn distinct(attribute: &str, driver: &str) -> Result<Option<String>, String> {
    let (domain, name) = attribute.split_once('/').unwrap_or((driver, attribute));
    if domain != driver {
        return Err(format!(
            "constraint distinctAttribute {attribute:?} is not an attribute of driver {driver}"
        ));
    }
    match name {
        "uuid" | "index" => Ok(None),
        "nvlinkClique" | "nvlinkDomain" | "pcieSwitch" | "numaNode" | "model" | "driverVersion"
        | "type" => Ok(Some(format!(
            "constraint distinctAttribute {attribute:?} asks each GPU a different {name}; gpuplace does not spread a claim's GPUs so (it meets it for a claim of one GPU)"
        ))),
        _ => Err(format!(
            "constraint distinctAttribute {attribute:?}: gpuplace meets uuid and index, and the others for a claim of one GPU"
        )),
    }
}
