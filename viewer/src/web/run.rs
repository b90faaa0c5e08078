//! The experiments of `cachalot run` on the visitor's GPU: `seeds`, `mlp-train`,
//! `matmul-sweep` and `ops` (an uploaded op file) through `cachalot-runtime` on a
//! `cachalot-wgpu` device over the browser's WebGPU — the same `CachingAllocator`, the same
//! WGSL kernels, the same allocator events as natively — or on the simulator with the wgpu
//! profile where the browser has no WebGPU.
//!
//! Nothing here blocks the page. The experiment is the runtime's future
//! ([`cachalot_runtime::execute_async`]): it waits for readbacks (`map_async`) instead of
//! blocking, and the [`LiveRun`]'s pump polls it once per frame, then forwards what the
//! allocator recorded to the viewer; a readback that completes wakes the page up for the next
//! frame. So the views follow the run at least once per step (every step reads its loss back)
//! and the page keeps drawing while the GPU works.
//!
//! Capacity: WebGPU has no free-memory query. The largest segment is the adapter's
//! `maxBufferSize` (the device is requested with the adapter's own limits), and the total is
//! a budget the page shows and the visitor sets; past either, the allocator's out-of-memory
//! error ends the run and the page goes on.

use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, Wake, Waker};

use cachalot_core::AllocatorConfig;
use cachalot_core::error::format_size;
use cachalot_runtime::device::wgpu::WgpuDevice;
use cachalot_runtime::experiments::OpsParams;
use cachalot_runtime::select::describe_wgpu;
use cachalot_runtime::{
    BackendKind, Device, Experiment, MlpParams, RunResult, Runtime, Selection, SimDevice, SimProfile, SweepParams,
    execute_async,
};
use cachalot_trace::snapshot::{pickle, torch};
use cachalot_wgpu::{WgpuConfig, WgpuContext};
use wasm_bindgen::JsCast;

use crate::live::{self, LiveEvent, LiveRun, LiveSender};
use crate::loading::Inbox;
use crate::style;

/// The budget a run starts with: 2 GiB, what `seeds` needs (its peak reserves 1.0 GiB) with
/// room to spare, and within what a browser lends a page on most GPUs.
const DEFAULT_BUDGET_MIB: u64 = 2048;

/// The longest a run that failed on WebGPU waits for the device's next answer, which brings
/// the device's loss if that was the cause (see `WebRuns::start`).
const FAILED_RUN_HOLD: std::time::Duration = std::time::Duration::from_secs(2);

/// Whether and how the page reaches WebGPU.
#[derive(Clone, Debug)]
pub enum Adapter {
    /// The adapter and device are being requested.
    Pending,
    /// The device, and the adapter in words.
    Ready(Arc<WgpuContext>, String),
    /// No WebGPU here, and why.
    Missing(String),
}

/// The experiments the page offers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `seeds`.
    Seeds,
    /// `mlp-train`.
    MlpTrain,
    /// `matmul-sweep`.
    MatmulSweep,
    /// `ops` with an uploaded op file.
    Ops,
}

impl Kind {
    const ALL: [Kind; 4] = [Kind::Seeds, Kind::MlpTrain, Kind::MatmulSweep, Kind::Ops];

    fn name(self) -> &'static str {
        match self {
            Kind::Seeds => "seeds",
            Kind::MlpTrain => "mlp-train",
            Kind::MatmulSweep => "matmul-sweep",
            Kind::Ops => "ops",
        }
    }
}

/// What the visitor chose: the experiment, its settings, the backend and the budget.
#[derive(Clone, Debug)]
pub struct Settings {
    /// The experiment.
    pub kind: Kind,
    /// On WebGPU (`true`) or on the simulator with the wgpu profile.
    pub webgpu: bool,
    /// `mlp-train`: steps.
    pub steps: u32,
    /// `mlp-train`: layer widths, comma-separated.
    pub widths: String,
    /// `mlp-train`: batch sizes, cycled, comma-separated.
    pub batches: String,
    /// `matmul-sweep`: shapes `MxNxK`, comma-separated (empty: the default sweep).
    pub shapes: String,
    /// The allocator configuration, `PYTORCH_CUDA_ALLOC_CONF` syntax.
    pub config: String,
    /// Bytes of segments the run may hold, in MiB.
    pub budget_mib: u64,
    /// The uploaded op file: name and text.
    pub ops: Option<(String, String)>,
}

impl Default for Settings {
    fn default() -> Self {
        let mlp = MlpParams::default();
        Settings {
            kind: Kind::Seeds,
            webgpu: true,
            steps: mlp.steps,
            widths: join(&mlp.widths),
            batches: join(&mlp.batches),
            shapes: String::new(),
            config: String::new(),
            budget_mib: DEFAULT_BUDGET_MIB,
            ops: None,
        }
    }
}

