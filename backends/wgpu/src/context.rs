//! `WgpuContext`: the device, its queue, the limits in force, the submission clock and the
//! compiled kernels, shared (through `Arc`) by the backend and the kernel runner.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use cachalot_core::BackendError;

use crate::error::{KernelError, WgpuError};
use crate::pipelines::{Kernel, PipelineKey, Pipelines};
use crate::waiting::{self, lock};

/// Default bound on the memory the backend holds, when none is configured: wgpu cannot tell
/// how much memory a device has, so the allocator needs a number to stop at.
pub const DEFAULT_CAPACITY: u64 = 4 << 30;

/// How the wgpu device is set up and bounded.
#[derive(Clone, Debug)]
pub struct WgpuConfig {
    /// Bytes of segments the backend may hold at once (the device's "total memory" for the
    /// allocator and its out-of-memory message). wgpu has no free-memory query, so this
    /// bound stands in for the device's size.
    pub capacity: u64,
    /// Limits to request from the adapter; `None` requests everything the adapter offers
    /// (wgpu's defaults are far lower: 256 MiB buffers, 16 KiB of workgroup memory).
    pub limits: Option<wgpu::Limits>,
    /// Keep naga's run-time bounds checks and loop bounding in the kernels.
    ///
    /// `true` is the safe choice: an access out of a binding's range is clamped by the shader
    /// itself, whatever a kernel's own guards do. `false` trusts those guards (every kernel of
    /// `cachalot-shaders` tests its indices and the runner validates every binding against the
    /// shape), which saves the checks' time, much of it in the matmul's inner loop (figures in
    /// `BENCHMARKS.md`). The default is `false` natively, where the kernels are ours and the
    /// speed is measured, and `true` in the browser, where a page must never depend on the
    /// kernels being right to stay within its buffers.
    pub runtime_checks: bool,
    /// Ordinal shown as `GPU N` in out-of-memory messages.
    pub device_index: u32,
    /// Adapter preference when [`WgpuContext::request`] picks one.
    pub power_preference: wgpu::PowerPreference,
}

impl Default for WgpuConfig {
    fn default() -> Self {
        WgpuConfig {
            capacity: DEFAULT_CAPACITY,
            limits: None,
            runtime_checks: cfg!(target_arch = "wasm32"),
            device_index: 0,
            power_preference: wgpu::PowerPreference::HighPerformance,
        }
    }
}

impl WgpuConfig {
    /// The default configuration with `capacity` bytes.
    pub fn with_capacity(capacity: u64) -> Self {
        WgpuConfig { capacity, ..WgpuConfig::default() }
    }
}

/// Counts the submissions made through the context and learns which have completed.
///
/// An event of the backend is the count at the time it is recorded: all work submitted so
/// far. wgpu orders one queue, so "submission n has completed" means every use before it has.
#[derive(Debug, Default)]
struct Submissions {
    /// Submissions made (the index of the latest).
    submitted: AtomicU64,
    /// Highest submission known to have completed (advanced by `on_submitted_work_done`).
    completed: Arc<AtomicU64>,
    /// wgpu's index of each submission not yet known to be complete, for precise waits.
    pending: Mutex<VecDeque<(u64, wgpu::SubmissionIndex)>>,
}

/// A wgpu device and queue prepared for cachalot: the limits in force, the configuration, the
/// submission clock that stands in for CUDA events, and the kernels (compiled on first use).
///
/// Share it with `Arc`: the [`crate::WgpuBackend`] (memory) and the [`crate::Kernels`]
/// runner (work) both hold one. Every submission that touches allocations should go through
/// [`WgpuContext::submit`], so that the backend's events see it.
#[derive(Debug)]
pub struct WgpuContext {
    device: wgpu::Device,
    queue: wgpu::Queue,
    info: wgpu::AdapterInfo,
    limits: wgpu::Limits,
    config: WgpuConfig,
    submissions: Submissions,
    /// Errors the device reported outside any error scope (validation, out of memory) and its
    /// loss, as text, oldest first; see [`WgpuContext::take_device_errors`].
    device_errors: Arc<Mutex<Vec<String>>>,
    /// Disjoint ranges for the storage bindings a kernel declares and a call leaves unused
    /// (made on first use; see [`WgpuContext::unused_binding`]).
    unused: std::sync::OnceLock<wgpu::Buffer>,
    pub(crate) pipelines: Pipelines,
}

/// Unused storage bindings one dispatch can have at most (`unused_binding` slots).
const UNUSED_SLOTS: u64 = 8;

impl WgpuContext {
    /// Requests a device from `adapter` with `config.limits` (the adapter's own limits by
    /// default).
    pub async fn new(adapter: &wgpu::Adapter, config: WgpuConfig) -> Result<Arc<Self>, WgpuError> {
        let limits = config.limits.clone().unwrap_or_else(|| adapter.limits());
        let descriptor =
            wgpu::DeviceDescriptor { label: Some("cachalot"), required_limits: limits, ..Default::default() };
        let (device, queue) =
            adapter.request_device(&descriptor).await.map_err(|e| WgpuError::RequestDevice(e.to_string()))?;
        Self::from_device(device, queue, adapter.get_info(), config)
    }

