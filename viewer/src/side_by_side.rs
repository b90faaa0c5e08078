//! Two runs side by side with linked cursors (the "Compare" tab): e.g. one experiment on CUDA
//! and on wgpu, or PyTorch's recorded trace and cachalot's replay of it. Both timelines in one
//! plot, each run's peaks and B's over A's (a trace beside its replay under `policy:cachalot`:
//! what cachalot's own policy would save), the `memory_stats()` keys that differ at the
//! cursors, both segment maps.

use egui_plot::{LineStyle, VLine};

use crate::format;
use crate::model::Run;
use crate::segments::{self, SegmentMapState};
use crate::style;
use crate::tabs::RunTab;
use crate::timeline::{add_series, memory_plot, outline};

/// How the cursor of the second run follows the first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Link {
    /// The same entry number (runs of one program: the same operations in the same order).
    Entry,
    /// The same fraction of each run.
    Fraction,
}

/// What the side-by-side panel remembers.
#[derive(Debug)]
pub struct SideBySideState {
    /// Index of the first run.
    pub a: usize,
    /// Index of the second run.
    pub b: usize,
    /// How the cursors are linked.
    pub link: Link,
    /// List only the stats that differ.
    pub only_differences: bool,
    /// The two segment maps.
    pub maps: [SegmentMapState; 2],
    /// Why the two runs differ (`cachalot compare`'s analysis).
    pub reasons: crate::reasons::ReasonsState,
    /// A run against PyTorch's `expected.json`.
    pub expected: crate::reasons::ExpectedState,
}

impl Default for SideBySideState {
    fn default() -> Self {
        SideBySideState {
            a: 0,
            b: 1,
            link: Link::Entry,
            only_differences: true,
            maps: [(); 2].map(|()| SegmentMapState { fill_height: false, ..SegmentMapState::default() }),
            reasons: crate::reasons::ReasonsState::default(),
            expected: crate::reasons::ExpectedState::default(),
        }
    }
}

impl SideBySideState {
    /// Where the second run's cursor goes for cursor `a` of the first.
    pub fn linked(&self, a: usize, end_a: usize, end_b: usize) -> usize {
        match self.link {
            Link::Entry => a.min(end_b),
            Link::Fraction if end_a == 0 => 0,
            Link::Fraction => ((a as f64 / end_a as f64) * end_b as f64).round() as usize,
        }
    }
}

fn run_picker(ui: &mut egui::Ui, label: &str, tabs: &[RunTab], index: &mut usize) {
    egui::ComboBox::new(("compare_pick", label), format!("run {label}"))
        .selected_text(tabs.get(*index).map_or("—".to_owned(), |t| t.run.name.clone()))
        .width(260.0)
        .show_ui(ui, |ui| {
            for (i, tab) in tabs.iter().enumerate() {
                ui.selectable_value(index, i, tab.run.name.as_str());
            }
        });
}

