//! The extender's judgement of the candidate nodes for one pod: the scheduler's filter
//! stage (node filters, extended resources, volumes, filters about other pods), then core's
//! fit or score per candidate, preferences, and the node gpuplace would choose.

use std::sync::Arc;

use gpuplace_core::{Placer, cycle};

use crate::framework::filter::{Filtered, VerdictCache};
use crate::framework::volumes::VolumeIndex;
use crate::framework::{FilterInput, Profile};
use crate::k8s::demand::PodDemand;
use crate::k8s::pod_info::PodInfo;
use crate::shared::members::Alone;
use crate::snapshot::Snapshot;

use super::last_judgement::LastJudgement;
use super::names::Names;
use super::wire::Picked;

/// One candidate's verdict.
pub(super) enum Verdict {
    /// Fits, ranked by (preference sum, policy score).
    Fits((i64, i64)),
    /// Fails where preemption could help (resources).
    Fails(Arc<str>),
    /// Fails where no preemption helps (taints, selectors, volumes, models, unknown).
    Unresolvable(Arc<str>),
}

impl Verdict {
    /// The ranking key where the pod fits.
    pub(super) fn key(&self) -> Option<(i64, i64)> {
        match self {
            Verdict::Fits(key) => Some(*key),
            Verdict::Fails(_) | Verdict::Unresolvable(_) => None,
        }
    }
}

/// What a verb needs computed.
#[derive(Clone, Copy)]
pub(super) struct Need {
    /// The policy's score of each fitting candidate (prioritize).
    pub scores: bool,
    /// The candidate gpuplace would choose (filter in mode best).
    pub best: bool,
}

pub(super) struct Verdicts {
    pub nodes: Vec<Verdict>,
    /// The candidate gpuplace would choose.
    pub best: Option<usize>,
}

impl Verdicts {
    /// Whether some candidate fits.
    pub fn any_fits(&self) -> bool {
        self.nodes.iter().any(|v| matches!(v, Verdict::Fits(_)))
    }

    /// Every candidate fails for one reason no preemption can change.
    fn all_unresolvable(count: usize, why: &str) -> Verdicts {
        let why: Arc<str> = Arc::from(why);
        Verdicts {
            nodes: (0..count)
                .map(|_| Verdict::Unresolvable(Arc::clone(&why)))
                .collect(),
            best: None,
        }
    }
}

/// What a judgement reads and the caches it keeps.
pub(super) struct Parts<'a> {
    pub snapshot: Option<&'a Snapshot>,
    pub placer: &'a mut Placer,
    pub verdicts: &'a mut VerdictCache,
    pub volumes: &'a VolumeIndex,
    /// The filters and preferences, as configured.
    pub profile: &'a Profile,
    pub names: &'a mut NameIndex,
    /// The last judgement, for prioritize after filter of the same pod.
    pub last: &'a mut LastJudgement,
    /// The extender's count of changes to its state (judgements are kept per count).
    pub state: u64,
}

/// The state's index of each candidate name, remembered for the lists of recent calls:
/// kube-scheduler sends its nodes in the same order call after call (all of them, a
/// rotating window, or the ones that passed filter), so the same list usually comes again
/// (one comparison of the name buffers answers it) or a name is found a step or two past
/// the previous one by comparing strings, sparing a hash lookup per node. A name not found
/// nearby is looked up and the walk continues from its remembered place. Valid for one
/// build of the state (the extender drops it when the state is built anew).
#[derive(Default)]
pub(super) struct NameIndex {
    /// The longest recent list: names are matched by position against it.
    longest: Remembered,
    /// The list of the call before, when another (filter's candidates, then the ones that
    /// passed for prioritize): answered whole when it comes again (shared, not
    /// copied). Its name buffer is reused call after call (a rotating window sends a new
    /// list each time).
    other: Other,
}

#[derive(Default)]
struct Other {
    names: Names,
    index: Arc<[Option<usize>]>,
}

#[derive(Default)]
struct Remembered {
    names: Names,
    index: Arc<[Option<usize>]>,
    /// Position in `names` of each node of the state (`u32::MAX`: not in `names`).
    position: Vec<u32>,
}

