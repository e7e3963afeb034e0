//! Fragmentation as FGD measures it (Weng et al., ATC '23).
//!
//! A node's fragmentation under a target workload M is the expected idle GPU milli that a
//! pod drawn from M could not use there: F_n(M) = sum over shapes m of p_m * f_n(m).

use std::collections::HashMap;

use gpuplace_model::{NodeInventory, Request};

use crate::node_state::NodeState;

/// A pod shape as fragmentation sees it: memory is left out, as in the paper.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Shape {
    pub cpu_milli: u64,
    pub gpu_milli: u32,
    pub gpu_count: u32,
    /// Allowed models joined by `|`, empty for any (kept as one key, as the paper does).
    pub models: String,
}

impl Shape {
    /// The shape of a request.
    pub fn of(request: &Request) -> Self {
        Shape {
            cpu_milli: request.cpu_milli,
            gpu_milli: request.gpu_milli,
            gpu_count: request.gpu_count,
            models: request.allowed_models.join("|"),
        }
    }

    fn allows(&self, model: &str) -> bool {
        self.models.is_empty() || self.models.split('|').any(|m| m == model)
    }
}

/// The typical pods M with their probabilities p_m.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TargetWorkload {
    shapes: Vec<(Shape, f64)>,
    /// The GPU shapes as (per-GPU milli, CPU milli, shape index), smallest milli first: what
    /// [`TargetWorkload::stranded_of`] searches.
    by_milli: Vec<(u32, u64, usize)>,
    /// The smallest per-GPU milli a kept share shape asks (`None`: no shares in the
    /// workload).
    share_floor: Option<u32>,
    /// CPU milli the GPU shapes ask per milli-GPU, weighted by probability.
    cpu_per_gpu_milli: f64,
    /// Every multi-GPU shape seen (the coverage cut's rare ones too), with the weight the
    /// `gpuplace` policy adds to FGD's: counted once per GPU it asks instead of once per
    /// pod (see [`TargetWorkload::multi_fragmentation_of`]).
    multi: Vec<(Shape, f64)>,
}

/// Shapes are kept in batches of this many until coverage is reached (the paper's
/// experiments ran with `podIncreaseStep: 1`).
const SHAPE_STEP: usize = 1;

/// The fraction of share pods, smallest shares first, whose sizes do not set the share
/// floor (see [`TargetWorkload::share_floor`]).
pub const RARE_SHARES: f64 = 0.01;

/// The share floor of shapes weighted by pod count or probability.
fn share_floor<'a>(shapes: impl Iterator<Item = (&'a Shape, f64)>) -> Option<u32> {
    let mut shares: Vec<(u32, f64)> = shapes
        .filter(|(s, w)| s.gpu_count == 1 && s.gpu_milli < 1000 && *w > 0.0)
        .map(|(s, w)| (s.gpu_milli, w))
        .collect();
    shares.sort_by_key(|&(milli, _)| milli);
    let total: f64 = shares.iter().map(|(_, w)| w).sum();
    let mut seen = 0.0;
    for &(milli, w) in &shares {
        seen += w;
        if seen > RARE_SHARES * total {
            return Some(milli);
        }
    }
    shares.last().map(|&(milli, _)| milli)
}

/// How many pods have each shape, kept up to date pod by pod (a pod added, changed or gone
/// costs one update), so FGD's target workload is derived in time proportional to the
/// shapes, not the pods.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ShapeCounts {
    counts: HashMap<Shape, u64>,
}

impl ShapeCounts {
    pub fn add(&mut self, request: &Request) {
        *self.counts.entry(Shape::of(request)).or_default() += 1;
    }

    /// A pod counted by [`add`](Self::add) is gone (a shape never added is ignored).
    pub fn remove(&mut self, request: &Request) {
        let shape = Shape::of(request);
        if let Some(count) = self.counts.get_mut(&shape) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                self.counts.remove(&shape);
            }
        }
    }

    /// Pods counted.
    pub fn total(&self) -> u64 {
        self.counts.values().sum()
    }

    /// The workload of the pods counted, as [`TargetWorkload::from_requests`] gives it.
    pub fn workload(&self, coverage: f64) -> TargetWorkload {
        TargetWorkload::from_counts(&self.counts, coverage)
    }
}

