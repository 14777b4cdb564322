//! One HTTP/1.1 exchange of `gpucap metrics --listen`: the request head read within
//! a time, the answer (pure), written within a time. The connection closes after it
//! (`Connection: close`: no keep-alive, so no idle connection to bound).

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use super::CONTENT_TYPE;

/// What a request gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    /// `GET /metrics` (with `head`: `HEAD /metrics`, the same without the body).
    Metrics { head: bool },
    /// Another path: 404.
    NotFound,
    /// Another method on /metrics: 405.
    MethodNotAllowed,
    /// Not an HTTP/1.x request line: 400.
    BadRequest,
}

/// The answer to a request whose head (request line and headers) is `head`. A query
/// string is ignored (`/metrics?x=1` is `/metrics`).
pub fn route(head: &[u8]) -> Route {
    let line = head.split(|&b| b == b'\n').next().unwrap_or_default();
    let Ok(line) = std::str::from_utf8(line) else {
        return Route::BadRequest;
    };
    let mut words = line.trim_end_matches('\r').split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (words.next(), words.next(), words.next(), words.next())
    else {
        return Route::BadRequest;
    };
    if !version.starts_with("HTTP/1.") || method.is_empty() || !target.starts_with('/') {
        return Route::BadRequest;
    }
    let path = target.split('?').next().unwrap_or(target);
    if path != "/metrics" {
        return Route::NotFound;
    }
    match method {
        "GET" => Route::Metrics { head: false },
        "HEAD" => Route::Metrics { head: true },
        _ => Route::MethodNotAllowed,
    }
}

/// The bytes of an HTTP/1.1 response, which closes the connection.
pub fn response(status: &str, content_type: &str, body: &str, head_only: bool) -> Vec<u8> {
    let mut out = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n\
         Connection: close\r\n",
        body.len()
    );
    if status.starts_with("405") {
        out.push_str("Allow: GET, HEAD\r\n");
    }
    out.push_str("\r\n");
    let mut bytes = out.into_bytes();
    if !head_only {
        bytes.extend_from_slice(body.as_bytes());
    }
    bytes
}

/// The longest request head read; a longer one is answered 400.
pub const MAX_HEAD: usize = 16 * 1024;

/// How long a client may take to send its whole request head, from its connection on:
/// a client that sends nothing, or a byte now and then, is cut off after this long.
pub const REQUEST_TIME: Duration = Duration::from_secs(5);

/// How long a client may take to read the whole answer.
pub const ANSWER_TIME: Duration = Duration::from_secs(5);

/// The time left before `deadline`; None once it passed.
fn left(deadline: Instant) -> Option<Duration> {
    deadline
        .checked_duration_since(Instant::now())
        .filter(|d| !d.is_zero())
}

/// Reads a request head (up to the blank line) before `deadline` (a client sending a
/// byte now and then is cut off too). None: the client sent nothing usable (closed,
/// too slow); a head longer than [`MAX_HEAD`] reads as an empty one (400).
pub fn read_head(mut stream: &TcpStream, deadline: Instant) -> Option<Vec<u8>> {
    let mut head = Vec::new();
    let mut buf = [0u8; 2048];
    loop {
        stream.set_read_timeout(Some(left(deadline)?)).ok()?;
        let n = match stream.read(&mut buf) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => return None,
        };
        if n == 0 {
            return (!head.is_empty()).then_some(head);
        }
        head.extend_from_slice(&buf[..n]);
        if head.windows(4).any(|w| w == b"\r\n\r\n") || head.windows(2).any(|w| w == b"\n\n") {
            return Some(head);
        }
        if head.len() > MAX_HEAD {
            return Some(Vec::new());
        }
    }
}

/// Writes `bytes` before `deadline` (a client reading a byte now and then is cut off
/// too).
pub fn write_before(mut stream: &TcpStream, mut bytes: &[u8], deadline: Instant) -> io::Result<()> {
    while !bytes.is_empty() {
        let left = left(deadline).ok_or(io::ErrorKind::TimedOut)?;
        stream.set_write_timeout(Some(left))?;
        match stream.write(bytes) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => bytes = &bytes[n..],
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// The answer to the request whose head is `head`; `scrape` gives the exposition
/// (called for GET and HEAD /metrics only).
pub fn answer(head: &[u8], scrape: impl FnOnce() -> String) -> Vec<u8> {
    let text = "text/plain; charset=utf-8";
    match route(head) {
        Route::Metrics { head } => response("200 OK", CONTENT_TYPE, &scrape(), head),
        Route::NotFound => response(
            "404 Not Found",
            text,
            "not found: gpucap serves its metrics at /metrics\n",
            false,
        ),
        Route::MethodNotAllowed => response(
            "405 Method Not Allowed",
            text,
            "/metrics answers GET and HEAD\n",
            false,
        ),
        Route::BadRequest => response("400 Bad Request", text, "bad request\n", false),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes() {
        let r = |s: &str| route(s.as_bytes());
        assert_eq!(
            r("GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"),
            Route::Metrics { head: false }
        );
        assert_eq!(
            r("GET /metrics?x=1 HTTP/1.0\r\n\r\n"),
            Route::Metrics { head: false }
        );
        assert_eq!(
            r("HEAD /metrics HTTP/1.1\r\n\r\n"),
            Route::Metrics { head: true }
        );
        assert_eq!(r("GET / HTTP/1.1\r\n\r\n"), Route::NotFound);
        assert_eq!(r("GET /metrics/ HTTP/1.1\r\n\r\n"), Route::NotFound);
        assert_eq!(r("GET /favicon.ico HTTP/1.1\r\n\r\n"), Route::NotFound);
        assert_eq!(r("POST /metrics HTTP/1.1\r\n\r\n"), Route::MethodNotAllowed);
        assert_eq!(r("GET /metrics\r\n\r\n"), Route::BadRequest);
        assert_eq!(r("GET /metrics SPDY/3\r\n\r\n"), Route::BadRequest);
        assert_eq!(r("GET metrics HTTP/1.1\r\n\r\n"), Route::BadRequest);
        assert_eq!(r("\u{1b}\r\n\r\n"), Route::BadRequest);
        assert_eq!(route(b"GET /\xff HTTP/1.1\r\n\r\n"), Route::BadRequest);
        assert_eq!(r(""), Route::BadRequest);
    }

    #[test]
    fn responses() {
        let ok = String::from_utf8(response("200 OK", CONTENT_TYPE, "a 1\n", false)).unwrap();
        assert_eq!(
            ok,
            "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n\
             Content-Length: 4\r\nConnection: close\r\n\r\na 1\n"
        );
        let head = String::from_utf8(response("200 OK", CONTENT_TYPE, "a 1\n", true)).unwrap();
        assert!(head.ends_with("Content-Length: 4\r\nConnection: close\r\n\r\n"));
        let no = String::from_utf8(response("405 Method Not Allowed", "t", "", false)).unwrap();
        assert!(no.contains("\r\nAllow: GET, HEAD\r\n"), "{no}");
    }
}
