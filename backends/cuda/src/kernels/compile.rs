//! NVRTC: CUDA C to a loaded module, once per process, source and target.
//!
//! The first choice is a CUBIN for the device's own architecture (`sm_XY`): machine code that
//! the driver loads as it is, also when NVRTC is newer than the driver (CUDA's minor-version
//! compatibility covers machine code, not the JIT of newer PTX). If NVRTC cannot make one, or
//! the driver refuses it, PTX for the architecture (`compute_XY`), then PTX for NVRTC's default
//! target, which the driver compiles at load time. cudarc's safe NVRTC layer returns PTX only,
//! so the CUBIN path calls `cudarc::nvrtc::result` / `sys`.

use std::collections::HashMap;
use std::ffi::{CString, c_char};
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::CudaModule;
use cudarc::nvrtc::{CompileOptions, Ptx, result, sys};

use crate::device::CudaDevice;
use crate::error::CudaError;

/// What NVRTC is asked for.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Target {
    /// Machine code for `sm_XY`.
    Cubin(String),
    /// PTX for `compute_XY`, or for NVRTC's default target.
    Ptx(Option<String>),
}

/// Compiles `source` for `target`, through a process-wide cache.
fn compiled(name: &'static str, source: &str, target: &Target) -> Result<Ptx, String> {
    static CACHE: OnceLock<Mutex<HashMap<(&'static str, Target), Ptx>>> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    let key = (name, target.clone());
    if let Some(image) = cache.lock().unwrap_or_else(|p| p.into_inner()).get(&key) {
        return Ok(image.clone());
    }
    let image = match target {
        Target::Cubin(arch) => Ptx::from_binary(cubin(name, source, arch)?),
        Target::Ptx(arch) => {
            let options = CompileOptions {
                name: Some(name.to_string()),
                options: arch.iter().map(|a| format!("--gpu-architecture={a}")).collect(),
                ..Default::default()
            };
            cudarc::nvrtc::compile_ptx_with_opts(source, options).map_err(|e| e.to_string())?
        }
    };
    cache.lock().unwrap_or_else(|p| p.into_inner()).insert(key, image.clone());
    Ok(image)
}

/// Destroys an NVRTC program on drop.
struct Program(sys::nvrtcProgram);

impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: created by `result::create_program`, destroyed once.
        let _ = unsafe { result::destroy_program(self.0) };
    }
}

/// NVRTC to a CUBIN for `arch` (`sm_XY`).
fn cubin(name: &str, source: &str, arch: &str) -> Result<Vec<u8>, String> {
    let source = CString::new(source).map_err(|e| e.to_string())?;
    let name = CString::new(name).map_err(|e| e.to_string())?;
    let program = Program(result::create_program(&source, Some(&name)).map_err(|e| format!("{e:?}"))?);
    let options = [format!("--gpu-architecture={arch}")];
    // SAFETY: a live program; the sources outlive it.
    if let Err(e) = unsafe { result::compile_program(program.0, &options) } {
        // SAFETY: as above.
        let log = unsafe { result::get_program_log(program.0) }.unwrap_or_default();
        let log: Vec<u8> = log.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect();
        return Err(format!("{e:?}: {}", String::from_utf8_lossy(&log)));
    }
    let mut size = 0usize;
    // SAFETY: a compiled program; valid out-pointer.
    unsafe { sys::nvrtcGetCUBINSize(program.0, &mut size) }.result().map_err(|e| format!("{e:?}"))?;
    let mut image = vec![0u8; size];
    // SAFETY: the buffer holds the size NVRTC reported.
    unsafe { sys::nvrtcGetCUBIN(program.0, image.as_mut_ptr() as *mut c_char) }
        .result()
        .map_err(|e| format!("{e:?}"))?;
    if image.is_empty() {
        return Err("NVRTC returned an empty CUBIN".into());
    }
    Ok(image)
}

/// Compiles `source` for `device` and loads it: CUBIN first, then PTX (module docs).
pub(crate) fn load(device: &CudaDevice, name: &'static str, source: &str) -> Result<Arc<CudaModule>, CudaError> {
    let (major, minor) = device.compute_capability();
    let targets = [
        Target::Cubin(format!("sm_{major}{minor}")),
        Target::Ptx(Some(format!("compute_{major}{minor}"))),
        Target::Ptx(None),
    ];
    let mut failures = Vec::new();
    for target in &targets {
        match compiled(name, source, target) {
            Ok(image) => match device.context().load_module(image) {
                Ok(module) => return Ok(module),
                Err(e) => failures.push(format!("{target:?}: loading failed: {e}")),
            },
            Err(e) => failures.push(format!("{target:?}: {e}")),
        }
    }
    Err(CudaError::Compile { source_name: name, message: failures.join("; ") })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Needs only `libnvrtc` (no GPU): skipped where it cannot be loaded.
    #[test]
    fn both_sources_compile_to_cubin_and_ptx() {
        if !crate::device::nvrtc_library_present() {
            eprintln!("skipped: libnvrtc cannot be loaded here");
            return;
        }
        let sources = [
            ("cachalot-shaders/cuda/kernels.cu", cachalot_shaders::cuda::KERNELS, cachalot_shaders::cuda::KERNEL_NAMES),
            (
                "cachalot-cuda/cuda/backend_kernels.cu",
                super::super::BACKEND_KERNELS,
                &[
                    "cachalot_scale",
                    "cachalot_fill_u32",
                    "cachalot_fill_pattern",
                    "cachalot_check_pattern",
                    "cachalot_spin_fill_pattern",
                    "cachalot_sum_partial",
                    "cachalot_sum_final",
                ][..],
            ),
        ];
        for (name, source, kernels) in sources {
            let image = compiled(name, source, &Target::Cubin("sm_90".into())).unwrap();
            assert!(image.as_bytes().is_none(), "a CUBIN is binary");
            for target in [Target::Ptx(Some("compute_90".into())), Target::Ptx(None)] {
                let ptx = compiled(name, source, &target).unwrap().to_src();
                for kernel in kernels {
                    assert!(ptx.contains(&format!(".entry {kernel}(")), "{name}: {kernel} missing for {target:?}");
                }
            }
        }
    }
}
