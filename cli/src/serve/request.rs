//! The request head of `cachalot serve`: read in bounded pieces from a socket that may be slow,
//! idle or hostile, and parsed into the method and target. Standard library only, so that the
//! fuzz target (`fuzz/fuzz_targets/http_request.rs`) builds it on its own.

/// The most bytes a request head (request line and headers) may have. A browser's request for
/// a static file needs well under 2 KiB; a longer head is answered 431 and the connection closed.
pub const MAX_HEAD_BYTES: usize = 16 * 1024;

/// A request head as far as it has arrived.
#[derive(Debug, Default)]
pub struct Head {
    bytes: Vec<u8>,
}

/// What a complete head asks for.
#[derive(Debug, PartialEq, Eq)]
pub struct Request {
    /// `GET`, `HEAD` or anything else (answered 405).
    pub method: String,
    /// The path with its query, as sent.
    pub target: String,
}

/// Why a head cannot be served.
#[derive(Debug, PartialEq, Eq)]
pub enum Refusal {
    /// Longer than [`MAX_HEAD_BYTES`]: 431.
    TooLarge,
    /// Not an HTTP request line: 400.
    Malformed,
}

impl Refusal {
    /// The response for the refusal.
    pub fn response(&self) -> &'static [u8] {
        match self {
            Refusal::TooLarge => {
                b"HTTP/1.1 431 Request Header Fields Too Large\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            }
            Refusal::Malformed => b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
        }
    }
}

impl Head {
    /// Bytes received so far.
    pub fn received(&self) -> usize {
        self.bytes.len()
    }

    /// Adds bytes read from the socket. `Ok(Some(_))` once the head is complete (an empty line
    /// ends it), `Ok(None)` while more is needed; refused as soon as it is too long or its
    /// request line cannot be one.
    pub fn push(&mut self, data: &[u8]) -> Result<Option<Request>, Refusal> {
        // Only the tail that could complete "\r\n\r\n" with the new bytes is searched again.
        let from = self.bytes.len().saturating_sub(3);
        self.bytes.extend_from_slice(data);
        let end = find_end(&self.bytes[from..]).map(|at| from + at);
        match end {
            Some(end) if end <= MAX_HEAD_BYTES => parse(&self.bytes[..end]).map(Some),
            _ if self.bytes.len() > MAX_HEAD_BYTES => Err(Refusal::TooLarge),
            Some(_) => Err(Refusal::TooLarge),
            None => Ok(None),
        }
    }
}

/// Where the head ends: the index just past the first empty line (`\r\n\r\n`, or `\n\n` from
/// a hand-typed request).
fn find_end(bytes: &[u8]) -> Option<usize> {
    (0..bytes.len()).find_map(|i| match &bytes[i..] {
        [b'\r', b'\n', b'\r', b'\n', ..] => Some(i + 4),
        [b'\n', b'\n', ..] => Some(i + 2),
        _ => None,
    })
}

/// Parses a complete head: `METHOD TARGET HTTP/x.y`, then headers, which are ignored.
pub fn parse(head: &[u8]) -> Result<Request, Refusal> {
    let line_end = head.iter().position(|&b| b == b'\n').unwrap_or(head.len());
    let line = std::str::from_utf8(&head[..line_end]).map_err(|_| Refusal::Malformed)?;
    let mut parts = line.trim_end_matches('\r').split(' ');
    let (Some(method), Some(target), Some(version), None) = (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(Refusal::Malformed);
    };
    if method.is_empty() || !target.starts_with('/') || !version.starts_with("HTTP/") {
        return Err(Refusal::Malformed);
    }
    Ok(Request { method: method.to_owned(), target: target.to_owned() })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heads_arrive_in_pieces() {
        let mut head = Head::default();
        assert_eq!(head.push(b"GET /app.js HTTP/1.1\r\nHost: x\r"), Ok(None));
        let request = head.push(b"\n\r\n").unwrap().unwrap();
        assert_eq!((request.method.as_str(), request.target.as_str()), ("GET", "/app.js"));
    }

    #[test]
    fn long_or_broken_heads_are_refused() {
        let mut head = Head::default();
        let line = vec![b'a'; 4096];
        let mut outcome = Ok(None);
        for _ in 0..5 {
            outcome = head.push(&line);
            if outcome.is_err() {
                break;
            }
        }
        assert_eq!(outcome, Err(Refusal::TooLarge));
        for broken in [&b"GET\r\n\r\n"[..], b"GET x HTTP/1.1\r\n\r\n", b"\xff / HTTP/1.1\r\n\r\n", b"\r\n\r\n"] {
            assert_eq!(Head::default().push(broken), Err(Refusal::Malformed), "{broken:?}");
        }
    }
}