fn join(values: &[usize]) -> String {
    values.iter().map(usize::to_string).collect::<Vec<_>>().join(",")
}

fn parse_list(text: &str, what: &str) -> Result<Vec<usize>, String> {
    text.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| s.parse::<usize>().map_err(|_| format!("{what}: '{s}' is not a whole number")))
        .collect()
}

impl Settings {
    /// The runtime's experiment, or what is wrong with the settings.
    pub fn experiment(&self) -> Result<Experiment, String> {
        Ok(match self.kind {
            Kind::Seeds => Experiment::Seeds,
            Kind::MlpTrain => {
                let params = MlpParams {
                    steps: self.steps,
                    widths: parse_list(&self.widths, "widths")?,
                    batches: parse_list(&self.batches, "batches")?,
                    ..MlpParams::default()
                };
                params.validate().map_err(|e| e.to_string())?;
                Experiment::MlpTrain(params)
            }
            Kind::MatmulSweep => {
                let mut params = SweepParams::default();
                if !self.shapes.trim().is_empty() {
                    params.shapes = self
                        .shapes
                        .split(',')
                        .map(str::trim)
                        .filter(|s| !s.is_empty())
                        .map(|s| {
                            let dims = s.split('x').map(|d| d.trim().parse::<u32>()).collect::<Result<Vec<_>, _>>();
                            match dims.as_deref() {
                                Ok([m, n, k]) => Ok((*m, *n, *k)),
                                _ => Err(format!("shapes: '{s}' is not MxNxK")),
                            }
                        })
                        .collect::<Result<_, _>>()?;
                }
                Experiment::MatmulSweep(params)
            }
            Kind::Ops => {
                let (name, _) = self.ops.as_ref().ok_or("ops: choose an op file first")?;
                Experiment::Ops(OpsParams { path: name.clone(), mark_every: 0, ops_per_second: 0 })
            }
        })
    }

    fn budget(&self) -> u64 {
        self.budget_mib.max(1).saturating_mul(1 << 20)
    }
}

/// How far a run is, for the window and for scripts.
#[derive(Debug, Default)]
pub struct Progress {
    /// The run's name.
    pub name: String,
    /// What it runs on, in the words its errors use (the adapter, or the simulator).
    pub device: String,
    /// Marks recorded so far.
    pub marks: usize,
    /// Trace entries recorded so far.
    pub entries: u64,
    /// The finished run (its record, snapshot and marks).
    pub result: Option<RunResult>,
    /// Errors the GPU reported (validation, device lost) during the run.
    pub device_errors: Vec<String>,
    /// Whether the visitor stopped it.
    pub stopped: bool,
    stop: bool,
    /// Whether the device was lost during the run, not yet answered by a new one.
    device_lost: bool,
}

impl Progress {
    /// Whether the run is still going.
    pub fn running(&self) -> bool {
        self.result.is_none() && !self.stopped
    }
}

/// Wakes the page up (a repaint) when a readback completes.
struct Repaint(egui::Context);

impl Wake for Repaint {
    fn wake(self: Arc<Self>) {
        self.0.request_repaint();
    }
}

/// What the pump has forwarded to the viewer so far.
#[derive(Default)]
struct Forwarded {
    stacks: usize,
    entries: u64,
    marks: usize,
}

impl Forwarded {
    /// Sends the stacks, entries and marks recorded since the last call. The runtime keeps its
    /// trace (it is the run's snapshot), so this reads the new tail rather than clearing it.
    fn forward(&mut self, rt: &Runtime, sender: &LiveSender, progress: &mut Progress) {
        let mut events = Vec::new();
        rt.with_allocator(|allocator| {
            for (i, stack) in allocator.contexts().stacks().iter().enumerate().skip(self.stacks) {
                events.push(LiveEvent::Stack { id: cachalot_core::ContextId(i as u32), frames: stack.to_vec() });
            }
            self.stacks = allocator.contexts().stacks().len();
            let total = allocator.trace_len_total();
            if total > self.entries {
                let trace = allocator.trace();
                let new = ((total - self.entries) as usize).min(trace.len());
                events.push(LiveEvent::Entries(trace[trace.len() - new..].to_vec()));
                self.entries = total;
            }
            for mark in allocator.marks().iter().skip(self.marks) {
                events.push(LiveEvent::Mark(mark.clone()));
            }
            self.marks = allocator.marks().len();
        });
        for event in events {
            sender.send(event);
        }
        progress.entries = self.entries;
        progress.marks = self.marks;
    }
}

