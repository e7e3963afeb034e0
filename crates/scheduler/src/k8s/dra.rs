//! DRA claims (`resource.k8s.io/v1`) as the scheduler reads them: what a ResourceClaim
//! asks of gpuplace's driver ([`ClaimShape`]: whole GPUs or a share, how they are linked),
//! what it holds once allocated, and who uses it. Pure: the pod store keeps the claims
//! and resolves each pod's against them ([`pod`]); the Binding's writes are built in
//! [`write`].
//!
//! The claims in the API are the record of which devices are taken: a claim's allocation
//! is counted once (on the first pod it is reserved for), a claim allocated by anyone is
//! honoured, and nothing else is kept (no annotation), so a restart or a new leader reads
//! the same record.

pub mod constraints;
pub mod extended;
pub mod pod;
pub mod selectors;
pub mod store;
pub mod write;

use gpuplace_model::{GpuTopology, MILLI_PER_GPU, quantity_milli};
use k8s_openapi::api::resource::v1::{DeviceRequest, ResourceClaim};

/// The finalizer kube-scheduler (and gpuplace) puts on a claim it allocates: the
/// resource claim controller deallocates the claim when its last user is gone, and then
/// removes it.
pub const DELETE_PROTECTION: &str = "resource.kubernetes.io/delete-protection";
/// What a claim pod asks among its node's scalar resources, and what a node served by
/// gpuplace's DRA driver (label [`gpuplace_model::keys::DRA_DRIVER_LABEL`]) offers without
/// limit: claim pods go to such nodes only.
pub const DRA_GPUS: &str = "dra.gpuplace.io/gpus";
/// The phrase key for a device plugin pod on a DRA node (no resource of that name exists).
pub const PLUGIN_GPUS: &str = "dra.gpuplace.io/device-plugin";
/// The annotation that marks the claim the scheduler made for a pod's extended resources.
pub const EXTENDED_CLAIM_ANNOTATION: &str = "resource.kubernetes.io/extended-resource-claim";
/// The name a pod's extended-resource claim goes by among its claims (not a valid claim
/// name in a pod's spec, so it meets none of them).
pub const EXTENDED_REF: &str = "<extended-resources>";

/// The most entries `status.reservedFor` may hold (the API's limit).
pub const MAX_RESERVED_FOR: usize = 256;

/// Which claims are gpuplace's to allocate: its driver, and the DeviceClasses that select
/// the driver's GPUs (those of `deploy/base/dra-driver`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DraSettings {
    pub driver: String,
    pub classes: Vec<String>,
}

impl Default for DraSettings {
    fn default() -> Self {
        DraSettings {
            driver: "gpu.gpuplace.io".into(),
            classes: vec!["gpu.gpuplace.io".into(), "gpu-share.gpuplace.io".into()],
        }
    }
}

/// One request of a claim, as gpuplace allocates it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShapeRequest {
    /// The name the allocation results give it: the request's, or for a `firstAvailable`
    /// subrequest `<request>/<subrequest>`.
    pub name: String,
    pub count: u32,
    /// Milli-GPU each device gives: 1000 for whole GPUs, less for a share.
    pub milli: u32,
    /// The memory a share asks (`capacity.requests.memory`), MiB.
    pub memory_mib: Option<u64>,
    /// Its CEL selectors, compiled: every device it gets must match them.
    pub selectors: Option<std::sync::Arc<selectors::Selectors>>,
    /// `allocationMode: All`: every GPU of the node it is allocated on (`count` is 0 until
    /// the node's size is known: [`store::alternatives`]).
    pub all: bool,
}

/// What a claim asks of gpuplace's GPUs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaimShape {
    /// The ways the claim can be met, in its order of preference: one where every request
    /// is `exactly`; where requests list `firstAvailable` subrequests, each combination of
    /// one subrequest per request, the earlier requests' choices changing slowest (the
    /// order kube-scheduler's allocator tries them in). Combinations gpuplace cannot
    /// allocate (another driver's class, a share beside other devices) are left out; at
    /// least one is kept.
    pub options: Vec<ClaimOption>,
    /// How the claim's devices must be linked (its `matchAttribute` constraints).
    pub topology: GpuTopology,
}

/// One way to meet a claim: a device request for each of its requests.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaimOption {
    pub requests: Vec<ShapeRequest>,
}

