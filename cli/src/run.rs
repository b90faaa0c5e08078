//! `cachalot run EXPERIMENT [--backend auto|cuda|wgpu|sim] [--device N] [--config STR] [--out FILE]`:
//! runs an experiment of `cachalot-runtime` on a device, prints which device and why, the marks
//! as the run reaches them, then losses, checks and the final `memory_summary()`, and with
//! `--out` writes a snapshot the viewer opens and `cachalot compare` reads. At an out-of-memory
//! error it prints `explain`'s short answer: the main cause and the command that proves a fix. Ctrl-C stops the run
//! at its next operation and keeps the snapshot of what it did ([`crate::interrupt`]).

use std::path::{Path, PathBuf};

use anyhow::anyhow;
use cachalot_core::DeviceFacts;
use cachalot_core::error::{format_size, group_digits, shorten};
use cachalot_runtime::experiments::{Loss, OpsParams, Optimizer};
use cachalot_runtime::stream::{TraceBatch, TraceSink};
use cachalot_runtime::{
    Activation, BackendRequest, DeviceOptions, Experiment, MlpParams, RunResult, SweepParams, execute_watched, open,
};
use cachalot_trace::explain::At;
use cachalot_trace::oom_snapshots::OomSnapshots;

use crate::failure::{Failure, Outcome};
use crate::input::parse_bytes;
use crate::interrupt;

/// Arguments of `cachalot run`.
#[derive(Clone, Debug, clap::Args)]
pub struct RunArgs {
    /// The experiment.
    #[command(subcommand)]
    pub experiment: ExperimentCommand,
    /// The device and where the snapshot goes.
    #[command(flatten)]
    pub run: RunOptions,
    /// Print the abbreviated memory_summary().
    #[arg(long, global = true)]
    pub abbreviated: bool,
    /// At every out-of-memory error of the run, write the allocator's snapshot as that error left
    /// it to this directory (EXPERIMENT.oom-N.json), through an OOM observer (the command the
    /// run prints at its first error then explains that file).
    #[arg(long, global = true)]
    pub oom_snapshot: Option<PathBuf>,
}

/// The device an experiment runs on and where its snapshot goes: the options `cachalot run`
/// and `cachalot view --run` share.
#[derive(Clone, Debug, clap::Args)]
pub struct RunOptions {
    /// auto: CUDA, then wgpu's best adapter, then the simulator. sim runs the CPU reference
    /// kernels on the simulator's allocator (the profile says which device it stands for).
    #[arg(long, default_value = "auto", global = true, value_parser = ["auto", "cuda", "wgpu", "sim"])]
    pub backend: String,
    /// CUDA device ordinal, or the index of the adapter in wgpu's enumeration (default: device
    /// 0 for CUDA, the best adapter for wgpu).
    #[arg(long, global = true)]
    pub device: Option<usize>,
    /// Allocator configuration, PYTORCH_CUDA_ALLOC_CONF syntax (e.g. expandable_segments:True);
    /// default: the PYTORCH_CUDA_ALLOC_CONF variable, as PyTorch reads it (--config wins over it).
    #[arg(long, global = true)]
    pub config: Option<String>,
    /// Write the run's snapshot here (for `cachalot view` and `cachalot compare`); without it,
    /// nothing is written.
    #[arg(long, global = true)]
    pub out: Option<PathBuf>,
    /// Simulator profile: cuda-sm90 (PyTorch 2.11 on an H100/H200: 32 MiB + 1 MiB workspaces,
    /// the default), cuda-sm80 (8.125 MiB + 1 MiB) or wgpu (queue-stream discipline, no
    /// workspaces: the wgpu device's allocator events).
    #[arg(long, global = true)]
    pub profile: Option<String>,
    /// Device memory for wgpu (which cannot query it; default 4 GiB) and the simulator, in
    /// bytes or with a KiB/MiB/GiB suffix.
    #[arg(long, global = true, value_parser = parse_bytes)]
    pub capacity: Option<u64>,
    /// On the simulator, skip the kernels: allocations only (any size, instantly).
    #[arg(long, global = true)]
    pub no_compute: bool,
}

impl RunOptions {
    /// How to open the device; a bad PYTORCH_CUDA_ALLOC_CONF is refused as a bad --config is.
    pub fn device_options(&self) -> anyhow::Result<DeviceOptions> {
        self.with_config(AllocConf::choose(self.config.as_deref())?.settings)
    }

