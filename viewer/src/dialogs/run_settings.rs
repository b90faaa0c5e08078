//! The settings of a `cachalot run` experiment in the "Run experiment" window (natively): which
//! experiment (`seeds`, `mlp-train`, `matmul-sweep`, `ops FILE`), its parameters and the device
//! options, the same as the flags of `cachalot run`, kept as the text the user typed so that a
//! half-typed number is not lost, and checked when the run starts ([`RunSettings::experiment`]):
//! every field that does not parse is named with what was wrong, in the dialog.
//!
//! The op file is a path field, checked as it is typed (does the file exist) and read and parsed
//! when the run starts. No native file dialog: the workspace has no file-dialog crate (`rfd`
//! would bring GTK or the XDG portal to every build of the viewer), and "Open files" already
//! works without one.

use std::path::Path;

use cachalot_core::AllocatorConfig;
use cachalot_runtime::experiments::{Loss, OpsParams, Optimizer};
use cachalot_runtime::{Activation, BackendRequest, DeviceOptions, Experiment, MlpParams, SimProfile, SweepParams};
use cachalot_trace::ops::OpFile;

use crate::live::device_runs::{BACKENDS, RuntimeExperiment};
use crate::style;

/// The experiments of `cachalot run`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ExperimentKind {
    /// `seeds`.
    #[default]
    Seeds,
    /// `mlp-train`.
    MlpTrain,
    /// `matmul-sweep`.
    MatmulSweep,
    /// `ops FILE`.
    Ops,
}

impl ExperimentKind {
    /// Every experiment, in the order `cachalot run --help` lists them.
    pub const ALL: [ExperimentKind; 4] =
        [ExperimentKind::Seeds, ExperimentKind::MlpTrain, ExperimentKind::MatmulSweep, ExperimentKind::Ops];

    /// The command-line name.
    pub fn name(self) -> &'static str {
        match self {
            ExperimentKind::Seeds => "seeds",
            ExperimentKind::MlpTrain => "mlp-train",
            ExperimentKind::MatmulSweep => "matmul-sweep",
            ExperimentKind::Ops => "ops",
        }
    }
}

/// The fields of the form, as typed.
#[derive(Clone, Debug)]
pub struct RunSettings {
    /// The experiment.
    pub experiment: ExperimentKind,
    /// `mlp-train --steps`.
    pub steps: String,
    /// `mlp-train --widths`.
    pub widths: String,
    /// `mlp-train --depth` (empty: the widths as given).
    pub depth: String,
    /// `mlp-train --batches`.
    pub batches: String,
    /// `mlp-train --optimizer`.
    pub optimizer: Optimizer,
    /// `mlp-train --lr`.
    pub lr: String,
    /// `mlp-train --momentum`.
    pub momentum: String,
    /// `mlp-train --activation`.
    pub activation: Activation,
    /// `mlp-train --loss`.
    pub loss: Loss,
    /// `--seed` of `mlp-train` and `matmul-sweep`.
    pub seed: String,
    /// `matmul-sweep --shapes` (MxNxK, comma-separated).
    pub shapes: String,
    /// `matmul-sweep --sizes` (N for N x N x N, added to the shapes).
    pub sizes: String,
    /// `matmul-sweep --layouts`.
    pub layouts: String,
    /// `matmul-sweep --tolerance`.
    pub tolerance: String,
    /// The op file of `ops FILE`.
    pub ops_file: String,
    /// `ops --mark-every`.
    pub mark_every: String,
    /// `--backend`.
    pub backend: BackendRequest,
    /// `--device` (empty: device 0 / the best adapter).
    pub device: String,
    /// `--config`, `PYTORCH_CUDA_ALLOC_CONF` syntax.
    pub config: String,
    /// `--profile` of the simulator (empty: `cuda-sm90`).
    pub profile: String,
    /// `--capacity` (empty: the backend's default).
    pub capacity: String,
    /// The opposite of `--no-compute`.
    pub compute: bool,
}

impl Default for RunSettings {
    fn default() -> Self {
        let mlp = MlpParams::default();
        let sweep = SweepParams::default();
        let list = |v: &[usize]| v.iter().map(ToString::to_string).collect::<Vec<_>>().join(",");
        RunSettings {
            experiment: ExperimentKind::Seeds,
            steps: mlp.steps.to_string(),
            widths: list(&mlp.widths),
            depth: String::new(),
            batches: list(&mlp.batches),
            optimizer: mlp.optimizer,
            lr: mlp.lr.to_string(),
            momentum: mlp.momentum.to_string(),
            activation: mlp.activation,
            loss: mlp.loss,
            seed: "0".into(),
            // Empty: the sweep's default shapes, as `cachalot run matmul-sweep` without --shapes.
            shapes: String::new(),
            sizes: String::new(),
            layouts: sweep.layouts.join(","),
            tolerance: sweep.tolerance.to_string(),
            ops_file: String::new(),
            mark_every: "0".into(),
            backend: BackendRequest::Auto,
            device: String::new(),
            config: String::new(),
            profile: String::new(),
            capacity: String::new(),
            compute: true,
        }
    }
}

