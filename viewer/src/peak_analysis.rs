//! Peak analysis at the cursor: buttons that jump to the allocated, reserved or fragmentation
//! peak; the live memory grouped by stack (memory_viz's "memory by stack": the top stacks with
//! their share of the allocated bytes, each expandable to its frames); and the fragmentation —
//! reserved minus allocated bytes as cached free blocks by size class and the segments that hold
//! them. The numbers are [`crate::model::peak`]'s, computed once per cursor position.

use crate::format;
use crate::model::peak::{Fragmentation, PeakKind, Peaks, StackGroup, memory_by_stack};
use crate::model::{PoolState, Run};
use crate::style;

/// What the peak analysis remembers between frames.
#[derive(Clone, Debug)]
pub struct PeakAnalysisState {
    /// Stacks listed before the rest are summed up.
    pub top_n: usize,
    /// Segments listed in the fragmentation table.
    pub segments_shown: usize,
    peaks: Option<(usize, Peaks)>,
    /// The groups and fragmentation at a cursor position of a run with so many entries.
    at: Option<((usize, usize), Vec<StackGroup>, Fragmentation)>,
}

impl Default for PeakAnalysisState {
    fn default() -> Self {
        PeakAnalysisState { top_n: 10, segments_shown: 8, peaks: None, at: None }
    }
}

impl PeakAnalysisState {
    /// The peaks of `run`, computed once per length of it.
    pub fn peaks(&mut self, run: &Run) -> Peaks {
        match self.peaks {
            Some((processed, peaks)) if processed == run.processed() => peaks,
            _ => {
                let peaks = Peaks::of(run);
                self.peaks = Some((run.processed(), peaks));
                peaks
            }
        }
    }
}

/// A stack's one-line name: its innermost frame, with how many frames are behind it.
pub fn stack_title(run: &Run, group: &StackGroup) -> String {
    let Some(c) = group.context else { return "(no stack recorded)".into() };
    let frames = run.contexts.frames(c);
    // The file's last component only: the table sits beside another, and expanding the row
    // shows the full paths.
    let file = |f: &cachalot_core::Frame| f.filename.rsplit('/').next().unwrap_or_default().to_owned();
    match frames.first() {
        Some(f) if frames.len() > 1 => format!("{} ({}:{}) +{} frames", f.name, file(f), f.line, frames.len() - 1),
        Some(f) => format!("{} ({}:{})", f.name, file(f), f.line),
        None => "(empty stack)".into(),
    }
}

/// Shows the peak analysis of `run` at `cursor`, whose state is `state`; returns the cursor to
/// jump to, if a peak button was clicked.
pub fn ui(
    ui: &mut egui::Ui,
    run: &Run,
    state: &PoolState,
    cursor: usize,
    analysis: &mut PeakAnalysisState,
) -> Option<usize> {
    let mut go = None;
    let peaks = analysis.peaks(run);
    ui.horizontal(|ui| {
        ui.label("jump to peak:");
        for kind in PeakKind::ALL {
            let at = peaks.get(kind);
            let value = match kind {
                PeakKind::Allocated => run.allocated.at(at),
                PeakKind::Reserved => run.reserved.at(at),
                PeakKind::Fragmentation => run.reserved.at(at).saturating_sub(run.allocated.at(at)),
            };
            let button = ui.selectable_label(cursor == at, format!("{} {}", kind.label(), format::bytes(value)));
            if button.on_hover_text(format!("first reached after entry {}", format::count(at as u64))).clicked() {
                go = Some(at);
            }
        }
    });
    let key = (cursor, run.processed());
    if analysis.at.as_ref().is_none_or(|(k, _, _)| *k != key) {
        analysis.at = Some((key, memory_by_stack(state), Fragmentation::of(state)));
    }
    let Some((_, groups, fragmentation)) = &analysis.at else { return go };
    ui.columns(2, |columns| {
        egui::ScrollArea::vertical().id_salt("by_stack").show(&mut columns[0], |ui| {
            by_stack(ui, run, groups, &mut analysis.top_n, fragmentation.allocated);
        });
        egui::ScrollArea::vertical().id_salt("fragmentation").show(&mut columns[1], |ui| {
            fragmentation_ui(ui, fragmentation, &mut analysis.segments_shown);
        });
    });
    go
}

