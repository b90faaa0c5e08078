//! Reading and writing PyTorch snapshot pickles, checked against what Python's own `pickle`
//! reads in the nine reference snapshots of `shared/traces/pytorch-2.11-h200`.
//!
//! The expected values in `data/torch_pickle_facts.json` come from plain Python 3 (no torch):
//! `python3 core/tests/data/torch_pickle_facts.py > core/tests/data/torch_pickle_facts.json`.

#![allow(clippy::unwrap_used, reason = "test helpers outside #[test] functions")]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use cachalot_core::trace::{ContextId, TraceAction, TraceEntry};
use cachalot_core::{BlockState, StreamId};
use cachalot_trace::snapshot::pickle::{PickleError, read_snapshot, write_snapshot};
use cachalot_trace::snapshot::torch::TorchSnapshot;
use proptest::prelude::*;
use serde_json::Value as Json;

const TRACES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../testdata/traces/pytorch-2.11-h200");
const FACTS: &str = include_str!("data/torch_pickle_facts.json");

fn facts() -> Vec<Json> {
    serde_json::from_str(FACTS).expect("data/torch_pickle_facts.json is valid JSON")
}

fn reference(name: &str) -> Vec<u8> {
    let path = Path::new(TRACES).join(format!("{name}.pickle"));
    std::fs::read(&path).unwrap_or_else(|e| {
        panic!("{}: {e} (the reference traces are in testdata/traces of the repository)", path.display())
    })
}

fn int(json: &Json) -> i128 {
    json.as_i64().map(i128::from).or_else(|| json.as_u64().map(i128::from)).expect("an integer fact")
}

