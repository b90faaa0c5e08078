//! The proof set of real PyTorch jobs (`scripts/dev/torch-jobs.py`: AMP with a grad scaler,
//! activation checkpointing under expandable segments, a training step captured in a CUDA graph,
//! torch.compile's `reduce-overhead` training and inference, cuDNN autotuning, MemPool, a ragged
//! inference server under roundup_power2_divisions, mixture-of-experts dispatch, an OOM-driven batch-size search under a memory fraction, a convnet fed
//! by pinned-memory prefetch on a side stream, a 64k-vocabulary head with GiB-sized logits under
//! max_split_size_mb, FSDP2 on one rank), each captured with PyTorch 2.11's own allocator on an
//! H200 (`testdata/conformance/jobs`): each must replay to exactly what PyTorch recorded (segment
//! events, final segments, every `memory_stats()` key, `memory_summary()`), the private-pool
//! calls made where the job listed them (MemPool, the graph capture, and the CUDA-graph trees of
//! the compiled jobs, listed by `PoolCalls.graph_trees()`).

#![allow(clippy::unwrap_used, reason = "test helpers outside #[test] functions")]

use std::path::PathBuf;

use cachalot_trace::snapshot::pickle::read_snapshot;

mod common;

#[test]
fn every_job_of_the_proof_set_matches_pytorch() {
    let traces = common::pickles_in(&PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../testdata/conformance/jobs"));
    let names: Vec<String> = traces.iter().map(|p| p.file_stem().unwrap().to_string_lossy().into_owned()).collect();
    let jobs = [
        "amp_gpt",
        "batch_search",
        "checkpointing",
        "compile_ro_infer",
        "compile_ro_train",
        "cudnn_autotune",
        "graph_step",
        "mempool",
        "moe",
        "multi_gib",
        "pinned_prefetch",
        "ragged_server",
        "fsdp2_world1",
    ];
    for job in jobs {
        assert!(names.iter().any(|n| n == job), "testdata/conformance/jobs holds {job}: {names:?}");
    }
    for path in traces {
        common::assert_matches_pytorch(&path);
    }
}

/// A snapshot of a torch.compile job (`mode="reduce-overhead"`, inference), as PyTorch wrote it:
/// frames in code Inductor generated carry an unknown line, written as 2^64 − 1. It reads, and
/// the frame keeps the value PyTorch wrote (`Frame::line` holds it as −1, the same 64 bits).
#[test]
fn a_torch_compile_snapshot_reads_with_its_unknown_lines() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../testdata/conformance/jobs/torch-compile/compile_ro_infer.pickle");
    let snapshot = read_snapshot(&std::fs::read(&path).unwrap()).unwrap();
    let entries: usize = snapshot.device_traces.iter().map(Vec::len).sum();
    assert!(entries > 0, "the job's trace is there");
    let unknown = snapshot
        .device_traces
        .iter()
        .flatten()
        .filter_map(|e| e.context)
        .flat_map(|c| snapshot.contexts.frames(c).iter())
        .filter(|f| f.line as u64 == u64::MAX)
        .count();
    assert!(unknown > 0, "frames with PyTorch's unknown line");
}
