#!/usr/bin/env bash
# cachalot as PyTorch's CUDA allocator (bindings/torch) against PyTorch's own, on the GPU machine,
# in one command.
#
#   here:    scripts/dev/torch-build.sh            # the wheel, the scripts and capture.py into .dev-torch/
#   device:  bash .dev-torch/torch-device.sh [PARTS]   # with carry [".dev-torch"]; results under $OUT
#
# PARTS (default "same features speed"): any of same, jobs, policy, policy-speed, vmm, features, speed, graph, stacks, ddp,
# determinism (the training workloads with PyTorch's deterministic algorithms, twice on PyTorch's
# allocator, and multistream twice: whether PyTorch repeats itself where the first part found
# differences).
# SPEED_ROUNDS (default 100): rounds per speed bench (torch-speed.py).
#
# 1. Same bytes: capture.py's workloads, unchanged, once on each allocator (same seed; the
#    training ones a second time on PyTorch's to see whether its losses repeat at all):
#    torch-compare.py checks every mark, the peak, memory_stats and the losses. cachalot's
#    snapshots (with their expected.json) come back in $OUT/cachalot-runs.tar.gz for
#    `cachalot replay --check`, and open here in torch.cuda._memory_viz.
# jobs: the proof set of real jobs (torch-jobs.py: AMP, checkpointing, a step in a CUDA graph,
#    torch.compile reduce-overhead, cuDNN autotuning, MemPool, a ragged server, MoE, FSDP2 on one
#    rank), each on PyTorch's allocator, on cachalot, and on PyTorch's again (does PyTorch repeat
#    itself?), compared mark by mark; PyTorch's own captures come back in $OUT/jobs-native.tar.gz
#    for `cachalot replay --check` and `cachalot view`. JOBS picks some (default: all).
# policy: the proof set's jobs on PyTorch's allocator under each job's settings and under the
#    setting `cachalot tune` finds best for it, on cachalot, and on policy:cachalot: peaks and
#    device calls (torch-policy.py table -> $OUT/policy.md). policy-speed: their step times,
#    paired (torch-policy.py speed; after policy in the same call, which finds the best settings,
#    or with .dev-torch/best/JOB.conf). vmm: vmm-cost.cu, the driver calls of mapping 14 GiB.
# 2. Speed: per-step times of gpt_train and convnet_train and ns per torch.empty/del:
#    torch-speed.py's three workers side by side (PyTorch's allocator, cachalot, PyTorch's again
#    as the control), short blocks alternating within rounds, pinned to two cores.
# 3. DDP (ddp): torch-ddp.py under torchrun on every GPU there is (NPROC, default all), native,
#    cachalot and native again; marks, peaks and losses per rank compared.
# graph: torch-graph-probe.py's captures that bypass the Python guard; a crash is re-run under
#    cuda-gdb for its backtrace. stacks: torch-stacks.py on both allocators (frames, cost).
# 4. Cross-stream safety (and graph capture, OOM, the torch.cuda patch): torch-features.py on
#    both allocators and on cachalot without its record_stream hook.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${OUT:-/tmp/torch-out}
mkdir -p "$out"
work=$(mktemp -d)
export PYTHONUNBUFFERED=1 CAPTURE_PY=$here/capture.py CACHALOT_TORCH_SHIM_DIR=$work/shim
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
# The wheel, unpacked onto the path (no index on the device; nothing else to install).
python3 -m zipfile -e "$(ls "$here"/cachalot_torch-*.whl | head -1)" "$work/site"
export PYTHONPATH=$work/site
{
python3 -c 'import torch, sys, cachalot_torch; print(sys.version.split()[0], torch.__version__, torch.cuda.get_device_name(0)); print(cachalot_torch.cuda_status(0))'
start=$SECONDS
first=$(python3 -c 'import cachalot_torch, torch; cachalot_torch.enable(); torch.zeros(1, device="cuda"); print("shim built and installed")' 2>&1)
echo "$first" | tail -3
grep -q "shim built and installed" <<<"$first" || { echo "cachalot_torch.enable() fails here: stopping"; exit 1; }
echo "first enable (builds the C++ shim): $((SECONDS - start)) s"

parts=${1:-same features speed}
all_jobs="amp_gpt checkpointing graph_step compile_ro_train compile_ro_infer cudnn_autotune mempool ragged_server moe
    pinned_prefetch batch_search multi_gib fsdp2_world1"
has() { [[ " $parts " == *" $1 "* ]]; }
run() { local mode=$1 dir=$2 w=$3 seed=$4; shift 4
    env "$@" timeout 120 python3 "$here/torch-proof.py" "$mode" "$w" "$work/$dir" "$seed" 2>&1 | tail -1; }
both() { run native native "$@"; run cachalot cachalot "$@"; }
if has same; then
echo "== 1. same bytes"
both seeds 0
both gpt_train 1
both kvcache_infer 2
both multistream 3
both convnet_train 4
both "random_stress@maxsplit" 5 PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:64,roundup_power2_divisions:4
both "gpt_train@expandable" 6 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
both "oom_probe@fraction" 7 CAP_FRACTION=0.02 PYTORCH_CUDA_ALLOC_CONF=garbage_collection_threshold:0.6
both "convnet_train@gc" 8 CAP_FRACTION=0.0025 PYTORCH_CUDA_ALLOC_CONF=garbage_collection_threshold:0.5
both lstm_train 9
both transformer_varlen 10
for w in "gpt_train 1" "convnet_train 4" "lstm_train 9" "transformer_varlen 10"; do run native native2 $w; done
python3 "$here/torch-compare.py" "$work/native" "$work/cachalot" "$work/native2" | tee "$out/same-bytes.md"
echo "compare rc=$?"
for p in "$work"/cachalot/gpt_train.pickle "$work"/cachalot/multistream.pickle; do
    python3 -m torch.cuda._memory_viz trace_plot "$p" -o "$work/$(basename "$p").trace.html" && \
    python3 -m torch.cuda._memory_viz segment_plot "$p" -o "$work/$(basename "$p").segments.html" && \
    echo "_memory_viz opened $(basename "$p"): $(stat -c %s "$work/$(basename "$p").trace.html") B trace plot"
done
tar -C "$work" -czf "$out/cachalot-runs.tar.gz" cachalot native
fi

if has jobs; then
echo "== the proof set: real jobs on both allocators"
for job in ${JOBS:-$all_jobs}; do
    # A compiled job's first run fills Inductor's caches: a run before the three, not compared.
    runs="native cachalot native2"; [[ $job == compile* ]] && runs="warm $runs"
    for run in $runs; do
        mode=${run%2}; [[ $run == warm ]] && mode=native
        PYTORCH_CUDA_ALLOC_CONF=$(python3 "$here/torch-jobs.py" conf "$job") CAPTURE_PY=$here/torch-jobs.py \
            timeout 180 python3 "$here/torch-proof.py" "$mode" "$job" "$work/jobs-$run" 11 > "$work/job-$job-$run.log" 2>&1
        echo "$job $run rc=$?: $(tail -1 "$work/job-$job-$run.log")"
        grep -m3 "Error\|error:" "$work/job-$job-$run.log" | grep -v "^  " | head -3
    done
done
python3 "$here/torch-compare.py" "$work/jobs-native" "$work/jobs-cachalot" "$work/jobs-native2" | tee "$out/jobs.md"
echo "compare rc=$?"
tar -C "$work" -czf "$out/jobs-native.tar.gz" jobs-native jobs-cachalot jobs-native2
fi

if has policy; then
echo "== policy: every job on PyTorch's allocator (its own settings, then tune's best), cachalot, policy:cachalot"
# Peaks and device calls of the proof run, per job and allocator; jobs run four at a time (the
# GPU holds them; peaks are per process), multi_gib alone.
capture() { local mode=$1 job=$2 conf=$3 allocator=$1
    [[ $mode == native2 || $mode == best ]] && allocator=native
    PYTORCH_CUDA_ALLOC_CONF=$conf CAPTURE_PY=$here/torch-jobs.py timeout 300 \
        python3 "$here/torch-proof.py" "$allocator" "$job" "$work/policy/$mode" 11 > "$work/policy-$job-$mode.log" 2>&1
    echo "$job $mode [$conf] rc=$?: $(tail -1 "$work/policy-$job-$mode.log")"; }
batch() { local mode=$1; shift; local n=0
    for job in "$@"; do
        conf=$(python3 "$here/torch-jobs.py" conf "$job")
        [[ $mode == best ]] && conf=$(cat "$work/policy/best-$job.conf" 2>/dev/null || echo "$conf")
        if [[ $job == multi_gib ]]; then wait; capture "$mode" "$job" "$conf"; continue; fi
        capture "$mode" "$job" "$conf" & n=$((n + 1)); ((n % 4 == 0)) && wait
    done; wait; }
jobs_list=${JOBS:-$all_jobs}
# Inductor's caches first, so that compile time does not weigh on one allocator's run.
for job in $jobs_list; do [[ $job == compile* ]] && capture native "$job" "" >/dev/null; done
mkdir -p "$work/policy"
modes=${POLICY_MODES:-native best cachalot policy native2}  # POLICY_MODES: some of them
[[ " $modes " == *" native "* ]] && batch native $jobs_list
for job in $jobs_list; do
    # Settings found before (carried in .dev-torch/best/JOB.conf) are not searched again.
    [ -e "$here/best/$job.conf" ] && { cp "$here/best/$job.conf" "$work/policy/best-$job.conf"; continue; }
    "$here/cachalot" tune "$work/policy/native/$job.pickle" --json > "$work/policy/tune-$job.json" 2> "$work/policy/tune-$job.err"
    python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["winner"]["settings"])' "$work/policy/tune-$job.json" \
        > "$work/policy/best-$job.conf" 2>/dev/null || rm -f "$work/policy/best-$job.conf"
    echo "tune $job: $(cat "$work/policy/best-$job.conf" 2>/dev/null || tail -1 "$work/policy/tune-$job.err")"
