//! The last judgement's verdicts, kept for the next call about the same pod on the same
//! state: kube-scheduler calls prioritize right after filter with the nodes that passed, in
//! the order filter answered them, so in filter mode `all` prioritize answers from filter's
//! work (one walk over the two lists of names) instead of judging thousands of nodes again.

use std::sync::Arc;

use gpuplace_model::Change;

use crate::k8s::pod_info::PodInfo;
use crate::shared::assume::Reservations;
use crate::snapshot::Snapshot;

use super::names::Names;
use super::wire::Picked;

/// Whether taking `changes` leaves what a judgement reads as it was: every pod changed is
/// unplaced before and after (not bound, holding nothing, not reserved), as when pending
/// pods come and go. The watch shows kube-scheduler's next pods between its filter and
/// prioritize calls: those changes keep the last judgement. `None` (not known) moves it.
pub(super) fn moves_nothing(
    snapshot: Option<&Snapshot>,
    reservations: &Reservations,
    changes: Option<&[Change<PodInfo>]>,
) -> bool {
    let (Some(snapshot), Some(changes)) = (snapshot, changes) else {
        return false;
    };
    let unplaced = |pod: &Option<Arc<PodInfo>>| {
        pod.as_ref().is_none_or(|p| {
            p.node_name.is_none()
                && !snapshot.held.contains_key(&p.key.uid)
                && !reservations.contains(&p.key.uid)
        })
    };
    changes
        .iter()
        .all(|c| unplaced(&c.before) && unplaced(&c.after))
}

/// Verdicts by candidate for one pod (by UID and resourceVersion: the API server never
/// gives two versions of a pod the same one) at one state (the extender's count of state
/// changes).
#[derive(Default)]
pub(super) struct LastJudgement {
    about: Option<About>,
    /// The judged candidates, in the order of that call; the buffers are reused call after
    /// call.
    names: Names,
    /// By position in `names`: the key (preference sum, policy score) where the pod fits.
    keys: Vec<Option<(i64, i64)>>,
}

struct About {
    uid: String,
    resource_version: String,
    state: u64,
}

impl About {
    /// `None` for a pod without a resourceVersion (nothing tells two versions apart).
    fn of(pod: &PodInfo, state: u64) -> Option<About> {
        (!pod.resource_version.is_empty() && !pod.key.uid.is_empty()).then(|| About {
            uid: pod.key.uid.clone(),
            resource_version: pod.resource_version.clone(),
            state,
        })
    }
}

impl LastJudgement {
    /// Keeps the verdicts on `names` for `pod` at `state`: `keys` by position, the key where
    /// the pod fits, `None` where it does not. The keys must hold the policy's scores (a
    /// judgement that only checked fit is not kept: prioritize needs the scores) and no
    /// preference sums (those are scaled over the candidates of the call that made them).
    pub(super) fn record(
        &mut self,
        pod: &PodInfo,
        state: u64,
        names: &Names,
        keys: impl Iterator<Item = Option<(i64, i64)>>,
    ) {
        self.about = About::of(pod, state);
        if self.about.is_none() {
            return;
        }
        self.names.clone_from(names);
        self.keys.clear();
        self.keys.extend(keys);
    }

    /// Keeps nothing (the last judgement could not be reused).
    pub(super) fn clear(&mut self) {
        self.about = None;
    }

    /// The key of each of `names` (`None`: does not fit), when the last judgement was about
    /// `pod` at `state` and `names` are some of its candidates in the same order (as
    /// kube-scheduler sends the ones that passed filter); `None` otherwise. `picked`, when
    /// the names came back as a filter answer wrote them, says where they stood in that
    /// filter's candidates: when those are this judgement's, no walk over the names is
    /// needed.
    pub(super) fn recall(
        &self,
        pod: &PodInfo,
        state: u64,
        names: &Names,
        picked: Option<&Picked>,
    ) -> Option<Vec<Option<(i64, i64)>>> {
        let about = self.about.as_ref()?;
        if about.state != state
            || about.uid != pod.key.uid
            || about.resource_version != pod.resource_version
            || names.len() > self.names.len()
            // One key was kept per name.
            || self.keys.len() != self.names.len()
        {
            return None;
        }
        let mut keys = Vec::with_capacity(names.len());
        match picked {
            Some(picked) if picked.at.len() == names.len() && *picked.from == self.names => {
                for &j in picked.at.iter() {
                    keys.push(*self.keys.get(j as usize)?);
                }
            }
            _ => names.positions_in(&self.names, |j| {
                keys.push(self.keys.get(j).copied().flatten())
            })?,
        }
        Some(keys)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Pod;

    fn pod(uid: &str, rv: &str) -> PodInfo {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": uid, "resourceVersion": rv},
            "spec": {"containers": []}
        }))
        .unwrap();
        PodInfo::from_pod(&pod, "nvidia.com/gpu")
    }

    fn names(list: &[&str]) -> Names {
        list.iter().copied().collect()
    }

    #[test]
    fn recalled_only_for_the_same_pod_version_state_and_a_subsequence_of_its_names() {
        let mut last = LastJudgement::default();
        let keys = [Some((0, 5)), None, Some((0, 7)), Some((0, 1))];
        last.record(
            &pod("u", "1"),
            3,
            &names(&["a", "b", "c", "d"]),
            keys.into_iter(),
        );
        let p = pod("u", "1");
        assert_eq!(
            last.recall(&p, 3, &names(&["a", "c", "d"]), None),
            Some(vec![Some((0, 5)), Some((0, 7)), Some((0, 1))])
        );
        assert_eq!(last.recall(&p, 3, &names(&["b"]), None), Some(vec![None]));
        assert_eq!(last.recall(&p, 3, &names(&[]), None), Some(vec![]));
        // Out of order, unknown, repeated beyond the list, another state or version.
        assert_eq!(last.recall(&p, 3, &names(&["c", "a"]), None), None);
        assert_eq!(last.recall(&p, 3, &names(&["a", "x"]), None), None);
        assert_eq!(last.recall(&p, 3, &names(&["d", "d"]), None), None);
        assert_eq!(last.recall(&p, 4, &names(&["a"]), None), None);
        assert_eq!(last.recall(&pod("u", "2"), 3, &names(&["a"]), None), None);
        assert_eq!(last.recall(&pod("v", "1"), 3, &names(&["a"]), None), None);
        last.clear();
        assert_eq!(last.recall(&p, 3, &names(&["a"]), None), None);
        // Told where the names stood in filter's candidates: taken from there when those
        // candidates are this judgement's, else found by walking them.
        last.record(&p, 3, &names(&["a", "b", "c", "d"]), keys.into_iter());
        let from = |list: &[&str], at: &[u32]| Picked {
            from: Arc::new(names(list)),
            at: Arc::from(at),
        };
        let mine = from(&["a", "b", "c", "d"], &[1, 3]);
        let sub = names(&["b", "d"]);
        assert_eq!(
            last.recall(&p, 3, &sub, Some(&mine)),
            Some(vec![None, Some((0, 1))])
        );
        let other = from(&["x", "b", "y", "d"], &[1, 3]);
        assert_eq!(
            last.recall(&p, 3, &sub, Some(&other)),
            Some(vec![None, Some((0, 1))])
        );
        let past = from(&["a", "b", "c", "d"], &[1, 7]);
        assert_eq!(last.recall(&p, 3, &sub, Some(&past)), None);
        // A pod without a resourceVersion is never kept.
        last.record(&pod("u", ""), 3, &names(&["a"]), [Some((0, 1))].into_iter());
        assert_eq!(last.recall(&pod("u", ""), 3, &names(&["a"]), None), None);
    }
}
