//! `torch.cuda.memory_summary()`, byte for byte (`docs/allocator-rules.md` §17).

use std::fmt::Write;

use crate::stats::{MemoryStats, Stat, StatType};

const WIDTH: usize = 75;

/// The table `torch.cuda.memory_summary(device, abbreviated)` prints for these stats.
///
/// With `abbreviated` the "from large pool" / "from small pool" rows are left out.
pub fn memory_summary(stats: &MemoryStats, device: u32, abbreviated: bool) -> String {
    let mut lines: Vec<String> = Vec::with_capacity(64);
    lines.push("=".repeat(WIDTH));
    lines.push(format!(" {:16} PyTorch CUDA memory summary, device ID {device:<17} ", ""));
    lines.push("-".repeat(WIDTH));
    lines.push(format!(
        "  {:9} CUDA OOMs: {:<12} | {:6} cudaMalloc retries: {:<8}  ",
        "", stats.num_ooms, "", stats.num_alloc_retries
    ));
    lines.push("=".repeat(WIDTH));
    lines.push("        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  ".into());

    type Formatter = fn(i64, f64) -> String;
    let metrics: [(&str, &str, Formatter); 9] = [
        ("allocated_bytes", "Allocated memory", format_size),
        ("active_bytes", "Active memory", format_size),
        ("requested_bytes", "Requested memory", format_size),
        ("reserved_bytes", "GPU reserved memory", format_size),
        ("inactive_split_bytes", "Non-releasable memory", format_size),
        ("allocation", "Allocations", format_count),
        ("active", "Active allocs", format_count),
        ("segment", "GPU reserved segments", format_count),
        ("inactive_split", "Non-releasable allocs", format_count),
    ];
    for (key, name, format) in metrics {
        lines.push("-".repeat(WIDTH));
        let Some(array) = stats.array(key) else { continue };
        let all = array.all();
        let mut rows = vec![(name, all)];
        if !abbreviated {
            rows.push(("      from large pool", array.get(StatType::LargePool)));
            rows.push(("      from small pool", array.get(StatType::SmallPool)));
        }
        for (label, stat) in rows {
            // Every row uses the unit the `all` row chose for the same column.
            lines.push(row(label, stat, all, format));
        }
    }
    for (name, stat) in
        [("Oversize allocations", &stats.oversize_allocations), ("Oversize GPU segments", &stats.oversize_segments)]
    {
        lines.push("-".repeat(WIDTH));
        lines.push(row(name, stat, stat, format_count));
    }
    lines.push("=".repeat(WIDTH));

    let mut out = String::with_capacity(lines.len() * (WIDTH + 3));
    for line in &lines {
        let _ = writeln!(out, "|{line}|");
    }
    out
}

fn row(label: &str, stat: &Stat, unit_of: &Stat, format: fn(i64, f64) -> String) -> String {
    format!(
        " {label:<21} | {} | {} | {} | {} ",
        format(stat.current, unit_of.current as f64),
        format(stat.peak, unit_of.peak as f64),
        format(stat.allocated, unit_of.allocated as f64),
        format(stat.freed, unit_of.freed as f64),
    )
}

/// Python's `_format_size`: the unit steps while the reference value is at least 768 KiB;
/// the value itself is divided with floor division.
fn format_size(mut size: i64, mut reference: f64) -> String {
    const PREFIXES: [&str; 6] = ["B  ", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut prefix = PREFIXES[0];
    for next in &PREFIXES[1..] {
        if reference < 768.0 * 1024.0 {
            break;
        }
        prefix = next;
        size = size.div_euclid(1024);
        reference /= 1024.0;
    }
    format!("{size:6} {prefix}")
}

/// Python's `_format_count`: thousands steps while the reference value is at least 750,000.
fn format_count(mut count: i64, mut reference: f64) -> String {
    const PREFIXES: [&str; 3] = [" ", "K", "M"];
    let mut prefix = PREFIXES[0];
    for next in &PREFIXES[1..] {
        if reference < 750.0 * 1000.0 {
            break;
        }
        prefix = next;
        count = count.div_euclid(1000);
        reference /= 1000.0;
    }
    format!("{count:7} {prefix} ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_follow_the_all_row() {
        assert_eq!(format_size(561_152, 561_152.0), "561152 B  ");
        assert_eq!(format_size(512, 88_081_408.0), "     0 KiB");
        assert_eq!(format_size(88_081_408, 88_081_408.0), " 86017 KiB");
        assert_eq!(format_size(0, 0.0), "     0 B  ");
        assert_eq!(format_count(4, 4.0), "      4   ");
        assert_eq!(format_count(1_234_567, 1_234_567.0), "   1234 K ");
    }

    #[test]
    fn every_line_is_77_characters() {
        let text = memory_summary(&MemoryStats::default(), 0, false);
        assert!(text.lines().all(|l| l.chars().count() == 77), "{text}");
        assert_eq!(text.lines().count(), 47);
        assert_eq!(memory_summary(&MemoryStats::default(), 0, true).lines().count(), 29);
    }
}
