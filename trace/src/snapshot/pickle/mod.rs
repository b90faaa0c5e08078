//! Reading and writing PyTorch snapshot pickles (`torch.cuda.memory._dump_snapshot`, `docs/allocator-rules.md` §18.4).
//!
//! PyTorch writes its snapshot with Python's `pickle` (protocol 4 on Python ≤ 3.13, 5 on 3.14):
//! plain dicts, lists, tuples, strings, ints, floats and bools, where the frame lists and frame
//! dicts are shared between thousands of entries (memoised once, referenced again with `BINGET`).
//!
//! **Reading** is one reader in two parts, which run side by side on two threads for a large file:
//! 1. `Guard` scans the opcodes once, without building anything, and refuses what is not
//!    snapshot data or would hurt a reader: object/class opcodes, truncation, memo ids beyond
//!    the file, nesting deeper than [`MAX_NESTING`], self-referencing containers, and
//!    shared-tuple or dict-merge tricks whose cost grows faster than the file. Its error, naming
//!    the byte, is the one given for any pickle it refuses.
//! 2. `stream` runs the pickle machine once more and builds the [`TorchSnapshot`] directly
//!    (`convert` turns each typed container into its segment, block, entry...): each container
//!    is typed by its place when it is created (an entry, a frame list...), frame lists are
//!    interned once by their memo identity, and an entry's fields are freed as soon as it is in
//!    its trace. It reads protocols 2 to 5 as Python's pickler and PyTorch's C++ one write them;
//!    protocols 0 and 1 (which PyTorch never writes) are refused with a clear error. Anything that
//!    does not fit a snapshot is an error naming its place
//!    (`device_traces[0][1234].size: expected an integer, found a string`).
//!
//! Each field is read as PyTorch 2.11 writes it: unsigned where its C++ type is (a frame's line,
//! where torch.compile's generated code gives an unknown line as 2^64 − 1; sizes; addresses),
//! signed where it is (a stream handle cast to `int64_t`, times, devices), and a field kept in a
//! type of the other signedness keeps its 64 bits, which the writer writes back as PyTorch
//! does (`convert.rs`).
//!
//! **Writing** emits protocol 4 directly, with exactly PyTorch's keys (in PyTorch's order) and
//! value types, sharing each stack, frame dict and string through the memo the way Python's
//! pickler does, so the file stays as small as PyTorch's own. It only uses opcodes that the web
//! viewer's JavaScript unpickler (`MemoryViz.js`) knows, and no `FRAME`s (they are optional).

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::Arc;

use rustc_hash::FxHashSet;

use crate::snapshot::torch::{ExternalAnnotation, TorchAllocatorSettings, TorchBlock, TorchSegment, TorchSnapshot};
use cachalot_core::BlockState;
use cachalot_core::backend::StreamId;
use cachalot_core::size::{PoolKind, ROUNDUP_INTERVALS, SMALL_BUFFER};
use cachalot_core::trace::{ContextId, ContextTable, Frame, TraceAction, TraceEntry};

/// Deepest nesting of containers (and of open `MARK`s) a pickle may have. A snapshot nests 7
/// levels (dict → list → dict → list → dict → list → dict); the limit keeps anything that walks
/// the values, in Python or here, far from the end of a thread's stack.
pub const MAX_NESTING: u32 = 100;

/// The keys of `roundup_power2_divisions`, one per interval (MB, `"1"` to `"32768"`).
const ROUNDUP_KEYS: [&str; ROUNDUP_INTERVALS] =
    ["1", "2", "4", "8", "16", "32", "64", "128", "256", "512", "1024", "2048", "4096", "8192", "16384", "32768"];

/// Why a snapshot pickle could not be read or written. Every variant names its place.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PickleError {
    /// The bytes are not a readable pickle: truncated, corrupt, or using opcodes that a
    /// snapshot never contains.
    #[error("byte {offset}: {message}")]
    Malformed {
        /// Offset of the opcode that could not be read.
        offset: usize,
        /// What is wrong there.
        message: String,
    },
    /// The pickle is sound but a value in it is not what a PyTorch snapshot holds there.
    #[error("{place}: {message}")]
    Invalid {
        /// Where, e.g. `device_traces[0][1234].size`.
        place: String,
        /// What is wrong there, e.g. `expected an integer, found a string`.
        message: String,
    },
    /// The snapshot cannot be written, e.g. an entry names a stack its context table lacks.
    #[error("cannot write {place}: {message}")]
    Unwritable {
        /// Where, e.g. `segments[3].blocks[0].frames`.
        place: String,
        /// What is wrong there.
        message: String,
    },
}

impl PickleError {
    /// The place the error names: `byte N` for a malformed pickle, else the path of the value.
    pub fn place(&self) -> String {
        match self {
            PickleError::Malformed { offset, .. } => format!("byte {offset}"),
            PickleError::Invalid { place, .. } | PickleError::Unwritable { place, .. } => place.clone(),
        }
    }
}