/// The page's runs on WebGPU: the adapter, the settings, the current run and the last result.
pub struct WebRuns {
    adapter: Rc<RefCell<Adapter>>,
    /// What the next run will be.
    pub settings: Settings,
    current: Option<Rc<RefCell<Progress>>>,
    error: Option<String>,
    /// What the GPU reported while no run was going (validation errors, the device's loss),
    /// oldest first, until the visitor dismisses them.
    gpu_errors: Vec<String>,
    /// Whether the idle device's answer to a `onSubmittedWorkDone` is awaited (see
    /// [`WebRuns::collect_device_errors`]).
    listening: Arc<AtomicBool>,
    uploads: Inbox,
    /// Whether the window is shown: only when asked for (the page's "Run on this GPU" button),
    /// until closed or a run starts or ends, so that it covers nothing the page shows.
    open: bool,
    /// Whether a run was going at the last frame (its end closes the window).
    was_running: bool,
}

impl Default for WebRuns {
    fn default() -> Self {
        WebRuns {
            adapter: Rc::new(RefCell::new(Adapter::Pending)),
            settings: Settings::default(),
            current: None,
            error: None,
            gpu_errors: Vec::new(),
            listening: Arc::default(),
            uploads: Inbox::default(),
            open: false,
            was_running: false,
        }
    }
}

/// Why the page has no WebGPU, in the visitor's words, or `None` when `navigator.gpu` exists.
fn missing_webgpu() -> Option<String> {
    let window = web_sys::window()?;
    let secure = window.is_secure_context();
    let gpu = js_sys::Reflect::get(&window.navigator(), &"gpu".into()).ok().filter(|v| !v.is_undefined());
    if gpu.is_some() {
        return None;
    }
    Some(if secure {
        "this browser has no WebGPU (navigator.gpu is missing): it does not ship WebGPU, or it is turned off \
         (Chrome/Edge 113+, Safari 26 and Firefox 141+ on Windows have it; elsewhere it may need a flag)"
            .into()
    } else {
        "this page is not a secure context (https or localhost), and browsers offer WebGPU (navigator.gpu) only \
         there: open it as http://localhost or http://127.0.0.1"
            .into()
    })
}

/// Requests a WebGPU adapter and a device with its full limits (the browser's WebGPU only,
/// never WebGL, which has no compute shaders).
async fn request_context() -> Result<(Arc<WgpuContext>, String), String> {
    if let Some(why) = missing_webgpu() {
        return Err(why);
    }
    let instance = wgpu::Instance::new(wgpu::InstanceDescriptor {
        backends: wgpu::Backends::BROWSER_WEBGPU,
        ..wgpu::InstanceDescriptor::new_without_display_handle()
    });
    let options =
        wgpu::RequestAdapterOptions { power_preference: wgpu::PowerPreference::HighPerformance, ..Default::default() };
    let adapter = instance.request_adapter(&options).await.map_err(|e| {
        format!(
            "the browser has WebGPU but gave no adapter ({e}): its GPU may be blocklisted, or WebGPU disabled for \
             this device"
        )
    })?;
    let config = WgpuConfig { capacity: DEFAULT_BUDGET_MIB << 20, ..WgpuConfig::default() };
    let context = WgpuContext::new(&adapter, config).await.map_err(|e| e.to_string())?;
    let mut description = describe_wgpu(&context, context.config().capacity);
    if context.adapter_info().name.trim().is_empty() {
        // wgpu names a browser's adapter by `GPUAdapterInfo.description`, which browsers leave
        // empty unless asked with a permission prompt; the rest of that info names it instead.
        let name = browser_adapter_name().await.unwrap_or_else(|| "unnamed adapter".into());
        description = format!("{name} {}", description.trim_start());
    }
    Ok((context, description))
}

/// The adapter the browser offers, named by its `GPUAdapterInfo` (`vendor`, `architecture`,
/// `device`, `description`, those it fills in: Chromium's SwiftShader is "google swiftshader"),
/// or `None` where it fills in none. wgpu reads only `description`.
async fn browser_adapter_name() -> Option<String> {
    use js_sys::Reflect;
    let gpu = Reflect::get(&web_sys::window()?.navigator(), &"gpu".into()).ok()?;
    let request: js_sys::Function = Reflect::get(&gpu, &"requestAdapter".into()).ok()?.dyn_into().ok()?;
    let options = js_sys::Object::new();
    Reflect::set(&options, &"powerPreference".into(), &"high-performance".into()).ok()?;
    let promise: js_sys::Promise = request.call1(&gpu, &options).ok()?.dyn_into().ok()?;
    let adapter = wasm_bindgen_futures::JsFuture::from(promise).await.ok()?;
    let info = Reflect::get(&adapter, &"info".into()).ok().filter(|i| i.is_object())?;
    let parts: Vec<String> = ["vendor", "architecture", "device", "description"]
        .into_iter()
        .filter_map(|key| Reflect::get(&info, &key.into()).ok()?.as_string())
        .map(|part| part.trim().to_owned())
        .filter(|part| !part.is_empty())
        .collect();
    (!parts.is_empty()).then(|| parts.join(" "))
}

