//! Defragmentation's state and helpers: the settings, which pods may move, and the places
//! planned for moved pods' replacements ("steers"). The stage that makes room is
//! [`super::make_room`]; the plans are core's ([`gpuplace_core::defrag`]).
//!
//! A pod may move when its controller makes it again (a ReplicaSet, StatefulSet or Job owns
//! it), it opted in (`gpuplace.io/movable: "true"`, a label or annotation from its
//! template), it has run at least the minimum age, it is not terminating, reserved,
//! promised to a preemptor or itself the replacement of a move still being steered; a gang
//! member only with its whole gang. Disruption budgets count as the Eviction API will.
//!
//! A moved pod is evicted; its controller makes a new pod with the same owner and the same
//! requests. The place planned for it is held (the part already free, every round) until
//! such a pod is decided: it is placed on the planned node (the planned GPUs held for it
//! are free then) rather than wherever the policy would put it, and while that node cannot
//! take it yet (the pods there still leaving) it waits for it, its steer kept. A steer
//! nobody claims is dropped after [`DefragConfig::steer_ttl`] (its pod, if it still waits,
//! then goes wherever it fits).

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub use gpuplace_core::defrag::{MAX_MIN_AGE, Mode as DefragMode, Settings};
use gpuplace_core::defrag::{Movables, MoveCandidate, may_move, unit_may_move};
use gpuplace_core::preempt::Holder;
use gpuplace_model::Request;

use super::preempt::Listed;
use crate::api::{ClusterView, PodKey};
use crate::framework::Filtering;
use crate::framework::filter::VerdictCache;
use crate::k8s::pod_info::PodInfo;
use crate::shared::nominations::{Planned, hold_planned};
use crate::snapshot::{Held, Snapshot};

/// A defragmentation setting that cannot be read.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DefragSettingError {
    #[error("{0:?} is not a duration (a number with ms, s, m or h, e.g. 5m, 90s, 1h30m, 0s)")]
    Duration(String),
}

/// Reads a duration as Kubernetes tools write them: `5m`, `90s`, `1h30m`, `250ms`, `0s`.
pub fn parse_duration(text: &str) -> Result<Duration, DefragSettingError> {
    let bad = || DefragSettingError::Duration(text.to_string());
    let mut rest = text.trim();
    if rest.is_empty() {
        return Err(bad());
    }
    let mut total = Duration::ZERO;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(bad)?;
        let value: f64 = rest[..digits].parse().map_err(|_| bad())?;
        rest = &rest[digits..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let seconds = match &rest[..unit_len] {
            "ms" => value / 1000.0,
            "s" => value,
            "m" => value * 60.0,
            "h" => value * 3600.0,
            _ => return Err(bad()),
        };
        rest = &rest[unit_len..];
        if !(seconds.is_finite() && seconds < 1e9) {
            return Err(bad());
        }
        total += Duration::from_secs_f64(seconds);
    }
    Ok(total)
}

/// Defragmentation's settings: core's, shared with the simulator, and the scheduler's own.
#[derive(Clone, Debug, PartialEq)]
pub struct DefragConfig {
    pub settings: Settings,
    /// How long a moved pod's planned place waits for its replacement.
    pub steer_ttl: Duration,
}

/// How long a moved pod's planned place waits for its replacement by default.
pub const STEER_TTL: Duration = Duration::from_secs(300);

impl Default for DefragConfig {
    fn default() -> Self {
        DefragConfig {
            settings: Settings::default(),
            steer_ttl: STEER_TTL,
        }
    }
}

/// The place planned for the replacement of a moved pod.
#[derive(Clone, Debug, PartialEq)]
pub struct Steer {
    /// The pod that moved.
    pub moved: PodKey,
    /// Its controller's UID: the replacement has the same.
    pub owner: String,
    pub request: Request,
    pub node: String,
    /// GPU IDs and milli.
    pub gpus: Vec<(String, u32)>,
    pub extended: BTreeMap<String, i64>,
    /// Whom it moved for (`None`: rebalancing).
    pub for_pod: Option<PodKey>,
    pub since: Instant,
    /// The moved pod's queue label (`gpuplace.io/queue`): its queue keeps the place's
    /// amount for the replacement until it is decided.
    pub queue_label: Option<String>,
}

impl Steer {
    /// The place planned for the replacement.
    pub fn planned(&self) -> Planned<'_> {
        Planned {
            node: &self.node,
            request: &self.request,
            gpus: &self.gpus,
            extended: &self.extended,
        }
    }
}

/// Steers in flight.
#[derive(Debug, Default)]
pub struct Steers {
    list: Vec<Steer>,
}

/// Holds the place `steer` planned for its replacement in `snapshot`.
fn hold_steer(snapshot: &mut Snapshot, steer: &Steer) {
    hold_planned(snapshot, hold_key(&steer.moved.uid), &steer.planned());
}