/// `text` as a `T`, or an error naming `field`.
fn number<T: std::str::FromStr>(field: &str, text: &str, what: &str) -> Result<T, String> {
    text.trim().parse().map_err(|_| format!("{field}: '{}' is not {what}", text.trim()))
}

/// A comma-separated list of numbers, or an error naming `field`.
fn list<T: std::str::FromStr>(field: &str, text: &str, what: &str) -> Result<Vec<T>, String> {
    text.split(',').filter(|s| !s.trim().is_empty()).map(|s| number(field, s, what)).collect()
}

/// `4096`, `64MiB`, `4GiB`, `1.5GB`: bytes, with the units `cachalot run --capacity` takes
/// ([`cachalot_core::size::parse_bytes`]), at least one; errors name `field`.
pub fn parse_bytes(field: &str, text: &str) -> Result<u64, String> {
    use cachalot_core::size::ByteSizeError;
    let t = text.trim();
    match cachalot_core::size::parse_bytes(t) {
        Ok(0) | Err(ByteSizeError::TooLarge) => Err(format!("{field}: '{t}' is not between 1 byte and 1 EiB")),
        Ok(bytes) => Ok(bytes),
        Err(ByteSizeError::NotANumber) => Err(format!("{field}: '{t}' is not a size")),
        Err(ByteSizeError::UnknownUnit(unit)) => {
            Err(format!("{field}: unknown unit '{unit}' in '{t}' (B, KiB, MiB, GiB, TiB, kB, MB, GB)"))
        }
    }
}

/// Why the op file at `path` cannot be used, checked without reading it (cheap enough for
/// every frame).
pub fn op_file_problem(path: &str) -> Option<String> {
    let path = path.trim();
    if path.is_empty() {
        return Some("op file: no file given (a file of `a ID SIZE [STREAM]` and `f ID` lines)".into());
    }
    match std::fs::metadata(path) {
        Err(e) => Some(format!("op file {path}: {e}")),
        Ok(m) if !m.is_file() => Some(format!("op file {path}: not a file")),
        Ok(_) => None,
    }
}

impl RunSettings {
    /// The device options of the form, checked: the configuration string parses, the profile
    /// exists, the device index and capacity are numbers.
    pub fn device_options(&self) -> Result<DeviceOptions, String> {
        let config = self.config.trim();
        AllocatorConfig::parse(config).map_err(|e| format!("config '{config}': {e}"))?;
        let profile = self.profile.trim();
        if !profile.is_empty() {
            if SimProfile::by_name(profile).is_none() {
                return Err(format!("simulator profile '{profile}' (known: {})", SimProfile::NAMES.join(", ")));
            }
            if !matches!(self.backend, BackendRequest::Sim | BackendRequest::Auto) {
                return Err("the simulator profile applies to the simulator only (backend sim)".into());
            }
        }
        let device = self.device.trim();
        Ok(DeviceOptions {
            backend: self.backend,
            device: if device.is_empty() { None } else { Some(number("device", device, "a device index")?) },
            config: config.to_owned(),
            profile: (!profile.is_empty()).then(|| profile.to_owned()),
            capacity: if self.capacity.trim().is_empty() {
                None
            } else {
                Some(parse_bytes("capacity", &self.capacity)?)
            },
            compute: self.compute,
        })
    }

