//! `gpuplace defrag --plan`: the moves defragmentation would make in the live cluster
//! (see `gpuplace_scheduler::defrag_plan`), read with the caller's kubeconfig; nothing is
//! written.

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use gpuplace_core::Policy;
use gpuplace_scheduler::defrag_plan;
use gpuplace_scheduler::k8s::status_read;
use gpuplace_scheduler::scheduler::defrag::{DefragConfig, parse_duration};

#[derive(Args, Debug)]
pub struct DefragArgs {
    /// Print the plan without touching anything (the only mode: the scheduler carries
    /// moves out, with `--defrag`).
    #[arg(long)]
    plan: bool,
    /// Kubeconfig file [default: $KUBECONFIG, ~/.kube/config, or in-cluster].
    #[arg(long, env = "KUBECONFIG")]
    kubeconfig: Option<PathBuf>,
    /// GPU extended resource [default: nvidia.com/gpu].
    #[arg(long, env = "GPUPLACE_RESOURCE")]
    resource: Option<String>,
    /// The scheduler's placement policy, which places moved pods [default: gpuplace].
    #[arg(long, env = "GPUPLACE_POLICY")]
    policy: Option<String>,
    /// How long a pod must have run before it may move (e.g. 5m, 90s, 0s; at most 30 days).
    #[arg(long, default_value = "5m")]
    min_age: String,
    /// Seed of the policy's tie-breaks: give the scheduler's `--seed` to plan as it would.
    #[arg(long, env = "GPUPLACE_SEED", default_value_t = 42)]
    seed: u64,
    /// Pods one plan may move (1 to 1000).
    #[arg(long, default_value_t = 4)]
    max_moves: usize,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

pub fn run(args: DefragArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.plan,
        "gpuplace defrag only prints plans: add --plan (the scheduler moves pods, see its --defrag)"
    );
    anyhow::ensure!(
        (1..=1000).contains(&args.max_moves),
        "--max-moves must be between 1 and 1000, got {}",
        args.max_moves
    );
    let policy: Policy = args
        .policy
        .clone()
        .unwrap_or_else(|| Policy::DEFAULT.name().into())
        .parse()?;
    let min_age = parse_duration(&args.min_age)?;
    anyhow::ensure!(
        min_age <= gpuplace_scheduler::scheduler::defrag::MAX_MIN_AGE,
        "--min-age must be at most 720h (30 days), got {}",
        args.min_age
    );
    let mut config = DefragConfig::default();
    config.settings.min_age = min_age;
    config.settings.max_moves = args.max_moves;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let resource = args
        .resource
        .clone()
        .unwrap_or_else(|| gpuplace_model::keys::GPU_RESOURCE.into());
    let view = runtime.block_on(async {
        let client = crate::kube_client::client(args.kubeconfig.clone()).await?;
        let read = status_read::read(client.clone(), &resource, None).await?;
        let budgets = status_read::read_budgets(client).await?;
        let mut view = read.view;
        view.budgets = std::sync::Arc::new(budgets);
        anyhow::Ok(view)
    })?;
    let plan = defrag_plan::plan(
        &view,
        &resource,
        policy,
        args.seed,
        &config,
        k8s_openapi::jiff::Timestamp::now(),
    );
    if args.json {
        println!("{}", serde_json::to_string_pretty(&plan)?);
    } else {
        print!("{}", defrag_plan::text(&plan));
    }
    Ok(())
}
