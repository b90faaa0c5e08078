//! cachalot's own snapshot file: JSON, lossless for everything the viewer and `compare` need.
//!
//! Schema (version 1), one JSON object:
//!
//! | field | type | meaning |
//! | --- | --- | --- |
//! | `format` | `"cachalot-snapshot"` | identifies the file |
//! | `version` | `1` | schema version |
//! | `source` | string | what produced it (`"replay of gpt_train.pickle"`, `"run seeds on cuda"`) |
//! | `device` | [`DeviceFacts`] | backend, name, total memory, alignment, limits |
//! | `settings` | string | the `PYTORCH_CUDA_ALLOC_CONF`-style configuration |
//! | `memory_fraction` | number or null | `set_per_process_memory_fraction` |
//! | `segments` | [[`SegmentSnapshot`]] | end state: segments with their blocks |
//! | `trace` | [[`TraceEntry`]] | every state change, oldest first (`action`, `addr`, `size`, `stream`, `time_us`, optional `context`, `annotation`) |
//! | `stacks` | [[[`Frame`]]] | stacks referenced by `context` indices |
//! | `annotations` | [[`Annotation`]] | `compile_context` / `user_metadata` referenced by `annotation` |
//! | `stats` | [`MemoryStats`] | `memory_stats()` at the end |
//! | `marks` | [[`Mark`]] | labelled points with `memory_allocated()` / `memory_reserved()` |
//! | `timings` | [[`Timing`]] | named durations (e.g. time per training step) |
//! | `trace_complete` | bool | whether the trace starts from an empty allocator (else earlier entries were dropped) |

use cachalot_core::backend::DeviceFacts;
use cachalot_core::error::shorten;
use cachalot_core::size::MAX_REQUEST;
use cachalot_core::stats::MemoryStats;
use cachalot_core::trace::{Annotation, ContextTable, Frame, Mark, TraceAction, TraceEntry};
use cachalot_core::{Allocator, SegmentSnapshot};

/// Value of the `format` field.
pub const FORMAT: &str = "cachalot-snapshot";
/// Current schema version.
pub const VERSION: u32 = 1;

/// A named duration of a run.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Timing {
    /// What was timed.
    pub label: String,
    /// Seconds.
    pub seconds: f64,
}

/// A cachalot snapshot: device, configuration, end state, trace, stacks, stats and marks.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Snapshot {
    /// Always [`FORMAT`].
    pub format: String,
    /// Schema version ([`VERSION`]).
    pub version: u32,
    /// What produced the snapshot.
    pub source: String,
    /// The device.
    pub device: DeviceFacts,
    /// Allocator configuration string.
    pub settings: String,
    /// Memory fraction, if set.
    pub memory_fraction: Option<f64>,
    /// Segments and blocks at the end.
    pub segments: Vec<SegmentSnapshot>,
    /// The trace, oldest first.
    pub trace: Vec<TraceEntry>,
    /// Stacks, indexed by `TraceEntry::context` / block and segment contexts.
    pub stacks: Vec<Vec<Frame>>,
    /// Annotations, indexed by `TraceEntry::annotation`.
    pub annotations: Vec<Annotation>,
    /// `memory_stats()` at the end.
    pub stats: MemoryStats,
    /// Labelled marks.
    pub marks: Vec<Mark>,
    /// Named durations.
    #[serde(default)]
    pub timings: Vec<Timing>,
    /// Whether the trace starts from an empty allocator.
    #[serde(default)]
    pub trace_complete: bool,
}

/// A snapshot file that cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotFileError {
    /// Not valid JSON, or a field of the wrong type; the message names line and column, and
    /// quotes a bad value by its first bytes only.
    #[error("{}", json_message(.0))]
    Json(#[from] serde_json::Error),
    /// JSON of another kind of file.
    #[error("not a cachalot snapshot (format is {:?})", shorten(.0))]
    WrongFormat(String),
    /// A newer schema.
    #[error("snapshot version {0} is newer than this cachalot understands ({VERSION})")]
    Version(u32),
    /// A value no device or allocator produces, named by its place in the file: sums over it
    /// (the viewer's, the replay's) would wrap.
    #[error("{0}")]
    Value(String),
}