fn hold_key(moved_uid: &str) -> String {
    format!("moved/{moved_uid}")
}

impl Steers {
    pub fn len(&self) -> usize {
        self.list.len()
    }

    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    pub fn push(&mut self, steer: Steer) {
        self.list.push(steer);
    }

    pub fn iter(&self) -> impl Iterator<Item = &Steer> {
        self.list.iter()
    }

    /// Drops the steers older than `ttl`, then holds the others' places in `snapshot`.
    pub fn hold(&mut self, snapshot: &mut Snapshot, now: Instant, ttl: Duration) {
        self.list.retain(|s| now.duration_since(s.since) < ttl);
        for s in &self.list {
            hold_steer(snapshot, s);
        }
    }

    /// Adds `steer`, its planned place held in `snapshot` (when given) for the rest of the
    /// round: no pod decided after the move may take the replacement's place.
    pub fn push_held(&mut self, steer: Steer, snapshot: Option<&mut Snapshot>) {
        if let Some(snapshot) = snapshot {
            hold_steer(snapshot, &steer);
        }
        self.list.push(steer);
    }

    /// Gives back every hold (before the state is kept for the next round).
    pub fn release_all(&self, snapshot: &mut Snapshot) {
        for s in &self.list {
            snapshot.release(&hold_key(&s.moved.uid));
        }
    }

    /// Whether `pod` is a replacement `s` planned a place for (same namespace, owner and
    /// requests).
    fn replaces(s: &Steer, pod: &PodInfo) -> bool {
        let (Some(owner), Ok(demand)) = (pod.controller.as_ref(), pod.demand.as_ref()) else {
            return false;
        };
        s.owner == owner.uid
            && s.moved.namespace == pod.key.namespace
            && s.request == demand.request
    }

    /// Where the steer `pod` is the replacement for stands in the list.
    fn position_for(&self, pod: &PodInfo) -> Option<usize> {
        self.list.iter().position(|s| Self::replaces(s, pod))
    }

    /// The steers `pod` may be the replacement for.
    pub fn matching<'s>(&'s self, pod: &'s PodInfo) -> impl Iterator<Item = &'s Steer> {
        self.list.iter().filter(move |s| Self::replaces(s, pod))
    }

    /// The steer `pod` is the replacement for, left in place.
    pub fn find_for(&self, pod: &PodInfo) -> Option<&Steer> {
        self.list.iter().find(|s| Self::replaces(s, pod))
    }

    /// The steer `pod` is the replacement for, taken out with its hold given back.
    pub fn take_for(&mut self, pod: &PodInfo, snapshot: &mut Snapshot) -> Option<Steer> {
        let i = self.position_for(pod)?;
        let steer = self.list.swap_remove(i);
        snapshot.release(&hold_key(&steer.moved.uid));
        Some(steer)
    }

    /// Puts back a steer whose replacement could not be placed there.
    pub fn restore(&mut self, steer: Steer, snapshot: &mut Snapshot) {
        self.push_held(steer, Some(snapshot));
    }
}

/// Pods that may move now, for a plan: core's movables and the pod of each holder.
pub struct MovableSet<'a> {
    pub movables: Movables<'a>,
    pub pods: Vec<Arc<PodInfo>>,
}

/// What decides which pods may move, besides the pods themselves.
pub struct Eligibility<'a> {
    pub min_age: Duration,
    /// The wall clock now (ages are measured from `status.startTime`).
    pub now: k8s_openapi::jiff::Timestamp,
    /// Decided pods whose Binding is in flight, and victims promised to a preemptor.
    pub skip: &'a dyn Fn(&str) -> bool,
}

impl Eligibility<'_> {
    /// Whether `pod` itself may move (its gang aside): core's rule.
    pub fn allows(&self, pod: &PodInfo) -> bool {
        let age = pod.started.map(|started| {
            let ran = self.now.duration_since(started);
            Duration::try_from(ran).unwrap_or(Duration::ZERO)
        });
        let candidate = MoveCandidate {
            opted_in: pod.movable,
            controlled: pod.controller.is_some(),
            bound: pod.is_active_bound(),
            leaving: pod.deleting || (self.skip)(&pod.key.uid),
            age,
        };
        may_move(&candidate, self.min_age)
    }
}

