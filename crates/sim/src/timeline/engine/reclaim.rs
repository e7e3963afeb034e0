//! Reclaim in the timeline replay: a unit of a queue below its guarantee evicts units of
//! queues above theirs (core's [`cycle::reclaim::plan_within_guarantees`] over the victim
//! search), each queue kept at its guarantee; the candidates, kept while nothing they read
//! changed, and the leaving pods' places it may count on.

use std::rc::Rc;
use std::sync::Arc;

use gpuplace_core::cycle;
use gpuplace_core::fairshare::{Entitlement, Res};

use super::Engine;
use super::chain::{FairView, SimPlan, asks_of, search_on};
use super::evictable::{Room, SearchAsk, SearchedAt};
use super::freeing::holders_of;
use super::groups::ReclaimPool;
use super::victims::{Eviction, Unsure, candidates_of};
use crate::timeline::options::Ms;

impl Engine<'_> {
    /// Reclaim for `unit` of queue `fair.queue`: units of queues above their guarantee
    /// evicted, every queue kept at its guarantee (core's check).
    pub(super) fn plan_reclaim(
        &mut self,
        unit: u32,
        fair: FairView<'_, '_>,
        now: Ms,
    ) -> Option<SimPlan> {
        self.tenants.as_ref()?;
        let mut asked = Res::default();
        for &j in &self.units[unit as usize].jobs {
            asked.add(&Res::of(
                &self.pods[self.jobs[j as usize].pod as usize].request,
                None,
            ));
        }
        let tree = fair.picker.tree();
        let entitled = Entitlement::new(tree, fair.picker.allocations(), fair.queue, &asked)?;
        // A pod alone: not where the same search found nothing with nothing changed.
        let ask = match self.units[unit as usize].single {
            Some(one) => {
                let ask = SearchAsk {
                    request: one.rid,
                    priority: one.priority,
                    queue: Some(fair.queue),
                };
                let key = self.searched_at(now);
                let standing = fair.picker.allocations();
                if self.failed_reclaims.known_with(key, standing, ask) {
                    return None;
                }
                Some(ask)
            }
            None => None,
        };
        let found = self.plan_reclaim_on(unit, fair, &entitled, now);
        if let Some(ask) = ask
            && found.is_none()
        {
            self.failed_reclaims.failed(ask);
        }
        found
    }

    /// What a victim search reads besides its ask, now.
    fn searched_at(&self, now: Ms) -> SearchedAt {
        SearchedAt {
            state: self.state.instance(),
            journal: self.state.journal_len(),
            running: self.by_priority.generation(),
            now_ms: now.0,
        }
    }

    /// [`Self::plan_reclaim`]'s search, over every unit of the queues `entitled` may take
    /// from.
    fn plan_reclaim_on(
        &mut self,
        unit: u32,
        fair: FairView<'_, '_>,
        entitled: &Entitlement<'_>,
        now: Ms,
    ) -> Option<SimPlan> {
        let pool = self.reclaim_pool(entitled, now)?;
        let (groups, unit_queue) = (&pool.groups, &pool.unit_queue);
        let (found, losses) = {
            let (pods, jobs) = (self.pods, &self.jobs);
            let asks = asks_of(pods, jobs, &self.units[unit as usize].jobs);
            let mut candidates = candidates_of(jobs, pods, groups);
            candidates.freeing = holders_of(&self.leaving, &pool.freeing);
            let takes = cycle::reclaim::Takes::new(&self.state, &candidates, unit_queue);
            let prefer = cycle::reclaim::prefer_most_used(&takes, fair.picker);
            let (placer, state) = (&mut self.placer, &self.state);
            let found = cycle::reclaim::plan_within_guarantees(
                &takes,
                entitled,
                prefer,
                |excluded| search_on(placer, state, &asks, &candidates, excluded),
                |(units, _)| units,
            )?;
            // Pod by pod, as the scheduler takes them off (every eviction lands here).
            let losses =
                cycle::reclaim::victim_losses(state, &candidates, unit_queue, &found.plan.0);
            (found, losses)
        };
        let (units, places) = found.plan;
        let nodes: Vec<usize> = places.iter().map(|p| p.0).collect();
        let freeing = self.slots_on(&pool.freeing, &nodes);
        let counts = units
            .iter()
            .map(|&u| (unit_queue[u], groups.get(u).len() as u64))
            .collect();
        Some(SimPlan::Reclaim {
            eviction: Eviction {
                groups: Rc::clone(&pool.groups),
                units,
                places,
                freeing,
            },
            losses,
            counts,
        })
    }
}

impl Engine<'_> {
    /// Reclaim's candidates for a pod as `entitled` says, and the leaving pods' places it
    /// may count on (kept while the same: a change to those bumps the running pods'
    /// generation); `None` when no unit may be taken.
    fn reclaim_pool(&mut self, entitled: &Entitlement<'_>, now: Ms) -> Option<Rc<ReclaimPool>> {
        let queue_of = Arc::clone(&self.tenants.as_ref()?.queue_of);
        let of = |pod: u32| queue_of.get(pod as usize).copied().unwrap_or(0);
        let takeable = entitled.takeable();
        let at = self.searched_at(now);
        let pool = match &self.reclaim_pool {
            Some(kept) if kept.at == at && kept.takeable == takeable => Rc::clone(kept),
            _ => {
                let take = |pod: u32| takeable.get(of(pod)).copied().unwrap_or(false);
                let groups = self.victim_groups(&take, now, &Room::Anywhere, Unsure::Unasked);
                let unit_queue = groups
                    .iter()
                    .map(|g| of(self.jobs[g[0] as usize].pod))
                    .collect();
                let freeing = self.offered_slots(&take, &Room::Anywhere);
                let pool = Rc::new(ReclaimPool {
                    at,
                    takeable,
                    groups: Rc::new(groups),
                    unit_queue,
                    freeing,
                });
                self.reclaim_pool = Some(Rc::clone(&pool));
                pool
            }
        };
        (!pool.groups.is_empty()).then_some(pool)
    }
}
