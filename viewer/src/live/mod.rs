//! Live runs: an experiment feeds trace entries to the viewer while it runs.
//!
//! The viewer depends on no GPU crate, so it runs no GPU experiment by itself: the program
//! showing it hands it a list of [`Experiment`]s through
//! [`crate::app::ViewerApp::with_experiments`], the only way experiments reach the "Run
//! experiment" dialog. Today both such programs, `cachalot view` (crate `cachalot-cli`) and the
//! web page (`web`), hand it [`default_experiments`], the simulator's; an experiment on CUDA or
//! wgpu is one more [`Experiment`] handed over the same way. Starting one returns a
//! [`LiveRun`]: the receiving end of a channel of [`LiveEvent`]s, which the app drains every
//! frame into a growing [`crate::model::Run`]. The sending end, [`LiveSender`], can be moved
//! to the thread that runs the experiment; [`LiveRecorder`] forwards what a
//! `CachingAllocator` recorded since the last call.
//!
//! In the browser there are no threads: a [`LiveRun`] may instead carry a *pump*, a closure
//! the app calls once per frame to advance the experiment a little.
//!
//! [`SimExperiment`] is a built-in source that runs scripted workloads through the real
//! allocator on the simulator, so live runs work (and are tested) without a GPU. Natively,
//! [`device_runs::RuntimeExperiment`] runs any experiment of `cachalot run` on any backend, watched
//! through `cachalot_runtime::stream`. [`save`] turns a finished run back into a file: a
//! cachalot snapshot or a PyTorch snapshot pickle.

#[cfg(not(target_arch = "wasm32"))]
pub mod device_runs;
pub mod ingest;
pub mod save;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;

use cachalot_core::size::MIB;
use cachalot_core::{
    Allocation, AllocatorConfig, Backend, CachingAllocator, ContextId, DeviceFacts, Frame, Mark, SimBackend, StreamId,
    TraceEntry,
};
use cachalot_trace::Snapshot;

/// What an experiment tells the viewer, in order.
#[derive(Clone, Debug)]
pub enum LiveEvent {
    /// The first message: what runs where.
    Start {
        /// Name shown in the viewer.
        name: String,
        /// The device.
        device: DeviceFacts,
        /// The allocator configuration string (`PYTORCH_CUDA_ALLOC_CONF` syntax).
        settings: String,
    },
    /// A stack, sent before the first entry that refers to it (ids are dense, from 0).
    Stack {
        /// Its id in the entries.
        id: ContextId,
        /// Frames, innermost first.
        frames: Vec<Frame>,
    },
    /// Trace entries, oldest first.
    Entries(Vec<TraceEntry>),
    /// A labelled mark.
    Mark(Mark),
    /// The experiment ended; the snapshot (if sent) lets the viewer verify its rebuilt state.
    Finished(Option<Box<Snapshot>>),
    /// The experiment failed.
    Failed(String),
}

/// The longest a live run's news waits for a frame (60 frames/s).
const LIVE_FRAME: std::time::Duration = std::time::Duration::from_millis(16);

/// The hold of a run that is not asked to pause.
const NO_HOLD: u64 = u64::MAX;

/// The viewer's end of a live run.
pub struct LiveRun {
    receiver: mpsc::Receiver<LiveEvent>,
    stop: Arc<AtomicBool>,
    hold: Arc<AtomicU64>,
    pump: Option<Box<dyn FnMut() -> bool>>,
}

impl std::fmt::Debug for LiveRun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LiveRun").field("pumped", &self.pump.is_some()).finish()
    }
}

/// The experiment's end of a live run. Cheap to clone; every method ignores a viewer that
/// went away (the experiment should then look at [`LiveSender::stop_requested`]).
#[derive(Clone, Debug)]
pub struct LiveSender {
    sender: mpsc::Sender<LiveEvent>,
    stop: Arc<AtomicBool>,
    hold: Arc<AtomicU64>,
    repaint: Option<egui::Context>,
}

/// A connected sender and receiver.
pub fn channel() -> (LiveSender, LiveRun) {
    let (sender, receiver) = mpsc::channel();
    let stop = Arc::new(AtomicBool::new(false));
    let hold = Arc::new(AtomicU64::new(NO_HOLD));
    (
        LiveSender { sender, stop: stop.clone(), hold: hold.clone(), repaint: None },
        LiveRun { receiver, stop, hold, pump: None },
    )
}

