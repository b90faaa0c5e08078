//! How numbers, sizes, addresses, streams and times read in the viewer: one place, so every
//! panel agrees. Their colours are [`crate::style`]'s.

use cachalot_core::StreamId;
use cachalot_core::size::PoolKind;

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
