#!/usr/bin/env python3
"""Seeded generator of PyTorch allocator workloads x settings for the conformance campaign.

    gen.py --seed S --count N [--device-total BYTES] > specs.jsonl

Writes one JSON workload spec a line. The same seed and count always give the same specs (only
Python's `random.Random(seed)` decides), so a campaign can be re-run and a mismatching spec
re-created from its name alone. No torch is needed here; `capture.py` runs the specs.

A spec is
    {"name": str, "seed": int, "conf": PYTORCH_CUDA_ALLOC_CONF, "fraction": float|null,
     "kind": "ops", "streams": k, "ops": [...]}          # a program of raw allocations, or
    {..., "kind": "model", "model": NAME, "params": {...}} # a model-shaped workload
The op language (run by capture.py, cut by shrink.py):
    ["a", slot, bytes, stream]  torch.empty(bytes, uint8) on stream (0 = the default stream)
    ["f", slot]                 drop the tensor of slot
    ["r", slot, stream]         use the tensor on stream (a write there) and record_stream it
    ["w", a, b]                 stream a waits for stream b
    ["s"]                       torch.cuda.synchronize()
    ["e"]                       torch.cuda.empty_cache()
    ["p"]                       torch.cuda.reset_peak_memory_stats()
    ["o", bytes, stream]        an allocation expected to fail: OutOfMemoryError caught, run goes on
Every allocation catches OutOfMemoryError (its message goes to the marks).
"""

import argparse
import json
import random
import sys

MIB = 1 << 20
GIB = 1 << 30
# Live bytes a workload may hold: 16 captures share one GPU.
LIVE_CAP = 3 * GIB // 2
SETTINGS_PER_CAMPAIGN = 40

MODELS = ["gpt_train", "kvcache_infer", "multistream", "convnet_train", "lstm_train", "transformer_varlen",
          "mlp_train", "random_stress", "oom_probe"]


def roundup_list(rng):
    """A per-interval `roundup_power2_divisions` list, `[64:8,256:4,>:1]` style (sizes in MB)."""
    sizes = sorted(rng.sample([1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096], rng.randint(1, 4)))
    entries = [f"{mb}:{rng.choice([1, 2, 4, 8, 16])}" for mb in sizes]
    if rng.random() < 0.7:
        entries.append(f">:{rng.choice([1, 2, 4, 8])}")
    return "[" + ",".join(entries) + "]"


def settings(rng):
    """A PYTORCH_CUDA_ALLOC_CONF covering every 2.11 key that changes what the device allocator
    does, plus some that must not change it."""
    parts = []
    if rng.random() < 0.35:
        parts.append("expandable_segments:True")
    if rng.random() < 0.35:
        parts.append(f"max_split_size_mb:{rng.choice([21, 32, 40, 64, 100, 200, 512])}")
    r = rng.random()
    if r < 0.2:
        parts.append(f"roundup_power2_divisions:{rng.choice([1, 2, 4, 8, 16])}")
    elif r < 0.35:
        parts.append(f"roundup_power2_divisions:{roundup_list(rng)}")
    if rng.random() < 0.15:
        parts.append(f"max_non_split_rounding_mb:{rng.choice([20, 64, 256, 1024])}")
    if rng.random() < 0.25:
        parts.append(f"garbage_collection_threshold:{rng.choice([0.3, 0.5, 0.6, 0.8, 0.95])}")
    if rng.random() < 0.08:
        parts.append("release_lock_on_cudamalloc:True")
    if rng.random() < 0.05:
        parts.append("pinned_use_cuda_host_register:True,pinned_num_register_threads:4")
    if rng.random() < 0.05:
        parts.append("graph_capture_record_stream_reuse:True")
    if rng.random() < 0.05:
        large = rng.choice([40, 64])
        parts.append(f"large_segment_size_mb:{large}")
        # PyTorch refuses a max_split_size_mb below the large segment size.
        parts = [p if not p.startswith("max_split_size_mb") or int(p.split(":")[1]) >= large
                 else f"max_split_size_mb:{large}" for p in parts]
    rng.shuffle(parts)
    return ",".join(parts)


def settings_pool(master_seed, device_total, k=SETTINGS_PER_CAMPAIGN):
    """The campaign's settings: a few dozen, so that captures of one setting share a process
    that imported torch (see capture.py); the first is PyTorch's defaults. From seed 4 on, a fifth
    of them also set the memory fraction as a key, `per_process_memory_fraction` (0.5-2.5 GiB of
    the device allowed), drawn from a generator of its own so that seeds 1-3 stay as they were."""
    pool = [""] + [settings(random.Random(master_seed * 7919 + n)) for n in range(1, k)]
    if master_seed >= 4:
        for n in range(1, k):
            rng = random.Random(master_seed * 7919 + n + 1_000_000)
            if rng.random() < 0.2:
                fraction = round(rng.uniform(0.5, 2.5) * GIB / device_total, 5)
                pool[n] = ",".join(p for p in [pool[n], f"per_process_memory_fraction:{fraction}"] if p)
    return pool


def size(rng, conf_split_mb):
    """A request size: log-uniform over 1 B .. 1 GiB, or a size at one of the allocator's edges."""
    r = rng.random()
    if r < 0.55:
        return max(1, int(2 ** rng.uniform(0, rng.choice([12, 20, 22, 25, 27, 30]))))
    edges = [1, 511, 512, 513, MIB - 1, MIB, MIB + 1, 2 * MIB, 10 * MIB - 1, 10 * MIB, 10 * MIB + 1,
             20 * MIB, 20 * MIB + 1, 3 * MIB, 40 * MIB, 64 * MIB]
    if conf_split_mb:
        edges += [conf_split_mb * MIB - 1, conf_split_mb * MIB, conf_split_mb * MIB + 1]
    if r < 0.85:
        return rng.choice(edges)
    # Sizes that repeat, as tensors of a model do.
    return rng.choice([4096, 65536, 393216, 1572864, 6291456, 25165824])


