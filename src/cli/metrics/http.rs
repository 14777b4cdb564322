//! One HTTP/1.1 exchange of `gpucap metrics --listen`: the request head read within
//! a time, the answer (pure), written within a time. The connection closes after it
//! (`Connection: close`: no keep-alive, so no idle connection to bound).

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use super::CONTENT_TYPE;

/// What a request gets, and whether it was `HEAD` (`head`: the same answer without its
/// body, whatever the answer: RFC 9110, 9.3.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    /// `GET /metrics` or `HEAD /metrics`.
    Metrics { head: bool },
    /// Another path: 404.
    NotFound { head: bool },
    /// Another method on /metrics: 405.
    MethodNotAllowed,
    /// Not an HTTP/1.x request line: 400.
    BadRequest,
}

/// The answer to a request whose head (request line and headers) is `head`. A query
/// string is ignored (`/metrics?x=1` is `/metrics`), and a target in absolute form
/// (`http://host:9400/metrics`, which a server must accept: RFC 9112, 3.2.2) is its path.
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
    let Some(target) = origin_form(target) else {
        return Route::BadRequest;
    };
    if !version.starts_with("HTTP/1.") || method.is_empty() {
        return Route::BadRequest;
    }
    let head = method == "HEAD";
    let path = target.split('?').next().unwrap_or(target);
    if path != "/metrics" {
        return Route::NotFound { head };
    }
    match method {
        "GET" | "HEAD" => Route::Metrics { head },
        _ => Route::MethodNotAllowed,
    }
}

/// A request target as a path (`/metrics?x=1`): itself, or the path of one in absolute
/// form (`http://host:9400/metrics?x=1`; `http://host` alone is `/`). None: neither.
fn origin_form(target: &str) -> Option<&str> {
    if target.starts_with('/') {
        return Some(target);
    }
    let lower = target
        .get(..8)
        .map(str::to_ascii_lowercase)
        .unwrap_or_default();
    let rest = if lower.starts_with("http://") {
        &target[7..]
    } else if lower.starts_with("https://") {
        &target[8..]
    } else {
        return None;
    };
    match rest.find(['/', '?']) {
        Some(i) if rest[i..].starts_with('/') => Some(&rest[i..]),
        Some(_) | None => Some("/"),
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
/// (called for GET and HEAD /metrics only), or why there is none: then the answer is
/// 500 with that line, so that Prometheus marks the target down (`up` 0) rather than
/// taking an empty answer for no pools.
pub fn answer(head: &[u8], scrape: impl FnOnce() -> Result<String, String>) -> Vec<u8> {
    let text = "text/plain; charset=utf-8";
    match route(head) {
        Route::Metrics { head } => match scrape() {
            Ok(body) => response("200 OK", CONTENT_TYPE, &body, head),
            Err(e) => response("500 Internal Server Error", text, &format!("{e}\n"), head),
        },
        Route::NotFound { head } => response(
            "404 Not Found",
            text,
            "not found: gpucap serves its metrics at /metrics\n",
            head,
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
        let not_found = Route::NotFound { head: false };
        assert_eq!(r("GET / HTTP/1.1\r\n\r\n"), not_found);
        assert_eq!(r("GET /metrics/ HTTP/1.1\r\n\r\n"), not_found);
        assert_eq!(r("GET /favicon.ico HTTP/1.1\r\n\r\n"), not_found);
        assert_eq!(
            r("HEAD /x HTTP/1.1\r\n\r\n"),
            Route::NotFound { head: true }
        );
        // The absolute form of a target is its path.
        for t in [
            "http://127.0.0.1:9400/metrics",
            "HTTP://node:9400/metrics?x=1",
            "https://node/metrics",
        ] {
            assert_eq!(
                r(&format!("GET {t} HTTP/1.1\r\n\r\n")),
                Route::Metrics { head: false },
                "{t}"
            );
        }
        assert_eq!(r("GET http://node:9400 HTTP/1.1\r\n\r\n"), not_found);
        assert_eq!(r("GET http://node?metrics HTTP/1.1\r\n\r\n"), not_found);
        assert_eq!(
            r("GET ftp://node/metrics HTTP/1.1\r\n\r\n"),
            Route::BadRequest
        );
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
        // HEAD gets no body, whatever the answer; a failed reading is a 500 with its line.
        let a = |req: &str, r: Result<String, String>| {
            String::from_utf8(answer(req.as_bytes(), || r)).unwrap()
        };
        let nf = a("HEAD /x HTTP/1.1\r\n\r\n", Ok(String::new()));
        assert!(
            nf.starts_with("HTTP/1.1 404 ") && nf.ends_with("\r\n\r\n"),
            "{nf}"
        );
        let e = a(
            "GET /metrics HTTP/1.1\r\n\r\n",
            Err("gpucap: --all: d: no".into()),
        );
        assert!(
            e.starts_with("HTTP/1.1 500 ") && e.ends_with("\r\n\r\ngpucap: --all: d: no\n"),
            "{e}"
        );
    }
}
