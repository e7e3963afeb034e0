//! The extender's judgement of the candidate nodes for one pod: the scheduler's filter
//! stage (node filters, extended resources, volumes, filters about other pods), then core's
//! fit or score per candidate, preferences, and the node gpuplace would choose.

use std::sync::Arc;

use gpuplace_core::Placer;

use crate::framework::filter::{Filtered, VerdictCache};
use crate::framework::volumes::VolumeIndex;
use crate::framework::{FilterInput, Profile};
use crate::k8s::pod_info::PodInfo;
use crate::snapshot::Snapshot;

/// One candidate's verdict.
pub(super) enum Verdict {
    /// Fits, ranked by (preference sum, policy score).
    Fits((i64, i64)),
    /// Fails where preemption could help (resources).
    Fails(Arc<str>),
    /// Fails where no preemption helps (taints, selectors, volumes, models, unknown).
    Unresolvable(Arc<str>),
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
}

impl Parts<'_> {
    /// The verdict on each named candidate, and the one gpuplace would choose.
    pub(super) fn evaluate(
        &mut self,
        pod: &Arc<PodInfo>,
        names: &[String],
        resource: &str,
        need: Need,
    ) -> Verdicts {
        let Some(snapshot) = self.snapshot else {
            return Verdicts::all_unresolvable(names.len(), "gpuplace's cache is not synced yet");
        };
        let index: Vec<Option<usize>> = names.iter().map(|n| snapshot.node_index(n)).collect();
        let demand = match &pod.demand {
            Ok(d) => d,
            Err(e) => {
                return Verdicts::all_unresolvable(names.len(), e);
            }
        };
        let node_filter = self.verdicts.get(snapshot, pod);
        let profile = Profile {
            volumes: self.volumes,
        };
        let filtered = profile.filter(
            &node_filter,
            &FilterInput {
                snapshot,
                scalars: &snapshot.scalars,
                pod,
                demand,
                planned: &[],
            },
        );
        let mut filtered: Filtered = match filtered {
            Ok(f) => f.into_owned(),
            Err(why) => {
                return Verdicts::all_unresolvable(names.len(), &why);
            }
        };
        // Only the candidates kube-scheduler sent are ours to choose among.
        let mut candidates = vec![false; snapshot.nodes.len()];
        for n in index.iter().flatten() {
            candidates[*n] = true;
        }
        let (rejected_why, allowed): (Vec<Option<String>>, Vec<bool>) = index
            .iter()
            .map(|n| match n {
                Some(n) => (filtered.why(*n).map(String::from), filtered.allows(*n)),
                None => (None, false),
            })
            .unzip();
        let rejected_why: Vec<Option<&str>> = rejected_why.iter().map(|w| w.as_deref()).collect();
        // Usually every node is a candidate: then no mask is needed, and core answers from
        // its ranking of node classes instead of scanning them.
        if candidates.iter().any(|c| !c) {
            filtered.restrict(&candidates);
        }
        // Preference sums, computed once: prioritize ranks by them, and mode best chooses
        // among the fitting candidates with the best sum (as the scheduler's own
        // `with_preferences` narrows).
        let preference = crate::framework::preference::wanted(
            pod,
            snapshot.preferring_pods > 0,
            snapshot.soft_taint_nodes > 0,
        )
        .then(|| {
            let placed = crate::framework::interpod::Placed {
                nodes: &snapshot.nodes,
                pods: &snapshot.placed,
                extra: &[],
            };
            let mask: Vec<bool> = (0..snapshot.nodes.len())
                .map(|n| filtered.allows(n))
                .collect();
            (
                crate::framework::preference::scores(&placed, pod, &mask),
                mask,
            )
        });
        // Per candidate: the policy's score (prioritize) or only whether it fits (filter).
        let present: Vec<usize> = index.iter().flatten().copied().collect();
        let mut fits: std::vec::IntoIter<Result<i64, gpuplace_core::FitFailure>> = if need.scores {
            self.placer
                .score_nodes(&snapshot.state, &demand.request, &present)
        } else {
            present
                .iter()
                .map(|&n| snapshot.state.fit(n, &demand.request).map(|()| 0))
                .collect()
        }
        .into_iter();
        let best = if need.best {
            let narrowed = preference.as_ref().and_then(|(scores, mask)| {
                crate::framework::preference::best_nodes(scores, mask, |n| {
                    snapshot.state.fit(n, &demand.request).is_ok()
                })
            });
            let mask = narrowed.as_deref().or(filtered.mask());
            self.placer
                .choose(&snapshot.state, &demand.request, mask)
                .ok()
                .and_then(|d| index.iter().position(|n| *n == Some(d.node)))
        } else {
            None
        };
        let asked = gpuplace_core::Asked::of(&demand.request);
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
        let nodes = index
            .iter()
            .zip(rejected_why.into_iter().zip(allowed))
            .map(|(n, (why, allowed))| {
                let Some(n) = n else {
                    return Verdict::Unresolvable(text(NOT_CACHED));
                };
                let fit = fits.next();
                if !allowed {
                    let why = why.unwrap_or("node(s) were filtered out");
                    return if unresolvable(why) {
                        Verdict::Unresolvable(text(why))
                    } else {
                        Verdict::Fails(text(why))
                    };
                }
                match fit {
                    Some(Ok(score)) => {
                        let pref = preference.as_ref().map_or(0, |(p, _)| p[*n]);
                        Verdict::Fits((pref, score))
                    }
                    Some(Err(failure)) => {
                        let why = text(&failure.phrase_for(resource, &asked));
                        if unresolvable_fit(failure) {
                            Verdict::Unresolvable(why)
                        } else {
                            Verdict::Fails(why)
                        }
                    }
                    None => Verdict::Unresolvable(text(NOT_CACHED)),
                }
            })
            .collect();
        Verdicts { nodes, best }
    }
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