/// Reads a snapshot pickle: the dict of `torch.cuda.memory._dump_snapshot` (protocol 2–5) or
/// a bare list of segments (`torch.cuda.memory_snapshot()`). Never panics; anything that is
/// not a snapshot is an error that names its place.
pub fn read_snapshot(bytes: &[u8]) -> Result<TorchSnapshot, PickleError> {
    read_snapshot_then(bytes, |result| result)
}

/// Reads like [`read_snapshot`], handing the result to `deliver` before the reader's own
/// tables (one small record per container of the file) are freed, and returns what `deliver`
/// returns: a caller with more work to do can start it on another thread from `deliver` and
/// let that freeing overlap it.
pub fn read_snapshot_then<T>(bytes: &[u8], deliver: impl FnOnce(Result<TorchSnapshot, PickleError>) -> T) -> T {
    let mut stream = Stream::new(bytes);
    let result = guard_and_stream(bytes, &mut stream);
    let delivered = deliver(result);
    drop(stream);
    delivered
}

/// The snapshot `stream` reads from `bytes`, if the guard passes them; else the guard's error.
/// Natively, for a large file, the two run side by side on two threads: the reader needs no
/// guard to stay safe (it builds no graph, recurses nowhere, and its memory and work grow with
/// the input: see its module doc), and its result is only used once the guard has passed the
/// pickle.
fn guard_and_stream(bytes: &[u8], stream: &mut Stream<'_>) -> Result<TorchSnapshot, PickleError> {
    // Below this size a thread's start costs more than it saves (`cargo bench --bench pickle`).
    #[cfg(not(target_family = "wasm"))]
    const SIDE_BY_SIDE_FROM: usize = 4 << 20;
    #[cfg(not(target_family = "wasm"))]
    if bytes.len() >= SIDE_BY_SIDE_FROM {
        return std::thread::scope(|scope| {
            let guard = scope.spawn(|| Guard::new(bytes).scan());
            let streamed = stream.read();
            let guarded = guard.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic));
            guarded.and(streamed)
        });
    }
    Guard::new(bytes).scan().and_then(|_| stream.read())
}

/// Writes `snapshot` as PyTorch writes it (protocol 4).
pub fn write_snapshot(snapshot: &TorchSnapshot) -> Result<Vec<u8>, PickleError> {
    let mut writer = Writer::new(&snapshot.contexts);
    writer.snapshot(snapshot)?;
    Ok(writer.out)
}

mod convert;
mod guard;
mod op;
mod place;
mod stream;
mod write;

use cachalot_core::trace::AnnotationId;
use guard::Guard;
use place::Place;
use stream::Stream;
use write::Writer;

#[cfg(test)]
mod tests {
    use super::*;

    fn pickle(body: &[u8]) -> Vec<u8> {
        let mut bytes = vec![op::PROTO, 4];
        bytes.extend_from_slice(body);
        bytes
    }

    fn malformed(bytes: &[u8]) -> String {
        match read_snapshot(bytes) {
            Err(e @ PickleError::Malformed { .. }) => e.to_string(),
            other => panic!("expected a malformed-pickle error, got {other:?}"),
        }
    }

    #[test]
    fn roundup_keys_are_the_interval_keys() {
        for (i, key) in ROUNDUP_KEYS.iter().enumerate() {
            assert_eq!(*key, TorchAllocatorSettings::interval_key(i));
        }
    }

    #[test]
    fn ints_are_written_like_python_writes_them() {
        let cases: [(i128, &[u8]); 9] = [
            (0, &[op::BININT1, 0]),
            (255, &[op::BININT1, 255]),
            (256, &[op::BININT2, 0, 1]),
            (-1, &[op::BININT, 0xff, 0xff, 0xff, 0xff]),
            (1 << 31, &[op::LONG1, 5, 0, 0, 0, 0x80, 0]),
            (-(1 << 31) - 1, &[op::LONG1, 5, 0xff, 0xff, 0xff, 0x7f, 0xff]),
            (0x7f00_0000_0000, &[op::LONG1, 6, 0, 0, 0, 0, 0, 0x7f]),
            (u64::MAX.into(), &[op::LONG1, 9, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0]),
            (i64::MIN.into(), &[op::LONG1, 8, 0, 0, 0, 0, 0, 0, 0, 0x80]),
        ];
        let table = ContextTable::default();
        for (value, expected) in cases {
            let mut w = Writer::new(&table);
            w.int(value);
            assert_eq!(w.out, expected, "{value}");
        }
    }

    #[test]
    fn places_render_like_python_paths() {
        let root = Place::ROOT;
        let traces = root.field("device_traces");
        let trace = traces.index(0);
        let entry = trace.index(1234);
        assert_eq!(entry.field("size").render(), "device_traces[0][1234].size");
        assert_eq!(root.field("divisions").key("32").render(), "divisions[\"32\"]");
        assert_eq!(root.index(3).field("blocks").render(), "[3].blocks");
        assert_eq!(root.render(), "the top level");
    }