impl WebRuns {
    /// Starts requesting the adapter; the window shows the answer when it comes.
    pub fn request_adapter(&self, ctx: &egui::Context) {
        let (adapter, ctx) = (Rc::clone(&self.adapter), ctx.clone());
        wasm_bindgen_futures::spawn_local(async move {
            // Chromium may refuse the first device of a page that eframe is setting its own
            // WebGPU up in ("A valid external Instance reference no longer exists"); a fresh
            // instance and adapter a moment later get one.
            let mut answer = request_context().await;
            for _ in 0..3 {
                match &answer {
                    Err(why) if why.contains("Instance reference") => {
                        sleep_ms(200).await;
                        answer = request_context().await;
                    }
                    _ => break,
                }
            }
            let answer = match answer {
                Ok((context, description)) => Adapter::Ready(context, description),
                Err(why) => Adapter::Missing(why),
            };
            *adapter.borrow_mut() = answer;
            ctx.request_repaint();
        });
    }

    /// Where the adapter stands.
    pub fn adapter(&self) -> Adapter {
        self.adapter.borrow().clone()
    }

    /// The current (or last) run's progress.
    pub fn current(&self) -> Option<Rc<RefCell<Progress>>> {
        self.current.clone()
    }

    /// Starts a run with the current settings: a live run for the viewer's tabs.
    pub fn start(&mut self, ctx: &egui::Context) -> Result<LiveRun, String> {
        if self.current.as_ref().is_some_and(|p| p.borrow().running()) {
            return Err("a run is going: stop it first".into());
        }
        let settings = self.settings.clone();
        let experiment = settings.experiment()?;
        let config = AllocatorConfig::parse(&settings.config)
            .map_err(|e| format!("allocator config '{}': {e}", settings.config))?;
        let budget = settings.budget();
        let (device, selection, context): (Box<dyn Device>, Selection, Option<Arc<WgpuContext>>) = if settings.webgpu {
            let Adapter::Ready(context, _) = self.adapter() else {
                return Err(match self.adapter() {
                    Adapter::Missing(why) => format!("no WebGPU: {why}. Run it on the simulator instead."),
                    _ => "the WebGPU adapter is still being requested".into(),
                });
            };
            let device = WgpuDevice::with_capacity(Arc::clone(&context), config, budget).map_err(|e| e.to_string())?;
            let line = format!("wgpu: taken: WebGPU in the browser, {}", describe_wgpu(&context, budget));
            (Box::new(device), Selection { backend: BackendKind::Wgpu, lines: vec![line] }, Some(context))
        } else {
            let mut profile = SimProfile::by_name("wgpu").ok_or("the simulator has no wgpu profile")?;
            profile.capacity = budget;
            let device = SimDevice::new(profile, config, true).map_err(|e| e.to_string())?;
            let line = "sim: taken: simulator, profile wgpu (the wgpu device's allocator events), kernels on the CPU";
            (Box::new(device), Selection { backend: BackendKind::Sim, lines: vec![line.into()] }, None)
        };
        if let Some(context) = &context {
            // What the device reported before this run is not this run's: it stays with the
            // window's errors. A device lost since the last frame cannot run it: a new one is
            // requested, as the window does when it sees the loss.
            let earlier = context.take_device_errors();
            let lost = earlier.iter().find(|e| is_device_loss(e)).cloned();
            self.gpu_errors.extend(earlier);
            if let Some(lost) = lost {
                self.renew_device(ctx);
                return Err(format!("{lost}: a new device is being requested; press Run again in a moment"));
            }
        }
        let rt = Rc::new(Runtime::new(device));
        let where_ = if settings.webgpu { "WebGPU" } else { "simulator" };
        let name = format!("{} on {where_} (browser)", experiment.name());
        let mut facts = rt.device_facts();
        let device_label = match (&context, self.adapter()) {
            (Some(_), Adapter::Ready(_, description)) => {
                let adapter = description.split(" (").next().unwrap_or(&description).to_owned();
                if facts.name.trim().is_empty() {
                    // wgpu's name of a browser adapter is mostly empty (see `request_context`).
                    facts.name = adapter.clone();
                }
                format!("WebGPU ({adapter}, a budget of {})", format_size(budget))
            }
            _ => format!("the simulator (wgpu profile, a budget of {})", format_size(budget)),
        };
        let (sender, run) = live::channel();
        let sender = sender.with_repaint(ctx.clone());
        sender.send(LiveEvent::Start { name: name.clone(), device: facts, settings: settings.config.clone() });
        let progress = Rc::new(RefCell::new(Progress { name, device: device_label, ..Progress::default() }));
        self.current = Some(Rc::clone(&progress));
        // The run shows in its tab; the window, if it was open, gives the page back to it.
        self.open = false;

        let ops_text = settings.ops.map(|(_, text)| text);
        let runtime = Rc::clone(&rt);
        let mut future: Option<Pin<Box<dyn Future<Output = RunResult>>>> =
            Some(Box::pin(async move { execute_async(&experiment, &runtime, selection, ops_text.as_deref()).await }));
        let waker = Waker::from(Arc::new(Repaint(ctx.clone())));
        let mut forwarded = Forwarded::default();
        // A run that failed on WebGPU, held until the device's next answer (see below).
        let mut failed: Option<(RunResult, Arc<AtomicBool>, web_time::Instant)> = None;
        let repaint = ctx.clone();
        let pump = move || {
            let mut progress = progress.borrow_mut();
            let take_errors = |progress: &mut Progress| {
                if let Some(context) = &context {
                    // Shown in the window and the console; the run goes on (a `Failed` event
                    // would end the live tab), and the GPU's own next error or the run's end
                    // tells more.
                    for error in context.take_device_errors() {
                        log::error!("{}: {error}", progress.name);
                        progress.device_lost |= is_device_loss(&error);
                        progress.device_errors.push(error);
                    }
                }
            };
            if let Some((_, answered, since)) = &failed {
                take_errors(&mut progress);
                if !answered.load(Ordering::Relaxed) && since.elapsed() < FAILED_RUN_HOLD {
                    repaint.request_repaint_after(std::time::Duration::from_millis(50));
                    return true;
                }
                if let Some((result, ..)) = failed.take() {
                    let error = result.record.error.as_deref().unwrap_or_default();
                    sender.send(LiveEvent::Failed(crate::format::error_on_device(error, &progress.device)));
                    progress.result = Some(result);
                }
                return false;
            }
            let Some(running) = future.as_mut() else { return false };
            if progress.stop || sender.stop_requested() {
                // Dropping the future drops the experiment's tensors: their blocks are freed
                // and the allocator stays consistent, as after any error.
                future = None;
                forwarded.forward(&rt, &sender, &mut progress);
                progress.stopped = true;
                sender.send(LiveEvent::Failed(format!("stopped after {} marks", progress.marks)));
                return false;
            }
            let poll = running.as_mut().poll(&mut Context::from_waker(&waker));
            forwarded.forward(&rt, &sender, &mut progress);
            take_errors(&mut progress);
            let Poll::Ready(result) = poll else { return true };
            future = None;
            if let (Some(_), Some(context)) = (&result.record.error, &context) {
                // A failed readback may be the device's loss, which the browser tells
                // through a callback it delivers with the device's next answer: the run
                // ends once one came (or after a moment), so it says why it failed.
                let answered = Arc::new(AtomicBool::new(false));
                let (flag, ctx) = (Arc::clone(&answered), repaint.clone());
                context.queue().on_submitted_work_done(move || {
                    flag.store(true, Ordering::Relaxed);
                    ctx.request_repaint();
                });
                failed = Some((result, answered, web_time::Instant::now()));
                return true;
            }
            match &result.record.error {
                Some(error) => sender.send(LiveEvent::Failed(crate::format::error_on_device(error, &progress.device))),
                None => {
                    let mut end = result.snapshot.clone();
                    // The trace went out entry by entry; the end state is what the viewer verifies.
                    end.trace.clear();
                    sender.send(LiveEvent::Finished(Some(Box::new(end))));
                }
            }
            progress.result = Some(result);
            false
        };
        Ok(run.with_pump(pump))
    }