impl TargetWorkload {
    /// Most popular shapes of `requests` (CPU-only ones included) covering at least
    /// `coverage` of pods (the paper uses 0.95); probabilities renormalised over the kept
    /// shapes.
    pub fn from_requests<'a>(
        requests: impl IntoIterator<Item = &'a Request>,
        coverage: f64,
    ) -> Self {
        let mut counts = ShapeCounts::default();
        for request in requests {
            counts.add(request);
        }
        counts.workload(coverage)
    }

    /// [`from_requests`](Self::from_requests) from the pods' shapes already counted.
    fn from_counts(counts: &HashMap<Shape, u64>, coverage: f64) -> Self {
        let total: u64 = counts.values().sum();
        let mut ranked: Vec<(Shape, u64)> = counts
            .iter()
            .filter(|(_, c)| **c > 0)
            .map(|(s, c)| (s.clone(), *c))
            .collect();
        // Most popular first; equal counts ordered by shape, largest first (deterministic).
        ranked.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| b.0.cmp(&a.0)));
        let wanted = coverage * total as f64;
        let mut kept = 0usize;
        let mut covered = 0u64;
        while (covered as f64) < wanted && kept < ranked.len() {
            let upto = (kept + SHAPE_STEP).min(ranked.len());
            covered += ranked[kept..upto].iter().map(|(_, c)| *c).sum::<u64>();
            kept = upto;
        }
        let covered = covered.max(1) as f64;
        let shapes: Vec<(Shape, f64)> = ranked[..kept]
            .iter()
            .map(|(s, c)| (s.clone(), *c as f64 / covered))
            .collect();
        // The floor is read from every share seen, the rare ones the coverage drops too.
        let floor = share_floor(ranked.iter().map(|(s, c)| (s, *c as f64)));
        // A k-GPU shape weighs k times its pods on the same scale; what FGD already counts
        // of it (once per pod, if the cut kept it) is not added twice.
        let multi = ranked
            .iter()
            .enumerate()
            .filter(|(_, (s, _))| s.gpu_count > 1)
            .map(|(i, (s, c))| {
                let counted = if i < kept { 1.0 } else { 0.0 };
                let weight = (f64::from(s.gpu_count) - counted) * *c as f64 / covered;
                (s.clone(), weight)
            })
            .collect();
        let mut workload = Self::indexed(shapes, floor);
        workload.multi = multi;
        workload
    }

    /// The workload with its lookups built.
    fn indexed(shapes: Vec<(Shape, f64)>, share_floor: Option<u32>) -> Self {
        let mut by_milli: Vec<(u32, u64, usize)> = shapes
            .iter()
            .enumerate()
            .filter(|(_, (s, _))| s.gpu_count > 0)
            .map(|(i, (s, _))| (s.gpu_milli, s.cpu_milli, i))
            .collect();
        by_milli.sort_unstable();
        let (cpu, gpu) =
            shapes
                .iter()
                .filter(|(s, _)| s.gpu_count > 0)
                .fold((0.0, 0.0), |(c, g), (s, p)| {
                    (
                        c + p * s.cpu_milli as f64,
                        g + p * f64::from(s.gpu_count) * f64::from(s.gpu_milli),
                    )
                });
        TargetWorkload {
            shapes,
            by_milli,
            share_floor,
            cpu_per_gpu_milli: if gpu > 0.0 { cpu / gpu } else { 0.0 },
            multi: Vec::new(),
        }
    }

    /// A workload from explicit shapes and weights (weights are renormalised).
    pub fn from_shapes(shapes: Vec<(Shape, f64)>) -> Self {
        let sum: f64 = shapes.iter().map(|(_, w)| *w).sum();
        let shapes = shapes
            .into_iter()
            .map(|(s, w)| (s, if sum > 0.0 { w / sum } else { 0.0 }))
            .collect::<Vec<_>>();
        let floor = share_floor(shapes.iter().map(|(s, w)| (s, *w)));
        Self::indexed(shapes, floor)
    }

    pub fn shapes(&self) -> &[(Shape, f64)] {
        &self.shapes
    }

    /// The share size below which a partly used GPU's free milli is not expected to be used
    /// again: the smallest share once the rarest shares (`RARE_SHARES`, 1% of share pods,
    /// smallest first) are left out. Counting gaps only the rarest shares could fill makes
    /// the gap balance spread such gaps (on the openb traces a floor at the very smallest
    /// share, 50 milli, left 5.2% of GPU unallocated on the default trace instead of 4.0%).
    pub fn share_floor(&self) -> Option<u32> {
        self.share_floor
    }

    /// CPU milli the workload's GPU pods ask per milli-GPU (probability-weighted).
    pub fn cpu_per_gpu_milli(&self) -> f64 {
        self.cpu_per_gpu_milli
    }

    /// Idle GPU milli on a node with `cpu_free` and per-GPU free milli `gpu_free` that its
    /// CPU cannot feed at the workload's CPU per GPU: idle - cpu_free / (CPU per milli-GPU),
    /// at least 0. Unlike [`stranded_of`](Self::stranded_of) it counts GPUs the CPU left
    /// will starve on average, before no shape at all fits.
    pub fn unfed_of(&self, cpu_free: u64, gpu_free: &[u32]) -> f64 {
        if self.cpu_per_gpu_milli <= 0.0 {
            return 0.0;
        }
        let idle: u64 = gpu_free.iter().map(|&m| u64::from(m)).sum();
        (idle as f64 - cpu_free as f64 / self.cpu_per_gpu_milli).max(0.0)
    }

    /// Idle GPU milli on a node of GPU `model` with `cpu_free` and per-GPU free milli
    /// `gpu_free` that no GPU shape of the workload can use any more: the GPU's free milli
    /// is below every shape's share, or every shape small enough needs more CPU than is
    /// left, or is not allowed on the model. Unlike F_n(M) it does not depend on how likely
    /// a shape is, only on whether any shape could still take the GPU (a GPU counts alone:
    /// multi-GPU shapes need whole GPUs, which a single fitting shape covers).
    pub fn stranded_of(&self, model: &str, cpu_free: u64, gpu_free: &[u32]) -> u64 {
        gpu_free
            .iter()
            .filter(|&&free| free > 0 && !self.usable(model, cpu_free, free))
            .map(|&free| u64::from(free))
            .sum()
    }

    /// Whether some GPU shape fits `free` milli of one GPU with `cpu_free` on `model`.
    fn usable(&self, model: &str, cpu_free: u64, free: u32) -> bool {
        self.by_milli
            .iter()
            .take_while(|(milli, _, _)| *milli <= free)
            .any(|&(_, cpu, i)| cpu <= cpu_free && self.shapes[i].0.allows(model))
    }

    /// F_n(M) for a node in state `state`, in milli-GPU.
    pub fn node_fragmentation(&self, node: &NodeInventory, state: &NodeState) -> f64 {
        self.fragmentation_of(node.gpu_model(), state.cpu_free, &state.gpu_free)
    }

    /// F_n(M) for a node of GPU `model` with `cpu_free` and per-GPU free milli `gpu_free`.
    pub fn fragmentation_of(&self, model: &str, cpu_free: u64, gpu_free: &[u32]) -> f64 {
        weighted_fragmentation(&self.shapes, model, cpu_free, gpu_free)
    }

    /// What the `gpuplace` policy adds to F_n(M) on a node of GPU `model` with `cpu_free`
    /// and per-GPU free milli `gpu_free`: every multi-GPU shape of the pods seen, weighted
    /// by the GPUs it asks (a 1-GPU pod counts once, an 8-GPU pod eight times), less what
    /// F_n(M) already counts of it. FGD's per-pod probabilities and coverage cut leave rare
    /// multi-GPU shapes out, so it sees no difference between filling a partly used node
    /// and breaking a free one; over time the pods it strands that way are the 8-GPU ones.
    pub fn multi_fragmentation_of(&self, model: &str, cpu_free: u64, gpu_free: &[u32]) -> f64 {
        weighted_fragmentation(&self.multi, model, cpu_free, gpu_free)
    }
}

