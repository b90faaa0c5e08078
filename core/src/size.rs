//! Size rules: how a request becomes a block size, which pool it belongs to and how large a
//! new segment for it is (`docs/allocator-rules.md` §1–§3, §6).
//!
//! All thresholds apply to the *rounded* size: a `10 MiB - 1` request rounds to exactly
//! 10 MiB and therefore gets its own 10 MiB segment instead of a 20 MiB one.

/// Every block size is a multiple of this (PyTorch `kMinBlockSize`).
pub const MIN_BLOCK_SIZE: u64 = 512;
/// Rounded sizes up to and including this go to the small pool (`kSmallSize`).
pub const SMALL_SIZE: u64 = 1 << 20;
/// Segment size for every small-pool allocation and page size of small expandable segments
/// (`kSmallBuffer`).
pub const SMALL_BUFFER: u64 = 2 << 20;
/// Default large segment size for requests under [`MIN_LARGE_ALLOC`], default large-pool page
/// size of expandable segments and default oversize slack (`kLargeBuffer`).
pub const LARGE_BUFFER: u64 = 20 << 20;
/// Rounded sizes from this on get a segment of their own (`kMinLargeAlloc`).
pub const MIN_LARGE_ALLOC: u64 = 10 << 20;
/// Granularity of segments for sizes of at least [`MIN_LARGE_ALLOC`] (`kRoundLarge`).
pub const ROUND_LARGE: u64 = 2 << 20;
/// One mebibyte, the unit of the `*_mb` configuration keys.
pub const MIB: u64 = 1 << 20;
/// Number of `roundup_power2_divisions` intervals: `[1 MiB, 2 MiB)` up to `>= 32 GiB`.
pub const ROUNDUP_INTERVALS: usize = 16;
/// Requests of this size or more fail at once with "more than 1EB" (PyTorch checks `>= 2^60`).
pub const MAX_REQUEST: u64 = 1 << 60;

/// Which of the two pools of a device a block lives in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
pub enum PoolKind {
    /// Blocks of at most 1 MiB, carved from 2 MiB segments.
    Small,
    /// Everything larger.
    Large,
}

impl PoolKind {
    /// The pool that serves a block of `rounded_size` bytes.
    #[inline]
    pub fn for_size(rounded_size: u64) -> Self {
        if rounded_size <= SMALL_SIZE { PoolKind::Small } else { PoolKind::Large }
    }

    /// PyTorch's name for the pool (`segment_type` in snapshots).
    pub fn name(self) -> &'static str {
        match self {
            PoolKind::Small => "small",
            PoolKind::Large => "large",
        }
    }
}

/// The per-interval divisions of `roundup_power2_divisions` (0 or 1 = plain 512-byte rounding).
pub type RoundupDivisions = [u64; ROUNDUP_INTERVALS];

/// `round_size`: the block size for a request of `size` bytes.
#[inline]
pub fn round_size(size: u64, divisions: &RoundupDivisions) -> u64 {
    if size < MIN_BLOCK_SIZE {
        return MIN_BLOCK_SIZE;
    }
    let d = divisions_for(size, divisions);
    if d > 1 && size > MIN_BLOCK_SIZE * d {
        roundup_power2_next_division(size, d)
    } else {
        size.div_ceil(MIN_BLOCK_SIZE) * MIN_BLOCK_SIZE
    }
}

/// The division count that applies to `size`: interval 0 also covers everything below 1 MiB.
#[inline]
fn divisions_for(size: u64, divisions: &RoundupDivisions) -> u64 {
    let log = u64::from(63 - size.leading_zeros());
    let index = log.saturating_sub(20).min(ROUNDUP_INTERVALS as u64 - 1);
    divisions[index as usize]
}

/// Rounds `size` up to the next of `divisions` equal steps between two powers of two.
fn roundup_power2_next_division(size: u64, divisions: u64) -> u64 {
    if size.is_power_of_two() {
        return size;
    }
    let floor = 1u64 << (63 - size.leading_zeros());
    let step = floor >> (63 - divisions.leading_zeros());
    if step == 0 {
        return floor << 1;
    }
    let rounded_down = size & !(step - 1);
    if rounded_down == size { size } else { rounded_down + step }
}

/// `get_allocation_size`: the segment size `cudaMalloc` is asked for when a block of
/// `rounded_size` bytes finds nothing in the cache.
#[inline]
pub fn allocation_size(rounded_size: u64, large_segment_size: u64) -> u64 {
    if rounded_size <= SMALL_SIZE {
        SMALL_BUFFER
    } else if rounded_size < MIN_LARGE_ALLOC {
        large_segment_size
    } else {
        rounded_size.div_ceil(ROUND_LARGE) * ROUND_LARGE
    }
}