impl ClaimOption {
    /// Devices asked, over every request.
    pub fn count(&self) -> u32 {
        self.requests.iter().map(|r| r.count).sum()
    }
}

/// The most ways one pod's claims may be met that gpuplace tries (combinations of
/// `firstAvailable` subrequests, over every claim of the pod to allocate).
pub const MAX_OPTIONS: usize = 16;

/// One device a claim holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeldDevice {
    pub request: String,
    pub driver: String,
    pub pool: String,
    pub device: String,
    /// Milli-GPU it consumed (1000 when the allocation names none).
    pub milli: u32,
}

/// A user in `status.reservedFor`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Consumer {
    pub api_group: Option<String>,
    pub resource: String,
    pub name: String,
    pub uid: String,
}

impl Consumer {
    /// The user as `status.reservedFor` names it.
    pub fn reference(&self) -> k8s_openapi::api::resource::v1::ResourceClaimConsumerReference {
        k8s_openapi::api::resource::v1::ResourceClaimConsumerReference {
            api_group: self.api_group.clone(),
            resource: self.resource.clone(),
            name: self.name.clone(),
            uid: self.uid.clone(),
        }
    }
}

/// A claim's namespace and name (`default` when it names none), as stores key it.
pub fn claim_key(claim: &ResourceClaim) -> (String, String) {
    (
        claim
            .metadata
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into()),
        claim.metadata.name.clone().unwrap_or_default(),
    )
}

/// Whether `claim` is one the scheduler made for a pod's extended resources.
pub fn is_extended(claim: &ResourceClaim) -> bool {
    claim
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(EXTENDED_CLAIM_ANNOTATION))
        .is_some_and(|v| v == "true")
}

/// The UID of the pod that owns `claim`, when it is a claim made for a pod's extended
/// resources (annotated so, its controller a Pod).
pub fn owner_of(claim: &ResourceClaim) -> Option<String> {
    if !is_extended(claim) {
        return None;
    }
    claim
        .metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true) && o.kind == "Pod" && o.api_version == "v1")
        .map(|o| o.uid.clone())
}

/// What the scheduler keeps of a ResourceClaim.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaimInfo {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub resource_version: String,
    pub finalizers: Vec<String>,
    pub deleting: bool,
    /// What it asks, or why gpuplace cannot allocate it.
    pub shape: Result<ClaimShape, String>,
    /// Its allocation: the node it was allocated on and the devices, when allocated.
    pub allocation: Option<Allocated>,
    pub reserved_for: Vec<Consumer>,
    /// For a claim the scheduler made for a pod's extended resources
    /// ([`is_extended`]): the UID of the pod that owns it.
    pub extended_owner: Option<String>,
}

/// An allocated claim's node and devices.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Allocated {
    /// The node its `nodeSelector` names (`metadata.name In [node]`), if one.
    pub node: Option<String>,
    pub devices: Vec<HeldDevice>,
}

impl ClaimInfo {
    /// Reads `claim`; what gpuplace cannot allocate is kept as the shape's error.
    pub fn of(claim: &ResourceClaim, settings: &DraSettings) -> ClaimInfo {
        let meta = &claim.metadata;
        let status = claim.status.as_ref();
        ClaimInfo {
            namespace: meta.namespace.clone().unwrap_or_else(|| "default".into()),
            name: meta.name.clone().unwrap_or_default(),
            uid: meta.uid.clone().unwrap_or_default(),
            resource_version: meta.resource_version.clone().unwrap_or_default(),
            finalizers: meta.finalizers.clone().unwrap_or_default(),
            deleting: meta.deletion_timestamp.is_some(),
            shape: shape_of(claim, settings),
            allocation: status.and_then(|s| s.allocation.as_ref()).map(allocated_of),
            reserved_for: status
                .and_then(|s| s.reserved_for.as_ref())
                .into_iter()
                .flatten()
                .map(|r| Consumer {
                    api_group: r.api_group.clone().filter(|g| !g.is_empty()),
                    resource: r.resource.clone(),
                    name: r.name.clone(),
                    uid: r.uid.clone(),
                })
                .collect(),
            extended_owner: owner_of(claim),
        }
    }

