//! `gpuplace replay`: a trace replayed against a live cluster (see `gpuplace_replay`), its
//! report the timeline's own (`simulate --timeline`'s JSON and plots) plus what the run
//! cost the API server and the scheduler.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, bail};
use clap::Args;
use gpuplace_core::Policy;
use gpuplace_model::NodeInventory;
use gpuplace_replay::clean;
use gpuplace_replay::driver::{self, DriverConfig, Progress};
use gpuplace_replay::kube_api::KubeReplayApi;
use gpuplace_replay::objects::{self, PodTemplate};
use gpuplace_replay::pod_base::PodBase;
use gpuplace_replay::{Object, Plan, ReplayApi};
use gpuplace_sim::timeline::{DurationModel, Timeline, TimelineOptions};
use gpuplace_sim::{builtin_workload, load_workload};

use crate::replay_report::{self, Live};

/// Replay a GPU trace against a live cluster, on the trace's clock scaled by `--speed`.
#[derive(Args, Debug)]
pub struct ReplayArgs {
    /// Node list CSV (openb format). Needs --pods. Without --fake-nodes only its pods are
    /// used and the nodes are the cluster's own.
    #[arg(long, requires = "pods")]
    pub(crate) nodes: Option<PathBuf>,
    /// Pod list CSV (openb format).
    #[arg(long, requires = "nodes")]
    pub(crate) pods: Option<PathBuf>,
    /// Built-in workload only: shrink the openb-like cluster to 1/SCALE of its size.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub(crate) scale: u32,
    /// With --fake-nodes: this many nodes drawn from the node list.
    #[arg(long)]
    pub(crate) sample_nodes: Option<usize>,
    #[arg(long, default_value_t = 0, requires = "sample_nodes")]
    pub(crate) sample_seed: u64,
    /// Offered load: GPU-seconds asked per second over GPU capacity (0.01 to 10).
    #[arg(long, default_value_t = 0.9)]
    pub(crate) load: f64,
    /// Units (pods, or gangs) arriving after the start.
    #[arg(long, default_value_t = 1_000)]
    pub(crate) arrivals: usize,
    /// Share of the arrivals left out of the metrics as warm-up (0 to below 1).
    #[arg(long, default_value_t = 0.2)]
    pub(crate) warmup: f64,
    #[arg(long, default_value_t = 1.0)]
    pub(crate) duration_scale: f64,
    #[arg(long, default_value_t = 60.0)]
    pub(crate) min_duration: f64,
    #[arg(long)]
    pub(crate) max_duration: Option<f64>,
    /// Start from an empty cluster instead of the mix's stationary population.
    #[arg(long)]
    pub(crate) cold_start: bool,
    /// The arrivals of `simulate --timeline --seeds 1 --seed-start N` (same other flags).
    #[arg(long, default_value_t = 42)]
    pub(crate) seed: u64,
    /// Simulated seconds per real second (above 0, at most 100,000).
    #[arg(long, default_value_t = 10.0)]
    pub(crate) speed: f64,
    /// The scheduler the pods name: `gpuplace`, `default-scheduler` (kube-scheduler, with or
    /// without gpuplace as its extender), any other.
    #[arg(long, default_value = "gpuplace")]
    pub(crate) scheduler_name: String,
    /// The policy the report is filed under (and `simulate --timeline` compares with):
    /// by default `gpuplace` for the gpuplace scheduler, `kube-default` for any other.
    #[arg(long)]
    pub(crate) policy: Option<String>,
    /// The namespace of the pods (it must exist; the replay makes no namespace).
    #[arg(long, default_value = "default")]
    pub(crate) namespace: String,
    /// Create the node list's nodes as fake Nodes (no kubelet): pods run from their
    /// Binding, and the replay plays the kubelet for pods evicted from them.
    #[arg(long)]
    pub(crate) fake_nodes: bool,
    /// Share the pods among queues (a tenants file, as `simulate --tenants`): the Queues
    /// are created and each pod labelled with its own.
    #[arg(long)]
    pub(crate) tenants: Option<PathBuf>,
    /// Every GPU pod asks whole GPUs (a share one): stock Kubernetes without sharing.
    #[arg(long)]
    pub(crate) whole_gpus: bool,
    /// GPUs through DRA (Kubernetes 1.34+): fake nodes publish theirs as gpuplace's DRA
    /// driver does (ResourceSlices), and each pod claims its own from a
    /// ResourceClaimTemplate of its shape, allocated by whichever scheduler places it. The
    /// cluster needs gpuplace's DeviceClasses (deploy/base/dra-driver/deviceclasses.yaml).
    #[arg(long)]
    pub(crate) dra: bool,
    /// The PriorityClasses of the trace's priorities 0, 1 and 2 (e.g. `be,burstable,ls`);
    /// without them pods carry no priority, as `simulate --no-priorities`.
    #[arg(long, value_delimiter = ',')]
    pub(crate) priority_classes: Option<Vec<String>>,
    /// Seconds between renewals of the fake nodes' heartbeats (their Leases, as a kubelet
    /// renews them; 0 to 30, 0: none, for a cluster without a node lifecycle controller).
    #[arg(long, default_value_t = 20.0)]
    pub(crate) node_heartbeat: f64,
    /// Seconds without a Binding that end the warm start (its pods created with the clock
    /// stopped; those still waiting then wait from time 0); 0.5 to 600. With `--dra` a
    /// pod's first attempt may wait for its claim to be made: give it longer.
    #[arg(long, default_value_t = 2.0)]
    pub(crate) warm_quiet: f64,
    /// A Pod (YAML or JSON) every replay pod is made from: the tolerations, node selector,
    /// affinity, image, pull secrets or labels the cluster's own GPU pods need. The replay
    /// sets the name, namespace, scheduler, node and the container's resources itself.
    #[arg(long)]
    pub(crate) pod_template: Option<PathBuf>,
    /// Creations and deletions in flight at once (1 to 256).
    #[arg(long, default_value_t = 32)]
    pub(crate) in_flight: usize,
    /// The scheduler's process on this machine: its CPU seconds go in the report.
    #[arg(long)]
    pub(crate) scheduler_pid: Option<u32>,
    /// Write summary.json, the plots and index.html here.
    #[arg(long)]
    pub(crate) out: Option<PathBuf>,
    /// Print one JSON object on stdout and nothing else there.
    #[arg(long)]
    pub(crate) json: bool,
    /// Delete everything replays left (labelled app.kubernetes.io/managed-by=gpuplace-replay)
    /// and exit.
    #[arg(long)]
    pub(crate) clean: bool,
    #[arg(long, env = "KUBECONFIG")]
    pub(crate) kubeconfig: Option<PathBuf>,
}

