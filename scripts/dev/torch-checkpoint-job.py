#!/usr/bin/env python3
"""A torch.compile(mode="reduce-overhead") job whose CUDA-graph tree records graphs off its
current path, so that PyTorch restores the tree's pool to a checkpoint (the allocator's
`setCheckpointPoolState`); every output and gradient is checked against the same model run
eagerly.

    python3 scripts/dev/torch-checkpoint-job.py                # PyTorch's allocator
    CACHALOT=1 python3 scripts/dev/torch-checkpoint-job.py     # cachalot_torch.enable() first
    CAPTURE=OUTDIR python3 scripts/dev/torch-checkpoint-job.py # also writes capture.py's files
    RESULT=FILE ...                                            # the result as JSON, for `compare`
    python3 scripts/dev/torch-checkpoint-job.py compare A.json B.json   # the two runs bit for bit

With CAPTURE, the run is recorded as capture.py records one (history with Python stacks), and
OUTDIR/checkpoint_job.pickle and OUTDIR/checkpoint_job.expected.json are written, the latter with
the graph tree's pool calls (scripts/conformance/pool_calls.py, `PoolCalls.graph_trees()`), so
that `cachalot replay --check OUTDIR/checkpoint_job.pickle` replays the restores too.

Where the restore happens (torch/_inductor/cudagraph_trees.py, CUDAGraphTreeManager._run): a
forward run in training mode leaves its backward pending, so the next compiled call cannot start
a new generation (`can_start_new_generation`) and the replayed forward stays the tree's current
node, its outputs alive. If that call is a function not yet warmed up (a new batch shape, the
model in eval mode: dynamo compiles a new graph), `_run` calls
`apply_checkpoint_execution_state_in_allocator` before warming it up (path_state EXECUTION); if it
is warmed up but has no recorded child there, `_run` calls it before recording it as a new child.
That method calls `torch._C._cuda_setCheckpointPoolState` and then frees the outputs that died
(`_cuda_cudaCachingAllocator_raw_delete`), and, with
`torch._inductor.config.triton.slow_path_cudagraph_asserts` (off here: see below), checks that the
pool's allocated blocks are exactly the live outputs (`checkPoolLiveAllocations`) and that each
live output frees through the allocator (`_has_Standard_Deleter`).

Two phases, each of a few steps of gradient accumulation over two micro-batches:
- shapes: the first micro-batch has 32 rows, the second 48 and 40 rows in turn;
- train/eval: between the training forward and its backward, the model runs in eval mode under
  no_grad.
The job fails unless the tree restored a checkpoint in each phase (its
`debug_checkpointing_counter`). It prints the count, the allocator's memory_allocated and
memory_reserved after each step, and which values differ from eager; `compare` then checks that
two runs (PyTorch's allocator and cachalot) computed every output and gradient bit for bit alike,
restored as many checkpoints and marked the same bytes: a restore that handed back the wrong
memory would change the values after it.
"""
import copy
import json
import os
import pickle
import sys

if sys.argv[1:2] == ["compare"]:
    runs = [json.load(open(path)) for path in sys.argv[2:4]]
    keys = ("checkpoints_restored", "marks", "digests")
    differ = [k for k in keys if runs[0][k] != runs[1][k]]
    print(f"checkpoint job, {runs[0]['allocator']} against {runs[1]['allocator']}: "
          f"{len(runs[0]['digests'])} values, restores {runs[0]['checkpoints_restored']}: "
          + ("equal" if not differ else f"differ in {', '.join(differ)}"))
    sys.exit(1 if differ else 0)

import torch  # noqa: E402

if os.environ.get("CACHALOT") == "1":
    import cachalot_torch

    cachalot_torch.enable()

from torch._inductor import cudagraph_trees  # noqa: E402

# PyTorch's own slow-path asserts fail this job on PyTorch's own allocator (H200, 2.11: "Data
# Pointer: ..., history:" from the pool check after a restore), so they are left at their default;
# `compare` checks the restores' effect on every value instead.
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
torch.manual_seed(0)

D = 256
TOLERANCE = dict(rtol=1e-3, atol=1e-4)


class Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = torch.nn.LayerNorm(D)
        self.up = torch.nn.Linear(D, 4 * D)
        self.down = torch.nn.Linear(4 * D, D)
        self.head = torch.nn.Linear(D, 8)

    def forward(self, x):
        h = x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))
        return self.head(h)


