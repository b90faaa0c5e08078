//! Reads a PyTorch snapshot pickle and prints how long the read took: with the streaming reader
//! that `cachalot` uses, or with `--general`, the `pickled` crate's value graph converted
//! afterwards (the reader before issue 22). `scripts/dev/pickle-speed.sh` runs both under
//! `/usr/bin/time` against Python's `pickle.load` of the same file.
//!
//! ```sh
//! cargo run --release -p cachalot-trace --example read_pickle -- [--general] big.pickle
//! ```

use std::time::Instant;

use cachalot_trace::snapshot::pickle;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut general = false;
    let mut path = None;
    for arg in std::env::args().skip(1) {
        match arg.as_str() {
            "--general" => general = true,
            _ => path = Some(arg),
        }
    }
    let path = path.ok_or("usage: read_pickle [--general] FILE.pickle")?;
    let start = Instant::now();
    let bytes = std::fs::read(&path)?;
    let loaded = start.elapsed();
    let snapshot = if general { pickle::read_snapshot_general(&bytes)? } else { pickle::read_snapshot(&bytes)? };
    let read = start.elapsed() - loaded;
    let entries: usize = snapshot.device_traces.iter().map(Vec::len).sum();
    eprintln!(
        "{path}: {entries} entries, {} segments, {} stacks; file read {loaded:.2?}, pickle read {read:.2?} ({})",
        snapshot.segments.len(),
        snapshot.contexts.stacks().len(),
        if general { "general reader" } else { "streaming reader" }
    );
    Ok(())
}
