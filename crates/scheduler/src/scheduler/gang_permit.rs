//! The gang stage (kube-scheduler's Permit, done as one trial): every waiting member is
//! placed on a copy of the state; nothing binds unless `minMember` members fit at once.
//! With a topology key (`spec.topologyKey`, or the members' annotation
//! `gpuplace.io/topology-key`), every member lands on nodes sharing one value of that node
//! label, chosen among the values where the gang fits as the one leaving the least
//! fragmentation.

use std::time::Instant;

use gpuplace_core::Decision;

use std::sync::Arc;

use super::gang_status::{Gang, Why, sentence};
use super::post_filter::Outcome;
use super::reclaim::Fair;
use super::{RoundReport, Scheduler};
use crate::api::{ClusterApi, ClusterView};
use crate::framework::filter::{Verdicts, explain};
use crate::framework::{FilterInput, Profile};
use crate::k8s::demand::PodDemand;
use crate::k8s::gang::PodGroupSpec;
use crate::k8s::pod_info::PodInfo;
use crate::snapshot::Snapshot;
use std::borrow::Cow;

pub use gpuplace_model::keys::TOPOLOGY_KEY_ANNOTATION;

/// One domain's trial: the members placed, why the others were not, and the cluster's
/// fragmentation after it.
#[derive(Default)]
struct Trial<'a> {
    planned: Vec<(&'a Arc<PodInfo>, PodDemand, Decision)>,
    failure: Option<String>,
    frag: f64,
}

/// The trial kept over the gang's domains, and why members did not fit where too few did.
struct BestTrial<'a> {
    trial: Trial<'a>,
    failure: Option<String>,
}

/// A gang round where too few members fit.
struct GangAttempt<'g, 'a> {
    gang: &'g Gang,
    members: &'g [(&'a Arc<PodInfo>, Verdicts)],
    domains: &'g [Option<Vec<bool>>],
    /// Members the best trial placed.
    placed: u32,
    failure: Option<String>,
}

fn best_len(best: &Option<Trial<'_>>) -> usize {
    best.as_ref().map_or(0, |b| b.planned.len())
}

impl<A: ClusterApi> Scheduler<A> {
    /// All-or-nothing: place every waiting member on a copy; reserve them all only when
    /// at least `minMember` members (bound and reserved ones included) fit, and only then
    /// hand their Bindings to the bind stage. With queues, `fair` is the gang's queue
    /// and the round's allocations (for reclaim).
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn schedule_gang<U>(
        &mut self,
        snapshot: &mut Snapshot,
        view: &ClusterView,
        (namespace, group): (&str, &str),
        members: Vec<(&Arc<PodInfo>, Verdicts)>,
        fair: Option<Fair<'_, '_, U>>,
        now: Instant,
        report: &mut RoundReport,
    ) {
        let Some(gang) = self.gang_of_view(view, namespace, group) else {
            let reason = format!("pod group {namespace}/{group} does not exist");
            self.refuse_gang(&members, reason, now, report).await;
            return;
        };
        // Try all members on a copy of the state, in each allowed domain (one value of
        // the gang's topology key, or the whole cluster), and keep the domain where enough
        // fit leaving the least fragmentation.
        let domains = match self.domains(
            snapshot,
            &view.pods,
            (namespace, group),
            &gang.spec,
            &members,
        ) {
            Ok(d) => d,
            Err(reason) => {
                self.refuse_gang(&members, reason, now, report).await;
                return;
            }
        };
        // Members that preempted are tried with the devices held for them free; moved
        // members' replacements on the places planned for them (held until now), as a
        // single pod's are.
        let mut steered = Steered::new();
        for (pod, _) in &members {
            self.cluster.free_nominee(&pod.key.uid, snapshot);
            if let Some(steer) = self.steers.take_for(pod, snapshot) {
                steered.insert(pod.key.uid.clone(), steer);
            }
        }
        let best = self.best_trial(snapshot, &members, &domains, &gang, &steered);
        if gang.bound + best.trial.planned.len() as u32 >= gang.spec.min_member {
            let placed: std::collections::HashSet<&str> = best
                .trial
                .planned
                .iter()
                .map(|(p, _, _)| p.key.uid.as_str())
                .collect();
            let left: Vec<(&Arc<PodInfo>, Verdicts)> = members
                .iter()
                .filter(|(p, _)| !placed.contains(p.key.uid.as_str()))
                .map(|(p, v)| (*p, v.clone()))
                .collect();
            let (placed, failure) = (best.trial.planned.len() as u32, best.trial.failure);
            if placed > 0 {
                self.permit_gang(snapshot, &gang, best.trial.planned, report)
                    .await;
            }
            if !left.is_empty() {
                // The gang has its minMember: the members that do not fit now are told so
                // as single pods are, and wait for an event that may make room.
                let why = failure.unwrap_or_else(|| "no node fits it".to_string());
                let reason = format!(
                    "pod group {}: {} of minMember {} member(s) placed; this member does not fit: {}",
                    gang.id,
                    gang.bound + placed,
                    gang.spec.min_member,
                    sentence(&why)
                );
                self.refuse_gang(&left, reason, now, report).await;
            }
            return;
        }
        let attempt = GangAttempt {
            gang: &gang,
            members: &members,
            domains: &domains,
            placed: best.trial.planned.len() as u32,
            failure: best.failure,
        };
        self.gang_does_not_fit(snapshot, view, attempt, fair, now, report)
            .await;
    }

