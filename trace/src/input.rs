//! Reading an input file whole, with a size limit: the one limit every reader of the project
//! applies (the command line's, `compare`'s columns, the viewer's file loads), so a huge file
//! or an endless source such as `/dev/zero` or a pipe is an error naming the limit instead of
//! a read that runs until memory is gone.
//!
//! ```
//! let path = std::env::temp_dir().join(format!("cachalot-input-doc-{}", std::process::id()));
//! std::fs::write(&path, b"a 0 512\n")?;
//! assert_eq!(cachalot_trace::input::read_limited(&path, 8)?, b"a 0 512\n");
//! assert!(cachalot_trace::input::read_limited(&path, 7).is_err());
//! std::fs::remove_file(&path)?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::io::Read;
use std::path::Path;

/// The most bytes an input file may have unless `CACHALOT_MAX_INPUT_BYTES` says otherwise:
/// 1 GiB, about eight times the 3,000,000-entry pickle of BENCHMARKS.md.
pub const DEFAULT_MAX_INPUT_BYTES: u64 = 1 << 30;

/// Why an input file was not read.
#[derive(Debug, thiserror::Error)]
pub enum InputError {
    /// `CACHALOT_MAX_INPUT_BYTES` is not a positive number.
    #[error("CACHALOT_MAX_INPUT_BYTES={0}: expected a positive number of bytes")]
    BadLimit(String),
    /// The file could not be opened or read.
    #[error("{name}: cannot read")]
    Read {
        /// The file.
        name: String,
        /// What the system said.
        #[source]
        source: std::io::Error,
    },
    /// The file is larger than the limit; `size` is its length where the system knows it
    /// beforehand (a regular file), `None` where the read reached the limit (a pipe, a device).
    #[error(
        "{name}: {} the input limit of {limit} bytes (set CACHALOT_MAX_INPUT_BYTES to raise it)",
        match size { Some(size) => format!("{size} bytes is more than"), None => "more than".to_owned() }
    )]
    TooLarge {
        /// The file.
        name: String,
        /// Its length, when known before reading.
        size: Option<u64>,
        /// The limit in force.
        limit: u64,
    },
}

impl InputError {
    /// What is wrong, without the file's name, for a caller whose own error names the file:
    /// `cannot read: No such file or directory (os error 2)`.
    pub fn reason(&self) -> String {
        match self {
            InputError::BadLimit(_) => self.to_string(),
            InputError::Read { source, .. } => format!("cannot read: {source}"),
            InputError::TooLarge { name, .. } => {
                let message = self.to_string();
                message.strip_prefix(name.as_str()).and_then(|m| m.strip_prefix(": ")).unwrap_or(&message).to_owned()
            }
        }
    }
}

/// The input size limit: `CACHALOT_MAX_INPUT_BYTES` if set, else [`DEFAULT_MAX_INPUT_BYTES`].
pub fn max_input_bytes() -> Result<u64, InputError> {
    match std::env::var("CACHALOT_MAX_INPUT_BYTES") {
        Ok(text) => text.trim().parse::<u64>().ok().filter(|&n| n > 0).ok_or(InputError::BadLimit(text)),
        Err(_) => Ok(DEFAULT_MAX_INPUT_BYTES),
    }
}

/// Reads the whole of `path` (a file, a pipe or a device), refusing more than
/// [`max_input_bytes`].
pub fn read(path: &Path) -> Result<Vec<u8>, InputError> {
    read_limited(path, max_input_bytes()?)
}

/// Reads the whole of `path`, refusing more than `limit` bytes: a regular file larger than
/// that before reading anything, anything else once `limit + 1` bytes have come.
pub fn read_limited(path: &Path, limit: u64) -> Result<Vec<u8>, InputError> {
    let name = path.display().to_string();
    let file = match std::fs::File::open(path) {
        Ok(file) => file,
        Err(source) => return Err(InputError::Read { name, source }),
    };
    // A regular file's length sizes the buffer; a pipe or a device says 0 and grows it.
    let known = file.metadata().map(|m| m.len()).unwrap_or(0);
    if known > limit {
        return Err(InputError::TooLarge { name, size: Some(known), limit });
    }
    let mut bytes = Vec::with_capacity(known as usize);
    if let Err(source) = file.take(limit.saturating_add(1)).read_to_end(&mut bytes) {
        return Err(InputError::Read { name, source });
    }
    if bytes.len() as u64 > limit {
        return Err(InputError::TooLarge { name, size: None, limit });
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str, bytes: &[u8]) -> std::path::PathBuf {
        let path = std::env::temp_dir().join(format!("cachalot-input-{name}-{}", std::process::id()));
        std::fs::write(&path, bytes).expect("writes the scratch file");
        path
    }

    #[test]
    fn a_file_within_the_limit_is_read_whole() {
        let path = scratch("within", b"0123456789");
        assert_eq!(read_limited(&path, 10).expect("reads"), b"0123456789");
        std::fs::remove_file(path).ok();
    }

    #[test]
    fn a_file_over_the_limit_is_refused_naming_its_size_and_the_limit() {
        let path = scratch("over", b"0123456789");
        let message = read_limited(&path, 9).expect_err("over the limit").to_string();
        assert!(message.contains("10 bytes is more than the input limit of 9 bytes"), "{message}");
        assert!(message.contains("CACHALOT_MAX_INPUT_BYTES"), "{message}");
        let reason = read_limited(&path, 9).expect_err("over the limit").reason();
        assert!(reason.starts_with("10 bytes is more than"), "{reason}");
        std::fs::remove_file(path).ok();
    }

    /// `/dev/zero` says it has no length and never ends: the read stops at the limit.
    #[cfg(unix)]
    #[test]
    fn an_endless_source_stops_at_the_limit() {
        let message = read_limited(Path::new("/dev/zero"), 1 << 16).expect_err("endless").to_string();
        assert!(message.contains("more than the input limit of 65536 bytes"), "{message}");
    }

    #[test]
    fn a_missing_file_names_itself() {
        let error = read_limited(Path::new("/nonexistent/cachalot-input"), 10).expect_err("missing");
        assert_eq!(error.to_string(), "/nonexistent/cachalot-input: cannot read");
        assert!(std::error::Error::source(&error).is_some());
        assert!(error.reason().starts_with("cannot read: "), "{}", error.reason());
    }
}
