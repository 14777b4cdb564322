//! The HTTP/1.1 server of `gpucap metrics --listen`.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use super::{CONTENT_TYPE, Reader, Reading, exposition};

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
const MAX_HEAD: usize = 16 * 1024;

/// How long a client may take to send its whole request (and, separately, to read the
/// answer): one thread serves every request, so a slow client holds the others up at
/// most this long.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(5);

/// Reads a request head (up to the blank line) within [`CLIENT_TIMEOUT`] in all (a
/// client sending a byte now and then is cut off too). None: the client sent nothing
/// usable (closed, too slow, too long).
fn read_head(stream: &mut TcpStream) -> Option<Vec<u8>> {
    let deadline = Instant::now() + CLIENT_TIMEOUT;
    let mut head = Vec::new();
    let mut buf = [0u8; 2048];
    loop {
        let left = deadline
            .checked_duration_since(Instant::now())
            .filter(|d| !d.is_zero())?;
        stream.set_read_timeout(Some(left)).ok()?;
        let n = stream.read(&mut buf).ok()?;
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

/// Answers one connection.
fn handle(mut stream: TcpStream, reader: &mut Reader, log: &mut Log) {
    let _ = stream.set_write_timeout(Some(CLIENT_TIMEOUT));
    let Some(head) = read_head(&mut stream) else {
        return;
    };
    let text = "text/plain; charset=utf-8";
    let answer = match route(&head) {
        Route::Metrics { head } => {
            let body = scrape(reader, log);
            response("200 OK", CONTENT_TYPE, &body, head)
        }
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
    };
    let _ = stream.write_all(&answer);
    let _ = stream.flush();
}

/// One reading of the pools as an exposition; what changed is logged.
fn scrape(reader: &mut Reader, log: &mut Log) -> String {
    match reader.read() {
        Ok(readings) => {
            log.note(&readings);
            exposition(&readings)
        }
        Err(e) => {
            log.line(&e);
            String::new()
        }
    }
}

/// The server's log: a line when a pool becomes readable or unreadable (not at every
/// scrape: a sidecar may wait a long time for the first member).
pub struct Log<'a> {
    out: &'a mut dyn Write,
    /// Per pool label, the last error (None: readable).
    last: HashMap<String, Option<String>>,
    last_line: Option<String>,
}

impl<'a> Log<'a> {
    pub fn new(out: &'a mut dyn Write) -> Log<'a> {
        Log {
            out,
            last: HashMap::new(),
            last_line: None,
        }
    }

    fn note(&mut self, readings: &[Reading]) {
        self.last_line = None;
        for r in readings {
            let now = r.result.as_ref().err().map(|(_, e)| e.clone());
            let before = self.last.insert(r.label.clone(), now.clone());
            if before.as_ref() == Some(&now) {
                continue;
            }
            let line = match (&now, &r.result) {
                (Some(e), _) => format!("{e} (served as gpucap_pool_up 0)"),
                (None, Ok((path, _))) => format!(
                    "gpucap metrics: pool {} readable (file {})",
                    r.label,
                    path.display()
                ),
                (None, Err(_)) => continue,
            };
            let _ = writeln!(self.out, "{line}");
        }
        let _ = self.out.flush();
    }

    fn line(&mut self, line: &str) {
        if self.last_line.as_deref() != Some(line) {
            let _ = writeln!(self.out, "{line}");
            let _ = self.out.flush();
            self.last_line = Some(line.to_string());
        }
    }
}

/// Serves `reader`'s pools on `listener` until the process is killed: one request at
/// a time. Only returns if accepting keeps failing (the error).
pub fn serve(listener: TcpListener, mut reader: Reader, out: &mut dyn Write) -> io::Error {
    let mut log = Log::new(out);
    let mut failures = 0u32;
    loop {
        match listener.accept() {
            Ok((stream, _)) => {
                failures = 0;
                handle(stream, &mut reader, &mut log);
            }
            // Out of descriptors, a connection reset before it was accepted...: wait a
            // little and go on, unless it never stops.
            Err(e) => {
                failures += 1;
                if failures > 1000 {
                    return e;
                }
                log.line(&format!("gpucap metrics: accept: {e}"));
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::tests::reading;
    use crate::pool::tests::view;

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

    #[test]
    fn the_log_says_what_changed_once() {
        let mut out = Vec::new();
        {
            let mut log = Log::new(&mut out);
            let down = || Reading {
                label: "p".into(),
                result: Err((1, "gpucap: no pool file at /x".into())),
            };
            log.note(&[down()]);
            log.note(&[down()]);
            log.note(&[reading("p", view())]);
            log.note(&[reading("p", view())]);
            log.note(&[down()]);
        }
        let out = String::from_utf8(out).unwrap();
        assert_eq!(
            out,
            "gpucap: no pool file at /x (served as gpucap_pool_up 0)\n\
             gpucap metrics: pool p readable (file /p/p.pool)\n\
             gpucap: no pool file at /x (served as gpucap_pool_up 0)\n"
        );
    }
}
