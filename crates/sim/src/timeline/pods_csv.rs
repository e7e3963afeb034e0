//! `pods.csv` and `nodes.csv`: every pod's life ([`super::pods::PodRecord`]) in a report,
//! and the nodes its `node` column counts.

use std::fmt::Write as _;
use std::path::Path;

use gpuplace_model::NodeInventory;

use super::TimelineRun;
use crate::report::{ReportError, write};

/// The columns of `pods.csv`.
const HEADER: &str = "policy,seed,pod,unit,cpu_milli,memory_mib,gpus,gpu_milli,measured,by_controller,arrival_s,bound_s,end_s,node,evicted,abandoned,failed_attempts";

/// The CSV text of every pod of `runs`, one row per pod per run (an empty cell: none).
pub fn pods_csv(runs: &[TimelineRun]) -> String {
    let mut out = String::from(HEADER);
    out.push('\n');
    let cell = |v: Option<f64>| v.map(|x| format!("{x:.3}")).unwrap_or_default();
    for run in runs {
        for p in &run.pods {
            let _ = writeln!(
                out,
                "{},{},{},{},{},{},{},{},{},{},{:.3},{},{},{},{},{},{}",
                run.policy.name(),
                run.seed,
                p.pod,
                p.unit,
                p.cpu_milli,
                p.memory_mib,
                p.gpus,
                p.gpu_milli,
                p.measured,
                p.by_controller,
                p.arrival_s,
                cell(p.bound_s),
                cell(p.end_s),
                p.node.map(|n| n.to_string()).unwrap_or_default(),
                p.evicted,
                p.abandoned,
                p.failed_attempts.map(|n| n.to_string()).unwrap_or_default()
            );
        }
    }
    out
}

/// The CSV text of the cluster's nodes, in the order `pods.csv`'s `node` counts them.
pub fn nodes_csv(nodes: &[NodeInventory]) -> String {
    let mut out = String::from("node,name,cpu_milli,memory_mib,gpus\n");
    for (i, n) in nodes.iter().enumerate() {
        // Node names are DNS labels (no commas); the trace's are `openb-node-NNNN`.
        let _ = writeln!(
            out,
            "{i},{},{},{},{}",
            n.name,
            n.cpu_milli,
            n.memory_mib,
            n.gpus.len()
        );
    }
    out
}

/// Writes `pods.csv` and `nodes.csv` into `dir` (made by the report); returns their names.
pub fn write_pods(
    runs: &[TimelineRun],
    nodes: &[NodeInventory],
    dir: &Path,
) -> Result<Vec<String>, ReportError> {
    write(&dir.join("pods.csv"), &pods_csv(runs))?;
    write(&dir.join("nodes.csv"), &nodes_csv(nodes))?;
    Ok(vec!["pods.csv".to_string(), "nodes.csv".to_string()])
}
