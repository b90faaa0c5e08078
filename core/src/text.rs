//! Numbers and values as messages quote them: counts grouped in threes, and a bad value cut
//! to a short prefix, so an error about a huge input stays one line.

/// The most bytes of a bad value an error message quotes ([`shorten`]).
pub const QUOTED_BYTES: usize = 100;

/// `text` as an error message quotes it: whole when it has at most [`QUOTED_BYTES`] bytes,
/// else its first ones (cut at a character boundary) followed by `… (N bytes)`, so a
/// 10-megabyte number in a file or a configuration string gives a one-line error, not a
/// 10-megabyte one.
///
/// ```
/// use cachalot_core::error::shorten;
/// assert_eq!(shorten("12x4"), "12x4");
/// let long = "9".repeat(10_000_000);
/// assert_eq!(shorten(&long), format!("{}… (10,000,000 bytes)", "9".repeat(100)));
/// ```
pub fn shorten(text: &str) -> std::borrow::Cow<'_, str> {
    if text.len() <= QUOTED_BYTES {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut end = QUOTED_BYTES;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    std::borrow::Cow::Owned(format!("{}… ({} bytes)", &text[..end], group_digits(text.len() as u64)))
}

/// `1234567` as `1,234,567`: counts in reports and the viewer.
pub fn group_digits(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, ch) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(ch);
    }
    out
}