    /// Finds an adapter (honouring `WGPU_BACKEND`, preferring `config.power_preference`) and
    /// requests a device from it. Without an adapter the error is [`WgpuError::NoAdapter`].
    pub async fn request(config: WgpuConfig) -> Result<Arc<Self>, WgpuError> {
        let instance = wgpu::Instance::new(wgpu::InstanceDescriptor {
            backends: wgpu::Backends::all().with_env(),
            ..wgpu::InstanceDescriptor::new_without_display_handle()
        });
        let options = wgpu::RequestAdapterOptions {
            power_preference: config.power_preference,
            force_fallback_adapter: false,
            compatible_surface: None,
            ..Default::default()
        };
        let adapter = instance.request_adapter(&options).await.map_err(|e| WgpuError::NoAdapter(e.to_string()))?;
        Self::new(&adapter, config).await
    }

    /// [`WgpuContext::request`], blocking (not on the web, where nothing may block).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn request_blocking(config: WgpuConfig) -> Result<Arc<Self>, WgpuError> {
        pollster::block_on(Self::request(config))
    }

    /// Wraps a device an application already has (e.g. eframe's). The limits in force are the
    /// device's; `config.limits` is ignored.
    // On the web wgpu's handles are not `Send`; one `Arc` type on every target keeps the API
    // the same, and the browser's main thread is the only thread.
    #[cfg_attr(target_arch = "wasm32", allow(clippy::arc_with_non_send_sync))]
    pub fn from_device(
        device: wgpu::Device,
        queue: wgpu::Queue,
        info: wgpu::AdapterInfo,
        config: WgpuConfig,
    ) -> Result<Arc<Self>, WgpuError> {
        let limits = device.limits();
        // Allocation handles are block addresses; blocks start at multiples of 512 bytes
        // (PyTorch's rounding), which must be valid storage binding offsets.
        if limits.min_storage_buffer_offset_alignment > crate::BLOCK_ALIGNMENT as u32 {
            return Err(WgpuError::Unsupported(format!(
                "min_storage_buffer_offset_alignment is {} bytes, above the allocator's {}-byte block alignment",
                limits.min_storage_buffer_offset_alignment,
                crate::BLOCK_ALIGNMENT
            )));
        }
        let device_errors = Arc::new(Mutex::new(Vec::new()));
        // In the browser an error scope answers only after the event loop ran, so errors the
        // scopes of this crate do not catch at once, and the device's loss, are kept for the
        // page to show. Natively wgpu's default handler (a panic naming the error) stays: an
        // uncaught error there is a bug, never something to read later.
        #[cfg(target_arch = "wasm32")]
        {
            let errors = Arc::clone(&device_errors);
            device.on_uncaptured_error(Arc::new(move |error: wgpu::Error| {
                lock(&errors).push(format!("WebGPU error: {error}"));
            }));
            let errors = Arc::clone(&device_errors);
            device.set_device_lost_callback(move |reason, message| {
                lock(&errors).push(format!("WebGPU device lost ({reason:?}): {message}"));
            });
        }
        Ok(Arc::new(WgpuContext {
            device,
            queue,
            info,
            limits,
            config,
            submissions: Submissions::default(),
            device_errors,
            unused: std::sync::OnceLock::new(),
            pipelines: Pipelines::default(),
        }))
    }

    /// Range `slot` of a small buffer of the context's own, for a storage binding a kernel
    /// declares but a call does not use: `(buffer, offset, size)`. The slots never overlap, as
    /// WebGPU requires of writable bindings of one dispatch (native backends do not check,
    /// browsers do). Slots past the last wrap around.
    pub(crate) fn unused_binding(&self, slot: usize) -> (wgpu::Buffer, u64, u64) {
        // Offsets of storage bindings must be multiples of this (at most 256 on every adapter).
        let stride = u64::from(self.limits.min_storage_buffer_offset_alignment).max(16);
        let buffer = self.unused.get_or_init(|| {
            self.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("cachalot unused bindings"),
                size: stride * UNUSED_SLOTS,
                usage: wgpu::BufferUsages::STORAGE,
                mapped_at_creation: false,
            })
        });
        (buffer.clone(), (slot as u64 % UNUSED_SLOTS) * stride, stride)
    }

    /// Takes the errors the device reported outside an error scope, and its loss, since the
    /// last call (oldest first). Only the browser collects them: natively such an error is a
    /// panic of wgpu's default handler, and this is always empty.
    pub fn take_device_errors(&self) -> Vec<String> {
        std::mem::take(&mut *lock(&self.device_errors))
    }

    /// The device.
    pub fn device(&self) -> &wgpu::Device {
        &self.device
    }

    /// The queue.
    pub fn queue(&self) -> &wgpu::Queue {
        &self.queue
    }

    /// What the adapter says about itself.
    pub fn adapter_info(&self) -> &wgpu::AdapterInfo {
        &self.info
    }

    /// The limits in force on the device.
    pub fn limits(&self) -> &wgpu::Limits {
        &self.limits
    }

    /// The configuration.
    pub fn config(&self) -> &WgpuConfig {
        &self.config
    }

    /// Submits command buffers and returns their submission number (counted from 1). All work
    /// on allocations should be submitted here, so events recorded later cover it.
    pub fn submit(&self, commands: impl IntoIterator<Item = wgpu::CommandBuffer>) -> u64 {
        // The lock keeps numbers in queue order when several threads submit.
        let mut pending = lock(&self.submissions.pending);
        let index = self.queue.submit(commands);
        let number = self.submissions.submitted.fetch_add(1, Ordering::AcqRel) + 1;
        // Drop what is known complete, so the list stays short without anyone polling.
        let completed = self.completed_submission();
        while pending.front().is_some_and(|(n, _)| *n <= completed) {
            pending.pop_front();
        }
        pending.push_back((number, index));
        let completed = Arc::clone(&self.submissions.completed);
        self.queue.on_submitted_work_done(move || {
            completed.fetch_max(number, Ordering::AcqRel);
        });
        number
    }

    /// The latest submission number (0 before the first).
    pub fn last_submission(&self) -> u64 {
        self.submissions.submitted.load(Ordering::Acquire)
    }

    /// The highest submission known to have completed, without asking the device.
    pub fn completed_submission(&self) -> u64 {
        self.submissions.completed.load(Ordering::Acquire)
    }

    /// Whether submission `number` is known to have completed, without asking the device.
    pub fn is_complete(&self, number: u64) -> bool {
        self.completed_submission() >= number
    }

    /// Lets the device run its completion callbacks without blocking (a no-op on the web,
    /// where the browser runs them).
    pub fn poll(&self) -> Result<(), BackendError> {
        self.device.poll(wgpu::PollType::Poll).map_err(|e| BackendError::Device(format!("wgpu poll: {e}")))?;
        self.prune();
        Ok(())
    }

    /// Blocks until submission `number` has completed.
    ///
    /// On the web nothing may block: this returns at once and counts the submission as
    /// complete, which is sound for the allocator because WebGPU runs every later command of
    /// the one queue after the pending work (and keeps a destroyed buffer until the work using
    /// it is done). Counting it complete is what makes the allocator's frees complete at the
    /// same calls as natively, where the wait is real: the browser's own completion callbacks
    /// only run when the page returns to its event loop.
    pub fn wait_for(&self, number: u64) -> Result<(), BackendError> {
        if self.is_complete(number) {
            return Ok(());
        }
        #[cfg(target_arch = "wasm32")]
        {
            self.submissions.completed.fetch_max(number.min(self.last_submission()), Ordering::AcqRel);
            self.prune();
        }
        #[cfg(not(target_arch = "wasm32"))]
        {
            let index = lock(&self.submissions.pending).iter().find(|(n, _)| *n >= number).map(|(_, i)| i.clone());
            let poll = wgpu::PollType::Wait { submission_index: index, timeout: None };
            self.device.poll(poll).map_err(|e| BackendError::Device(format!("wgpu wait: {e}")))?;
            // The wait ran the callbacks up to that submission; make sure of the number.
            self.submissions.completed.fetch_max(number, Ordering::AcqRel);
            self.prune();
        }
        Ok(())
    }

    /// Blocks until everything submitted so far has completed (returns at once on the web).
    pub fn wait_idle(&self) -> Result<(), BackendError> {
        self.wait_for(self.last_submission())
    }

    fn prune(&self) {
        let completed = self.completed_submission();
        let mut pending = lock(&self.submissions.pending);
        while pending.front().is_some_and(|(n, _)| *n <= completed) {
            pending.pop_front();
        }
    }

    /// Runs `f` inside an error scope of `filter` and returns what the scope caught.
    ///
    /// Native wgpu answers at once. On the web the answer would arrive later through the
    /// browser: there no scope is pushed, nothing is returned here, and the error goes to the
    /// device's uncaptured-error handler ([`WgpuContext::take_device_errors`]).
    pub(crate) fn scoped<T>(&self, filter: wgpu::ErrorFilter, f: impl FnOnce() -> T) -> (T, Option<wgpu::Error>) {
        waiting::scoped(&self.device, filter, f)
    }

    /// The pipeline for `key`, compiled now if this is its first use.
    pub(crate) fn kernel(&self, key: PipelineKey) -> Result<Arc<Kernel>, KernelError> {
        self.pipelines.kernel(self.device(), self.config().runtime_checks, key)
    }
}
