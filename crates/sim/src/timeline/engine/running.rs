//! The running jobs, kept three ways: all of them (in an order that changes only where a
//! job leaves, the last one taking its place), by node (with each job's unit, so that a
//! walk over a node's pods reads no job), and by unit (a gang's members, listed in the
//! cluster's order as the scheduler lists a gang's pods by name; a moved pod's
//! replacement with the unit of the pod it replaces). The victim search reads the nodes
//! where evictions could make room and the units found there, instead of every running job.
//! A fourth view keeps them in the cluster's order of pods (when each was made), which
//! make-room and rebalancing list movable units in, so that no listing sorts them.

use std::collections::BTreeMap;

use crate::timeline::options::Ms;

/// A running job and its unit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct OnNode {
    pub job: u32,
    pub unit: u32,
}

/// Where a job stands in the cluster's order of pods (see `Engine::made`): when it was
/// made (its arrival, or its controller's re-create), a controller's pod before an
/// arrival of the same instant, then job order (the names the test stack gives).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Made {
    pub at_ms: u64,
    pub arrived: bool,
    pub job: u32,
}

/// What a listing in the cluster's order reads of a running job, kept beside its place
/// in that order so that a walk over thousands of them reads no job record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Started {
    pub unit: u32,
    /// Its unit is this pod alone.
    pub alone: bool,
    /// Its trace pod.
    pub pod: u32,
    /// When it was decided (its Binding in flight until after that instant).
    pub decided: Ms,
    /// When its work began.
    pub work_from: Ms,
}

/// Running jobs, by job index.
#[derive(Debug, Default)]
pub(super) struct Running {
    all: Vec<u32>,
    /// Every running job, in the cluster's order.
    ordered: BTreeMap<Made, Started>,
    /// Per job, its index in `all` (`u32::MAX`: not running).
    at: Vec<u32>,
    /// Per node, its running jobs (in no particular order).
    on_node: Vec<Vec<OnNode>>,
    /// Per unit, its running jobs in the cluster's order.
    of_unit: Vec<Vec<Made>>,
}

impl Running {
    /// Makes room for one more job (not running).
    pub(super) fn add_job(&mut self) {
        self.at.push(u32::MAX);
    }

    /// `job` (of `started.unit`), made as `made` says, started on `node`.
    pub(super) fn start(&mut self, made: Made, node: usize, started: Started) {
        let (job, unit) = (made.job, started.unit);
        self.ordered.insert(made, started);
        self.at[job as usize] = self.all.len() as u32;
        self.all.push(job);
        grow_to(&mut self.on_node, node).push(OnNode { job, unit });
        // Kept in the cluster's order (a unit is a pod or a gang: a short list).
        let members = grow_to(&mut self.of_unit, unit as usize);
        let at = members.partition_point(|m| *m < made);
        members.insert(at, made);
    }

    /// The job `made` names, running, begins its work at `work_from` instead.
    pub(super) fn work_from(&mut self, made: &Made, work_from: Ms) {
        if let Some(started) = self.ordered.get_mut(made) {
            started.work_from = work_from;
        }
    }

    /// The job `made` names, of `unit` on `node`, left; false when it was not running.
    pub(super) fn end(&mut self, made: Made, node: usize, unit: u32) -> bool {
        let job = made.job;
        let at = self.at[job as usize];
        if at == u32::MAX {
            return false;
        }
        self.all.swap_remove(at as usize);
        if let Some(&moved) = self.all.get(at as usize) {
            self.at[moved as usize] = at;
        }
        self.at[job as usize] = u32::MAX;
        self.ordered.remove(&made);
        if let Some(list) = self.on_node.get_mut(node)
            && let Some(i) = list.iter().position(|o| o.job == job)
        {
            list.swap_remove(i);
        }
        if let Some(list) = self.of_unit.get_mut(unit as usize)
            && let Some(i) = list.iter().position(|m| m.job == job)
        {
            list.remove(i);
        }
        true
    }

    /// Every running job.
    pub(super) fn all(&self) -> &[u32] {
        &self.all
    }

