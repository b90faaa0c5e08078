//! The answer in words, written once for every place that shows it (`cachalot explain`, the
//! short answer of `run` and `replay --oom-snapshot`, the viewer's Explain tab). Sizes are
//! written by the caller's own formatter, so each keeps its style of units.

use std::fmt;

use cachalot_core::size::PoolKind;

use super::{Cause, Change, ClassBytes, Explanation, Memory, Request};

impl fmt::Display for Change {
    /// The line or the call that makes the change.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Change::Settings { settings } => write!(f, "PYTORCH_CUDA_ALLOC_CONF={settings}"),
            Change::OwnPolicy { settings } => write!(f, "{settings} (cachalot as the allocator)"),
            Change::EmptyCacheBefore { entry } => {
                write!(f, "torch.cuda.empty_cache() just before the request (entry {entry})")
            }
            Change::MemoryFraction { fraction } => write!(f, "torch.cuda.set_per_process_memory_fraction({fraction})"),
        }
    }
}

impl Request {
    /// The pool the request was served from, or asked.
    pub fn pool_kind(&self) -> PoolKind {
        if self.pool == "small" { PoolKind::Small } else { PoolKind::Large }
    }
}

impl Explanation {
    /// `main cause: …` with the figures that show it, sizes written by `size`; `None` where
    /// the request was served.
    pub fn main_cause_line(&self, size: impl Fn(u64) -> String) -> Option<String> {
        let cause = self.main_cause?;
        Some(cause_line(cause, &self.request, &self.memory, self.retry.room_after, &self.after_retry, size))
    }
}

/// `main cause: …` of a failed `request`, with the figures that show it.
pub(super) fn cause_line(
    cause: Cause,
    request: &Request,
    memory: &Memory,
    room_after: u64,
    after_retry: &[ClassBytes],
    size: impl Fn(u64) -> String,
) -> String {
    let (r, m) = (request, memory);
    let detail = match cause {
        Cause::LiveExceedsDevice => format!(
            "{} live + {} asked > {} the device leaves this allocator",
            size(m.allocated),
            size(r.rounded),
            size(m.device_total.saturating_sub(m.outside))
        ),
        Cause::FractionCap => format!(
            "allowance {} with {} reserved; the device had {} free",
            size(m.allowed.unwrap_or(0)),
            size(m.reserved_after),
            size(m.device_free_after)
        ),
        Cause::SegmentSize => format!("a segment of {} asked, {} of room", size(r.segment_size), size(room_after)),
        _ => after_retry
            .first()
            .map(|c| format!("{} in {} blocks, largest {}", size(c.bytes), c.blocks, size(c.largest_block)))
            .unwrap_or_default(),
    };
    format!("main cause: {} ({detail})", cause.describe(r.pool_kind()))
}
