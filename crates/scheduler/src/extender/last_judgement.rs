//! The last judgement's verdicts by node, kept for the next call about the same pod on the
//! same state: kube-scheduler calls prioritize right after filter with the nodes that
//! passed, so in filter mode `all` prioritize answers from filter's work instead of
//! judging thousands of nodes again.

use crate::k8s::pod_info::PodInfo;

/// What the last judgement said of one node of the state.
#[derive(Clone, Copy)]
enum Seen {
    /// Not among that call's candidates.
    No,
    /// Fits, with its key (preference sum, policy score).
    Fits((i64, i64)),
    /// Does not fit (for any reason).
    Fails,
}

/// Verdicts by node index for one pod (by UID and resourceVersion: the API server never
/// gives two versions of a pod the same one) at one state (the extender's count of state
/// changes).
#[derive(Default)]
pub(super) struct LastJudgement {
    about: Option<About>,
    /// Per node of the state; the buffer is reused call after call.
    seen: Vec<Seen>,
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
    /// Keeps the verdicts on the candidates at `index` (node indices by position) for
    /// `pod` at `state`: `keys` by position, the key where the pod fits, `None` where it
    /// does not. The keys must hold the policy's scores (a judgement that only checked fit
    /// is not kept: prioritize needs the scores) and no preference sums (those are scaled
    /// over the candidates of the call that made them).
    pub(super) fn record(
        &mut self,
        pod: &PodInfo,
        state: u64,
        nodes: usize,
        index: &[Option<usize>],
        keys: impl Iterator<Item = Option<(i64, i64)>>,
    ) {
        self.about = About::of(pod, state);
        if self.about.is_none() {
            return;
        }
        self.seen.clear();
        self.seen.resize(nodes, Seen::No);
        for (n, key) in index.iter().zip(keys) {
            let Some(slot) = n.and_then(|n| self.seen.get_mut(n)) else {
                continue;
            };
            *slot = match key {
                Some(key) => Seen::Fits(key),
                None => Seen::Fails,
            };
        }
    }

    /// Keeps nothing (the last judgement could not be reused).
    pub(super) fn clear(&mut self) {
        self.about = None;
    }

    /// The key of each candidate at `index` (`None`: does not fit or is not in the state),
    /// when the last judgement was about `pod` at `state` and covered every candidate.
    pub(super) fn recall(
        &self,
        pod: &PodInfo,
        state: u64,
        index: &[Option<usize>],
    ) -> Option<Vec<Option<(i64, i64)>>> {
        let about = self.about.as_ref()?;
        if about.state != state
            || about.uid != pod.key.uid
            || about.resource_version != pod.resource_version
        {
            return None;
        }
        index
            .iter()
            .map(|n| match n {
                None => Some(None),
                Some(n) => match self.seen.get(*n)? {
                    Seen::No => None,
                    Seen::Fits(key) => Some(Some(*key)),
                    Seen::Fails => Some(None),
                },
            })
            .collect()
    }
}
