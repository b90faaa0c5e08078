//! "Save run" (natively): a path field and two buttons, the shown run as a cachalot snapshot or
//! as a PyTorch snapshot pickle ([`crate::live::save`]).

use std::path::{Path, PathBuf};

use crate::live::save::{SaveFormat, run_bytes};
use crate::style;
use crate::tabs::RunTab;

/// "Save run": where to write the shown run, and in which format.
#[derive(Debug, Default)]
pub struct SaveDialog {
    /// Whether it is shown.
    pub open: bool,
    path: String,
    /// The run the path was proposed for (a new run gets a new proposal).
    proposed_for: String,
    message: Option<(bool, String)>,
}

impl SaveDialog {
    /// Shows the dialog (if open) for `tab`; returns the file written, if one was.
    pub fn show(&mut self, ctx: &egui::Context, tab: Option<&RunTab>) -> Option<PathBuf> {
        if !self.open {
            return None;
        }
        let mut open = true;
        let mut written = None;
        egui::Window::new("Save run").open(&mut open).collapsible(false).default_width(520.0).show(ctx, |ui| {
            let Some(tab) = tab else {
                ui.label("No run is shown.");
                return;
            };
            if self.proposed_for != tab.run.name {
                self.proposed_for = tab.run.name.clone();
                self.path = proposed_path(&tab.run.name).display().to_string();
                self.message = None;
            }
            ui.label(format!("{} ({} entries)", tab.run.name, tab.run.trace.len()));
            ui.horizontal(|ui| {
                ui.label("path");
                ui.add(egui::TextEdit::singleline(&mut self.path).desired_width(400.0));
            });
            ui.horizontal(|ui| {
                let can_save = !tab.run.live;
                for (format, label) in [
                    (SaveFormat::Cachalot, "Save snapshot (cachalot)"),
                    (SaveFormat::TorchPickle, "Save PyTorch pickle"),
                ] {
                    let button = ui.add_enabled(can_save, egui::Button::new(label));
                    if button.clicked() {
                        let path = with_extension(self.path.trim(), format);
                        self.path = path.display().to_string();
                        self.message = Some(match save(tab, format, &path) {
                            Ok(()) => {
                                written = Some(path.clone());
                                (false, format!("wrote {}", path.display()))
                            }
                            Err(e) => (true, e),
                        });
                    }
                }
            });
            if tab.run.live {
                ui.weak("The run is still going: stop it or wait for its end to save it.");
            }
            if let Some((error, text)) = &self.message {
                if *error {
                    ui.colored_label(style::series::OOM, text);
                } else {
                    ui.label(text);
                }
            }
        });
        self.open = open;
        written
    }
}

/// Writes `tab`'s run to `path` as `format`.
pub fn save(tab: &RunTab, format: SaveFormat, path: &Path) -> Result<(), String> {
    let bytes = run_bytes(&tab.run, tab.end_snapshot.as_deref(), format).map_err(|e| e.to_string())?;
    cachalot_trace::output::write_atomic(path, &bytes).map_err(|e| e.to_string())
}

/// A file name in the current folder made of the run's name.
fn proposed_path(name: &str) -> PathBuf {
    let stem: String =
        name.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '.' { c } else { '_' }).collect();
    let dir = std::env::current_dir().unwrap_or_default();
    dir.join(format!("{stem}.json"))
}

/// `path` with the format's extension (replacing the other format's).
fn with_extension(path: &str, format: SaveFormat) -> PathBuf {
    let path = PathBuf::from(path);
    match path.extension().and_then(|e| e.to_str()) {
        Some("json" | "pickle") => path.with_extension(format.extension()),
        _ => {
            let mut name = path.into_os_string();
            name.push(".");
            name.push(format.extension());
            PathBuf::from(name)
        }
    }
}
