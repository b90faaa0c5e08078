//! Op files: the common input of every allocator benchmark (`shared/bench/make_ops.py`).
//!
//! One op per line: `a ID SIZE [STREAM]` allocates SIZE bytes as handle ID, `f ID` frees it;
//! `#` starts a comment. IDs are any numbers below 2^32, not reused while live; the parser
//! renumbers them densely (a handle's slot is reused once it is freed), so the memory a replay
//! needs for its handles is set by the most allocations live at once, not by the largest id
//! written in the file. [`timing`] times replays of them the way PyTorch's reference harness
//! does.

pub mod timing;

use cachalot_core::backend::{Backend, StreamId};
use cachalot_core::error::{AllocatorError, shorten};
use cachalot_core::{Allocation, CachingAllocator};
use rustc_hash::FxHashMap;

/// One operation of an op file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// Allocate `size` bytes on `stream` as handle `id`.
    Alloc {
        /// Handle slot: the file's id renumbered densely, below [`OpFile::handles`].
        id: u32,
        /// Bytes.
        size: u64,
        /// Stream.
        stream: StreamId,
    },
    /// Free handle `id`.
    Free {
        /// Handle slot, as in [`Op::Alloc`].
        id: u32,
    },
}

/// A parsed op file: `a ID SIZE [STREAM]` allocates `SIZE` bytes as handle `ID` (on `STREAM`, the
/// default stream if absent), `f ID` frees it, `#` starts a comment. The standard workloads of
/// PyTorch's allocator benchmark (`shared/bench/make_ops.py`) are written in it.
///
/// ```
/// use cachalot_core::{AllocatorConfig, CachingAllocator, SimBackend};
/// use cachalot_trace::ops::OpFile;
///
/// let ops = OpFile::parse("# two tensors\na 0 1048576\na 1 512 7\nf 0\nf 1\n")?;
/// assert_eq!((ops.ops.len(), ops.handles), (4, 2));
///
/// let mut allocator = CachingAllocator::new(SimBackend::new(80 << 30), AllocatorConfig::default())?;
/// let mut handles = vec![None; ops.handles];
/// ops.replay(&mut allocator, &mut handles, false)?;
/// assert_eq!(allocator.memory_allocated(), 0);
/// assert_eq!(allocator.memory_reserved(), 4 << 20); // a small-pool segment per stream, cached
///
/// let error = OpFile::parse("a 0 512\nf 9\n").unwrap_err();
/// assert_eq!(error.to_string(), "line 2: free of id 9, which is not live");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, Default, PartialEq)]
pub struct OpFile {
    /// The operations in order.
    pub ops: Vec<Op>,
    /// Handle slots a replay needs: the most allocations live at once.
    pub handles: usize,
}

/// A line of an op file that cannot be read.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("line {line}: {message}")]
pub struct OpFileError {
    /// 1-based line number.
    pub line: usize,
    /// What is wrong.
    pub message: String,
}

impl OpFile {
    /// Parses op-file text.
    pub fn parse(text: &str) -> Result<Self, OpFileError> {
        let mut file = OpFile::default();
        // The file's live ids and their slots; freed slots are handed out again.
        let mut live: FxHashMap<u32, u32> = FxHashMap::default();
        let mut vacant: Vec<u32> = Vec::new();
        for (n, raw) in text.lines().enumerate() {
            let error = |message: String| OpFileError { line: n + 1, message };
            let line = raw.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let mut fields = line.split_ascii_whitespace();
            let kind = fields.next().unwrap_or_default();
            // A bad field is quoted (its first bytes only: a field may be megabytes long) with
            // its column, counted in bytes from 1 on the line as written.
            let column = |field: &str| field.as_ptr() as usize - raw.as_ptr() as usize + 1;
            let mut number = |what: &str| -> Result<Option<u64>, OpFileError> {
                fields
                    .next()
                    .map(|f| {
                        f.parse::<u64>().map_err(|_| {
                            error(format!(
                                "{what} '{}' at column {} is not a non-negative integer",
                                shorten(f),
                                column(f)
                            ))
                        })
                    })
                    .transpose()
            };
            let op = match kind {
                "a" => {
                    let id = number("id")?.ok_or_else(|| error("'a' needs an id and a size".into()))?;
                    let size = number("size")?.ok_or_else(|| error("'a' needs a size".into()))?;
                    let stream = StreamId(number("stream")?.unwrap_or(0));
                    let id = u32::try_from(id).map_err(|_| error(format!("id {id} is too large")))?;
                    Op::Alloc { id, size, stream }
                }
                "f" => {
                    let id = number("id")?.ok_or_else(|| error("'f' needs an id".into()))?;
                    let id = u32::try_from(id).map_err(|_| error(format!("id {id} is too large")))?;
                    Op::Free { id }
                }
                other => return Err(error(format!("unknown op '{}' (expected 'a' or 'f')", shorten(other)))),
            };
            if fields.next().is_some() {
                return Err(error("too many fields".into()));
            }
            let op = match op {
                Op::Alloc { id, size, stream } => {
                    let std::collections::hash_map::Entry::Vacant(entry) = live.entry(id) else {
                        return Err(error(format!("id {id} is allocated again while live")));
                    };
                    // At most one slot per op line, so the count fits the ids' u32.
                    let slot = vacant.pop().unwrap_or(file.handles as u32);
                    file.handles = file.handles.max(slot as usize + 1);
                    entry.insert(slot);
                    Op::Alloc { id: slot, size, stream }
                }
                Op::Free { id } => {
                    let slot = live.remove(&id).ok_or_else(|| error(format!("free of id {id}, which is not live")))?;
                    vacant.push(slot);
                    Op::Free { id: slot }
                }
            };
            file.ops.push(op);
        }
        Ok(file)
    }