/// The pods of `snapshot` that may move, each with the nodes its own filters allow
/// (its current node included); a gang only whole.
pub fn movable_set<'a>(
    snapshot: &'a Snapshot,
    view: &ClusterView,
    filtering: Filtering<'_>,
    rules: &Eligibility<'_>,
) -> MovableSet<'a> {
    let budgets = crate::k8s::budgets::Budgets::new(&view.budgets);
    let mut out = MovableSet {
        movables: Movables::default(),
        pods: Vec::new(),
    };
    out.movables.candidates.budgets = budgets.allowed();
    let mut verdicts = VerdictCache::default();
    for unit in movable_units(snapshot, view, rules) {
        out.movables.push_unit(
            unit.made,
            unit.members.iter().map(|(p, h)| {
                let holder = Holder {
                    node: h.node,
                    request: &h.request,
                    gpus: &h.gpus,
                    budgets: budgets.covering(p),
                };
                (
                    holder,
                    allowed_nodes(snapshot, filtering, &mut verdicts, p, h.node),
                )
            }),
        );
        out.pods.extend(unit.members.into_iter().map(|(p, _)| p));
    }
    out
}

/// The units of `snapshot` that may move (one pod, or a whole gang), in the cluster's
/// order ([`Listed::sort_in_cluster_order`]).
fn movable_units<'a>(
    snapshot: &'a Snapshot,
    view: &ClusterView,
    rules: &Eligibility<'_>,
) -> Vec<Listed<'a>> {
    let mut gangs: HashSet<(&str, &str)> = HashSet::new();
    let mut out = Vec::new();
    for pod in snapshot.placed.iter().flatten() {
        let Some(held) = snapshot.held.get(&pod.key.uid) else {
            continue;
        };
        if !rules.allows(pod) {
            continue;
        }
        let members = match &pod.group {
            None => vec![(Arc::clone(pod), held)],
            Some(group) => {
                if !gangs.insert((pod.key.namespace.as_str(), group.as_str())) {
                    continue;
                }
                let Some(members) = whole_gang(snapshot, view, pod, rules) else {
                    continue;
                };
                members
            }
        };
        out.push(Listed::of(members));
    }
    Listed::sort_in_cluster_order(&mut out);
    out
}

