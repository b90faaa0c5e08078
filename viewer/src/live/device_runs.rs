//! The experiments of `cachalot run` (`seeds`, `mlp-train`, `matmul-sweep`, `ops FILE`) as live
//! runs, on any backend: [`RuntimeExperiment`] opens the device on a worker thread, runs the
//! experiment with a [`LiveSink`] watching it (`cachalot_runtime::stream`) and sends the
//! viewer the allocator's entries in the runtime's batches, then `Finished` with the run's
//! end state and record: the snapshot `cachalot run` would have written, less the trace the
//! viewer already has.

use cachalot_core::DeviceFacts;
use cachalot_runtime::stream::{TraceBatch, TraceSink};
use cachalot_runtime::{BackendRequest, DeviceOptions, Experiment as RuntimeRun, MlpParams, SweepParams};

use super::{Experiment, LiveEvent, LiveRun, LiveSender, channel};

/// The backends a runtime experiment runs on, as `--backend` names them.
pub const BACKENDS: [&str; 4] = ["auto", "cuda", "wgpu", "sim"];

/// An experiment of `cachalot-runtime` with the options of the device it opens.
#[derive(Clone, Debug)]
pub struct RuntimeExperiment {
    /// The experiment and its parameters.
    pub experiment: RuntimeRun,
    /// How to open the device; its `backend` is the one offered first.
    pub options: DeviceOptions,
}

impl RuntimeExperiment {
    /// `experiment` on the device `options` describe.
    pub fn new(experiment: RuntimeRun, options: DeviceOptions) -> Self {
        RuntimeExperiment { experiment, options }
    }

    /// Runs the experiment on this thread with `sender` receiving what happens: `Start`, the
    /// batches, then `Finished` with the end state, or `Failed` if the device cannot be opened.
    pub fn run(&self, backend: BackendRequest, sender: LiveSender) {
        let options = DeviceOptions { backend, ..self.options.clone() };
        let (device, selection) = match cachalot_runtime::open(&options) {
            Ok(opened) => opened,
            Err(e) => return sender.send(LiveEvent::Failed(e.to_string())),
        };
        let name = format!("{} on {}", self.name(), selection.backend.name());
        let sink = LiveSink::new(sender.clone(), name);
        let result = cachalot_runtime::execute_watched(&self.experiment, device, selection, Box::new(sink));
        let mut snapshot = result.snapshot;
        // The entries went out in batches; the end state is what the viewer verifies them by.
        snapshot.trace = Vec::new();
        sender.send(LiveEvent::Finished(Some(Box::new(snapshot))));
    }
}

impl Experiment for RuntimeExperiment {
    fn name(&self) -> String {
        match &self.experiment {
            RuntimeRun::Seeds => "seeds".into(),
            RuntimeRun::MlpTrain(p) => format!(
                "mlp-train, {} steps, widths {}",
                p.steps,
                p.widths.iter().map(ToString::to_string).collect::<Vec<_>>().join(",")
            ),
            RuntimeRun::MatmulSweep(p) => format!("matmul-sweep, {} shapes", p.shapes.len()),
            RuntimeRun::Ops(p) => {
                let file = std::path::Path::new(&p.path).file_name().map(|f| f.to_string_lossy().into_owned());
                format!("ops {}", file.unwrap_or_else(|| p.path.clone()))
            }
        }
    }

    fn description(&self) -> String {
        match &self.experiment {
            RuntimeRun::Seeds => {
                "PyTorch's memory demonstrations with the sizes of seeds.expected.json (cachalot run seeds)".into()
            }
            RuntimeRun::MlpTrain(_) => {
                "a stack of linear layers trained over changing batch sizes (cachalot run mlp-train)".into()
            }
            RuntimeRun::MatmulSweep(_) => {
                "matrix products over shapes, each checked against the CPU (cachalot run matmul-sweep)".into()
            }
            RuntimeRun::Ops(p) => format!("the op file {} as allocations, no kernels (cachalot run ops)", p.path),
        }
    }

    fn backends(&self) -> Vec<String> {
        let first = match self.options.backend {
            BackendRequest::Auto => "auto",
            BackendRequest::Cuda => "cuda",
            BackendRequest::Wgpu => "wgpu",
            BackendRequest::Sim => "sim",
        };
        std::iter::once(first).chain(BACKENDS.into_iter().filter(|b| *b != first)).map(String::from).collect()
    }

    fn start(&self, backend: &str, ctx: &egui::Context) -> Result<LiveRun, String> {
        self.start_held(backend, ctx, None)
    }
}

impl RuntimeExperiment {
    /// [`Experiment::start`], the run held from the start once it has sent `hold` entries
    /// (see [`LiveRun::hold_at`]): a hold set after starting may come after a short run ended.
    pub fn start_held(&self, backend: &str, ctx: &egui::Context, hold: Option<u64>) -> Result<LiveRun, String> {
        let request = BackendRequest::parse(backend)
            .ok_or_else(|| format!("backend {backend}: expected one of {}", BACKENDS.join(", ")))?;
        let (sender, run) = channel();
        if let Some(entries) = hold {
            run.hold_at(entries);
        }
        let sender = sender.with_repaint(ctx.clone());
        let experiment = self.clone();
        std::thread::Builder::new()
            .name("cachalot-live".into())
            .spawn(move || experiment.run(request, sender))
            .map_err(|e| format!("cannot start a thread: {e}"))?;
        Ok(run)
    }
}

/// `cachalot run`'s experiments with their default parameters on `options`' device: what the
/// window's "Run experiment" offers natively (`ops` needs a file, so it is offered only when
/// given).
pub fn runtime_experiments(options: &DeviceOptions) -> Vec<Box<dyn Experiment>> {
    [RuntimeRun::Seeds, RuntimeRun::MlpTrain(MlpParams::default()), RuntimeRun::MatmulSweep(SweepParams::default())]
        .into_iter()
        .map(|experiment| Box::new(RuntimeExperiment::new(experiment, options.clone())) as Box<dyn Experiment>)
        .collect()
}

/// Forwards a watched run's batches to the viewer: new stacks, then entries, then marks, one
/// message each per batch (not one per entry), and pauses while the viewer holds the run.
#[derive(Debug)]
pub struct LiveSink {
    sender: LiveSender,
    name: String,
    entries_sent: u64,
}

impl LiveSink {
    /// A sink that sends to `sender` and names the run `name`.
    pub fn new(sender: LiveSender, name: impl Into<String>) -> Self {
        LiveSink { sender, name: name.into(), entries_sent: 0 }
    }
}

impl TraceSink for LiveSink {
    fn begin(&mut self, device: &DeviceFacts, settings: &str) {
        self.sender.send(LiveEvent::Start {
            name: self.name.clone(),
            device: device.clone(),
            settings: settings.to_owned(),
        });
    }

    fn deliver(&mut self, batch: TraceBatch) {
        for (id, frames) in batch.stacks {
            self.sender.send(LiveEvent::Stack { id, frames });
        }
        if !batch.entries.is_empty() {
            self.entries_sent += batch.entries.len() as u64;
            self.sender.send(LiveEvent::Entries(batch.entries));
        }
        for mark in batch.marks {
            self.sender.send(LiveEvent::Mark(mark));
        }
        // A held run waits here, between two operations, with the device's memory as it is.
        while self.sender.held(self.entries_sent) {
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
    }

    fn stop_requested(&self) -> bool {
        self.sender.stop_requested()
    }
}
