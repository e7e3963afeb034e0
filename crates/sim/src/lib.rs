//! Trace replay of gpuplace's placement policies: the openb CSV loader, the built-in
//! workload, the paper's replay method, metrics per arrived GPU %, and reports.

pub mod asks;
pub mod builtin;
pub mod output;
mod plot;
pub mod preemption;
pub mod replay;
pub mod report;
pub mod sample;
pub mod timeline;
pub mod trace;
pub mod workload;

pub use replay::{Prepared, RunResult, SimError, Workload, run_all};
pub use report::{PolicySummary, Stat, Summary, summarize};
pub use sample::SampleError;
pub use trace::{TraceError, TracePod, load_nodes, load_pods};

use std::path::Path;

/// Loads a trace's node and pod lists into a [`Workload`] named after the pod file.
pub fn load_workload(nodes: &Path, pods: &Path) -> Result<Workload, TraceError> {
    let name = pods
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| pods.display().to_string());
    Ok(Workload {
        name,
        nodes: load_nodes(nodes)?,
        pods: load_pods(pods)?,
    })
}

/// The built-in workload at `1/scale` of the openb cluster's size.
pub fn builtin_workload(scale: u32) -> Workload {
    let nodes = builtin::cluster(scale);
    let pods = builtin::pods(&nodes);
    Workload {
        name: if scale <= 1 {
            "builtin".to_string()
        } else {
            format!("builtin-1/{scale}")
        },
        nodes,
        pods,
    }
}
