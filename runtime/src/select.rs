//! Opening a device: `--backend auto|cuda|wgpu|sim`.
//!
//! `auto` tries CUDA (`cachalot_cuda::probe`, then the kernels, which need NVRTC), then
//! wgpu's best adapter (a software adapter such as Mesa's lavapipe counts, and is named as
//! software), then the simulator, and keeps a line for each: what was taken, and why each
//! backend before it was not.

use cachalot_core::AllocatorConfig;

#[cfg(not(target_arch = "wasm32"))]
use crate::device::cuda::CudaDevice;
use crate::device::sim::{SimDevice, SimProfile};
use crate::device::wgpu::WgpuDevice;
use crate::device::{BackendKind, Device};
use crate::error::RuntimeError;

/// The backend asked for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum BackendRequest {
    /// CUDA, then wgpu, then the simulator.
    #[default]
    Auto,
    /// CUDA only.
    Cuda,
    /// wgpu only.
    Wgpu,
    /// The simulator.
    Sim,
}

impl BackendRequest {
    /// Parses `auto`, `cuda`, `wgpu` or `sim`.
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "auto" => Some(BackendRequest::Auto),
            "cuda" => Some(BackendRequest::Cuda),
            "wgpu" => Some(BackendRequest::Wgpu),
            "sim" => Some(BackendRequest::Sim),
            _ => None,
        }
    }
}

/// How to open the device.
#[derive(Clone, Debug, PartialEq)]
pub struct DeviceOptions {
    /// Which backend.
    pub backend: BackendRequest,
    /// CUDA ordinal, or the index of the wgpu adapter in wgpu's enumeration (`None`: device 0
    /// for CUDA, the best adapter for wgpu).
    pub device: Option<usize>,
    /// The allocator configuration (`PYTORCH_CUDA_ALLOC_CONF` syntax).
    pub config: String,
    /// The simulator's profile (default `cuda-sm90`).
    pub profile: Option<String>,
    /// Device capacity in bytes for wgpu (which cannot query it) and the simulator.
    pub capacity: Option<u64>,
    /// Whether the simulator computes (off: allocations only).
    pub compute: bool,
}

impl Default for DeviceOptions {
    fn default() -> Self {
        DeviceOptions {
            backend: BackendRequest::Auto,
            device: None,
            config: String::new(),
            profile: None,
            capacity: None,
            compute: true,
        }
    }
}

/// What was opened, and why.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Selection {
    /// The backend taken.
    pub backend: BackendKind,
    /// One line per backend considered, in order: taken, or why not.
    pub lines: Vec<String>,
}

/// Parses an allocator configuration (`PYTORCH_CUDA_ALLOC_CONF` syntax) with the error
/// [`open`] gives for it, so a caller can check one before opening anything.
pub fn parse_config(text: &str) -> Result<AllocatorConfig, RuntimeError> {
    AllocatorConfig::parse(text).map_err(|e| {
        RuntimeError::Parameters(format!("allocator config '{}': {e}", cachalot_core::error::shorten(text)))
    })
}

/// Opens the device `options` ask for.
pub fn open(options: &DeviceOptions) -> Result<(Box<dyn Device>, Selection), RuntimeError> {
    let config = parse_config(&options.config)?;
    if options.profile.is_some() && !matches!(options.backend, BackendRequest::Sim | BackendRequest::Auto) {
        return Err(RuntimeError::Parameters("--profile applies to the simulator only (--backend sim)".into()));
    }
    choose(
        options.backend,
        || {
            let (device, description) = open_cuda(options.device.unwrap_or(0), config.clone())?;
            Ok((Box::new(device) as Box<dyn Device>, description))
        },
        || {
            let capacity = options.capacity.unwrap_or(cachalot_wgpu::DEFAULT_CAPACITY);
            let (device, description) = open_wgpu(options.device, capacity, config.clone())?;
            Ok((Box::new(device) as Box<dyn Device>, description))
        },
        || {
            let name = options.profile.as_deref().unwrap_or("cuda-sm90");
            let mut profile = SimProfile::by_name(name).ok_or_else(|| {
                RuntimeError::Parameters(format!(
                    "simulator profile '{name}' (known: {})",
                    SimProfile::NAMES.join(", ")
                ))
            })?;
            if let Some(capacity) = options.capacity {
                profile.capacity = capacity;
            }
            let description = format!(
                "simulator, profile {} ({}; {}), kernels {}",
                profile.name,
                profile.discipline.describe(),
                match profile.workspaces {
                    Some(ws) => format!(
                        "cuBLAS workspace {} B + cuBLASLt {} B",
                        cachalot_core::error::group_digits(ws.cublas),
                        cachalot_core::error::group_digits(ws.cublaslt)
                    ),
                    None => "no workspaces".into(),
                },
                if options.compute { "on the CPU (the reference)" } else { "skipped (allocations only)" }
            );
            let device = SimDevice::new(profile, config.clone(), options.compute)?;
            Ok((Box::new(device) as Box<dyn Device>, description))
        },
    )
}

