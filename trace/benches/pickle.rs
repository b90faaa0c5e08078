//! `cargo bench -p cachalot-trace --bench pickle`: reads each reference PyTorch snapshot pickle
//! (`testdata/traces`) with the streaming reader `cachalot` uses and, as the reference in the
//! same run, with the general reader (the `pickled` crate's value graph, converted afterwards),
//! and prints the median of five reads of each and their ratio. Arguments filter the files by
//! name. The large-file comparison against Python's `pickle.load` is
//! `scripts/dev/pickle-speed.sh` (BENCHMARKS.md §5).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use cachalot_trace::snapshot::pickle::{read_snapshot, read_snapshot_general};

const READS: usize = 5;

fn median_read(bytes: &[u8], read: fn(&[u8]) -> bool) -> Duration {
    let mut times: Vec<Duration> = (0..READS)
        .map(|_| {
            let start = Instant::now();
            assert!(read(bytes), "the reference pickle reads");
            start.elapsed()
        })
        .collect();
    times.sort();
    times[READS / 2]
}

fn main() {
    let filters: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with("--")).collect();
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../testdata/traces/pytorch-2.11-h200");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "pickle"))
        .filter(|p| filters.is_empty() || filters.iter().any(|f| p.to_string_lossy().contains(f.as_str())))
        .collect();
    files.sort();
    println!("{:<28} {:>10} {:>12} {:>12} {:>8}", "pickle", "bytes", "stream ms", "general ms", "ratio");
    for path in &files {
        let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let stream = median_read(&bytes, |b| read_snapshot(b).is_ok());
        let general = median_read(&bytes, |b| read_snapshot_general(b).is_ok());
        let name = path.file_stem().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        println!(
            "{name:<28} {:>10} {:>12.3} {:>12.3} {:>8.2}",
            bytes.len(),
            stream.as_secs_f64() * 1e3,
            general.as_secs_f64() * 1e3,
            stream.as_secs_f64() / general.as_secs_f64()
        );
    }
}