pub fn run(args: ReplayArgs) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(replay(args))
}

impl ReplayArgs {
    fn options(&self) -> anyhow::Result<TimelineOptions> {
        let tenants = self
            .tenants
            .as_deref()
            .map(crate::simulate_timeline::read_tenants)
            .transpose()?;
        Ok(TimelineOptions {
            load: self.load,
            arrivals: self.arrivals,
            warmup: self.warmup,
            durations: DurationModel {
                scale: self.duration_scale,
                min_s: self.min_duration,
                max_s: self.max_duration,
            },
            warm_start: !self.cold_start,
            tenants,
            whole_gpus: self.whole_gpus,
            no_priorities: self.priority_classes.is_none(),
            ..TimelineOptions::default()
        })
    }

    fn policy(&self) -> anyhow::Result<Policy> {
        let policy = match &self.policy {
            Some(p) => p.parse()?,
            None if self.scheduler_name == "gpuplace" => Policy::GPUPLACE,
            // kube-scheduler allocating the claims itself.
            None if self.dra => Policy::KubeDra,
            None => Policy::KubeDefault,
        };
        match policy {
            Policy::KubeDefault if self.dra => bail!(
                "--policy kube-default takes the device plugin's GPUs; with --dra kube-scheduler allocates the claims itself: kube-dra"
            ),
            Policy::KubeDra if !self.dra => {
                bail!("--policy kube-dra is kube-scheduler allocating DRA claims: add --dra")
            }
            _ => Ok(policy),
        }
    }

    fn template(&self, run: &str) -> anyhow::Result<PodTemplate> {
        let priority_classes = match &self.priority_classes {
            Some(list) => match <[String; 3]>::try_from(list.clone()) {
                Ok(three) => Some(three),
                Err(_) => bail!(
                    "--priority-classes needs three PriorityClass names (for priorities 0, 1 and 2), got {}",
                    list.len()
                ),
            },
            None => None,
        };
        let base = match &self.pod_template {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .with_context(|| format!("cannot read the pod template {}", path.display()))?;
                PodBase::parse(&text)
                    .with_context(|| format!("--pod-template {}", path.display()))?
            }
            None => PodBase::default(),
        };
        if let (Some(class), Some(_)) = (base.priority_class(), &priority_classes) {
            bail!(
                "the pod template sets priorityClassName {class} and --priority-classes gives each pod its own: drop one"
            );
        }
        Ok(PodTemplate {
            run: run.to_string(),
            namespace: self.namespace.clone(),
            scheduler_name: self.scheduler_name.clone(),
            priority_classes,
            base,
            dra: self.dra,
        })
    }
}