/// Places past the previous match compared before a name is looked up.
const LOOKAHEAD: usize = 3;

impl NameIndex {
    /// The state's index of each of `names` (`None`: not in the state).
    pub(super) fn lookup(&mut self, snapshot: &Snapshot, names: &Names) -> Arc<[Option<usize>]> {
        if *names == self.longest.names {
            return Arc::clone(&self.longest.index);
        }
        if self.other.names == *names {
            return Arc::clone(&self.other.index);
        }
        let longest = &self.longest;
        let mut out = Vec::with_capacity(names.len());
        let mut next = 0usize;
        let mut misses = 0usize;
        for name in names.iter() {
            let end = (next + LOOKAHEAD).min(longest.names.len());
            if let Some(i) = (next..end).find(|&i| longest.names.get(i) == name) {
                out.push(longest.index[i]);
                next = i + 1;
                continue;
            }
            misses += 1;
            let n = snapshot.node_index(name);
            if let Some(&at) = n.and_then(|n| longest.position.get(n))
                && at != u32::MAX
            {
                next = at as usize + 1;
            }
            out.push(n);
        }
        let out: Arc<[Option<usize>]> = Arc::from(out);
        if misses > 0 && names.len() >= self.longest.names.len() {
            let mut position = vec![u32::MAX; snapshot.nodes.len()];
            for (i, n) in out.iter().enumerate() {
                if let Some(p) = n.and_then(|n| position.get_mut(n)) {
                    *p = i as u32;
                }
            }
            self.longest = Remembered {
                names: names.clone(),
                index: Arc::clone(&out),
                position,
            };
        } else {
            self.other.names.clone_from(names);
            self.other.index = Arc::clone(&out);
        }
        out
    }
}

/// The pod's preference sums over the nodes the filters allow, and that mask.
struct Preferences {
    scores: Vec<i64>,
    mask: Vec<bool>,
}

