//! Prometheus metrics of the device plugin, served on `--metrics-addr` with `/healthz`.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DeviceLabel {
    pub device: String,
}

/// Every metric the plugin exports.
#[derive(Clone)]
pub struct Metrics {
    pub allocations: Counter,
    pub allocation_errors: Family<ReasonLabel, Counter>,
    pub preferred_allocations: Counter,
    pub registrations: Counter,
    pub registration_failures: Counter,
    pub device_healthy: Family<DeviceLabel, Gauge>,
    pub devices: Gauge,
    /// Handshake steps by result (planned, planned_busy, ambiguous, no_plan, list, ...).
    pub handshake: Family<ResultLabel, Counter>,
    /// Containers whose kubelet devices differ from the scheduler's plan.
    pub mismatches: Counter,
    /// 1 while registered with the kubelet.
    pub registered: Gauge,
    /// GetPreferredAllocation time in the plugin, by whether it waited for the pod watch.
    pub preferred_seconds: Family<WaitedLabel, Histogram>,
}

impl Default for Metrics {
    fn default() -> Metrics {
        Metrics {
            allocations: Counter::default(),
            allocation_errors: Family::default(),
            preferred_allocations: Counter::default(),
            registrations: Counter::default(),
            registration_failures: Counter::default(),
            device_healthy: Family::default(),
            devices: Gauge::default(),
            handshake: Family::default(),
            mismatches: Counter::default(),
            registered: Gauge::default(),
            preferred_seconds: Family::new_with_constructor(|| {
                Histogram::new(PREFERRED_BUCKETS.iter().copied())
            }),
        }
    }
}

/// Upper bounds of the GetPreferredAllocation histogram, in seconds.
pub const PREFERRED_BUCKETS: [f64; 12] = [
    0.0001, 0.00025, 0.0005, 0.00075, 0.001, 0.002, 0.005, 0.01, 0.05, 0.25, 1.0, 5.0,
];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WaitedLabel {
    /// "true" when the call waited for the pod watch to deliver the pod being admitted.
    pub waited_for_watch: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabel {
    pub result: String,
}

impl Metrics {
    /// Registers every metric under `gpuplace_deviceplugin_`.
    pub fn register(&self, registry: &mut Registry) {
        let sub = registry.sub_registry_with_prefix("gpuplace_deviceplugin");
        sub.register(
            "allocations",
            "Allocate container requests served",
            self.allocations.clone(),
        );
        sub.register(
            "allocation_errors",
            "Allocate and preferred-allocation requests refused, by reason",
            self.allocation_errors.clone(),
        );
        sub.register(
            "preferred_allocations",
            "GetPreferredAllocation container requests served",
            self.preferred_allocations.clone(),
        );
        sub.register(
            "registrations",
            "Successful registrations with the kubelet",
            self.registrations.clone(),
        );
        sub.register(
            "registration_failures",
            "Failed registration attempts (kubelet absent or refusing)",
            self.registration_failures.clone(),
        );
        sub.register(
            "device_healthy",
            "1 when the device is healthy",
            self.device_healthy.clone(),
        );
        sub.register(
            "devices",
            "Devices advertised to the kubelet",
            self.devices.clone(),
        );
        sub.register(
            "handshake",
            "Handshake steps by result: planned (the plan answered), planned_busy (a planned device was not on offer), ambiguous, no_plan, list, list_cached, allocate_differs, allocated_written, ...",
            self.handshake.clone(),
        );
        sub.register(
            "allocation_mismatches",
            "Containers whose kubelet devices differ from the scheduler's assignment",
            self.mismatches.clone(),
        );
        sub.register(
            "preferred_allocation_seconds",
            "GetPreferredAllocation time in the plugin (identification and answer), by whether it waited for the pod watch",
            self.preferred_seconds.clone(),
        );
        sub.register(
            "registered",
            "1 while the plugin is registered with the kubelet",
            self.registered.clone(),
        );
    }

    pub fn handshake(&self, result: &str) {
        self.handshake
            .get_or_create(&ResultLabel {
                result: result.to_string(),
            })
            .inc();
    }

    pub fn preferred_seconds(&self, waited_for_watch: bool, seconds: f64) {
        self.preferred_seconds
            .get_or_create(&WaitedLabel {
                waited_for_watch: waited_for_watch.to_string(),
            })
            .observe(seconds);
    }

    pub fn error(&self, reason: &str) {
        self.allocation_errors
            .get_or_create(&ReasonLabel {
                reason: reason.to_string(),
            })
            .inc();
    }
}

/// Renders the registry in the Prometheus text format.
pub fn render(registry: &Registry) -> String {
    let mut out = String::new();
    // Writing into a String cannot fail.
    let _ = prometheus_client::encoding::text::encode(&mut out, registry);
    out
}

/// `/healthz`: 200 while registered with the kubelet; 503 otherwise (the kubelet's socket
/// is gone or refuses us), so a probe can tell a plugin the kubelet does not hear.
pub fn health(metrics: &Metrics) -> Result<&'static str, &'static str> {
    if metrics.registered.get() > 0 {
        Ok("ok: registered with the kubelet")
    } else {
        Err("not registered with the kubelet")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn health_follows_the_registration() {
        let m = Metrics::default();
        assert!(health(&m).is_err());
        m.registered.set(1);
        assert!(health(&m).is_ok());
        m.registered.set(0);
        assert!(health(&m).is_err());
    }
}
