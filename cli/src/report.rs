//! `cachalot summary` and `cachalot stats`: the end state of a snapshot, a trace or an op file.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use cachalot_core::{AllocatorConfig, CachingAllocator, MemoryStats, SimBackend};
use cachalot_trace::replay::{ExpectedRun, ReplayOptions, replay};

use crate::failure::Outcome;
use crate::input::{Input, load};

/// How to turn a file into end-of-run stats.
#[derive(Clone, Debug, clap::Args)]
pub struct SourceArgs {
    /// A cachalot snapshot (.json), a PyTorch snapshot pickle, or an op file.
    pub file: PathBuf,
    /// Allocator configuration (PYTORCH_CUDA_ALLOC_CONF syntax) for traces and op files;
    /// default: the trace's own settings, or PyTorch's defaults.
    #[arg(long)]
    pub config: Option<String>,
    /// Total device memory in bytes for the simulator (default: the trace's, or an H200's).
    #[arg(long)]
    pub device_total: Option<u64>,
}

/// The end-of-run stats of a file: stored in a cachalot snapshot, or obtained by replaying a
/// PyTorch trace or an op file on the simulator.
pub fn end_stats(args: &SourceArgs) -> Result<MemoryStats> {
    match load(&args.file)? {
        Input::Cachalot(snapshot) => Ok(snapshot.stats),
        Input::Torch(snapshot) => {
            let expected = expected_beside(&args.file)?;
            let mut options = ReplayOptions::for_snapshot(&snapshot, expected.as_ref())
                .with_context(|| crate::input::settings_place(&args.file, expected.is_some()))?;
            if let Some(settings) = &args.config {
                options.config = AllocatorConfig::parse(settings).context("--config")?;
            }
            if let Some(total) = args.device_total {
                options.device_total = total;
            }
            let outcome =
                replay(&snapshot, &options, |_, _| {}).map_err(|e| anyhow::anyhow!("{}: {e}", args.file.display()))?;
            Ok(outcome.allocator.stats())
        }
        Input::Ops(ops) => {
            let config = AllocatorConfig::parse(args.config.as_deref().unwrap_or("")).context("--config")?;
            let total = args.device_total.unwrap_or(cachalot_trace::replay::DEFAULT_DEVICE_TOTAL);
            let mut allocator = CachingAllocator::new(SimBackend::new(total), config)?;
            let mut handles = vec![None; ops.handles];
            ops.replay(&mut allocator, &mut handles, false)
                .map_err(|e| anyhow::anyhow!("{}: {e}", args.file.display()))?;
            Ok(allocator.stats())
        }
    }
}

/// `NAME.expected.json` beside `NAME.pickle`, if there is one.
pub fn expected_beside(trace: &Path) -> Result<Option<ExpectedRun>> {
    expected_for_device(trace, 0)
}

/// What was recorded for device `device` of `trace` ([`ExpectedRun::beside_device`]).
pub fn expected_for_device(trace: &Path, device: usize) -> Result<Option<ExpectedRun>> {
    ExpectedRun::beside_device(trace, device).map_err(anyhow::Error::msg)
}

/// `cachalot summary FILE`.
pub fn summary(args: &SourceArgs, abbreviated: bool, device: u32) -> Outcome {
    let stats = end_stats(args)?;
    print!("{}", cachalot_core::summary::memory_summary(&stats, device, abbreviated));
    Ok(())
}

/// `cachalot stats FILE [--json]`.
pub fn stats(args: &SourceArgs, json: bool) -> Outcome {
    let flat = end_stats(args)?.to_flat();
    if json {
        println!("{}", serde_json::to_string_pretty(&flat).context("stats as JSON")?);
    } else {
        let width = flat.keys().map(String::len).max().unwrap_or(0);
        for (key, value) in flat {
            println!("{key:<width$}  {value}");
        }
    }
    Ok(())
}