/// sum over `shapes` of weight * f_n(shape): the idle GPU milli each shape could not use
/// (all of it where the shape does not fit, else the GPUs too small for its share).
fn weighted_fragmentation(
    shapes: &[(Shape, f64)],
    model: &str,
    cpu_free: u64,
    gpu_free: &[u32],
) -> f64 {
    let idle: u64 = gpu_free.iter().map(|&m| u64::from(m)).sum();
    if idle == 0 || shapes.is_empty() {
        return 0.0;
    }
    let idle = idle as f64;
    let mut frag = 0.0;
    for (shape, p) in shapes {
        if shape.gpu_count == 0 || !shape.allows(model) {
            frag += p * idle;
            continue;
        }
        let mut fitting = 0u32;
        let mut below = 0u64;
        for &free in gpu_free {
            if free >= shape.gpu_milli {
                fitting += 1;
            } else {
                below += u64::from(free);
            }
        }
        if fitting >= shape.gpu_count && cpu_free >= shape.cpu_milli {
            frag += p * below as f64;
        } else {
            frag += p * idle;
        }
    }
    frag
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(cpu: u64, count: u32, milli: u32) -> Request {
        Request {
            cpu_milli: cpu,
            memory_mib: 0,
            gpu_count: count,
            gpu_milli: milli,
            allowed_models: vec![],
            need: Default::default(),
        }
    }

    #[test]
    fn memory_is_not_part_of_a_shape() {
        let mut a = req(1000, 1, 500);
        let mut b = a.clone();
        a.memory_mib = 1;
        b.memory_mib = 2;
        let m = TargetWorkload::from_requests(&[a, b], 0.95);
        assert_eq!(m.shapes().len(), 1);
        assert_eq!(m.shapes()[0].1, 1.0);
    }

    #[test]
    fn paper_example_one_shape() {
        // One shape asking 500 milli: a GPU with 300 free is a fragment, 600 is not.
        let m = TargetWorkload::from_requests(&[req(1000, 1, 500)], 0.95);
        assert_eq!(m.fragmentation_of("T4", 4000, &[300, 600]), 300.0);
        // Without CPU for the shape every idle milli is a fragment.
        assert_eq!(m.fragmentation_of("T4", 500, &[300, 600]), 900.0);
        // A fully used node has no fragment.
        assert_eq!(m.fragmentation_of("T4", 500, &[0, 0]), 0.0);
    }

    #[test]
    fn cpu_only_and_disallowed_shapes_count_all_idle() {
        let mut v100 = req(0, 1, 1000);
        v100.allowed_models = vec!["V100M16".into()];
        let m = TargetWorkload::from_shapes(vec![
            (Shape::of(&req(1000, 0, 0)), 1.0),
            (Shape::of(&v100), 1.0),
        ]);
        assert_eq!(m.fragmentation_of("T4", 4000, &[1000]), 1000.0);
        assert_eq!(m.fragmentation_of("V100M16", 4000, &[1000]), 500.0);
    }

    #[test]
    fn stranded_milli_counts_what_no_shape_can_use() {
        let mut v100 = req(2000, 1, 1000);
        v100.allowed_models = vec!["V100M16".into()];
        let m = TargetWorkload::from_shapes(vec![
            (Shape::of(&req(4000, 1, 300)), 1.0),
            (Shape::of(&req(1000, 1, 500)), 1.0),
            (Shape::of(&v100), 1.0),
            (Shape::of(&req(8000, 0, 0)), 1.0),
        ]);
        assert_eq!(m.share_floor(), Some(300));
        // 200 free is below every share; 400 takes the 300 share with 4 cores.
        assert_eq!(m.stranded_of("T4", 4000, &[200, 400, 0]), 200);
        // With 3 cores the 300 share no longer fits: 400 is stranded too; 600 still takes
        // the 500 share (1 core). A whole GPU of T4 is usable by the 500 share.
        assert_eq!(m.stranded_of("T4", 3000, &[200, 400, 600, 1000]), 600);
        // With no CPU nothing is usable.
        assert_eq!(m.stranded_of("T4", 0, &[1000, 600]), 1600);
        // The V100-only shape is the only one that fits 2 cores and a whole GPU.
        assert_eq!(m.stranded_of("V100M16", 900, &[1000]), 1000);
        assert_eq!(m.stranded_of("V100M16", 2000, &[1000]), 0);
        let per = (4000.0 + 1000.0 + 2000.0) / (300.0 + 500.0 + 1000.0);
        assert!((m.cpu_per_gpu_milli() - per).abs() < 1e-9);
        // 7,000 CPU milli feed 1,800 GPU milli: of 2,000 idle, 200 are unfed.
        assert!((m.unfed_of(7000, &[1000, 1000]) - 200.0).abs() < 1e-6);
        assert_eq!(m.unfed_of(8000, &[1000, 1000]), 0.0);
        assert_eq!(TargetWorkload::default().unfed_of(0, &[1000]), 0.0);
        assert_eq!(TargetWorkload::default().share_floor(), None);
    }

    #[test]
    fn coverage_keeps_the_most_popular_shapes() {
        // 100 pods: 90 of one shape, 2 of another, then 8 singles; 95% coverage needs
        // 90 + 2 + 3 singles, so five shapes.
        let mut pods = vec![req(1000, 1, 1000); 90];
        pods.extend(vec![req(5000, 1, 1000); 2]);
        for i in 0..8 {
            pods.push(req(2000 + i, 1, 1000));
        }
        let m = TargetWorkload::from_requests(&pods, 0.95);
        assert_eq!(m.shapes().len(), 5);
        let sum: f64 = m.shapes().iter().map(|(_, p)| p).sum();
        assert!((sum - 1.0).abs() < 1e-9);
        assert_eq!(m.shapes()[0].0.cpu_milli, 1000);
        // The share floor leaves out the rarest 1% of share pods (smallest first): one 110
        // share in 100 does not set it; three do, although the coverage keeps only 500.
        let mut shares = vec![req(1000, 1, 500); 99];
        shares.push(req(1000, 1, 110));
        let m = TargetWorkload::from_requests(&shares, 0.95);
        assert_eq!(m.shapes().len(), 1);
        assert_eq!(m.share_floor(), Some(500));
        let mut shares = vec![req(1000, 1, 500); 97];
        shares.extend(vec![req(1000, 1, 110); 3]);
        let m = TargetWorkload::from_requests(&shares, 0.95);
        assert_eq!(m.shapes().len(), 1);
        assert_eq!(m.share_floor(), Some(110));
    }
}
