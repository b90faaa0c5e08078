#!/usr/bin/env python3
"""Hostile inputs against the `cachalot` binary: each class of issue 20, run as an attacker or a
careless user would, with the outcome, exit statuses and peak memory of every run.

    scripts/dev/hostile.sh            # builds the debug binary, then runs this
    scripts/dev/hostile.py BINARY [--seed N] [--mutants N]

A run passes when it exits 0, 1 or 2 (2: bad input, with a message), does not panic (101) or
die of a signal, finishes within the time limit and stays under the memory bound of its class.
Prints a Markdown table (BENCHMARKS.md, "Hostile input") and exits 1 if any run failed.
"""

import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TRACES = ROOT / "testdata/traces/pytorch-2.11-h200"
TIMEOUT_S = 60


def run(binary, args, env=None, stdin=None):
    """Runs BINARY ARGS; returns (exit status or 'timeout', peak RSS in MiB, stderr's last line)."""
    full_env = dict(os.environ, **(env or {}))
    with tempfile.TemporaryFile() as err:
        process = subprocess.Popen(
            [str(binary), *args], stdout=subprocess.DEVNULL, stderr=err, stdin=stdin or subprocess.DEVNULL, env=full_env
        )
        started = time.monotonic()
        status = None
        rss_kib = 0
        while True:
            pid, raw, usage = os.wait4(process.pid, os.WNOHANG)
            if pid:
                status = os.waitstatus_to_exitcode(raw)
                rss_kib = usage.ru_maxrss
                break
            if time.monotonic() - started > TIMEOUT_S:
                process.kill()
                os.wait4(process.pid, 0)
                status = "timeout"
                break
            time.sleep(0.01)
        err.seek(0)
        lines = err.read().decode(errors="replace").strip().splitlines()
    return status, rss_kib / 1024, (lines[-1] if lines else "")


def mutate(data, rng):
    """A corrupted copy: flipped bytes, a cut, a duplicated range or a huge number spliced in."""
    data = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        kind = rng.randrange(5)
        if kind == 0 and data:
            for _ in range(rng.randint(1, 16)):
                data[rng.randrange(len(data))] = rng.randrange(256)
        elif kind == 1 and data:
            data = data[: rng.randrange(len(data))]
        elif kind == 2 and len(data) > 2:
            a = rng.randrange(len(data) - 1)
            b = min(len(data), a + rng.randint(1, 4096))
            data[a:a] = data[a:b] * rng.randint(1, 8)
        elif kind == 3:
            at = rng.randrange(len(data) + 1)
            data[at:at] = rng.choice([b"18446744073709551615", b"-1", b"NaN", b"1e308", b"4294967295", b"\xff" * 8])
        else:
            if data:
                a = rng.randrange(len(data))
                del data[a : a + rng.randint(1, 64)]
    return bytes(data)


class Table:
    def __init__(self):
        self.rows = []
        self.failed = False

    def add(self, name, runs, ok_statuses, memory_bound_mib, note=""):
        statuses = {}
        worst_rss = 0.0
        bad = []
        for status, rss, last in runs:
            statuses[status] = statuses.get(status, 0) + 1
            worst_rss = max(worst_rss, rss)
            if status not in ok_statuses or rss > memory_bound_mib:
                bad.append(f"status {status}, {rss:.0f} MiB: {last}")
        outcome = "pass" if not bad else f"FAIL ({len(bad)}): {bad[0]}"
        self.failed |= bool(bad)
        shown = ", ".join(f"{k}: {v}" for k, v in sorted(statuses.items(), key=lambda kv: str(kv[0])))
        self.rows.append((name, len(runs), shown, f"{worst_rss:.0f}", outcome, note))
        print(f"  {name}: {len(runs)} runs, exit {shown}, peak {worst_rss:.0f} MiB, {outcome}", file=sys.stderr)

    def markdown(self):
        out = ["| input class | runs | exit statuses (count) | peak RSS (MiB) | outcome | example / note |",
               "| --- | ---: | --- | ---: | --- | --- |"]
        for name, n, statuses, rss, outcome, note in self.rows:
            out.append(f"| {name} | {n} | {statuses} | {rss} | {outcome} | {note} |")
        return "\n".join(out)


