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
    let bytes = std::fs::read(path).with_context(|| format!("{}: cannot read", path.display()))?;
    parse(path, &bytes)
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
