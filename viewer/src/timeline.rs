//! The timeline: allocated, active and reserved bytes over the trace, OOM and `empty_cache`
//! markers, and the cursor, which the user drags to any moment. Clicking an OOM marker picks
//! its error ([`TimelinePick::Oom`]), which the app explains.
//!
//! Bytes go up on a linear scale, or on a logarithmic one ([`Scale`]) where a run's labelled
//! phases are of such different sizes that the small ones would be a flat line at the bottom
//! (`cachalot run seeds`: 512 B to 1 GiB). The top of the plot is kept for the marks' labels,
//! above the highest value, so that no label sits on a line.

use egui::Color32;
use egui_plot::{FilledArea, GridMark, HoverPosition, Line, LineStyle, Plot, PlotPoints, PlotUi, VLine};

use crate::format;
use crate::model::{Outline, Run};
use crate::style;

/// Rows of mark labels at the top of the plot; a label that fits in none is left out (its mark's
/// line stays, and hovering the plot names the entry).
const MARK_LABEL_ROWS: usize = 3;
/// Points between two labels of one row.
const MARK_LABEL_GAP: f32 = 6.0;
/// Most marks in view whose labels are measured and laid out in a frame: more would not fit in
/// the rows anyway, and measuring every mark of a long run each frame would cost its frame rate.
const MAX_MARK_LABELS: usize = 120;
/// The ratio between the largest and the smallest non-zero level of a run's marks above which
/// the timeline opens on a logarithmic scale: at a linear scale 64 times below the top, a phase
/// is a few pixels high.
const LOG_SCALE_SPAN: u64 = 64;

/// How bytes map to the plot's height.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Scale {
    /// Bytes as they are.
    Linear,
    /// `log2(bytes)`, with everything below `floor` bytes (zero included) drawn at `floor`.
    Log {
        /// The bottom of the plot, in bytes (a power of two).
        floor: f64,
    },
}

impl Scale {
    /// The plot's y value of `bytes`.
    pub fn y(self, bytes: f64) -> f64 {
        match self {
            Scale::Linear => bytes,
            Scale::Log { floor } => bytes.max(floor).log2(),
        }
    }

    /// The bytes at the plot's y value `y`.
    pub fn bytes(self, y: f64) -> f64 {
        match self {
            Scale::Linear => y,
            Scale::Log { .. } => y.exp2(),
        }
    }

    /// The logarithmic scale for a run whose smallest non-zero value is `smallest` bytes: its
    /// floor one power of two below that value's, so that it stands above zero.
    pub fn log_for(smallest: u64) -> Self {
        let power = smallest.max(2).ilog2() - 1;
        Scale::Log { floor: f64::from(power).exp2() }
    }
}

/// What the timeline remembers between frames.
#[derive(Clone, Debug)]
pub struct TimelineState {
    /// Draw the active bytes too.
    pub show_active: bool,
    /// Keep the whole run in view as it grows (live runs).
    pub follow: bool,
    /// Draw labelled marks.
    pub show_marks: bool,
    /// A logarithmic byte axis, as the user chose it; `None` until they do, the run decides
    /// ([`log_scale_suits`]).
    pub log_scale: Option<bool>,
    /// Rows of mark labels drawn last frame: the band kept free for them at the top.
    pub label_rows: usize,
    /// The smallest non-zero value of the run's counters, over its first `.0` cursor positions
    /// (kept up to date as a live run grows, without rescanning it).
    smallest: (usize, u64),
    /// Where the plot was drawn last frame, and the entries its left and right edges showed
    /// (for hit tests in tests and tools).
    pub plot_area: Option<(egui::Rect, f64, f64)>,
}

impl Default for TimelineState {
    fn default() -> Self {
        TimelineState {
            show_active: true,
            follow: true,
            show_marks: true,
            log_scale: None,
            label_rows: 0,
            smallest: (0, u64::MAX),
            plot_area: None,
        }
    }
}

