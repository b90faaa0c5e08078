#!/usr/bin/env python3
"""What Python's own `pickle` reads in the reference snapshots: the expected values of
core/tests/torch_pickle.rs.

Regenerate with (plain Python 3, no torch needed):

    python3 core/tests/data/torch_pickle_facts.py > core/tests/data/torch_pickle_facts.json
    python3 core/tests/data/torch_pickle_facts.py --fixtures core/tests/data

The second writes `seeds.protocolN.pickle`: the `seeds` snapshot as Python's `pickle` writes it
in protocols 0, 1, 2, 3 and 5 (PyTorch's file is protocol 4).

The traces directory defaults to ../../../testdata/traces/pytorch-2.11-h200 relative to this
script (the repository's copy of shared/traces); pass another one as the first argument.
"""

import collections
import json
import os
import pickle
import sys


def nodes(value, keys):
    """Nodes of the object graph, following a shared object each time it is referenced."""
    n = 1
    if isinstance(value, dict):
        for k, v in value.items():
            n += (nodes(k, keys) if keys else 0) + nodes(v, keys)
    elif isinstance(value, (list, tuple)):
        for v in value:
            n += nodes(v, keys)
    return n


def distinct_lists_and_dicts(value, seen):
    if isinstance(value, (list, dict)):
        if id(value) in seen:
            return
        seen.add(id(value))
    if isinstance(value, dict):
        for v in value.values():
            distinct_lists_and_dicts(v, seen)
    elif isinstance(value, (list, tuple)):
        for v in value:
            distinct_lists_and_dicts(v, seen)


def stack_key(frames):
    return tuple((f["filename"], f["line"], f["name"]) for f in frames)


def entry_facts(e):
    return {
        "action": e["action"],
        "addr": e["device_free"] if e["action"] == "oom" else e["addr"],
        "size": e["size"],
        "stream": e["stream"],
        "time_us": e["time_us"],
        "frames": len(e["frames"]) if "frames" in e else None,
    }


def facts(path):
    with open(path, "rb") as f:
        raw = f.read()
    snap = pickle.loads(raw)
    seen = set()
    distinct_lists_and_dicts(snap, seen)
    segments = snap["segments"]
    blocks = [b for s in segments for b in s["blocks"]]
    entries = [e for t in snap["device_traces"] for e in t]
    # The stacks cachalot interns: non-empty ones of segments and blocks (an empty one there
    # means "none recorded"), and every one an entry carries (an empty one there is a context
    # without Python frames).
    stacks = set()
    for s in segments:
        if s["frames"]:
            stacks.add(stack_key(s["frames"]))
    for b in blocks:
        if b["frames"]:
            stacks.add(stack_key(b["frames"]))
    for e in entries:
        if "frames" in e:
            stacks.add(stack_key(e["frames"]))
    settings = snap["allocator_settings"]
    return {
        "name": os.path.basename(path)[: -len(".pickle")],
        "bytes": len(raw),
        "protocol": raw[1] if raw[:1] == b"\x80" else 0,
        "nodes": nodes(snap, keys=False),
        "nodes_with_keys": nodes(snap, keys=True),
        "distinct_lists_and_dicts": len(seen),
        "segments": len(segments),
        "segment_total_size_sum": sum(s["total_size"] for s in segments),
        "segment_allocated_size_sum": sum(s["allocated_size"] for s in segments),
        "segment_active_size_sum": sum(s["active_size"] for s in segments),
        "segment_requested_size_sum": sum(s["requested_size"] for s in segments),
        "segment_types": dict(collections.Counter(s["segment_type"] for s in segments)),
        "expandable_segments": sum(1 for s in segments if s["is_expandable"]),
        "segment_streams": sorted(set(s["stream"] for s in segments)),
        "first_segment_address": segments[0]["address"],
        "last_segment_address": segments[-1]["address"],
        "blocks": len(blocks),
        "block_states": dict(collections.Counter(b["state"] for b in blocks)),
        "block_size_sum": sum(b["size"] for b in blocks),
        "block_requested_size_sum": sum(b["requested_size"] for b in blocks),
        "devices": len(snap["device_traces"]),
        "entries": len(entries),
        "actions": dict(collections.Counter(e["action"] for e in entries)),
        "entry_size_sum": sum(e["size"] for e in entries),
        "entry_addr_sum": sum(e["device_free"] if e["action"] == "oom" else e["addr"] for e in entries),
        "entry_time_us_min": min(e["time_us"] for e in entries),
        "entry_time_us_max": max(e["time_us"] for e in entries),
        "entries_without_frames": sum(1 for e in entries if "frames" not in e),
        "entries_with_empty_frames": sum(1 for e in entries if e.get("frames") == []),
        "entry_frames_sum": sum(len(e.get("frames", [])) for e in entries),
        "annotated_entries": sum(
            1 for e in entries if e.get("compile_context", "N/A") != "N/A" or e.get("user_metadata", "") != ""
        ),
        "first_entry": entry_facts(entries[0]),
        "last_entry": entry_facts(entries[-1]),
        "distinct_stacks": len(stacks),
        "settings": {
            "PYTORCH_CUDA_ALLOC_CONF": settings["PYTORCH_CUDA_ALLOC_CONF"],
            "max_split_size": settings["max_split_size"],
            "garbage_collection_threshold": settings["garbage_collection_threshold"],
            "expandable_segments": settings["expandable_segments"],
            "roundup_power2_divisions": [settings["roundup_power2_divisions"][str(1 << i)] for i in range(16)],
        },
        "external_annotations": len(snap["external_annotations"]),
        "first_external_annotation": snap["external_annotations"][0] if snap["external_annotations"] else None,
    }


def write_fixtures(traces, out):
    with open(os.path.join(traces, "seeds.pickle"), "rb") as f:
        snap = pickle.load(f)
    for protocol in (0, 1, 2, 3, 5):
        with open(os.path.join(out, f"seeds.protocol{protocol}.pickle"), "wb") as f:
            pickle.dump(snap, f, protocol=protocol)


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    traces = os.path.join(here, "..", "..", "..", "testdata", "traces", "pytorch-2.11-h200")
    if sys.argv[1:2] == ["--fixtures"]:
        write_fixtures(traces, sys.argv[2])
        return
    if len(sys.argv) > 1:
        traces = sys.argv[1]
    names = sorted(n for n in os.listdir(traces) if n.endswith(".pickle"))
    json.dump([facts(os.path.join(traces, n)) for n in names], sys.stdout, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