    /// The gang's spec, identity and members already bound or reserved; `None` when its
    /// PodGroup does not exist.
    fn gang_of_view(&self, view: &ClusterView, namespace: &str, group: &str) -> Option<Gang> {
        let spec = view
            .groups
            .iter()
            .find(|g| {
                g.metadata.namespace.as_deref() == Some(namespace)
                    && g.metadata.name.as_deref() == Some(group)
            })
            .map(|g| g.spec.clone())?;
        let id = format!("{namespace}/{group}");
        let bound_uids: std::collections::HashSet<&str> = view
            .pods
            .iter()
            .filter(|p| {
                p.key.namespace == namespace
                    && p.group.as_deref() == Some(group)
                    && p.is_active_bound()
            })
            .map(|p| p.key.uid.as_str())
            .collect();
        // A reservation whose pod the view already shows bound counts once.
        let reserved = self
            .cluster
            .reservations()
            .of_gang(&id)
            .filter(|r| !bound_uids.contains(r.key.uid.as_str()))
            .count();
        let bound = (bound_uids.len() + reserved) as u32;
        Some(Gang {
            id,
            namespace: namespace.to_string(),
            group: group.to_string(),
            spec,
            bound,
        })
    }

    /// The trial to keep over `domains`: among those where enough members fit, the one
    /// leaving the least fragmentation; else the one placing the most members, with why
    /// the others did not fit.
    fn best_trial<'a>(
        &mut self,
        snapshot: &Snapshot,
        members: &[(&'a Arc<PodInfo>, Verdicts)],
        domains: &[Option<Vec<bool>>],
        gang: &Gang,
        steered: &Steered,
    ) -> BestTrial<'a> {
        let (bound, min_member) = (gang.bound, gang.spec.min_member);
        let mut best: Option<Trial> = None;
        let mut failure = None;
        for domain in domains {
            let trial = self.try_members(snapshot, members, domain.as_deref(), steered);
            let enough = bound + trial.planned.len() as u32 >= min_member;
            if !enough {
                if failure.is_none() || trial.planned.len() > best_len(&best) {
                    failure = trial.failure.clone();
                }
                if best.as_ref().is_none_or(|b| {
                    bound + (b.planned.len() as u32) < min_member
                        && trial.planned.len() > b.planned.len()
                }) {
                    best = Some(trial);
                }
                continue;
            }
            let better = match &best {
                Some(b) if bound + b.planned.len() as u32 >= min_member => trial.frag < b.frag,
                _ => true,
            };
            if better {
                best = Some(trial);
            }
        }
        let failure = failure.or_else(|| {
            (domains.is_empty()).then(|| "no node has the gang's topology key".to_string())
        });
        BestTrial {
            trial: best.unwrap_or_default(),
            failure,
        }
    }

    /// Permit: every planned member is reserved before any Binding is sent; nominations
    /// for other nodes end (their `nominatedNodeName` is cleared once the Binding's outcome
    /// is known).
    async fn permit_gang(
        &mut self,
        snapshot: &mut Snapshot,
        gang: &Gang,
        planned: Vec<(&Arc<PodInfo>, PodDemand, Decision)>,
        report: &mut RoundReport,
    ) {
        for (pod, _, decision) in &planned {
            let placement = decision.to_placement(&snapshot.state);
            self.cluster.nominee_decided(&pod.key.uid, &placement);
        }
        let requests: Vec<_> = planned
            .iter()
            .map(|(pod, demand, decision)| {
                self.assume(snapshot, pod, demand, decision, Some(gang.id.clone()))
            })
            .collect();
        report.assumed += requests.len();
        self.gangs.permitted(
            &gang.id,
            &gang.namespace,
            &gang.group,
            gang.bound,
            requests.iter().map(|r| r.pod.uid.as_str()),
        );
        let attempts = self.config.gang_bind_attempts;
        for request in requests {
            self.binder.dispatch(request, attempts, true).await;
        }
    }