/// A plot of bytes over trace entries, as the timeline and the side-by-side view draw it: x from 0
/// to `x_max`, y from 0 to `y_max` on a byte axis, zoom and scroll along x only (a drag moves the
/// cursor instead of the view). It has no legend: the timeline says what its lines are in the
/// row above it, where no label of the plot can hide under it.
pub fn memory_plot<'a>(id: impl std::hash::Hash + std::fmt::Debug, x_max: f64, y_max: f64) -> Plot<'a> {
    Plot::new(id)
        .default_x_bounds(0.0, x_max)
        .default_y_bounds(0.0, y_max)
        .allow_drag(false)
        .allow_zoom([true, false])
        .allow_scroll([true, false])
        .y_axis_formatter(bytes_axis)
        .y_grid_spacer(egui_plot::log_grid_spacer(4))
        .y_axis_min_width(64.0)
}

/// Formats a y-axis value as bytes.
pub fn bytes_axis(mark: GridMark, _range: &std::ops::RangeInclusive<f64>) -> String {
    if mark.value < 0.0 { String::new() } else { format::bytes_axis(mark.value as u64) }
}

/// How thick a band is drawn where a bucket holds a single value, in points: as thick as the
/// step lines.
const MIN_BAND_THICKNESS: f64 = 1.5;

/// How `series` is drawn over the x range `[x0, x1]` of `plot_ui`: about two points per pixel,
/// and bands at least a line thick.
pub fn outline(series: &mut crate::model::Series, plot_ui: &PlotUi, x0: f64, x1: f64) -> Outline {
    scaled_outline(series, plot_ui, x0, x1, Scale::Linear)
}

/// [`outline`] with its bytes on `scale`.
fn scaled_outline(series: &mut crate::model::Series, plot_ui: &PlotUi, x0: f64, x1: f64, scale: Scale) -> Outline {
    let start = x0.floor().max(0.0) as usize;
    let end = (x1.ceil().max(0.0) as usize).saturating_add(2);
    let width_px = plot_ui.response().rect.width();
    let mut outline = series.outline(start..end, (width_px.max(100.0) * 2.0) as usize);
    if scale != Scale::Linear {
        match &mut outline {
            Outline::Steps(points) => points.iter_mut().for_each(|p| p[1] = scale.y(p[1])),
            Outline::Band(band) => band.low.iter_mut().chain(band.high.iter_mut()).for_each(|v| *v = scale.y(*v)),
        }
    }
    // Thickened in the plot's units, after the scale.
    if let Outline::Band(band) = &mut outline {
        band.thicken(MIN_BAND_THICKNESS / plot_ui.transform().dpos_dvalue_y().abs().max(f64::MIN_POSITIVE));
    }
    outline
}

/// Whether a run reads best on a logarithmic scale: its marks' non-zero levels (reserved bytes)
/// span more than [`LOG_SCALE_SPAN`], so that at a linear scale its small phases would be flat
/// at the bottom. A run without marks (a PyTorch trace) stays linear, where the differences
/// near its peak read best.
pub fn log_scale_suits(run: &Run) -> bool {
    let levels = run.marks.iter().map(|m| m.reserved).filter(|&r| r > 0);
    match (levels.clone().min(), levels.max()) {
        (Some(low), Some(high)) => high / low > LOG_SCALE_SPAN,
        _ => false,
    }
}

/// Grid lines of a byte axis drawn as `log2(bytes)`: at every power of two, the powers of 1024
/// (1 KiB, 1 MiB, 1 GiB) strongest; egui_plot leaves out the labels of lines too close together.
fn log_grid(input: egui_plot::GridInput) -> Vec<GridMark> {
    let (low, high) = input.bounds;
    if !(low.is_finite() && high.is_finite()) || high - low > 128.0 {
        return Vec::new();
    }
    (low.ceil() as i64..=high.floor() as i64)
        .map(|power| {
            let step_size = if power % 10 == 0 {
                10.0
            } else if power % 2 == 0 {
                2.0
            } else {
                1.0
            };
            GridMark { value: power as f64, step_size }
        })
        .collect()
}

