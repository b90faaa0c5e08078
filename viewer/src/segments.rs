//! The segment map at the cursor: every segment a row drawn to scale, blocks coloured by
//! state; hovering shows a block's address, sizes, the entry that allocated it and its stack;
//! clicking selects it; dragging pans and Ctrl + wheel (or the buttons) zooms.
//!
//! The mapped ranges of one expandable segment (same stream and pool, within one reservation)
//! share a row, with the unmapped address space between them drawn as such.

use cachalot_core::size::PoolKind;
use cachalot_core::{BlockState, StreamId};
use egui::{Color32, CornerRadius, FontId, Pos2, Rect, Sense, Stroke, StrokeKind, Vec2};

use crate::format;
use crate::model::{NO_EVENT, PoolState, Run};
use crate::style::{self, BlockKind};

/// Height of a row, in points, where the rows fill the panel or more.
pub const ROW_HEIGHT: f32 = 18.0;
/// The tallest a row grows to where few rows leave the panel mostly empty: blocks big enough
/// to point at, and the map reads as a picture rather than a strip at the top.
const MAX_ROW_HEIGHT: f32 = 40.0;
/// Narrowest label column, in points: room for the address, size, pool and a short stream.
const LABEL_WIDTH: f32 = 250.0;
/// Font of the row labels.
const LABEL_FONT_SIZE: f32 = 11.0;

/// A stretch of a row: a block, or unmapped address space.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Piece {
    /// First address.
    pub address: u64,
    /// Bytes.
    pub size: u64,
    /// What it is.
    pub kind: BlockKind,
}

/// One row of the map: a segment, or the mapped ranges of one expandable segment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Row {
    /// First address.
    pub start: u64,
    /// One past the last address.
    pub end: u64,
    /// Stream.
    pub stream: StreamId,
    /// Pool.
    pub pool: PoolKind,
    /// Whether it is an expandable segment.
    pub expandable: bool,
    /// Pieces in address order, tiling the row.
    pub pieces: Vec<Piece>,
}

impl Row {
    /// Bytes spanned.
    pub fn len(&self) -> u64 {
        self.end - self.start
    }

    /// Whether it spans nothing.
    pub fn is_empty(&self) -> bool {
        self.end == self.start
    }

    /// The piece at `address`.
    pub fn piece_at(&self, address: u64) -> Option<&Piece> {
        let i = self.pieces.partition_point(|p| p.address + p.size <= address);
        self.pieces.get(i).filter(|p| p.address <= address)
    }
}

/// The rows of a state. Mapped ranges of an expandable segment join one row when they are
/// closer than `reservation` bytes (the address space one reservation spans).
pub fn rows(state: &PoolState, group_by_stream: bool, reservation: u64) -> Vec<Row> {
    let mut rows: Vec<Row> = Vec::new();
    for segment in state.segments.values() {
        let split = segment.is_split();
        let pieces = segment.blocks.iter().map(|b| Piece {
            address: b.address,
            size: b.size,
            kind: BlockKind::of(b.state, split && !segment.expandable),
        });
        if let Some(last) = rows.last_mut().filter(|r| {
            segment.expandable
                && r.expandable
                && r.stream == segment.stream
                && r.pool == segment.pool
                && segment.address >= r.end
                && segment.address - r.start < reservation
        }) {
            last.pieces.push(Piece { address: last.end, size: segment.address - last.end, kind: BlockKind::Unmapped });
            last.pieces.extend(pieces);
            last.end = segment.end();
            continue;
        }
        rows.push(Row {
            start: segment.address,
            end: segment.end(),
            stream: segment.stream,
            pool: segment.pool,
            expandable: segment.expandable,
            pieces: pieces.collect(),
        });
    }
    for row in &mut rows {
        row.pieces.retain(|p| p.size > 0);
    }
    if group_by_stream {
        rows.sort_by_key(|r| (r.stream, r.pool == PoolKind::Large, r.start));
    }
    rows
}

