//! Writing an output file whole or not at all: the one way every file the project writes (the
//! command line's snapshots, PNGs and replays, the viewer's saved runs and screenshots, the
//! out-of-memory snapshots) reaches the disk.
//!
//! The bytes go to a temporary file in the target's own folder, which is flushed to the disk
//! and only then renamed over the target: a rename within one file system replaces the target
//! in one step, so a reader sees the previous file or the new one, never a truncated mix. A
//! full disk, a missing folder or a killed process leaves the previous file as it was (and no
//! temporary file behind, except after a kill).
//!
//! ```
//! let path = std::env::temp_dir().join(format!("cachalot-output-doc-{}", std::process::id()));
//! cachalot_trace::output::write_atomic(&path, b"first")?;
//! cachalot_trace::output::write_atomic(&path, b"second")?;
//! assert_eq!(std::fs::read(&path)?, b"second");
//! // A folder that does not exist: an error naming the file, nothing written.
//! assert!(cachalot_trace::output::write_atomic(&path.join("nope.json"), b"x").is_err());
//! std::fs::remove_file(&path)?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// Why an output file was not written; the previous file at that path, if any, is untouched.
#[derive(Debug, thiserror::Error)]
#[error("{}: cannot write: {source}", path.display())]
pub struct OutputError {
    /// The file that was to be written.
    pub path: PathBuf,
    /// What the system said.
    #[source]
    pub source: std::io::Error,
}

/// Writes `bytes` to `path` atomically: into a temporary file beside it, synced, then renamed
/// over `path`. On any error the temporary file is removed and `path` is as it was.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), OutputError> {
    write_atomic_with(path, |file| file.write_all(bytes))
}

/// As [`write_atomic`], with the content written by `write` into the temporary file (through a
/// buffer): for output produced piece by piece, such as an encoded image.
pub fn write_atomic_with(
    path: &Path,
    write: impl FnOnce(&mut dyn Write) -> std::io::Result<()>,
) -> Result<(), OutputError> {
    let error = |source| OutputError { path: path.to_path_buf(), source };
    let temporary = temporary_beside(path).map_err(error)?;
    let written = (|| {
        let file = std::fs::OpenOptions::new().write(true).create_new(true).open(&temporary)?;
        let mut buffered = std::io::BufWriter::new(file);
        write(&mut buffered)?;
        let file = buffered.into_inner().map_err(std::io::IntoInnerError::into_error)?;
        // The data must be on the disk before the name points at it, or a crash right after
        // the rename could leave an empty file under the new name.
        file.sync_all()?;
        std::fs::rename(&temporary, path)
    })();
    if let Err(source) = written {
        let _ = std::fs::remove_file(&temporary);
        return Err(error(source));
    }
    Ok(())
}

/// A name for the temporary file in `path`'s folder (a rename only replaces a file in one step
/// within one file system): `.NAME.PID.N.tmp`, unique within this process by `N`.
fn temporary_beside(path: &Path) -> std::io::Result<PathBuf> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let name = path
        .file_name()
        .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a file name (it names a folder)"))?;
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let temporary = format!(".{}.{}.{n}.tmp", name.to_string_lossy(), std::process::id());
    Ok(path.with_file_name(temporary))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("cachalot-output-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("creates the scratch folder");
        dir
    }

    fn entries(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .expect("lists the folder")
            .map(|e| e.expect("an entry").file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn replaces_the_previous_file_and_leaves_nothing_else() {
        let dir = scratch("replace");
        let path = dir.join("out.json");
        write_atomic(&path, b"old").expect("writes");
        write_atomic(&path, b"new content").expect("writes");
        assert_eq!(std::fs::read(&path).expect("reads"), b"new content");
        assert_eq!(entries(&dir), ["out.json"]);
        std::fs::remove_dir_all(dir).ok();
    }

    /// A write that fails half-way (as on a full disk) leaves the previous file whole and no
    /// temporary file behind.
    #[test]
    fn a_failed_write_leaves_the_previous_file_untouched() {
        let dir = scratch("failed");
        let path = dir.join("out.json");
        write_atomic(&path, b"previous").expect("writes");
        let error = write_atomic_with(&path, |w| {
            w.write_all(b"half of it")?;
            Err(std::io::Error::other("No space left on device"))
        })
        .expect_err("the write fails");
        assert_eq!(std::fs::read(&path).expect("reads"), b"previous");
        assert_eq!(entries(&dir), ["out.json"]);
        let message = error.to_string();
        assert!(message.contains("out.json: cannot write: No space left on device"), "{message}");
        std::fs::remove_dir_all(dir).ok();
    }

    /// A missing folder, a folder's own name and a file system that takes no new files.
    #[cfg(target_os = "linux")]
    #[test]
    fn a_folder_that_is_not_there_or_not_a_file_name_is_an_error() {
        let dir = scratch("missing");
        assert!(write_atomic(&dir.join("no/such/folder.json"), b"x").is_err());
        assert!(write_atomic(Path::new("/"), b"x").is_err());
        assert!(write_atomic(Path::new("/proc/cachalot-output-test"), b"x").is_err());
        std::fs::remove_dir_all(dir).ok();
    }
}