impl LiveSender {
    /// Sends an event (and wakes the viewer up within a frame at 60 frames/s: a run streams
    /// hundreds of batches a second, and a repaint for each would draw as many frames, each
    /// taking CPU time from the run).
    pub fn send(&self, event: LiveEvent) {
        let _ = self.sender.send(event);
        if let Some(ctx) = &self.repaint {
            ctx.request_repaint_after(LIVE_FRAME);
        }
    }

    /// Whether the viewer asked the experiment to stop.
    pub fn stop_requested(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    /// Whether the viewer asked the experiment to wait once `entries_sent` entries went out
    /// ([`LiveRun::hold_at`]). An experiment that honours it calls this after sending and waits
    /// (on a thread) while it is true and no stop was requested.
    pub fn held(&self, entries_sent: u64) -> bool {
        entries_sent >= self.hold.load(Ordering::Relaxed) && !self.stop_requested()
    }

    /// Wakes `ctx` whenever something is sent.
    pub fn with_repaint(mut self, ctx: egui::Context) -> Self {
        self.repaint = Some(ctx);
        self
    }
}

impl LiveRun {
    /// Adds a closure the app calls once per frame to advance the experiment (for the browser,
    /// which has no threads); it returns `false` once the experiment is done.
    pub fn with_pump(mut self, pump: impl FnMut() -> bool + 'static) -> Self {
        self.pump = Some(Box::new(pump));
        self
    }

    /// Asks the experiment to stop.
    pub fn request_stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
    }

    /// Whether a stop was asked for.
    pub fn stop_requested(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    /// Asks the experiment to pause once it has sent `entries` entries (experiments on a thread
    /// that honour [`LiveSender::held`]), so that the viewer can show, or a headless run take a
    /// picture of, a moment in the middle of a run while the device still holds it.
    pub fn hold_at(&self, entries: u64) {
        self.hold.store(entries, Ordering::Relaxed);
    }

    /// Lets a held experiment go on.
    pub fn release(&self) {
        self.hold.store(NO_HOLD, Ordering::Relaxed);
    }

    /// Runs the pump once (if any) and returns every event that arrived. `connected` turns
    /// false when the sender is gone and nothing is left.
    pub fn poll(&mut self) -> (Vec<LiveEvent>, bool) {
        if let Some(pump) = &mut self.pump
            && !pump()
        {
            self.pump = None;
        }
        let mut events = Vec::new();
        loop {
            match self.receiver.try_recv() {
                Ok(event) => events.push(event),
                Err(mpsc::TryRecvError::Empty) => return (events, true),
                Err(mpsc::TryRecvError::Disconnected) => return (events, self.pump.is_some()),
            }
        }
    }
}

/// Something the viewer can start and watch.
pub trait Experiment {
    /// Name in the menu.
    fn name(&self) -> String;
    /// One line on what it does.
    fn description(&self) -> String;
    /// Backends it can run on (e.g. `"sim"`, `"cuda"`, `"wgpu"`).
    fn backends(&self) -> Vec<String>;
    /// Starts it on `backend`; `ctx` is for waking the viewer up.
    fn start(&self, backend: &str, ctx: &egui::Context) -> Result<LiveRun, String>;
}

/// Forwards what an allocator recorded to a [`LiveSender`].
///
/// It takes the allocator's history and clears it on every [`LiveRecorder::forward`], so the
/// allocator's own buffer stays small; new stacks are sent before the entries using them.
#[derive(Debug)]
pub struct LiveRecorder {
    sender: LiveSender,
    stacks_sent: usize,
    marks_sent: usize,
    entries_sent: u64,
}

impl LiveRecorder {
    /// Starts history recording on `allocator` and sends the `Start` event.
    pub fn start<B: Backend>(sender: LiveSender, name: &str, allocator: &mut CachingAllocator<B>) -> Self {
        allocator.record_history(true, usize::MAX, &[], true);
        sender.send(LiveEvent::Start {
            name: name.to_owned(),
            device: allocator.device().clone(),
            settings: allocator.config().settings().to_owned(),
        });
        LiveRecorder { sender, stacks_sent: 0, marks_sent: 0, entries_sent: 0 }
    }

    /// Sends what was recorded since the last call.
    pub fn forward<B: Backend>(&mut self, allocator: &mut CachingAllocator<B>) {
        let stacks = allocator.contexts().stacks();
        for (i, stack) in stacks.iter().enumerate().skip(self.stacks_sent) {
            self.sender.send(LiveEvent::Stack { id: ContextId(i as u32), frames: stack.to_vec() });
        }
        self.stacks_sent = stacks.len();
        let entries = allocator.trace();
        if !entries.is_empty() {
            self.entries_sent += entries.len() as u64;
            // Clearing keeps the allocator's copy small (a core `trace_since` would avoid it).
            allocator.record_history(true, usize::MAX, &[], true);
            self.sender.send(LiveEvent::Entries(entries));
        }
        let marks = allocator.marks();
        for mark in marks.iter().skip(self.marks_sent) {
            self.sender.send(LiveEvent::Mark(mark.clone()));
        }
        self.marks_sent = marks.len();
    }

