//! "Open files" (natively): a path field and a list of the folder's files, so that opening a
//! file needs no system dialog.

use std::path::{Path, PathBuf};

use crate::style;

/// "Open files": a path field and a list of the folder's files (no system dialog needed).
#[derive(Debug)]
pub struct OpenDialog {
    /// Whether it is shown.
    pub open: bool,
    path: String,
    error: Option<String>,
}

impl Default for OpenDialog {
    fn default() -> Self {
        let cwd = std::env::current_dir().map(|p| p.display().to_string()).unwrap_or_default();
        OpenDialog { open: false, path: cwd, error: None }
    }
}

impl OpenDialog {
    /// Shows the dialog; returns the files the user chose.
    pub fn show(&mut self, ctx: &egui::Context) -> Vec<PathBuf> {
        let mut chosen = Vec::new();
        if !self.open {
            return chosen;
        }
        let mut open = true;
        egui::Window::new("Open files").open(&mut open).default_width(520.0).show(ctx, |ui| {
            ui.horizontal(|ui| {
                ui.label("path");
                let edit = ui.add(egui::TextEdit::singleline(&mut self.path).desired_width(380.0));
                let enter = edit.lost_focus() && ui.input(|i| i.key_pressed(egui::Key::Enter));
                if ui.button("Open").clicked() || enter {
                    let path = PathBuf::from(self.path.trim());
                    if path.is_file() {
                        chosen.push(path);
                    } else if !path.is_dir() {
                        self.error = Some(format!("{}: no such file", path.display()));
                    }
                }
            });
            if let Some(e) = &self.error {
                ui.colored_label(style::series::OOM, e);
            }
            let dir = PathBuf::from(self.path.trim());
            let dir = if dir.is_dir() { dir } else { dir.parent().map(Path::to_path_buf).unwrap_or_default() };
            ui.separator();
            egui::ScrollArea::vertical().max_height(320.0).show(ui, |ui| {
                if let Some(parent) = dir.parent()
                    && ui.selectable_label(false, "📁 ..").clicked()
                {
                    self.path = parent.display().to_string();
                }
                let mut entries: Vec<(bool, PathBuf)> = std::fs::read_dir(&dir)
                    .map(|rd| rd.filter_map(Result::ok).map(|e| (e.path().is_dir(), e.path())).collect())
                    .unwrap_or_default();
                entries.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
                for (is_dir, path) in entries {
                    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
                    if name.starts_with('.') {
                        continue;
                    }
                    let label = if is_dir { format!("📁 {name}") } else { name };
                    if ui.selectable_label(false, label).clicked() {
                        if is_dir {
                            self.path = path.display().to_string();
                        } else {
                            chosen.push(path);
                        }
                    }
                }
            });
        });
        if !chosen.is_empty() {
            self.error = None;
            open = false;
        }
        self.open = open;
        chosen
    }
}