def main():
    binary = Path(sys.argv[1])
    seed = int(sys.argv[sys.argv.index("--seed") + 1]) if "--seed" in sys.argv else 20
    mutants = int(sys.argv[sys.argv.index("--mutants") + 1]) if "--mutants" in sys.argv else 200
    rng = random.Random(seed)
    table = Table()
    small_trace = TRACES / "multistream.pickle"
    with tempfile.TemporaryDirectory(prefix="cachalot-hostile-") as tmp:
        tmp = Path(tmp)

        def write(name, data):
            path = tmp / name
            path.write_bytes(data if isinstance(data, bytes) else data.encode())
            return str(path)

        # 1. Wrapping arithmetic on values from outside.
        runs = []
        for value in ["17592186044416", "17592186044417", "18446744073709551615", "0", "10"]:
            for command in ["replay", "stats", "summary"]:
                runs.append(run(binary, [command, "--config", f"large_segment_size_mb:{value}", str(small_trace)]))
        table.add("config values that wrap (`large_segment_size_mb:2^44`, ...)", runs, {2}, 512,
                  "`replay --config large_segment_size_mb:17592186044416`: exit 2, names key and limit")
        runs = []
        expected = json.loads((TRACES / "multistream.expected.json").read_text())
        for field, value in [("device_total_bytes", -1), ("device_total_bytes", "NaN"), ("device_total_bytes", 1.5),
                             ("device_total_bytes", 1e30), ("memory_fraction", "NaN"), ("memory_fraction", 7),
                             ("PYTORCH_CUDA_ALLOC_CONF", "large_segment_size_mb:17592186044416")]:
            d = tmp / f"expected-{len(runs)}"
            d.mkdir()
            (d / "multistream.pickle").write_bytes(small_trace.read_bytes())
            (d / "multistream.expected.json").write_text(json.dumps(dict(expected, **{field: value})))
            for command in ["replay", "stats"]:
                runs.append(run(binary, [command, str(d / "multistream.pickle")]))
        table.add("expected.json values out of range (-1, NaN, 1e30, fraction 7, wrapping config)", runs, {2}, 512,
                  "`device_total_bytes: -1` is an error naming the field, not 0")

        # 2. Memory sized by a number in the input.
        runs = [run(binary, ["stats", write("big-id.ops", "a 4294967295 512\nf 4294967295\n")])]
        runs.append(run(binary, ["stats", write("ids.ops", "".join(f"a {4294967295 - i} 512\n" for i in range(1000)))]))
        table.add("op-file ids near 2^32", runs, {0}, 256, "`a 4294967295 512`: ids renumbered densely")
        streams = "".join(f"a {i} 512 {i + 1}\nf {i}\n" for i in range(10_000))
        kept = "".join(f"a {i} 512 {i + 1}\n" for i in range(10_000))
        runs = [run(binary, ["stats", write("streams.ops", streams)]), run(binary, ["stats", write("kept.ops", kept)])]
        table.add("10,000 streams in an op file (freed / kept live)", runs, {0}, 1024,
                  "was ~400 KB per stream (4 GB)")
        runs = [run(binary, ["run", "--backend", "sim", "--out", str(tmp / "ops.json"), "ops", write("huge.ops", "a 0 107374182400\n")])]
        table.add("`run --backend sim ops` with `a 0 107374182400`", runs, {0, 1, 2}, 512,
                  "PyTorch's OOM (host budget 16 GiB), no abort")
        limit = {"CACHALOT_MAX_INPUT_BYTES": str(64 << 20)}
        runs = [run(binary, ["stats", "/dev/zero"], env=limit), run(binary, ["stats", "/dev/stdin"], env=limit,
                stdin=open("/dev/zero", "rb")), run(binary, ["replay", "/dev/zero"], env=limit)]
        table.add("endless input (`/dev/zero`, a pipe) with a 64 MiB limit", runs, {2}, 256,
                  "default limit 1 GiB (CACHALOT_MAX_INPUT_BYTES)")

        # 3. Corrupted files of every reader.
        sources = [TRACES / "seeds.pickle", TRACES / "multistream.pickle", TRACES / "oom_probe_fraction.pickle"]
        runs = []
        for i in range(mutants):
            data = mutate(rng.choice(sources).read_bytes(), rng)
            runs.append(run(binary, ["replay", "--check", write(f"m{i}.pickle", data)]))
        table.add("corrupted PyTorch pickles (`replay --check`)", runs, {0, 1, 2}, 1024)
        snapshot = tmp / "seeds.sim.json"
        run(binary, ["run", "--backend", "sim", "--out", str(snapshot), "seeds"])
        runs = []
        for i in range(mutants):
            runs.append(run(binary, ["stats", write(f"m{i}.json", mutate(snapshot.read_bytes(), rng))]))
        table.add("corrupted cachalot snapshots (`stats`)", runs, {0, 2}, 1024)
        runs = []
        ops = (ROOT / "testdata/bench-ops/trace-multistream.ops").read_bytes()
        for i in range(mutants):
            runs.append(run(binary, ["stats", write(f"m{i}.ops", mutate(ops, rng))]))
        table.add("corrupted op files (`stats`)", runs, {0, 2}, 1024)

        # 3b. compare and a snapshot's run record.
        record_snapshot = tmp / "mlp.sim.json"
        run(binary, ["run", "--backend", "sim", "--out", str(record_snapshot), "mlp-train", "--steps", "2"])
        runs = []
        data = json.loads(record_snapshot.read_text())
        for key, value in [("steps", 4_000_000_000), ("widths", [1 << 40, 10]), ("batches", [1 << 40])]:
            crafted = json.loads(json.dumps(data))
            for i, (k, v) in enumerate(crafted["device"]["details"]):
                if k == "cachalot.run":
                    record = json.loads(v)
                    record["experiment"]["mlp-train"][key] = value
                    crafted["device"]["details"][i][1] = json.dumps(record)
            path = write(f"crafted-{key}.json", json.dumps(crafted))
            runs.append(run(binary, ["compare", str(record_snapshot), path]))
        table.add("`compare` of snapshots whose record asks for 4e9 steps / 2^40 widths", runs, {0, 1}, 512,
                  "not rerun without `--rerun`; a note names why")

        # 4. Command-line values that reach library calls.
        runs = [run(binary, ["view", "--scale", s, "--screenshot", str(tmp / "x.png"), str(small_trace)])
                for s in ["6", "0", "NaN", "inf", "-1"]]
        runs.append(run(binary, ["view", "--size", "8000x8000", "--scale", "2", "--screenshot", str(tmp / "x.png"),
                                 str(small_trace)]))
        runs += [run(binary, ["compare", "--loss-tolerance", t, str(snapshot), str(snapshot)])
                 for t in ["NaN", "-1", "inf"]]
        runs += [run(binary, ["stats", "--device-total", t, str(small_trace)]) for t in ["99999999999999999999T", "2000000000000000000000"]]
        table.add("CLI values (`view --scale 6/0/NaN/inf/-1`, `--loss-tolerance NaN`, sizes over 1 EiB)", runs, {2}, 512)

    print(table.markdown())
    return 1 if table.failed else 0


if __name__ == "__main__":
    sys.exit(main())