    #[test]
    fn deep_nesting_is_refused_before_it_can_overflow_a_stack() {
        let n = 50_000;
        let mut body = vec![op::EMPTY_LIST; n];
        body.extend(std::iter::repeat_n(op::APPEND, n - 1));
        body.push(op::STOP);
        assert!(malformed(&pickle(&body)).contains("nested deeper than 100"));
        let mut marks = vec![op::MARK; 1_000_000];
        marks.push(op::STOP);
        assert!(malformed(&pickle(&marks)).contains("MARKs are nested deeper"));
    }

    #[test]
    fn memo_ids_beyond_the_file_are_refused() {
        let body = [op::NONE, op::LONG_BINPUT, 0xff, 0xff, 0xff, 0x7f, op::STOP];
        assert!(malformed(&pickle(&body)).contains("memo id 2147483647"));
        let body = [op::BINGET, 3, op::STOP];
        assert!(malformed(&pickle(&body)).contains("never stored"));
    }

    #[test]
    fn doubling_a_shared_tuple_is_refused_quickly() {
        let mut body = vec![op::NONE];
        for _ in 0..64 {
            body.extend([op::DUP, op::TUPLE2]);
        }
        body.push(op::STOP);
        assert!(malformed(&pickle(&body)).contains("far more work"));
    }

    #[test]
    fn item_by_item_dict_growth_is_bounded() {
        // 100,000 SETITEMs on one dict: quadratic in a reader that merges dicts item by item.
        let mut body = vec![op::EMPTY_DICT];
        for i in 0..100_000u32 {
            body.push(op::BININT);
            body.extend(i.to_le_bytes());
            body.extend([op::NONE, op::SETITEM]);
        }
        body.push(op::STOP);
        assert!(malformed(&pickle(&body)).contains("far more work"));
    }

    #[test]
    fn recursive_containers_are_refused() {
        // l = []; l.append(l)
        let body = [op::EMPTY_LIST, op::MEMOIZE, op::BINGET, 0, op::APPEND, op::STOP];
        assert!(malformed(&pickle(&body)).contains("inside itself"));
        // a = []; b = [a]; a.append(b)
        let body = [
            op::EMPTY_LIST,
            op::MEMOIZE,
            op::EMPTY_LIST,
            op::BINGET,
            0,
            op::APPEND,
            op::BINGET,
            0,
            op::BINGET,
            0,
            op::APPEND,
            op::STOP,
        ];
        assert!(malformed(&pickle(&body)).contains("already inside another container"));
    }

    #[test]
    fn objects_and_unknown_opcodes_are_refused() {
        let body = b"cos\nsystem\n(S'true'\ntR.";
        assert!(malformed(&pickle(body)).contains("GLOBAL"));
        assert!(malformed(&pickle(&[0xff])).contains("unknown opcode 0xff"));
        assert!(malformed(&[op::PROTO, 9, op::NONE, op::STOP]).contains("protocol 9"));
    }

    #[test]
    fn a_shared_list_cannot_multiply_the_snapshot() {
        // {"segments": [], "device_traces": [L, L, L, ...]} with L a list of 1,000 entries.
        let mut body = vec![op::EMPTY_DICT, op::MARK];
        body.extend([op::SHORT_BINUNICODE, 8]);
        body.extend(b"segments");
        body.push(op::EMPTY_LIST);
        body.extend([op::SHORT_BINUNICODE, 13]);
        body.extend(b"device_traces");
        body.extend([op::EMPTY_LIST, op::MARK, op::EMPTY_LIST, op::MEMOIZE, op::MARK]);
        for _ in 0..1000 {
            body.extend([op::EMPTY_DICT, op::MARK, op::SHORT_BINUNICODE, 6]);
            body.extend(b"action");
            body.extend([op::SHORT_BINUNICODE, 5]);
            body.extend(b"alloc");
            body.extend([op::SHORT_BINUNICODE, 4]);
            body.extend(b"addr");
            body.extend([op::BININT1, 0, op::SHORT_BINUNICODE, 4]);
            body.extend(b"size");
            body.extend([op::BININT1, 0, op::SETITEMS]);
        }
        body.push(op::APPENDS);
        for _ in 0..999 {
            body.extend([op::BINGET, 0]);
        }
        body.extend([op::APPENDS, op::SETITEMS, op::STOP]);
        let error = read_snapshot(&pickle(&body)).expect_err("must not read 1,000,000 entries from 40 kB");
        assert!(
            error.to_string().starts_with("device_traces[1]: a list that already stands at an earlier place"),
            "{error}"
        );
    }

    #[test]
    fn trailing_bytes_after_stop_are_ignored_like_python() {
        let bytes = pickle(&[op::EMPTY_LIST, op::STOP, b'x', b'y']);
        let snapshot = read_snapshot(&bytes).expect("a bare, empty list of segments");
        assert!(snapshot.segments.is_empty());
    }
}
