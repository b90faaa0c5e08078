//! `memory_stats()` at the cursor — every key, with current, peak, allocated and freed — and
//! the `memory_summary()` text PyTorch would print there.

use cachalot_core::MemoryStats;
use cachalot_core::stats::StatType;

use crate::format;
use crate::model::Run;
use crate::style;

/// The stat arrays in PyTorch's order, and whether they count bytes.
pub const ARRAYS: [(&str, bool); 9] = [
    ("allocated_bytes", true),
    ("active_bytes", true),
    ("requested_bytes", true),
    ("reserved_bytes", true),
    ("inactive_split_bytes", true),
    ("allocation", false),
    ("active", false),
    ("segment", false),
    ("inactive_split", false),
];

/// What the stats panel remembers.
#[derive(Clone, Debug, Default)]
pub struct StatsState {
    /// Exact numbers instead of human units.
    pub raw: bool,
    /// The summary without the per-pool rows.
    pub abbreviated: bool,
}

fn value(v: i64, is_bytes: bool, raw: bool) -> String {
    match (raw, is_bytes) {
        (true, _) => v.to_string(),
        (false, true) => format::bytes_signed(v),
        (false, false) => {
            if v < 0 {
                format!("-{}", format::count(v.unsigned_abs()))
            } else {
                format::count(v as u64)
            }
        }
    }
}

/// Keys whose values differ between two stats (the flattened `memory_stats()` names).
pub fn differing_keys(a: &MemoryStats, b: &MemoryStats) -> Vec<String> {
    let (a, b) = (a.to_flat(), b.to_flat());
    a.iter().filter(|(k, v)| b.get(*k) != Some(v)).map(|(k, _)| k.clone()).collect()
}

/// Shows `stats` (at cursor position `cursor` of `run`).
pub fn ui(ui: &mut egui::Ui, run: &Run, stats: &MemoryStats, cursor: usize, state: &mut StatsState) {
    ui.horizontal(|ui| {
        ui.checkbox(&mut state.raw, "exact numbers");
        ui.checkbox(&mut state.abbreviated, "abbreviated summary");
        ui.weak("num_alloc_retries and num_sync_all_streams are not in traces: inferred from the releases.");
    });
    if cursor == run.end()
        && !run.live
        && let Some(recorded) = &run.recorded_stats
    {
        let mut differ = differing_keys(stats, recorded);
        differ.retain(|k| k != "num_alloc_retries" && k != "num_sync_all_streams");
        if differ.is_empty() {
            ui.colored_label(style::series::RESERVED, "✔ every key matches the file's memory_stats()");
        } else {
            ui.colored_label(
                style::series::OOM,
                format!("{} keys differ from the file's memory_stats(): {}", differ.len(), differ.join(", ")),
            );
        }
    }
    let raw = state.raw;
    ui.columns(2, |columns| {
        egui::ScrollArea::vertical().id_salt("stats_table").show(&mut columns[0], |ui| {
            egui::Grid::new("stats_grid").striped(true).num_columns(5).show(ui, |ui| {
                for title in ["key", "current", "peak", "allocated", "freed"] {
                    ui.strong(title);
                }
                ui.end_row();
                for (name, is_bytes) in ARRAYS {
                    let Some(array) = stats.array(name) else { continue };
                    for kind in [StatType::All, StatType::LargePool, StatType::SmallPool] {
                        let s = array.get(kind);
                        ui.monospace(format!("{name}.{}", kind.key()));
                        for v in [s.current, s.peak, s.allocated, s.freed] {
                            ui.label(value(v, is_bytes, raw));
                        }
                        ui.end_row();
                    }
                }
                for (name, s) in [
                    ("oversize_allocations", &stats.oversize_allocations),
                    ("oversize_segments", &stats.oversize_segments),
                ] {
                    ui.monospace(name);
                    for v in [s.current, s.peak, s.allocated, s.freed] {
                        ui.label(value(v, false, raw));
                    }
                    ui.end_row();
                }
                for (name, v) in [
                    ("num_alloc_retries", stats.num_alloc_retries as i64),
                    ("num_ooms", stats.num_ooms as i64),
                    ("num_sync_all_streams", stats.num_sync_all_streams as i64),
                    ("num_device_alloc", stats.num_device_alloc as i64),
                    ("num_device_free", stats.num_device_free as i64),
                    ("max_split_size", stats.max_split_size),
                ] {
                    ui.monospace(name);
                    ui.label(if name == "max_split_size" { v.to_string() } else { value(v, false, raw) });
                    ui.end_row();
                }
            });
        });
        let device = run.device.as_ref().map_or(0, |d| d.index);
        let summary = cachalot_core::summary::memory_summary(stats, device, state.abbreviated);
        egui::ScrollArea::both().id_salt("stats_summary").show(&mut columns[1], |ui| {
            ui.add(egui::Label::new(egui::RichText::new(summary).monospace().size(11.0)).extend());
        });
    });
}
