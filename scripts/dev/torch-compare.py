#!/usr/bin/env python3
"""Compares the runs of torch-proof.py on PyTorch's allocator and on cachalot's.

    torch-compare.py NATIVE_DIR CACHALOT_DIR [NATIVE2_DIR] > table

Per workload: every mark's memory_allocated and memory_reserved (and OOM messages, in the part
the allocator decides), peak reserved, every memory_stats key, and the losses bit for bit. With
NATIVE2_DIR (a second run on PyTorch's allocator), whether PyTorch repeats itself first: its
marks and its losses. A mark where cachalot differs from PyTorch's first run but PyTorch's two
runs differ there too is PyTorch's own difference, listed as such and not counted against
cachalot. Exits 1 if a mark (other than those), the peak or a loss differs.
"""
import glob
import json
import os
import sys


def allocator_part(message):
    """The OOM message without the device's free memory and NVML's per-process sentence, which
    come from the driver, not the allocator, and without the line cachalot_torch appends (its
    main cause), as cachalot-core's OutOfMemoryError::allocator_part."""
    message = message.split("\ncachalot: ")[0]
    start = message.find(" of which ")
    rest = message.find("Of the allocated memory")
    if start < 0 or rest < 0:
        return message
    return message[:start] + " ... " + message[rest:]


def load(directory, tag):
    with open(f"{directory}/{tag}.expected.json") as f:
        expected = json.load(f)
    try:
        with open(f"{directory}/{tag}.losses.json") as f:
            losses = json.load(f)["losses"]
    except FileNotFoundError:
        losses = None
    return expected, losses


def main():
    native_dir, cachalot_dir = sys.argv[1], sys.argv[2]
    native2_dir = sys.argv[3] if len(sys.argv) > 3 else None
    failed = False
    rows = []
    for path in sorted(glob.glob(f"{native_dir}/*.expected.json")):
        tag = os.path.basename(path)[: -len(".expected.json")]
        if not os.path.exists(f"{cachalot_dir}/{tag}.expected.json"):
            rows.append((tag, "no cachalot run", "", "", "", ""))
            failed = True
            continue
        n, n_losses = load(native_dir, tag)
        c, c_losses = load(cachalot_dir, tag)
        n2 = None
        if native2_dir and os.path.exists(f"{native2_dir}/{tag}.expected.json"):
            n2, _ = load(native2_dir, tag)
        mark_diffs = []
        own_diffs = []  # where PyTorch's two runs differ as well
        for i, (a, b) in enumerate(zip(n["marks"], c["marks"])):
            for key in ("label", "allocated", "reserved"):
                if a.get(key) != b.get(key):
                    again = n2["marks"][i].get(key) if n2 and i < len(n2["marks"]) else a.get(key)
                    line = f"{a.get('label')}.{key}: {a.get(key)} vs {b.get(key)}"
                    if again != a.get(key):
                        own_diffs.append(f"{line} (PyTorch's second run: {again})")
                    else:
                        mark_diffs.append(line)
            if "message" in a and allocator_part(a["message"]) != allocator_part(b.get("message", "")):
                mark_diffs.append(f"{a['label']}.message:\n  {a['message']}\n  {b.get('message')}")
        if len(n["marks"]) != len(c["marks"]):
            mark_diffs.append(f"{len(n['marks'])} vs {len(c['marks'])} marks")
        peak_n = n["memory_stats"].get("reserved_bytes.all.peak")
        peak_c = c["memory_stats"].get("reserved_bytes.all.peak")
        peak_own = n2 is not None and n2["memory_stats"].get("reserved_bytes.all.peak") != peak_n
        marks_repeat = ""
        if n2 is not None:
            same = sum(1 for a, b in zip(n["marks"], n2["marks"])
                       if (a.get("allocated"), a.get("reserved")) == (b.get("allocated"), b.get("reserved")))
            marks_repeat = f"{same}/{len(n['marks'])}"
        keys = sorted(set(n["memory_stats"]) | set(c["memory_stats"]))
        stat_diffs = [k for k in keys if n["memory_stats"].get(k) != c["memory_stats"].get(k)]
        # Keys where PyTorch's own second run differs from its first: its difference, not ours.
        own_stats = [k for k in stat_diffs if n2 is not None and n2["memory_stats"].get(k) != n["memory_stats"].get(k)]
        losses_equal = n_losses == c_losses
        repeatable = ""
        if native2_dir and os.path.exists(f"{native2_dir}/{tag}.expected.json"):
            _, n2_losses = load(native2_dir, tag)
            repeatable = "yes" if n2_losses == n_losses else "NO"
        ok = not mark_diffs and (peak_n == peak_c or peak_own) and losses_equal
        failed |= not ok
        marks_text = "equal" if not mark_diffs and not own_diffs else "DIFFER" if mark_diffs else \
            f"equal but {len(own_diffs)} where PyTorch differs from itself"
        rows.append((tag, f"{len(n['marks'])} marks " + marks_text, marks_repeat,
                     f"{peak_n} / {peak_c}" + (" (PyTorch's own differ)" if peak_own and peak_n != peak_c else ""),
                     f"{len(keys) - len(stat_diffs)}/{len(keys)} equal"
                     + (f" ({len(own_stats)} of the others PyTorch's own)" if own_stats else ""),
                     f"{len(n_losses or [])} " + ("bit-identical" if losses_equal else "DIFFER"), repeatable))
        for d in mark_diffs[:10]:
            print(f"  {tag}: {d}", file=sys.stderr)
        for d in own_diffs[:5]:
            print(f"  {tag}: PyTorch's own: {d}", file=sys.stderr)
        if stat_diffs:
            print(f"  {tag}: memory_stats keys that differ: " + ", ".join(
                f"{k}={n['memory_stats'].get(k)}/{c['memory_stats'].get(k)}" for k in stat_diffs), file=sys.stderr)
    header = ("workload", "marks (allocated, reserved)", "PyTorch repeats its marks", "peak reserved PyTorch / cachalot",
              "memory_stats keys", "losses", "PyTorch repeats its losses")
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for row in rows:
        print("| " + " | ".join(row) + " |")
    sys.exit(1 if failed else 0)


main()