/// What the map remembers between frames.
#[derive(Clone, Debug)]
pub struct SegmentMapState {
    /// 1 = the longest row fills the width.
    pub zoom: f32,
    /// Horizontal offset in points.
    pub pan: f32,
    /// Every row scaled to the width on its own (not to scale with the others).
    pub per_row_scale: bool,
    /// Rows ordered by stream and pool instead of address.
    pub group_by_stream: bool,
    /// Address of the selected block.
    pub selected: Option<u64>,
    /// Few rows grow taller to fill the panel (up to [`MAX_ROW_HEIGHT`]); off where two maps
    /// are compared, whose rows must be alike.
    pub fill_height: bool,
    /// Where the visible blocks at least 3 points wide were drawn in the last frame, by
    /// address (for hit tests in tests and tools).
    pub drawn: Vec<(u64, Rect)>,
}

impl Default for SegmentMapState {
    fn default() -> Self {
        SegmentMapState {
            zoom: 1.0,
            pan: 0.0,
            per_row_scale: false,
            group_by_stream: false,
            selected: None,
            fill_height: true,
            drawn: Vec::new(),
        }
    }
}

impl SegmentMapState {
    /// Where the block at `address` was drawn last frame.
    pub fn drawn_rect(&self, address: u64) -> Option<Rect> {
        self.drawn.iter().find(|(a, _)| *a == address).map(|(_, r)| *r)
    }
}

/// Shows the legend and a one-line summary of the state.
fn legend(ui: &mut egui::Ui, state: &PoolState) {
    ui.horizontal_wrapped(|ui| {
        for kind in BlockKind::ALL {
            let (rect, _) = ui.allocate_exact_size(Vec2::new(12.0, 12.0), Sense::hover());
            ui.painter().rect_filled(rect, 2, kind.color());
            ui.label(kind.label());
        }
        ui.separator();
        let s = &state.stats;
        ui.label(format!(
            "{} segments, reserved {}, allocated {}",
            state.segments.len(),
            format::bytes(s.reserved_bytes.all().current.max(0) as u64),
            format::bytes(s.allocated_bytes.all().current.max(0) as u64)
        ));
    });
}

/// Shows what is known about the block at `address`; returns the entry to move the cursor to
/// if the user asked.
pub fn block_details(ui: &mut egui::Ui, run: &Run, state: &PoolState, address: u64, buttons: bool) -> Option<usize> {
    let Some((segment, block)) = state.block_at(address) else {
        ui.label(format!("No block at {} at this point of the run.", format::address(address)));
        return None;
    };
    let mut go = None;
    let kind = BlockKind::of(block.state, segment.is_split() && !segment.expandable);
    ui.horizontal(|ui| {
        let (rect, _) = ui.allocate_exact_size(Vec2::new(12.0, 12.0), Sense::hover());
        ui.painter().rect_filled(rect, 2, kind.color());
        ui.strong(format!("Block {} — {}", format::address(block.address), format::bytes(block.size)));
    });
    ui.label(format!("size {} B, requested {} B", format::count(block.size), format::count(block.requested)));
    ui.label(format!("state: {} ({})", block.state.name(), kind.label()));
    ui.label(format!(
        "segment {} — {}, {} pool, stream {}{}",
        format::address(segment.address),
        format::bytes(segment.size),
        segment.pool.name(),
        format::stream(segment.stream),
        if segment.expandable { ", expandable (mapped range)" } else { "" }
    ));
    if block.event != NO_EVENT {
        let i = block.event as usize;
        if let Some(e) = run.trace.get(i) {
            let origin = run.trace.first().map_or(0, |f| f.time_us);
            ui.horizontal(|ui| {
                ui.label(format!(
                    "made by entry #{}: {} of {} B at {}",
                    format::count(i as u64),
                    e.action.name(),
                    format::count(e.size),
                    format::seconds_since(e.time_us, origin)
                ));
                if buttons && ui.small_button("go there").clicked() {
                    go = Some(i + 1);
                }
            });
        }
    } else if block.state != BlockState::Inactive {
        ui.label("allocated before the trace began");
    }
    let frames = run.frames(block.context);
    if frames.is_empty() {
        if block.state != BlockState::Inactive {
            ui.weak("no stack recorded");
        }
    } else {
        for f in frames.iter().take(12) {
            ui.monospace(format!("{}:{} {}", f.filename, f.line, f.name));
        }
        if frames.len() > 12 {
            ui.weak(format!("… {} more frames", frames.len() - 12));
        }
    }
    go
}