/// A backend opener for [`choose`]: what was opened and its description, or why it cannot be.
type Opener<'a, T> = Box<dyn FnOnce() -> Result<(T, String), String> + 'a>;

/// The order `--backend` follows, for anything opened per backend (a [`Device`] here, a bench
/// target in [`crate::bench`]): `auto` tries `cuda`, then `wgpu`, then `sim`, which always
/// opens; a named backend is tried alone and its failure is the error. The selection's lines
/// say what was taken and why each backend before it was not.
pub(crate) fn choose<'a, T>(
    request: BackendRequest,
    cuda: impl FnOnce() -> Result<(T, String), String> + 'a,
    wgpu: impl FnOnce() -> Result<(T, String), String> + 'a,
    sim: impl FnOnce() -> Result<(T, String), RuntimeError>,
) -> Result<(T, Selection), RuntimeError> {
    let auto = request == BackendRequest::Auto;
    let mut lines = Vec::new();
    let openers: [(BackendRequest, BackendKind, Opener<'a, T>); 2] = [
        (BackendRequest::Cuda, BackendKind::Cuda, Box::new(cuda)),
        (BackendRequest::Wgpu, BackendKind::Wgpu, Box::new(wgpu)),
    ];
    for (wanted, kind, open) in openers {
        if !auto && request != wanted {
            continue;
        }
        match open() {
            Ok((opened, description)) => {
                lines.push(format!("{}: taken: {description}", kind.name()));
                return Ok((opened, Selection { backend: kind, lines }));
            }
            Err(reason) if auto => lines.push(format!("{}: not usable: {reason}", kind.name())),
            Err(reason) => return Err(RuntimeError::Unavailable { backend: kind.name(), reason }),
        }
    }
    let (opened, description) = sim()?;
    lines.push(format!("sim: taken: {description}"));
    Ok((opened, Selection { backend: BackendKind::Sim, lines }))
}

#[cfg(not(target_arch = "wasm32"))]
fn open_cuda(ordinal: usize, config: AllocatorConfig) -> Result<(CudaDevice, String), String> {
    let description = cachalot_cuda::probe(ordinal).map_err(|e| e.to_string())?;
    let device = CudaDevice::open(ordinal, config).map_err(|e| format!("{description}, but {e}"))?;
    Ok((device, description))
}

/// In the browser there is no CUDA (its driver is a native library).
#[cfg(target_arch = "wasm32")]
fn open_cuda(_ordinal: usize, _config: AllocatorConfig) -> Result<(crate::device::sim::SimDevice, String), String> {
    Err("CUDA is not reachable from a web page; the browser's GPU is reached through WebGPU (wgpu)".into())
}

/// In the browser an adapter can only be awaited: the page requests its WebGPU context first
/// and runs on it with [`crate::execute_on`] and a [`crate::device::wgpu::WgpuDevice`].
#[cfg(target_arch = "wasm32")]
fn open_wgpu(_index: Option<usize>, _capacity: u64, _config: AllocatorConfig) -> Result<(WgpuDevice, String), String> {
    Err("in the browser the WebGPU adapter is requested asynchronously by the page, not opened here".into())
}

#[cfg(not(target_arch = "wasm32"))]
fn open_wgpu(index: Option<usize>, capacity: u64, config: AllocatorConfig) -> Result<(WgpuDevice, String), String> {
    let context = WgpuDevice::request(index, capacity).map_err(|e| e.to_string())?;
    let description = describe_wgpu(&context, capacity);
    let device = WgpuDevice::new(context, config).map_err(|e| e.to_string())?;
    Ok((device, description))
}

/// The adapter of `context` in words, saying so when it is a software one.
pub fn describe_wgpu(context: &cachalot_wgpu::WgpuContext, capacity: u64) -> String {
    let info = context.adapter_info();
    let software = if info.device_type == wgpu::DeviceType::Cpu {
        ", a software adapter: correct but slow, and not a GPU's memory"
    } else {
        ""
    };
    format!(
        "{} ({:?}, {:?}{software}; capacity {} bytes, configured)",
        info.name,
        info.backend,
        info.device_type,
        cachalot_core::error::group_digits(capacity)
    )
}