done
for mode in best cachalot policy native2; do [[ " $modes " == *" $mode "* ]] && batch $mode $jobs_list; done
python3 "$here/torch-policy.py" table "$work/policy" "$work/policy-speed" | tee "$out/policy.md"
# The same runs as the proof set's: cachalot's exact policy against PyTorch's, PyTorch against itself.
python3 "$here/torch-compare.py" "$work/policy/native" "$work/policy/cachalot" "$work/policy/native2" | tee "$out/jobs.md"
echo "compare rc=$?"
tar -C "$work" -czf "$out/policy-runs.tar.gz" policy
fi

if has policy-speed; then
echo "== policy-speed: step time, paired, on the four allocators"
mkdir -p "$work/policy-speed"
for job in ${JOBS:-$all_jobs}; do
    [[ $job == mempool ]] && continue  # no step that repeats
    conf=$(python3 "$here/torch-jobs.py" conf "$job")
    best=$(cat "$here/best/$job.conf" "$work/policy/best-$job.conf" 2>/dev/null | head -1)
    steps=4; [[ $job == multi_gib || $job == batch_search ]] && steps=2
    PYTORCH_CUDA_ALLOC_CONF=$conf BEST_CONF=${best:-$conf} timeout 240 python3 "$here/torch-policy.py" speed "$job" \
        "$work/policy-speed/$job.jsonl" "${SPEED_ROUNDS:-12}" $steps 2> "$work/policy-speed-$job.err" | cut -c1-400
    echo "$job rc=$?"; grep -m3 "Error" "$work/policy-speed-$job.err"
