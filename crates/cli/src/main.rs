//! `gpuplace`: the one binary of the gpuplace GPU scheduling stack.

mod bench;
#[cfg(feature = "bench-fakes")]
mod bench_scheduler;
mod device_plugin;
#[cfg(feature = "bench-fakes")]
mod heap;
mod logging;
mod scheduler;
mod signals;
mod simulate;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[cfg(feature = "bench-fakes")]
#[global_allocator]
static ALLOCATOR: heap::CountingAllocator = heap::CountingAllocator;

/// A repeated flag takes its last value (as Kubernetes components do), so a wrapper can set
/// a default and its caller override it.
#[derive(Parser)]
#[command(
    name = "gpuplace",
    version,
    about = "GPU placement for Kubernetes: exact devices, topology, fragmentation-aware policies",
    args_override_self = true
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Replay a GPU cluster trace (or the built-in workload) against placement policies.
    #[command(args_override_self = true)]
    Simulate(simulate::SimulateArgs),
    /// Serve the kubelet device plugin API (run as a DaemonSet on GPU nodes).
    #[command(args_override_self = true)]
    DevicePlugin(device_plugin::DevicePluginArgs),
    /// Schedule pods (spec.schedulerName) onto nodes and exact GPUs.
    #[command(args_override_self = true)]
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

#[cfg(test)]
mod tests {
    use clap::Parser;

    #[test]
    fn a_repeated_flag_takes_its_last_value() {
        let cli = super::Cli::try_parse_from([
            "gpuplace",
            "device-plugin",
            "--pass-device-specs",
            "true",
            "--pass-device-specs",
            "false",
            "--replicas",
            "2",
            "--replicas",
            "3",
        ])
        .unwrap_or_else(|e| panic!("{e}"));
        let super::Command::DevicePlugin(args) = cli.command else {
            panic!("not the device plugin");
        };
        let settings = format!("{args:?}");
        assert!(
            settings.contains("pass_device_specs: Some(false)"),
            "{settings}"
        );
        assert!(settings.contains("replicas: Some(3)"), "{settings}");
        assert!(
            super::Cli::try_parse_from(["gpuplace", "scheduler", "--seed", "1", "--seed", "2"])
                .is_ok()
        );
    }
}
