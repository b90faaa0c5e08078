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

/// A run's error as a page shows it for a run on `device` (the browser's WebGPU adapter, or
/// the simulator): the allocator's out-of-memory message is PyTorch's word for word ("CUDA out
/// of memory. … GPU 0 has a total capacity …"), which names a device the run did not use; here
/// it names `device`. Other errors read as they are.
pub fn error_on_device(error: &str, device: &str) -> String {
    const PYTORCH: &str = "CUDA out of memory.";
    let Some(start) = error.find(PYTORCH) else { return error.to_owned() };
    let (before, rest) = (&error[..start], &error[start + PYTORCH.len()..]);
    let rest = match rest.find(" GPU ") {
        Some(at) => {
            let after = &rest[at + " GPU ".len()..];
            let digits = after.len() - after.trim_start_matches(|c: char| c.is_ascii_digit()).len();
            match after[digits..].strip_prefix(" has ") {
                Some(tail) if digits > 0 => format!("{} The device has {tail}", &rest[..at]),
                _ => rest.to_owned(),
            }
        }
        None => rest.to_owned(),
    };
    format!("{before}out of memory on {device}.{rest}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_out_of_memory_error_names_the_device_it_ran_on() {
        let pytorch = "CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of 16.00 MiB \
                       of which 0 bytes is free. Of the allocated memory 12.00 MiB is allocated by PyTorch";
        assert_eq!(
            error_on_device(pytorch, "WebGPU (google swiftshader, a budget of 16.00 MiB)"),
            "out of memory on WebGPU (google swiftshader, a budget of 16.00 MiB). Tried to allocate 20.00 MiB. The \
             device has a total capacity of 16.00 MiB of which 0 bytes is free. Of the allocated memory 12.00 MiB \
             is allocated by PyTorch"
        );
        let oversize = "CUDA out of memory. Tried to allocate more than 1EB memory.";
        assert_eq!(
            error_on_device(oversize, "the simulator"),
            "out of memory on the simulator. Tried to allocate more than 1EB memory."
        );
        assert_eq!(error_on_device("stopped after 3 marks", "the simulator"), "stopped after 3 marks");
        assert_eq!(
            error_on_device("seeds: CUDA out of memory. x", "the simulator"),
            "seeds: out of memory on the simulator. x"
        );
    }

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
