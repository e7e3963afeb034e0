//! Placing a unit's members on a snapshot (the scheduler's loop, its gang stage and the
//! extender's choice): a unit's members on the round's snapshot, as core's cycle places them
//! ([`gpuplace_core::cycle::place::trial`]): Filter is the profile's filters and
//! preferences (within the gang's domain first), a moved pod's replacement is steered to
//! its planned place, and Reserve takes each member's place on a copy of the state for the
//! members after it (a gang's trial); a single pod's place is reserved by `assume` once
//! Permit allowed it.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use gpuplace_core::cycle::place::{self, Feasible, Nodes};
use gpuplace_core::shortage::shortage;
use gpuplace_core::{ClusterState, Decision, Unschedulable};
use gpuplace_model::Request;

use super::nominations::Planned;
use crate::framework::filter::{Filtered, Verdicts};
use crate::framework::{FilterInput, Filtering};
use crate::k8s::demand::PodDemand;
use crate::k8s::pod_info::PodInfo;
use crate::snapshot::{Scalars, Snapshot};

/// Moved members' planned places (their steers), by pod UID.
pub type Steered<'p> = HashMap<String, Planned<'p>>;

/// Nominated members' nodes (of the plan that evicted or moved pods for them), by pod UID,
/// as the round's snapshot's node indexes.
pub type Nominated = HashMap<String, usize>;

/// A member placed in a trial.
pub struct Trialled<'a> {
    pub pod: &'a Arc<PodInfo>,
    pub demand: PodDemand,
    pub decision: Decision,
}

/// What Filter and the preferences left for a member.
pub struct Kept<'v>(Cow<'v, Filtered>);

impl Feasible for Kept<'_> {
    fn mask(&self) -> Option<&[bool]> {
        self.0.mask()
    }
}

/// A unit's members on one snapshot, within one domain.
pub struct OnSnapshot<'s, 'a> {
    pub snapshot: &'s Snapshot,
    /// The profile, with the round's claims and volumes.
    pub filtering: Filtering<'s>,
    pub members: Vec<(&'a Arc<PodInfo>, &'s Verdicts)>,
    demands: Vec<Result<PodDemand, String>>,
    /// The nodes of the gang's topology domain (`None`: every node).
    pub domain: Option<&'s [bool]>,
    pub steered: &'s Steered<'s>,
    /// Nominated members' nodes, tried first (`None`: none).
    pub nominated: Option<&'s Nominated>,
    /// The state the members are decided on: the snapshot's for a single pod, a copy that
    /// each member's Reserve takes from for a gang.
    state: Cow<'s, ClusterState>,
    scalars: Cow<'s, Scalars>,
    /// Members placed so far, for the terms about other pods.
    planned: Vec<(usize, Arc<PodInfo>)>,
    /// Time spent in Filter.
    pub filter_time: Duration,
    /// What the last member that fit nowhere was found short of, and the nodes its filters
    /// left (why it waits is told from it: nothing computed twice).
    pub unfit: std::cell::RefCell<Option<UnfitFound>>,
}

/// A member that fits nowhere: its GPU shortage (none when GPUs are not what it lacks) over
/// the nodes its filters left (`None`: every node).
#[derive(Clone, Debug)]
pub struct UnfitFound {
    pub shortage: Option<gpuplace_core::shortage::Shortage>,
    /// With no GPU shortage: CPU or memory, when some node it may use lacks them.
    pub short_of: Option<gpuplace_core::waiting::Resource>,
    /// Its DRA claims' selectors ruled out some node.
    pub by_claim_selectors: bool,
    pub mask: Option<Vec<bool>>,
    /// A moved pod's replacement waiting for its planned node (by index): what it lacks
    /// there is the pods still leaving it, not the cluster's room.
    pub planned_node: Option<usize>,
}

/// The phrase that counts, in a waiting replacement's message, the nodes it is not tried on.
const NOT_ITS_PLANNED_NODE: &str = "node(s) were not its planned node";

