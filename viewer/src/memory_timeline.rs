//! The Active Memory Timeline, as PyTorch's memory_viz draws it: every allocation a band over
//! its lifetime, stacked in allocation order (a freed band lets those above it slide down),
//! coloured by its stack, its operation (the innermost frame) or its stream. Hovering a band
//! names its size, address, stream, allocation and free entries and its stack; clicking one
//! selects its block in the segment map at that moment; dragging moves the cursor; the wheel
//! zooms around the pointer and a horizontal wheel (or shift + wheel) pans.
//!
//! The picture comes from [`Lifetimes::layout`] (one column per point, bands thinner than a pixel
//! merged) and is cached for the range and size in view: moving the cursor repaints the cached
//! picture and only zooming, panning, resizing or new entries of a live run lay it out again.
//! The bands are rasterized into a texture of one pixel per column and point (a few hundred
//! thousand pixels), drawn as one image: a zoomed-out picture of millions of entries has hundreds
//! of thousands of bands, whose shapes tessellated every frame took a third of a second.

use std::hash::{Hash, Hasher};

use egui::{Color32, Pos2, Rect, Sense, Stroke, Vec2};

use crate::format;
use crate::model::Run;
use crate::model::lifetimes::{BandItem, Layout, Lifetime, Lifetimes};
use crate::style;

/// What gives a band its colour.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ColorBy {
    /// The whole stack it was allocated from.
    Stack,
    /// The innermost frame's name: the operation that made it (what kind of tensor it is).
    Operation,
    /// Its stream.
    Stream,
}

impl ColorBy {
    /// Every choice, in the picker's order.
    pub const ALL: [ColorBy; 3] = [ColorBy::Stack, ColorBy::Operation, ColorBy::Stream];

    /// The picker's label.
    pub fn label(self) -> &'static str {
        match self {
            ColorBy::Stack => "stack",
            ColorBy::Operation => "operation",
            ColorBy::Stream => "stream",
        }
    }
}

/// What the user did in the timeline.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemoryAction {
    /// Dragged the cursor here.
    MoveCursor(usize),
    /// Clicked an allocation: show its block in the segment map at this cursor position.
    Select {
        /// Address of the block.
        address: u64,
        /// A moment at which it is allocated (the clicked column's).
        cursor: usize,
    },
}

/// What the Active Memory Timeline remembers between frames.
#[derive(Clone, Debug)]
pub struct MemoryTimelineState {
    /// The cursor positions in view (`None`: the whole run).
    pub view: Option<(f64, f64)>,
    /// What colours the bands.
    pub color_by: ColorBy,
    /// The allocations of the run, kept up to date with it.
    pub lifetimes: Lifetimes,
    /// The last layout and what it was made for.
    layout: Option<(LayoutKey, Layout)>,
    /// The layout rasterized, and for which layout and colours.
    picture: Option<Picture>,
    /// Layouts made since the state was created (for tests and the benchmark: moving the cursor
    /// must not make one).
    pub layouts_made: usize,
    /// Where the bands were drawn in the last frame and the positions at its edges (for hit
    /// tests in tests and tools).
    pub plot_area: Option<(Rect, usize, usize)>,
}

impl Default for MemoryTimelineState {
    fn default() -> Self {
        MemoryTimelineState {
            view: None,
            color_by: ColorBy::Stack,
            lifetimes: Lifetimes::default(),
            layout: None,
            picture: None,
            layouts_made: 0,
            plot_area: None,
        }
    }
}

/// The texture of a layout's bands.
#[derive(Clone)]
struct Picture {
    key: (LayoutKey, ColorBy),
    texture: egui::TextureHandle,
}

impl std::fmt::Debug for Picture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Picture").field("key", &self.key).field("texture", &self.texture.id()).finish()
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct LayoutKey {
    range: (usize, usize),
    columns: u32,
    top: u64,
    height_bits: u32,
    processed: usize,
}

