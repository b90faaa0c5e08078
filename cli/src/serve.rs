//! `cachalot serve [--port N] [--dir DIR]`: serves the web build (`scripts/build-web.sh`
//! writes it to `target/web`) on localhost. A small std-only HTTP/1.1 server: GET and HEAD of
//! static files, nothing else; it only listens on the loopback interface.
//!
//! Its resources are bounded whatever visitors send: one thread accepts connections and reads
//! their request heads without blocking (at most [`MAX_PENDING`] at once, each for at most
//! [`HEAD_TIMEOUT`], each head at most [`request::MAX_HEAD_BYTES`]; when full, the connection
//! waiting longest is closed, so idle connections cannot lock a page out), and a fixed pool of
//! [`WORKERS`] threads, started before the first connection, answers complete requests.

mod request;

use std::collections::VecDeque;
use std::io::{ErrorKind, Read, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::path::{Component, Path, PathBuf};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow};
use request::{Head, Request};

use crate::failure::{Failure, Outcome};

/// Arguments of `cachalot serve`.
#[derive(Clone, Debug, clap::Args)]
pub struct ServeArgs {
    /// Port on 127.0.0.1.
    #[arg(long, default_value_t = 8765)]
    pub port: u16,
    /// Folder to serve (the web build).
    #[arg(long, default_value = "target/web")]
    pub dir: PathBuf,
}

fn content_type(path: &Path) -> &'static str {
    match path.extension().and_then(|e| e.to_str()) {
        Some("html") => "text/html; charset=utf-8",
        Some("js") => "text/javascript; charset=utf-8",
        Some("wasm") => "application/wasm",
        Some("css") => "text/css; charset=utf-8",
        Some("json") => "application/json",
        Some("png") => "image/png",
        Some("svg") => "image/svg+xml",
        _ => "application/octet-stream",
    }
}

/// The file a request path names inside `root`, refusing anything that climbs out of it.
fn resolve(root: &Path, target: &str) -> Option<PathBuf> {
    let path = target.split(['?', '#']).next().unwrap_or("/");
    let relative = Path::new(path.trim_start_matches('/'));
    if relative.components().any(|c| !matches!(c, Component::Normal(_))) {
        return None;
    }
    let full = root.join(relative);
    if full.is_dir() { Some(full.join("index.html")) } else { Some(full) }
}

/// The regular file at `path` if its real path (symbolic links followed) lies inside
/// `canonical_root`, the served folder's own real path: a link in the folder that points out
/// of it, or at a device or a pipe, is not served.
fn confine(canonical_root: &Path, path: &Path) -> Option<PathBuf> {
    let real = std::fs::canonicalize(path).ok()?;
    let regular = std::fs::metadata(&real).is_ok_and(|m| m.is_file());
    (regular && real.starts_with(canonical_root)).then_some(real)
}

/// Threads that answer complete requests.
pub const WORKERS: usize = 8;
/// Complete requests waiting for a worker; beyond that a request is answered 503.
const QUEUE: usize = 64;
/// Connections whose request head is still arriving; beyond that the oldest is closed.
pub const MAX_PENDING: usize = 256;
/// How long a connection may take to send its request head.
pub const HEAD_TIMEOUT: Duration = Duration::from_secs(10);
/// How long writing a response may stall before the connection is dropped.
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);
/// The accept thread's pause when no pending connection had anything to read.
const IDLE_POLL: Duration = Duration::from_millis(2);

/// A connection whose head is arriving.
struct Pending {
    stream: TcpStream,
    head: Head,
    since: Instant,
}

/// Answers one complete request.
fn respond(stream: &mut TcpStream, root: &Path, request: &Request) -> std::io::Result<()> {
    let (method, target) = (request.method.as_str(), request.target.as_str());
    if method != "GET" && method != "HEAD" {
        return stream.write_all(b"HTTP/1.1 405 Method Not Allowed\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
    }
    let file =
        resolve(root, target).and_then(|p| confine(root, &p)).and_then(|p| std::fs::read(&p).ok().map(|b| (p, b)));
    match file {
        Some((path, body)) => {
            let header = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: {}\r\nContent-Length: {}\r\nCache-Control: no-cache\r\nConnection: close\r\n\r\n",
                content_type(&path),
                body.len()
            );
            stream.write_all(header.as_bytes())?;
            if method == "GET" {
                stream.write_all(&body)?;
            }
            Ok(())
        }
        None => stream.write_all(b"HTTP/1.1 404 Not Found\r\nContent-Length: 9\r\nConnection: close\r\n\r\nnot found"),
    }
}

/// A worker: answers requests from the queue until the server stops.
fn work(queue: &Mutex<Receiver<(TcpStream, Request)>>, root: &Path) {
    loop {
        // The lock is held only while waiting for the next request, not while answering it.
        let next = match queue.lock() {
            Ok(receiver) => receiver.recv(),
            Err(_) => return,
        };
        let Ok((mut stream, request)) = next else { return };
        let prepared = stream.set_nonblocking(false).and_then(|()| stream.set_write_timeout(Some(WRITE_TIMEOUT)));
        if let Err(e) = prepared.and_then(|()| respond(&mut stream, root, &request)) {
            eprintln!("cachalot serve: {e}");
        }
    }
}

