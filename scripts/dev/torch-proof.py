#!/usr/bin/env python3
"""One workload of ../shared/traces/capture.py on PyTorch's allocator or on cachalot's, unchanged.

    torch-proof.py MODE WORKLOAD OUTDIR SEED      (MODE: native | cachalot | policy; CAPTURE_PY: capture.py;
                                                   PROOF_DETERMINISTIC=1: deterministic algorithms)

capture.py runs as it is: on cachalot, `cachalot_torch.enable()` first, and torch.cuda's memory
functions (memory_allocated/reserved at every mark, memory_stats, memory_summary,
_record_memory_history, _snapshot) are cachalot's through its patch of torch._C. It writes
OUTDIR/TAG.expected.json (marks, memory_stats) and OUTDIR/TAG.pickle (the snapshot with its
trace); this adds OUTDIR/TAG.losses.json, every loss that called backward() as float.hex(), so
torch-compare.py can check them bit for bit.
"""
import json
import os
import runpy
import sys
import time

mode, workload, outdir, seed = sys.argv[1:5]
capture = os.environ.get("CAPTURE_PY", os.path.join(os.path.dirname(__file__), "capture.py"))
started = time.time()
if mode in ("cachalot", "policy"):
    import cachalot_torch
    # policy: cachalot's own placement policy added to the job's settings
    settings = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
    cachalot_torch.enable(config=",".join(filter(None, [settings, "policy:cachalot" if mode == "policy" else ""])))
elif mode != "native":
    sys.exit(f"torch-proof.py: MODE is native, cachalot or policy, not {mode!r}")
import torch  # noqa: E402

if os.environ.get("PROOF_DETERMINISTIC"):
    # PyTorch's own losses differ from run to run where kernels use atomics; its deterministic
    # algorithms (and cuBLAS's fixed workspace, CUBLAS_WORKSPACE_CONFIG) make them repeat, on
    # both allocators alike. warn_only: ops without a deterministic kernel still run.
    torch.use_deterministic_algorithms(True, warn_only=True)

losses = []
backward = torch.Tensor.backward


def recording_backward(self, *args, **kwargs):
    # .item() copies 4 bytes to the host: no device allocation, so the marks are unaffected.
    losses.append(float(self.detach().float().item()).hex())
    return backward(self, *args, **kwargs)


torch.Tensor.backward = recording_backward
os.makedirs(outdir, exist_ok=True)
sys.argv = [capture, workload, outdir, seed]
runpy.run_path(capture, run_name="__main__")
tag = workload.replace("@", "_")
with open(f"{outdir}/{tag}.losses.json", "w") as f:
    json.dump({"mode": mode, "allocator": "native" if mode == "native" else "cachalot",
               "losses": losses, "seconds": round(time.time() - started, 2)}, f)