    /// Takes what the device reported while no run is going (a run's own errors go to its
    /// progress), and answers a lost device by requesting a new one once no run uses it, so the
    /// next run gets a working device without a reload of the page.
    fn collect_device_errors(&mut self, ctx: &egui::Context) {
        let Adapter::Ready(context, _) = self.adapter() else { return };
        if self.current.as_ref().is_some_and(|p| p.borrow().running()) {
            return;
        }
        // A browser hands the page what its GPU process sent (an error event among it) only
        // while the page awaits an answer of the device: during a run its readbacks, idle
        // nothing, and a validation error would wait unseen (Chromium). So the idle device is
        // asked, once a second, to tell when its (no) work is done; its answer wakes the page,
        // which then shows what came with it.
        if !self.listening.swap(true, Ordering::Relaxed) {
            let (listening, ctx) = (Arc::clone(&self.listening), ctx.clone());
            context.queue().on_submitted_work_done(move || {
                listening.store(false, Ordering::Relaxed);
                ctx.request_repaint_after(std::time::Duration::from_secs(1));
            });
        }
        let new = context.take_device_errors();
        for error in &new {
            log::error!("WebGPU: {error}");
        }
        let lost_in_run = self.current.as_ref().is_some_and(|p| std::mem::take(&mut p.borrow_mut().device_lost));
        let lost = lost_in_run || new.iter().any(|e| is_device_loss(e));
        self.gpu_errors.extend(new);
        if lost {
            self.renew_device(ctx);
        }
    }

