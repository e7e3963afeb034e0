//! What the node-class index keeps per request (a ranking of the best classes) and the
//! small pieces its passes share; the passes themselves are in `ranking.rs`.

use gpuplace_model::Request;

use crate::state::ClusterState;

/// A class's standing for a request: (score, member), higher wins; the member is the
/// (seeded rank, node) a scan would take, and a lower one wins ties.
pub(super) type Standing = (i64, std::cmp::Reverse<(u64, u32)>);

/// The best classes for one request: `top` holds (standing, GPU hint, class) best first;
/// every class not in `top` either stands below `bound` or (with no bound) does not fit.
/// Classes touched since `pos` of the index's log are evaluated again before use.
pub(super) struct Ranking {
    pub(super) epoch: u64,
    pub(super) pos: usize,
    pub(super) top: Vec<(Standing, u32, u32)>,
    pub(super) bound: Option<Standing>,
    /// Per node type, the request's hardware verdict (see [`Statics`]).
    pub(super) statics: Statics,
}

/// A request's verdict per node type on what depends on the hardware alone (GPU models and
/// memory: [`ClusterState::fit_static`]), `None` until known. Requests without
/// requirements need none.
pub(super) type Statics = Vec<Option<Result<(), crate::fit::FitFailure>>>;

/// `request`'s fit on node `n`, its hardware verdict remembered in `statics` per node type.
pub(super) fn fit_remembered(
    state: &ClusterState,
    n: usize,
    request: &Request,
    statics: &mut Statics,
) -> Result<(), crate::fit::FitFailure> {
    if request.need.is_empty() {
        return state.fit(n, request);
    }
    let t = state.node_type(n) as usize;
    if statics.len() <= t {
        statics.resize(t + 1, None);
    }
    let verdict = *statics[t].get_or_insert_with(|| state.fit_static(n, request));
    state.fit_with_static(n, request, verdict)
}

/// A decision read from the classes: score, the member (seeded rank, node), GPU hint.
pub(super) type Best = (i64, (u64, u32), u32);

/// How many of the best classes a ranking keeps after a full pass.
pub(super) const RANKED: usize = 16;
/// Rankings kept at most (one per distinct request).
pub(super) const RANKINGS: usize = 4096;

/// What one decision asks of the classes: the request, the nodes allowed (all when
/// `None`), and the request's shape id for the score cache.
pub(super) struct Ask<'a> {
    pub request: &'a Request,
    pub allowed: Option<&'a [bool]>,
    pub shape: Option<u32>,
    /// Node types allowed (a bit per type), for a request whose requirements were reduced
    /// to the node types they allow (see `Placer::reduce`); `None`: every type.
    pub types: Option<&'a [u64]>,
}

/// Whether node type `t` is in `types`.
pub(super) fn type_allowed(types: &[u64], t: u32) -> bool {
    types
        .get(t as usize / 64)
        .is_some_and(|w| w & (1 << (t % 64)) != 0)
}