    /// The experiment the form describes, every field checked, as `cachalot run` checks its
    /// flags; an op file is read and parsed here, so that a bad one is named in the dialog.
    pub fn experiment(&self) -> Result<RuntimeExperiment, String> {
        let options = self.device_options()?;
        let experiment = match self.experiment {
            ExperimentKind::Seeds => Experiment::Seeds,
            ExperimentKind::MlpTrain => {
                let mut params = MlpParams {
                    widths: list("widths", &self.widths, "a width")?,
                    steps: number("steps", &self.steps, "a number of steps")?,
                    batches: list("batches", &self.batches, "a batch size")?,
                    optimizer: self.optimizer,
                    lr: number("learning rate", &self.lr, "a number")?,
                    momentum: number("momentum", &self.momentum, "a number")?,
                    activation: self.activation,
                    loss: self.loss,
                    seed: number("seed", &self.seed, "a whole number")?,
                };
                if !self.depth.trim().is_empty() {
                    params = params.with_depth(number("depth", &self.depth, "a number of layers")?);
                }
                params.validate().map_err(|e| e.to_string())?;
                Experiment::MlpTrain(params)
            }
            ExperimentKind::MatmulSweep => {
                let mut shapes = Vec::new();
                for s in self.shapes.split(',').map(str::trim).filter(|s| !s.is_empty()) {
                    let dims: Vec<u32> = s
                        .split('x')
                        .map(|d| d.trim().parse())
                        .collect::<Result<_, _>>()
                        .map_err(|_| format!("shapes: '{s}' is not MxNxK"))?;
                    match dims[..] {
                        [m, n, k] => shapes.push((m, n, k)),
                        _ => return Err(format!("shapes: '{s}' is not MxNxK")),
                    }
                }
                shapes.extend(list::<u32>("sizes", &self.sizes, "a size")?.into_iter().map(|n| (n, n, n)));
                let layouts: Vec<String> =
                    self.layouts.split(',').map(|l| l.trim().to_owned()).filter(|l| !l.is_empty()).collect();
                if let Some(bad) = layouts.iter().find(|l| !matches!(l.as_str(), "nn" | "nt" | "tn")) {
                    return Err(format!("layouts: '{bad}' is not nn, nt or tn"));
                }
                if layouts.is_empty() {
                    return Err("layouts: none given (nn, nt, tn)".into());
                }
                Experiment::MatmulSweep(SweepParams {
                    shapes: if shapes.is_empty() { SweepParams::default().shapes } else { shapes },
                    layouts,
                    tolerance: number("tolerance", &self.tolerance, "a number")?,
                    seed: number("seed", &self.seed, "a whole number")?,
                })
            }
            ExperimentKind::Ops => {
                if let Some(problem) = op_file_problem(&self.ops_file) {
                    return Err(problem);
                }
                let path = self.ops_file.trim();
                let bytes = cachalot_trace::input::read(std::path::Path::new(path))
                    .map_err(|e| format!("op file {path}: {}", e.reason()))?;
                let text = std::str::from_utf8(&bytes).map_err(|_| format!("op file {path}: not UTF-8 text"))?;
                OpFile::parse(text).map_err(|e| format!("op file {path}: {e}"))?;
                let mark_every = number("mark every", &self.mark_every, "a number of ops")?;
                Experiment::Ops(OpsParams { path: path.to_owned(), mark_every, ops_per_second: 0 })
            }
        };
        Ok(RuntimeExperiment::new(experiment, options))
    }