fn share_bar(ui: &mut egui::Ui, share: f64, color: egui::Color32) {
    let (rect, _) = ui.allocate_exact_size(egui::vec2(60.0, 10.0), egui::Sense::hover());
    ui.painter().rect_filled(rect, 0.0, ui.visuals().extreme_bg_color);
    let filled = egui::Rect::from_min_size(rect.min, egui::vec2(rect.width() * share as f32, rect.height()));
    ui.painter().rect_filled(filled, 0.0, color);
}

fn by_stack(ui: &mut egui::Ui, run: &Run, groups: &[StackGroup], top_n: &mut usize, allocated: u64) {
    ui.horizontal(|ui| {
        ui.strong(format!("Memory by stack · {} allocated", format::bytes(allocated)));
        ui.add(egui::DragValue::new(top_n).range(1..=200).prefix("top "));
    });
    for (i, group) in groups.iter().take(*top_n).enumerate() {
        ui.horizontal(|ui| {
            share_bar(ui, group.share, style::series::ALLOCATED);
            ui.monospace(format!(
                "{:5.1}% {:>10} {:>5}×",
                group.share * 100.0,
                format::bytes(group.bytes),
                group.blocks
            ));
            egui::CollapsingHeader::new(stack_title(run, group)).id_salt(("stack", i, group.context)).show(ui, |ui| {
                match group.context {
                    Some(c) => {
                        for f in run.contexts.frames(c) {
                            ui.monospace(format!("{} ({}:{})", f.name, f.filename, f.line));
                        }
                    }
                    None => {
                        ui.label("allocations made without a stack (set_context was not called)");
                    }
                }
            });
        });
    }
    if groups.len() > *top_n {
        let rest = &groups[*top_n..];
        let bytes: u64 = rest.iter().map(|g| g.bytes).sum();
        let share: f64 = rest.iter().map(|g| g.share).sum();
        ui.horizontal(|ui| {
            share_bar(ui, share, style::series::ALLOCATED.gamma_multiply(0.5));
            ui.monospace(format!("{:5.1}% {:>10}", share * 100.0, format::bytes(bytes)));
            ui.label(format!("{} other stacks", rest.len()));
        });
    }
    if groups.is_empty() {
        ui.label("nothing allocated at the cursor");
    }
}

fn fragmentation_ui(ui: &mut egui::Ui, f: &Fragmentation, segments_shown: &mut usize) {
    let unused = f.reserved.saturating_sub(f.allocated);
    ui.strong(format!(
        "Fragmentation · {} reserved − {} allocated = {}",
        format::bytes(f.reserved),
        format::bytes(f.allocated),
        format::bytes(unused)
    ));
    ui.label(format!(
        "{} in cached free blocks, {} freed but waiting for other streams",
        format::bytes(f.cached_free),
        format::bytes(f.pending_free)
    ));
    egui::Grid::new("size_classes").striped(true).show(ui, |ui| {
        ui.label("free block size");
        ui.label("blocks");
        ui.label("bytes");
        ui.label("share");
        ui.end_row();
        for class in &f.by_size_class {
            ui.label(class.label);
            ui.monospace(format::count(class.blocks as u64));
            ui.monospace(format::bytes(class.bytes));
            let share = if f.cached_free == 0 { 0.0 } else { class.bytes as f64 / f.cached_free as f64 };
            share_bar(ui, share, style::series::RESERVED);
            ui.end_row();
        }
    });
    ui.add_space(4.0);
    ui.horizontal(|ui| {
        ui.strong(format!("{} segments hold them", f.segments.len()));
        ui.add(egui::DragValue::new(segments_shown).range(1..=500).prefix("show "));
    });
    egui::Grid::new("free_segments").striped(true).show(ui, |ui| {
        for title in ["segment", "pool", "stream", "size", "free", "blocks", "largest", "pending"] {
            ui.label(title);
        }
        ui.end_row();
        for s in f.segments.iter().take(*segments_shown) {
            ui.monospace(format::address(s.address));
            ui.monospace(format::pool_letter(s.pool));
            ui.monospace(format::stream(s.stream));
            ui.monospace(format::bytes(s.size));
            ui.monospace(format::bytes(s.free));
            ui.monospace(format::count(s.free_blocks as u64));
            ui.monospace(format::bytes(s.largest));
            ui.monospace(format::bytes(s.pending));
            ui.end_row();
        }
    });
}