fn read(name: &str) -> TorchSnapshot {
    read_snapshot(&reference(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

// ---------------------------------------------------------------------------------------------
// The reference snapshots, read as Python reads them

#[test]
fn the_reference_directory_holds_the_nine_snapshots_the_facts_describe() {
    let mut on_disk: Vec<String> = std::fs::read_dir(TRACES)
        .unwrap_or_else(|e| panic!("{TRACES}: {e} (the reference traces must be checked out as shared/)"))
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.strip_suffix(".pickle").map(str::to_owned))
        .collect();
    on_disk.sort();
    let described: Vec<String> = facts().iter().map(|f| f["name"].as_str().expect("name").to_owned()).collect();
    assert_eq!(on_disk, described, "regenerate data/torch_pickle_facts.json with data/torch_pickle_facts.py");
    assert_eq!(on_disk.len(), 9);
}

fn entry_facts(snapshot: &TorchSnapshot, e: &TraceEntry) -> Json {
    serde_json::json!({
        "action": e.action.name(),
        "addr": e.addr,
        "size": e.size,
        "stream": e.stream.0,
        "time_us": e.time_us,
        "frames": e.context.map(|c| snapshot.contexts.frames(c).len()),
    })
}

fn counts<'a>(names: impl Iterator<Item = &'a str>) -> Json {
    let mut map = BTreeMap::<&str, u64>::new();
    names.for_each(|n| *map.entry(n).or_default() += 1);
    serde_json::to_value(map).expect("counts")
}

/// The typed snapshot holds what Python reads: counts, sums, first and last values, stacks,
/// settings and annotations of all nine reference snapshots.
#[test]
fn every_reference_snapshot_reads_as_python_reads_it() {
    for fact in facts() {
        let name = fact["name"].as_str().expect("name");
        let s = read(name);
        let f = |key: &str| int(&fact[key]);
        let segments = &s.segments;
        let blocks: Vec<_> = segments.iter().flat_map(|s| &s.blocks).collect();
        let entries: Vec<_> = s.device_traces.iter().flatten().collect();
        let sum = |it: &mut dyn Iterator<Item = u64>| it.map(i128::from).sum::<i128>();

        assert_eq!(segments.len() as i128, f("segments"), "{name}");
        assert_eq!(sum(&mut segments.iter().map(|s| s.total_size)), f("segment_total_size_sum"), "{name}");
        assert_eq!(sum(&mut segments.iter().map(|s| s.allocated_size)), f("segment_allocated_size_sum"), "{name}");
        assert_eq!(sum(&mut segments.iter().map(|s| s.active_size)), f("segment_active_size_sum"), "{name}");
        assert_eq!(sum(&mut segments.iter().map(|s| s.requested_size)), f("segment_requested_size_sum"), "{name}");
        assert_eq!(counts(segments.iter().map(|s| s.segment_type.name())), fact["segment_types"], "{name}");
        assert_eq!(segments.iter().filter(|s| s.is_expandable).count() as i128, f("expandable_segments"), "{name}");
        let streams: std::collections::BTreeSet<u64> = segments.iter().map(|s| s.stream).collect();
        assert_eq!(serde_json::to_value(streams).expect("streams"), fact["segment_streams"], "{name}");
        assert_eq!(i128::from(segments[0].address), f("first_segment_address"), "{name}");
        assert_eq!(i128::from(segments[segments.len() - 1].address), f("last_segment_address"), "{name}");
        assert!(segments.iter().all(|s| s.segment_pool_id == (0, 0) && s.device == 0), "{name}");

        assert_eq!(blocks.len() as i128, f("blocks"), "{name}");
        assert_eq!(counts(blocks.iter().map(|b| b.state.name())), fact["block_states"], "{name}");
        assert_eq!(sum(&mut blocks.iter().map(|b| b.size)), f("block_size_sum"), "{name}");
        assert_eq!(sum(&mut blocks.iter().map(|b| b.requested_size)), f("block_requested_size_sum"), "{name}");

        assert_eq!(s.device_traces.len() as i128, f("devices"), "{name}");
        assert_eq!(entries.len() as i128, f("entries"), "{name}");
        assert_eq!(counts(entries.iter().map(|e| e.action.name())), fact["actions"], "{name}");
        assert_eq!(sum(&mut entries.iter().map(|e| e.size)), f("entry_size_sum"), "{name}");
        assert_eq!(sum(&mut entries.iter().map(|e| e.addr)), f("entry_addr_sum"), "{name}");
        assert_eq!(entries.iter().map(|e| i128::from(e.time_us)).min(), Some(f("entry_time_us_min")), "{name}");
        assert_eq!(entries.iter().map(|e| i128::from(e.time_us)).max(), Some(f("entry_time_us_max")), "{name}");
        let frames = |e: &&TraceEntry| e.context.map(|c| s.contexts.frames(c).len());
        assert_eq!(entries.iter().filter(|e| frames(e).is_none()).count() as i128, f("entries_without_frames"));
        assert_eq!(entries.iter().filter(|e| frames(e) == Some(0)).count() as i128, f("entries_with_empty_frames"));
        assert_eq!(entries.iter().filter_map(frames).sum::<usize>() as i128, f("entry_frames_sum"), "{name}");
        assert_eq!(entries.iter().filter(|e| e.annotation.is_some()).count() as i128, f("annotated_entries"));
        assert_eq!(entry_facts(&s, entries[0]), fact["first_entry"], "{name}");
        assert_eq!(entry_facts(&s, entries[entries.len() - 1]), fact["last_entry"], "{name}");
        assert_eq!(s.contexts.stacks().len() as i128, f("distinct_stacks"), "{name}: interned stacks");

        let settings = s.allocator_settings.as_ref().expect("allocator_settings");
        let expected = &fact["settings"];
        assert_eq!(settings.settings, expected["PYTORCH_CUDA_ALLOC_CONF"].as_str().expect("conf"), "{name}");
        assert_eq!(i128::from(settings.max_split_size), int(&expected["max_split_size"]), "{name}");
        assert_eq!(
            Some(settings.garbage_collection_threshold),
            expected["garbage_collection_threshold"].as_f64(),
            "{name}"
        );
        assert_eq!(Some(settings.expandable_segments), expected["expandable_segments"].as_bool(), "{name}");
        assert_eq!(
            serde_json::to_value(settings.roundup_power2_divisions).expect("divisions"),
            expected["roundup_power2_divisions"],
            "{name}"
        );
        assert_eq!(settings.pinned_num_register_threads, 1, "{name}");

        assert_eq!(s.external_annotations.len() as i128, f("external_annotations"), "{name}");
        let first = s
            .external_annotations
            .first()
            .map(|a| serde_json::json!({"stage": a.stage, "name": a.name, "device": a.device, "time_us": a.time_us}));
        assert_eq!(first.unwrap_or(Json::Null), fact["first_external_annotation"], "{name}");
    }
}

/// Every frame list PyTorch shares is interned once, and blocks of free memory carry none.
#[test]
fn stacks_are_interned_and_free_blocks_have_none() {
    let s = read("random_stress_maxsplit");
    assert_eq!(s.contexts.stacks().len(), 4);
    for block in s.segments.iter().flat_map(|s| &s.blocks) {
        if block.state == BlockState::Inactive {
            assert_eq!(block.frames, None);
        }
    }
    let first = s.device_traces[0][0];
    assert_eq!(first.action, TraceAction::SegmentAlloc);
    assert_eq!(first.stream, StreamId::DEFAULT);
    let frame = &s.contexts.frames(first.context.expect("recorded with stacks"))[0];
    assert!(!frame.filename.is_empty() && !frame.name.is_empty() && frame.line > 0, "{frame:?}");
}

// ---------------------------------------------------------------------------------------------
// Round trips

fn assert_same(a: &TorchSnapshot, b: &TorchSnapshot, name: &str) {
    assert_eq!(a.segments, b.segments, "{name}: segments");
    assert_eq!(a.device_traces, b.device_traces, "{name}: device_traces");
    assert_eq!(a.allocator_settings, b.allocator_settings, "{name}: allocator_settings");
    assert_eq!(a.external_annotations, b.external_annotations, "{name}: external_annotations");
    assert_eq!(a.contexts.stacks(), b.contexts.stacks(), "{name}: stacks");
    assert_eq!(a.contexts.annotations(), b.contexts.annotations(), "{name}: annotations");
}

#[test]
fn read_write_read_gives_the_same_snapshot() {
    for fact in facts() {
        let name = fact["name"].as_str().expect("name");
        let original = reference(name);
        let first = read(name);
        let written = write_snapshot(&first).expect("writes");
        let second = read_snapshot(&written).expect("reads what it wrote");
        assert_same(&first, &second, name);
        // Writing is deterministic and a fixed point.
        assert_eq!(write_snapshot(&second).expect("writes"), written);
        // Shared stacks, frames and strings stay shared: the file is no larger than PyTorch's.
        assert!(written.len() <= original.len(), "{name}: {} bytes written for {}", written.len(), original.len());
    }
}

/// Python's `pickle` loads what we write into exactly what it loads from PyTorch's file, and
/// the file uses only opcodes of protocol 2–4 that `MemoryViz.js`'s unpickler knows. Needs
/// `python3`; the Rust-side checks above do not.
#[test]
fn python_reads_what_we_write_as_it_reads_the_original() {
    if std::process::Command::new("python3").arg("--version").output().is_err() {
        eprintln!("python3 not found: skipping the Python-side comparison");
        return;
    }
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("torch_pickle");
    std::fs::create_dir_all(&dir).expect("temp dir");
    let script = r#"
import pickle, pickletools, sys
MEMORYVIZ_JS = {"APPENDS", "BINGET", "BININT", "BININT1", "BININT2", "EMPTY_DICT", "EMPTY_LIST", "FRAME",
    "LONG1", "LONG_BINGET", "MARK", "MEMOIZE", "PROTO", "SETITEMS", "SHORT_BINUNICODE", "STOP", "TUPLE2",
    "APPEND", "NEWFALSE", "BINPUT", "BINUNICODE", "EMPTY_TUPLE", "NEWTRUE", "NONE", "BINFLOAT", "TUPLE",
    "TUPLE1", "TUPLE3", "LONG_BINPUT", "LIST", "DICT", "SETITEM"}
for original, written in zip(sys.argv[1::2], sys.argv[2::2]):
    a = pickle.load(open(original, "rb"))
    data = open(written, "rb").read()
    b = pickle.loads(data)
    assert a == b, original
    assert data[:2] == b"\x80\x04", data[:2]
    used = {op.name for op, _, _ in pickletools.genops(data)}
    assert used <= MEMORYVIZ_JS, used - MEMORYVIZ_JS
print("ok")
"#;
    let mut args = vec!["-c".to_owned(), script.to_owned()];
    for fact in facts() {
        let name = fact["name"].as_str().expect("name");
        let snapshot = read(name);
        let path = dir.join(format!("{name}.pickle"));
        std::fs::write(&path, write_snapshot(&snapshot).expect("writes")).expect("temp file");
        args.push(format!("{TRACES}/{name}.pickle"));
        args.push(path.display().to_string());
    }
    let out = std::process::Command::new("python3").args(&args).output().expect("python3 runs");
    assert!(
        out.status.success() && out.stdout.starts_with(b"ok"),
        "python3: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn fixture(name: &str) -> Vec<u8> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data").join(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Python's `pickle` writing the `seeds` snapshot in protocols 2, 3 and 5 (PyTorch's file is
/// protocol 4): all read the same. Protocols 0 and 1, which PyTorch never writes, are refused
/// with an error that says so.
#[test]
fn every_pickle_protocol_from_2_reads_the_same_and_0_and_1_are_refused() {
    let expected = read("seeds");
    for protocol in [2, 3, 5] {
        let bytes = fixture(&format!("seeds.protocol{protocol}.pickle"));
        let snapshot = read_snapshot(&bytes).unwrap_or_else(|e| panic!("protocol {protocol}: {e}"));
        assert_same(&expected, &snapshot, &format!("protocol {protocol}"));
    }
    for protocol in [0, 1] {
        let e = error(&fixture(&format!("seeds.protocol{protocol}.pickle")));
        assert!(e.to_string().starts_with("byte 0: a pickle of protocol 0 or 1"), "protocol {protocol}: {e}");
    }
}

// ---------------------------------------------------------------------------------------------
// Hand-made pickles: defaults, errors and their places

/// A Python value, dumped the way protocol 2 does (BINUNICODE, BINPUT-free).
enum Py {
    None,
    Bool(bool),
    Int(i64),
    /// An integer as a C++ `uint64_t` gives it to Python (above `i64::MAX` for the cases here).
    UInt(u64),
    /// 2^72: wider than any field.
    Wide,
    Float(f64),
    Str(&'static str),
    List(Vec<Py>),
    Tuple(Vec<Py>),
    Dict(Vec<(&'static str, Py)>),
}

fn dump(value: &Py) -> Vec<u8> {
    fn emit(v: &Py, out: &mut Vec<u8>) {
        match v {
            Py::None => out.push(b'N'),
            Py::Bool(b) => out.push(if *b { 0x88 } else { 0x89 }),
            Py::Int(i) => {
                out.push(0x8a);
                out.push(8);
                out.extend(i.to_le_bytes());
            }
            Py::UInt(u) => {
                out.push(0x8a);
                out.push(9);
                out.extend(u.to_le_bytes());
                out.push(0);
            }
            Py::Wide => out.extend([0x8a, 10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]),
            Py::Float(f) => {
                out.push(b'G');
                out.extend(f.to_be_bytes());
            }
            Py::Str(s) => {
                out.push(b'X');
                out.extend((s.len() as u32).to_le_bytes());
                out.extend(s.as_bytes());
            }
            Py::List(items) => {
                out.extend([b']', b'(']);
                items.iter().for_each(|i| emit(i, out));
                out.push(b'e');
            }
            Py::Tuple(items) => {
                out.push(b'(');
                items.iter().for_each(|i| emit(i, out));
                out.push(b't');
            }
            Py::Dict(items) => {
                out.extend([b'}', b'(']);
                for (k, v) in items {
                    emit(&Py::Str(k), out);
                    emit(v, out);
                }
                out.push(b'u');
            }
        }
    }
    let mut out = vec![0x80, 2];
    emit(value, &mut out);
    out.push(b'.');
    out
}

fn frame() -> Py {
    Py::Dict(vec![("filename", Py::Str("train.py")), ("line", Py::Int(12)), ("name", Py::Str("step"))])
}

fn block(state: &'static str, size: i64) -> Vec<(&'static str, Py)> {
    vec![("size", Py::Int(size)), ("state", Py::Str(state)), ("frames", Py::List(vec![]))]
}

fn entry(action: &'static str) -> Vec<(&'static str, Py)> {
    vec![
        ("action", Py::Str(action)),
        ("addr", Py::Int(0x7f00_0000_0000)),
        ("size", Py::Int(512)),
        ("stream", Py::Int(0)),
        ("time_us", Py::Int(1_795_302_654_082_507)),
    ]
}

/// A small snapshot with every optional key left out.
fn minimal(edit: impl FnOnce(&mut Vec<(&'static str, Py)>, &mut Vec<(&'static str, Py)>, &mut Vec<Py>)) -> Vec<u8> {
    let mut segment = vec![
        ("address", Py::Int(0x7f00_0000_0000)),
        ("total_size", Py::Int(2 << 20)),
        (
            "blocks",
            Py::List(vec![
                Py::Dict(vec![
                    ("size", Py::Int(512)),
                    ("requested_size", Py::Int(4)),
                    ("state", Py::Str("active_allocated")),
                    ("frames", Py::List(vec![frame()])),
                ]),
                Py::Dict(block("inactive", (2 << 20) - 512)),
            ]),
        ),
    ];
    let mut settings = vec![("PYTORCH_CUDA_ALLOC_CONF", Py::Str("expandable_segments:True"))];
    let mut entries = vec![Py::Dict(entry("segment_alloc")), Py::Dict(entry("alloc"))];
    edit(&mut segment, &mut settings, &mut entries);
    dump(&Py::Dict(vec![
        ("segments", Py::List(vec![Py::Dict(segment)])),
        ("device_traces", Py::List(vec![Py::List(entries)])),
        ("allocator_settings", Py::Dict(settings)),
    ]))
}

fn error(bytes: &[u8]) -> PickleError {
    match read_snapshot(bytes) {
        Ok(_) => panic!("expected an error"),
        Err(e) => e,
    }
}

#[test]
fn missing_optional_keys_get_pytorchs_defaults() {
    let s = read_snapshot(&minimal(|_, _, _| {})).expect("reads");
    let segment = &s.segments[0];
    assert_eq!((segment.device, segment.stream, segment.segment_pool_id), (0, 0, (0, 0)));
    assert_eq!((segment.allocated_size, segment.active_size, segment.requested_size), (512, 512, 4));
    assert_eq!(segment.segment_type.name(), "small");
    assert!(!segment.is_expandable && segment.frames.is_none());
    let addresses: Vec<u64> = segment.blocks.iter().map(|b| b.address).collect();
    assert_eq!(addresses, [0x7f00_0000_0000, 0x7f00_0000_0200]);
    assert_eq!(segment.blocks[1].requested_size, (2 << 20) - 512);
    assert_eq!(s.contexts.frames(segment.blocks[0].frames.expect("a stack"))[0].name.as_ref(), "step");
    let settings = s.allocator_settings.expect("settings");
    assert_eq!(settings.settings, "expandable_segments:True");
    assert_eq!((settings.max_split_size, settings.pinned_num_register_threads), (-1, 1));
    assert_eq!(settings.roundup_power2_divisions, [0; 16]);
    let e = s.device_traces[0][1];
    assert_eq!((e.action, e.context, e.annotation), (TraceAction::Alloc, None, None));
    assert!(s.external_annotations.is_empty());
}

#[test]
fn a_bare_list_of_segments_reads_and_writes() {
    let bytes = dump(&Py::List(vec![Py::Dict(vec![
        ("address", Py::Int(1 << 40)),
        ("total_size", Py::Int(20 << 20)),
        ("segment_pool_id", Py::Tuple(vec![Py::Int(1), Py::Int(2)])),
        ("blocks", Py::List(vec![Py::Dict(block("active_pending_free", 20 << 20))])),
    ])]));
    let s = read_snapshot(&bytes).expect("reads");
    assert_eq!((s.segments.len(), s.device_traces.len(), s.allocator_settings.is_none()), (1, 0, true));
    assert_eq!(s.segments[0].segment_type.name(), "large");
    assert_eq!(s.segments[0].segment_pool_id, (1, 2));
    assert_eq!(s.segments[0].active_size, 20 << 20);
    assert_eq!(s.segments[0].allocated_size, 0);
    let again = read_snapshot(&write_snapshot(&s).expect("writes")).expect("reads");
    assert_same(&s, &again, "bare list");
}

#[test]
fn annotations_and_oom_entries_round_trip() {
    let bytes = minimal(|_, _, entries| {
        let mut oom = entry("oom");
        oom[1] = ("device_free", Py::Int(123_456));
        oom.push(("frames", Py::List(vec![])));
        entries.push(Py::Dict(oom));
        let mut annotated = entry("free_requested");
        annotated.push(("compile_context", Py::Str("graph 3")));
        annotated.push(("user_metadata", Py::Str("step 7")));
        annotated.push(("frames", Py::List(vec![frame(), frame()])));
        entries.push(Py::Dict(annotated));
    });
    let s = read_snapshot(&bytes).expect("reads");
    let oom = s.device_traces[0][2];
    assert_eq!((oom.action, oom.addr), (TraceAction::Oom, 123_456));
    assert_eq!(oom.context.map(|c| s.contexts.frames(c).len()), Some(0));
    let annotated = s.device_traces[0][3];
    let annotation = s.contexts.annotation(annotated.annotation.expect("annotated")).expect("interned");
    assert_eq!((annotation.compile_context.as_str(), annotation.user_metadata.as_str()), ("graph 3", "step 7"));
    let again = read_snapshot(&write_snapshot(&s).expect("writes")).expect("reads");
    assert_same(&s, &again, "annotations");
}

#[test]
fn a_wrong_type_names_its_place() {
    let bytes = minimal(|_, _, entries| {
        entries[1] = Py::Dict({
            let mut e = entry("alloc");
            e[2] = ("size", Py::Str("big"));
            e
        })
    });
    let e = error(&bytes);
    assert_eq!(e.to_string(), "device_traces[0][1].size: expected an integer, found a string");
    assert_eq!(e.place(), "device_traces[0][1].size");

    let bytes = minimal(|_, _, entries| entries.push(entry_with("alloc", |e| set(e, "size", Py::Wide))));
    assert_eq!(
        error(&bytes).to_string(),
        "device_traces[0][2].size: an integer wider than 64 bits, which no field holds"
    );

    let bytes = minimal(|segment, _, _| segment[1] = ("total_size", Py::Float(2.0)));
    assert_eq!(error(&bytes).to_string(), "segments[0].total_size: expected an integer, found a float");

    let bytes = minimal(|_, settings, _| settings.push(("expandable_segments", Py::Int(1))));
    assert_eq!(error(&bytes).to_string(), "allocator_settings.expandable_segments: expected a bool, found an integer");

    let bytes = minimal(|_, settings, _| {
        settings.push(("roundup_power2_divisions", Py::Dict(vec![("1", Py::Int(4)), ("3", Py::Int(4))])))
    });
    assert_eq!(
        error(&bytes).to_string(),
        "allocator_settings.roundup_power2_divisions[\"3\"]: not an interval key (\"1\", \"2\", \"4\", ... \"32768\")"
    );

    let bytes = minimal(|_, _, entries| entries[0] = Py::Dict(vec![("action", Py::Str("alloc"))]));
    assert_eq!(error(&bytes).to_string(), "device_traces[0][0]: missing key \"addr\"");

    let bytes = minimal(|segment, _, _| segment[0] = ("address", Py::Int(-4)));
    assert_eq!(error(&bytes).to_string(), "segments[0].address: expected a non-negative integer, found -4");

    let bytes = minimal(|segment, _, _| segment.push(("segment_pool_id", Py::Tuple(vec![Py::Int(1)]))));
    assert_eq!(error(&bytes).to_string(), "segments[0].segment_pool_id: expected a pair, found 1 items");

    let bytes = minimal(|segment, _, _| {
        segment[2] = ("blocks", Py::List(vec![Py::Dict(vec![("size", Py::Int(512)), ("state", Py::Str("busy"))])]))
    });
    assert!(error(&bytes).to_string().starts_with("segments[0].blocks[0].state: unknown block state \"busy\""));

    let bytes = minimal(|_, _, entries| entries.push(Py::Dict(vec![("action", Py::None)])));
    assert_eq!(error(&bytes).to_string(), "device_traces[0][2].action: expected a string, found None");

    let bytes = minimal(|_, _, entries| entries.push(Py::Bool(true)));
    assert_eq!(error(&bytes).to_string(), "device_traces[0][2]: expected a dict, found a bool");

    assert_eq!(
        error(&dump(&Py::Int(3))).to_string(),
        "the top level: expected a snapshot dict or a list of segments, found an integer"
    );
}

// ---------------------------------------------------------------------------------------------
// Values PyTorch really writes, one test each

fn entry_with(action: &'static str, edit: impl FnOnce(&mut Vec<(&'static str, Py)>)) -> Py {
    let mut e = entry(action);
    edit(&mut e);
    Py::Dict(e)
}

fn set(fields: &mut [(&'static str, Py)], key: &str, value: Py) {
    fields.iter_mut().find(|(k, _)| *k == key).expect("the key").1 = value;
}

fn round_trip(s: &TorchSnapshot, name: &str) -> Vec<u8> {
    let written = write_snapshot(s).expect("writes");
    assert_same(s, &read_snapshot(&written).expect("reads back"), name);
    written
}

/// Python's `pickle.loads` of `bytes`, then `expression` of it (`s`), printed; `None` without python3.
fn python(bytes: &[u8], expression: &str) -> Option<String> {
    std::process::Command::new("python3").arg("--version").output().ok()?;
    static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let name = format!("python-{}-{call}.pickle", std::process::id());
    let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(name);
    std::fs::write(&path, bytes).expect("temp file");
    let script = format!("import pickle, sys; s = pickle.load(open(sys.argv[1], 'rb')); print({expression})");
    let out = std::process::Command::new("python3").args(["-c", &script]).arg(&path).output().expect("runs");
    let _ = std::fs::remove_file(&path);
    assert!(out.status.success(), "python3: {}", String::from_utf8_lossy(&out.stderr));
    Some(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// A frame's line is a `uint64_t` in PyTorch; an unknown one (code torch.compile generated, as
/// `fake_tensor.py`'s `init_gpu_context` in a compiled training job) is 2^64 − 1. It reads, and
/// is written back as the same number.
#[test]
fn an_unknown_frame_line_reads_and_is_written_back_unchanged() {
    let unknown = Py::Dict(vec![
        ("filename", Py::Str("torch/_subclasses/fake_tensor.py")),
        ("line", Py::UInt(u64::MAX)),
        ("name", Py::Str("init_gpu_context")),
    ]);
    let bytes = minimal(|_, _, entries| {
        entries.push(entry_with("alloc", |e| e.push(("frames", Py::List(vec![unknown, frame()])))))
    });
    let s = read_snapshot(&bytes).expect("reads");
    let frames = s.contexts.frames(s.device_traces[0][2].context.expect("frames"));
    assert_eq!((frames[0].line as u64, frames[1].line), (u64::MAX, 12));
    let written = round_trip(&s, "unknown line");
    let long = [0x8a, 9, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0];
    assert!(written.windows(long.len()).any(|w| w == long), "written as LONG1 2^64 - 1");
    if let Some(line) = python(&written, "s['device_traces'][0][2]['frames'][0]['line']") {
        assert_eq!(line, u64::MAX.to_string());
    }
}

/// PyTorch writes a stream as its `cudaStream_t` cast to `int64_t`, so a handle with the top bit
/// set is negative; another writer may spell the same handle unsigned. Both read as the
/// handle's 64 bits, written back as PyTorch writes them.
#[test]
fn a_stream_handle_keeps_its_64_bits_either_spelling() {
    let bytes = minimal(|segment, _, entries| {
        segment.push(("stream", Py::Int(-2)));
        entries.push(entry_with("alloc", |e| set(e, "stream", Py::Int(-2))));
        entries.push(entry_with("free_requested", |e| set(e, "stream", Py::UInt(u64::MAX - 1))));
    });
    let s = read_snapshot(&bytes).expect("reads");
    assert_eq!(s.segments[0].stream, u64::MAX - 1);
    assert_eq!(
        (s.device_traces[0][2].stream, s.device_traces[0][3].stream),
        (StreamId(u64::MAX - 1), StreamId(u64::MAX - 1))
    );
    let written = round_trip(&s, "stream");
    if let Some(streams) =
        python(&written, "[e['stream'] for e in s['device_traces'][0]] + [s['segments'][0]['stream']]")
    {
        assert_eq!(streams, "[0, 0, -2, -2, -2]");
    }
}

/// `segment_pool_id` is a pair of `unsigned long long`: an id above `i64::MAX` keeps its bits.
#[test]
fn pool_ids_are_unsigned() {
    let bytes =
        minimal(|segment, _, _| segment.push(("segment_pool_id", Py::Tuple(vec![Py::UInt(1 << 63), Py::Int(7)]))));
    let s = read_snapshot(&bytes).expect("reads");
    assert_eq!(s.segments[0].segment_pool_id, (i64::MIN, 7));
    let written = round_trip(&s, "pool id");
    if let Some(pool) = python(&written, "s['segments'][0]['segment_pool_id']") {
        assert_eq!(pool, format!("({}, 7)", 1u64 << 63));
    }
}

/// Times are `time_t` and devices `int8_t`: any signed 64-bit value reads; a time beyond that
/// range is not PyTorch's and names its place.
#[test]
fn times_and_devices_are_signed() {
    let bytes = minimal(|segment, _, entries| {
        segment.push(("device", Py::Int(-1)));
        entries.push(entry_with("alloc", |e| set(e, "time_us", Py::Int(i64::MAX))));
        entries.push(entry_with("alloc", |e| set(e, "time_us", Py::Int(-5))));
    });
    let s = read_snapshot(&bytes).expect("reads");
    assert_eq!(s.segments[0].device, -1);
    assert_eq!((s.device_traces[0][2].time_us, s.device_traces[0][3].time_us), (i64::MAX, -5));
    round_trip(&s, "times");
    let bytes = minimal(|_, _, entries| entries.push(entry_with("alloc", |e| set(e, "time_us", Py::UInt(u64::MAX)))));
    assert_eq!(
        error(&bytes).to_string(),
        "device_traces[0][2].time_us: 18446744073709551615 does not fit in a signed 64-bit integer"
    );
}

/// `torch.cuda.memory._snapshot(augment_with_fx_traces=True)` adds keys to the frames of
/// compiled code, some of them `None`: they are not read, and do not stop the reader.
#[test]
fn frames_augmented_with_fx_metadata_read() {
    let augmented = Py::Dict(vec![
        ("filename", Py::Str("/tmp/torchinductor/fx_graph_module_1.py")),
        ("line", Py::Int(41)),
        ("name", Py::Str("forward")),
        ("fx_node_op", Py::None),
        ("fx_node_name", Py::None),
        ("fx_node_target", Py::Str("None")),
        ("fx_original_trace", Py::Str("  File \"model.py\", line 7, in forward")),
    ]);
    let bytes =
        minimal(|_, _, entries| entries.push(entry_with("alloc", |e| e.push(("frames", Py::List(vec![augmented]))))));
    let s = read_snapshot(&bytes).expect("reads");
    let frame = &s.contexts.frames(s.device_traces[0][2].context.expect("frames"))[0];
    assert_eq!((frame.line, frame.name.as_ref()), (41, "forward"));
}

#[test]
fn an_unknown_action_names_it_and_its_place() {
    let e = error(&minimal(|_, _, entries| entries.push(Py::Dict(entry("explode")))));
    let text = e.to_string();
    assert!(text.starts_with("device_traces[0][2].action: unknown action \"explode\""), "{text}");
    assert!(text.contains("segment_unmap"), "{text}");

    // The same deep in a real trace: make entry 1234 of gpt_train the only `snapshot` entry,
    // write it, and misspell the one place the writer spells the name out.
    let mut snapshot = read("gpt_train");
    snapshot.device_traces[0][1234].action = TraceAction::Snapshot;
    let mut bytes = write_snapshot(&snapshot).expect("writes");
    let spelled = b"\x8c\x08snapshot";
    let at: Vec<usize> =
        (0..bytes.len() - spelled.len()).filter(|&i| &bytes[i..i + spelled.len()] == spelled).collect();
    assert_eq!(at.len(), 1, "\"snapshot\" is spelled out once and shared");
    bytes[at[0] + 9] = b'X';
    let text = error(&bytes).to_string();
    assert!(text.starts_with("device_traces[0][1234].action: unknown action \"snapshoX\""), "{text}");
}

#[test]
fn truncated_and_corrupt_files_name_the_byte() {
    let bytes = reference("seeds");
    for cut in [0, 1, 2, 100, bytes.len() / 2, bytes.len() - 1] {
        let e = error(&bytes[..cut]);
        let text = e.to_string();
        assert!(matches!(e, PickleError::Malformed { .. }), "{text}");
        assert!(text.starts_with("byte ") && text.contains("truncated"), "cut at {cut}: {text}");
        assert!(e.place().starts_with("byte "));
    }
    let e = error(&bytes[..bytes.len() - 1]);
    assert_eq!(
        e.to_string(),
        format!("byte {}: the file ends before the pickle's STOP opcode (truncated file?)", bytes.len() - 1)
    );

    assert!(error(b"").to_string().starts_with("byte 0: "));
    assert!(
        error(b"\x80\x04\x95\x01").to_string().starts_with("byte 2: FRAME: the file ends inside its 8-byte argument")
    );
    let mut corrupt = bytes.clone();
    corrupt[2] = 0xfe;
    assert!(error(&corrupt).to_string().starts_with("byte 2: unknown opcode 0xfe"));
}

#[test]
fn writing_names_a_stack_that_is_not_in_the_table() {
    let mut snapshot = read("seeds");
    snapshot.segments[1].blocks[0].frames = Some(ContextId(9999));
    let e = write_snapshot(&snapshot).expect_err("stack 9999 does not exist");
    assert_eq!(e.place(), "segments[1].blocks[0].frames");
    assert!(e.to_string().starts_with("cannot write segments[1].blocks[0].frames: stack 9999 is not in"));
}

// ---------------------------------------------------------------------------------------------
// Robustness: no input makes the reader panic

/// Every one-byte change of a small reference pickle either reads to a snapshot that
/// writes and reads back the same, or is an error that names a byte or a place.
#[test]
fn one_byte_changes_read_consistently_or_name_their_place() {
    let original = reference("seeds");
    let (mut read_count, mut refused) = (0, 0);
    // Every third byte keeps the debug-build test near ten seconds.
    for at in (0..original.len()).step_by(3) {
        for delta in [1u8, 0xff] {
            let mut bytes = original.clone();
            bytes[at] = bytes[at].wrapping_add(delta);
            match read_snapshot(&bytes) {
                Ok(snapshot) => {
                    read_count += 1;
                    let written = write_snapshot(&snapshot).expect("what reads also writes");
                    let again = read_snapshot(&written).expect("and reads back");
                    assert_same(&snapshot, &again, &format!("byte {at} + {delta}"));
                }
                Err(e) => {
                    refused += 1;
                    let place = e.place();
                    assert!(!place.is_empty() && !e.to_string().ends_with(": "), "byte {at} + {delta}: {e}");
                }
            }
        }
    }
    assert!(read_count > 500 && refused > 500, "{read_count} read, {refused} refused");
}

/// Files from 4 MiB on are read with the guard on a second thread.
#[test]
fn a_large_pickle_reads_the_same_with_the_guard_beside_the_reader() {
    let mut snapshot = read_snapshot(&reference("random_stress_maxsplit")).expect("reads");
    let trace = snapshot.device_traces[0].clone();
    for _ in 0..3 {
        snapshot.device_traces[0].extend_from_slice(&trace);
    }
    let large = write_snapshot(&snapshot).expect("writes");
    assert!(large.len() >= 4 << 20, "{} bytes", large.len());
    let read = read_snapshot(&large).expect("reads");
    assert_same(&read, &snapshot, "four times random_stress_maxsplit");
    // The guard's verdict wins over what the reader made of the same bytes.
    let mut corrupt = large[..large.len() - 1].to_vec();
    corrupt.extend_from_slice(b"cos\nsystem\n.");
    match read_snapshot(&corrupt) {
        Err(e @ PickleError::Malformed { .. }) => {
            assert!(e.to_string().starts_with(&format!("byte {}: GLOBAL", large.len() - 1)), "{e}")
        }
        other => panic!("{:?}", other.map(|_| "a snapshot")),
    }
}

#[derive(Clone, Debug)]
enum Mutation {
    Truncate(usize),
    Flip(Vec<(usize, u8)>),
    Insert(usize, Vec<u8>),
    Remove(usize, usize),
}

fn mutate(original: &[u8], mutation: &Mutation) -> Vec<u8> {
    let mut bytes = original.to_vec();
    let len = bytes.len();
    match mutation {
        Mutation::Truncate(at) => bytes.truncate(at % len),
        Mutation::Flip(flips) => flips.iter().for_each(|&(at, byte)| bytes[at % len] = byte),
        Mutation::Insert(at, new) => {
            bytes.splice(at % len..at % len, new.iter().copied());
        }
        Mutation::Remove(at, n) => {
            let at = at % len;
            bytes.drain(at..(at + n).min(len));
        }
    }
    bytes
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        any::<usize>().prop_map(Mutation::Truncate),
        prop::collection::vec((any::<usize>(), any::<u8>()), 1..6).prop_map(Mutation::Flip),
        (any::<usize>(), prop::collection::vec(any::<u8>(), 1..6)).prop_map(|(at, b)| Mutation::Insert(at, b)),
        (any::<usize>(), 1usize..16).prop_map(|(at, n)| Mutation::Remove(at, n)),
    ]
}

/// Small reference pickles to mutate: PyTorch's protocol 4 and Python's protocol 2.
fn fuzzed() -> &'static [Vec<u8>] {
    static FILES: std::sync::OnceLock<Vec<Vec<u8>>> = std::sync::OnceLock::new();
    FILES.get_or_init(|| {
        let mut files: Vec<Vec<u8>> = ["seeds", "oom_probe_fraction", "multistream"].map(reference).into();
        files.push(fixture("seeds.protocol2.pickle"));
        files
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 3000, failure_persistence: None, ..ProptestConfig::default() })]

    /// Mutated reference pickles read as `Ok` or `Err`, never a panic (or an abort); whatever
    /// reads also writes and reads back the same.
    #[test]
    fn mutated_pickles_never_panic(file in 0..4usize, mutation in mutation()) {
        let bytes = mutate(&fuzzed()[file], &mutation);
        if let Ok(snapshot) = read_snapshot(&bytes) {
            let written = write_snapshot(&snapshot).expect("what reads also writes");
            let again = read_snapshot(&written).expect("and reads back");
            assert_same(&snapshot, &again, "mutated");
        }
    }

    /// Random bytes behind a protocol header never panic either.
    #[test]
    fn random_bytes_never_panic(body in prop::collection::vec(any::<u8>(), 0..400)) {
        let mut bytes = vec![0x80, 4];
        bytes.extend(body);
        let _ = read_snapshot(&bytes);
    }
}

// ---------------------------------------------------------------------------------------------
// Timing (printed, never asserted): `cargo test --release -p cachalot-core --test torch_pickle
// -- --nocapture read_timing`

#[test]
fn read_timing() {
    let bytes = reference("random_stress_maxsplit");
    let runs = if cfg!(debug_assertions) { 1 } else { 20 };
    let start = Instant::now();
    let mut entries = 0;
    for _ in 0..runs {
        entries = read_snapshot(&bytes).expect("reads").device_traces[0].len();
    }
    let read_time = start.elapsed() / runs;
    let snapshot = read("random_stress_maxsplit");
    let start = Instant::now();
    for _ in 0..runs {
        write_snapshot(&snapshot).expect("writes");
    }
    let write = start.elapsed() / runs;
    eprintln!(
        "random_stress_maxsplit.pickle ({} bytes, {entries} entries): read {read_time:?}, write {write:?} ({})",
        bytes.len(),
        if cfg!(debug_assertions) { "debug" } else { "release" }
    );
}