    /// The 1-based line of `text` (the text [`OpFile::parse`] read) that holds op number
    /// `index` of its [`OpFile::ops`]: for an error met while running that op.
    pub fn line_of(text: &str, index: usize) -> Option<usize> {
        text.lines()
            .enumerate()
            .filter(|(_, line)| {
                let line = line.trim();
                !line.is_empty() && !line.starts_with('#')
            })
            .nth(index)
            .map(|(n, _)| n + 1)
    }

    /// Replays the ops once on `allocator`, using `handles` (at least [`OpFile::handles`] long)
    /// for the live allocations. With `single_stream`, every op runs on the default stream, as
    /// PyTorch's reference harness (`torch_alloc_bench.py`) does.
    pub fn replay<B: Backend>(
        &self,
        allocator: &mut CachingAllocator<B>,
        handles: &mut [Option<Allocation>],
        single_stream: bool,
    ) -> Result<(), AllocatorError> {
        for op in &self.ops {
            match *op {
                Op::Alloc { id, size, stream } => {
                    let stream = if single_stream { StreamId::DEFAULT } else { stream };
                    handles[id as usize] = Some(allocator.malloc(size, stream)?);
                }
                Op::Free { id } => {
                    if let Some(allocation) = handles[id as usize].take() {
                        allocator.free(allocation)?;
                    }
                }
            }
        }
        Ok(())
    }

    /// Frees the allocations a replay left live, emptying `handles`: between replays, so that
    /// each starts from the same live set.
    pub fn free_live<B: Backend>(
        allocator: &mut CachingAllocator<B>,
        handles: &mut [Option<Allocation>],
    ) -> Result<(), AllocatorError> {
        for handle in handles.iter_mut() {
            if let Some(allocation) = handle.take() {
                allocator.free(allocation)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_format() {
        let f = OpFile::parse("# comment\na 0 1048576\na 1 512 7\nf 0\n\nf 1\n").unwrap();
        assert_eq!(f.ops.len(), 4);
        assert_eq!(f.ops[1], Op::Alloc { id: 1, size: 512, stream: StreamId(7) });
        assert_eq!(f.handles, 2);
    }

    /// Ids are renumbered densely: a huge id costs one slot, and freed slots are reused.
    #[test]
    fn ids_are_renumbered_densely() {
        let f = OpFile::parse("a 4294967295 512\na 7 512\nf 4294967295\na 9 1024\n").unwrap();
        assert_eq!(f.handles, 2);
        assert_eq!(f.ops[0], Op::Alloc { id: 0, size: 512, stream: StreamId(0) });
        assert_eq!(f.ops[2], Op::Free { id: 0 });
        assert_eq!(f.ops[3], Op::Alloc { id: 0, size: 1024, stream: StreamId(0) });
    }

    #[test]
    fn errors_name_the_line() {
        for (text, line, fragment) in [
            ("a 0\n", 1, "needs a size"),
            ("a 0 5\nf 1\n", 2, "not live"),
            ("a 0 5\na 0 6\n", 2, "again while live"),
            ("x 1\n", 1, "unknown op 'x'"),
            ("a 0 -5\n", 1, "'-5'"),
            ("a 0 5\nf 0 0\n", 2, "too many fields"),
            ("a 0 5\n  a 1 x5\n", 2, "size 'x5' at column 7"),
        ] {
            let err = OpFile::parse(text).unwrap_err();
            assert_eq!(err.line, line, "{text:?}");
            assert!(err.to_string().contains(fragment), "{text:?}: {err}");
        }
    }

    /// A huge bad value is quoted by its first bytes only, with its column.
    #[test]
    fn a_huge_bad_value_is_quoted_short() {
        let text = format!("a 0 512\na 1 {}x\n", "9".repeat(10_000_000));
        let message = OpFile::parse(&text).unwrap_err().to_string();
        assert!(message.len() < 200, "{} bytes", message.len());
        assert!(message.starts_with("line 2: size '9999"), "{message}");
        assert!(message.contains("(10,000,001 bytes)' at column 5"), "{message}");
        let op = format!("{}\n", "z".repeat(1 << 20));
        assert!(OpFile::parse(&op).unwrap_err().to_string().len() < 200);
    }

    #[test]
    fn ops_are_found_by_their_line() {
        let text = "# header\n\na 0 512\n  # note\nf 0\n";
        assert_eq!(OpFile::line_of(text, 0), Some(3));
        assert_eq!(OpFile::line_of(text, 1), Some(5));
        assert_eq!(OpFile::line_of(text, 2), None);
    }
}