def ops_program(rng, n, streams, fraction, conf_split_mb, expandable):
    ops, live, slot, live_bytes = [], {}, 0, 0
    p_free = rng.uniform(0.3, 0.55)
    p_record = rng.choice([0, 0.02, 0.1]) if streams > 1 else 0
    p_empty = rng.choice([0, 0.002, 0.01])
    p_peak = rng.choice([0, 0, 0.003])
    # With expandable segments and no fraction, a request larger than the device maps pages until
    # the device is full before it fails: the other captures on the GPU would run out of memory.
    p_oom = 0 if expandable and fraction is None else rng.choice([0, 0, 0.005, 0.02])
    cap = LIVE_CAP if fraction is None else LIVE_CAP * 2  # a fraction makes the allocator refuse first
    for _ in range(n):
        r = rng.random()
        if live and (r < p_free or live_bytes > cap):
            s = rng.choice(list(live))
            ops.append(["f", s])
            live_bytes -= live.pop(s)
        elif live and r < p_free + p_record:
            s = rng.choice(list(live))
            ops.append(["r", s, rng.randrange(1, streams)])
        elif r < p_free + p_record + p_empty:
            ops.append(["e"])
        elif r < p_free + p_record + p_empty + p_peak:
            ops.append(["p"])
        elif r < p_free + p_record + p_empty + p_peak + p_oom:
            # More than any device has, or (under a fraction) more than the allowance.
            big = 1 << rng.randint(38, 41) if fraction is None or rng.random() < 0.3 else rng.randint(1, 3) * GIB
            ops.append(["o", big, rng.randrange(streams)])
        elif streams > 1 and r < p_free + p_record + p_empty + p_peak + p_oom + 0.01:
            a, b = rng.sample(range(streams), 2)
            ops.append(["w", a, b])
        else:
            b = size(rng, conf_split_mb)
            stream = 0 if streams == 1 or rng.random() < 0.6 else rng.randrange(1, streams)
            ops.append(["a", slot, b, stream])
            live[slot] = b
            live_bytes += b
            slot += 1
    if rng.random() < 0.5:
        ops.append(["s"])
    return ops


def model_params(rng, model):
    c = rng.choice
    return {
        "gpt_train": lambda: {"steps": c([2, 3, 4]), "d": c([128, 256, 384]), "layers": c([1, 2, 4]),
                              "L": c([64, 128, 256]), "B": c([4, 8, 16]), "vocab": c([1000, 8000])},
        "kvcache_infer": lambda: {"d": c([128, 256, 512]), "layers": c([2, 4, 6]), "new_tokens": c([16, 48, 96]),
                                  "B": c([1, 4]), "prompt": c([16, 64])},
        "multistream": lambda: {"iters": c([10, 20, 40])},
        "convnet_train": lambda: {"steps": c([3, 6, 10])},
        "lstm_train": lambda: {"steps": c([2, 4])},
        "transformer_varlen": lambda: {"steps": c([3, 6]), "layers": c([1, 2])},
        "mlp_train": lambda: {"steps": c([2, 4, 6])},
        "random_stress": lambda: {"n": c([1000, 3000, 6000]), "maxlog": c([20, 24, 27]), "live_cap": c([50, 300])},
        "oom_probe": lambda: {"chunk_mb": c([16, 64, 100]), "again_mb": c([200, 512])},
    }[model]()


def spec(master_seed, index, device_total, pool):
    seed = master_seed * 1_000_003 + index
    rng = random.Random(seed)
    conf = rng.choice(pool)
    fraction = None
    if "garbage_collection_threshold" in conf or rng.random() < 0.25:
        # 0.5 to 2.5 GiB allowed: OOMs and the garbage collector come into play.
        fraction = round(rng.uniform(0.5, 2.5) * GIB / device_total, 5)
    split = next((int(p.split(":")[1]) for p in conf.split(",") if p.startswith("max_split_size_mb")), None)
    s = {"name": f"c{master_seed}_{index:05d}", "seed": seed, "conf": conf, "fraction": fraction}
    if rng.random() < 0.3:
        model = rng.choice(MODELS)
        if model == "oom_probe" and fraction is None:
            # Allocating until the device itself is full would starve the other captures.
            s["fraction"] = fraction = round(rng.uniform(0.5, 2.0) * GIB / device_total, 5)
        s.update(kind="model", model=model, params=model_params(rng, model))
    else:
        streams = rng.choice([1, 1, 2, 3])
        n = int(2 ** rng.uniform(4, 12))
        s.update(kind="ops", streams=streams, ops=ops_program(rng, n, streams, fraction, split, "expandable_segments:True" in conf))
    return s


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--count", type=int, required=True)
    ap.add_argument("--start", type=int, default=0, help="first index (to extend a campaign)")
    # An H100 80GB's total_memory; the fraction is chosen to allow 0.5-2.5 GiB of it.
    ap.add_argument("--device-total", type=int, default=85_029_158_912)
    a = ap.parse_args()
    pool = settings_pool(a.seed, a.device_total)
    for i in range(a.start, a.start + a.count):
        sys.stdout.write(json.dumps(spec(a.seed, i, a.device_total, pool), separators=(",", ":")) + "\n")


if __name__ == "__main__":
    main()