/// serde_json's message, whose quote of a bad value (a string of the wrong type, an unknown
/// variant) may be the whole value, however long: cut to its first bytes, the line and column
/// kept.
fn json_message(error: &serde_json::Error) -> String {
    let message = error.to_string();
    let place = format!(" at line {} column {}", error.line(), error.column());
    match message.strip_suffix(&place) {
        Some(what) if error.line() > 0 => format!("{}{place}", shorten(what)),
        _ => shorten(&message).into_owned(),
    }
}

impl Snapshot {
    /// Captures the allocator now: a `&CachingAllocator<B>` or a `&dyn Allocator` (the
    /// runtime's, whose backend is chosen at run time). The trace is complete when history was
    /// recorded from the allocator's first operation and the ring buffer never overwrote an entry.
    pub fn capture(allocator: &(impl Allocator + ?Sized), source: impl Into<String>) -> Self {
        let trace = allocator.trace();
        let complete = allocator.is_recording_history() && allocator.trace_len_total() == trace.len() as u64;
        let fraction = allocator.memory_fraction();
        Snapshot {
            format: FORMAT.into(),
            version: VERSION,
            source: source.into(),
            device: allocator.device().clone(),
            settings: allocator.settings().to_owned(),
            memory_fraction: (fraction < 1.0).then_some(fraction),
            segments: allocator.snapshot(),
            trace,
            stacks: allocator.contexts().stacks().iter().map(|s| s.to_vec()).collect(),
            annotations: allocator.contexts().annotations().to_vec(),
            stats: allocator.stats(),
            marks: allocator.marks().to_vec(),
            timings: Vec::new(),
            trace_complete: complete,
        }
    }

    /// The stacks and annotations as an interning table (ids unchanged).
    pub fn context_table(&self) -> ContextTable {
        let mut table = ContextTable::default();
        for stack in &self.stacks {
            table.intern(stack);
        }
        for a in &self.annotations {
            table.intern_annotation(&a.compile_context, &a.user_metadata);
        }
        table
    }

