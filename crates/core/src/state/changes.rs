//! Changes to a [`ClusterState`]: a request taken on a node, or given back.

use gpuplace_model::Request;

use super::{ClusterState, StateError, class_of};

impl ClusterState {
    /// Whether [`apply`](Self::apply) would take `request` on node `n` with `gpus`.
    pub fn can_apply(&self, n: usize, request: &Request, gpus: &[(usize, u32)]) -> bool {
        let Some(s) = self.state.get(n) else {
            return false;
        };
        self.check_gpus(n, gpus).is_ok()
            && s.cpu_free >= request.cpu_milli
            && s.memory_free >= request.memory_mib
            && gpus.iter().all(|&(g, milli)| s.gpu_free[g] >= milli)
    }

    /// Takes `request` on node `n` with `gpus` (position, milli); refuses any overcommit.
    pub fn apply(
        &mut self,
        n: usize,
        request: &Request,
        gpus: &[(usize, u32)],
    ) -> Result<(), StateError> {
        if n >= self.state.len() {
            return Err(StateError::NodeOutOfRange(n));
        }
        self.check_gpus(n, gpus)?;
        let s = &self.state[n];
        let over = |what: &str| StateError::OverCommit {
            node: self.nodes[n].name.clone(),
            what: what.to_string(),
        };
        if s.cpu_free < request.cpu_milli {
            return Err(over("cpu"));
        }
        if s.memory_free < request.memory_mib {
            return Err(over("memory"));
        }
        for &(g, milli) in gpus {
            if s.gpu_free[g] < milli {
                return Err(over(&format!("gpu {g}")));
            }
        }
        let s = &mut self.state[n];
        s.cpu_free -= request.cpu_milli;
        s.memory_free -= request.memory_mib;
        let mut taken = 0u64;
        for &(g, milli) in gpus {
            let before = s.gpu_free[g];
            s.gpu_free[g] -= milli;
            self.gaps.update(s.gpu_capacity[g], before, s.gpu_free[g]);
            taken += u64::from(milli);
        }
        if let Some(class) = class_of(request) {
            match s.classes.iter_mut().find(|(c, _)| *c == class) {
                Some(entry) => entry.1 += 1,
                None => s.classes.push((class, 1)),
            }
        }
        s.version += 1;
        self.note_change(n);
        self.gpu_free_milli -= taken;
        let idle = self.state[n].gpu_idle();
        self.reserve.update(n, idle + taken, idle);
        self.refresh_frag(n);
        Ok(())
    }

    /// Gives back what [`apply`](Self::apply) took; refuses to release more than is allocated.
    pub fn release(
        &mut self,
        n: usize,
        request: &Request,
        gpus: &[(usize, u32)],
    ) -> Result<(), StateError> {
        if n >= self.state.len() {
            return Err(StateError::NodeOutOfRange(n));
        }
        self.check_gpus(n, gpus)?;
        let inv = &self.nodes[n];
        let s = &self.state[n];
        let over = |what: &str| StateError::OverRelease {
            node: inv.name.clone(),
            what: what.to_string(),
        };
        if s.cpu_free + request.cpu_milli > inv.cpu_milli {
            return Err(over("cpu"));
        }
        if s.memory_free + request.memory_mib > inv.memory_mib {
            return Err(over("memory"));
        }
        for &(g, milli) in gpus {
            if s.gpu_free[g] + milli > inv.gpus[g].milli_capacity {
                return Err(over(&format!("gpu {g}")));
            }
        }
        let s = &mut self.state[n];
        s.cpu_free += request.cpu_milli;
        s.memory_free += request.memory_mib;
        let mut given = 0u64;
        for &(g, milli) in gpus {
            // An unhealthy GPU keeps 0 usable; its share returns when it heals.
            if s.gpu_capacity[g] > 0 {
                let before = s.gpu_free[g];
                s.gpu_free[g] += milli;
                self.gaps.update(s.gpu_capacity[g], before, s.gpu_free[g]);
                given += u64::from(milli);
            }
        }
        if let Some(class) = class_of(request) {
            if let Some(entry) = s.classes.iter_mut().find(|(c, _)| *c == class) {
                entry.1 = entry.1.saturating_sub(1);
            }
            s.classes.retain(|(_, count)| *count > 0);
        }
        s.version += 1;
        self.note_change(n);
        self.gpu_free_milli += given;
        let idle = self.state[n].gpu_idle();
        self.reserve.update(n, idle - given, idle);
        self.refresh_frag(n);
        Ok(())
    }
}
