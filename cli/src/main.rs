//! `cachalot`: PyTorch's CUDA caching allocator on every GPU — replay, inspect and compare.

mod bench;
mod compare;
mod explain;
mod failure;
mod input;
mod interrupt;
mod replay;
mod report;
mod run;
mod serve;
mod tune;
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
    /// Find the PYTORCH_CUDA_ALLOC_CONF a PyTorch trace needs (candidate settings replayed, ranked) and what policy:cachalot saves
    ///
    /// Each candidate is an exact replay of the trace, so its peak is the one PyTorch would reach
    /// with that setting. cachalot's own policy (policy:cachalot: not a PyTorch setting, it needs
    /// cachalot as the allocator) is replayed beside them, never ranked among them: its peak
    /// reserved against the trace's settings and PyTorch's best, its device calls, and how
    /// memory_allocated() reads under it.
    Tune(tune::TuneArgs),
    /// Why a recorded job ran out of memory: the causes at the failing request and the fix, proven by replay.
    Explain(explain::ExplainArgs),
    /// Run an experiment on CUDA, wgpu or the simulator: marks, memory_summary() and a snapshot.
    Run(run::RunArgs),
    /// Time op files (testdata/bench-ops) on CUDA, wgpu or the simulator, in torch_alloc_bench.py's shape.
    Bench(bench::BenchArgs),
    /// Put runs (snapshots of `run`, PyTorch's expected.json) side by side, with the reasons they differ.
    Compare(compare::CompareArgs),
    /// Open the pool viewer (or render it headless with --screenshot, or time it with --bench).
    View(Box<view::ViewArgs>),
    /// Serve the web viewer (built by scripts/build-web.sh) on localhost.
    Serve(serve::ServeArgs),
}

fn main() -> ExitCode {
    // Both change the process's environment, so they come before anything that could start a thread.
    #[cfg(unix)]
    {
        die_quietly_on_closed_pipe();
        provide_runtime_dir();
    }
    let cli = Cli::try_parse().unwrap_or_else(|error| exit_on_bad_command_line(error));
    let outcome = match &cli.command {
        Command::Summary { source, abbreviated, device } => report::summary(source, *abbreviated, *device),
        Command::Stats { source, json } => report::stats(source, *json),
        Command::Replay(args) => replay::run(args),
        Command::Tune(args) => tune::run(args),
        Command::Explain(args) => explain::run(args),
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

/// Reports a command line clap refused, as clap does (help and version included), but with a bad
/// value quoted by its first bytes and its length (`cachalot_core::error::shorten`): clap quotes
/// a value whole, and a 5 MB one would make a 5 MB error line.
fn exit_on_bad_command_line(error: clap::Error) -> ! {
    use clap::error::{ContextKind, ContextValue};
    if let Some(ContextValue::String(value)) = error.get(ContextKind::InvalidValue) {
        let short = cachalot_core::error::shorten(value);
        if short.len() < value.len() {
            let text = error.render().to_string().replace(value.as_str(), &short);
            eprint!("{text}");
            std::process::exit(error.exit_code());
        }
    }
    error.exit()
}

/// Output written into a closed pipe (`cachalot stats --json | head`) ends the process quietly, as
/// it does every Unix tool. Rust starts programs with SIGPIPE ignored, which turns the closed pipe
/// into an error that `println!` panics on.
#[cfg(unix)]
fn die_quietly_on_closed_pipe() {
    // SAFETY: `main` calls this before any thread exists, and `SIG_DFL` is a valid disposition.
    // `cachalot serve` writes to sockets, which Rust's std sends with MSG_NOSIGNAL on Linux, so a
    // visitor who closes a connection early gets no signal sent to the server.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

/// Mesa's drivers (the software Vulkan and OpenGL that wgpu and the viewer use without a GPU)
/// print `error: XDG_RUNTIME_DIR is invalid or not set in the environment.` twice on every start
/// without one: in containers, on CI, over ssh without a login session. A private directory under
/// the temporary one (this user's, mode 0700, as the XDG specification asks) stands in for it.
#[cfg(unix)]
fn provide_runtime_dir() {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};

    if std::env::var_os("XDG_RUNTIME_DIR").is_some_and(|dir| !dir.is_empty()) {
        return;
    }
    // SAFETY: getuid has no preconditions and cannot fail.
    let uid = unsafe { libc::getuid() };
    let dir = std::env::temp_dir().join(format!("cachalot-runtime-{uid}"));
    // It may exist from an earlier run; whether it is usable is checked below either way.
    let _ = std::fs::DirBuilder::new().mode(0o700).create(&dir);
    let private = std::fs::symlink_metadata(&dir)
        .is_ok_and(|m| m.is_dir() && m.uid() == uid && m.permissions().mode() & 0o777 == 0o700);
    if private {
        // SAFETY: `main` calls this before any thread exists, so nothing reads the environment
        // while it changes.
        unsafe { std::env::set_var("XDG_RUNTIME_DIR", &dir) };
    }
}
