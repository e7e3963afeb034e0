//! What the scheduling queue orders (one pod, or a gang decided as one unit) and the order
//! a round decides them in (as sorted, or by the queues' fair order).

use std::cmp::Reverse;
use std::sync::Arc;

use gpuplace_core::fairshare::Picker;
use k8s_openapi::jiff::Timestamp;

use crate::k8s::pod_info::PodInfo;

/// What the queue orders: one pod, or a gang (decided as one unit).
pub(crate) enum Unit<'a> {
    Single(&'a Arc<PodInfo>),
    Gang((String, String), Vec<&'a Arc<PodInfo>>),
}

impl<'a> Unit<'a> {
    /// Its pods.
    pub(crate) fn pods(&self) -> Vec<&'a Arc<PodInfo>> {
        match self {
            Unit::Single(p) => vec![*p],
            Unit::Gang(_, members) => members.clone(),
        }
    }

    /// Priority (highest member's for a gang), then creation time, then name.
    pub(crate) fn order(&self) -> (Reverse<i32>, Option<Timestamp>, String) {
        match self {
            Unit::Single(p) => (Reverse(p.priority), p.created, p.key.to_string()),
            Unit::Gang((ns, g), members) => (
                Reverse(members.iter().map(|p| p.priority).max().unwrap_or(0)),
                members.iter().filter_map(|p| p.created).min(),
                format!("{ns}/{g}"),
            ),
        }
    }
}

/// The units of `waiting` in queue order: each pod alone, the members of a gang (its
/// namespace and group) together; a pod alone is kept when `due` says so, a gang when any
/// member is due.
pub(crate) fn form<'a>(
    waiting: impl IntoIterator<Item = &'a Arc<PodInfo>>,
    due: impl Fn(&PodInfo) -> bool,
) -> Vec<Unit<'a>> {
    let mut gangs: std::collections::BTreeMap<(String, String), Vec<&'a Arc<PodInfo>>> =
        Default::default();
    let mut units = Vec::new();
    for pod in waiting {
        match &pod.group {
            Some(g) => gangs
                .entry((pod.key.namespace.clone(), g.clone()))
                .or_default()
                .push(pod),
            None if due(pod) => units.push(Unit::Single(pod)),
            None => {}
        }
    }
    for (id, members) in gangs {
        if members.iter().any(|p| due(p)) {
            units.push(Unit::Gang(id, members));
        }
    }
    units.sort_by_cached_key(Unit::order);
    units
}

/// The order units are decided in: as sorted (no queues), or by the queues' picker.
pub(crate) enum Order<'p, 't, 'a> {
    Plain(std::vec::IntoIter<Unit<'a>>),
    Fair(&'p mut Picker<'t, Unit<'a>>),
}

impl<'a> Order<'_, '_, 'a> {
    /// The next unit, with its queue when queues order them.
    pub(crate) fn next(&mut self) -> Option<(Option<usize>, Unit<'a>)> {
        match self {
            Order::Plain(units) => units.next().map(|u| (None, u)),
            Order::Fair(picker) => picker.pop().map(|(q, u)| (Some(q), u)),
        }
    }
}
