//! `gpuplace`: the one binary of the gpuplace GPU scheduling stack.

mod bench;
mod bench_scheduler;
mod device_plugin;
mod heap;
mod logging;
mod scheduler;
mod signals;
mod simulate;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[global_allocator]
static ALLOCATOR: heap::CountingAllocator = heap::CountingAllocator;

#[derive(Parser)]
#[command(
    name = "gpuplace",
    version,
    about = "GPU placement for Kubernetes: exact devices, topology, fragmentation-aware policies"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Replay a GPU cluster trace (or the built-in workload) against placement policies.
    Simulate(simulate::SimulateArgs),
    /// Serve the kubelet device plugin API (run as a DaemonSet on GPU nodes).
    DevicePlugin(device_plugin::DevicePluginArgs),
    /// Schedule pods (spec.schedulerName) onto nodes and exact GPUs.
    Scheduler(scheduler::SchedulerArgs),
    /// Print the PodGroup CustomResourceDefinition (YAML).
    Crd,
    /// List the placement policies.
    Policies,
    /// Measure the speed of gpuplace's parts.
    #[command(subcommand)]
    Bench(bench::BenchCommand),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Simulate(args) => simulate::run(args),
        Command::Bench(command) => bench::run(command),
        Command::DevicePlugin(args) => device_plugin::run(args),
        Command::Scheduler(args) => scheduler::run(args),
        Command::Crd => scheduler::print_crd(),
        Command::Policies => {
            for p in gpuplace_core::Policy::ALL {
                println!("{p}");
            }
            Ok(())
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