impl MemoryTimelineState {
    /// The last layout drawn.
    pub fn layout(&self) -> Option<&Layout> {
        self.layout.as_ref().map(|(_, l)| l)
    }
}

/// Twelve colours that tell neighbours apart on the dark background (d3's Tableau 10, which
/// memory_viz uses, and two more).
const PALETTE: [Color32; 12] = [
    Color32::from_rgb(78, 121, 167),
    Color32::from_rgb(242, 142, 43),
    Color32::from_rgb(225, 87, 89),
    Color32::from_rgb(118, 183, 178),
    Color32::from_rgb(89, 161, 79),
    Color32::from_rgb(237, 201, 72),
    Color32::from_rgb(176, 122, 161),
    Color32::from_rgb(255, 157, 167),
    Color32::from_rgb(156, 117, 95),
    Color32::from_rgb(186, 176, 172),
    Color32::from_rgb(134, 188, 227),
    Color32::from_rgb(200, 82, 160),
];

/// The top edge drawn on bands tall enough for one.
const EDGE_OPAQUE: Color32 = Color32::from_gray(30);

/// Colour of bands that merge allocations thinner than a pixel.
const MERGED: Color32 = Color32::from_gray(95);

fn palette_color(key: impl Hash) -> Color32 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    key.hash(&mut h);
    PALETTE[(h.finish() % PALETTE.len() as u64) as usize]
}

/// The colour of an allocation.
pub fn band_color(run: &Run, lifetime: &Lifetime, color_by: ColorBy) -> Color32 {
    match color_by {
        ColorBy::Stack => palette_color(lifetime.context.map(|c| c.0)),
        ColorBy::Operation => {
            let name = lifetime.context.and_then(|c| run.contexts.frames(c).first()).map(|f| f.name.as_ref());
            palette_color(name)
        }
        ColorBy::Stream => style::stream_color(lifetime.stream),
    }
}