    /// Every running job, in the cluster's order of pods (see [`Made`]).
    pub(super) fn in_cluster_order(&self) -> impl Iterator<Item = (u32, &Started)> + '_ {
        self.ordered.iter().map(|(m, s)| (m.job, s))
    }

    /// What was kept of the job `made` names when it started; `None` when it is not
    /// running.
    pub(super) fn started(&self, made: &Made) -> Option<&Started> {
        self.ordered.get(made)
    }

    /// The jobs running on `node`, each with its unit.
    pub(super) fn on(&self, node: usize) -> &[OnNode] {
        self.on_node.get(node).map_or(&[], Vec::as_slice)
    }

    /// The running jobs of `unit`, in the cluster's order (a gang's first member is its
    /// first there, as the scheduler's, whose queue is the gang's), appended to `out`.
    pub(super) fn of_unit_into(&self, unit: u32, out: &mut Vec<u32>) {
        let Some(jobs) = self.of_unit.get(unit as usize) else {
            return;
        };
        out.extend(jobs.iter().map(|m| m.job));
    }
}

fn grow_to<T>(lists: &mut Vec<Vec<T>>, i: usize) -> &mut Vec<T> {
    if lists.len() <= i {
        lists.resize_with(i + 1, Vec::new);
    }
    &mut lists[i]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn made(job: u32, at_ms: u64) -> Made {
        Made {
            at_ms,
            arrived: true,
            job,
        }
    }

    fn started(unit: u32) -> Started {
        Started {
            unit,
            alone: false,
            pod: 0,
            decided: Ms(0),
            work_from: Ms(0),
        }
    }

    /// Room for `jobs` jobs, none running.
    fn with_jobs(jobs: usize) -> Running {
        let mut r = Running::default();
        (0..jobs).for_each(|_| r.add_job());
        r
    }

    fn of_unit(r: &Running, unit: u32) -> Vec<u32> {
        let mut out = Vec::new();
        r.of_unit_into(unit, &mut out);
        out
    }

    #[test]
    fn the_three_views_agree_as_jobs_start_and_leave() {
        let mut r = with_jobs(5);
        r.start(made(0, 5), 1, started(0));
        r.start(made(1, 3), 1, started(1));
        r.start(made(2, 3), 0, started(1));
        r.start(made(3, 1), 2, started(2));
        assert_eq!(r.all(), &[0, 1, 2, 3]);
        let order: Vec<u32> = r.in_cluster_order().map(|(j, _)| j).collect();
        assert_eq!(order, vec![3, 1, 2, 0], "by when made, then job");
        assert!(r.end(made(0, 5), 1, 0));
        assert!(!r.end(made(0, 5), 1, 0), "not running any more");
        // The last took the leaver's place.
        assert_eq!(r.all(), &[3, 1, 2]);
        assert_eq!(r.on(1), &[OnNode { job: 1, unit: 1 }]);
        assert!(r.on(7).is_empty());
        assert_eq!(of_unit(&r, 1), vec![1, 2], "in the cluster's order");
        r.start(made(4, 0), 0, started(1));
        assert!(r.end(made(1, 3), 1, 1));
        assert_eq!(r.all(), &[3, 4, 2]);
        let order: Vec<u32> = r.in_cluster_order().map(|(j, _)| j).collect();
        assert_eq!(order, vec![4, 3, 2]);
        assert_eq!(of_unit(&r, 1), vec![4, 2]);
        assert!(of_unit(&r, 0).is_empty());
        assert!(of_unit(&r, 9).is_empty());
    }

    #[test]
    fn a_units_members_are_listed_in_the_clusters_order_whatever_order_they_started_in() {
        let mut r = with_jobs(4);
        r.start(made(3, 0), 0, started(2));
        r.start(made(2, 7), 1, started(1));
        r.start(made(1, 7), 2, started(1));
        r.end(made(3, 0), 0, 2);
        r.start(made(0, 9), 0, started(1));
        assert_eq!(of_unit(&r, 1), vec![1, 2, 0]);
    }
}
