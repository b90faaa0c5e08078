//! How numbers, addresses and states look in the viewer: one place, so every panel agrees.

use cachalot_core::size::PoolKind;
use cachalot_core::{BlockState, StreamId, TraceAction};
use egui::Color32;

/// Bytes with a binary unit and one decimal (`20.0 MiB`, `512 B`), as memory_viz shows them.
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 7] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut value = n as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

/// Bytes for an axis label: the largest unit the value reaches, up to two decimals, no
/// trailing zeros (`768 MiB`, `1.25 GiB`).
pub fn bytes_axis(n: u64) -> String {
    const UNITS: [&str; 7] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    let mut value = n as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    let text = format!("{value:.2}");
    let text = text.trim_end_matches('0').trim_end_matches('.');
    format!("{text} {}", UNITS[unit])
}

/// Signed bytes (stats can be shown as differences).
pub fn bytes_signed(n: i64) -> String {
    if n < 0 { format!("-{}", bytes(n.unsigned_abs())) } else { bytes(n as u64) }
}

/// An integer with thousands separators (`3,000,000`).
pub use cachalot_core::error::group_digits as count;

/// A device address.
pub fn address(a: u64) -> String {
    format!("{a:#x}")
}

/// A stream, short: `s0` for the default stream, else the handle in hex.
pub fn stream(s: StreamId) -> String {
    if s == StreamId::DEFAULT { "s0".into() } else { format!("s{:#x}", s.0) }
}

/// A pool, one letter.
pub fn pool_letter(p: PoolKind) -> &'static str {
    match p {
        PoolKind::Small => "S",
        PoolKind::Large => "L",
    }
}

/// Microseconds since the first entry, as seconds.
pub fn seconds_since(time_us: i64, origin_us: i64) -> String {
    format!("{:.6} s", (time_us - origin_us) as f64 / 1e6)
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

/// Parses a size typed by a user: `1048576`, `1 MiB`, `1.5G`, `512k`.
pub fn parse_bytes(text: &str) -> Option<u64> {
    let t = text.trim().to_ascii_lowercase();
    if t.is_empty() {
        return None;
    }
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let value: f64 = number.parse().ok()?;
    let unit = unit.trim().trim_end_matches('b').trim_end_matches('i');
    let scale = match unit {
        "" => 1u64,
        "k" => 1 << 10,
        "m" => 1 << 20,
        "g" => 1 << 30,
        "t" => 1 << 40,
        _ => return None,
    };
    Some((value * scale as f64) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_like_memory_viz() {
        assert_eq!(bytes(4), "4 B");
        assert_eq!(bytes(20 << 20), "20.0 MiB");
        assert_eq!(bytes(1536), "1.5 KiB");
        assert_eq!(bytes_signed(-2048), "-2.0 KiB");
        assert_eq!(count(3_000_000), "3,000,000");
        assert_eq!(count(12), "12");
        assert_eq!(parse_bytes("1 MiB"), Some(1 << 20));
        assert_eq!(parse_bytes("1.5g"), Some(3 << 29));
        assert_eq!(parse_bytes("512"), Some(512));
        assert_eq!(parse_bytes("x"), None);
    }
}
