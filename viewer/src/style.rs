//! How the viewer looks: the theme, the colours every panel shares (series, block kinds,
//! streams, trace actions) and the panel frames, which drop their fill where a software
//! rasterizer draws the window.

use cachalot_core::{BlockState, StreamId, TraceAction};
use egui::Color32;

/// Sets the theme and spacing the panels are laid out for.
pub fn setup(ctx: &egui::Context) {
    ctx.set_theme(egui::Theme::Dark);
    ctx.global_style_mut(|style| {
        style.spacing.item_spacing = egui::vec2(6.0, 4.0);
    });
}

/// Where the app tells the panels whether a software rasterizer draws them: they read it from
/// the context, so that no panel needs the app.
fn software_rendering_id() -> egui::Id {
    egui::Id::unique("cachalot_software_rendering")
}

/// Tells the panels drawn with `ctx` whether a software rasterizer draws the window (the app
/// calls this at the start of every frame).
pub fn set_software_rendering(ctx: &egui::Context, software: bool) {
    ctx.data_mut(|d| d.insert_temp(software_rendering_id(), software));
}

/// Whether a software rasterizer draws the window, where every filled pixel counts.
pub fn software_rendering(ctx: &egui::Context) -> bool {
    ctx.data(|d| d.get_temp::<bool>(software_rendering_id())).unwrap_or(false)
}

/// A panel's `frame`, without its fill when a software rasterizer draws the window. There, every
/// shaded pixel costs CPU time (a pass over the whole window is a large share of a frame, even
/// through OpenGL, which the window uses there: `native::WindowRenderer`), and the panels' fills
/// cover the whole window, so leaving them out multiplies the frame rate of an empty window
/// (docs/journal/benchmarks-2026-11.md, section 5, "Earlier the same day: fewer shaded pixels").
/// The window is cleared to the same colour ([`eframe::App::clear_color`]), which costs nothing;
/// what is lost is the fade at the edges of scroll areas, which takes its colour from the fill.
pub fn panel_frame(ui: &egui::Ui, frame: egui::Frame) -> egui::Frame {
    if software_rendering(ui.ctx()) { frame.fill(egui::Color32::TRANSPARENT) } else { frame }
}

/// What a block is, for colouring: its state and whether its segment is split.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BlockKind {
    /// Handed out to a user.
    Allocated,
    /// Freed, waiting for work on another stream.
    PendingFree,
    /// Free, in a segment that holds other blocks too: cached but not releasable.
    InactiveSplit,
    /// Free, the whole segment: releasable by `empty_cache`.
    Free,
    /// Reserved address space of an expandable segment with no memory mapped.
    Unmapped,
}

impl BlockKind {
    /// Every kind, for the legend.
    pub const ALL: [BlockKind; 5] =
        [BlockKind::Allocated, BlockKind::PendingFree, BlockKind::InactiveSplit, BlockKind::Free, BlockKind::Unmapped];

    /// The kind of a block in a segment that is (or is not) split.
    pub fn of(state: BlockState, split: bool) -> Self {
        match state {
            BlockState::ActiveAllocated => BlockKind::Allocated,
            BlockState::ActivePendingFree => BlockKind::PendingFree,
            BlockState::Inactive if split => BlockKind::InactiveSplit,
            BlockState::Inactive => BlockKind::Free,
        }
    }

    /// Its name in the legend.
    pub fn label(self) -> &'static str {
        match self {
            BlockKind::Allocated => "allocated",
            BlockKind::PendingFree => "freed, pending on another stream",
            BlockKind::InactiveSplit => "free, inactive split",
            BlockKind::Free => "free segment (releasable)",
            BlockKind::Unmapped => "unmapped VA",
        }
    }

    /// Its colour.
    pub fn color(self) -> Color32 {
        match self {
            BlockKind::Allocated => Color32::from_rgb(66, 133, 244),
            BlockKind::PendingFree => Color32::from_rgb(255, 152, 0),
            BlockKind::InactiveSplit => Color32::from_rgb(222, 196, 72),
            BlockKind::Free => Color32::from_rgb(98, 160, 110),
            BlockKind::Unmapped => Color32::from_rgb(58, 58, 66),
        }
    }

    /// Which colour wins when several blocks share one pixel (the most telling one).
    pub fn priority(self) -> u8 {
        match self {
            BlockKind::Allocated => 4,
            BlockKind::PendingFree => 5,
            BlockKind::InactiveSplit => 3,
            BlockKind::Free => 2,
            BlockKind::Unmapped => 1,
        }
    }
}

/// A colour per stream (the default stream is grey).
pub fn stream_color(s: StreamId) -> Color32 {
    if s == StreamId::DEFAULT {
        return Color32::from_gray(150);
    }
    const PALETTE: [Color32; 6] = [
        Color32::from_rgb(171, 71, 188),
        Color32::from_rgb(38, 166, 154),
        Color32::from_rgb(239, 83, 80),
        Color32::from_rgb(141, 110, 99),
        Color32::from_rgb(92, 107, 192),
        Color32::from_rgb(212, 225, 87),
    ];
    // Stream handles are pointers or small integers; mix the bits so neighbours differ.
    let h = s.0.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 59;
    PALETTE[h as usize % PALETTE.len()]
}

/// A colour per trace action in the event list.
pub fn action_color(a: TraceAction) -> Color32 {
    match a {
        TraceAction::Alloc => BlockKind::Allocated.color(),
        TraceAction::FreeRequested => Color32::from_rgb(255, 183, 77),
        TraceAction::FreeCompleted => BlockKind::Free.color(),
        TraceAction::SegmentAlloc | TraceAction::SegmentMap => Color32::from_rgb(186, 104, 200),
        TraceAction::SegmentFree | TraceAction::SegmentUnmap => Color32::from_rgb(149, 117, 205),
        TraceAction::Snapshot => Color32::from_gray(160),
        TraceAction::Oom => Color32::from_rgb(244, 67, 54),
    }
}

/// Colours of the three timeline series.
pub mod series {
    use egui::Color32;
    /// `memory_allocated()`.
    pub const ALLOCATED: Color32 = Color32::from_rgb(66, 133, 244);
    /// Active bytes.
    pub const ACTIVE: Color32 = Color32::from_rgb(255, 152, 0);
    /// `memory_reserved()`.
    pub const RESERVED: Color32 = Color32::from_rgb(98, 190, 110);
    /// Out-of-memory markers.
    pub const OOM: Color32 = Color32::from_rgb(244, 67, 54);
    /// `empty_cache` markers.
    pub const EMPTY_CACHE: Color32 = Color32::from_rgb(186, 104, 200);
    /// Full releases of the retry chain.
    pub const RETRY: Color32 = Color32::from_rgb(255, 112, 67);
    /// The cursor.
    pub const CURSOR: Color32 = Color32::from_rgb(250, 250, 250);
}
