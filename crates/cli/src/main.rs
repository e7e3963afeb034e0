//! `gpuplace`: the one binary of the gpuplace GPU scheduling stack.

mod bench;
mod defrag;
mod device_plugin;
mod extender;
mod kube_client;
mod logging;
mod ops;
mod progress;
mod queue_flags;
mod replay;
mod replay_report;
mod scheduler;
mod signals;
mod simulate;
mod simulate_timeline;
mod status;
mod status_source;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

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
    /// Serve kube-scheduler's extender API (filter, prioritize, bind) with gpuplace's
    /// placement.
    #[command(args_override_self = true)]
    Extender(extender::ExtenderArgs),
    /// Show the fleet's GPUs: use, holders, fragmentation, pending pods and why.
    #[command(args_override_self = true)]
    Status(status::StatusArgs),
    /// Show what defragmentation would move in the live cluster (`--plan`), touching
    /// nothing.
    #[command(args_override_self = true)]
    Defrag(defrag::DefragArgs),
    /// Replay a GPU trace against a live cluster (real time scaled by --speed) with the
    /// scheduler the pods name, and report as `simulate --timeline` does.
    #[command(args_override_self = true)]
    Replay(replay::ReplayArgs),
    /// Print the PodGroup and Queue CustomResourceDefinitions (YAML).
    Crd,
    /// List the placement policies.
    Policies,
    /// Measure the speed of gpuplace's parts.
    #[command(subcommand)]
    Bench(bench::BenchCommand),
}

/// The command line, where a flag's value may be a negative number (`--load -1` is the
/// value -1, refused by the flag's own check with its bounds, not read as a flag `-1`).
fn command() -> clap::Command {
    fn negatives(cmd: clap::Command) -> clap::Command {
        cmd.mut_args(|a| {
            if a.get_action().takes_values() {
                a.allow_negative_numbers(true)
            } else {
                a
            }
        })
        .mut_subcommands(negatives)
    }
    negatives(<Cli as clap::CommandFactory>::command())
}

fn parse() -> Cli {
    let mut matches = command().get_matches();
    match <Cli as clap::FromArgMatches>::from_arg_matches_mut(&mut matches) {
        Ok(cli) => cli,
        Err(e) => e.format(&mut command()).exit(),
    }
}

fn main() -> ExitCode {
    let cli = parse();
    let result = match cli.command {
        Command::Simulate(args) => simulate::run(args),
        Command::Bench(command) => bench::run(command),
        Command::DevicePlugin(args) => device_plugin::run(args),
        Command::Scheduler(args) => scheduler::run(args),
        Command::Extender(args) => extender::run(args),
        Command::Status(args) => status::run(args),
        Command::Defrag(args) => defrag::run(args),
        Command::Replay(args) => replay::run(args),
        Command::Crd => scheduler::print_crd(),
        Command::Policies => {
            for p in gpuplace_core::Policy::ALL
                .into_iter()
                .chain(gpuplace_core::Policy::EXTRA)
            {
                println!("{p}");
            }
            Ok(())
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", error_chain(&e));
            ExitCode::FAILURE
        }
    }
}

/// The error and its causes, each said once: a cause whose text its parent's message
/// already contains (thiserror messages that show their source) is not repeated.
fn error_chain(e: &anyhow::Error) -> String {
    let mut out = String::new();
    let mut previous = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if !previous.is_empty() && previous.contains(&text) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&text);
        previous = text;
    }
    out
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    #[test]
    fn each_cause_is_said_once() {
        let io = std::io::Error::new(std::io::ErrorKind::NotFound, "No such file or directory");
        #[derive(Debug)]
        struct Read {
            source: std::io::Error,
        }
        impl std::fmt::Display for Read {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(f, "nodes.csv: cannot read: {}", self.source)
            }
        }
        impl std::error::Error for Read {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                Some(&self.source)
            }
        }
        let e = anyhow::Error::new(Read { source: io }).context("cannot load the trace");
        assert_eq!(
            super::error_chain(&e),
            "cannot load the trace: nodes.csv: cannot read: No such file or directory"
        );
    }

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