    /// Answers the device's loss: says so, and requests a new device for the next run.
    fn renew_device(&mut self, ctx: &egui::Context) {
        self.gpu_errors.push("the WebGPU device is gone: a new one is being requested for the next run".into());
        *self.adapter.borrow_mut() = Adapter::Pending;
        self.request_adapter(ctx);
    }

    /// Makes the device fail, for tests of how the page reports it: `"validation"` creates a
    /// buffer WebGPU forbids (a validation error), `"device-loss"` destroys the device.
    pub fn inject_fault(&self, kind: &str) -> Result<(), String> {
        let Adapter::Ready(context, _) = self.adapter() else { return Err("no WebGPU device".into()) };
        match kind {
            "validation" => {
                // Each with its own label, so no browser takes it for a repeat of the last.
                static INJECTED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
                let n = INJECTED.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
                // Mapped for reading and bound as storage at once: WebGPU allows MAP_READ only
                // with COPY_DST.
                let _buffer = context.device().create_buffer(&wgpu::BufferDescriptor {
                    label: Some(&format!("cachalot fault injection {n}: invalid usage")),
                    size: 256,
                    usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::STORAGE,
                    mapped_at_creation: false,
                });
            }
            "device-loss" => context.device().destroy(),
            other => return Err(format!("unknown fault '{other}': validation or device-loss")),
        }
        Ok(())
    }

    /// Asks the current run to stop (at its next frame).
    pub fn stop(&self) {
        if let Some(progress) = &self.current {
            progress.borrow_mut().stop = true;
        }
    }

    /// The window: the adapter and budget, the experiment and its settings, Run / Stop,
    /// progress, errors and the result's downloads. Returns a run the visitor started.
    pub fn window(&mut self, ctx: &egui::Context) -> Option<LiveRun> {
        self.collect_device_errors(ctx);
        for (name, bytes) in self.uploads.take() {
            match bytes.map(String::from_utf8) {
                Ok(Ok(text)) => self.settings.ops = Some((name, text)),
                Ok(Err(_)) => self.error = Some(format!("{name}: not a text op file")),
                Err(e) => self.error = Some(format!("{name}: {e}")),
            }
        }
        let running = self.current.as_ref().is_some_and(|p| p.borrow().running());
        if self.was_running && !running {
            // The run ended: the page shows it, and says in its notices how it ended.
            self.open = false;
        }
        self.was_running = running;
        let mut started = None;
        let mut open = self.open;
        egui::Window::new("Run on this GPU (WebGPU)")
            .open(&mut open)
            .default_pos([12.0, 60.0])
            .default_width(360.0)
            .show(ctx, |ui| started = self.contents(ui, ctx));
        // Closed by its button, or by a run it started (`start`).
        self.open &= open;
        started
    }

    /// Shows the window (the page's "Run on this GPU (WebGPU)…" button).
    pub fn show_window(&mut self) {
        self.open = true;
    }

    /// Whether the window is shown.
    pub fn window_open(&self) -> bool {
        self.open
    }