    /// The form: the experiment, its parameters, then the device.
    pub fn ui(&mut self, ui: &mut egui::Ui) {
        ui.horizontal(|ui| {
            ui.label("experiment");
            for kind in ExperimentKind::ALL {
                ui.selectable_value(&mut self.experiment, kind, kind.name());
            }
        });
        egui::Grid::new("run_settings").num_columns(2).spacing([8.0, 4.0]).show(ui, |ui| {
            let field = |ui: &mut egui::Ui, label: &str, text: &mut String, hint: &str| {
                let label = ui.label(label);
                ui.add(egui::TextEdit::singleline(text).hint_text(hint).desired_width(260.0)).labelled_by(label.id);
                ui.end_row();
            };
            match self.experiment {
                ExperimentKind::Seeds => {
                    ui.weak("no parameters: the sizes of seeds.expected.json");
                    ui.end_row();
                }
                ExperimentKind::MlpTrain => {
                    field(ui, "steps", &mut self.steps, "12");
                    field(ui, "widths", &mut self.widths, "inputs,hidden…,classes");
                    field(ui, "depth", &mut self.depth, "hidden layers (repeats the first hidden width)");
                    field(ui, "batches", &mut self.batches, "64,128,32");
                    ui.label("optimizer");
                    ui.horizontal(|ui| {
                        ui.selectable_value(&mut self.optimizer, Optimizer::Adam, "adam");
                        ui.selectable_value(&mut self.optimizer, Optimizer::Sgd, "sgd");
                    });
                    ui.end_row();
                    field(ui, "learning rate", &mut self.lr, "0.001");
                    field(ui, "momentum", &mut self.momentum, "0.9 (sgd)");
                    ui.label("activation");
                    ui.horizontal(|ui| {
                        ui.selectable_value(&mut self.activation, Activation::Relu, "relu");
                        ui.selectable_value(&mut self.activation, Activation::Gelu, "gelu");
                    });
                    ui.end_row();
                    ui.label("loss");
                    ui.horizontal(|ui| {
                        ui.selectable_value(&mut self.loss, Loss::CrossEntropy, "cross-entropy");
                        ui.selectable_value(&mut self.loss, Loss::Mse, "mse");
                    });
                    ui.end_row();
                    field(ui, "seed", &mut self.seed, "0");
                }
                ExperimentKind::MatmulSweep => {
                    field(ui, "shapes", &mut self.shapes, "MxNxK,… (empty: 64³ to 1024³ and odd shapes)");
                    field(ui, "sizes", &mut self.sizes, "N,… (N x N x N, added to the shapes)");
                    field(ui, "layouts", &mut self.layouts, "nn,nt,tn");
                    field(ui, "tolerance", &mut self.tolerance, "0.0001");
                    field(ui, "seed", &mut self.seed, "0");
                }
                ExperimentKind::Ops => {
                    field(ui, "op file", &mut self.ops_file, "path of an op file (a ID SIZE [STREAM] / f ID)");
                    ui.label("");
                    match op_file_problem(&self.ops_file) {
                        Some(problem) if !self.ops_file.trim().is_empty() => {
                            ui.colored_label(style::series::OOM, problem);
                        }
                        Some(_) => {
                            ui.weak("e.g. testdata/bench-ops/*.ops");
                        }
                        None => {
                            let name = Path::new(self.ops_file.trim()).file_name().unwrap_or_default();
                            ui.weak(format!("✔ {} exists", name.to_string_lossy()));
                        }
                    }
                    ui.end_row();
                    field(ui, "mark every", &mut self.mark_every, "ops between marks (0: at the end only)");
                }
            }
            ui.separator();
            ui.separator();
            ui.end_row();
            ui.label("backend");
            ui.horizontal(|ui| {
                for name in BACKENDS {
                    if let Some(request) = BackendRequest::parse(name) {
                        ui.selectable_value(&mut self.backend, request, name);
                    }
                }
            });
            ui.end_row();
            field(ui, "config", &mut self.config, "PYTORCH_CUDA_ALLOC_CONF, e.g. expandable_segments:True");
            field(ui, "device", &mut self.device, "CUDA ordinal / wgpu adapter index (empty: the first/best)");
            field(ui, "capacity", &mut self.capacity, "wgpu and simulator memory, e.g. 4GiB");
            field(ui, "profile", &mut self.profile, "simulator: cuda-sm90 (default), cuda-sm80, wgpu");
            ui.label("compute");
            ui.checkbox(&mut self.compute, "run the kernels (off: allocations only, on the simulator)");
            ui.end_row();
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_bad_field_is_named() {
        let bad = |edit: fn(&mut RunSettings), needle: &str| {
            let mut s = RunSettings::default();
            edit(&mut s);
            let error = s.experiment().map(|_| ()).unwrap_err();
            assert!(error.contains(needle), "{error} should name {needle}");
        };
        bad(|s| s.config = "expandable_segments:Maybe".into(), "config 'expandable_segments:Maybe'");
        bad(|s| s.capacity = "4 parsecs".into(), "capacity");
        bad(|s| s.profile = "h100".into(), "simulator profile 'h100'");
        bad(
            |s| {
                s.experiment = ExperimentKind::MlpTrain;
                s.steps = "twelve".into();
            },
            "steps: 'twelve'",
        );
        bad(
            |s| {
                s.experiment = ExperimentKind::MlpTrain;
                s.widths = "256".into();
            },
            "widths",
        );
        bad(
            |s| {
                s.experiment = ExperimentKind::MatmulSweep;
                s.shapes = "64x64".into();
            },
            "shapes: '64x64'",
        );
        bad(
            |s| {
                s.experiment = ExperimentKind::Ops;
                s.ops_file = "/no/such/file.ops".into();
            },
            "op file /no/such/file.ops",
        );
    }

    #[test]
    fn the_form_builds_what_the_flags_would() {
        let mut s = RunSettings {
            experiment: ExperimentKind::MlpTrain,
            steps: "3".into(),
            depth: "4".into(),
            lr: "0.01".into(),
            config: "expandable_segments:True".into(),
            backend: BackendRequest::Sim,
            capacity: "2GiB".into(),
            compute: false,
            ..RunSettings::default()
        };
        let built = s.experiment().unwrap();
        let Experiment::MlpTrain(p) = &built.experiment else { panic!("{:?}", built.experiment) };
        assert_eq!((p.steps, p.lr, p.widths.clone()), (3, 0.01, vec![256, 512, 512, 512, 512, 10]));
        assert_eq!(built.options.config, "expandable_segments:True");
        assert_eq!((built.options.capacity, built.options.compute), (Some(2 << 30), false));
        s.experiment = ExperimentKind::MatmulSweep;
        s.shapes = "2x3x4".into();
        s.sizes = "8".into();
        let Experiment::MatmulSweep(p) = s.experiment().unwrap().experiment else { panic!() };
        assert_eq!(p.shapes, vec![(2, 3, 4), (8, 8, 8)]);
    }
}
