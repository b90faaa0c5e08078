//! Seconds the native viewer takes to open files (read, parse, rebuild: what `cachalot view`
//! does before the first frame), the reference for the web page's figure in BENCHMARKS.md
//! (`scripts/dev/bench-web.sh` runs both). Prints one JSON line per file: the median of
//! `--runs` opens (default 3).
//!
//! ```text
//! cargo run --release -p cachalot-viewer --example open_time -- [--runs N] FILE...
//! ```

use std::time::Instant;

use cachalot_viewer::load::{Progress, load_bytes};

fn main() -> Result<(), String> {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let mut runs = 3;
    if let Some(i) = args.iter().position(|a| a == "--runs") {
        runs = args.get(i + 1).and_then(|n| n.parse().ok()).ok_or("--runs takes a number")?;
        args.drain(i..i + 2);
    }
    if args.is_empty() {
        return Err("usage: open_time [--runs N] FILE...".into());
    }
    for path in &args {
        let name = std::path::Path::new(path).file_name().map_or(path.clone(), |n| n.to_string_lossy().into_owned());
        let mut seconds = Vec::with_capacity(runs);
        let mut entries = 0;
        for _ in 0..runs.max(1) {
            let started = Instant::now();
            let bytes = std::fs::read(path).map_err(|e| format!("{path}: {e}"))?;
            let opened = load_bytes(&name, &bytes, &Progress::default()).map_err(|e| format!("{path}: {e}"))?;
            seconds.push(started.elapsed().as_secs_f64());
            entries = opened.iter().map(|r| r.trace.len()).sum::<usize>();
        }
        seconds.sort_by(f64::total_cmp);
        let median = seconds[seconds.len() / 2];
        println!(r#"{{"file":"{name}","entries":{entries},"seconds":{median:.4}}}"#);
    }
    Ok(())
}
