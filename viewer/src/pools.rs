//! The pools at the cursor: small and large pool per stream, with what is cached in each, its
//! largest free block and a histogram of free-block sizes — the fragmentation picture. Segments
//! of private pools (`torch.cuda.MemPool`, CUDA graphs) are rows of their own, labelled with the
//! pool's id where the recording's snapshot names it (`segment_pool_id`: PyTorch records it for
//! the segments alive at the end, its trace entries name no pool).

use std::collections::BTreeMap;

use cachalot_core::size::PoolKind;
use cachalot_core::{BlockState, PoolId, SegmentSnapshot, StreamId};
use egui_plot::{Bar, BarChart, Plot};

use crate::format;
use crate::model::PoolState;
use crate::style;

/// Free-block histogram buckets: powers of two from 512 B (2^9) to 2^40 B.
const FIRST_BUCKET: u32 = 9;
const BUCKETS: usize = 32;

/// What one (stream, pool) holds.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PoolSummary {
    /// Segments (mapped ranges for expandable segments).
    pub segments: usize,
    /// Bytes reserved.
    pub reserved: u64,
    /// Bytes allocated.
    pub allocated: u64,
    /// Bytes freed but waiting for another stream.
    pub pending: u64,
    /// Bytes free in the cache.
    pub free: u64,
    /// Of those, bytes in split segments (not releasable).
    pub inactive_split: u64,
    /// Number of free blocks.
    pub free_blocks: usize,
    /// The largest free block.
    pub largest_free: u64,
    /// Free blocks per power-of-two size bucket (bucket `i` holds sizes in `[2^(9+i), 2^(10+i))`).
    pub histogram: Vec<u64>,
}

impl PoolSummary {
    /// How much of the free memory is not in the largest free block (0 = one free block).
    pub fn fragmentation(&self) -> f64 {
        if self.free == 0 { 0.0 } else { 1.0 - self.largest_free as f64 / self.free as f64 }
    }

    fn add_free(&mut self, size: u64) {
        self.free_blocks += 1;
        self.largest_free = self.largest_free.max(size);
        let bucket = (63 - size.max(1).leading_zeros()).saturating_sub(FIRST_BUCKET) as usize;
        self.histogram[bucket.min(BUCKETS - 1)] += 1;
    }
}

/// One row of the table: a private pool's id ([`PoolId::DEFAULT`] for the default pools), a
/// stream and a pool kind.
pub type PoolKey = (PoolId, StreamId, PoolKind);

/// The private pools of the segments a recording ended with, by (address, stream).
pub fn private_segments(recorded_end: Option<&[SegmentSnapshot]>) -> BTreeMap<(u64, StreamId), PoolId> {
    recorded_end
        .unwrap_or_default()
        .iter()
        .filter(|s| !s.pool_id.is_default())
        .map(|s| ((s.address, s.stream), s.pool_id))
        .collect()
}

/// Summaries per (private pool, stream, pool), plus the total under `None`; `private` names
/// the pool of segments by (address, stream) (see [`private_segments`]).
pub fn summarize(
    state: &PoolState,
    private: &BTreeMap<(u64, StreamId), PoolId>,
) -> BTreeMap<Option<PoolKey>, PoolSummary> {
    let mut out: BTreeMap<Option<PoolKey>, PoolSummary> = BTreeMap::new();
    for segment in state.segments.values() {
        let split = segment.is_split() && !segment.expandable;
        let pool_id = private.get(&(segment.address, segment.stream)).copied().unwrap_or_default();
        for key in [Some((pool_id, segment.stream, segment.pool)), None] {
            let s = out.entry(key).or_insert_with(|| PoolSummary { histogram: vec![0; BUCKETS], ..Default::default() });
            s.segments += 1;
            s.reserved += segment.size;
            for b in &segment.blocks {
                match b.state {
                    BlockState::ActiveAllocated => s.allocated += b.size,
                    BlockState::ActivePendingFree => s.pending += b.size,
                    BlockState::Inactive => {
                        s.free += b.size;
                        if split {
                            s.inactive_split += b.size;
                        }
                        s.add_free(b.size);
                    }
                }
            }
        }
    }
    out
}