    /// [`device_options`](Self::device_options) with the settings unchecked: for the experiments
    /// the viewer offers, where a bad PYTORCH_CUDA_ALLOC_CONF must not stop the viewing of files
    /// (a run started there reports it, as `cachalot run` would).
    pub fn device_options_unchecked(&self) -> anyhow::Result<DeviceOptions> {
        let variable = std::env::var("PYTORCH_CUDA_ALLOC_CONF").unwrap_or_default();
        self.with_config(self.config.clone().unwrap_or(variable))
    }

    fn with_config(&self, config: String) -> anyhow::Result<DeviceOptions> {
        let backend =
            BackendRequest::parse(&self.backend).ok_or_else(|| anyhow!("unknown backend {}", self.backend))?;
        if self.capacity == Some(0) {
            anyhow::bail!("--capacity 0: a device needs some memory");
        }
        Ok(DeviceOptions {
            backend,
            device: self.device,
            config,
            profile: self.profile.clone(),
            capacity: self.capacity,
            compute: !self.no_compute,
        })
    }
}

/// The allocator settings a command runs with, and where they came from: `--config` wins over
/// the `PYTORCH_CUDA_ALLOC_CONF` variable, which PyTorch users set for the same purpose.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AllocConf {
    /// The settings (`PYTORCH_CUDA_ALLOC_CONF` syntax; empty: PyTorch's defaults).
    pub settings: String,
    /// Where they came from, for the line that says so.
    pub source: String,
}

impl AllocConf {
    /// The settings of `--config` (`flag`), else of the variable. The variable's are checked
    /// here, so a bad value is refused with the error a bad `--config` gets where the device
    /// opens, naming the variable.
    pub fn choose(flag: Option<&str>) -> anyhow::Result<Self> {
        Self::from_sources(flag, std::env::var("PYTORCH_CUDA_ALLOC_CONF").ok().as_deref())
    }

    fn from_sources(flag: Option<&str>, variable: Option<&str>) -> anyhow::Result<Self> {
        let variable = variable.filter(|v| !v.is_empty());
        let (settings, source) = match (flag, variable) {
            (Some(flag), Some(variable)) if flag != variable => {
                (flag, format!("--config; PYTORCH_CUDA_ALLOC_CONF={variable} is not used: --config wins over it"))
            }
            (Some(flag), _) => (flag, "--config".to_owned()),
            (None, Some(variable)) => {
                cachalot_runtime::select::parse_config(variable)
                    .map_err(|e| anyhow!("{e} (from the PYTORCH_CUDA_ALLOC_CONF variable; --config wins over it)"))?;
                (variable, "the PYTORCH_CUDA_ALLOC_CONF variable".to_owned())
            }
            (None, None) => ("", "no --config, PYTORCH_CUDA_ALLOC_CONF unset".to_owned()),
        };
        Ok(AllocConf { settings: settings.to_owned(), source })
    }

    /// `allocator config: SETTINGS (SOURCE)`.
    pub fn describe(&self) -> String {
        let settings = if self.settings.is_empty() { "PyTorch's defaults" } else { &self.settings };
        format!("allocator config: {settings} ({})", self.source)
    }
}

/// The experiments.
#[derive(Clone, Debug, clap::Subcommand)]
pub enum ExperimentCommand {
    /// The classic PyTorch memory demonstrations with the sizes of seeds.expected.json: a 4-byte
    /// tensor, empty_cache, a 10240x1050 tensor, Linear(1024, 10) on a 10240x1024 input,
    /// y = 5x and its backward.
    Seeds,
    /// Train a stack of linear layers (forward, backward, optimiser step) over changing batch sizes.
    MlpTrain(MlpArgs),
    /// Matrix products over a range of shapes, every result read back and checked.
    MatmulSweep(SweepArgs),
    /// An op file (`a ID SIZE [STREAM]`, `f ID`; testdata/bench-ops has some) as allocations, no kernels.
    Ops {
        /// The op file.
        file: PathBuf,
        /// A mark every this many ops (0: at the end only).
        #[arg(long, default_value_t = 0)]
        mark_every: usize,
        /// Run at most this many ops per second, as a job that computes between its allocations
        /// would (0: as fast as it goes); the sleeps are not counted in the op loop's time.
        #[arg(long, default_value_t = 0)]
        ops_per_second: u64,
    },
}

