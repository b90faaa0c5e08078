//! The trace as a filterable list (action, stream, size, frame text); picking an entry moves
//! the cursor to just after it.

use cachalot_core::{StreamId, TraceAction};

use crate::format;
use crate::model::Run;
use crate::style;

/// Height of a list row.
const ROW_HEIGHT: f32 = 16.0;

/// The filter, compared between frames to know when to filter again.
#[derive(Clone, Debug, PartialEq, Eq)]
struct FilterKey {
    actions: [bool; 9],
    stream: Option<StreamId>,
    min_size: u64,
    text: String,
    entries: usize,
}

/// What the events panel remembers.
#[derive(Clone, Debug)]
pub struct EventsState {
    /// Which actions are listed (in [`TraceAction::ALL`] order).
    pub actions: [bool; 9],
    /// Only this stream.
    pub stream: Option<StreamId>,
    /// Smallest size listed, as typed (`1 MiB`, `4096`).
    pub min_size: String,
    /// Text that a frame's file or function name must contain.
    pub text: String,
    filtered: Vec<u32>,
    key: Option<FilterKey>,
    last_cursor: Option<usize>,
}

impl Default for EventsState {
    fn default() -> Self {
        EventsState {
            actions: [true; 9],
            stream: None,
            min_size: String::new(),
            text: String::new(),
            filtered: Vec::new(),
            key: None,
            last_cursor: None,
        }
    }
}

impl EventsState {
    /// Indices of the entries the filter lets through (after the last frame).
    pub fn filtered(&self) -> &[u32] {
        &self.filtered
    }

    fn refilter(&mut self, run: &Run) {
        let min_size = format::parse_bytes(&self.min_size).unwrap_or(0);
        let key = FilterKey {
            actions: self.actions,
            stream: self.stream,
            min_size,
            text: self.text.to_lowercase(),
            entries: run.trace.len(),
        };
        if self.key.as_ref() == Some(&key) {
            return;
        }
        // Match each stack once, not once per entry.
        let stacks = run.contexts.stacks();
        let stack_matches: Vec<bool> = stacks
            .iter()
            .map(|frames| {
                key.text.is_empty()
                    || frames.iter().any(|f| {
                        f.filename.to_lowercase().contains(&key.text) || f.name.to_lowercase().contains(&key.text)
                    })
            })
            .collect();
        self.filtered = run
            .trace
            .iter()
            .enumerate()
            .filter(|(_, e)| {
                key.actions[e.action as usize]
                    && key.stream.is_none_or(|s| s == e.stream)
                    && e.size >= key.min_size
                    && match e.context {
                        Some(c) => stack_matches.get(c.0 as usize).copied().unwrap_or(false),
                        None => key.text.is_empty(),
                    }
            })
            .map(|(i, _)| i as u32)
            .collect();
        self.key = Some(key);
    }
}

/// The list line of entry `i`.
pub fn entry_line(run: &Run, i: usize) -> String {
    let Some(e) = run.trace.get(i) else { return String::new() };
    let frame = run
        .frames(e.context)
        .first()
        .map(|f| format!("{}:{} {}", f.filename.rsplit('/').next().unwrap_or(&f.filename), f.line, f.name))
        .unwrap_or_default();
    let place =
        if e.action == TraceAction::Oom { format!("free {}", format::bytes(e.addr)) } else { format::address(e.addr) };
    format!(
        "#{:<9} {:<14} {:>10} {:<16} {:<6} {}",
        i,
        e.action.name(),
        format::bytes(e.size),
        place,
        format::stream(e.stream),
        frame
    )
}

/// Shows the list; returns the cursor position the user picked.
pub fn ui(ui: &mut egui::Ui, run: &Run, cursor: usize, state: &mut EventsState) -> Option<usize> {
    let mut picked = None;
    ui.horizontal_wrapped(|ui| {
        for (i, action) in TraceAction::ALL.iter().enumerate() {
            ui.toggle_value(&mut state.actions[i], action.name());
        }
    });
    ui.horizontal(|ui| {
        let streams: std::collections::BTreeSet<StreamId> = run.head().segments.values().map(|s| s.stream).collect();
        egui::ComboBox::new("events_stream", "stream")
            .selected_text(state.stream.map_or("all streams".to_owned(), format::stream))
            .show_ui(ui, |ui| {
                ui.selectable_value(&mut state.stream, None, "all streams");
                for s in streams {
                    ui.selectable_value(&mut state.stream, Some(s), format::stream(s));
                }
            });
        ui.label("size ≥");
        ui.add(egui::TextEdit::singleline(&mut state.min_size).desired_width(70.0).hint_text("0"));
        ui.label("frame");
        ui.add(egui::TextEdit::singleline(&mut state.text).desired_width(160.0).hint_text("file or function"));
    });
    state.refilter(run);
    let list = &state.filtered;
    ui.label(format!("{} of {} entries", format::count(list.len() as u64), format::count(run.trace.len() as u64)));
    // The entry just before the cursor, and where it is in the filtered list.
    let current = cursor.checked_sub(1);
    let position = current.map(|c| list.partition_point(|&i| (i as usize) < c));
    let mut area = egui::ScrollArea::vertical().id_salt(("events_list", run.name.as_str())).auto_shrink(false);
    if state.last_cursor != Some(cursor)
        && let Some(p) = position
    {
        let row = ROW_HEIGHT + ui.spacing().item_spacing.y;
        area = area.vertical_scroll_offset((p as f32 * row - 120.0).max(0.0));
    }
    state.last_cursor = Some(cursor);
    area.show_rows(ui, ROW_HEIGHT, list.len(), |ui, range| {
        let font = egui::FontId::monospace(11.5);
        for &i in &list[range] {
            let i = i as usize;
            let selected = current == Some(i);
            let line = entry_line(run, i);
            let (rect, response) =
                ui.allocate_exact_size(egui::vec2(ui.available_width(), ROW_HEIGHT), egui::Sense::click());
            response.widget_info(|| egui::WidgetInfo::selected(egui::Role::Button, true, selected, &line));
            if ui.is_rect_visible(rect) {
                let visuals = ui.visuals();
                if selected {
                    ui.painter().rect_filled(rect, 2, visuals.selection.bg_fill);
                } else if response.hovered() {
                    ui.painter().rect_filled(rect, 2, visuals.widgets.hovered.weak_bg_fill);
                }
                let color =
                    if selected { visuals.strong_text_color() } else { style::action_color(run.trace[i].action) };
                ui.painter().text(
                    rect.left_center() + egui::vec2(4.0, 0.0),
                    egui::Align2::LEFT_CENTER,
                    line,
                    font.clone(),
                    color,
                );
            }
            if response.clicked() {
                picked = Some(i + 1);
            }
        }
    });
    if let Some(p) = picked {
        state.last_cursor = Some(p);
    }
    picked
}
