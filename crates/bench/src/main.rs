//! `gpuplace-bench`: gpuplace's scheduler, extender and preemption timed at cluster scale
//! against the in-memory API server of `gpuplace-testkit`.
//!
//! A binary of its own because it links test fakes and a counting global allocator, which
//! the release binary (`gpuplace`) must not hold; `gpuplace bench placement` (the core
//! alone) stays in the release binary.

mod extender;
mod heap;
mod preemption;
mod scheduler;
mod stream;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[global_allocator]
static ALLOCATOR: heap::CountingAllocator = heap::CountingAllocator;

#[derive(Parser)]
#[command(
    name = "gpuplace-bench",
    version,
    about = "Time gpuplace's scheduler, extender and preemption against the in-memory API server",
    args_override_self = true
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Schedule pending pods against the in-memory API: pods bound per second end to end,
    /// where the time goes, the core alone, and the scheduler's memory.
    Scheduler(scheduler::SchedulerBenchArgs),
    /// Time the extender's filter + prioritize per pod at scale, through its HTTP router
    /// against the in-memory API.
    Extender(extender::ExtenderBenchArgs),
    /// Time preemption's decisions at scale: a full cluster of low-priority pods, then
    /// high-priority pods that must evict.
    Preemption(preemption::PreemptionBenchArgs),
}

fn main() -> ExitCode {
    let result = match Cli::parse().command {
        Command::Scheduler(args) => scheduler::run(args),
        Command::Extender(args) => extender::run(args),
        Command::Preemption(args) => preemption::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