/// Shows the map of `state`; returns a cursor position the user asked to go to.
pub fn ui(ui: &mut egui::Ui, run: &Run, state: &PoolState, map: &mut SegmentMapState) -> Option<usize> {
    let mut go = None;
    legend(ui, state);
    ui.horizontal(|ui| {
        if ui.small_button("−").on_hover_text("zoom out (Ctrl + wheel)").clicked() {
            map.zoom = (map.zoom / 1.5).max(1.0);
        }
        if ui.small_button("fit").clicked() {
            map.zoom = 1.0;
            map.pan = 0.0;
        }
        if ui.small_button("+").on_hover_text("zoom in (Ctrl + wheel)").clicked() {
            map.zoom *= 1.5;
        }
        ui.label(format!("zoom ×{:.1}", map.zoom));
        ui.checkbox(&mut map.per_row_scale, "each row to its own width");
        ui.checkbox(&mut map.group_by_stream, "group by stream and pool");
    });

    if let Some(address) = map.selected {
        egui::Panel::bottom(("block_details", run.name.as_str()))
            .frame(style::panel_frame(ui, egui::Frame::side_top_panel(ui.style())))
            .resizable(true)
            .default_size(150.0)
            .show(ui, |ui| {
                ui.horizontal(|ui| {
                    ui.strong("Selected block");
                    if ui.small_button("×").on_hover_text("clear the selection").clicked() {
                        map.selected = None;
                    }
                });
                egui::ScrollArea::vertical().id_salt("block_details_scroll").show(ui, |ui| {
                    go = block_details(ui, run, state, address, true);
                });
            });
    }

    let total = run.device.as_ref().map_or(cachalot_trace::replay::DEFAULT_DEVICE_TOTAL, |d| d.total_memory);
    let reservation = total + total / 8 + (1 << 30);
    let rows = rows(state, map.group_by_stream, reservation);
    if rows.is_empty() {
        ui.add_space(20.0);
        ui.weak("No segments at this point of the run.");
        return go;
    }
    let longest = rows.iter().map(Row::len).max().unwrap_or(1).max(1);
    let per_row = ui.available_height() / rows.len() as f32 - ui.spacing().item_spacing.y;
    let row_height = if map.fill_height { per_row.clamp(ROW_HEIGHT, MAX_ROW_HEIGHT).floor() } else { ROW_HEIGHT };
    map.drawn.clear();
    let zoom_delta = ui.input(|i| if i.modifiers.command { i.zoom_delta() } else { 1.0 });

    egui::ScrollArea::vertical().id_salt(("segment_rows", run.name.as_str())).auto_shrink(false).show_rows(
        ui,
        row_height,
        rows.len(),
        |ui, range| {
            let width = ui.available_width();
            // Each visible row's label, made once: it sets the column's width and is painted.
            let labels: Vec<String> = rows[range.clone()].iter().map(row_label).collect();
            let label_width = label_column_width(ui, &labels, width);
            let bar_width = (width - label_width - 8.0).max(50.0);
            for (row, label) in rows[range].iter().zip(labels) {
                let (rect, response) = ui.allocate_exact_size(Vec2::new(width, row_height), Sense::click_and_drag());
                let bytes_per_point = match map.per_row_scale {
                    true => row.len().max(1) as f64 / bar_width as f64 / map.zoom as f64,
                    false => longest as f64 / bar_width as f64 / map.zoom as f64,
                };
                let bar = Rect::from_min_max(
                    Pos2::new(rect.left() + label_width, rect.top() + 2.0),
                    Pos2::new(rect.right(), rect.bottom() - 2.0),
                );
                paint_row(ui, row, label, rect, bar, bytes_per_point, map);
                if response.dragged() {
                    map.pan = (map.pan - response.drag_delta().x).max(0.0);
                }
                if response.hovered() && zoom_delta != 1.0 {
                    map.zoom = (map.zoom * zoom_delta).clamp(1.0, 1e7);
                }
                let pointer = response.hover_pos().or(response.interact_pointer_pos());
                let address = pointer.filter(|p| p.x >= bar.left()).and_then(|p| {
                    let offset = ((p.x - bar.left() + map.pan) as f64 * bytes_per_point) as u64;
                    row.start.checked_add(offset).filter(|&a| a < row.end)
                });
                let piece = address.and_then(|a| row.piece_at(a)).copied();
                if response.clicked() {
                    map.selected = piece.filter(|p| p.kind != BlockKind::Unmapped).map(|p| p.address);
                }
                if let Some(piece) = piece {
                    response.on_hover_ui_at_pointer(|ui| {
                        ui.set_max_width(420.0);
                        if piece.kind == BlockKind::Unmapped {
                            ui.label(format!(
                                "unmapped address space {}–{} ({})",
                                format::address(piece.address),
                                format::address(piece.address + piece.size),
                                format::bytes(piece.size)
                            ));
                        } else {
                            block_details(ui, run, state, piece.address, false);
                        }
                    });
                }
            }
        },
    );
    go
}