    /// Sends the rest and `Finished` with the allocator's end state.
    pub fn finish<B: Backend>(mut self, allocator: &mut CachingAllocator<B>, source: &str) {
        self.forward(allocator);
        let mut snapshot = Snapshot::capture(allocator, source);
        // The trace went out entry by entry; the end state is what the viewer verifies.
        snapshot.trace.clear();
        self.sender.send(LiveEvent::Finished(Some(Box::new(snapshot))));
    }

    /// The sender (to check for a stop request).
    pub fn sender(&self) -> &LiveSender {
        &self.sender
    }

    /// Entries forwarded so far.
    pub fn entries_sent(&self) -> u64 {
        self.entries_sent
    }
}

/// Scripted workloads run live on the simulator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SimWorkload {
    /// A transformer-like training loop: weights kept, activations grown then freed each step,
    /// with a second stream for gradient buckets (frees that wait for it).
    TrainingLoop,
    /// A KV cache that grows by concatenation: fragmentation, then `empty_cache`.
    KvCache,
}

/// Runs a [`SimWorkload`] through the real allocator on the simulator, live.
#[derive(Clone, Debug)]
pub struct SimExperiment {
    /// What to run.
    pub workload: SimWorkload,
    /// Steps (training steps or decode tokens).
    pub steps: usize,
    /// Operations per pump call or between pauses on a thread.
    pub ops_per_tick: usize,
    /// Pause between ticks on a thread (milliseconds), so the run can be watched.
    pub tick_ms: u64,
}

impl SimExperiment {
    /// A training loop of `steps` steps.
    pub fn training(steps: usize) -> Self {
        SimExperiment { workload: SimWorkload::TrainingLoop, steps, ops_per_tick: 40, tick_ms: 15 }
    }

    /// KV-cache decoding of `steps` tokens.
    pub fn kv_cache(steps: usize) -> Self {
        SimExperiment { workload: SimWorkload::KvCache, steps, ops_per_tick: 10, tick_ms: 15 }
    }
}

/// The state of a running [`SimExperiment`]: advanced a few operations at a time.
pub struct SimRunner {
    allocator: CachingAllocator<SimBackend>,
    recorder: LiveRecorder,
    script: Vec<ScriptOp>,
    next: usize,
    ops_per_tick: usize,
    handles: Vec<Option<Allocation>>,
    name: String,
    stacks: Vec<ContextId>,
    done: bool,
}

#[derive(Clone, Debug)]
enum ScriptOp {
    Alloc { id: usize, size: u64, stream: StreamId, stack: usize },
    Free { id: usize },
    RecordStream { id: usize, stream: StreamId },
    FinishStream(StreamId),
    EmptyCache,
    Mark(String),
}

impl SimRunner {
    /// Sets the allocator up and sends the `Start` event.
    pub fn new(experiment: &SimExperiment, sender: LiveSender) -> Result<Self, String> {
        let backend = SimBackend::new(80 << 30).with_name("simulated 80 GiB GPU");
        let mut allocator = CachingAllocator::new(backend, AllocatorConfig::default()).map_err(|e| e.to_string())?;
        let name = match experiment.workload {
            SimWorkload::TrainingLoop => "training loop (simulator)",
            SimWorkload::KvCache => "KV-cache decoding (simulator)",
        };
        let recorder = LiveRecorder::start(sender, name, &mut allocator);
        let frames = |file: &str, line: i64, function: &str| {
            vec![
                Frame { filename: file.into(), line, name: function.into() },
                Frame { filename: "run.py".into(), line: 12, name: "main".into() },
            ]
        };
        let stacks = [
            frames("model.py", 31, "Linear.__init__"),
            frames("model.py", 58, "Attention.forward"),
            frames("model.py", 77, "MLP.forward"),
            frames("train.py", 40, "loss.backward"),
            frames("optim.py", 112, "AdamW.step"),
            frames("decode.py", 25, "torch.cat"),
        ]
        .iter()
        .map(|f| allocator.intern_context(f))
        .collect();
        let script = match experiment.workload {
            SimWorkload::TrainingLoop => training_script(experiment.steps),
            SimWorkload::KvCache => kv_script(experiment.steps),
        };
        let handles = vec![None; script.len()];
        Ok(SimRunner {
            allocator,
            recorder,
            script,
            next: 0,
            ops_per_tick: experiment.ops_per_tick.max(1),
            handles,
            name: name.to_owned(),
            stacks,
            done: false,
        })
    }