impl Parts<'_> {
    /// The verdict on each named candidate, and the one gpuplace would choose.
    pub(super) fn evaluate(
        &mut self,
        pod: &Arc<PodInfo>,
        names: &Names,
        resource: &str,
        need: Need,
    ) -> Verdicts {
        let Some(snapshot) = self.snapshot else {
            return Verdicts::all_unresolvable(names.len(), "gpuplace's cache is not synced yet");
        };
        let index = self.names.lookup(snapshot, names);
        let demand = match &pod.demand {
            Ok(d) => d,
            Err(e) => return Verdicts::all_unresolvable(names.len(), e),
        };
        let mut filtered = match self.filter(snapshot, pod, demand) {
            Ok(f) => f,
            Err(why) => return Verdicts::all_unresolvable(names.len(), &why),
        };
        // Only the candidates kube-scheduler sent are ours to choose among. Usually every
        // node is a candidate: then no mask is needed, and core answers from its ranking of
        // node classes instead of scanning them. (Restricting leaves the candidates' own
        // verdicts as they were.)
        let mut candidates = vec![false; snapshot.nodes.len()];
        let mut present: Vec<usize> = Vec::with_capacity(index.len());
        for &n in index.iter().flatten() {
            candidates[n] = true;
            present.push(n);
        }
        if present.len() < candidates.len() || candidates.iter().any(|c| !c) {
            filtered.restrict(&candidates);
        }
        let preferences = preferences(snapshot, pod, &filtered);
        // Per candidate: the policy's score (prioritize) or only whether it fits (filter).
        let fits = if need.scores {
            self.placer
                .score_nodes(&snapshot.state, &demand.request, &present)
        } else {
            self.placer
                .fit_nodes(&snapshot.state, &demand.request, &present)
                .into_iter()
                .map(|fit| fit.map(|()| 0))
                .collect()
        };
        let best = need
            .best
            .then(|| self.best(snapshot, demand, &filtered, preferences.as_ref()))
            .flatten()
            .and_then(|best| index.iter().position(|n| *n == Some(best)));
        let nodes = verdicts_of(
            &index,
            &filtered,
            fits,
            preferences.as_ref().map(|p| &p.scores[..]),
            resource,
            &gpuplace_core::Asked::of(&demand.request),
        );
        // Preference sums are scaled over the allowed candidates (as kube-scheduler
        // normalizes over the feasible nodes): prioritize's own candidates would scale
        // them otherwise, so a judgement with preferences is not kept.
        if need.scores && preferences.is_none() {
            let keys = nodes.iter().map(Verdict::key);
            self.last.record(pod, self.state, names, keys);
        } else {
            self.last.clear();
        }
        Verdicts { nodes, best }
    }

    /// Each candidate's key (preference sum, policy score) where the pod fits: from the
    /// last judgement when it was about this pod on this state and covered them all
    /// (prioritize after filter in mode all), else judged now. `picked`: where the names
    /// stood in filter's candidates, when they came back as filter's answer wrote them.
    pub(super) fn keys(
        &mut self,
        pod: &Arc<PodInfo>,
        names: &Names,
        picked: Option<&Picked>,
        resource: &str,
    ) -> Vec<Option<(i64, i64)>> {
        if let Some(keys) = self.last.recall(pod, self.state, names, picked) {
            return keys;
        }
        let need = Need {
            scores: true,
            best: false,
        };
        self.evaluate(pod, names, resource, need)
            .nodes
            .iter()
            .map(Verdict::key)
            .collect()
    }

    /// The profile's filters over every node.
    fn filter(
        &mut self,
        snapshot: &Snapshot,
        pod: &Arc<PodInfo>,
        demand: &PodDemand,
    ) -> Result<Filtered, String> {
        let node_filter = self.verdicts.get(snapshot, pod);
        let input = FilterInput::alone(snapshot, self.volumes, pod, demand);
        self.profile
            .filter(&node_filter, &input)
            .map(|f| f.into_owned())
    }

    /// The node gpuplace would choose among the fitting candidates with the best
    /// preference sum (as the scheduler's own `with_preferences` narrows).
    fn best(
        &mut self,
        snapshot: &Snapshot,
        demand: &PodDemand,
        filtered: &Filtered,
        preferences: Option<&Preferences>,
    ) -> Option<usize> {
        let narrowed = preferences.and_then(|p| {
            crate::framework::preference::best_nodes(&p.scores, &p.mask, |n| {
                snapshot.state.fit(n, &demand.request).is_ok()
            })
        });
        let mut chosen = Alone {
            state: &snapshot.state,
            request: &demand.request,
            mask: narrowed.as_deref().or(filtered.mask()),
        };
        // Score as core's cycle scores a pod alone (nothing is reserved: kube-scheduler
        // binds through this extender later).
        let trial = cycle::place::trial(&mut chosen, self.placer, None);
        trial.placed.first().map(|(_, node)| *node)
    }
}

/// Preference sums, computed once when the pod or the cluster has preferences: prioritize
/// ranks by them, and mode best chooses among the candidates with the best sum.
fn preferences(snapshot: &Snapshot, pod: &PodInfo, filtered: &Filtered) -> Option<Preferences> {
    let wanted = crate::framework::preference::wanted(
        pod,
        snapshot.preferring_pods > 0,
        snapshot.soft_taint_nodes > 0,
    );
    wanted.then(|| {
        let placed = crate::framework::interpod::Placed {
            nodes: &snapshot.nodes,
            pods: &snapshot.placed,
            extra: &[],
        };
        let mask: Vec<bool> = (0..snapshot.nodes.len())
            .map(|n| filtered.allows(n))
            .collect();
        Preferences {
            scores: crate::framework::preference::scores(&placed, pod, &mask),
            mask,
        }
    })
}