/// A row's label: address, size, pool, stream and whether the segment is expandable.
fn row_label(row: &Row) -> String {
    format!(
        "{} {:>9} {} {}{}",
        format::address(row.start),
        format::bytes(row.len()),
        format::pool_letter(row.pool),
        format::stream(row.stream),
        if row.expandable { " exp" } else { "" }
    )
}

/// The label column's width for the visible rows' `labels`: the longest label (monospace, so its characters times one
/// glyph's width) and the stream marker before it, at least [`LABEL_WIDTH`], and at most 45% of
/// the map's `width`, past which a label is cut at the column's edge.
fn label_column_width(ui: &egui::Ui, labels: &[String], width: f32) -> f32 {
    let longest = labels.iter().map(|label| label.chars().count()).max().unwrap_or(0);
    let glyph = ui.fonts_mut(|f| f.glyph_width(&FontId::monospace(LABEL_FONT_SIZE), '0'));
    (10.0 + longest as f32 * glyph + 12.0).max(LABEL_WIDTH).min((width * 0.45).max(LABEL_WIDTH))
}

/// Paints a row's `label` ([`row_label`]) and its pieces; blocks narrower than a point share a
/// pixel, which takes the colour of the most telling one.
fn paint_row(
    ui: &egui::Ui,
    row: &Row,
    label: String,
    rect: Rect,
    bar: Rect,
    bytes_per_point: f64,
    map: &mut SegmentMapState,
) {
    let painter = ui.painter_at(rect);
    let text = ui.visuals().text_color();
    painter.rect_filled(
        Rect::from_min_size(rect.min + Vec2::new(2.0, 4.0), Vec2::new(4.0, rect.height() - 8.0)),
        1,
        style::stream_color(row.stream),
    );
    // The label never runs into the bar, however long its stream id (PyTorch's are pointers).
    let painter_label = ui.painter_at(Rect::from_min_max(rect.min, Pos2::new(bar.left() - 4.0, rect.max.y)));
    painter_label.text(
        Pos2::new(rect.left() + 10.0, rect.center().y),
        egui::Align2::LEFT_CENTER,
        label,
        FontId::monospace(LABEL_FONT_SIZE),
        text,
    );
    let painter = ui.painter_at(bar);
    let x_of = |address: u64| bar.left() + ((address - row.start) as f64 / bytes_per_point) as f32 - map.pan;
    // The whole extent, at least 2 points wide, so that tiny segments stay visible.
    let extent = Rect::from_min_max(
        Pos2::new(x_of(row.start), bar.top()),
        Pos2::new(x_of(row.end).max(x_of(row.start) + 2.0), bar.bottom()),
    );
    // The pieces tile the extent, so on a software rasterizer, where every shaded pixel counts
    // (see `style::panel_frame`), it is painted only where it shows past them: a row narrower
    // than its two points. (Elsewhere it also backs the anti-aliased seams between pieces.)
    if !style::software_rendering(ui.ctx()) || x_of(row.end) - x_of(row.start) < 2.0 {
        painter.rect_filled(extent, 0, Color32::from_gray(40));
    }
    let mut column: Option<(f32, f32, BlockKind)> = None;
    let flush = |column: &mut Option<(f32, f32, BlockKind)>| {
        if let Some((x0, x1, kind)) = column.take() {
            painter.rect_filled(
                Rect::from_min_max(Pos2::new(x0, bar.top()), Pos2::new(x1.max(x0 + 1.0), bar.bottom())),
                0,
                kind.color(),
            );
        }
    };
    for piece in &row.pieces {
        let x0 = x_of(piece.address);
        let x1 = x_of(piece.address + piece.size);
        if x1 < bar.left() || x0 > bar.right() {
            continue;
        }
        if x1 - x0 >= 1.0 {
            flush(&mut column);
            let r = Rect::from_min_max(Pos2::new(x0, bar.top()), Pos2::new(x1, bar.bottom()));
            painter.rect_filled(r, 0, piece.kind.color());
            if x1 - x0 >= 4.0 {
                painter.vline(x1 - 0.5, bar.y_range(), Stroke::new(1.0, Color32::from_black_alpha(140)));
            }
            if piece.kind == BlockKind::Unmapped {
                hatch(&painter, r);
            }
            if x1 - x0 >= 3.0 && map.drawn.len() < 20_000 {
                map.drawn.push((piece.address, r.intersect(bar)));
            }
            if map.selected == Some(piece.address) {
                painter.rect_stroke(r, CornerRadius::ZERO, Stroke::new(2.0, Color32::WHITE), StrokeKind::Inside);
            }
            continue;
        }
        let px = x0.floor();
        match &mut column {
            Some((start, end, kind)) if px < *end => {
                *end = end.max(x1.ceil());
                if piece.kind.priority() > kind.priority() {
                    *kind = piece.kind;
                }
                let _ = start;
            }
            _ => {
                flush(&mut column);
                column = Some((px, px + 1.0, piece.kind));
            }
        }
    }
    flush(&mut column);
}

