//! `cargo bench -p cachalot-trace --bench pickle`: reads each reference PyTorch snapshot pickle
//! (`testdata/traces`) with the reader `cachalot` uses and, as the reference in the same run,
//! with Python's `pickle.loads` of the same bytes (timed inside Python, so without the
//! interpreter's start; skipped when `python3` is missing), and prints the median of five reads
//! of each and their ratio. Arguments filter the files by name. The large-file comparison is
//! `scripts/dev/pickle-speed.sh` (BENCHMARKS.md §5).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use cachalot_trace::snapshot::pickle::read_snapshot;

const READS: usize = 5;

fn median(mut times: Vec<Duration>) -> Duration {
    times.sort();
    times[times.len() / 2]
}

/// The median of five `pickle.loads` of the file, timed by Python itself.
fn python_loads(path: &Path) -> Option<Duration> {
    let script = format!(
        "import pickle, sys, time\n\
         data = open(sys.argv[1], 'rb').read()\n\
         times = []\n\
         for _ in range({READS}):\n\
         \x20   start = time.perf_counter(); pickle.loads(data); times.append(time.perf_counter() - start)\n\
         print(sorted(times)[{READS} // 2])"
    );
    let out = std::process::Command::new("python3").args(["-c", &script]).arg(path).output().ok()?;
    let seconds: f64 = String::from_utf8_lossy(&out.stdout).trim().parse().ok()?;
    Some(Duration::from_secs_f64(seconds))
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
    println!("{:<28} {:>10} {:>10} {:>10} {:>8}", "pickle", "bytes", "read ms", "python ms", "ratio");
    for path in &files {
        let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let read = median(
            (0..READS)
                .map(|_| {
                    let start = Instant::now();
                    assert!(read_snapshot(&bytes).is_ok(), "the reference pickle reads");
                    start.elapsed()
                })
                .collect(),
        );
        let python = python_loads(path);
        let name = path.file_stem().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let (python_ms, ratio) = match python {
            Some(p) => {
                (format!("{:.3}", p.as_secs_f64() * 1e3), format!("{:.2}", read.as_secs_f64() / p.as_secs_f64()))
            }
            None => ("-".to_owned(), "-".to_owned()),
        };
        println!("{name:<28} {:>10} {:>10.3} {python_ms:>10} {ratio:>8}", bytes.len(), read.as_secs_f64() * 1e3);
    }
}