/// Shows two of `tabs` (all open runs) side by side, and a run against PyTorch's
/// `expected.json`.
pub fn ui(ui: &mut egui::Ui, tabs: &mut [RunTab], state: &mut SideBySideState) {
    crate::reasons::expected_ui(ui, tabs, &mut state.expected);
    if tabs.len() < 2 {
        ui.add_space(20.0);
        ui.label("Open two runs to compare them (e.g. a PyTorch trace and its cachalot replay from the \"Replay through cachalot\" button).");
        return;
    }
    state.a = state.a.min(tabs.len() - 1);
    state.b = state.b.min(tabs.len() - 1);
    ui.horizontal(|ui| {
        run_picker(ui, "A", tabs, &mut state.a);
        run_picker(ui, "B", tabs, &mut state.b);
        if ui.small_button("swap").on_hover_text("swap").clicked() {
            std::mem::swap(&mut state.a, &mut state.b);
        }
        ui.separator();
        ui.label("link cursors by");
        ui.radio_value(&mut state.link, Link::Entry, "entry");
        ui.radio_value(&mut state.link, Link::Fraction, "fraction of the run");
        ui.checkbox(&mut state.only_differences, "only differing stats");
    });
    if state.a == state.b {
        // A run compared with itself says nothing: take the next one.
        state.b = (state.a + 1) % tabs.len();
    }
    let (a, b) = (state.a, state.b);
    {
        let (ra, rb) = two_mut(tabs, a, b);
        peaks_ui(ui, &mut ra.run, &mut rb.run);
    }
    crate::reasons::ui(ui, &tabs[a], &tabs[b], &mut state.reasons);
    let (end_a, end_b) = (tabs[a].run.end(), tabs[b].run.end());
    let mut cursor = tabs[a].cursor.min(end_a);

    // One plot, both runs, in A's entry numbers.
    let scale_b = match state.link {
        Link::Entry => 1.0,
        Link::Fraction if end_b == 0 => 1.0,
        Link::Fraction => end_a as f64 / end_b as f64,
    };
    let y_max = tabs[a].run.reserved.max().max(tabs[b].run.reserved.max()).max(1) as f64 * 1.08;
    let x_max = (end_a.max((end_b as f64 * scale_b) as usize)).max(1) as f64;
    let names = (tabs[a].run.name.clone(), tabs[b].run.name.clone());
    let moved = {
        let (ra, rb) = two_mut(tabs, a, b);
        memory_plot(("compare_plot", a, b), x_max, y_max)
            .legend(egui_plot::Legend::default().position(egui_plot::Corner::LeftTop))
            .height(170.0)
            .show(ui, |plot_ui| {
                let bounds = plot_ui.plot_bounds();
                let (x0, x1) = (bounds.min()[0], bounds.max()[0]);
                let (bx0, bx1) = (x0 / scale_b, x1 / scale_b);
                let counters = [
                    ("reserved", &mut ra.run.reserved, &mut rb.run.reserved, style::series::RESERVED),
                    ("allocated", &mut ra.run.allocated, &mut rb.run.allocated, style::series::ALLOCATED),
                ];
                for (label, series_a, series_b, color) in counters {
                    let a_outline = outline(series_a, plot_ui, x0, x1);
                    add_series(plot_ui, format!("A {label} — {}", names.0), a_outline, color, LineStyle::Solid);
                    let b_outline = outline(series_b, plot_ui, bx0, bx1).scale_x(scale_b);
                    let b_name = format!("B {label} — {}", names.1);
                    add_series(plot_ui, b_name, b_outline, color.gamma_multiply(0.8), LineStyle::dashed_dense());
                }
                plot_ui.vline(VLine::new("", cursor as f64).color(style::series::CURSOR).width(2.0));
                let response = plot_ui.response();
                if response.dragged() || response.clicked() {
                    crate::timeline::pointer_entry(plot_ui).map(|p| p.x.round().clamp(0.0, end_a as f64) as usize)
                } else {
                    None
                }
            })
            .inner
    };
    if let Some(m) = moved {
        cursor = m;
    }
    let cursor_b = state.linked(cursor, end_a, end_b);
    tabs[a].cursor = cursor;
    tabs[b].cursor = cursor_b;
    ui.label(format!(
        "A: {} — B: {}",
        crate::timeline::cursor_text(&tabs[a].run, cursor),
        crate::timeline::cursor_text(&tabs[b].run, cursor_b)
    ));

    // Bring both states to the cursors.
    for (i, c) in [(a, cursor), (b, cursor_b)] {
        let tab = &mut tabs[i];
        tab.run.seek(&mut tab.cache, c);
    }
    let (Some(sa), Some(sb)) = (tabs[a].cache.state(), tabs[b].cache.state()) else { return };
    let (fa, fb) = (sa.stats.to_flat(), sb.stats.to_flat());
    let differing = fa.iter().filter(|(k, v)| fb.get(*k) != Some(v)).count();
    ui.horizontal(|ui| {
        ui.strong("memory_stats()");
        if differing == 0 {
            ui.colored_label(style::series::RESERVED, "all 122 keys equal at the cursor");
        } else {
            ui.colored_label(style::series::OOM, format!("{differing} keys differ at the cursor"));
        }
    });
    egui::ScrollArea::vertical().id_salt("compare_stats").max_height(150.0).show(ui, |ui| {
        egui::Grid::new("compare_grid").striped(true).num_columns(4).show(ui, |ui| {
            for title in ["key", "A", "B", "B − A"] {
                ui.strong(title);
            }
            ui.end_row();
            for (key, va) in &fa {
                let vb = fb.get(key).copied().unwrap_or(0);
                if state.only_differences && *va == vb {
                    continue;
                }
                let is_bytes = key.contains("bytes");
                let show = |v: i64| if is_bytes { format::bytes_signed(v) } else { v.to_string() };
                ui.monospace(key);
                ui.label(show(*va));
                ui.label(show(vb));
                let delta = vb - va;
                if delta == 0 {
                    ui.label("0");
                } else {
                    ui.colored_label(style::series::OOM, show(delta));
                }
                ui.end_row();
            }
        });
    });
    ui.separator();
    let [map_a, map_b] = &mut state.maps;
    let (ta, tb) = two_mut(tabs, a, b);
    let mut go = [None, None];
    ui.columns(2, |columns| {
        for (k, (ui, (tab, map))) in columns.iter_mut().zip([(&*ta, map_a), (&*tb, map_b)]).enumerate() {
            ui.push_id(k, |ui| {
                ui.strong(format!("{} {}", if k == 0 { "A" } else { "B" }, tab.run.name));
                if let Some(state) = tab.cache.state() {
                    go[k] = segments::ui(ui, &tab.run, state, map);
                }
            });
        }
    });
    if let Some(g) = go[0] {
        tabs[a].cursor = g;
    }
    if let Some(g) = go[1] {
        tabs[b].cursor = g;
    }
}