/// What the pools panel remembers.
#[derive(Clone, Debug, Default)]
pub struct PoolsState {
    /// The pool whose histogram is shown (`None`: all).
    pub selected: Option<PoolKey>,
    /// Histogram of bytes instead of block counts.
    pub by_bytes: bool,
}

/// "large", or "large · private (0, 1)" for a private pool's.
fn pool_label(id: PoolId, pool: PoolKind) -> String {
    if id.is_default() { pool.name().to_owned() } else { format!("{} · private {id}", pool.name()) }
}

fn bucket_label(i: usize) -> String {
    format::bytes_axis(1u64 << (FIRST_BUCKET as usize + i))
}

/// Shows the pools of `state`; `recorded_end` (the recording's final segments) names private
/// pools.
pub fn ui(ui: &mut egui::Ui, state: &PoolState, recorded_end: Option<&[SegmentSnapshot]>, pools: &mut PoolsState) {
    let summaries = summarize(state, &private_segments(recorded_end));
    if summaries.is_empty() {
        ui.weak("No segments at this point of the run.");
        return;
    }
    if let Some(total) = summaries.get(&None) {
        ui.horizontal_wrapped(|ui| {
            ui.strong(format!("Largest free block: {}", format::bytes(total.largest_free)));
            ui.separator();
            ui.label(format!(
                "cached free {} in {} blocks, of which {} in split segments (non-releasable); fragmentation {:.1} %",
                format::bytes(total.free),
                format::count(total.free_blocks as u64),
                format::bytes(total.inactive_split),
                100.0 * total.fragmentation()
            ));
        });
    }
    ui.add_space(4.0);
    egui::Grid::new("pools_table").striped(true).num_columns(11).show(ui, |ui| {
        for title in [
            "stream",
            "pool",
            "segments",
            "reserved",
            "allocated",
            "pending free",
            "free cached",
            "inactive split",
            "free blocks",
            "largest free",
            "fragmentation",
        ] {
            ui.strong(title);
        }
        ui.end_row();
        for (key, s) in &summaries {
            let (stream, pool) = match key {
                Some((id, stream, pool)) => (format::stream(*stream), pool_label(*id, *pool)),
                None => ("all".to_owned(), "both".to_owned()),
            };
            let selected = pools.selected == *key;
            if ui.selectable_label(selected, stream).on_hover_text("show this pool's histogram").clicked() {
                pools.selected = *key;
            }
            ui.label(pool);
            ui.label(format::count(s.segments as u64));
            ui.label(format::bytes(s.reserved));
            ui.label(format::bytes(s.allocated));
            ui.label(format::bytes(s.pending));
            ui.label(format::bytes(s.free));
            ui.label(format::bytes(s.inactive_split));
            ui.label(format::count(s.free_blocks as u64));
            ui.label(format::bytes(s.largest_free));
            ui.label(format!("{:.1} %", 100.0 * s.fragmentation()));
            ui.end_row();
        }
    });
    ui.add_space(6.0);
    let shown = summaries.get(&pools.selected).or_else(|| summaries.get(&None));
    let Some(shown) = shown else { return };
    ui.horizontal(|ui| {
        let which = match pools.selected {
            Some((id, stream, pool)) => format!("{} of stream {}", pool_label(id, pool), format::stream(stream)),
            None => "all pools".to_owned(),
        };
        ui.strong(format!("Free-block sizes, {which}"));
        ui.radio_value(&mut pools.by_bytes, false, "blocks");
        ui.radio_value(&mut pools.by_bytes, true, "bytes (approx.)");
    });
    let last = shown.histogram.iter().rposition(|&n| n > 0).unwrap_or(0).max(8);
    let bars: Vec<Bar> = (0..=last)
        .map(|i| {
            let n = shown.histogram[i];
            let height =
                if pools.by_bytes { n as f64 * (1u64 << (FIRST_BUCKET as usize + i)) as f64 } else { n as f64 };
            Bar::new(i as f64, height).name(format!("{}–{}", bucket_label(i), bucket_label(i + 1))).width(0.8)
        })
        .collect();
    let by_bytes = pools.by_bytes;
    Plot::new("free_histogram")
        .allow_drag(false)
        .allow_zoom(false)
        .allow_scroll(false)
        .x_axis_formatter(|mark, _| {
            let i = mark.value.round();
            if (mark.value - i).abs() < 1e-6 && i >= 0.0 { bucket_label(i as usize) } else { String::new() }
        })
        .y_axis_formatter(move |mark, _| {
            if mark.value < 0.0 {
                String::new()
            } else if by_bytes {
                format::bytes_axis(mark.value as u64)
            } else if mark.value.fract() == 0.0 {
                format!("{}", mark.value as u64)
            } else {
                String::new()
            }
        })
        .show(ui, |plot_ui| {
            plot_ui.bar_chart(BarChart::new("free blocks", bars).color(style::BlockKind::InactiveSplit.color()));
        });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Block, NO_EVENT, Segment};

    #[test]
    fn summaries_count_free_blocks_by_pool() {
        let mut state = PoolState::default();
        let block = |address, size, state| Block { address, size, requested: 0, state, event: NO_EVENT, context: None };
        state.segments.insert(
            0,
            Segment {
                address: 0,
                size: 3 << 20,
                stream: StreamId::DEFAULT,
                pool: PoolKind::Large,
                expandable: false,
                event: NO_EVENT,
                context: None,
                blocks: vec![
                    block(0, 1 << 20, BlockState::Inactive),
                    block(1 << 20, 1 << 20, BlockState::ActiveAllocated),
                    block(2 << 20, 1 << 20, BlockState::Inactive),
                ],
            },
        );
        let s = summarize(&state, &BTreeMap::new());
        let large = &s[&Some((PoolId::DEFAULT, StreamId::DEFAULT, PoolKind::Large))];
        assert_eq!((large.free, large.free_blocks, large.largest_free), (2 << 20, 2, 1 << 20));
        assert_eq!(large.inactive_split, 2 << 20);
        assert_eq!(large.histogram[(20 - FIRST_BUCKET) as usize], 2);
        assert!((large.fragmentation() - 0.5).abs() < 1e-9);
        assert_eq!(s[&None].allocated, 1 << 20);
    }

    /// A segment the recording's snapshot puts in a private pool is a row of that pool's, apart
    /// from the default pool's row of the same stream and kind.
    #[test]
    fn segments_of_private_pools_are_rows_of_their_own() {
        let mut state = PoolState::default();
        let segment = |address| Segment {
            address,
            size: 2 << 20,
            stream: StreamId::DEFAULT,
            pool: PoolKind::Small,
            expandable: false,
            event: NO_EVENT,
            context: None,
            blocks: vec![Block {
                address,
                size: 2 << 20,
                requested: 0,
                state: BlockState::Inactive,
                event: NO_EVENT,
                context: None,
            }],
        };
        state.segments.insert(0, segment(0));
        state.segments.insert(4 << 20, segment(4 << 20));
        let end = [SegmentSnapshot {
            address: 4 << 20,
            total_size: 2 << 20,
            allocated_size: 0,
            active_size: 0,
            requested_size: 0,
            stream: StreamId::DEFAULT,
            pool: PoolKind::Small,
            is_expandable: false,
            pool_id: PoolId(0, 1),
            context: None,
            blocks: Vec::new(),
        }];
        let s = summarize(&state, &private_segments(Some(&end)));
        let private = &s[&Some((PoolId(0, 1), StreamId::DEFAULT, PoolKind::Small))];
        let default = &s[&Some((PoolId::DEFAULT, StreamId::DEFAULT, PoolKind::Small))];
        assert_eq!((private.segments, default.segments, s[&None].segments), (1, 1, 2));
        assert_eq!(pool_label(PoolId(0, 1), PoolKind::Small), "small · private (0, 1)");
    }
}