    /// Not enough members fit: preempt for them all if that can help (within the gang's
    /// queue), else reclaim from other queues, else make room; else hold nothing, wait,
    /// and after the gang's timeout say why.
    async fn gang_does_not_fit<U>(
        &mut self,
        snapshot: &mut Snapshot,
        view: &ClusterView,
        attempt: GangAttempt<'_, '_>,
        fair: Option<Fair<'_, '_, U>>,
        now: Instant,
        report: &mut RoundReport,
    ) {
        let GangAttempt {
            gang,
            members,
            domains,
            placed,
            failure,
        } = attempt;
        let (bound, min_member) = (gang.bound, gang.spec.min_member);
        let present = bound + members.len() as u32;
        let mut preemption = None;
        if present >= min_member {
            let outcome = self
                .post_filter_gang(snapshot, view, members, domains, fair, report)
                .await;
            for (pod, _) in members {
                self.cluster.hold_nominee(&pod.key.uid, snapshot);
            }
            if matches!(
                outcome,
                Outcome::Nominated { .. }
                    | Outcome::Moving { .. }
                    | Outcome::Reclaimed { .. }
                    | Outcome::Waiting
            ) {
                let reason = format!(
                    "pod group {}: only {} of {min_member} members fit at once",
                    gang.id,
                    bound + placed
                );
                let message = outcome.message(&sentence(&reason), snapshot.nodes.len());
                report.waiting_gangs += 1;
                if !matches!(outcome, Outcome::Waiting) {
                    for (pod, _) in members {
                        self.events
                            .emit(&pod.key, "Warning", "FailedScheduling", message.clone());
                    }
                }
                for (pod, _) in members {
                    self.wait(&pod.key.uid, now, None);
                }
                self.gangs.stop_waiting(&gang.id);
                let why = Why {
                    reason: "NotEnoughResources",
                    message: &message,
                };
                self.set_phase(&gang.namespace, &gang.group, "Pending", bound, Some(why))
                    .await;
                return;
            }
            preemption = Some(outcome);
        } else {
            for (pod, _) in members {
                self.cluster.hold_nominee(&pod.key.uid, snapshot);
            }
        }
        report.waiting_gangs += 1;
        let reason = if present < min_member {
            format!(
                "pod group {} has {present} of {min_member} members",
                gang.id
            )
        } else {
            format!(
                "pod group {}: only {} of {min_member} members fit at once{}",
                gang.id,
                bound + placed,
                failure.map(|f| format!("; {f}")).unwrap_or_default()
            )
        };
        let why = if present < min_member {
            "MembersMissing"
        } else {
            "NotEnoughResources"
        };
        let reason = match preemption {
            Some(p) => p.message(&sentence(&reason), snapshot.nodes.len()),
            None => sentence(&reason),
        };
        let why = Why {
            reason: why,
            message: &reason,
        };
        self.wait_or_time_out(gang, members, why, now, report).await;
    }

