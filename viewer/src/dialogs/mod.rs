//! The app's dialogs: "Run experiment" (natively, any experiment of `cachalot run` with its
//! settings, [`run_settings`]; and the experiments the host gave the viewer, each on a backend)
//! and, natively, "Open files" (a path field and the folder's
//! files, so that no system dialog is needed) and "Save run" (a finished run as a cachalot
//! snapshot or a PyTorch pickle).

#[cfg(not(target_arch = "wasm32"))]
mod open_files;
#[cfg(not(target_arch = "wasm32"))]
pub mod run_settings;
#[cfg(not(target_arch = "wasm32"))]
mod save_run;
#[cfg(not(target_arch = "wasm32"))]
mod starting;

#[cfg(not(target_arch = "wasm32"))]
pub use open_files::OpenDialog;
#[cfg(not(target_arch = "wasm32"))]
pub use save_run::SaveDialog;

use crate::live::{Experiment, LiveRun};
use crate::style;

/// The "Run experiment" window.
#[derive(Debug, Default)]
pub struct RunDialog {
    /// Whether it is shown.
    pub open: bool,
    experiment: usize,
    backend: usize,
    error: Option<String>,
    /// An experiment (index) and backend to start at the next frame without showing the dialog.
    queued: Option<(usize, String)>,
    /// The `cachalot run` form.
    #[cfg(not(target_arch = "wasm32"))]
    pub settings: run_settings::RunSettings,
    /// The form's run while its device opens.
    #[cfg(not(target_arch = "wasm32"))]
    starting: Option<starting::Starting>,
    /// Why the form's run did not start.
    #[cfg(not(target_arch = "wasm32"))]
    form_error: Option<String>,
}

impl RunDialog {
    /// Starts experiment `index` of those offered on `backend` at the next frame, as if chosen
    /// here (a command line's `--run`); if it cannot start, the dialog opens and says why.
    pub fn queue(&mut self, index: usize, backend: impl Into<String>) {
        self.queued = Some((index, backend.into()));
    }

    /// Shows the dialog (if open) offering `experiments`; returns the run its Start button
    /// started. The dialog closes once one started and shows why when one could not.
    pub fn show(&mut self, ctx: &egui::Context, experiments: &[Box<dyn Experiment>]) -> Option<LiveRun> {
        if let Some((index, backend)) = self.queued.take() {
            let started = experiments.get(index).ok_or_else(|| format!("no experiment {index}"));
            match started.and_then(|e| e.start(&backend, ctx)) {
                Ok(live) => return Some(live),
                Err(e) => {
                    self.error = Some(e);
                    self.open = true;
                }
            }
        }
        if !self.open {
            return None;
        }
        let mut open = true;
        let mut start = None;
        #[cfg(not(target_arch = "wasm32"))]
        let mut started_here = None;
        egui::Window::new("Run experiment").open(&mut open).collapsible(false).show(ctx, |ui| {
            #[cfg(not(target_arch = "wasm32"))]
            {
                started_here = self.run_form(ui);
                ui.separator();
                ui.strong("Offered by the program");
            }
            if experiments.is_empty() {
                ui.label("The program showing this viewer offers no experiments.");
            }
            self.experiment = self.experiment.min(experiments.len().saturating_sub(1));
            for (i, e) in experiments.iter().enumerate() {
                ui.radio_value(&mut self.experiment, i, e.name()).on_hover_text(e.description());
            }
            if let Some(e) = experiments.get(self.experiment) {
                ui.weak(e.description());
                let backends = e.backends();
                self.backend = self.backend.min(backends.len().saturating_sub(1));
                ui.horizontal(|ui| {
                    egui::ComboBox::new("backend", "backend")
                        .selected_text(backends.get(self.backend).cloned().unwrap_or_default())
                        .show_ui(ui, |ui| {
                            for (i, b) in backends.iter().enumerate() {
                                ui.selectable_value(&mut self.backend, i, b);
                            }
                        });
                });
                if ui.button("Start").clicked() {
                    start = backends.get(self.backend).cloned();
                }
            }
            if let Some(error) = &self.error {
                ui.colored_label(style::series::OOM, error);
            }
        });
        let mut started = None;
        #[cfg(not(target_arch = "wasm32"))]
        if let Some(live) = started_here {
            started = Some(live);
            self.error = None;
            open = false;
        }
        if let Some(backend) = start {
            match experiments.get(self.experiment).map(|e| e.start(&backend, ctx)) {
                Some(Ok(live)) => {
                    started = Some(live);
                    self.error = None;
                    open = false;
                }
                Some(Err(e)) => self.error = Some(e),
                None => {}
            }
        }
        self.open = open;
        #[cfg(not(target_arch = "wasm32"))]
        if !open {
            // Closing the window gives up a run whose device was still opening.
            self.starting = None;
        }
        started
    }

    /// The `cachalot run` form and its Start button; returns the run once its device opened.
    /// What is wrong with the form, or why the device did not open, is shown under it.
    #[cfg(not(target_arch = "wasm32"))]
    fn run_form(&mut self, ui: &mut egui::Ui) -> Option<LiveRun> {
        ui.strong("cachalot run");
        self.settings.ui(ui);
        let mut started = None;
        if let Some(starting) = &mut self.starting {
            match starting.poll() {
                None => {
                    ui.horizontal(|ui| {
                        ui.spinner();
                        ui.label(format!("{}: opening the device…", starting.name));
                    });
                }
                Some(Ok(live)) => {
                    self.starting = None;
                    started = Some(live);
                }
                Some(Err(why)) => {
                    self.starting = None;
                    self.form_error = Some(why);
                }
            }
        } else if ui.button("Start run").clicked() {
            match self.settings.experiment().and_then(|e| starting::Starting::spawn(e, ui.ctx())) {
                Ok(starting) => {
                    self.form_error = None;
                    self.starting = Some(starting);
                }
                Err(e) => self.form_error = Some(e),
            }
        }
        if let Some(error) = &self.form_error {
            ui.colored_label(style::series::OOM, error);
        }
        started
    }
}