eager = Mlp().cuda()
model = copy.deepcopy(eager)
compiled = torch.compile(model, mode="reduce-overhead", dynamic=False)
marks = []


digests = []  # (what, the compiled value's sum as float.hex, whether it matched eager)


def check(what, got, want):
    """Records the compiled value (to compare allocators bit for bit: `compare` mode) and
    whether it matched eager. PyTorch's own allocator does not match eager everywhere here
    (gradients after a restore, 2.11 on an H200), so a mismatch is reported, not fatal."""
    matched = torch.allclose(got, want, **TOLERANCE)
    digests.append((what, float(got.double().sum().item()).hex(), matched))


def forward(x, what):
    """The compiled model's output on `x`, checked against eager's; both kept for backward."""
    out = compiled(x)
    ref = eager(x)
    check(what, out, ref)
    return out.square().mean(), ref.square().mean()


def backward(losses, what):
    for m in (model, eager):
        m.zero_grad(set_to_none=True)
    sum(c for c, _ in losses).backward()
    sum(e for _, e in losses).backward()
    for (name, p), q in zip(model.named_parameters(), eager.parameters()):
        check(f"{what}: grad of {name}", p.grad, q.grad)


def mark(label):
    torch.cuda.synchronize()
    marks.append({"label": label, "allocated": torch.cuda.memory_allocated(),
                  "reserved": torch.cuda.memory_reserved()})


def shapes(steps=8):
    for s in range(steps):
        first = forward(torch.randn(32, D, device="cuda"), f"shapes step {s}, rows 32")
        rows = (48, 40)[s % 2]
        second = forward(torch.randn(rows, D, device="cuda"), f"shapes step {s}, rows {rows}")
        backward([first, second], f"shapes step {s}")
        mark(f"shapes{s}")


def train_eval(steps=6):
    for s in range(steps):
        x = torch.randn(32, D, device="cuda")
        loss = forward(x, f"train/eval step {s}, train")
        model.eval()
        eager.eval()
        with torch.no_grad():
            probe = torch.randn(24, D, device="cuda")
            check(f"train/eval step {s}, eval", compiled(probe), eager(probe))
        model.train()
        eager.train()
        backward([loss], f"train/eval step {s}")
        mark(f"train_eval{s}")


def checkpoints():
    manager = cudagraph_trees.get_manager(torch.cuda.current_device(), create_if_none_exists=False)
    return 0 if manager is None else manager.debug_checkpointing_counter


capture = os.environ.get("CAPTURE")
if capture:
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "conformance"))
    from pool_calls import PoolCalls

    os.makedirs(capture, exist_ok=True)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    torch.cuda.memory._record_memory_history(max_entries=3_000_000, stacks="python")
    recorder = PoolCalls(torch)
    graph_tree_calls = recorder.graph_trees()
    graph_tree_calls.__enter__()

shapes()
after_shapes = checkpoints()
train_eval()
restored = checkpoints()

if capture:
    torch.cuda.synchronize()
    graph_tree_calls.__exit__(None, None, None)
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    with open(f"{capture}/checkpoint_job.pickle", "wb") as f:
        pickle.dump(snap, f)
    with open(f"{capture}/checkpoint_job.expected.json", "w") as f:
        json.dump({"workload": "checkpoint_job", "torch": torch.__version__, "gpu": torch.cuda.get_device_name(0),
                   "PYTORCH_CUDA_ALLOC_CONF": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""), "memory_fraction": None,
                   "device_total_bytes": torch.cuda.get_device_properties(0).total_memory,
                   "marks": marks, "memory_stats": dict(torch.cuda.memory_stats()),
                   "memory_summary": torch.cuda.memory_summary(), "calls": recorder.calls}, f, indent=1)
result = {"allocator": "cachalot" if os.environ.get("CACHALOT") == "1" else "pytorch",
          "checkpoints_restored": {"shapes": after_shapes, "train_eval": restored - after_shapes},
          "marks": marks, "digests": digests,
          "unlike_eager": [what for what, _, matched in digests if not matched]}
if os.environ.get("RESULT"):
    with open(os.environ["RESULT"], "w") as f:
        json.dump(result, f)
print(json.dumps({k: v for k, v in result.items() if k != "digests"}))
assert after_shapes > 0, "the shapes phase restored no checkpoint: the job no longer tests setCheckpointPoolState"
assert restored > after_shapes, "the train/eval phase restored no checkpoint"
print(f"ok: {len(digests)} outputs and gradients, {len(result['unlike_eager'])} unlike eager")