/// Shows the Active Memory Timeline of `run` with the cursor at `cursor`.
pub fn ui(ui: &mut egui::Ui, run: &mut Run, cursor: usize, state: &mut MemoryTimelineState) -> Option<MemoryAction> {
    state.lifetimes.update(run);
    let end = run.end() + 1;
    let mut action = None;
    let (mut v0, mut v1) = state.view.unwrap_or((0.0, end as f64));
    ui.horizontal(|ui| {
        ui.label("colour by");
        for c in ColorBy::ALL {
            ui.selectable_value(&mut state.color_by, c, c.label());
        }
        ui.separator();
        if ui.small_button("fit").on_hover_text("show the whole run (double-click the picture)").clicked() {
            state.view = None;
            (v0, v1) = (0.0, end as f64);
        }
        ui.label(format!("{} allocations", format::count(state.lifetimes.items.len() as u64)))
            .on_hover_text("wheel: zoom around the pointer · shift + wheel: pan · drag: move the cursor · click a band: show its block in the segment map");
    });

    let (response, painter) =
        ui.allocate_painter(ui.available_size().max(Vec2::new(100.0, 60.0)), Sense::click_and_drag());
    let full = response.rect;
    let area = Rect::from_min_max(full.min + Vec2::new(64.0, 4.0), full.max - Vec2::new(8.0, 18.0));

    // Zoom around the pointer, pan with a horizontal scroll.
    if let Some(pointer) = response.hover_pos() {
        let (scroll, zoom) = ui.input(|i| (i.smooth_scroll_delta, i.zoom_delta()));
        let span = v1 - v0;
        let at = v0 + f64::from((pointer.x - area.left()) / area.width()) * span;
        let factor = f64::from(zoom) * (f64::from(scroll.y) / 200.0).exp();
        if (factor - 1.0).abs() > 1e-6 {
            let new_span = (span / factor).clamp(8.0_f64.min(end as f64), end as f64);
            v0 = at - (at - v0) * new_span / span;
            v1 = v0 + new_span;
        }
        if scroll.x != 0.0 {
            let shift = -f64::from(scroll.x / area.width()) * (v1 - v0);
            v0 += shift;
            v1 += shift;
        }
        if (v0, v1) != state.view.unwrap_or((0.0, end as f64)) {
            let span = (v1 - v0).min(end as f64);
            v0 = v0.clamp(0.0, end as f64 - span);
            v1 = v0 + span;
            state.view = Some((v0, v1));
        }
    }
    if response.double_clicked() {
        state.view = None;
        (v0, v1) = (0.0, end as f64);
    }
    let range = (v0.floor().max(0.0) as usize, (v1.ceil() as usize).min(end));

    // The y scale: the highest active bytes of the whole run, so panning keeps the scale.
    let top = run.active.max().max(1);
    let columns = area.width().max(1.0).round() as u32;
    let key =
        LayoutKey { range, columns, top, height_bits: area.height().to_bits(), processed: state.lifetimes.processed() };
    if state.layout.as_ref().is_none_or(|(k, _)| *k != key) {
        let bytes_per_pixel = top as f64 / f64::from(area.height().max(1.0));
        let layout = state.lifetimes.layout(range, columns, bytes_per_pixel, run.active.values());
        state.layouts_made += 1;
        state.layout = Some((key, layout));
    }
    let Some((_, layout)) = &state.layout else { return None };
    state.plot_area = Some((area, range.0, range.1));

    let col_w = area.width() / columns as f32;
    let y_of = |bytes: u64| area.bottom() - (bytes as f64 / top as f64) as f32 * area.height();
    // Axis: four byte levels and the positions at both edges.
    let text = ui.visuals().text_color();
    let grid = ui.visuals().widgets.noninteractive.bg_stroke.color;
    for k in 0..=4u64 {
        let bytes = top * k / 4;
        let y = y_of(bytes);
        painter.hline(area.x_range(), y, Stroke::new(0.5, grid));
        painter.text(
            Pos2::new(area.left() - 4.0, y),
            egui::Align2::RIGHT_CENTER,
            format::bytes_axis(bytes),
            egui::FontId::proportional(10.0),
            text,
        );
    }
    for (x, value, align) in
        [(area.left(), range.0, egui::Align2::LEFT_TOP), (area.right(), range.1, egui::Align2::RIGHT_TOP)]
    {
        painter.text(
            Pos2::new(x, area.bottom() + 2.0),
            align,
            format!("entry {}", format::count(value as u64)),
            egui::FontId::proportional(10.0),
            text,
        );
    }
    let rows = area.height().round().max(1.0) as usize;
    let picture_key = (key, state.color_by);
    if state.picture.as_ref().is_none_or(|p| p.key != picture_key) {
        let image = rasterize(run, &state.lifetimes, layout, state.color_by, rows, top);
        let options = egui::TextureOptions::NEAREST;
        match &mut state.picture {
            Some(p) => {
                p.texture.set(image, options);
                p.key = picture_key;
            }
            None => {
                let texture = ui.ctx().load_texture("active memory timeline", image, options);
                state.picture = Some(Picture { key: picture_key, texture });
            }
        }
    }
    if let Some(p) = &state.picture {
        let uv = Rect::from_min_max(Pos2::ZERO, Pos2::new(1.0, 1.0));
        painter.image(p.texture.id(), area, uv, Color32::WHITE);
    }
    let span = (range.1 - range.0).max(1) as f32;
    if (range.0..range.1).contains(&cursor) {
        let x = area.left() + (cursor - range.0) as f32 / span * area.width();
        painter.vline(x, area.y_range(), Stroke::new(1.5, style::series::CURSOR));
    }

    let column_at = |pos: Pos2| -> Option<u32> {
        area.x_range().contains(pos.x).then(|| (((pos.x - area.left()) / col_w) as u32).min(columns - 1))
    };
    let bytes_at = |pos: Pos2| ((area.bottom() - pos.y) / area.height()).max(0.0) as f64 * top as f64;
    if let Some(pos) = response.hover_pos()
        && let Some(x) = column_at(pos)
        && let Some(band) = layout.band_at(x, bytes_at(pos) as u64)
    {
        let sample = layout.samples[x as usize];
        let text = match band.item {
            BandItem::Allocation(i) => describe(run, &state.lifetimes.items[i as usize]),
            BandItem::Merged { count } => format!(
                "{count} allocations thinner than a pixel, {} together\nafter entry {}: zoom in to tell them apart",
                format::bytes(band.y1 - band.y0),
                format::count(u64::from(sample)),
            ),
        };
        response.clone().on_hover_ui_at_pointer(|ui| {
            ui.label(egui::RichText::new(text).monospace());
        });
    }
    if let Some(pos) = response.interact_pointer_pos()
        && let Some(x) = column_at(pos)
    {
        if response.clicked() {
            let sample = layout.samples[x as usize];
            if let Some(band) = layout.band_at(x, bytes_at(pos) as u64)
                && let BandItem::Allocation(i) = band.item
            {
                let address = state.lifetimes.items[i as usize].address;
                action = Some(MemoryAction::Select { address, cursor: sample as usize });
            }
        } else if response.dragged() {
            let p = range.0 as f32 + (pos.x - area.left()) / area.width() * span;
            action = Some(MemoryAction::MoveCursor((p.round().max(0.0) as usize).min(run.end())));
        }
    }
    action
}