/// A node name the API server takes, from a trace's.
fn node_name(name: &str) -> String {
    let cleaned: String = name
        .to_ascii_lowercase()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                c
            } else {
                '-'
            }
        })
        .collect();
    cleaned
        .trim_matches(|c: char| !c.is_ascii_alphanumeric())
        .to_string()
}

/// The cluster's own GPU nodes as the scheduler reads them.
async fn cluster_nodes(api: &KubeReplayApi) -> anyhow::Result<Vec<NodeInventory>> {
    let nodes = api
        .nodes()
        .await
        .context("cannot list the cluster's nodes")?;
    let inventories: Vec<NodeInventory> = nodes
        .iter()
        .map(|n| {
            gpuplace_scheduler::snapshot::inventory_of(n, gpuplace_model::keys::GPU_RESOURCE).0
        })
        .filter(|inv| !inv.gpus.is_empty())
        .collect();
    if inventories.is_empty() {
        bail!(
            "the cluster has no GPU nodes (nvidia.com/gpu allocatable): add --fake-nodes to create the node list's"
        );
    }
    Ok(inventories)
}

async fn replay(args: ReplayArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        (1..=256).contains(&args.in_flight),
        "--in-flight must be between 1 and 256, got {}",
        args.in_flight
    );
    anyhow::ensure!(
        args.speed.is_finite() && args.speed > 0.0 && args.speed <= 100_000.0,
        "--speed must be above 0 and at most 100000 (simulated seconds per real second), got {}",
        args.speed
    );
    anyhow::ensure!(
        args.node_heartbeat.is_finite() && (0.0..=30.0).contains(&args.node_heartbeat),
        "--node-heartbeat must be between 0 and 30 seconds (the node lifecycle controller's grace is 40), got {}",
        args.node_heartbeat
    );
    anyhow::ensure!(
        args.warm_quiet.is_finite() && (0.5..=600.0).contains(&args.warm_quiet),
        "--warm-quiet must be between 0.5 and 600 seconds, got {}",
        args.warm_quiet
    );
    anyhow::ensure!(
        args.fake_nodes || args.sample_nodes.is_none(),
        "--sample-nodes samples the node list, which only --fake-nodes creates"
    );
    // Every input is checked before the cluster is touched.
    let policy = args.policy()?;
    // This run's label: its clean-up deletes exactly what carries it.
    let run_id = format!(
        "rp{}-{}-{}",
        args.seed,
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        std::process::id()
    );
    let template = args.template(&run_id)?;
    let options = args.options()?;
    let mut workload = match (&args.nodes, &args.pods) {
        (Some(nodes), Some(pods)) => load_workload(nodes, pods)?,
        _ => builtin_workload(args.scale),
    };
    let client = crate::kube_client::client(args.kubeconfig.clone()).await?;
    let api = KubeReplayApi::new(client, &args.namespace);
    if args.clean {
        let cleaned = clean::delete_labelled(&api)
            .await
            .context("cannot clean up (is the API server there?)")?;
        for (kind, n) in &cleaned.deleted {
            println!("deleted {n} {}s", kind.name());
        }
        return Ok(());
    }
    if args.fake_nodes {
        if let Some(count) = args.sample_nodes {
            workload.sample_nodes(count, args.sample_seed)?;
        }
        for n in &mut workload.nodes {
            n.name = node_name(&n.name);
        }
    } else {
        workload.nodes = cluster_nodes(&api).await?;
    }
    let timeline = Timeline::new(workload, options).context("cannot replay this workload")?;
    let plan = Plan::new(&timeline, args.seed, &format!("rp{}", args.seed))?;
    let node_index: HashMap<String, (usize, NodeInventory)> = timeline
        .workload()
        .nodes
        .iter()
        .enumerate()
        .map(|(i, n)| (n.name.clone(), (i, n.clone())))
        .collect();
    let capacity = [
        timeline.capacity_milli(),
        timeline.workload().nodes.iter().map(|n| n.cpu_milli).sum(),
        timeline.workload().nodes.iter().map(|n| n.memory_mib).sum(),
    ];
    let mut before: Vec<Object> = plan
        .queues
        .iter()
        .map(|q| objects::queue(&run_id, q, capacity).map(|q| Object::Queue(Box::new(q))))
        .collect::<Result<_, _>>()?;
    if args.dra {
        let pods = &timeline.workload().pods;
        let asked = plan.pods.iter().map(|p| &pods[p.pod as usize].request);
        let templates = gpuplace_replay::claims::claim_templates(&run_id, &args.namespace, asked)?;
        before.extend(
            templates
                .into_iter()
                .map(|t| Object::ClaimTemplate(Box::new(t))),
        );
    }
    let fakes: Vec<(String, NodeInventory)> = if args.fake_nodes {
        timeline
            .workload()
            .nodes
            .iter()
            .map(|n| (n.name.clone(), n.clone()))
            .collect()
    } else {
        Vec::new()
    };
    let (stop, cancel) = tokio::sync::watch::channel(false);
    let interrupted = crate::signals::shutdown();
    let cpu_before = args.scheduler_pid.map(cpu_seconds).transpose()?;
    let config = DriverConfig {
        speed: args.speed,
        fake_nodes: args.fake_nodes,
        template,
        in_flight: args.in_flight,
        watch_patience: std::time::Duration::from_secs(30),
        heartbeat: std::time::Duration::from_secs_f64(args.node_heartbeat),
        warm_quiet: std::time::Duration::from_secs_f64(args.warm_quiet),
    };
    let bar = crate::progress::replay_bar(plan.end_ms);
    let show = |p: &Progress| {
        bar.set_position(p.simulated_ms / 1000);
        bar.set_message(format!(
            "created {}, waiting {}, bound {}, done {}, evicted {}",
            p.created, p.waiting, p.bound, p.finished, p.evicted
        ));
    };
    let started = Instant::now();
    let work = async {
        let prepared = driver::prepare(&api, &run_id, &fakes, &before, args.dra).await?;
        let outcome = driver::run(
            &api,
            &plan,
            &timeline.workload().pods,
            &node_index,
            &config,
            cancel,
            &show,
        )
        .await?;
        Ok::<_, driver::ReplayError>((prepared, outcome))
    };
    tokio::pin!(work);
    let result = tokio::select! {
        r = &mut work => r,
        () = interrupted => {
            // Ctrl-C: the driver stops at once and says so.
            let _ = stop.send(true);
            work.await
        }
    };
    bar.finish_and_clear();
    let cpu_after = args.scheduler_pid.map(cpu_seconds).transpose()?;
    // Whatever happened: delete exactly what this replay made (its run's label).
    let cleaned = clean::delete_run(&api, &run_id).await;
    let (prepared, outcome, made) = match (result, cleaned) {
        (Ok((prepared, outcome)), Ok(c)) => (prepared, outcome, c.total()),
        (Ok(_), Err(e)) => {
            bail!("the replay ran, but cleaning up failed ({e}): run `gpuplace replay --clean`")
        }
        (Err(e), Ok(c)) => bail!(
            "replay stopped: {e} (deleted the {} objects it had made)",
            c.total()
        ),
        (Err(e), Err(c)) => bail!(
            "replay stopped: {e}; cleaning up failed too ({c}): run `gpuplace replay --clean` once the API server is back"
        ),
    };
    let live = Live {
        scheduler_name: args.scheduler_name.clone(),
        speed: args.speed,
        fake_nodes: args.fake_nodes,
        requests: outcome.requests + prepared,
        scheduler_cpu_s: cpu_before.zip(cpu_after).map(|(a, b)| b - a),
        creation_lag_ms: outcome.creation_lag_ms,
        deletion_lag_ms: outcome.deletion_lag_ms,
        warm_start_s: outcome.warm_wall.as_secs_f64(),
        warm_start_bound: outcome.warm_bound,
        wall_s: outcome.wall.as_secs_f64(),
        objects_deleted_at_end: made,
    };
    let run = timeline.measure_lives(
        policy,
        args.seed,
        &outcome.lives,
        outcome.counts,
        started.elapsed(),
    );
    let summary = replay_report::summary(&timeline, args.seed, policy, &run, live);
    replay_report::emit(
        &summary,
        &run,
        &timeline.workload().nodes,
        args.out.as_deref(),
        args.json,
    )
}

/// User plus system CPU seconds of process `pid` so far.
fn cpu_seconds(pid: u32) -> anyhow::Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("--scheduler-pid {pid}: no such process here"))?;
    let after = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest)
        .unwrap_or_default();
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // utime and stime are fields 14 and 15 of stat; after "pid (comm)" they are 12 and 13.
    Ok((ticks(11) + ticks(12)) / 100.0)
}