    /// The node masks to try: one per value of the topology key (nodes without the label
    /// are in none), or the whole cluster when the gang has no key. Members already bound
    /// fix the value.
    fn domains(
        &self,
        snapshot: &Snapshot,
        pods: &[std::sync::Arc<PodInfo>],
        (namespace, group): (&str, &str),
        spec: &PodGroupSpec,
        members: &[(&Arc<PodInfo>, Verdicts)],
    ) -> Result<Vec<Option<Vec<bool>>>, String> {
        let key = match &spec.topology_key {
            Some(k) if !k.is_empty() => Some(k.clone()),
            _ => {
                let mut keys: Vec<&String> = members
                    .iter()
                    .filter_map(|(p, _)| p.topology_key.as_ref())
                    .collect();
                keys.sort();
                keys.dedup();
                if keys.len() > 1 {
                    return Err(format!(
                        "pod group {namespace}/{group}: members name different {TOPOLOGY_KEY_ANNOTATION} values {keys:?}"
                    ));
                }
                keys.first().map(|k| (*k).clone())
            }
        };
        let Some(key) = key else {
            return Ok(vec![None]);
        };
        let value_of = |n: usize| {
            snapshot.nodes[n]
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(&key))
                .cloned()
        };
        let bound_values: std::collections::BTreeSet<Option<String>> = pods
            .iter()
            .filter(|p| {
                p.key.namespace == namespace
                    && p.group.as_deref() == Some(group)
                    && p.is_active_bound()
            })
            .map(|p| p.key.uid.as_str())
            .chain(
                self.cluster
                    .reservations()
                    .of_gang(&format!("{namespace}/{group}"))
                    .map(|r| r.key.uid.as_str()),
            )
            .filter_map(|uid| snapshot.held.get(uid).map(|h| value_of(h.node)))
            .collect();
        let mut values: std::collections::BTreeSet<String> =
            (0..snapshot.nodes.len()).filter_map(value_of).collect();
        if let Some(fixed) = bound_values.iter().next() {
            if bound_values.len() > 1 || fixed.is_none() {
                return Err(format!(
                    "pod group {namespace}/{group}: members already bound span more than one {key} value"
                ));
            }
            values.retain(|v| Some(v) == fixed.as_ref());
        }
        Ok(values
            .into_iter()
            .map(|v| {
                Some(
                    (0..snapshot.nodes.len())
                        .map(|n| value_of(n).as_ref() == Some(&v))
                        .collect(),
                )
            })
            .collect())
    }

    /// Places the members one by one on a copy of the state, within `domain`.
    fn try_members<'a>(
        &mut self,
        snapshot: &Snapshot,
        members: &[(&'a Arc<PodInfo>, Verdicts)],
        domain: Option<&[bool]>,
        steered: &Steered,
    ) -> Trial<'a> {
        let mut trial = snapshot.state.clone();
        let mut scalars = snapshot.scalars.clone();
        let mut extra: Vec<(usize, Arc<PodInfo>)> = Vec::new();
        let mut out = Trial::default();
        for (pod, verdicts) in members {
            let demand = match &pod.demand {
                Ok(d) => d.clone(),
                Err(e) => {
                    out.failure = Some(e.clone());
                    continue;
                }
            };
            let profile = Profile {
                volumes: &self.volumes,
            };
            let input = FilterInput {
                snapshot,
                scalars: &scalars,
                pod,
                demand: &demand,
                planned: &extra,
            };
            let filtered = match profile.filter(verdicts, &input) {
                Ok(f) => f,
                Err(why) => {
                    out.failure = Some(why);
                    continue;
                }
            };
            let filtered = match domain {
                // Within the gang's domain first: preferences then rank inside it.
                Some(d) => {
                    let mut within = filtered.into_owned();
                    within.restrict(d);
                    Cow::Owned(within)
                }
                None => filtered,
            };
            let filtered = profile.prefer(filtered, &input, &trial);
            let mut mask: Option<Vec<bool>> = match (filtered.mask(), domain) {
                (None, None) => None,
                (Some(m), None) | (None, Some(m)) => Some(m.to_vec()),
                (Some(a), Some(b)) => Some(a.iter().zip(b).map(|(x, y)| *x && *y).collect()),
            };
            // A queue's per-model limits: only models with room for the whole gang.
            if let Some(narrow) = &self.narrow {
                let m = mask.get_or_insert_with(|| vec![true; narrow.len()]);
                m.iter_mut().zip(narrow).for_each(|(a, n)| *a &= *n);
            }
            let steer = steered.get(&pod.key.uid);
            let on_steer = steer.and_then(|st| {
                let n = snapshot.node_index(&st.node)?;
                let only = super::defrag::steer_mask(mask.as_deref(), n, trial.len());
                let d = self
                    .placer
                    .choose(&trial, &demand.request, Some(&only))
                    .ok()?;
                Some(st.exact_in(snapshot, &trial, d))
            });
            let chosen = match on_steer {
                Some(d) => Ok(d),
                None => self.placer.choose(&trial, &demand.request, mask.as_deref()),
            };
            match chosen {
                Ok(d) if trial.apply(d.node, &demand.request, &d.gpus).is_ok() => {
                    scalars.take(d.node, &demand.extended);
                    extra.push((d.node, Arc::clone(pod)));
                    out.planned.push((*pod, demand, d))
                }
                Ok(_) => out.failure = Some("placement could not be applied".into()),
                Err(why) => {
                    out.failure = Some(explain(
                        why,
                        &filtered.rejected,
                        snapshot.nodes.len(),
                        &self.config.gpu_resource,
                    ))
                }
            }
        }
        out.frag = trial.total_frag();
        out
    }
}

/// Moved members' steers (their planned places), by pod UID.
type Steered = std::collections::HashMap<String, super::defrag::Steer>;