/// The peaks of two runs and how B's compare with A's.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Peaks {
    /// `max_memory_reserved()` of A and B.
    pub reserved: (u64, u64),
    /// `max_memory_allocated()` of A and B.
    pub allocated: (u64, u64),
}

impl Peaks {
    /// The peaks of `a` and `b` over their whole runs.
    pub fn of(a: &mut Run, b: &mut Run) -> Self {
        Peaks { reserved: (a.reserved.max(), b.reserved.max()), allocated: (a.allocated.max(), b.allocated.max()) }
    }

    /// B's peak reserved over A's (`None` where A reserved nothing).
    pub fn reserved_ratio(&self) -> Option<f64> {
        ratio(self.reserved)
    }

    /// B's peak allocated over A's (`None` where A allocated nothing).
    pub fn allocated_ratio(&self) -> Option<f64> {
        ratio(self.allocated)
    }
}

fn ratio((a, b): (u64, u64)) -> Option<f64> {
    (a > 0).then(|| b as f64 / a as f64)
}

/// Whether `run` was made under cachalot's own policy.
fn own_policy(run: &Run) -> bool {
    run.settings.split(',').any(|entry| entry.trim() == cachalot_trace::tune::OWN_POLICY)
}

/// One line: each run's peak reserved and allocated and B's over A's; where one run is under
/// cachalot's own policy, how its allocated bytes read.
fn peaks_ui(ui: &mut egui::Ui, a: &mut Run, b: &mut Run) {
    let peaks = Peaks::of(a, b);
    let times = |r: Option<f64>| r.map_or("—".to_owned(), |r| format!("{r:.3}×"));
    ui.horizontal_wrapped(|ui| {
        ui.strong("peak reserved");
        ui.label(format!("A {} · B {}", format::bytes(peaks.reserved.0), format::bytes(peaks.reserved.1)));
        let ratio = peaks.reserved_ratio();
        let color = match ratio {
            Some(r) if r < 1.0 => style::series::RESERVED,
            Some(r) if r > 1.0 => style::series::OOM,
            _ => ui.visuals().text_color(),
        };
        ui.colored_label(color, format!("B / A {}", times(ratio)))
            .on_hover_text(format!("{} B against {} B", peaks.reserved.1, peaks.reserved.0));
        ui.separator();
        ui.strong("peak allocated");
        ui.label(format!(
            "A {} · B {} · B / A {}",
            format::bytes(peaks.allocated.0),
            format::bytes(peaks.allocated.1),
            times(peaks.allocated_ratio())
        ));
    });
    for (name, run) in [("A", &*a), ("B", &*b)] {
        if own_policy(run) {
            ui.label(
                egui::RichText::new(format!(
                    "{name} runs under {}: {}",
                    cachalot_trace::tune::OWN_POLICY,
                    cachalot_trace::tune::OWN_POLICY_ALLOCATED
                ))
                .small(),
            );
        }
    }
}

/// Two distinct elements mutably (`a != b`).
fn two_mut(tabs: &mut [RunTab], a: usize, b: usize) -> (&mut RunTab, &mut RunTab) {
    debug_assert_ne!(a, b);
    if a < b {
        let (left, right) = tabs.split_at_mut(b);
        (&mut left[a], &mut right[0])
    } else {
        let (left, right) = tabs.split_at_mut(a);
        (&mut right[0], &mut left[b])
    }
}