/// Adds a counter to a plot: a step line, or where there are more entries than pixels a band
/// from each pixel's lowest to its highest value (see [`outline`]). A band covers each pixel
/// once, where the min/max zigzag line it replaces covered each column three times over (on a
/// software rasterizer that line was most of a frame). A dashed `style` (the side-by-side view's
/// second run) draws a band half transparent instead. egui_plot's band aggregation of lines is
/// off: it would merge the two points of each step into a slanted band.
pub fn add_series(plot_ui: &mut PlotUi, name: String, outline: Outline, color: Color32, style: LineStyle) {
    match outline {
        Outline::Steps(points) => {
            plot_ui.line(Line::new(name, PlotPoints::new(points)).color(color).style(style).allow_band(false));
        }
        Outline::Band(band) => {
            let fill = if style == LineStyle::Solid { color } else { color.gamma_multiply(0.5) };
            plot_ui.add(FilledArea::new(name, &band.xs, &band.low, &band.high).fill_color(fill));
        }
    }
}

/// What the plot's lines and markers are, in a row above it: the counters drawn, then the kinds
/// of marker this run has.
fn legend(ui: &mut egui::Ui, run: &Run, show_active: bool) {
    let swatch = |ui: &mut egui::Ui, color: Color32, name: &str, dashed: bool| {
        let (rect, _) = ui.allocate_exact_size(egui::vec2(14.0, 10.0), egui::Sense::hover());
        let y = rect.center().y;
        let stroke = egui::Stroke::new(2.0, color);
        if dashed {
            ui.painter().vline(rect.center().x, rect.y_range(), stroke);
        } else {
            ui.painter().hline(rect.x_range(), y, stroke);
        }
        ui.label(egui::RichText::new(name).small());
    };
    ui.horizontal(|ui| {
        ui.spacing_mut().item_spacing.x = 4.0;
        swatch(ui, style::series::RESERVED, "reserved", false);
        if show_active {
            swatch(ui, style::series::ACTIVE, "active", false);
        }
        swatch(ui, style::series::ALLOCATED, "allocated", false);
        let markers = [
            (&run.markers.ooms, style::series::OOM, "OOM"),
            (&run.markers.empty_cache, style::series::EMPTY_CACHE, "empty_cache"),
            (&run.markers.retries, style::series::RETRY, "cache released by a malloc"),
            (&run.markers.collections, Color32::from_gray(150), "garbage collection"),
        ];
        for (at, color, name) in markers {
            if !at.is_empty() {
                swatch(ui, color, name, true);
            }
        }
        if !run.marks.is_empty() {
            swatch(ui, MARK_COLOR, "mark", true);
        }
    });
}

/// The colour of marks' lines and labels.
const MARK_COLOR: Color32 = Color32::from_gray(170);

