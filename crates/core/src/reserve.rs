//! The part of each GPU model's free capacity that pods restricted to models will need: the
//! `gpuplace` policy's *reserve*.
//!
//! FGD measures fragments, not supply: a whole GPU taken by a pod that could have run on any
//! model costs it nothing, even when pods that can run only on that model will arrive and
//! find none left. The reserve of model m is c_m · F, where F is the cluster's free GPU milli
//! and c_m the share of the workload's GPU request that is restricted to models and falls on
//! m (a shape allowed on several models is split in proportion to their capacity): if the
//! rest of the cluster is asked for in the workload's proportions, that much of it must be
//! m. A pod that could run elsewhere pays for the milli it takes out of m's free capacity
//! below the reserve; above it, m has room for everyone and costs nothing.

use std::collections::HashMap;

use gpuplace_model::{NodeInventory, Request};

use crate::frag::TargetWorkload;

/// Free GPU milli per model and the restricted share of the bound workload per model.
#[derive(Clone, Debug, Default)]
pub struct ModelReserve {
    /// Per node: the index of its GPU model in `free` and `share`.
    model_of: Vec<u32>,
    models: Vec<String>,
    /// Free milli per model.
    free: Vec<u64>,
    /// c_m: the share of the workload's GPU request restricted to models that falls on m.
    share: Vec<f64>,
    /// Whether any share is positive (otherwise nothing is reserved and nobody pays).
    active: bool,
}

impl ModelReserve {
    /// Per-model free milli of `nodes` whose free milli per node are `free`; nothing reserved.
    pub(crate) fn new(nodes: &[NodeInventory], free: impl Iterator<Item = u64>) -> Self {
        let mut index: HashMap<&str, u32> = HashMap::new();
        let mut models = Vec::new();
        let model_of = nodes
            .iter()
            .map(|node| {
                let model = node.gpu_model();
                *index.entry(model).or_insert_with(|| {
                    models.push(model.to_string());
                    (models.len() - 1) as u32
                })
            })
            .collect::<Vec<u32>>();
        let mut per_model = vec![0u64; models.len()];
        for (&m, f) in model_of.iter().zip(free) {
            per_model[m as usize] += f;
        }
        ModelReserve {
            model_of,
            share: vec![0.0; models.len()],
            models,
            free: per_model,
            active: false,
        }
    }

    /// Reads the shares c_m from `workload`, splitting a shape allowed on several models in
    /// proportion to their capacity (`capacity` per node, in node order).
    pub(crate) fn bind(&mut self, workload: &TargetWorkload, capacity: impl Iterator<Item = u64>) {
        let mut supply = vec![0u64; self.models.len()];
        for (&m, c) in self.model_of.iter().zip(capacity) {
            supply[m as usize] += c;
        }
        let mut share = vec![0.0; self.models.len()];
        let mut total = 0.0;
        for (shape, p) in workload.shapes() {
            if shape.gpu_count == 0 {
                continue;
            }
            let asked = p * f64::from(shape.gpu_count) * f64::from(shape.gpu_milli);
            total += asked;
            if shape.models.is_empty() {
                continue;
            }
            let allowed: Vec<usize> = shape
                .models
                .split('|')
                .filter_map(|name| self.models.iter().position(|m| m == name))
                .collect();
            let room: u64 = allowed.iter().map(|&m| supply[m]).sum();
            for &m in &allowed {
                if room > 0 {
                    share[m] += asked * supply[m] as f64 / room as f64;
                }
            }
        }
        if total > 0.0 {
            share.iter_mut().for_each(|s| *s /= total);
        }
        self.active = share.iter().any(|&s| s > 0.0);
        self.share = share;
    }

    /// Whether some model is reserved for restricted pods.
    pub fn active(&self) -> bool {
        self.active
    }

    /// Free GPU milli per model, as kept.
    pub fn free_per_model(&self) -> impl Iterator<Item = (&str, u64)> {
        self.models
            .iter()
            .map(String::as_str)
            .zip(self.free.iter().copied())
    }

