//! Loading the files the command line and the viewer open, recognised by their content.

use std::path::Path;

use anyhow::{Context, Result, bail};
use cachalot_trace::Snapshot;
use cachalot_trace::ops::OpFile;
use cachalot_trace::snapshot::torch::TorchSnapshot;
use cachalot_trace::snapshot::{FileFormat, pickle};

/// A file as it was recognised.
pub enum Input {
    /// A cachalot snapshot (JSON).
    Cachalot(Box<Snapshot>),
    /// A PyTorch snapshot pickle.
    Torch(Box<TorchSnapshot>),
    /// An op file (`a ID SIZE [STREAM]` / `f ID`).
    Ops(OpFile),
}

/// Reads and parses `path`; errors name the file and the place in it.
pub fn load(path: &Path) -> Result<Input> {
    let bytes = read(path)?;
    parse(path, &bytes)
}

/// The most bytes an input file may have unless `CACHALOT_MAX_INPUT_BYTES` says otherwise:
/// 1 GiB, about eight times the 3,000,000-entry pickle of BENCHMARKS.md.
pub const DEFAULT_MAX_INPUT_BYTES: u64 = 1 << 30;

/// The input size limit: `CACHALOT_MAX_INPUT_BYTES` if set, else [`DEFAULT_MAX_INPUT_BYTES`].
pub fn max_input_bytes() -> Result<u64> {
    match std::env::var("CACHALOT_MAX_INPUT_BYTES") {
        Ok(text) => text
            .trim()
            .parse::<u64>()
            .ok()
            .filter(|&n| n > 0)
            .with_context(|| format!("CACHALOT_MAX_INPUT_BYTES={text}: expected a positive number of bytes")),
        Err(_) => Ok(DEFAULT_MAX_INPUT_BYTES),
    }
}

/// Reads the whole of `path` (a file, a pipe or a device), refusing more than
/// [`max_input_bytes`]: an endless source such as `/dev/zero` or a huge file is an error naming
/// the limit instead of a read that runs until memory is gone.
pub fn read(path: &Path) -> Result<Vec<u8>> {
    use std::io::Read;
    let limit = max_input_bytes()?;
    let name = path.display();
    let file = std::fs::File::open(path).with_context(|| format!("{name}: cannot read"))?;
    // A regular file's length sizes the buffer; a pipe or a device says 0 and grows it.
    let known = file.metadata().map(|m| m.len()).unwrap_or(0);
    if known > limit {
        bail!(
            "{name}: {known} bytes is more than the input limit of {limit} (set CACHALOT_MAX_INPUT_BYTES to raise it)"
        );
    }
    let mut bytes = Vec::with_capacity(known as usize);
    file.take(limit + 1).read_to_end(&mut bytes).with_context(|| format!("{name}: cannot read"))?;
    if bytes.len() as u64 > limit {
        bail!("{name}: more than the input limit of {limit} bytes (set CACHALOT_MAX_INPUT_BYTES to raise it)");
    }
    Ok(bytes)
}

/// Parses the bytes of a file called `path`.
pub fn parse(path: &Path, bytes: &[u8]) -> Result<Input> {
    let name = path.display();
    match FileFormat::detect(bytes) {
        FileFormat::TorchPickle => {
            let snapshot = pickle::read_snapshot(bytes).map_err(|e| anyhow::anyhow!("{name}: {e}"))?;
            Ok(Input::Torch(Box::new(snapshot)))
        }
        FileFormat::Cachalot => {
            let snapshot = Snapshot::from_json(bytes).map_err(|e| anyhow::anyhow!("{name}: {e}"))?;
            Ok(Input::Cachalot(Box::new(snapshot)))
        }
        FileFormat::Ops => {
            let text = std::str::from_utf8(bytes).map_err(|e| anyhow::anyhow!("{name}: not UTF-8 text: {e}"))?;
            Ok(Input::Ops(OpFile::parse(text).map_err(|e| anyhow::anyhow!("{name}: {e}"))?))
        }
        FileFormat::Empty => bail!("{name}: the file is empty"),
        FileFormat::Unknown => bail!("{name}: not a cachalot snapshot (JSON), a PyTorch snapshot pickle or an op file"),
    }
}

/// Where a trace's allocator settings come from, for errors: the `PYTORCH_CUDA_ALLOC_CONF` of the
/// `NAME.expected.json` beside `trace` when there is one (it takes precedence), else the
/// pickle's `allocator_settings`.
pub fn settings_place(trace: &Path, has_expected: bool) -> String {
    match has_expected {
        true => {
            let name = trace.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            let stem = name.strip_suffix(".pickle").unwrap_or(&name);
            format!("{}: PYTORCH_CUDA_ALLOC_CONF", trace.with_file_name(format!("{stem}.expected.json")).display())
        }
        false => format!("{}: allocator_settings", trace.display()),
    }
}
