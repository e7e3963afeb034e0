//! The queues in `gpuplace status` and the live map: each Queue's standing as its status
//! says it (the leader writes it): guarantee, limit, allocation, fair share, usage over
//! time, pending pods, and why it serves no pod when it does not.

use std::fmt::Write;

use serde::Serialize;

use crate::api::ClusterView;

/// One queue.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct QueueLine {
    pub name: String,
    pub parent: Option<String>,
    pub guaranteed_gpus: String,
    pub limit_gpus: String,
    pub allocated_gpus: String,
    pub fair_share_gpus: String,
    /// GPUs held on average over the recent past (decayed mean), with the half-life.
    pub decayed_gpus: Option<String>,
    pub half_life: Option<String>,
    pub pending_pods: u32,
    /// Why it serves no pod, or why its half-life was refused.
    pub problems: Vec<String>,
}

/// The queues of `view`, by name.
pub fn lines(view: &ClusterView) -> Vec<QueueLine> {
    let mut out: Vec<QueueLine> = view
        .queues
        .iter()
        .map(|q| {
            let status = q.status.clone().unwrap_or_default();
            let usage = status.usage.as_ref();
            QueueLine {
                name: q.metadata.name.clone().unwrap_or_default(),
                parent: q.spec.parent.clone(),
                guaranteed_gpus: status.guaranteed_gpus.clone(),
                limit_gpus: status.limit_gpus.clone(),
                allocated_gpus: status.allocated_gpus.clone(),
                fair_share_gpus: status.fair_share_gpus.clone(),
                decayed_gpus: usage.map(|u| u.decayed_gpus.clone()),
                half_life: usage.map(|u| u.half_life.clone()),
                pending_pods: status.pending_pods,
                problems: status
                    .conditions
                    .iter()
                    .filter(|c| c.status == "False" && !c.message.is_empty())
                    .map(|c| format!("{}: {}", c.type_, c.message))
                    .collect(),
            }
        })
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

/// The QUEUES block of the text status.
pub fn render(out: &mut String, queues: &[QueueLine]) {
    if queues.is_empty() {
        return;
    }
    let _ = writeln!(out, "\nQUEUES ({})", queues.len());
    let _ = writeln!(
        out,
        "{:<20} {:<14} {:>10} {:>7} {:>9} {:>10} {:>16} {:>7}",
        "NAME",
        "PARENT",
        "GUARANTEED",
        "LIMIT",
        "ALLOCATED",
        "FAIR SHARE",
        "DECAYED USE",
        "PENDING"
    );
    for q in queues {
        let or_dash = |s: &str| {
            if s.is_empty() {
                "-".to_string()
            } else {
                s.to_string()
            }
        };
        let decayed = match (&q.decayed_gpus, &q.half_life) {
            (Some(d), Some(h)) => format!("{d} ({h})"),
            _ => "-".into(),
        };
        let _ = writeln!(
            out,
            "{:<20} {:<14} {:>10} {:>7} {:>9} {:>10} {:>16} {:>7}",
            q.name,
            q.parent.as_deref().unwrap_or("-"),
            or_dash(&q.guaranteed_gpus),
            or_dash(&q.limit_gpus),
            or_dash(&q.allocated_gpus),
            or_dash(&q.fair_share_gpus),
            decayed,
            q.pending_pods
        );
        for p in &q.problems {
            let _ = writeln!(out, "{:<20} {p}", "");
        }
    }
}
