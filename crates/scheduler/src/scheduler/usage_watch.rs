//! The queues' usage around the leader's rounds: a standby counts it from its watch, and a
//! leader leaving writes its last record ([`super::usage`] keeps the count).

use std::time::Instant;

use gpuplace_core::fairshare::Res;

use super::Scheduler;
use crate::api::{ApiError, ClusterApi};

impl<A: ClusterApi> Scheduler<A> {
    /// A standby's tick: the queues' usage carried on from the pods its watch shows bound
    /// (a leader's rounds do it with their decisions), so that the replica that takes the
    /// lease next has seen the whole time, not only the last record.
    pub async fn observe_usage(&mut self, now: Instant) -> Result<(), ApiError> {
        let view = self.api.view().await?;
        self.queues.refresh(&view);
        if !self.queues.defined(&view) {
            return Ok(());
        }
        let tree = self.queues.tree();
        let mut own = vec![Res::default(); tree.len()];
        for pod in view
            .pods
            .iter()
            .filter(|p| p.is_active_bound() && !p.deleting)
        {
            if let (Ok(q), Ok(d)) = (self.queues.of(pod), pod.demand.as_ref()) {
                own[q].add(&Res::of(&d.request, None));
            }
        }
        let totals = tree.subtree_totals(&own);
        self.usage.advance(&tree, &view, &totals, now);
        Ok(())
    }

    /// The queues' usage written as of now, so that the next leader carries it on from
    /// here (only a leader writes).
    pub(super) async fn leave_usage_record(&mut self, now: Instant) {
        if !self.gate.is_open() || !self.usage.decays() {
            return;
        }
        self.usage.carry_and_show(now);
        self.queue_status.finish().await;
        for (name, status) in self.queue_status.wanted.iter_mut() {
            status.usage = self.usage.shown_named(name);
        }
        self.flush_queue_statuses_now(now).await;
        self.queue_status.finish().await;
    }
}
