//! `cachalot serve` under hostile visitors: thousands of idle connections, an endless request
//! line and a request head sent byte by byte must not stop it serving the page.

#![allow(clippy::unwrap_used, reason = "test helpers outside #[test] functions")]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A `cachalot serve` process on a free port, killed on drop.
struct Server {
    child: Child,
    port: u16,
    _dir: TempDir,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A folder removed on drop.
struct TempDir(std::path::PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn start(test: &str) -> Server {
    let dir = std::env::temp_dir().join(format!("cachalot-serve-{test}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("index.html"), "<html>cachalot</html>").unwrap();
    let port = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap().local_addr().unwrap().port();
    let mut child = Command::new(env!("CARGO_BIN_EXE_cachalot"))
        .args(["serve", "--port", &port.to_string(), "--dir", &dir.display().to_string()])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    // The first line says it is listening.
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    assert!(line.starts_with("serving"), "{line}");
    Server { child, port, _dir: TempDir(dir) }
}

/// `GET /` on a fresh connection: the status line and body.
fn get_index(port: u16) -> String {
    let mut stream = TcpStream::connect((Ipv4Addr::LOCALHOST, port)).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    stream.write_all(b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n").unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    response
}

/// Raises this process's open-file limit to its hard limit (the idle connections need one
/// descriptor each here; the server keeps only a bounded number of them).
#[cfg(unix)]
fn raise_file_limit(wanted: usize) -> usize {
    let wanted = wanted as libc::rlim_t;
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit/setrlimit write and read the struct passed; RLIMIT_NOFILE is valid.
    unsafe {
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit);
        if limit.rlim_cur < wanted {
            limit.rlim_cur = limit.rlim_max.min(wanted);
            libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
        }
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit);
    }
    usize::try_from(limit.rlim_cur).unwrap_or(usize::MAX)
}

#[cfg(not(unix))]
fn raise_file_limit(wanted: usize) -> usize {
    wanted
}

#[test]
fn five_thousand_idle_connections_do_not_lock_the_page_out() {
    const IDLE: usize = 5_000;
    let available = raise_file_limit(IDLE + 256);
    assert!(available >= IDLE + 64, "the open-file limit is {available}: raise it to run this test");
    let server = start("idle");
    let mut idle = Vec::with_capacity(IDLE);
    for _ in 0..IDLE {
        idle.push(TcpStream::connect((Ipv4Addr::LOCALHOST, server.port)).unwrap());
    }
    // Some idle ones send half a request line and stop.
    for stream in idle.iter_mut().step_by(7) {
        let _ = stream.write_all(b"GET /index.html HT");
    }
    let started = Instant::now();
    let response = get_index(server.port);
    assert!(response.starts_with("HTTP/1.1 200 OK"), "{response}");
    assert!(response.ends_with("<html>cachalot</html>"), "{response}");
    // Served before any idle connection timed out (HEAD_TIMEOUT, 10 s): the server closed the
    // oldest idle ones to make room, rather than making the page wait for them.
    assert!(started.elapsed() < Duration::from_secs(8), "took {:?}", started.elapsed());
}

#[test]
fn an_endless_request_line_is_refused() {
    let server = start("endless");
    let mut stream = TcpStream::connect((Ipv4Addr::LOCALHOST, server.port)).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    // 1 MiB without a line end: the server answers 431 after 16 KiB and closes.
    let chunk = vec![b'A'; 64 * 1024];
    let mut sent = 0;
    for _ in 0..16 {
        match stream.write_all(&chunk) {
            Ok(()) => sent += chunk.len(),
            Err(_) => break, // closed by the server, as it should
        }
    }
    let mut response = Vec::new();
    let _ = stream.read_to_end(&mut response);
    let response = String::from_utf8_lossy(&response);
    assert!(response.starts_with("HTTP/1.1 431") || sent < 1 << 20, "{response}");
    assert!(get_index(server.port).starts_with("HTTP/1.1 200 OK"));
}

#[test]
fn a_slow_head_is_served_and_bad_ones_are_answered() {
    let server = start("slow");
    let mut stream = TcpStream::connect((Ipv4Addr::LOCALHOST, server.port)).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    for byte in b"GET /index.html HTTP/1.1\r\n\r\n" {
        stream.write_all(&[*byte]).unwrap();
        std::thread::sleep(Duration::from_millis(5));
    }
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    assert!(response.starts_with("HTTP/1.1 200 OK"), "{response}");
    for (request, status) in [
        (&b"\x00\x01\x02\r\n\r\n"[..], "HTTP/1.1 400"),
        (b"POST / HTTP/1.1\r\n\r\n", "HTTP/1.1 405"),
        (b"GET /../../etc/passwd HTTP/1.1\r\n\r\n", "HTTP/1.1 404"),
    ] {
        let mut stream = TcpStream::connect((Ipv4Addr::LOCALHOST, server.port)).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        stream.write_all(request).unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).unwrap();
        assert!(response.starts_with(status), "{request:?}: {response}");
    }
}

/// A link inside the served folder to a file outside it is not followed; a link to a file
/// inside it is.
#[cfg(unix)]
#[test]
fn links_out_of_the_folder_are_not_served() {
    let server = start("links");
    let outside = std::env::temp_dir().join(format!("cachalot-serve-outside-{}", std::process::id()));
    std::fs::write(&outside, "the secret outside").unwrap();
    let folder = &server._dir.0;
    std::os::unix::fs::symlink(&outside, folder.join("leak.html")).unwrap();
    std::os::unix::fs::symlink(folder.join("index.html"), folder.join("alias.html")).unwrap();
    let get = |path: &str| {
        let mut stream = TcpStream::connect((Ipv4Addr::LOCALHOST, server.port)).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        stream.write_all(format!("GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n").as_bytes()).unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).unwrap();
        response
    };
    let leaked = get("/leak.html");
    std::fs::remove_file(&outside).unwrap();
    assert!(leaked.starts_with("HTTP/1.1 404"), "{leaked}");
    assert!(!leaked.contains("secret"), "{leaked}");
    let alias = get("/alias.html");
    assert!(alias.starts_with("HTTP/1.1 200") && alias.ends_with("<html>cachalot</html>"), "{alias}");
}