    /// Records that node `n`'s free GPU milli went from `before` to `after`.
    pub(crate) fn update(&mut self, n: usize, before: u64, after: u64) {
        let m = self.model_of[n] as usize;
        self.free[m] = (self.free[m] + after).saturating_sub(before);
    }

    /// Milli of `taken` from node `n`'s model that `request` would take out of the model's
    /// reserve, given `cluster_free` free milli in the whole cluster. Pods allowed on one
    /// model only are what the reserve is for and never pay.
    pub fn cut(&self, n: usize, request: &Request, cluster_free: u64) -> f64 {
        if !self.active || request.allowed_models.len() == 1 {
            return 0.0;
        }
        let m = self.model_of[n] as usize;
        let taken = request.total_gpu_milli() as f64;
        let reserve = self.share[m] * cluster_free as f64;
        let left = self.free[m] as f64 - taken;
        (reserve - left).clamp(0.0, taken)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frag::Shape;

    fn req(count: u32, milli: u32, models: &[&str]) -> Request {
        Request {
            cpu_milli: 1000,
            memory_mib: 0,
            gpu_count: count,
            gpu_milli: milli,
            allowed_models: models.iter().map(|m| m.to_string()).collect(),
            need: Default::default(),
        }
    }

    #[test]
    fn flexible_pods_pay_for_what_they_take_below_the_reserve() {
        // 4 T4 and 12 V100 GPUs; half of the request wants T4 only.
        let nodes = vec![
            NodeInventory::uniform("t4", 64_000, 1024, 4, "T4"),
            NodeInventory::uniform("v100", 64_000, 1024, 12, "V100"),
        ];
        let mut reserve = ModelReserve::new(&nodes, [4000, 12_000].into_iter());
        let workload = TargetWorkload::from_shapes(vec![
            (Shape::of(&req(1, 1000, &["T4"])), 1.0),
            (Shape::of(&req(1, 1000, &[])), 1.0),
        ]);
        reserve.bind(&workload, [4000, 12_000].into_iter());
        assert!(reserve.active());
        // Reserve of T4 = 0.5 * 16,000 = 8,000 > 4,000 free: every milli taken is cut.
        let any = req(1, 1000, &[]);
        assert_eq!(reserve.cut(0, &any, 16_000), 1000.0);
        assert_eq!(reserve.cut(1, &any, 16_000), 0.0);
        // The pods the reserve is for never pay; pods allowed on two models do.
        assert_eq!(reserve.cut(0, &req(1, 1000, &["T4"]), 16_000), 0.0);
        assert_eq!(
            reserve.cut(0, &req(1, 1000, &["T4", "V100"]), 16_000),
            1000.0
        );
        // With 4,000 free in the cluster, all of it T4, the reserve is 2,000: taking 1,000
        // of 4,000 leaves 3,000, above it; taking 3,000 leaves 1,000, cutting 1,000.
        reserve.update(1, 12_000, 0);
        assert_eq!(reserve.cut(0, &any, 4000), 0.0);
        assert_eq!(reserve.cut(0, &req(3, 1000, &[]), 4000), 1000.0);
        // A share of a model split between two models counts in proportion to capacity.
        let split = TargetWorkload::from_shapes(vec![
            (Shape::of(&req(1, 1000, &["T4", "V100"])), 1.0),
            (Shape::of(&req(1, 1000, &[])), 3.0),
        ]);
        reserve.bind(&split, [4000, 12_000].into_iter());
        assert!((reserve.share[0] - 0.25 * 0.25).abs() < 1e-12);
        assert!((reserve.share[1] - 0.25 * 0.75).abs() < 1e-12);
    }

    #[test]
    fn without_restricted_shapes_nothing_is_reserved() {
        let nodes = vec![NodeInventory::uniform("a", 64_000, 1024, 2, "T4")];
        let mut reserve = ModelReserve::new(&nodes, [2000].into_iter());
        let workload = TargetWorkload::from_shapes(vec![(Shape::of(&req(1, 500, &[])), 1.0)]);
        reserve.bind(&workload, [2000].into_iter());
        assert!(!reserve.active());
        assert_eq!(reserve.cut(0, &req(1, 1000, &[]), 2000), 0.0);
    }
}
