//! `gpuplace status`: the fleet's GPUs, who holds them, why pods wait, how fragmented the
//! cluster is; read once (or every 2 s with `--watch`) with the caller's kubeconfig. Why
//! pods wait comes from the Events, or with `--scheduler URL` from the scheduler's memory
//! ([`crate::status_source`]).

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, ValueEnum};
use gpuplace_scheduler::k8s::status_read;
use gpuplace_scheduler::status::{self, Filter, text};

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Output {
    /// Every GPU's holders and NVLink groups, lines not cut.
    Wide,
    /// The whole status as JSON.
    Json,
}

#[derive(Args, Debug)]
pub struct StatusArgs {
    /// Kubeconfig file [default: $KUBECONFIG, ~/.kube/config, or in-cluster].
    #[arg(long, env = "KUBECONFIG")]
    kubeconfig: Option<PathBuf>,
    /// Only nodes whose name contains this.
    #[arg(long)]
    node: Option<String>,
    /// Only pods (holders and pending) of this namespace.
    #[arg(long, short = 'n')]
    namespace: Option<String>,
    /// Show it again every 2 seconds until interrupted.
    #[arg(long, short = 'w')]
    watch: bool,
    /// `wide` or `json` [default: plain text].
    #[arg(long, short = 'o', value_enum)]
    output: Option<Output>,
    /// GPU extended resource [default: nvidia.com/gpu].
    #[arg(long, env = "GPUPLACE_RESOURCE")]
    resource: Option<String>,
    /// Colour: always, never or auto (a terminal, unless NO_COLOR is set).
    #[arg(long, default_value = "auto")]
    color: String,
    #[command(flatten)]
    source: crate::status_source::SourceArgs,
}

pub fn run(args: StatusArgs) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(show(args))
}

async fn show(args: StatusArgs) -> anyhow::Result<()> {
    let terminal = std::io::stdout().is_terminal();
    let colour = match args.color.as_str() {
        "always" => true,
        "never" => false,
        "auto" => terminal && std::env::var_os("NO_COLOR").is_none(),
        other => anyhow::bail!("--color {other:?}: use always, never or auto"),
    };
    let client = crate::kube_client::client(args.kubeconfig.clone()).await?;
    let resource = args
        .resource
        .clone()
        .unwrap_or_else(|| gpuplace_model::keys::GPU_RESOURCE.into());
    let filter = Filter {
        node: args.node.clone(),
        namespace: args.namespace.clone(),
    };
    let width = std::env::var("COLUMNS")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(if terminal { 120 } else { 0 });
    let style = text::Style {
        wide: matches!(args.output, Some(Output::Wide)),
        colour,
        width,
    };
    let source = crate::status_source::Source::from_args(&args.source)?;
    loop {
        let read = status_read::read(client.clone(), &resource, args.namespace.as_deref())
            .await
            .context("cannot read the cluster")?;
        let reasons = status::reasons::from_events(&read.failures);
        let mut fleet = status::fleet(&read.view, &resource, &reasons, &filter);
        if let Some(source) = &source
            && let Err(e) =
                crate::status_source::merge(source, &mut fleet, args.namespace.as_deref()).await
        {
            // The Events still say why, as last written.
            eprintln!("gpuplace status: {e:#}; why pods wait is read from the Events");
        }
        let out = match args.output {
            Some(Output::Json) => serde_json::to_string_pretty(&fleet)? + "\n",
            _ => text::render(&fleet, style),
        };
        let mut stdout = std::io::stdout().lock();
        if args.watch && terminal {
            // Home and clear, then the new picture.
            write!(stdout, "\x1b[H\x1b[2J")?;
        }
        stdout.write_all(out.as_bytes())?;
        stdout.flush()?;
        drop(stdout);
        if !args.watch {
            return Ok(());
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(2)) => {}
            _ = tokio::signal::ctrl_c() => return Ok(()),
        }
        if !terminal {
            println!("---");
        }
    }
}