    fn contents(&mut self, ui: &mut egui::Ui, ctx: &egui::Context) -> Option<LiveRun> {
        let adapter = self.adapter();
        match &adapter {
            Adapter::Pending => {
                ui.horizontal(|ui| {
                    ui.spinner();
                    ui.label("Requesting a WebGPU adapter…");
                });
            }
            Adapter::Ready(context, description) => {
                ui.label(format!("WebGPU: {description}"));
                let limits = context.limits();
                ui.weak(format!(
                    "largest segment: {} (maxBufferSize); largest operand: {} (maxStorageBufferBindingSize)",
                    format_size(limits.max_buffer_size),
                    format_size(limits.max_storage_buffer_binding_size)
                ));
            }
            Adapter::Missing(why) => {
                ui.colored_label(style::series::OOM, format!("No WebGPU: {why}."));
                ui.label("The same experiment runs on the simulator (wgpu profile, CPU kernels) instead.");
                self.settings.webgpu = false;
            }
        }
        if !self.gpu_errors.is_empty() {
            for error in &self.gpu_errors {
                ui.colored_label(style::series::OOM, error);
            }
            if ui.small_button("dismiss").clicked() {
                self.gpu_errors.clear();
            }
        }
        ui.separator();
        let running = self.current.as_ref().is_some_and(|p| p.borrow().running());
        ui.add_enabled_ui(!running, |ui| self.settings_ui(ui, ctx, &adapter));
        let mut started = None;
        ui.horizontal(|ui| {
            if ui.add_enabled(!running, egui::Button::new("Run")).clicked() {
                match self.start(ctx) {
                    Ok(run) => {
                        self.error = None;
                        started = Some(run);
                    }
                    Err(e) => self.error = Some(e),
                }
            }
            if ui.add_enabled(running, egui::Button::new("Stop")).clicked() {
                self.stop();
            }
            if running {
                ui.spinner();
            }
        });
        if let Some(error) = &self.error {
            ui.colored_label(style::series::OOM, error);
        }
        if let Some(progress) = self.current.clone() {
            self.progress_ui(ui, &progress.borrow());
        }
        started
    }

    fn settings_ui(&mut self, ui: &mut egui::Ui, ctx: &egui::Context, adapter: &Adapter) {
        let s = &mut self.settings;
        ui.horizontal(|ui| {
            ui.label("experiment");
            for kind in Kind::ALL {
                ui.selectable_value(&mut s.kind, kind, kind.name());
            }
        });
        match s.kind {
            Kind::Seeds => {
                ui.weak("PyTorch's memory demonstrations with the sizes of seeds.expected.json.");
            }
            Kind::MlpTrain => {
                ui.horizontal(|ui| {
                    ui.label("steps");
                    ui.add(egui::DragValue::new(&mut s.steps).range(1..=10_000));
                    ui.label("widths");
                    ui.add(egui::TextEdit::singleline(&mut s.widths).desired_width(110.0));
                });
                ui.horizontal(|ui| {
                    ui.label("batches");
                    ui.add(egui::TextEdit::singleline(&mut s.batches).desired_width(110.0));
                });
            }
            Kind::MatmulSweep => {
                ui.horizontal(|ui| {
                    ui.label("shapes");
                    ui.add(egui::TextEdit::singleline(&mut s.shapes).hint_text("64x64x64,127x33x65 (default sweep)"));
                });
            }
            Kind::Ops => {
                ui.horizontal(|ui| {
                    if ui.button("Choose op file…").clicked() {
                        self.uploads.pick_files(ctx.clone());
                    }
                    match &s.ops {
                        Some((name, text)) => ui.label(format!("{name} ({} lines)", text.lines().count())),
                        None => ui.weak("a ID SIZE [STREAM] / f ID lines, as in shared/bench/"),
                    };
                });
            }
        }
        ui.horizontal(|ui| {
            ui.label("PYTORCH_CUDA_ALLOC_CONF");
            ui.add(egui::TextEdit::singleline(&mut s.config).hint_text("e.g. max_split_size_mb:64"));
        });
        ui.horizontal(|ui| {
            ui.label("budget (MiB)");
            ui.add(egui::DragValue::new(&mut s.budget_mib).range(1..=1 << 20));
            ui.weak("the most the run may hold in segments: WebGPU cannot tell free memory");
        });
        ui.horizontal(|ui| {
            ui.label("on");
            let has_gpu = matches!(adapter, Adapter::Ready(..));
            ui.add_enabled_ui(has_gpu, |ui| ui.radio_value(&mut s.webgpu, true, "WebGPU"));
            ui.radio_value(&mut s.webgpu, false, "simulator (wgpu profile)");
        });
    }

