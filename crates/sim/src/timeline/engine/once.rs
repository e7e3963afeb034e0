//! Each node once per pass over a list of node indices that may repeat (a journal of
//! changes): a mark per node holding the last pass that met it, so a pass costs what its
//! list costs and no set is built.

#[derive(Debug, Default)]
pub(super) struct OncePerPass {
    marks: Vec<u64>,
    pass: u64,
}

impl OncePerPass {
    /// Starts a pass over a cluster of `nodes` nodes.
    pub(super) fn begin(&mut self, nodes: usize) {
        self.pass += 1;
        self.marks.resize(nodes, 0);
    }

    /// Whether this pass meets node `n` for the first time (a node out of range: no).
    pub(super) fn first(&mut self, n: usize) -> bool {
        let pass = self.pass;
        self.marks
            .get_mut(n)
            .is_some_and(|m| std::mem::replace(m, pass) != pass)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_is_met_once_a_pass() {
        let mut once = OncePerPass::default();
        once.begin(3);
        let met: Vec<bool> = [0, 2, 0, 2, 1, 5].iter().map(|&n| once.first(n)).collect();
        assert_eq!(met, vec![true, true, false, false, true, false]);
        once.begin(3);
        assert!(once.first(0) && !once.first(0));
    }
}