/// Where a member's Reserve takes its place.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReserveOn {
    /// A copy of the snapshot's state, for the members after it (a gang's trial).
    Copy,
    /// Nowhere yet: the scheduler's `assume` reserves a single pod once Permit allowed it.
    Assume,
}

impl<'s, 'a> OnSnapshot<'s, 'a> {
    /// `members` on `snapshot`, each member's place reserved as `reserve` says.
    pub fn new(
        snapshot: &'s Snapshot,
        filtering: Filtering<'s>,
        members: Vec<(&'a Arc<PodInfo>, &'s Verdicts)>,
        steered: &'s Steered<'s>,
        reserve: ReserveOn,
    ) -> Self {
        let demands = members.iter().map(|(p, _)| p.demand.clone()).collect();
        let (state, scalars) = if reserve == ReserveOn::Copy {
            (
                Cow::Owned(snapshot.state.clone()),
                Cow::Owned(snapshot.scalars.clone()),
            )
        } else {
            (
                Cow::Borrowed(&snapshot.state),
                Cow::Borrowed(&snapshot.scalars),
            )
        };
        OnSnapshot {
            snapshot,
            filtering,
            members,
            demands,
            domain: None,
            steered,
            nominated: None,
            state,
            scalars,
            planned: Vec::new(),
            filter_time: Duration::ZERO,
            unfit: std::cell::RefCell::new(None),
        }
    }

    /// The fragmentation the trial leaves.
    pub fn frag(&self) -> f64 {
        self.state.total_frag()
    }

    fn steer_of(&self, i: usize) -> Option<&Planned<'s>> {
        self.steered.get(&self.members[i].0.key.uid)
    }
}

impl<'s, 'a> place::Members for OnSnapshot<'s, 'a> {
    type Filtered = Kept<'s>;
    type Placed = Trialled<'a>;
    type Unfit = String;

    fn count(&self) -> usize {
        self.members.len()
    }

    fn state(&self) -> &ClusterState {
        &self.state
    }

    fn request(&self, i: usize) -> Result<&Request, String> {
        match &self.demands[i] {
            Ok(d) => Ok(&d.request),
            Err(e) => Err(e.clone()),
        }
    }