    /// Serialises as JSON.
    pub fn to_json(&self) -> Vec<u8> {
        // Serialising plain data to a Vec cannot fail.
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// Parses JSON, checking the format and version fields.
    pub fn from_json(bytes: &[u8]) -> Result<Self, SnapshotFileError> {
        #[derive(serde::Deserialize)]
        struct Header {
            format: Option<String>,
            version: Option<u32>,
        }
        let header: Header = serde_json::from_slice(bytes)?;
        let format = header.format.unwrap_or_default();
        if format != FORMAT {
            return Err(SnapshotFileError::WrongFormat(format));
        }
        if let Some(v) = header.version.filter(|&v| v > VERSION) {
            return Err(SnapshotFileError::Version(v));
        }
        let snapshot: Snapshot = serde_json::from_slice(bytes)?;
        snapshot.check_values().map_err(SnapshotFileError::Value)?;
        Ok(snapshot)
    }

    /// The range checks of [`Snapshot::from_json`]: the device's memory is at most 1 EiB (the
    /// largest request PyTorch serves, [`MAX_REQUEST`]), and no segment, block or trace entry
    /// is larger or reaches past the end of the 64-bit address space.
    fn check_values(&self) -> Result<(), String> {
        let range = |place: String, address: u64, size: u64| -> Result<(), String> {
            if size > MAX_REQUEST || address.checked_add(size).is_none() {
                return Err(format!("{place}: {size} bytes at {address:#x} is not a range of device memory"));
            }
            Ok(())
        };
        if self.device.total_memory > MAX_REQUEST {
            return Err(format!(
                "device.total_memory: {} bytes is more than any device has (at most 1 EiB = {MAX_REQUEST})",
                self.device.total_memory
            ));
        }
        for (i, segment) in self.segments.iter().enumerate() {
            range(format!("segments[{i}]"), segment.address, segment.total_size)?;
            for (j, block) in segment.blocks.iter().enumerate() {
                range(format!("segments[{i}].blocks[{j}]"), block.address, block.size)?;
            }
        }
        for (i, entry) in self.trace.iter().enumerate() {
            // An `oom` entry keeps the device's free bytes where the others keep an address.
            range(format!("trace[{i}]"), if entry.action == TraceAction::Oom { 0 } else { entry.addr }, entry.size)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cachalot_core::{AllocatorConfig, CachingAllocator, SimBackend, StreamId};

    #[test]
    fn round_trips_through_json() {
        let mut a = CachingAllocator::new(SimBackend::new(1 << 30), AllocatorConfig::default()).unwrap();
        a.record_history(true, usize::MAX, &[], false);
        let stack = a.intern_context(&[Frame { filename: "train.py".into(), line: 7, name: "step".into() }]);
        a.set_context(Some(stack));
        let x = a.malloc(3 << 20, StreamId::DEFAULT).unwrap();
        a.mark("after x");
        a.free(x).unwrap();
        let snap = Snapshot::capture(&a, "test");
        assert_eq!(Snapshot::capture(&a as &dyn Allocator, "test"), snap, "a dyn caller captures the same");
        assert!(snap.trace_complete);
        assert_eq!(snap.trace.len(), 4);
        let back = Snapshot::from_json(&snap.to_json()).unwrap();
        assert_eq!(back, snap);
        assert_eq!(back.context_table().frames(stack)[0].line, 7);
    }

    #[test]
    fn bad_files_are_named_errors() {
        assert!(matches!(Snapshot::from_json(b"{\"format\":\"other\"}"), Err(SnapshotFileError::WrongFormat(_))));
        assert!(matches!(
            Snapshot::from_json(b"{\"format\":\"cachalot-snapshot\",\"version\":99}"),
            Err(SnapshotFileError::Version(99))
        ));
        let err = Snapshot::from_json(b"{\"format\":\"cachalot-snapshot\",\"version\":1,\"source\":3}").unwrap_err();
        assert!(err.to_string().contains("line 1"), "{err}");
        assert!(Snapshot::from_json(b"{\"format\": \"cachalot-snap").is_err());
    }

    /// A megabyte-long value of the wrong type, or format name, is quoted by its first bytes;
    /// the place stays in the message.
    #[test]
    fn long_bad_values_are_quoted_short() {
        let long = "x".repeat(1 << 20);
        let wrong_type = format!("{{\"format\":\"cachalot-snapshot\",\"version\":\"{long}\"}}");
        let message = Snapshot::from_json(wrong_type.as_bytes()).unwrap_err().to_string();
        assert!(message.len() < 300, "{} bytes", message.len());
        assert!(message.contains("bytes) at line 1 column 1048618"), "{message}");
        let other = format!("{{\"format\":\"{long}\"}}");
        let message = Snapshot::from_json(other.as_bytes()).unwrap_err().to_string();
        assert!(message.len() < 300 && message.starts_with("not a cachalot snapshot"), "{message}");
    }

    /// Values that would wrap the viewer's and the replay's sums are refused, naming the place.
    #[test]
    fn values_out_of_range_are_named() {
        let mut a = CachingAllocator::new(SimBackend::new(1 << 30), AllocatorConfig::default()).unwrap();
        a.record_history(true, usize::MAX, &[], false);
        let x = a.malloc(3 << 20, StreamId::DEFAULT).unwrap();
        a.free(x).unwrap();
        let good = Snapshot::capture(&a, "test");
        let mut huge = good.clone();
        huge.device.total_memory = u64::MAX;
        let err = Snapshot::from_json(&huge.to_json()).unwrap_err();
        assert!(err.to_string().contains("device.total_memory"), "{err}");
        let mut wrapping = good.clone();
        wrapping.trace[1].addr = u64::MAX - 10;
        let err = Snapshot::from_json(&wrapping.to_json()).unwrap_err();
        assert!(err.to_string().starts_with("trace[1]:"), "{err}");
        let mut segment = good;
        segment.segments[0].total_size = u64::MAX;
        let err = Snapshot::from_json(&segment.to_json()).unwrap_err();
        assert!(err.to_string().starts_with("segments[0]:"), "{err}");
    }
}