    fn progress_ui(&self, ui: &mut egui::Ui, progress: &Progress) {
        ui.separator();
        ui.label(format!(
            "{}: {} marks, {} allocator events{}",
            progress.name,
            progress.marks,
            progress.entries,
            if progress.running() { "…" } else { "" }
        ));
        for error in &progress.device_errors {
            ui.colored_label(style::series::OOM, error);
        }
        let Some(result) = &progress.result else {
            if progress.stopped {
                ui.weak("stopped");
            }
            return;
        };
        match &result.record.error {
            Some(error) => {
                ui.colored_label(
                    style::series::OOM,
                    format!("failed: {}", crate::format::error_on_device(error, &progress.device)),
                );
            }
            None => {
                let checks = &result.record.outcome.checks;
                let passed = checks.iter().filter(|c| c.passed).count();
                if checks.is_empty() {
                    ui.label("finished");
                } else {
                    ui.label(format!("finished: {passed} of {} checks passed", checks.len()));
                }
                for check in checks.iter().filter(|c| !c.passed) {
                    ui.colored_label(style::series::OOM, format!("{}: {}", check.name, check.detail));
                }
                if let Some(loss) = result.record.outcome.losses.last() {
                    ui.label(format!("last loss {loss:.6}"));
                }
            }
        }
        ui.horizontal(|ui| {
            let stem = format!("{}.webgpu", result.record.experiment.name());
            if ui.button("Download snapshot (.json)").clicked() {
                download(&format!("{stem}.json"), &result.snapshot.to_json());
            }
            if ui.button("Download PyTorch pickle").clicked() {
                match torch_pickle(result) {
                    Ok(bytes) => download(&format!("{stem}.pickle"), &bytes),
                    Err(e) => log::error!("cannot write the pickle: {e}"),
                }
            }
        });
    }

    /// The current run as JSON, for scripts that drive the page: the adapter, whether it
    /// runs, and when finished its record, marks and allocator events.
    pub fn status_json(&self) -> String {
        let adapter = match self.adapter() {
            Adapter::Pending => serde_json::json!({ "state": "pending" }),
            Adapter::Ready(context, description) => serde_json::json!({
                "state": "ready",
                "description": description,
                "max_buffer_size": context.limits().max_buffer_size,
                "max_storage_buffer_binding_size": context.limits().max_storage_buffer_binding_size,
            }),
            Adapter::Missing(why) => serde_json::json!({ "state": "missing", "why": why }),
        };
        let run = self.current.as_ref().map(|progress| {
            let progress = progress.borrow();
            let result = progress.result.as_ref().map(|r| {
                let marks: Vec<_> = r
                    .marks
                    .iter()
                    .map(|m| serde_json::json!({ "label": m.label, "allocated": m.allocated, "reserved": m.reserved }))
                    .collect();
                let events: Vec<_> = r
                    .snapshot
                    .trace
                    .iter()
                    .map(|e| serde_json::json!([e.action.name(), e.addr, e.size, e.stream.0]))
                    .collect();
                serde_json::json!({
                    "record": r.record,
                    "marks": marks,
                    "events": events,
                    "summary": r.summary,
                })
            });
            serde_json::json!({
                "name": progress.name,
                "running": progress.running(),
                "stopped": progress.stopped,
                "marks": progress.marks,
                "entries": progress.entries,
                "device_errors": progress.device_errors,
                "result": result,
            })
        });
        serde_json::json!({
            "adapter": adapter,
            "window_open": self.open,
            "budget_mib": self.settings.budget_mib,
            "gpu_errors": self.gpu_errors,
            "run": run,
        })
        .to_string()
    }
}

/// Whether a device error is its loss (`WgpuContext`'s words for the lost callback).
fn is_device_loss(error: &str) -> bool {
    error.starts_with("WebGPU device lost")
}

/// A run's snapshot as PyTorch writes `torch.cuda.memory._snapshot()` (what `_memory_viz`
/// opens).
pub fn torch_pickle(result: &RunResult) -> Result<Vec<u8>, String> {
    let snapshot = torch::from_snapshot(&result.snapshot).map_err(|e| e.to_string())?;
    pickle::write_snapshot(&snapshot).map_err(|e| e.to_string())
}

/// Waits `ms` milliseconds without blocking (a `setTimeout` promise).
pub(crate) async fn sleep_ms(ms: i32) {
    let promise = js_sys::Promise::new(&mut |resolve, _| {
        if let Some(window) = web_sys::window() {
            let _ = window.set_timeout_with_callback_and_timeout_and_arguments_0(&resolve, ms);
        }
    });
    let _ = wasm_bindgen_futures::JsFuture::from(promise).await;
}

/// Offers `bytes` as a download named `name` (a blob URL clicked through an anchor).
fn download(name: &str, bytes: &[u8]) {
    let result = (|| -> Result<(), wasm_bindgen::JsValue> {
        let document = web_sys::window().and_then(|w| w.document()).ok_or("no document")?;
        let parts = js_sys::Array::of1(&js_sys::Uint8Array::from(bytes));
        let blob = web_sys::Blob::new_with_u8_array_sequence(&parts)?;
        let url = web_sys::Url::create_object_url_with_blob(&blob)?;
        let anchor: web_sys::HtmlAnchorElement = document.create_element("a")?.dyn_into()?;
        anchor.set_href(&url);
        anchor.set_download(name);
        anchor.click();
        web_sys::Url::revoke_object_url(&url)?;
        Ok(())
    })();
    if let Err(e) = result {
        log::error!("download of {name} failed: {e:?}");
    }
}
