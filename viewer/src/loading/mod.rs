//! Getting files into the viewer without stalling it: every load (a file's bytes parsed and its
//! runs built by [`crate::load`], or a replay through cachalot) runs on a thread natively, and
//! on the frame after it was asked for in the browser, which has no threads (so "loading" is
//! drawn first). Files come by path, as bytes, dropped on the window, or in the browser from
//! its file picker and the page's server ([`Inbox`]).

#[cfg(target_arch = "wasm32")]
mod browser;

#[cfg(target_arch = "wasm32")]
pub use browser::{Inbox, mark};

use crate::load::{Progress, load_bytes};
use crate::model::Run;

/// What a load gives: the runs of the file, or the message to show (it starts with the name).
pub type Loaded = Result<Vec<Run>, String>;

/// A load to run on a later frame (in the browser).
#[cfg(target_arch = "wasm32")]
type Job = Box<dyn FnOnce(&Progress) -> Result<Vec<Run>, String>>;

/// A file being loaded.
struct Pending {
    name: String,
    progress: Progress,
    #[cfg(not(target_arch = "wasm32"))]
    receiver: std::sync::mpsc::Receiver<Result<Vec<Run>, String>>,
    /// In the browser: the work, done on a later frame.
    #[cfg(target_arch = "wasm32")]
    job: Option<Job>,
}

/// The loads under way, and in the browser the files its callbacks received.
#[derive(Default)]
pub struct Loader {
    pending: Vec<Pending>,
    #[cfg(target_arch = "wasm32")]
    inbox: Inbox,
}

/// Prefixes a load's error message with the file's name, unless it names it already.
fn named(name: &str, result: Result<Vec<Run>, String>) -> Loaded {
    result.map_err(|message| if message.starts_with(name) { message } else { format!("{name}: {message}") })
}

impl Loader {
    /// Whether nothing is loading.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// How many files are loading (in the browser, those still arriving too).
    pub fn len(&self) -> usize {
        #[cfg(target_arch = "wasm32")]
        return self.pending.len() + self.inbox.arriving().len();
        #[cfg(not(target_arch = "wasm32"))]
        self.pending.len()
    }

    /// Runs `job` on a thread (natively) or on a later frame (in the browser); its result comes
    /// back from [`Loader::poll`]. The error says why no thread could be started.
    pub fn spawn(
        &mut self,
        name: String,
        job: impl FnOnce(&Progress) -> Result<Vec<Run>, String> + Send + 'static,
    ) -> Result<(), String> {
        let progress = Progress::default();
        #[cfg(not(target_arch = "wasm32"))]
        {
            let (sender, receiver) = std::sync::mpsc::channel();
            let p = progress.clone();
            std::thread::Builder::new()
                .name(format!("load {name}"))
                .spawn(move || {
                    let _ = sender.send(job(&p));
                })
                .map_err(|e| format!("{name}: cannot start a thread: {e}"))?;
            self.pending.push(Pending { name, progress, receiver });
        }
        #[cfg(target_arch = "wasm32")]
        self.pending.push(Pending { name, progress, job: Some(Box::new(job)) });
        Ok(())
    }

    /// Starts loading the bytes of a file called `name`.
    pub fn open_bytes(&mut self, name: String, bytes: Vec<u8>) -> Result<(), String> {
        let job_name = name.clone();
        self.spawn(name, move |progress| load_bytes(&job_name, &bytes, progress).map_err(|e| e.to_string()))
    }