/// Every active member of `member`'s gang, when the gang may move whole (core's rule; a
/// gang whose PodGroup is gone does not move).
fn whole_gang<'a>(
    snapshot: &'a Snapshot,
    view: &ClusterView,
    member: &PodInfo,
    rules: &Eligibility<'_>,
) -> Option<Vec<(Arc<PodInfo>, &'a Held)>> {
    let members: Vec<(&Arc<PodInfo>, Option<&'a Held>)> = view
        .pods
        .iter()
        .filter(|p| {
            p.key.namespace == member.key.namespace
                && p.group == member.group
                && p.is_active_bound()
        })
        .map(|p| (p, snapshot.held.get(&p.key.uid)))
        .collect();
    // As many running as its PodGroup's minMember (fewer: some finished, and the
    // replacements could not be scheduled together again).
    let min_member = member.group.as_deref().map_or(1, |group| {
        view.groups
            .iter()
            .find(|g| {
                g.metadata.namespace.as_deref() == Some(member.key.namespace.as_str())
                    && g.metadata.name.as_deref() == Some(group)
            })
            .map_or(usize::MAX, |g| g.spec.min_member as usize)
    });
    let whole = unit_may_move(
        members.iter().map(|(p, h)| h.is_some() && rules.allows(p)),
        min_member,
    );
    whole.then(|| {
        members
            .into_iter()
            .filter_map(|(p, h)| Some((Arc::clone(p), h?)))
            .collect()
    })
}

/// The nodes `pod`'s filters allow (its own node always), `None` when every node does.
fn allowed_nodes(
    snapshot: &Snapshot,
    filtering: Filtering<'_>,
    verdicts: &mut VerdictCache,
    pod: &PodInfo,
    here: usize,
) -> Option<Vec<bool>> {
    pod.demand.as_ref().ok()?;
    let v = verdicts.get(snapshot, pod);
    match filtering.filter_alone(snapshot, &v, pod) {
        Ok(f) => f.mask().map(|m| {
            let mut m = m.to_vec();
            if let Some(a) = m.get_mut(here) {
                *a = true;
            }
            m
        }),
        Err(_) => {
            let mut m = vec![false; snapshot.nodes.len()];
            if let Some(a) = m.get_mut(here) {
                *a = true;
            }
            Some(m)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(name: &str, owner: Option<&str>) -> PodInfo {
        let mut v = json!({
            "metadata": {"name": name, "namespace": "ml", "uid": format!("{name}-uid")},
            "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}
        });
        if let Some(o) = owner {
            v["metadata"]["ownerReferences"] = json!([{"apiVersion": "apps/v1",
                "kind": "ReplicaSet", "name": o, "uid": o, "controller": true}]);
        }
        PodInfo::from_pod(&serde_json::from_value(v).unwrap(), "nvidia.com/gpu")
    }

    #[test]
    fn a_planned_place_is_held_until_the_replacement_takes_it() {
        let node: k8s_openapi::api::core::v1::Node = serde_json::from_value(json!({
            "metadata": {"name": "n1"},
            "status": {"allocatable": {"cpu": "8", "memory": "64Gi", "nvidia.com/gpu": "4"}}
        }))
        .unwrap();
        let mut snapshot = crate::snapshot::build(&[Arc::new(node)], &[], "nvidia.com/gpu");
        let gpu = snapshot.state.inventory(0).gpus[2].id.clone();
        let replacement = pod("a2", Some("rs"));
        let request = replacement.demand.as_ref().unwrap().request.clone();
        let mut steers = Steers::default();
        let now = Instant::now();
        steers.push(Steer {
            moved: pod("a", Some("rs")).key,
            owner: "rs".into(),
            request,
            node: "n1".into(),
            gpus: vec![(gpu, 1000)],
            extended: BTreeMap::new(),
            for_pod: None,
            since: now,
            queue_label: None,
        });
        steers.hold(&mut snapshot, now, Duration::from_secs(300));
        assert_eq!(snapshot.state.node(0).gpu_free, vec![1000, 1000, 0, 1000]);
        // Another controller's pod, or a bare one, is not the replacement.
        assert!(
            steers
                .take_for(&pod("b", Some("other")), &mut snapshot)
                .is_none()
        );
        assert!(steers.take_for(&pod("c", None), &mut snapshot).is_none());
        let steer = steers
            .take_for(&replacement, &mut snapshot)
            .expect("steered");
        assert_eq!(steer.node, "n1");
        assert_eq!(snapshot.state.node(0).gpu_free, vec![1000; 4]);
        assert!(steers.is_empty());
        // Unclaimed, a place is given up after the time to live.
        steers.restore(steer, &mut snapshot);
        steers.release_all(&mut snapshot);
        steers.hold(
            &mut snapshot,
            now + Duration::from_secs(301),
            Duration::from_secs(300),
        );
        assert!(steers.is_empty());
        assert_eq!(snapshot.state.node(0).gpu_free, vec![1000; 4]);
    }

    #[test]
    fn a_place_held_while_its_pods_leave_holds_what_is_free_and_the_replacement_gets_its_gpus() {
        let node: k8s_openapi::api::core::v1::Node = serde_json::from_value(json!({
            "metadata": {"name": "n1"},
            "status": {"allocatable": {"cpu": "8", "memory": "64Gi", "nvidia.com/gpu": "4"}}
        }))
        .unwrap();
        let mut snapshot = crate::snapshot::build(&[Arc::new(node)], &[], "nvidia.com/gpu");
        let gpus: Vec<String> = snapshot
            .state
            .inventory(0)
            .gpus
            .iter()
            .map(|g| g.id.clone())
            .collect();
        // A pod still leaving holds 300 of GPU 2.
        let leaving = Request {
            gpu_count: 1,
            gpu_milli: 300,
            ..Request::default()
        };
        snapshot.state.apply(0, &leaving, &[(2, 300)]).unwrap();
        let replacement = pod("a2", Some("rs"));
        let request = replacement.demand.as_ref().unwrap().request.clone();
        let now = Instant::now();
        let steer = Steer {
            moved: pod("a", Some("rs")).key,
            owner: "rs".into(),
            request: request.clone(),
            node: "n1".into(),
            gpus: vec![(gpus[2].clone(), 1000)],
            extended: BTreeMap::new(),
            for_pod: None,
            since: now,
            queue_label: None,
        };
        let mut steers = Steers::default();
        steers.push_held(steer, Some(&mut snapshot));
        assert_eq!(
            snapshot.state.node(0).gpu_free,
            vec![1000, 1000, 0, 1000],
            "the free 700 is held: nothing else lands on the planned GPU meanwhile"
        );
        let steer = steers
            .take_for(&replacement, &mut snapshot)
            .expect("steered");
        // Still leaving: the planned GPU has no room, so the policy chooses on the node.
        let planned = steer
            .planned()
            .decision_in(&snapshot)
            .expect("on the snapshot");
        assert_eq!(planned.gpus, vec![(2, 1000)]);
        assert!(
            !snapshot
                .state
                .can_apply(planned.node, &request, &planned.gpus)
        );
        // Gone: the replacement gets the GPU the plan counted on.
        snapshot.state.release(0, &leaving, &[(2, 300)]).unwrap();
        assert!(
            snapshot
                .state
                .can_apply(planned.node, &request, &planned.gpus)
        );
    }

    #[test]
    fn durations_read_as_kubernetes_writes_them() {
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("0s"), Ok(Duration::ZERO));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        for bad in ["", "5", "m", "5x", "-1s", "1e99h"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
        assert_eq!("all".parse(), Ok(DefragMode::All));
        assert!("sometimes".parse::<DefragMode>().is_err());
    }
}