/// Each named candidate's verdict, from the filters' judgement and core's fit or score (one
/// per candidate in the cache, in order).
fn verdicts_of(
    index: &[Option<usize>],
    filtered: &Filtered,
    fits: Vec<Result<i64, gpuplace_core::FitFailure>>,
    preferences: Option<&[i64]>,
    resource: &str,
    asked: &gpuplace_core::Asked,
) -> Vec<Verdict> {
    // Thousands of nodes fail for a handful of reasons: one shared text per reason.
    let mut texts: Vec<Arc<str>> = Vec::new();
    let mut text = |phrase: &str| -> Arc<str> {
        match texts.iter().find(|t| &***t == phrase) {
            Some(t) => Arc::clone(t),
            None => {
                let t: Arc<str> = Arc::from(phrase);
                texts.push(Arc::clone(&t));
                t
            }
        }
    };
    let mut phrases: Vec<(gpuplace_core::FitFailure, Arc<str>)> = Vec::new();
    let mut fits = fits.into_iter();
    index
        .iter()
        .map(|n| {
            let Some(n) = n else {
                return Verdict::Unresolvable(text(NOT_CACHED));
            };
            let fit = fits.next();
            if !filtered.allows(*n) {
                let why = filtered.why(*n).unwrap_or("node(s) were filtered out");
                return if unresolvable(why) {
                    Verdict::Unresolvable(text(why))
                } else {
                    Verdict::Fails(text(why))
                };
            }
            match fit {
                Some(Ok(score)) => Verdict::Fits((preferences.map_or(0, |p| p[*n]), score)),
                Some(Err(failure)) => {
                    // One phrase per kind of failure: thousands of full nodes, one text.
                    let why = match phrases.iter().find(|(f, _)| *f == failure) {
                        Some((_, why)) => Arc::clone(why),
                        None => {
                            let why = text(&failure.phrase_for(resource, asked));
                            phrases.push((failure, Arc::clone(&why)));
                            why
                        }
                    };
                    if unresolvable_fit(failure) {
                        Verdict::Unresolvable(why)
                    } else {
                        Verdict::Fails(why)
                    }
                }
                None => Verdict::Unresolvable(text(NOT_CACHED)),
            }
        })
        .collect()
}

const NOT_CACHED: &str = "node is not in gpuplace's cache";

/// Whether a filter's rejection is beyond what preemption could change: the node's
/// taints, labels, cordon or a volume's node affinity (resources, ports and other pods'
/// terms could be freed by evicting pods).
pub(super) fn unresolvable(phrase: &str) -> bool {
    phrase.starts_with("node(s) had untolerated taint")
        || phrase.starts_with("node(s) didn't match Pod's node affinity")
        || phrase.starts_with("node(s) were unschedulable")
        || phrase == crate::framework::volumes::NODE_CONFLICT
        || phrase.contains("missing required label")
}

/// Whether a fit failure is beyond what preemption could change (the node's GPUs are not
/// what the pod needs, whatever runs there).
fn unresolvable_fit(failure: gpuplace_core::FitFailure) -> bool {
    use gpuplace_core::FitFailure::*;
    matches!(failure, NoGpus | ModelNotAllowed | GpuMemoryTooSmall)
}

/// The first of `pod`'s ways to meet its claims (its claims' `firstAvailable` subrequests,
/// `demand` being the first way's, `None` when the first way asks all of a node's GPUs)
/// that fits on the nodes `only` allows: that way's demand and the decision, else why the
/// first way tried does not fit (`None`: no way was tried).
pub(super) fn choose_way(
    placer: &mut Placer,
    state: &gpuplace_core::ClusterState,
    pod: &PodInfo,
    demand: Option<PodDemand>,
    only: &[bool],
) -> Result<(PodDemand, gpuplace_core::Decision), Option<gpuplace_core::Unschedulable>> {
    let mut first = None;
    if let Some(demand) = demand {
        match placer.choose(state, &demand.request, Some(only)) {
            Ok(decision) => return Ok((demand, decision)),
            Err(why) => first = Some(why),
        }
    }
    let sizes = crate::k8s::dra::store::node_sizes(state);
    for way in crate::k8s::dra::store::alternatives(pod, &sizes) {
        let Ok(d) = &way.demand else { continue };
        match placer.choose(state, &d.request, Some(only)) {
            Ok(decision) => return Ok((d.clone(), decision)),
            Err(why) => {
                first.get_or_insert(why);
            }
        }
    }
    Err(first)
}