/// Arguments of `mlp-train`.
#[derive(Clone, Debug, clap::Args)]
pub struct MlpArgs {
    /// Training steps.
    #[arg(long, default_value_t = 12)]
    pub steps: u32,
    /// Layer widths: inputs, hidden layers, outputs (classes).
    #[arg(long, value_delimiter = ',', default_values_t = [256usize, 512, 512, 10])]
    pub widths: Vec<usize>,
    /// Number of hidden layers (repeats the first hidden width).
    #[arg(long)]
    pub depth: Option<usize>,
    /// Batch sizes, used in turn.
    #[arg(long, value_delimiter = ',', default_values_t = [64usize, 128, 32])]
    pub batches: Vec<usize>,
    /// Optimiser.
    #[arg(long, default_value = "adam", value_parser = ["sgd", "adam"])]
    pub optimizer: String,
    /// Learning rate.
    #[arg(long, default_value_t = 1e-3)]
    pub lr: f32,
    /// SGD momentum (0: none).
    #[arg(long, default_value_t = 0.9)]
    pub momentum: f32,
    /// Activation between layers.
    #[arg(long, default_value = "relu", value_parser = ["relu", "gelu"])]
    pub activation: String,
    /// Loss.
    #[arg(long, default_value = "cross-entropy", value_parser = ["cross-entropy", "mse"])]
    pub loss: String,
    /// Seed of parameters and data.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

/// Arguments of `matmul-sweep`.
#[derive(Clone, Debug, clap::Args)]
pub struct SweepArgs {
    /// Shapes as MxNxK (default: 64³ to 1024³ and odd shapes).
    #[arg(long, value_delimiter = ',')]
    pub shapes: Vec<String>,
    /// Square sizes N (N x N x N), added to --shapes.
    #[arg(long, value_delimiter = ',')]
    pub sizes: Vec<u32>,
    /// Layouts: nn, nt (B transposed), tn (A transposed).
    #[arg(long, value_delimiter = ',', default_values_t = ["nn".to_owned(), "nt".to_owned(), "tn".to_owned()])]
    pub layouts: Vec<String>,
    /// Largest norm-wise relative error accepted.
    #[arg(long, default_value_t = 1e-4)]
    pub tolerance: f64,
    /// Seed of the operands.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

/// `--out` must name a file in an existing folder: checked before the run, not after it.
fn check_out(out: &std::path::Path) -> anyhow::Result<()> {
    if out.is_dir() {
        anyhow::bail!("--out {}: is a folder; name the snapshot file", out.display());
    }
    let folder = out.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(std::path::Path::new("."));
    if !folder.is_dir() {
        anyhow::bail!("--out {}: the folder {} does not exist", out.display(), folder.display());
    }
    Ok(())
}

/// The experiment a command names, its parameters checked.
pub fn experiment(command: &ExperimentCommand) -> anyhow::Result<Experiment> {
    Ok(match command {
        ExperimentCommand::Seeds => Experiment::Seeds,
        ExperimentCommand::MlpTrain(a) => {
            let mut params = MlpParams {
                widths: a.widths.clone(),
                steps: a.steps,
                batches: a.batches.clone(),
                optimizer: if a.optimizer == "sgd" { Optimizer::Sgd } else { Optimizer::Adam },
                lr: a.lr,
                momentum: a.momentum,
                activation: if a.activation == "gelu" { Activation::Gelu } else { Activation::Relu },
                loss: if a.loss == "mse" { Loss::Mse } else { Loss::CrossEntropy },
                seed: a.seed,
            };
            if let Some(depth) = a.depth {
                params = params.with_depth(depth);
            }
            params.validate()?;
            Experiment::MlpTrain(params)
        }
        ExperimentCommand::MatmulSweep(a) => {
            let mut shapes = Vec::new();
            for s in &a.shapes {
                let dims: Vec<u32> = s
                    .split('x')
                    .map(|d| d.trim().parse::<u32>())
                    .collect::<Result<_, _>>()
                    .map_err(|_| anyhow!("--shapes '{}': expected MxNxK", shorten(s)))?;
                match dims[..] {
                    [m, n, k] => shapes.push((m, n, k)),
                    _ => anyhow::bail!("--shapes '{}': expected MxNxK", shorten(s)),
                }
            }
            shapes.extend(a.sizes.iter().map(|&n| (n, n, n)));
            let defaults = SweepParams::default();
            Experiment::MatmulSweep(SweepParams {
                shapes: if shapes.is_empty() { defaults.shapes } else { shapes },
                layouts: a.layouts.clone(),
                tolerance: a.tolerance,
                seed: a.seed,
            })
        }
        ExperimentCommand::Ops { file, mark_every, ops_per_second } => Experiment::Ops(OpsParams {
            path: file.display().to_string(),
            mark_every: *mark_every,
            ops_per_second: *ops_per_second,
        }),
    })
}

/// Runs the command: says which device and why, prints each mark as the run reaches it, then
/// what the run found and `memory_summary()`, and writes the snapshot where `--out` says. Exit
/// status 1 when the experiment stops or a check fails (the snapshot is written either way), 2
/// when the device cannot be opened or the input is bad (every input is checked before anything
/// is run or written, so a bad one leaves an earlier snapshot at `--out` as it was), 130 after
/// Ctrl-C (which keeps the snapshot of the run so far).
pub fn run(args: &RunArgs) -> Outcome {
    let experiment = experiment(&args.experiment).map_err(Failure::input)?;
    let conf = AllocConf::choose(args.run.config.as_deref()).map_err(Failure::input)?;
    let options = args.run.device_options().map_err(Failure::input)?;
    if let Some(out) = &args.run.out {
        check_out(out).map_err(Failure::input)?;
    }
    let name = experiment.name();
    let dumps = match &args.oom_snapshot {
        Some(dir) => {
            Some(OomSnapshots::new(dir, name, &format!("run of {name}")).map_err(|e| Failure::input(anyhow!(e)))?)
        }
        None => None,
    };
    let (mut device, selection) = open(&options).map_err(|e| Failure::input(anyhow!(e)))?;
    experiment.check(device.allocator().device()).map_err(|e| Failure::input(anyhow!(e)))?;
    if let Some(dumps) = &dumps {
        device.held_mut().attach_oom_observer(dumps.observer());
    }

    // The device first: a run on a slow device takes a while before its first mark.
    println!("{name} on {}", selection.backend.name());
    for line in &selection.lines {
        println!("  {line}");
    }
    println!("  streams: {}", device.discipline().describe());
    println!("  {}", conf.describe());
    interrupt::catch_first();
    let result = execute_watched(&experiment, device, selection, Box::new(MarkPrinter::default()));
    if let Some(error) = dumps.as_ref().and_then(OomSnapshots::first_error) {
        return Err(Failure::input(anyhow!(error)));
    }
    let record = &result.record;
    let out = args.run.out.as_deref();
    if record.error.is_some() && interrupt::requested() {
        return interrupted(&result, out);
    }

    let outcome = &record.outcome;
    if record.computes && !outcome.losses.is_empty() {
        println!("\nloss per step");
        for (step, (loss, timing)) in outcome.losses.iter().zip(&result.snapshot.timings).enumerate() {
            println!("  step {step:<4} {loss:.6}   ({:.4} s)", timing.seconds);
        }
    }
    for line in &outcome.lines {
        println!("{line}");
    }
    if !outcome.checks.is_empty() {
        let passed = outcome.checks.iter().filter(|c| c.passed).count();
        println!("\nchecks: {passed} of {} passed", outcome.checks.len());
        for c in outcome.checks.iter().filter(|c| !c.passed || outcome.checks.len() <= 8) {
            println!("  {} {}: {}", if c.passed { "ok  " } else { "FAIL" }, c.name, c.detail);
        }
    }
    for note in &record.notes {
        println!("note: {note}");
    }

    println!("\n{}", result.summary.trim_end());

    match out {
        Some(out) => {
            write_snapshot(out, &result)?;
            println!(
                "\nsnapshot: {} (open it with `cachalot view`, put runs side by side with `cachalot compare`)",
                out.display()
            );
        }
        None => println!(
            "\nno snapshot written: add --out FILE.json to keep one for `cachalot view` and `cachalot compare`"
        ),
    }
    if let (Some(dumps), Some(dir)) = (&dumps, &args.oom_snapshot) {
        println!("out-of-memory snapshots: {} in {}", dumps.written(), dir.display());
    }
    if result.snapshot.stats.num_ooms > 0 {
        println!("\n{}", explain_first_error(&result, name, args, dumps.as_ref()).trim_end());
    }

    if let Some(error) = &record.error {
        return Err(Failure { status: 1, error: anyhow!("the experiment stopped: {error}") });
    }
    if !result.succeeded() {
        return Err(Failure { status: 1, error: anyhow!("a check failed") });
    }
    Ok(())
}

/// The short answer at the run's first out-of-memory error ([`crate::explain::at_error`]),
/// read off the run's own trace, with the command that explains the file the run wrote.
fn explain_first_error(result: &RunResult, name: &str, args: &RunArgs, dumps: Option<&OomSnapshots>) -> String {
    let file = match (dumps.filter(|d| d.written() > 0), &args.oom_snapshot, &args.run.out) {
        (Some(_), Some(dir), _) => dir.join(format!("{name}.oom-1.json")).display().to_string(),
        (_, _, Some(out)) => out.display().to_string(),
        _ => "FILE.json (run again with --out FILE.json to keep the run's snapshot)".to_owned(),
    };
    let command = format!("cachalot explain {file}");
    match crate::explain::of_cachalot(&result.snapshot) {
        Ok((trace, options)) => crate::explain::at_error(&trace, &options, At::FirstOom, &command),
        Err(error) => format!("out of memory, not explained: the run's settings: {error}"),
    }
}

/// After Ctrl-C: what the run did before it stopped, and the snapshot of that part.
fn interrupted(result: &RunResult, out: Option<&Path>) -> Outcome {
    let snapshot = &result.snapshot;
    let last = snapshot.marks.last().map_or_else(String::new, |m| format!(", the last {}", m.label));
    println!(
        "\ninterrupted: {} stopped after {} marks{last} and {} allocator events (peak allocated {} B, peak \
         reserved {} B)",
        result.record.experiment.name(),
        snapshot.marks.len(),
        snapshot.trace.len(),
        group_digits(snapshot.stats.max_memory_allocated()),
        group_digits(snapshot.stats.max_memory_reserved()),
    );
    match out {
        Some(out) => {
            write_snapshot(out, result)?;
            println!("snapshot of the run so far: {}", out.display());
        }
        None => println!("no snapshot written: add --out FILE.json to keep one"),
    }
    Err(Failure { status: 130, error: anyhow!("interrupted (Ctrl-C)") })
}

/// Writes the run's snapshot to `out` whole or not at all: into a file beside it, then renamed
/// over it, so an interrupted or failed write never leaves half a snapshot under that name.
fn write_snapshot(out: &Path, result: &RunResult) -> Result<(), Failure> {
    cachalot_trace::output::write_atomic(out, &result.snapshot.to_json())
        .map_err(|e| Failure::input(anyhow!("writing {}: {e}", out.display())))
}

/// Prints each mark as the run reaches it, and asks the run to stop after Ctrl-C.
#[derive(Default)]
struct MarkPrinter {
    printed: usize,
}

/// The width of a mark's label column: the labels of the experiments fit (`256x256x256 nn`).
const LABEL_WIDTH: usize = 14;

impl TraceSink for MarkPrinter {
    fn begin(&mut self, _device: &DeviceFacts, _settings: &str) {}