    /// Starts loading a file by path (natively).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn open_path(&mut self, path: std::path::PathBuf) -> Result<(), String> {
        let name = path.file_name().map_or_else(|| path.display().to_string(), |n| n.to_string_lossy().into_owned());
        let job_name = name.clone();
        self.spawn(name, move |progress| {
            // Within the size limit every reader applies (CACHALOT_MAX_INPUT_BYTES).
            let bytes =
                cachalot_trace::input::read(&path).map_err(|e| format!("{}: {}", path.display(), e.reason()))?;
            load_bytes(&job_name, &bytes, progress).map_err(|e| e.to_string())
        })
    }

    /// Starts loading the files dropped on the window this frame. Returns the messages of those
    /// that could not be read.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn open_dropped(&mut self, ctx: &egui::Context) -> Vec<String> {
        let dropped = ctx.input(|i| i.raw.dropped_files.clone());
        dropped
            .into_iter()
            .filter_map(|file| {
                let path = file.path().to_path_buf();
                let started = if path.as_os_str().is_empty() {
                    // Dropped by a platform that hands over the contents, not a path.
                    match file.bytes() {
                        Ok(bytes) => self.open_bytes("dropped file".into(), bytes),
                        Err(e) => Err(format!("dropped file: {e}")),
                    }
                } else {
                    self.open_path(path)
                };
                started.err()
            })
            .collect()
    }

    /// Starts reading the files dropped on the page this frame. The page reads them between
    /// frames, so one that cannot be read shows up in [`Loader::poll`], and this returns none.
    #[cfg(target_arch = "wasm32")]
    pub fn open_dropped(&mut self, ctx: &egui::Context) -> Vec<String> {
        for file in ctx.input(|i| i.raw.dropped_files.clone()) {
            self.inbox.read_dropped(file, ctx.clone());
        }
        Vec::new()
    }

    /// The loads that finished since the last call, in the order they were started.
    pub fn poll(&mut self) -> Vec<Loaded> {
        let mut finished = Vec::new();
        #[cfg(not(target_arch = "wasm32"))]
        self.pending.retain(|l| match l.receiver.try_recv() {
            Ok(result) => {
                finished.push(named(&l.name, result));
                false
            }
            Err(std::sync::mpsc::TryRecvError::Empty) => true,
            Err(std::sync::mpsc::TryRecvError::Disconnected) => {
                finished.push(named(&l.name, Err("the load failed".into())));
                false
            }
        });
        #[cfg(target_arch = "wasm32")]
        {
            for (name, bytes) in self.inbox.take() {
                let started = bytes.map_err(|e| format!("{name}: {e}")).and_then(|bytes| self.open_bytes(name, bytes));
                if let Err(message) = started {
                    finished.push(Err(message));
                }
            }
            // One job per frame, so the page stays responsive between files.
            if let Some(mut pending) = self.pending.pop()
                && let Some(job) = pending.job.take()
            {
                // The parse runs inside the animation frame that then draws its run: done
                // between frames instead (in the callback that received the bytes), it was a
                // long task after which Chromium held the page's next frame back by up to a
                // second (BENCHMARKS.md §10).
                mark(&format!("cachalot load {}", pending.name));
                finished.push(named(&pending.name, job(&pending.progress)));
                mark(&format!("cachalot loaded {}", pending.name));
            }
        }
        finished
    }

    /// Waits until every load has finished and returns them all (for the command line and
    /// tests).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn wait(&mut self) -> Vec<Loaded> {
        std::mem::take(&mut self.pending)
            .into_iter()
            .map(|l| {
                let result = l.receiver.recv().unwrap_or_else(|_| Err(format!("{}: the load failed", l.name)));
                named(&l.name, result)
            })
            .collect()
    }

    /// A progress bar per file loading.
    pub fn progress_bars(&self, ui: &mut egui::Ui) {
        for l in &self.pending {
            ui.add(
                egui::ProgressBar::new(l.progress.fraction()).desired_width(140.0).text(format!("loading {}", l.name)),
            );
        }
        #[cfg(target_arch = "wasm32")]
        for name in self.inbox.arriving() {
            ui.add(egui::ProgressBar::new(0.0).animate(true).desired_width(140.0).text(format!("receiving {name}")));
        }
    }

    /// Opens the browser's file picker; the chosen files load on later frames.
    #[cfg(target_arch = "wasm32")]
    pub fn pick_files(&self, ctx: &egui::Context) {
        self.inbox.pick_files(ctx.clone());
    }

    /// Fetches `url` from the page's server and opens it (in the browser).
    #[cfg(target_arch = "wasm32")]
    pub fn fetch(&self, url: String, ctx: &egui::Context) {
        self.inbox.fetch(url, ctx.clone());
    }
}

/// Darkens the window with "Drop to open" while files are dragged over it.
pub fn drop_hint(ctx: &egui::Context) {
    let hovering = ctx.input(|i| !i.raw.hovered_files.is_empty());
    if hovering {
        let painter = ctx.layer_painter(egui::LayerId::new(egui::Order::Foreground, egui::Id::unique("drop")));
        let rect = ctx.content_rect();
        painter.rect_filled(rect, 0, egui::Color32::from_black_alpha(180));
        painter.text(
            rect.center(),
            egui::Align2::CENTER_CENTER,
            "Drop to open",
            egui::FontId::proportional(28.0),
            egui::Color32::WHITE,
        );
    }
}
