//! Messages at the bottom of the window: files that could not be opened, experiments that
//! finished or failed. The last four show; each can be dismissed.

use crate::style;

/// A message shown at the bottom of the window.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Notice {
    /// The text.
    pub text: String,
    /// An error (red) rather than information.
    pub error: bool,
}

impl Notice {
    /// Something that went wrong.
    pub fn error(text: impl Into<String>) -> Self {
        Notice { text: text.into(), error: true }
    }

    /// Something worth knowing.
    pub fn info(text: impl Into<String>) -> Self {
        Notice { text: text.into(), error: false }
    }
}

/// The bottom bar with the last notices (nothing when there are none).
pub fn bottom_bar(ui: &mut egui::Ui, notices: &mut Vec<Notice>) {
    if notices.is_empty() {
        return;
    }
    egui::Panel::bottom("notices").frame(style::panel_frame(ui, egui::Frame::side_top_panel(ui.style()))).show(
        ui,
        |ui| {
            let mut dismiss = None;
            let first = notices.len().saturating_sub(4);
            for (i, notice) in notices.iter().enumerate().skip(first) {
                ui.horizontal(|ui| {
                    if ui.small_button("dismiss").clicked() {
                        dismiss = Some(i);
                    }
                    let color = if notice.error { style::series::OOM } else { ui.visuals().text_color() };
                    ui.colored_label(color, notice.text.as_str());
                });
            }
            if let Some(i) = dismiss {
                notices.remove(i);
            }
        },
    );
}
