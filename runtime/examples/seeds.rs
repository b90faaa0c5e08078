//! Runs `seeds` on the best device here (CUDA, else wgpu, else the simulator) and prints the
//! marks next to PyTorch 2.11's on an H200.
//!
//! ```sh
//! cargo run --release -p cachalot-runtime --example seeds
//! ```

use cachalot_runtime::{DeviceOptions, Experiment, execute};

/// PyTorch 2.11's marks (`shared/traces/pytorch-2.11-h200/seeds.expected.json`).
const PYTORCH: [(&str, u64, u64); 12] = [
    ("tiny", 512, 2097152),
    ("tiny_del", 0, 2097152),
    ("tiny_empty", 0, 0),
    ("10240x1050", 44040192, 44040192),
    ("empty", 0, 0),
    ("linear_model", 41472, 2097152),
    ("linear_input", 41984512, 44040192),
    ("linear_output", 76997120, 77594624),
    ("linear_empty", 34603008, 35651584),
    ("bw_y", 571473920, 572522496),
    ("bw_after", 839909376, 1109393408),
    ("bw_empty", 34603008, 35651584),
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let run = execute(&Experiment::Seeds, &DeviceOptions::default())?;
    for line in &run.record.selection {
        println!("{line}");
    }
    println!("{:<14} {:>26} {:>26}", "mark", "here (alloc / reserved)", "PyTorch on H200");
    for (mark, (label, allocated, reserved)) in run.marks.iter().zip(PYTORCH) {
        let same = if (mark.allocated, mark.reserved) == (allocated, reserved) { "" } else { "  differs" };
        println!("{label:<14} {:>12} / {:>11} {allocated:>12} / {reserved:>11}{same}", mark.allocated, mark.reserved);
    }
    if run.record.workspaces.is_none() {
        println!(
            "(no cuBLAS/cuBLASLt workspaces on this device: `cachalot compare` shows that this is the whole difference)"
        );
    }
    if let Some(error) = &run.record.error {
        return Err(error.clone().into());
    }
    Ok(())
}