/// Reads what has arrived on `pending`: `Some` when the connection is finished with (answered,
/// handed to a worker, refused or closed), `None` while its head is incomplete.
fn read_head(pending: &mut Pending, workers: &SyncSender<(TcpStream, Request)>) -> Option<()> {
    let mut buffer = [0u8; 4096];
    loop {
        match pending.stream.read(&mut buffer) {
            Ok(0) => return Some(()),
            Ok(n) => match pending.head.push(&buffer[..n]) {
                Ok(None) => continue,
                Ok(Some(request)) => {
                    let stream = match pending.stream.try_clone() {
                        Ok(stream) => stream,
                        Err(_) => return Some(()),
                    };
                    if let Err(TrySendError::Full((mut stream, _)) | TrySendError::Disconnected((mut stream, _))) =
                        workers.try_send((stream, request))
                    {
                        let _ = stream.write_all(
                            b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                        );
                    }
                    return Some(());
                }
                Err(refusal) => {
                    let _ = pending.stream.write_all(refusal.response());
                    return Some(());
                }
            },
            Err(e) if e.kind() == ErrorKind::WouldBlock => return None,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(_) => return Some(()),
        }
    }
}

/// Accepts connections and reads their heads until the listener fails for good.
fn accept_loop(listener: &TcpListener, workers: &SyncSender<(TcpStream, Request)>) -> std::io::Result<()> {
    let mut pending: VecDeque<Pending> = VecDeque::new();
    loop {
        // With nothing pending the thread sleeps in accept; otherwise it polls.
        listener.set_nonblocking(!pending.is_empty())?;
        loop {
            match listener.accept() {
                Ok((stream, _)) => {
                    if stream.set_nonblocking(true).is_err() {
                        continue;
                    }
                    if pending.len() == MAX_PENDING {
                        pending.pop_front(); // the connection that has waited longest
                    }
                    pending.push_back(Pending { stream, head: Head::default(), since: Instant::now() });
                    listener.set_nonblocking(true)?;
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                // Out of file descriptors, a connection reset before it was accepted, ...:
                // the server goes on with the connections it has.
                Err(_) => {
                    if pending.is_empty() {
                        std::thread::sleep(IDLE_POLL);
                    }
                    break;
                }
            }
        }
        let now = Instant::now();
        // Progress: a connection finished, or bytes arrived on one.
        let before = pending.iter().map(|p| p.head.received()).sum::<usize>() + pending.len();
        pending.retain_mut(|p| now.duration_since(p.since) < HEAD_TIMEOUT && read_head(p, workers).is_none());
        let after = pending.iter().map(|p| p.head.received()).sum::<usize>() + pending.len();
        if !pending.is_empty() && before == after {
            std::thread::sleep(IDLE_POLL);
        }
    }
}

/// Runs `cachalot serve` until interrupted.
pub fn run(args: &ServeArgs) -> Outcome {
    let index = args.dir.join("index.html");
    if !index.is_file() {
        return Err(Failure::input(anyhow!(
            "{} not found: build the web viewer first with scripts/build-web.sh",
            index.display()
        )));
    }
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, args.port))
        .with_context(|| format!("cannot listen on 127.0.0.1:{}", args.port))?;
    // Requests are resolved against the folder's real path, which the files served must lie in.
    let root = std::fs::canonicalize(&args.dir).with_context(|| format!("--dir {}", args.dir.display()))?;
    let (sender, receiver) = sync_channel(QUEUE);
    let receiver = Arc::new(Mutex::new(receiver));
    for n in 0..WORKERS {
        let (queue, root) = (Arc::clone(&receiver), root.clone());
        std::thread::Builder::new()
            .name(format!("serve-{n}"))
            .spawn(move || work(&queue, &root))
            .context("cannot start the server's worker threads")?;
    }
    println!("serving {} on http://127.0.0.1:{}/", args.dir.display(), args.port);
    accept_loop(&listener, &sender).context("the listening socket failed")?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_stay_inside_the_root() {
        let root = Path::new("/srv/web");
        assert_eq!(resolve(root, "/app.js?x=1"), Some(root.join("app.js")));
        assert_eq!(resolve(root, "/../etc/passwd"), None);
        assert_eq!(resolve(root, "/a/../../b"), None);
        assert_eq!(content_type(Path::new("x.wasm")), "application/wasm");
    }

    /// A link inside the folder to a file outside it, or to a folder outside it, is not served;
    /// a link to a file inside it is.
    #[cfg(unix)]
    #[test]
    fn links_out_of_the_folder_are_not_followed() {
        let base = std::env::temp_dir().join(format!("cachalot-serve-confine-{}", std::process::id()));
        let (root, outside) = (base.join("web"), base.join("outside"));
        std::fs::create_dir_all(&root).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(root.join("index.html"), "page").unwrap();
        std::fs::write(outside.join("secret"), "secret").unwrap();
        std::os::unix::fs::symlink(outside.join("secret"), root.join("leak")).unwrap();
        std::os::unix::fs::symlink(&outside, root.join("dir")).unwrap();
        std::os::unix::fs::symlink(root.join("index.html"), root.join("alias.html")).unwrap();
        let root = std::fs::canonicalize(&root).unwrap();
        let served = |target: &str| resolve(&root, target).and_then(|p| confine(&root, &p));
        assert_eq!(served("/leak"), None);
        assert_eq!(served("/dir/secret"), None);
        assert_eq!(served("/missing"), None);
        assert_eq!(served("/alias.html"), Some(root.join("index.html")));
        assert_eq!(served("/"), Some(root.join("index.html")));
        std::fs::remove_dir_all(&base).unwrap();
    }
}
