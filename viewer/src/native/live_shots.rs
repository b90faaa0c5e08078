//! A live run rendered headless (`cachalot view --run EXPERIMENT --screenshot END.png
//! [--mid-screenshot MID.png --mid-event N]`): the window's own frame loop runs in an
//! egui_kittest harness, as for [`super::screenshot`], while the experiment runs on its thread.
//! For the picture mid-run, the experiment is held once it has sent `N` entries (see
//! [`crate::live::LiveRun::hold_at`]), so the picture shows the run while the device still
//! holds that state; then it goes on, and the last picture shows its end.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use super::{ScreenshotOptions, harness};
use crate::app::ViewerApp;

/// What to render of a live run.
#[derive(Clone, Debug)]
pub struct LiveShots {
    /// Size, view and scale of both pictures (the cursor is chosen here).
    pub options: ScreenshotOptions,
    /// A picture at this entry, taken while the experiment is held there.
    pub mid: Option<(u64, PathBuf)>,
    /// The picture at the end, the cursor on the last entry.
    pub end: PathBuf,
    /// Longest wait for the run to end.
    pub timeout: Duration,
}

/// What the pictures showed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LiveShotsReport {
    /// The cursor of the mid-run picture, and whether the experiment was still running then.
    pub mid: Option<(usize, bool)>,
    /// Entries at the end.
    pub entries: usize,
}

/// Runs `app` headless until its live runs have ended, taking the pictures `shots` asks for,
/// and returns the app (for saving the run) with what the pictures showed. The app must have
/// an experiment queued ([`ViewerApp::start_experiment`]) or a live run added; for a picture
/// mid-run, one added already held there
/// ([`crate::live::device_runs::RuntimeExperiment::start_held`]), since a short run may end before
/// its first frame.
pub fn live_screenshots(app: ViewerApp, shots: &LiveShots) -> Result<(ViewerApp, LiveShotsReport), String> {
    let options = &shots.options;
    let mut harness = harness(app, options.size, options.pixels_per_point, false);
    harness.state_mut().view = options.view;
    // The first frame starts a queued experiment.
    harness.step();
    let deadline = Instant::now() + shots.timeout;
    let mut report = LiveShotsReport { mid: None, entries: 0 };
    if let Some((event, path)) = &shots.mid {
        // A run started held (`RuntimeExperiment::start_held`) is already waiting there; a
        // queued one is held from its first frame.
        if let Some(live) = harness.state().active_tab().and_then(|t| t.live.as_ref()) {
            live.hold_at(*event);
        }
        wait(&mut harness, deadline, |app| {
            app.active_tab().is_none_or(|t| t.live.is_none() || t.run.trace.len() as u64 >= *event)
        })?;
        let tab = harness.state_mut().active_tab_mut().ok_or("no run was started")?;
        tab.timeline.follow = false;
        tab.cursor = (*event as usize).min(tab.run.end());
        let cursor = tab.cursor;
        harness.run_steps(4);
        let running = harness.state().active_tab().is_some_and(|t| t.live.is_some());
        super::save_png(&harness.render()?, path)?;
        report.mid = Some((cursor, running));
        if let Some(tab) = harness.state_mut().active_tab_mut() {
            tab.timeline.follow = true;
            if let Some(live) = &tab.live {
                live.release();
            }
        }
    }
    wait(&mut harness, deadline, |app| !app.has_live_runs())?;
    if let Some(tab) = harness.state_mut().active_tab_mut() {
        tab.cursor = options.cursor.unwrap_or(tab.run.end()).min(tab.run.end());
        report.entries = tab.run.trace.len();
    }
    harness.run_steps(4);
    super::save_png(&harness.render()?, &shots.end)?;
    Ok((harness.into_state(), report))
}

/// Steps frames until `done` holds for the app, or fails at `deadline` (stopping the runs).
fn wait(
    harness: &mut egui_kittest::Harness<'static, ViewerApp>,
    deadline: Instant,
    done: impl Fn(&ViewerApp) -> bool,
) -> Result<(), String> {
    while !done(harness.state()) {
        if Instant::now() > deadline {
            for tab in &harness.state().tabs {
                if let Some(live) = &tab.live {
                    live.request_stop();
                }
            }
            return Err("the live run did not get there in time".into());
        }
        harness.step();
        std::thread::sleep(Duration::from_millis(2));
    }
    Ok(())
}