done
tar -C "$work" -czf "$out/policy-speed.tar.gz" policy-speed
[ -d "$work/policy" ] && python3 "$here/torch-policy.py" table "$work/policy" "$work/policy-speed" | tee "$out/policy.md"
fi

if has checkpoint; then
echo "== checkpoint: a reduce-overhead graph tree restoring its pool (setCheckpointPoolState)"
for mode in native cachalot; do
    env $([[ $mode == cachalot ]] && echo CACHALOT=1) RESULT="$work/checkpoint-$mode.json" timeout 300 \
        python3 "$here/torch-checkpoint-job.py" > "$work/checkpoint-$mode.log" 2>&1
    echo "checkpoint job on $mode: rc=$?"; tail -2 "$work/checkpoint-$mode.log" | cut -c1-600
done
python3 "$here/torch-checkpoint-job.py" compare "$work/checkpoint-native.json" "$work/checkpoint-cachalot.json"
echo "compare rc=$?"
CAPTURE=$work/checkpoint timeout 300 python3 "$here/torch-checkpoint-job.py" > "$work/checkpoint-capture.log" 2>&1
echo "checkpoint capture rc=$?: $(tail -1 "$work/checkpoint-capture.log")"
"$here/cachalot" replay --check "$work/checkpoint/checkpoint_job.pickle" 2>&1 | tail -3
(cd "$work" && tar -czf "$out/checkpoint.tar.gz" checkpoint checkpoint-native.* checkpoint-cachalot.*)
fi

if has oom; then
echo "== oom: a PyTorch job per cause of torch-oom-causes.py, captured for cachalot explain (checked here with --check)"
timeout 240 python3 "$here/torch-oom-causes.py" --jobs "$work/oom" 2>&1 | tail -12
tar -C "$work" -czf "$out/oom.tar.gz" oom
fi

if has vmm; then
echo "== vmm: what backing 14 GiB costs in driver calls"
nvcc -O2 -o "$work/vmm-cost" "$here/vmm-cost.cu" -lcuda -lpthread && "$work/vmm-cost" 14 | tee "$out/vmm-cost.txt"
fi

if has determinism; then
echo "== 1b. losses with deterministic algorithms; does PyTorch repeat itself"
det=(PROOF_DETERMINISTIC=1 CUBLAS_WORKSPACE_CONFIG=:4096:8)
for w in "gpt_train 1" "convnet_train 4" "lstm_train 9" "transformer_varlen 10"; do
    run native det-native $w "${det[@]}"; run cachalot det-cachalot $w "${det[@]}"; run native det-native2 $w "${det[@]}"