/// Diagonal stripes over unmapped address space.
fn hatch(painter: &egui::Painter, rect: Rect) {
    let stroke = Stroke::new(1.0, Color32::from_gray(90));
    let h = rect.height();
    let mut x = rect.left() - h;
    while x < rect.right() {
        painter.line_segment([Pos2::new(x, rect.bottom()), Pos2::new(x + h, rect.top())], stroke);
        x += 6.0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Block, Segment};

    fn segment(address: u64, size: u64, expandable: bool, blocks: &[(u64, BlockState)]) -> Segment {
        let mut at = address;
        Segment {
            address,
            size,
            stream: StreamId::DEFAULT,
            pool: PoolKind::Large,
            expandable,
            event: NO_EVENT,
            context: None,
            blocks: blocks
                .iter()
                .map(|&(s, state)| {
                    let b = Block { address: at, size: s, requested: s, state, event: NO_EVENT, context: None };
                    at += s;
                    b
                })
                .collect(),
        }
    }

    #[test]
    fn expandable_ranges_share_a_row_with_the_gap_unmapped() {
        let mut state = PoolState::default();
        state
            .segments
            .insert(0, segment(0, 100, false, &[(60, BlockState::ActiveAllocated), (40, BlockState::Inactive)]));
        state.segments.insert(1000, segment(1000, 50, true, &[(50, BlockState::ActiveAllocated)]));
        state.segments.insert(1100, segment(1100, 50, true, &[(50, BlockState::Inactive)]));
        let rows = rows(&state, false, 10_000);
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].pieces[1].kind, BlockKind::InactiveSplit);
        assert_eq!(rows[1].pieces.len(), 3);
        assert_eq!(rows[1].pieces[1], Piece { address: 1050, size: 50, kind: BlockKind::Unmapped });
        assert_eq!(rows[1].pieces[2].kind, BlockKind::Free, "expandable blocks are never 'inactive split'");
        assert_eq!(rows[1].piece_at(1120).map(|p| p.address), Some(1100));
    }
}