    /// Runs up to `ops_per_tick` operations and forwards their entries; `false` once finished
    /// (or stopped).
    pub fn tick(&mut self) -> bool {
        if self.done {
            return false;
        }
        if self.recorder.sender().stop_requested() {
            self.script.truncate(self.next);
        }
        let end = (self.next + self.ops_per_tick).min(self.script.len());
        for i in self.next..end {
            if let Err(e) = self.run_op(i) {
                self.recorder.sender().send(LiveEvent::Failed(e));
                self.done = true;
                return false;
            }
        }
        self.next = end;
        self.recorder.forward(&mut self.allocator);
        if self.next >= self.script.len() {
            let recorder = std::mem::replace(&mut self.recorder, LiveRecorder::detached());
            recorder.finish(&mut self.allocator, &self.name);
            self.done = true;
            return false;
        }
        true
    }

    fn run_op(&mut self, i: usize) -> Result<(), String> {
        match self.script[i].clone() {
            ScriptOp::Alloc { id, size, stream, stack } => {
                self.allocator.set_context(self.stacks.get(stack).copied());
                let a = self.allocator.malloc(size, stream).map_err(|e| e.to_string())?;
                if let Some(slot) = self.handles.get_mut(id) {
                    *slot = Some(a);
                }
            }
            ScriptOp::Free { id } => {
                self.allocator.set_context(None);
                if let Some(a) = self.handles.get_mut(id).and_then(Option::take) {
                    self.allocator.free(a).map_err(|e| e.to_string())?;
                }
            }
            ScriptOp::RecordStream { id, stream } => {
                if let Some(Some(a)) = self.handles.get(id) {
                    self.allocator.backend_mut().hold_stream(stream);
                    self.allocator.record_stream(a, stream).map_err(|e| e.to_string())?;
                }
            }
            ScriptOp::FinishStream(stream) => self.allocator.backend_mut().finish_stream(stream),
            ScriptOp::EmptyCache => {
                for s in 1..4 {
                    self.allocator.backend_mut().finish_stream(StreamId(s));
                }
                self.allocator.empty_cache().map_err(|e| e.to_string())?;
            }
            ScriptOp::Mark(label) => self.allocator.mark(label),
        }
        Ok(())
    }
}

impl LiveRecorder {
    /// A recorder connected to nothing (after `finish` took the real one).
    fn detached() -> Self {
        let (sender, _) = channel();
        LiveRecorder { sender, stacks_sent: 0, marks_sent: 0, entries_sent: 0 }
    }
}

fn training_script(steps: usize) -> Vec<ScriptOp> {
    let mut ops = Vec::new();
    let mut id = 0;
    let mut alloc = |ops: &mut Vec<ScriptOp>, size: u64, stream: u64, stack: usize| {
        ops.push(ScriptOp::Alloc { id, size, stream: StreamId(stream), stack });
        id += 1;
        id - 1
    };
    let layers = 6;
    let mut weights = Vec::new();
    for l in 0..layers {
        weights.push(alloc(&mut ops, 12 * MIB + l as u64 * 4096, 0, 0));
        weights.push(alloc(&mut ops, 4 * MIB, 0, 0));
        weights.push(alloc(&mut ops, 3072, 0, 0));
    }
    ops.push(ScriptOp::Mark("weights loaded".into()));
    let mut optimizer_state: Vec<usize> = Vec::new();
    for step in 0..steps {
        let batch = 1 + (step % 3) as u64;
        let mut activations = Vec::new();
        for l in 0..layers {
            activations.push(alloc(&mut ops, batch * 6 * MIB + l as u64 * 512, 0, 1));
            let scratch = alloc(&mut ops, batch * 24 * MIB, 0, 2);
            activations.push(alloc(&mut ops, batch * 700 * 1024, 0, 2));
            ops.push(ScriptOp::Free { id: scratch });
        }
        let mut grads = Vec::new();
        for (l, a) in activations.iter().rev().enumerate() {
            let g = alloc(&mut ops, 8 * MIB + (l as u64 % 3) * MIB, 0, 3);
            ops.push(ScriptOp::Free { id: *a });
            if l % 2 == 0 {
                // Gradient buckets are reduced on a side stream: their frees wait for it.
                ops.push(ScriptOp::RecordStream { id: g, stream: StreamId(1) });
            }
            grads.push(g);
        }
        if optimizer_state.is_empty() {
            for _ in 0..weights.len() / 3 {
                optimizer_state.push(alloc(&mut ops, 24 * MIB, 0, 4));
            }
        }
        for g in grads {
            ops.push(ScriptOp::Free { id: g });
        }
        // The side stream's reductions finish during the optimizer step.
        ops.push(ScriptOp::FinishStream(StreamId(1)));
        ops.push(ScriptOp::Mark(format!("step {step}")));
        if step + 1 == steps / 2 {
            ops.push(ScriptOp::EmptyCache);
        }
    }
    ops
}

