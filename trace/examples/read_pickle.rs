//! Reads a PyTorch snapshot pickle with the reader `cachalot` uses and prints how long the read
//! took. `scripts/dev/pickle-speed.sh` runs it under `/usr/bin/time` against Python's
//! `pickle.load` of the same file.
//!
//! ```sh
//! cargo run --release -p cachalot-trace --example read_pickle -- big.pickle
//! ```

use std::time::Instant;

use cachalot_trace::snapshot::pickle;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args().nth(1).ok_or("usage: read_pickle FILE.pickle")?;
    let start = Instant::now();
    let bytes = std::fs::read(&path)?;
    let loaded = start.elapsed();
    let snapshot = pickle::read_snapshot(&bytes)?;
    let read = start.elapsed() - loaded;
    let entries: usize = snapshot.device_traces.iter().map(Vec::len).sum();
    eprintln!(
        "{path}: {entries} entries, {} segments, {} stacks; file read {loaded:.2?}, pickle read {read:.2?}",
        snapshot.segments.len(),
        snapshot.contexts.stacks().len(),
    );
    Ok(())
}