/// Labels the marks between entries `x0` and `x1` at the top of the plot, each at its entry,
/// in as many rows as it takes for no two to overlap ([`label_rows`]); returns the rows used.
fn mark_labels(plot_ui: &mut PlotUi, run: &Run, x0: f64, x1: f64) -> usize {
    let from = run.marks.partition_point(|m| (m.trace_index as f64) < x0);
    let to = run.marks.partition_point(|m| (m.trace_index as f64) <= x1);
    if from == to {
        return 0;
    }
    let step = (to - from).div_ceil(MAX_MARK_LABELS);
    let marks: Vec<&cachalot_core::Mark> = run.marks[from..to].iter().step_by(step).collect();
    let transform = *plot_ui.transform();
    let font = egui::TextStyle::Small.resolve(&plot_ui.ctx().global_style());
    let row_height = plot_ui.ctx().fonts_mut(|f| f.row_height(&font)) + 2.0;
    let right = transform.frame().right() - 2.0;
    let spans: Vec<(f32, f32)> = plot_ui.ctx().fonts_mut(|fonts| {
        marks
            .iter()
            .map(|mark| {
                let width = fonts.layout_no_wrap(mark.label.clone(), font.clone(), MARK_COLOR).size().x;
                // A label starts at its mark, or ends at the plot's right edge if it would
                // run past it.
                let left = transform.position_from_point_x(mark.trace_index as f64).min(right - width);
                (left, width)
            })
            .collect()
    });
    let top = transform.frame().top() + 2.0;
    let mut used = 0;
    for ((mark, &(left, _)), row) in marks.iter().zip(&spans).zip(label_rows(&spans, MARK_LABEL_ROWS, MARK_LABEL_GAP)) {
        let Some(row) = row else { continue };
        used = used.max(row + 1);
        let at = transform.value_from_position(egui::pos2(left, top + row as f32 * row_height));
        plot_ui.text(
            egui_plot::Text::new("mark", at, mark.label.as_str()).color(MARK_COLOR).anchor(egui::Align2::LEFT_TOP),
        );
    }
    used
}

/// The smallest non-zero value of the run's counters, brought up to date with its new values.
fn smallest_value(run: &Run, state: &mut TimelineState) -> u64 {
    let len = run.reserved.len();
    // A shorter run than last frame is another run in the tab (a live run's start): scan it anew.
    let (seen, mut smallest) = if len < state.smallest.0 { (0, u64::MAX) } else { state.smallest };
    for series in [&run.allocated, &run.active, &run.reserved] {
        let values = series.values();
        let new = values.get(seen.min(values.len())..).unwrap_or_default();
        smallest = new.iter().copied().filter(|&v| v > 0).fold(smallest, u64::min);
    }
    state.smallest = (len, smallest);
    smallest
}

/// The y range of the plot: from zero (or the log scale's floor) to above the highest value by
/// the band the mark labels take, given the plot's height last frame.
fn y_range(scale: Scale, highest: f64, state: &TimelineState, row_height: f32) -> (f64, f64) {
    let (low, top) = match scale {
        Scale::Linear => (0.0, highest.max(1.0) * 1.04),
        Scale::Log { floor } => (scale.y(floor), scale.y(highest.max(floor * 2.0)) + 0.3),
    };
    let height = state.plot_area.map_or(150.0, |(rect, _, _)| rect.height()).max(60.0);
    let band = (state.label_rows as f32 * row_height + 4.0).min(height / 2.0);
    (low, low + (top - low) * f64::from(height / (height - band)))
}

/// The row each label goes in, for labels given as `(left, width)` in points in order of
/// `left`: the first of `rows` rows whose last label ends `gap` before this one starts, or
/// `None` where every row is taken there. No two labels of a row overlap.
pub fn label_rows(spans: &[(f32, f32)], rows: usize, gap: f32) -> Vec<Option<usize>> {
    let mut row_ends = vec![f32::NEG_INFINITY; rows];
    spans
        .iter()
        .map(|&(left, width)| {
            let row = row_ends.iter().position(|&end| end + gap <= left)?;
            row_ends[row] = left + width;
            Some(row)
        })
        .collect()
}

/// What the user did on the timeline.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TimelinePick {
    /// Moved the cursor here (dragged, clicked, a button or a key).
    Cursor(usize),
    /// Clicked the marker of the out-of-memory error at this entry: the cursor goes just past
    /// it, and the app explains it ([`crate::explain`]).
    Oom(usize),
}

impl TimelinePick {
    /// The cursor position picked.
    pub fn cursor(self) -> usize {
        match self {
            TimelinePick::Cursor(c) => c,
            TimelinePick::Oom(entry) => entry + 1,
        }
    }
}

