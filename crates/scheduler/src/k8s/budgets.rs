//! PodDisruptionBudgets (policy/v1) as preemption reads them: which budgets cover a pod
//! and how many disruptions each still allows (`status.disruptionsAllowed`, as the
//! disruption controller last computed it; pods it lists as already disrupted do not take
//! another), as kube-scheduler's DefaultPreemption counts them.

use std::sync::Arc;

use k8s_openapi::api::policy::v1::PodDisruptionBudget;

use crate::k8s::pod_info::PodInfo;
use crate::k8s::selector::selects;

/// The budgets of a view, ready to match pods.
#[derive(Debug, Default)]
pub struct Budgets {
    budgets: Vec<Arc<PodDisruptionBudget>>,
}

impl Budgets {
    pub fn new(budgets: &[Arc<PodDisruptionBudget>]) -> Budgets {
        Budgets {
            budgets: budgets.to_vec(),
        }
    }

    /// Disruptions each budget allows now (0 before the controller has written a status).
    pub fn allowed(&self) -> Vec<i32> {
        self.budgets
            .iter()
            .map(|b| {
                b.status
                    .as_ref()
                    .and_then(|s| s.disruptions_allowed)
                    .unwrap_or(0)
                    .max(0)
            })
            .collect()
    }

    /// Indices of the budgets covering `pod`: same namespace, the selector selects its
    /// labels (an empty selector selects every pod of the namespace, a missing one none),
    /// and not already counted as disrupted.
    pub fn covering(&self, pod: &PodInfo) -> Vec<usize> {
        if self.budgets.is_empty() {
            return Vec::new();
        }
        self.budgets
            .iter()
            .enumerate()
            .filter(|(_, b)| {
                b.metadata.namespace.as_deref() == Some(pod.key.namespace.as_str())
                    && selects(
                        b.spec.as_ref().and_then(|s| s.selector.as_ref()),
                        &pod.labels,
                    )
                    && !b
                        .status
                        .as_ref()
                        .and_then(|s| s.disrupted_pods.as_ref())
                        .is_some_and(|d| d.contains_key(&pod.key.name))
            })
            .map(|(i, _)| i)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn budget(
        namespace: &str,
        selector: serde_json::Value,
        allowed: i32,
    ) -> Arc<PodDisruptionBudget> {
        Arc::new(
            serde_json::from_value(json!({
                "metadata": {"name": "b", "namespace": namespace},
                "spec": {"selector": selector, "minAvailable": 1},
                "status": {"disruptionsAllowed": allowed, "currentHealthy": 1,
                    "desiredHealthy": 1, "expectedPods": 1,
                    "disruptedPods": {"gone": "2026-01-01T00:00:00Z"}}
            }))
            .unwrap(),
        )
    }

    fn pod(name: &str, labels: serde_json::Value) -> PodInfo {
        PodInfo::from_pod(
            &serde_json::from_value(json!({
                "metadata": {"name": name, "namespace": "ml", "labels": labels},
                "spec": {"containers": []}
            }))
            .unwrap(),
            "nvidia.com/gpu",
        )
    }

    #[test]
    fn budgets_cover_pods_of_their_namespace_by_selector() {
        let budgets = Budgets::new(&[
            budget("ml", json!({"matchLabels": {"app": "train"}}), 1),
            budget("other", json!({}), 2),
            budget("ml", json!({}), -1),
        ]);
        assert_eq!(budgets.allowed(), vec![1, 2, 0]);
        assert_eq!(
            budgets.covering(&pod("a", json!({"app": "train"}))),
            vec![0, 2]
        );
        assert_eq!(
            budgets.covering(&pod("b", json!({"app": "serve"}))),
            vec![2]
        );
        assert!(
            budgets
                .covering(&pod("gone", json!({"app": "train"})))
                .is_empty()
        );
    }
}