/// The bands of `layout` as an image of one pixel per column and `rows` rows, `top` bytes high:
/// each band's colour over its columns and rows, with a dark top edge where it is at least four
/// rows tall (neighbours of one colour stay apart); transparent where nothing is allocated.
fn rasterize(
    run: &Run,
    lifetimes: &Lifetimes,
    layout: &Layout,
    color_by: ColorBy,
    rows: usize,
    top: u64,
) -> egui::ColorImage {
    let width = layout.columns as usize;
    let mut pixels = vec![Color32::TRANSPARENT; width * rows];
    let row_of = |bytes: u64| rows - ((bytes as f64 / top as f64 * rows as f64).round() as usize).min(rows);
    for band in &layout.bands {
        let color = match band.item {
            BandItem::Allocation(i) => band_color(run, &lifetimes.items[i as usize], color_by),
            BandItem::Merged { .. } => MERGED,
        };
        let (first, last) = (row_of(band.y1), row_of(band.y0).max(row_of(band.y1) + 1).min(rows));
        let edge = last - first >= 4;
        for row in first..last {
            let c = if edge && row == first { EDGE_OPAQUE } else { color };
            let line = &mut pixels[row * width..(row + 1) * width];
            line[band.x0 as usize..(band.x1 as usize).min(width)].fill(c);
        }
    }
    egui::ColorImage::new([width, rows], pixels)
}

/// What hovering an allocation says: size, address, stream, when it was allocated and freed
/// (entry and time since the run's first entry), and its stack, innermost frame first.
pub fn describe(run: &Run, l: &Lifetime) -> String {
    let origin = run.trace.first().map_or(0, |e| e.time_us);
    let when = |position: u32| -> String {
        if position == crate::model::lifetimes::NEVER {
            return "—".into();
        }
        match position.checked_sub(1).and_then(|i| run.trace.get(i as usize)) {
            Some(e) => format!(
                "entry {} ({})",
                format::count(u64::from(position - 1)),
                format::seconds_since(e.time_us, origin)
            ),
            None => "before the trace".into(),
        }
    };
    let mut text = format!(
        "{} at {} on {}\nallocated  {}\nfreed      {}\ncompleted  {}",
        format::bytes(l.size),
        format::address(l.address),
        format::stream(l.stream),
        when(l.start),
        when(l.freed),
        when(l.end),
    );
    match l.context {
        Some(c) => {
            for f in run.contexts.frames(c) {
                text.push_str(&format!("\n  {} ({}:{})", f.name, f.filename, f.line));
            }
        }
        None => text.push_str("\n  (no stack recorded)"),
    }
    text
}
