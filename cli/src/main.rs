//! `cachalot`: PyTorch's CUDA caching allocator on every GPU — replay, inspect and compare.

mod bench;
mod compare;
mod failure;
mod input;
mod replay;
mod report;
mod run;
mod serve;
mod view;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// cachalot: a caching GPU memory allocator that behaves exactly like PyTorch's.
#[derive(Debug, Parser)]
// The text `cachalot --help` has always shown: the binary is the command line and opens the viewer.
#[command(
    name = "cachalot",
    version,
    about = "The cachalot command line and the egui/eframe pool viewer (desktop and web)."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Print memory_summary() of a snapshot's end state (a trace or op file is replayed first).
    Summary {
        #[command(flatten)]
        source: report::SourceArgs,
        /// Leave out the per-pool rows.
        #[arg(long)]
        abbreviated: bool,
        /// Device ID shown in the title.
        #[arg(long, default_value_t = 0)]
        device: u32,
    },
    /// Print memory_stats() of a snapshot's end state.
    Stats {
        #[command(flatten)]
        source: report::SourceArgs,
        /// As a JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Replay PyTorch traces on the simulator; --check compares with what PyTorch recorded.
    Replay(replay::ReplayArgs),
    /// Run an experiment on CUDA, wgpu or the simulator: marks, memory_summary() and a snapshot.
    Run(run::RunArgs),
    /// Time op files (shared/bench) on CUDA, wgpu or the simulator, in torch_alloc_bench.py's shape.
    Bench(bench::BenchArgs),
    /// Put runs (snapshots of `run`, PyTorch's expected.json) side by side, with the reasons they differ.
    Compare(compare::CompareArgs),
    /// Open the pool viewer (or render it headless with --screenshot, or time it with --bench).
    View(view::ViewArgs),
    /// Serve the web viewer (built by scripts/build-web.sh) on localhost.
    Serve(serve::ServeArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let outcome = match &cli.command {
        Command::Summary { source, abbreviated, device } => report::summary(source, *abbreviated, *device),
        Command::Stats { source, json } => report::stats(source, *json),
        Command::Replay(args) => replay::run(args),
        Command::Run(args) => run::run(args),
        Command::Bench(args) => bench::run(args),
        Command::Compare(args) => compare::run(args),
        Command::View(args) => view::run(args),
        Command::Serve(args) => serve::run(args),
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => {
            eprintln!("cachalot: {:#}", failure.error);
            ExitCode::from(failure.status)
        }
    }
}