    fn deliver(&mut self, batch: TraceBatch) {
        for m in &batch.marks {
            if self.printed == 0 {
                println!("\nmarks (as torch.cuda.memory_allocated() / memory_reserved() would read)");
            }
            self.printed += 1;
            println!(
                "  {:<LABEL_WIDTH$}  allocated {:>15} ({:>10})   reserved {:>15} ({:>10})",
                m.label,
                group_digits(m.allocated),
                format_size(m.allocated),
                group_digits(m.reserved),
                format_size(m.reserved)
            );
        }
    }

    fn stop_requested(&self) -> bool {
        interrupt::requested()
    }

    fn wants_trace(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_wins_over_the_variable_and_a_bad_variable_is_refused() {
        let chosen = |flag, variable| AllocConf::from_sources(flag, variable).map(|c| c.settings);
        assert_eq!(chosen(None, None).unwrap(), "");
        assert_eq!(chosen(None, Some("")).unwrap(), "", "an empty variable is PyTorch's defaults");
        assert_eq!(chosen(None, Some("expandable_segments:True")).unwrap(), "expandable_segments:True");
        assert_eq!(
            chosen(Some("max_split_size_mb:64"), Some("expandable_segments:True")).unwrap(),
            "max_split_size_mb:64"
        );
        assert_eq!(
            chosen(Some(""), Some("expandable_segments:maybe")).unwrap(),
            "",
            "--config wins, unchecked variable"
        );
        let error = chosen(None, Some("expandable_segments:maybe")).unwrap_err().to_string();
        assert!(error.contains("'expandable_segments:maybe'") && error.contains("PYTORCH_CUDA_ALLOC_CONF"), "{error}");
        let ignored = AllocConf::from_sources(Some("x:1"), Some("expandable_segments:True")).unwrap();
        assert!(ignored.describe().contains("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True is not used"));
    }
}