/// `should_split`: whether a free block of `block_size` bytes that serves a request rounded to
/// `rounded` bytes is split, its remainder becoming a free block of its own. Small pool, and
/// every block while expandable segments are on: a remainder of at least 512 bytes. Large pool:
/// a remainder of more than 1 MiB, and never for oversize requests (`>= max_split_size`).
#[inline]
pub fn should_split(pool: PoolKind, expandable: bool, max_split_size: u64, block_size: u64, rounded: u64) -> bool {
    let remaining = block_size.saturating_sub(rounded);
    if pool == PoolKind::Small || expandable {
        remaining >= MIN_BLOCK_SIZE
    } else {
        rounded < max_split_size && remaining > SMALL_SIZE
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEFAULT: RoundupDivisions = [0; ROUNDUP_INTERVALS];

    /// `docs/allocator-rules.md` §2, measured on 2.11 / H200: request → block size under three configurations.
    #[test]
    fn rounding_table_matches_pytorch() {
        let four = [4; ROUNDUP_INTERVALS];
        // `[1:4,>:8]`: interval 0 gets 4, everything after it 8.
        let mut mixed = [8; ROUNDUP_INTERVALS];
        mixed[0] = 4;
        let table: [(u64, u64, u64, u64); 8] = [
            (1_200, 1_536, 1_536, 1_536),
            (2_049, 2_560, 2_560, 2_560),
            (5_000, 5_120, 5_120, 5_120),
            (1_300_000, 1_300_480, 1_310_720, 1_310_720),
            (3_000_000, 3_000_320, 3_145_728, 3_145_728),
            (5_242_881, 5_243_392, 6_291_456, 5_767_168),
            (73_400_321, 73_400_832, 83_886_080, 75_497_472),
            (314_572_801, 314_573_312, 335_544_320, 335_544_320),
        ];
        for (request, default, by_four, by_mixed) in table {
            assert_eq!(round_size(request, &DEFAULT), default, "default, {request}");
            assert_eq!(round_size(request, &four), by_four, "divisions 4, {request}");
            assert_eq!(round_size(request, &mixed), by_mixed, "[1:4,>:8], {request}");
        }
    }

    #[test]
    fn tiny_requests_take_one_minimum_block() {
        assert_eq!(round_size(1, &DEFAULT), 512);
        assert_eq!(round_size(4, &DEFAULT), 512);
        assert_eq!(round_size(512, &DEFAULT), 512);
        assert_eq!(round_size(513, &DEFAULT), 1024);
    }

    /// `docs/allocator-rules.md` §3 and §22: tiers are decided on the rounded size.
    #[test]
    fn allocation_sizes_follow_the_three_tiers() {
        assert_eq!(allocation_size(512, LARGE_BUFFER), SMALL_BUFFER);
        assert_eq!(allocation_size(SMALL_SIZE, LARGE_BUFFER), SMALL_BUFFER);
        assert_eq!(allocation_size(1_049_088, LARGE_BUFFER), LARGE_BUFFER);
        let ten_mib_minus_one = round_size(10 * MIB - 1, &DEFAULT);
        assert_eq!(ten_mib_minus_one, 10 * MIB);
        assert_eq!(allocation_size(ten_mib_minus_one, LARGE_BUFFER), 10 * MIB);
        assert_eq!(allocation_size(43_008_000, LARGE_BUFFER), 44_040_192);
        assert_eq!(allocation_size(15 * MIB, LARGE_BUFFER), 16 * MIB);
        assert_eq!(allocation_size(round_size(300 * MIB + 1, &DEFAULT), LARGE_BUFFER), 302 * MIB);
        assert_eq!(allocation_size(3 * MIB, 40 * MIB), 40 * MIB);
    }

    #[test]
    fn pools_split_at_one_mebibyte() {
        assert_eq!(PoolKind::for_size(SMALL_SIZE), PoolKind::Small);
        assert_eq!(PoolKind::for_size(SMALL_SIZE + 512), PoolKind::Large);
    }
}

/// Why a byte size did not parse ([`parse_bytes`]).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ByteSizeError {
    /// The number before the unit is not one.
    #[error("not a size")]
    NotANumber,
    /// The unit is none of B, KiB, MiB, GiB, TiB, kB, MB, GB.
    #[error("unknown unit '{0}'")]
    UnknownUnit(String),
    /// More than [`MAX_REQUEST`] (1 EiB), PyTorch's cap on one request, or not finite.
    #[error("larger than any device (at most 1 EiB = {MAX_REQUEST} bytes)")]
    TooLarge,
}

/// Parses a byte size as the command line and the viewer's forms take it: `4096`, `64MiB`,
/// `4 GiB`, `1.5GB` (binary units K/KiB, M/MiB, G/GiB, T/TiB; decimal kB, MB, GB; any case),
/// at most [`MAX_REQUEST`]. Fractions of a byte are cut off.
///
/// ```
/// use cachalot_core::size::{ByteSizeError, parse_bytes};
/// assert_eq!(parse_bytes("64MiB"), Ok(64 << 20));
/// assert_eq!(parse_bytes("1.5GB"), Ok(1_500_000_000));
/// assert_eq!(parse_bytes("3 parsecs"), Err(ByteSizeError::UnknownUnit("parsecs".into())));
/// ```
pub fn parse_bytes(text: &str) -> Result<u64, ByteSizeError> {
    let t = text.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let value: f64 = number.parse().map_err(|_| ByteSizeError::NotANumber)?;
    let scale: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" => 1 << 10,
        "kb" => 1000,
        "m" | "mib" => 1 << 20,
        "mb" => 1_000_000,
        "g" | "gib" => 1 << 30,
        "gb" => 1_000_000_000,
        "t" | "tib" => 1 << 40,
        other => return Err(ByteSizeError::UnknownUnit(other.to_owned())),
    };
    // The cast would saturate silently; nothing PyTorch can allocate is larger than 1 EiB.
    let bytes = value * scale as f64;
    if !(bytes.is_finite() && bytes <= MAX_REQUEST as f64) {
        return Err(ByteSizeError::TooLarge);
    }
    Ok(bytes as u64)
}