fn kv_script(tokens: usize) -> Vec<ScriptOp> {
    let mut ops = Vec::new();
    let mut id = 0;
    let mut cache: Vec<usize> = Vec::new();
    let heads = 4;
    for _ in 0..heads {
        ops.push(ScriptOp::Alloc { id, size: 64 * 1024, stream: StreamId::DEFAULT, stack: 5 });
        cache.push(id);
        id += 1;
    }
    for t in 0..tokens {
        for cached in cache.iter_mut() {
            // torch.cat: a new, bigger cache, then the old one is freed.
            let size = 64 * 1024 * (t as u64 + 2);
            ops.push(ScriptOp::Alloc { id, size, stream: StreamId::DEFAULT, stack: 5 });
            ops.push(ScriptOp::Free { id: *cached });
            *cached = id;
            id += 1;
        }
        let logits = id;
        ops.push(ScriptOp::Alloc { id, size: 3 * MIB, stream: StreamId::DEFAULT, stack: 2 });
        id += 1;
        ops.push(ScriptOp::Free { id: logits });
        if t % 16 == 15 {
            ops.push(ScriptOp::Mark(format!("token {}", t + 1)));
        }
    }
    for c in cache {
        ops.push(ScriptOp::Free { id: c });
    }
    ops.push(ScriptOp::EmptyCache);
    ops
}

impl Experiment for SimExperiment {
    fn name(&self) -> String {
        match self.workload {
            SimWorkload::TrainingLoop => format!("Training loop, {} steps", self.steps),
            SimWorkload::KvCache => format!("KV-cache decoding, {} tokens", self.steps),
        }
    }

    fn description(&self) -> String {
        match self.workload {
            SimWorkload::TrainingLoop => {
                "Weights, activations, gradients on a side stream and AdamW state; empty_cache halfway.".into()
            }
            SimWorkload::KvCache => "A KV cache grown with torch.cat: fragmentation, then empty_cache.".into(),
        }
    }

    fn backends(&self) -> Vec<String> {
        vec!["sim".into()]
    }

    fn start(&self, backend: &str, ctx: &egui::Context) -> Result<LiveRun, String> {
        if backend != "sim" {
            return Err(format!("{} runs only on the simulator, not on {backend}", self.name()));
        }
        let (sender, run) = channel();
        let sender = sender.with_repaint(ctx.clone());
        #[cfg(not(target_arch = "wasm32"))]
        {
            let experiment = self.clone();
            std::thread::Builder::new()
                .name("cachalot-live".into())
                .spawn(move || match SimRunner::new(&experiment, sender.clone()) {
                    Ok(mut runner) => {
                        while runner.tick() {
                            std::thread::sleep(std::time::Duration::from_millis(experiment.tick_ms));
                        }
                    }
                    Err(e) => sender.send(LiveEvent::Failed(e)),
                })
                .map_err(|e| format!("cannot start a thread: {e}"))?;
            Ok(run)
        }
        #[cfg(target_arch = "wasm32")]
        {
            let mut runner = SimRunner::new(self, sender)?;
            Ok(run.with_pump(move || runner.tick()))
        }
    }
}

/// The built-in experiments, workloads on the simulator ([`SimExperiment`]): what `cachalot
/// view` and the web page hand to [`crate::app::ViewerApp::with_experiments`].
pub fn default_experiments() -> Vec<Box<dyn Experiment>> {
    vec![Box::new(SimExperiment::training(12)), Box::new(SimExperiment::kv_cache(96))]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sim_runner_streams_a_run_the_viewer_can_verify() {
        let (sender, mut live) = channel();
        let mut runner = SimRunner::new(&SimExperiment::training(3), sender).unwrap();
        while runner.tick() {}
        let (events, _) = live.poll();
        assert!(matches!(events.first(), Some(LiveEvent::Start { .. })));
        assert!(matches!(events.last(), Some(LiveEvent::Finished(Some(_)))));
        let entries: usize = events.iter().map(|e| if let LiveEvent::Entries(v) = e { v.len() } else { 0 }).sum();
        assert!(entries > 300, "{entries}");
    }
}