done
python3 "$here/torch-compare.py" "$work/det-native" "$work/det-cachalot" "$work/det-native2" | tee "$out/determinism.md"
run native ms-native multistream 3; run native ms-native2 multistream 3; run cachalot ms-cachalot multistream 3
python3 "$here/torch-compare.py" "$work/ms-native" "$work/ms-native2" | tee "$out/multistream-repeat.md"
python3 "$here/torch-compare.py" "$work/ms-native" "$work/ms-cachalot" | tee -a "$out/multistream-repeat.md"
fi

if has features; then
echo "== 4. cross-stream safety, graph capture, OOM, the torch.cuda patch"
for mode in native cachalot cachalot-nohook; do
    timeout 120 python3 "$here/torch-features.py" $mode 2>&1 | tail -1 | tee -a "$out/features.jsonl"
done

fi

if has speed; then
echo "== 2. speed"
pin=(); command -v taskset >/dev/null && pin=(taskset -c 2,3)
for bench in "gpt_train ${SPEED_ROUNDS:-100} 5" "convnet_train ${SPEED_ROUNDS:-100} 10" "alloc ${SPEED_ROUNDS:-100} 2"; do
    timeout 240 "${pin[@]}" python3 "$here/torch-speed.py" $bench 2>"$work/speed-${bench%% *}.err" \
        | tee -a "$out/speed.jsonl" | grep -v '^{' ; echo "rc=$?"; tail -3 "$work/speed-${bench%% *}.err"
done
fi

if has graph; then
echo "== graph capture below the Python guard"
for route in native c-global c-relaxed graph-unguarded; do
    timeout 60 python3 "$here/torch-graph-probe.py" $route > "$work/graph-$route.log" 2>&1
    rc=$?; echo "$route rc=$rc: $(tail -1 "$work/graph-$route.log")" | tee -a "$out/graph.log"
    if [ $rc -ge 128 ] && command -v cuda-gdb >/dev/null; then
        timeout 120 cuda-gdb -q -batch -ex "set pagination off" -ex run -ex bt --args python3 "$here/torch-graph-probe.py" $route 2>&1 \
            | grep -v "^\[New Thread\|^\[Thread" | tail -40 | tee -a "$out/graph.log"
    fi
done
fi

if has stacks; then
echo "== Python stacks in the history"
for mode in native cachalot; do
    timeout 120 python3 "$here/torch-stacks.py" $mode "$work/stacks-$mode.pickle" 2>&1 | tail -1 | tee -a "$out/stacks.jsonl"
done
for mode in native cachalot; do
    python3 -m torch.cuda._memory_viz trace_plot "$work/stacks-$mode.pickle" -o "$work/stacks-$mode.html" && \
        echo "_memory_viz trace_plot opened stacks-$mode.pickle: $(stat -c %s "$work/stacks-$mode.html") B"
    # memory_viz's own reading of the frames (its flame-graph lines of the live blocks)
    python3 - "$work/stacks-$mode.pickle" <<'PY'
import io, pickle, sys
import torch.cuda._memory_viz as viz
data = pickle.load(open(sys.argv[1], "rb"))
out = io.StringIO()
for segment in data["segments"]:
    viz._write_blocks(out, f"stream_{segment['stream']}", segment["blocks"])
print(sys.argv[1].rsplit("/", 1)[-1], "memory_viz block line:", next(l for l in out.getvalue().splitlines() if "make_activations" in l))
PY
done
cp "$work/stacks-cachalot.pickle" "$work/stacks-native.pickle" "$out/" 2>/dev/null
fi

if has ddp; then
echo "== 3. DDP over NCCL"
nproc=${NPROC:-$(nvidia-smi -L | wc -l)}
for run in native cachalot native2; do
    mode=${run%2}
    timeout 180 torchrun --standalone --nproc_per_node "$nproc" "$here/torch-ddp.py" $mode "$work/ddp/$run" 8 > "$work/ddp-$run.log" 2>&1
    echo "torchrun --nproc_per_node $nproc torch-ddp.py $mode: rc=$?"; grep -i "error\|Traceback" "$work/ddp-$run.log" | head -5
done
python3 "$here/torch-ddp.py" compare "$work/ddp" native cachalot native2 | tee "$out/ddp.md"; echo "compare rc=$?"
for p in "$work"/ddp/cachalot/rank*.pickle; do
    python3 -m torch.cuda._memory_viz trace_plot "$p" -o "$p.html" && echo "_memory_viz opened $(basename "$p"): $(stat -c %s "$p.html") B"
done
tar -C "$work/ddp" -czf "$out/ddp-runs.tar.gz" native cachalot
fi
} 2>&1 | tee "$out/log"
