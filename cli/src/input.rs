//! Loading the files the command line and the viewer open, recognised by their content.

use std::path::Path;

use anyhow::{Result, bail};
use cachalot_core::error::shorten;
use cachalot_trace::Snapshot;
use cachalot_trace::input::InputError;
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

/// Reads the whole of `path` (a file, a pipe or a device), refusing more than
/// [`cachalot_trace::input::max_input_bytes`]: an endless source such as `/dev/zero` or a huge file is an error naming
/// the limit instead of a read that runs until memory is gone.
pub fn read(path: &Path) -> Result<Vec<u8>> {
    cachalot_trace::input::read(path).map_err(|e| match &e {
        InputError::Read { source, .. } if source.kind() == std::io::ErrorKind::NotFound => {
            anyhow::anyhow!("{}: {}; {REFERENCE_TRACES}", path.display(), e.reason())
        }
        _ => e.into(),
    })
}

/// Where a user who names a file that is not there finds files to try.
pub const REFERENCE_TRACES: &str =
    "PyTorch 2.11's reference traces are in testdata/traces/pytorch-2.11-h200/ of the repository";

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

/// A trace's name: its file name without `.pickle`.
pub fn trace_name(path: &Path) -> String {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    name.strip_suffix(".pickle").unwrap_or(&name).to_owned()
}

/// Parses `4096`, `64MiB`, `4GiB`, `1.5GB` ([`cachalot_core::size::parse_bytes`]), with the
/// command line's messages.
pub fn parse_bytes(text: &str) -> Result<u64, String> {
    use cachalot_core::size::ByteSizeError;
    cachalot_core::size::parse_bytes(text).map_err(|e| match e {
        ByteSizeError::NotANumber => format!("'{}' is not a size", shorten(text)),
        ByteSizeError::UnknownUnit(unit) => format!("unknown unit '{}' in '{}'", shorten(&unit), shorten(text)),
        ByteSizeError::TooLarge => format!("'{}' bytes is {e}", shorten(text)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_units() {
        assert_eq!(parse_bytes("4096"), Ok(4096));
        assert_eq!(parse_bytes("64MiB"), Ok(64 << 20));
        assert_eq!(parse_bytes("4 GiB"), Ok(4 << 30));
        assert_eq!(parse_bytes("1.5GB"), Ok(1_500_000_000));
        assert!(parse_bytes("lots").is_err());
        assert!(parse_bytes("99999999999999999999T").is_err());
        assert!(parse_bytes("2000000000000000000000").is_err());
    }
}