/// Points either side of an OOM marker within which a click picks it.
const OOM_PICK_POINTS: f32 = 4.0;

/// The out-of-memory error whose marker (drawn at `entry + 1`) is nearest to the screen x
/// `pointer` and within [`OOM_PICK_POINTS`] of it.
fn oom_near(ooms: &[u32], transform: &egui_plot::PlotTransform, pointer: f32) -> Option<usize> {
    let x_at = |m: u32| transform.position_from_point_x(f64::from(m) + 1.0);
    let from = ooms.partition_point(|&m| x_at(m) < pointer - OOM_PICK_POINTS);
    ooms[from..]
        .iter()
        .take_while(|&&m| x_at(m) <= pointer + OOM_PICK_POINTS)
        .min_by(|&&a, &&b| (x_at(a) - pointer).abs().total_cmp(&(x_at(b) - pointer).abs()))
        .map(|&m| m as usize)
}

/// Shows the timeline of `run` with the cursor at `cursor`; returns what the user picked: the
/// cursor they dragged or clicked to, or an OOM marker they clicked.
pub fn ui(ui: &mut egui::Ui, run: &mut Run, cursor: usize, state: &mut TimelineState) -> Option<TimelinePick> {
    let end = run.end();
    let x_max = end.max(1) as f64;
    let highest = run.reserved.max().max(run.active.max()) as f64;
    let mut moved = None;

    ui.horizontal(|ui| {
        ui.checkbox(&mut state.show_active, "active");
        ui.checkbox(&mut state.show_marks, "marks");
        let mut log = state.log_scale.unwrap_or_else(|| log_scale_suits(run));
        if ui.checkbox(&mut log, "log scale").on_hover_text("bytes on a logarithmic scale").changed() {
            state.log_scale = Some(log);
        }
        if run.live {
            ui.checkbox(&mut state.follow, "follow");
        }
        ui.separator();
        if ui.small_button("⏮").on_hover_text("first entry (Home)").clicked() {
            moved = Some(0);
        }
        if ui.small_button("◀").on_hover_text("previous entry (←)").clicked() {
            moved = Some(cursor.saturating_sub(1));
        }
        if ui.small_button("▶").on_hover_text("next entry (→)").clicked() {
            moved = Some((cursor + 1).min(end));
        }
        if ui.small_button("⏭").on_hover_text("last entry (End)").clicked() {
            moved = Some(end);
        }
        let mut typed = cursor;
        let drag =
            ui.add(egui::DragValue::new(&mut typed).range(0..=end).prefix("cursor ").suffix(format!(" / {end}")));
        if drag.changed() {
            moved = Some(typed);
        }
        ui.label(cursor_text(run, cursor));
    });
    legend(ui, run, state.show_active);

    let scale = if state.log_scale.unwrap_or_else(|| log_scale_suits(run)) {
        Scale::log_for(smallest_value(run, state))
    } else {
        Scale::Linear
    };
    let small = egui::TextStyle::Small.resolve(&ui.ctx().global_style());
    let row_height = ui.ctx().fonts_mut(|f| f.row_height(&small)) + 2.0;
    let (y_low, y_high) = y_range(scale, highest, state, row_height);
    let mut plot = memory_plot(("timeline", run.name.as_str()), x_max, y_high)
        .default_y_bounds(y_low, y_high)
        .x_axis_label("trace entry")
        .label_formatter(|hover| {
            let (name, p) = match hover {
                HoverPosition::NearDataPoint { plot_name, position, .. } => (*plot_name, position),
                HoverPosition::Elsewhere { position } => ("", position),
            };
            let x = p.x.round().max(0.0) as u64;
            let bytes = scale.bytes(p.y).max(0.0) as u64;
            Some(format!("{name}\nafter entry {}\n{}", format::count(x), format::bytes(bytes)))
        })
        .show_crosshair(false)
        // The plot's darker background is a full pass over its area: dropped where shading is
        // done by the CPU (see `style::panel_frame`).
        .show_background(!style::software_rendering(ui.ctx()));
    if let Scale::Log { .. } = scale {
        plot = plot
            .y_axis_formatter(move |mark, _| format::bytes_axis(scale.bytes(mark.value).round() as u64))
            .y_grid_spacer(log_grid);
    }

    let follow = run.live && state.follow;
    let show_active = state.show_active;
    let show_marks = state.show_marks;
    let mut label_rows = 0;
    let response = plot.show(ui, |plot_ui| {
        if follow {
            // The whole run as it grows, and after it ended (until the user zooms): egui_plot
            // then puts the x range at the plot's default bounds, the run's length, each frame.
            plot_ui.set_auto_bounds([true, false]);
        }
        // Bytes cannot be zoomed: the range is the run's, with room for the labels.
        plot_ui.set_plot_bounds_y(y_low..=y_high);
        // Last frame's range, unless the plot shows the whole run, which may have grown since.
        let (x0, x1) = if follow || plot_ui.auto_bounds().x {
            (0.0, x_max)
        } else {
            let bounds = plot_ui.plot_bounds();
            (bounds.min()[0], bounds.max()[0])
        };
        let width = plot_ui.response().rect.width();
        let drawn = |series: &mut crate::model::Series| scaled_outline(series, plot_ui, x0, x1, scale);
        // Back to front: each counter is at least the one drawn over it.
        let mut counters = vec![("reserved", drawn(&mut run.reserved), style::series::RESERVED)];
        if show_active {
            counters.push(("active", drawn(&mut run.active), style::series::ACTIVE));
        }
        counters.push(("allocated", drawn(&mut run.allocated), style::series::ALLOCATED));
        for back in 0..counters.len() {
            let (behind, front) = counters.split_at_mut(back + 1);
            if let Outline::Band(band) = &mut behind[back].1 {
                for (_, over, _) in front.iter() {
                    if let Outline::Band(over) = over {
                        band.hide_behind(over);
                    }
                }
            }
        }
        for (name, outline, color) in counters {
            add_series(plot_ui, name.to_owned(), outline, color, LineStyle::Solid);
        }
        // Markers in view, at most one per pixel column (thousands of OOMs would otherwise
        // cost thousands of lines a frame).
        let visible = |markers: &[u32], offset: f64| -> Vec<f64> {
            let from = markers.partition_point(|&m| (m as f64 + offset) < x0);
            let per_pixel = (x1 - x0) / f64::from(width.max(1.0));
            let mut last = f64::NEG_INFINITY;
            let mut xs = Vec::new();
            for &m in &markers[from..] {
                let x = m as f64 + offset;
                if x > x1 {
                    break;
                }
                if x - last >= per_pixel {
                    xs.push(x);
                    last = x;
                }
            }
            xs
        };
        for x in visible(&run.markers.ooms, 1.0) {
            plot_ui.vline(VLine::new("OOM", x).color(style::series::OOM).width(1.5));
        }
        for x in visible(&run.markers.empty_cache, 0.0) {
            plot_ui
                .vline(VLine::new("empty_cache", x).color(style::series::EMPTY_CACHE).style(LineStyle::dashed_loose()));
        }
        for x in visible(&run.markers.retries, 0.0) {
            plot_ui.vline(
                VLine::new("cache released by a malloc", x)
                    .color(style::series::RETRY)
                    .style(LineStyle::dotted_dense()),
            );
        }
        for x in visible(&run.markers.collections, 0.0) {
            plot_ui.vline(
                VLine::new("garbage collection", x)
                    .color(egui::Color32::from_gray(150))
                    .style(LineStyle::dotted_dense()),
            );
        }
        if show_marks && !run.marks.is_empty() {
            label_rows = mark_labels(plot_ui, run, x0, x1);
        }
        plot_ui.vline(VLine::new("", cursor as f64).color(style::series::CURSOR).width(2.0));
        let response = plot_ui.response();

        let clicked_oom = if response.clicked() {
            let pointer = plot_ui.ctx().input(|i| i.pointer.latest_pos());
            pointer.and_then(|p| oom_near(&run.markers.ooms, plot_ui.transform(), p.x))
        } else {
            None
        };
        if let Some(entry) = clicked_oom {
            Some(TimelinePick::Oom(entry))
        } else if response.dragged() || response.clicked() {
            pointer_entry(plot_ui).map(|p| TimelinePick::Cursor(p.x.round().clamp(0.0, x_max) as usize))
        } else {
            None
        }
    });
    let bounds = response.transform.bounds();
    state.plot_area = Some((*response.transform.frame(), bounds.min()[0], bounds.max()[0]));
    if label_rows != state.label_rows {
        // The band for the labels changes the y range: draw again with the new one.
        state.label_rows = label_rows;
        ui.ctx().request_repaint();
    }
    let mut picked = response.inner;
    if let Some(TimelinePick::Cursor(x)) = picked {
        moved = Some(x.min(end));
        picked = None;
    }
    let keys = ui.ctx().input(|i| {
        (
            i.key_pressed(egui::Key::ArrowLeft),
            i.key_pressed(egui::Key::ArrowRight),
            i.key_pressed(egui::Key::Home),
            i.key_pressed(egui::Key::End),
        )
    });
    let typing = ui.ctx().egui_wants_keyboard_input();
    if !typing {
        match keys {
            (true, _, _, _) => moved = Some(cursor.saturating_sub(1)),
            (_, true, _, _) => moved = Some((cursor + 1).min(end)),
            (_, _, true, _) => moved = Some(0),
            (_, _, _, true) => moved = Some(end),
            _ => {}
        }
    }
    // An OOM marker is picked even where the cursor already stands on it: it opens the answer.
    picked.or(moved.filter(|&m| m != cursor).map(TimelinePick::Cursor))
}