    /// `namespace/name`.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// Whether the pod with `uid` is among its users.
    pub fn reserved_for_pod(&self, uid: &str) -> bool {
        self.reserved_for
            .iter()
            .any(|c| c.resource == "pods" && c.uid == uid)
    }

    /// The pod its devices are counted on: its first user that is a pod.
    pub fn owner(&self) -> Option<&str> {
        self.reserved_for
            .iter()
            .find(|c| c.resource == "pods")
            .map(|c| c.uid.as_str())
    }
}

fn allocated_of(allocation: &k8s_openapi::api::resource::v1::AllocationResult) -> Allocated {
    let node = allocation.node_selector.as_ref().and_then(|s| {
        s.node_selector_terms
            .iter()
            .flat_map(|t| t.match_fields.iter().flatten())
            .find(|f| f.key == "metadata.name" && f.operator == "In")
            .and_then(|f| f.values.as_ref()?.first().cloned())
    });
    let devices = allocation
        .devices
        .as_ref()
        .and_then(|d| d.results.as_ref())
        .into_iter()
        .flatten()
        .map(|r| HeldDevice {
            request: r.request.clone(),
            driver: r.driver.clone(),
            pool: r.pool.clone(),
            device: r.device.clone(),
            milli: consumed_milli(r.consumed_capacity.as_ref()),
        })
        .collect();
    Allocated { node, devices }
}

/// The milli-GPU an allocation result consumed (a whole GPU when it names none).
pub fn consumed_milli(
    consumed: Option<
        &std::collections::BTreeMap<
            String,
            k8s_openapi::apimachinery::pkg::api::resource::Quantity,
        >,
    >,
) -> u32 {
    consumed
        .and_then(|c| c.get("milli"))
        .and_then(|q| quantity_milli(&q.0).ok())
        .map_or(MILLI_PER_GPU, |m| {
            u32::try_from(m / 1000)
                .unwrap_or(MILLI_PER_GPU)
                .clamp(1, MILLI_PER_GPU)
        })
}

/// What `claim` asks of gpuplace's GPUs, or why gpuplace cannot allocate it.
pub fn shape_of(claim: &ResourceClaim, settings: &DraSettings) -> Result<ClaimShape, String> {
    let devices = claim.spec.devices.as_ref();
    let choices: Vec<Vec<Result<ShapeRequest, String>>> = devices
        .and_then(|d| d.requests.as_ref())
        .into_iter()
        .flatten()
        .map(|r| request_choices(r, settings))
        .collect::<Result<_, _>>()?;
    if choices.is_empty() {
        return Err("it requests no devices".into());
    }
    let mut topology = GpuTopology::Any;
    // Spreads gpuplace does not make: a way with more than one device among the requests
    // such a constraint names cannot be had.
    let mut spreads = Vec::new();
    for c in devices
        .and_then(|d| d.constraints.as_ref())
        .into_iter()
        .flatten()
    {
        if let Some(attribute) = &c.distinct_attribute
            && let Some(why) = constraints::distinct(attribute, &settings.driver)?
        {
            spreads.push(constraints::Spread {
                why,
                requests: c.requests.clone().unwrap_or_default(),
            });
        }
        let Some(attribute) = &c.match_attribute else {
            continue;
        };
        topology = constraints::both(
            topology,
            constraints::match_topology(attribute, &settings.driver)?,
        )?;
    }
    let options = options_of(&choices)?;
    let options = if spreads.is_empty() {
        options
    } else {
        let tried = options.into_iter().map(|o| {
            let asks = || {
                o.requests.iter().map(|r| constraints::Asks {
                    name: &r.name,
                    count: r.count,
                    all: r.all,
                })
            };
            match spreads.iter().find(|s| !s.met_by(asks())) {
                Some(spread) => Err(spread.why.clone()),
                None => Ok(o),
            }
        });
        kept(tried, "it requests no devices")?
    };
    Ok(ClaimShape { options, topology })
}

