//! Starting a `cachalot run` experiment from the dialog so that a device that cannot be opened
//! (no CUDA driver, no adapter, a device index no machine has) is said in the dialog rather
//! than in a tab: the device is opened on the worker thread, which tells the dialog whether it
//! opened before it runs the experiment there. Until then the dialog holds the run; once the
//! device is open it hands the run, nothing of it polled yet, to the app.

use std::sync::mpsc;

use cachalot_runtime::Selection;

use crate::live::device_runs::{LiveSink, RuntimeExperiment};
use crate::live::{Experiment as _, LiveEvent, LiveRun, channel};

/// A run whose device is being opened.
#[derive(Debug)]
pub struct Starting {
    /// The experiment's name, for the dialog.
    pub name: String,
    live: Option<LiveRun>,
    opened: mpsc::Receiver<Result<Selection, String>>,
}

impl Starting {
    /// Opens `experiment`'s device and runs it on a new thread, `ctx` woken as it goes.
    pub fn spawn(experiment: RuntimeExperiment, ctx: &egui::Context) -> Result<Self, String> {
        let (sender, live) = channel();
        let sender = sender.with_repaint(ctx.clone());
        let (opened_tx, opened) = mpsc::channel();
        let name = experiment.name();
        let repaint = ctx.clone();
        std::thread::Builder::new()
            .name("cachalot-live".into())
            .spawn(move || {
                let (device, selection) = match cachalot_runtime::open(&experiment.options) {
                    Ok(opened) => opened,
                    Err(e) => {
                        let _ = opened_tx.send(Err(e.to_string()));
                        repaint.request_repaint();
                        return;
                    }
                };
                let _ = opened_tx.send(Ok(selection.clone()));
                repaint.request_repaint();
                let name = format!("{} on {}", experiment.name(), selection.backend.name());
                let sink = LiveSink::new(sender.clone(), name);
                let result =
                    cachalot_runtime::execute_watched(&experiment.experiment, device, selection, Box::new(sink));
                let mut snapshot = result.snapshot;
                // The entries went out in batches, as `RuntimeExperiment::run` sends them.
                snapshot.trace = Vec::new();
                sender.send(LiveEvent::Finished(Some(Box::new(snapshot))));
            })
            .map_err(|e| format!("cannot start a thread: {e}"))?;
        Ok(Starting { name, live: Some(live), opened })
    }

    /// `None` while the device is being opened; then the run (its device open) or why the
    /// device could not be opened.
    pub fn poll(&mut self) -> Option<Result<LiveRun, String>> {
        match self.opened.try_recv() {
            Ok(Ok(_)) => self.live.take().map(Ok),
            Ok(Err(why)) => Some(Err(format!("{}: {why}", self.name))),
            Err(mpsc::TryRecvError::Empty) => None,
            Err(mpsc::TryRecvError::Disconnected) => {
                Some(Err(format!("{}: the thread opening the device ended without a word", self.name)))
            }
        }
    }
}

impl Drop for Starting {
    /// A dialog closed while the device opened: the run, never shown, stops at once.
    fn drop(&mut self) {
        if let Some(live) = &self.live {
            live.request_stop();
        }
    }
}