/// The plot's x coordinate under the pointer. (egui_plot's own `pointer_coordinate` subtracts
/// the drag delta, as if dragging panned the plot; here dragging moves the cursor instead.)
pub fn pointer_entry(plot_ui: &egui_plot::PlotUi<'_>) -> Option<egui_plot::PlotPoint> {
    let pos = plot_ui.ctx().input(|i| i.pointer.latest_pos())?;
    Some(plot_ui.plot_from_screen(pos))
}

/// One line on the entry just before the cursor.
pub fn cursor_text(run: &Run, cursor: usize) -> String {
    match cursor.checked_sub(1).and_then(|i| run.trace.get(i)) {
        None => "before the first entry".into(),
        Some(e) => {
            let origin = run.trace.first().map_or(0, |f| f.time_us);
            format!(
                "after #{}: {} {} at {} ({})",
                format::count(cursor as u64 - 1),
                e.action.name(),
                format::bytes(e.size),
                format::address(e.addr),
                format::seconds_since(e.time_us, origin)
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::label_rows;

    #[test]
    fn labels_take_the_first_row_with_room_and_never_overlap() {
        // (left, width) in points, in order of left.
        let spans = [(0.0, 50.0), (20.0, 50.0), (40.0, 10.0), (56.0, 30.0), (60.0, 10.0), (61.0, 10.0), (200.0, 5.0)];
        let rows = label_rows(&spans, 3, 6.0);
        assert_eq!(rows, [Some(0), Some(1), Some(2), Some(0), Some(2), None, Some(0)]);
        for (i, (a, ra)) in spans.iter().zip(&rows).enumerate() {
            for (b, rb) in spans[i + 1..].iter().zip(&rows[i + 1..]) {
                if ra.is_some() && ra == rb {
                    assert!(a.0 + a.1 + 6.0 <= b.0, "{a:?} and {b:?} overlap in row {ra:?}");
                }
            }
        }
    }
}
