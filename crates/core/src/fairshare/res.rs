//! Resource amounts a queue holds, asks for or may take: GPU, CPU, memory and per-model
//! GPU, and how they read.

use gpuplace_model::Request;

/// GPU (milli), CPU (milli) and memory (MiB).
pub const DIMS: usize = 3;
/// The resources' names, as a queue's resource lists spell them.
pub const DIM_NAMES: [&str; DIMS] = ["nvidia.com/gpu", "cpu", "memory"];

/// Amounts of every resource, with milli-GPU per GPU model where known.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Res {
    pub dims: [u64; DIMS],
    /// Milli-GPU by GPU model, sorted by model (only the models that have some).
    pub models: Vec<(String, u64)>,
}

impl Res {
    /// What a pod asks: every GPU's milli, its CPU and memory; `model` is the model of the
    /// GPUs it was given (`None` while it waits).
    pub fn of(request: &Request, model: Option<&str>) -> Res {
        let gpu = u64::from(request.gpu_count) * u64::from(request.gpu_milli);
        let mut res = Res {
            dims: [gpu, request.cpu_milli, request.memory_mib],
            models: Vec::new(),
        };
        if let Some(model) = model.filter(|_| gpu > 0) {
            res.models.push((model.to_string(), gpu));
        }
        res
    }

    /// Milli-GPU of `model`.
    pub fn model(&self, model: &str) -> u64 {
        self.models
            .binary_search_by(|(m, _)| m.as_str().cmp(model))
            .map_or(0, |i| self.models[i].1)
    }

    pub fn add(&mut self, other: &Res) {
        for d in 0..DIMS {
            self.dims[d] = self.dims[d].saturating_add(other.dims[d]);
        }
        for (model, amount) in &other.models {
            match self.models.binary_search_by(|(m, _)| m.cmp(model)) {
                Ok(i) => self.models[i].1 = self.models[i].1.saturating_add(*amount),
                Err(i) => self.models.insert(i, (model.clone(), *amount)),
            }
        }
    }

    pub fn sub(&mut self, other: &Res) {
        for d in 0..DIMS {
            self.dims[d] = self.dims[d].saturating_sub(other.dims[d]);
        }
        for (model, amount) in &other.models {
            if let Ok(i) = self.models.binary_search_by(|(m, _)| m.cmp(model)) {
                self.models[i].1 = self.models[i].1.saturating_sub(*amount);
            }
        }
    }

    /// Whether nothing at all.
    pub fn is_zero(&self) -> bool {
        self.dims.iter().all(|&d| d == 0) && self.models.iter().all(|(_, a)| *a == 0)
    }
}

/// A resource amount as people read it: GPUs with up to three decimals, CPUs, memory in
/// GiB or MiB.
pub fn show_amount(dim: usize, amount: u64) -> String {
    match dim {
        0 | 1 => {
            let whole = amount / 1000;
            let frac = amount % 1000;
            if frac == 0 {
                format!("{whole}")
            } else {
                let s = format!("{whole}.{frac:03}");
                s.trim_end_matches('0').to_string()
            }
        }
        _ if amount.is_multiple_of(1024) => format!("{}Gi", amount / 1024),
        _ => format!("{amount}Mi"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn amounts_read_as_people_write_them() {
        assert_eq!(show_amount(0, 16_000), "16");
        assert_eq!(show_amount(0, 2_500), "2.5");
        assert_eq!(show_amount(0, 250), "0.25");
        assert_eq!(show_amount(1, 1_500), "1.5");
        assert_eq!(show_amount(2, 2048), "2Gi");
        assert_eq!(show_amount(2, 100), "100Mi");
    }

    #[test]
    fn res_adds_models_in_order() {
        let mut a = Res::default();
        a.add(&Res {
            dims: [1000, 0, 0],
            models: vec![("V100".into(), 1000)],
        });
        a.add(&Res {
            dims: [500, 0, 0],
            models: vec![("A100".into(), 500)],
        });
        assert_eq!(a.model("A100"), 500);
        assert_eq!(a.model("V100"), 1000);
        assert_eq!(a.dims[0], 1500);
        a.sub(&Res {
            dims: [1000, 0, 0],
            models: vec![("V100".into(), 1000)],
        });
        assert_eq!(a.model("V100"), 0);
        assert_eq!(a.dims[0], 500);
    }
}
