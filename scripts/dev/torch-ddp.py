#!/usr/bin/env python3
"""Proof 3 of issue 17: DDP training of capture.py's gpt_train over NCCL, every rank on
cachalot, against the same job on PyTorch's allocator.

    torchrun --nproc_per_node N torch-ddp.py MODE OUTDIR [STEPS]   (MODE: native | cachalot)
    torch-ddp.py compare OUTDIR NATIVE CACHALOT [NATIVE2]          (run directories' names)

Each rank: cachalot_torch.enable() first (cachalot mode), the process group (NCCL), the model
of capture.py's gpt_train seeded alike on every rank, wrapped in DistributedDataParallel, each
rank its own batches (seed + rank); history on (stacks="python"); after every step a mark
(memory_allocated and memory_reserved of the rank's device, after synchronize) and the loss as
float.hex. Writes OUTDIR/rank{R}.json and OUTDIR/rank{R}.pickle (the rank's snapshot, through
torch.cuda.memory._dump_snapshot, which is cachalot's on cachalot).

compare: per rank, every mark, the peak reserved and the losses of CACHALOT against NATIVE (and,
with NATIVE2, whether PyTorch repeats its own losses); exits 1 on a differing mark or peak.
"""
import json
import os
import sys


def train(mode, outdir, steps):
    if mode == "cachalot":
        import cachalot_torch
        cachalot_torch.enable()
    elif mode != "native":
        sys.exit(f"torch-ddp.py: MODE is native or cachalot, not {mode!r}")
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dev = torch.device("cuda", local_rank)
    dist.init_process_group("nccl", device_id=dev)
    torch.cuda.memory._record_memory_history(max_entries=3_000_000, stacks="python")
    marks, losses = [], []

    def mark(label):
        torch.cuda.synchronize(dev)
        marks.append({"label": label, "allocated": torch.cuda.memory_allocated(dev),
                      "reserved": torch.cuda.memory_reserved(dev)})

    class Gpt(torch.nn.Module):
        """capture.py's gpt_train model: embedding, causal pre-norm encoder, head."""

        def __init__(self, d=384, layers=4, vocab=8000):
            super().__init__()
            self.emb = torch.nn.Embedding(vocab, d)
            layer = torch.nn.TransformerEncoderLayer(d, 6, 4 * d, batch_first=True, norm_first=True)
            self.body = torch.nn.TransformerEncoder(layer, layers)
            self.head = torch.nn.Linear(d, vocab)

        def forward(self, tokens, mask):
            return self.head(self.body(self.emb(tokens), mask=mask, is_causal=True))

    L, B, vocab = 256, 16, 8000
    torch.manual_seed(1)  # the same initial weights on every rank (DDP also broadcasts rank 0's)
    model = DistributedDataParallel(Gpt(vocab=vocab).to(dev), device_ids=[local_rank])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    mask = torch.nn.Transformer.generate_square_subsequent_mask(L, device=dev)
    mark("model")
    torch.manual_seed(100 + rank)  # each rank its own batches
    for s in range(steps):
        tok = torch.randint(0, vocab, (B, L + 1), device=dev)
        logits = model(tok[:, :-1], mask)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, vocab), tok[:, 1:].reshape(-1))
        losses.append(float(loss.detach().float().item()).hex())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        mark(f"step{s}")
    os.makedirs(outdir, exist_ok=True)
    torch.cuda.memory._dump_snapshot(f"{outdir}/rank{rank}.pickle")
    stats = torch.cuda.memory_stats(dev)
    with open(f"{outdir}/rank{rank}.json", "w") as f:
        json.dump({"mode": mode, "rank": rank, "world": dist.get_world_size(), "device": torch.cuda.get_device_name(dev),
                   "marks": marks, "losses": losses, "peak_reserved": stats["reserved_bytes.all.peak"],
                   "peak_allocated": stats["allocated_bytes.all.peak"]}, f)
    dist.destroy_process_group()


def compare(outdir, native, cachalot, native2=None):
    import glob
    failed = False
    print("| rank | marks (allocated, reserved) | peak reserved PyTorch / cachalot | losses | PyTorch repeats its losses |")
    print("|---|---|---|---|---|")
    for path in sorted(glob.glob(f"{outdir}/{native}/rank*.json")):
        name = os.path.basename(path)
        n = json.load(open(path))
        c = json.load(open(f"{outdir}/{cachalot}/{name}"))
        diffs = [f"{a['label']}: {a['allocated']},{a['reserved']} vs {b['allocated']},{b['reserved']}"
                 for a, b in zip(n["marks"], c["marks"]) if (a["allocated"], a["reserved"]) != (b["allocated"], b["reserved"])]
        if len(n["marks"]) != len(c["marks"]):
            diffs.append(f"{len(n['marks'])} vs {len(c['marks'])} marks")
        repeat = ""
        if native2:
            n2 = json.load(open(f"{outdir}/{native2}/{name}"))
            repeat = "yes" if n2["losses"] == n["losses"] else "no"
        ok = not diffs and n["peak_reserved"] == c["peak_reserved"]
        failed |= not ok
        losses = f"{len(n['losses'])} " + ("bit-identical" if n["losses"] == c["losses"] else "differ")
        print(f"| {n['rank']} of {n['world']} | {len(n['marks'])} " + ("equal" if not diffs else "DIFFER") +
              f" | {n['peak_reserved']:,} / {c['peak_reserved']:,} | {losses} | {repeat} |")
        for d in diffs[:5]:
            print(f"  {name}: {d}", file=sys.stderr)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    if sys.argv[1] == "compare":
        compare(*sys.argv[2:])
    else:
        train(sys.argv[1], sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 8)
