//! `cachalot serve [--port N] [--dir DIR]`: serves the web build (`scripts/build-web.sh`
//! writes it to `target/web`) on localhost. A small std-only HTTP/1.1 server: GET and HEAD of
//! static files, nothing else; it only listens on the loopback interface.

use std::io::{BufRead, BufReader, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::path::{Component, Path, PathBuf};

use anyhow::{Context, anyhow};

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

fn respond(stream: &mut TcpStream, root: &Path) -> std::io::Result<()> {
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut request = String::new();
    reader.read_line(&mut request)?;
    // Read (and ignore) the headers.
    let mut line = String::new();
    while reader.read_line(&mut line)? > 2 {
        line.clear();
    }
    let mut parts = request.split_whitespace();
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or("/"));
    if method != "GET" && method != "HEAD" {
        return stream.write_all(b"HTTP/1.1 405 Method Not Allowed\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
    }
    let file = resolve(root, target).and_then(|p| std::fs::read(&p).ok().map(|b| (p, b)));
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
    println!("serving {} on http://127.0.0.1:{}/", args.dir.display(), args.port);
    for stream in listener.incoming() {
        let Ok(mut stream) = stream else { continue };
        let root = args.dir.clone();
        // One short-lived thread per connection: pages load a handful of files.
        std::thread::spawn(move || {
            if let Err(e) = respond(&mut stream, &root) {
                eprintln!("cachalot serve: {e}");
            }
        });
    }
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
}