/// Every combination of one choice per request, in preference order, without those
/// gpuplace cannot allocate; the first reason when none is left.
fn options_of(choices: &[Vec<Result<ShapeRequest, String>>]) -> Result<Vec<ClaimOption>, String> {
    let combinations = product(&choices.iter().map(Vec::len).collect::<Vec<_>>());
    if combinations > MAX_OPTIONS {
        return Err(format!(
            "its firstAvailable lists make {} combinations of subrequests; gpuplace tries at most {MAX_OPTIONS} a claim",
            counted(combinations)
        ));
    }
    let sizes: Vec<usize> = choices.iter().map(Vec::len).collect();
    let tried = combinations_of(&sizes).map(|picks| {
        picks
            .iter()
            .zip(choices)
            .map(|(&k, c)| c[k].clone())
            .collect::<Result<Vec<ShapeRequest>, String>>()
            .and_then(checked_option)
    });
    kept(tried, "it requests no devices")
}

/// The ways that can be had, in order, else the first reason one cannot (`none` when
/// none was tried).
pub fn kept<T>(
    tried: impl Iterator<Item = Result<T, String>>,
    none: &str,
) -> Result<Vec<T>, String> {
    let mut kept = Vec::new();
    let mut first_error = None;
    for way in tried {
        match way {
            Ok(way) => kept.push(way),
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    if kept.is_empty() {
        return Err(first_error.unwrap_or_else(|| none.to_string()));
    }
    // Kept as long as the claim: most keep one of a capacity of four.
    kept.shrink_to_fit();
    Ok(kept)
}

/// How many picks `sizes` makes (`usize::MAX` past it: a pod may name many claims).
pub fn product(sizes: &[usize]) -> usize {
    sizes
        .iter()
        .try_fold(1usize, |n, &k| n.checked_mul(k))
        .unwrap_or(usize::MAX)
}

/// A count [`product`] made, as a message says it.
pub fn counted(n: usize) -> String {
    if n == usize::MAX {
        "more than can be counted".into()
    } else {
        n.to_string()
    }
}

/// Every pick of one index below each of `sizes`, the first position changing slowest
/// (callers bound [`product`] first).
pub fn combinations_of(sizes: &[usize]) -> impl Iterator<Item = Vec<usize>> + '_ {
    let total = product(sizes);
    (0..total).map(move |mut n| {
        let mut picks = vec![0; sizes.len()];
        for (i, &size) in sizes.iter().enumerate().rev() {
            picks[i] = n % size.max(1);
            n /= size.max(1);
        }
        picks
    })
}

/// A share is one device in a claim of one request; so is a request for all of a node's
/// GPUs.
fn checked_option(requests: Vec<ShapeRequest>) -> Result<ClaimOption, String> {
    let option = ClaimOption { requests };
    if option.requests.iter().any(|r| r.all) && option.requests.len() > 1 {
        return Err(
            "a request for all of a node's GPUs (allocationMode All) is its claim's only request in gpuplace"
                .into(),
        );
    }
    let shares = option.requests.iter().filter(|r| r.milli < MILLI_PER_GPU);
    if shares.count() > 0 && (option.requests.len() > 1 || option.count() > 1) {
        return Err(
            "a share (capacity milli below 1000) is asked of one device in a claim of one request; ask whole GPUs or one share"
                .into(),
        );
    }
    Ok(option)
}

/// What one request may be met by: itself when it is `exactly` (or the reason gpuplace
/// cannot allocate it), each subrequest when it lists `firstAvailable` (a subrequest
/// gpuplace cannot allocate is kept as its reason, so another may be chosen).
fn request_choices(
    request: &DeviceRequest,
    settings: &DraSettings,
) -> Result<Vec<Result<ShapeRequest, String>>, String> {
    let name = &request.name;
    if let Some(subrequests) = request.first_available.as_ref().filter(|f| !f.is_empty()) {
        if request.exactly.is_some() {
            return Err(format!(
                "request {name:?} has both exactly and firstAvailable"
            ));
        }
        return Ok(subrequests
            .iter()
            .map(|sub| {
                asked(
                    &format!("{name}/{}", sub.name),
                    Asked {
                        class: &sub.device_class_name,
                        admin_access: None,
                        selectors: sub.selectors.as_deref(),
                        allocation_mode: sub.allocation_mode.as_deref(),
                        count: sub.count,
                        capacity: sub.capacity.as_ref(),
                    },
                    settings,
                )
            })
            .collect());
    }
    let Some(exactly) = &request.exactly else {
        return Err(format!(
            "request {name:?} has neither exactly nor firstAvailable"
        ));
    };
    let asked_for = Asked {
        class: &exactly.device_class_name,
        admin_access: exactly.admin_access,
        selectors: exactly.selectors.as_deref(),
        allocation_mode: exactly.allocation_mode.as_deref(),
        count: exactly.count,
        capacity: exactly.capacity.as_ref(),
    };
    Ok(vec![asked(name, asked_for, settings)])
}

/// What an `exactly` request or a `firstAvailable` subrequest asks.
struct Asked<'a> {
    class: &'a str,
    admin_access: Option<bool>,
    selectors: Option<&'a [k8s_openapi::api::resource::v1::DeviceSelector]>,
    allocation_mode: Option<&'a str>,
    count: Option<i64>,
    capacity: Option<&'a k8s_openapi::api::resource::v1::CapacityRequirements>,
}

