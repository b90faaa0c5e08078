//! Snapshots: the one exchange format between the allocator, the command line and the viewer.
//!
//! - [`file`](mod@file): cachalot's own snapshot file (JSON).
//! - [`torch`]: PyTorch's snapshot (`torch.cuda.memory._snapshot()`), typed.
//! - [`pickle`]: reading and writing PyTorch's snapshot pickles.
//! - [`FileFormat`]: which of these (or an op file) a file holds.

pub mod file;
pub mod pickle;
pub mod torch;

pub use file::{Snapshot, SnapshotFileError, Timing};

/// What a file holds, told from its first non-blank byte: the one way the command line and the
/// viewer recognise their inputs, so they agree on every file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FileFormat {
    /// A PyTorch snapshot pickle: protocol 2+ starts with PROTO (0x80), protocols 0/1 with a
    /// list or dict opcode (`(`, `]`, `}`).
    TorchPickle,
    /// A cachalot snapshot ([`Snapshot`], JSON).
    Cachalot,
    /// An op file ([`crate::ops::OpFile`]: `a ID SIZE [STREAM]`, `f ID`, `#` comments).
    Ops,
    /// Nothing but blanks.
    Empty,
    /// None of the above.
    Unknown,
}

impl FileFormat {
    /// Tells the format of `bytes`.
    pub fn detect(bytes: &[u8]) -> Self {
        match bytes.iter().find(|b| !b.is_ascii_whitespace()) {
            Some(0x80 | b'(' | b']' | b'}') => FileFormat::TorchPickle,
            Some(b'{') => FileFormat::Cachalot,
            Some(b'a' | b'f' | b'#') => FileFormat::Ops,
            None => FileFormat::Empty,
            Some(_) => FileFormat::Unknown,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::FileFormat;

    #[test]
    fn formats_are_told_from_the_first_non_blank_byte() {
        for (bytes, format) in [
            (&b"\x80\x04\x95"[..], FileFormat::TorchPickle),
            (b"(lp0\n", FileFormat::TorchPickle),
            (b"  \n{\"version\": 1}", FileFormat::Cachalot),
            (b"# ops\na 0 512\n", FileFormat::Ops),
            (b" \t\n", FileFormat::Empty),
            (b"", FileFormat::Empty),
            (b"PK\x03\x04", FileFormat::Unknown),
        ] {
            assert_eq!(FileFormat::detect(bytes), format, "{bytes:?}");
        }
    }
}