    fn filter(&mut self, i: usize) -> Result<Kept<'s>, String> {
        let started = Instant::now();
        let (pod, verdicts) = self.members[i];
        let demand = self.demands[i].as_ref().map_err(Clone::clone)?;
        let input = FilterInput {
            snapshot: self.snapshot,
            volumes: self.filtering.volumes,
            scalars: &self.scalars,
            pod,
            demand,
            planned: &self.planned,
        };
        let filtered = self.filtering.profile.filter(verdicts, &input);
        let kept = filtered.map(|filtered| {
            let filtered = match self.domain {
                // Within the gang's domain first: preferences then rank inside it.
                Some(d) => {
                    let mut within = filtered.into_owned();
                    within.restrict(d);
                    Cow::Owned(within)
                }
                None => filtered,
            };
            Kept(self.filtering.profile.prefer(filtered, &input, &self.state))
        });
        self.filter_time += started.elapsed();
        kept
    }

    fn steer(&self, i: usize) -> Option<usize> {
        self.steer_of(i)
            .and_then(|st| self.snapshot.node_index(st.node))
    }

    fn planned(&self, i: usize) -> Option<Decision> {
        self.steer_of(i)?.decision_in(self.snapshot)
    }

    fn nominated(&self, i: usize) -> Option<usize> {
        self.nominated?.get(&self.members[i].0.key.uid).copied()
    }

    fn reserve(&mut self, i: usize, chosen: Decision) -> Result<Trialled<'a>, String> {
        let pod = self.members[i].0;
        let demand = self.demands[i].clone()?;
        if let (Cow::Owned(state), Cow::Owned(scalars)) = (&mut self.state, &mut self.scalars) {
            if state
                .apply(chosen.node, &demand.request, &chosen.gpus)
                .is_err()
            {
                return Err("placement could not be applied".into());
            }
            scalars.take(chosen.node, &demand.extended);
            self.planned.push((chosen.node, Arc::clone(pod)));
        }
        Ok(Trialled {
            pod,
            demand,
            decision: chosen,
        })
    }

    /// kube-scheduler's message, then, when GPUs are what it lacks, whether the cluster has
    /// too few free (capacity) or enough only in pieces (fragmentation, with the blocks).
    fn unfit(&self, i: usize, why: Unschedulable, filtered: &Kept<'s>) -> String {
        let short_of = gpuplace_core::waiting::short_of(&why);
        let claims = self.members[i].0.dra.is_some();
        let message =
            self.filtering
                .profile
                .explain(why, &filtered.0, self.snapshot.nodes.len(), claims);
        let Ok(demand) = &self.demands[i] else {
            return message;
        };
        let found = shortage(&self.state, &demand.request, filtered.0.mask());
        let message = match &found {
            Some(s) => {
                let name_of = |n: usize| self.state.inventory(n).name.clone();
                format!("{message} {}", s.sentence(name_of))
            }
            None => message,
        };
        self.unfit.replace(Some(UnfitFound {
            short_of: found.is_none().then_some(short_of).flatten(),
            by_claim_selectors: filtered
                .0
                .rejected
                .keys()
                .any(|p| crate::framework::claim_selectors::is_selector_phrase(p)),
            shortage: found,
            mask: filtered.0.mask().map(<[bool]>::to_vec),
            planned_node: None,
        }));
        message
    }

    /// kube-scheduler's message, the nodes other than its planned one counted as not its
    /// planned node, then that it waits for its planned place there.
    fn awaits_planned(
        &self,
        i: usize,
        node: usize,
        why: Unschedulable,
        filtered: &Kept<'s>,
    ) -> String {
        let nodes = self.snapshot.nodes.len();
        let passed = filtered
            .0
            .mask()
            .map_or(nodes, |m| m.iter().filter(|a| **a).count());
        let mut others = filtered.0.clone().into_owned();
        let elsewhere = passed.saturating_sub(1);
        if elsewhere > 0 {
            others
                .rejected
                .insert(NOT_ITS_PLANNED_NODE.to_string(), elsewhere);
        }
        let claims = self.members[i].0.dra.is_some();
        let message = self.filtering.profile.explain(why, &others, nodes, claims);
        let name = &self.state.inventory(node).name;
        self.unfit.replace(Some(UnfitFound {
            shortage: None,
            short_of: None,
            by_claim_selectors: false,
            mask: Some(place::steer_mask(None, node, nodes)),
            planned_node: Some(node),
        }));
        format!(
            "{message} It replaces a moved pod and waits for the place planned for it on \
             node {name}, held for it while the pods there leave."
        )
    }
}

/// A pod alone whose Filter the driver already ran (`mask`), as core's cycle places it,
/// nothing reserved: the node it would go to. The extender's choice (kube-scheduler binds
/// through it later) and `defrag --plan`'s check of a pending pod use it.
pub struct Alone<'a> {
    pub state: &'a ClusterState,
    pub request: &'a Request,
    pub mask: Option<&'a [bool]>,
}

impl<'a> place::Members for Alone<'a> {
    type Filtered = Nodes<'a>;
    /// The node chosen.
    type Placed = usize;
    type Unfit = ();

    fn count(&self) -> usize {
        1
    }

    fn state(&self) -> &ClusterState {
        self.state
    }

    fn request(&self, _: usize) -> Result<&Request, ()> {
        Ok(self.request)
    }

    fn filter(&mut self, _: usize) -> Result<Nodes<'a>, ()> {
        Ok(Nodes(self.mask))
    }

    fn steer(&self, _: usize) -> Option<usize> {
        None
    }

    fn planned(&self, _: usize) -> Option<Decision> {
        None
    }

    fn nominated(&self, _: usize) -> Option<usize> {
        None
    }

    fn reserve(&mut self, _: usize, chosen: Decision) -> Result<usize, ()> {
        Ok(chosen.node)
    }

    fn unfit(&self, _: usize, _: Unschedulable, _: &Nodes<'a>) {}

    fn awaits_planned(&self, _: usize, _: usize, _: Unschedulable, _: &Nodes<'a>) {}
}