fn asked(name: &str, asked: Asked<'_>, settings: &DraSettings) -> Result<ShapeRequest, String> {
    let class = asked.class;
    if !settings.classes.iter().any(|c| c == class) {
        return Err(format!(
            "request {name:?} asks DeviceClass {class:?}, which is not one of gpuplace's ({}); let kube-scheduler place the pod",
            settings.classes.join(", ")
        ));
    }
    if asked.admin_access == Some(true) {
        return Err(format!(
            "request {name:?} asks adminAccess, which gpuplace does not grant"
        ));
    }
    let texts: Vec<String> = asked
        .selectors
        .into_iter()
        .flatten()
        .map(|s| {
            s.cel
                .as_ref()
                .map(|c| c.expression.clone())
                .ok_or_else(|| format!("request {name:?} has a selector without cel"))
        })
        .collect::<Result<_, _>>()?;
    let selectors = if texts.is_empty() {
        None
    } else {
        Some(std::sync::Arc::new(
            selectors::Selectors::compile(&texts).map_err(|e| format!("request {name:?}: {e}"))?,
        ))
    };
    let all = match asked.allocation_mode.unwrap_or("ExactCount") {
        "ExactCount" => false,
        "All" => true,
        mode => {
            return Err(format!(
                "request {name:?} has allocationMode {mode}; gpuplace allocates ExactCount and All"
            ));
        }
    };
    let count = if all {
        0
    } else {
        let count = asked.count.unwrap_or(1);
        u32::try_from(count)
            .ok()
            .filter(|c| (1..=64).contains(c))
            .ok_or_else(|| format!("request {name:?} has count {count}; 1 to 64 devices"))?
    };
    let (milli, memory_mib) = capacity_of(name, asked.capacity)?;
    if all && milli < MILLI_PER_GPU {
        return Err(format!(
            "request {name:?} asks all devices (allocationMode All) as shares; All gives whole GPUs"
        ));
    }
    Ok(ShapeRequest {
        name: name.to_string(),
        count,
        milli,
        memory_mib,
        selectors,
        all,
    })
}

fn capacity_of(
    name: &str,
    capacity: Option<&k8s_openapi::api::resource::v1::CapacityRequirements>,
) -> Result<(u32, Option<u64>), String> {
    let Some(requests) = capacity.and_then(|c| c.requests.as_ref()) else {
        return Ok((MILLI_PER_GPU, None));
    };
    let mut milli = MILLI_PER_GPU;
    let mut memory = None;
    for (key, q) in requests {
        let value = quantity_milli(&q.0).map_err(|e| format!("request {name:?}: {key}: {e}"))?;
        match key.as_str() {
            "milli" => {
                let m = value / 1000;
                milli = u32::try_from(m)
                    .ok()
                    .filter(|m| (1..=MILLI_PER_GPU).contains(m))
                    .ok_or_else(|| {
                        format!(
                            "request {name:?}: capacity milli {:?} is not 1 to 1000",
                            q.0
                        )
                    })?;
            }
            "memory" => {
                let bytes = value / 1000;
                let mib = u64::try_from(bytes.div_euclid(1 << 20))
                    .ok()
                    .filter(|m| *m > 0)
                    .ok_or_else(|| {
                        format!("request {name:?}: capacity memory {:?} is below 1Mi", q.0)
                    })?;
                memory = Some(mib);
            }
            other => {
                return Err(format!(
                    "request {name:?} asks capacity {other:?}; gpuplace's GPUs offer milli and memory"
                ));
            }
        }
    }
    Ok((milli, memory))
}

#[cfg(test)]
mod tests;
