//! The server of `gpucap metrics --listen`: a thread per connection, at most
//! [`MAX_CONNECTIONS`] of them, each done within [`REQUEST_TIME`] + [`ANSWER_TIME`].
//!
//! Slow clients (connected and sending nothing, or a byte now and then) cannot keep a
//! scrape waiting: each has its own thread, so a scrape is answered while they wait; a
//! client is cut off once its time is up; and when [`MAX_CONNECTIONS`] are open, a new
//! connection is taken all the same and the oldest open one is closed, unanswered
//! (it has had the longest to send its request). The pools are read one scrape at a
//! time (the reader keeps the files open between scrapes).

use std::collections::{HashMap, VecDeque};
use std::io::{self, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::{Arc, Mutex, MutexGuard, TryLockError};
use std::time::{Duration, Instant};

use super::http::{ANSWER_TIME, REQUEST_TIME, answer, read_head, write_before};
use super::{Reader, Reading, exposition};

/// The most connections served at once (each has a thread). A scrape needs a
/// connection for a few milliseconds; 256 also bounds the descriptors and threads a
/// flood of clients can take (it fits the usual limit of 1024 descriptors).
pub const MAX_CONNECTIONS: usize = 256;

/// The queue of connections the kernel completes before the server takes them (the
/// kernel caps it at net.core.somaxconn). std listens with 128: a burst of more
/// clients than that while the server starts their threads has the kernel drop a
/// connection attempt, which the client repeats only after a second.
const BACKLOG: i32 = 4 * MAX_CONNECTIONS as i32;

/// The stack of a connection's thread: a request head is read into the heap.
const STACK: usize = 256 * 1024;

/// A mutex's value, even if a thread panicked while holding it (the values here stay
/// consistent at every step).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The open connections, oldest first.
#[derive(Default)]
struct Open {
    next: u64,
    streams: VecDeque<(u64, Arc<TcpStream>)>,
}

impl Open {
    /// Takes `stream` (its id returned): at `max` open, the oldest is shut down first
    /// (its thread's read or write then fails, and it leaves).
    fn admit(&mut self, stream: Arc<TcpStream>, max: usize) -> (u64, bool) {
        let full = self.streams.len() >= max;
        if full && let Some((_, oldest)) = self.streams.pop_front() {
            let _ = oldest.shutdown(Shutdown::Both);
        }
        let id = self.next;
        self.next += 1;
        self.streams.push_back((id, stream));
        (id, full)
    }

    /// Forgets connection `id` (its descriptor closes with the last reference).
    fn leave(&mut self, id: u64) {
        if let Some(i) = self.streams.iter().position(|(k, _)| *k == id) {
            self.streams.remove(i);
        }
    }
}

/// What the server's threads share. The thread that accepts connections only ever
/// waits for `open` (held for a few instructions), never for a scrape or the log.
struct Shared<'a> {
    reader: Mutex<Reader>,
    log: Mutex<Log<'a>>,
    open: Mutex<Open>,
}

impl Shared<'_> {
    /// A line of the accepting thread: left out if the log is busy (a scrape writing
    /// to it), so that accepting never waits on stderr.
    fn say(&self, line: &str) {
        match self.log.try_lock() {
            Ok(mut log) => log.line(line),
            Err(TryLockError::Poisoned(e)) => e.into_inner().line(line),
            Err(TryLockError::WouldBlock) => {}
        }
    }
}

/// Serves `reader`'s pools on `listener` until the process is killed. Only returns if
/// accepting keeps failing (the error).
pub fn serve(listener: TcpListener, reader: Reader, out: &mut (dyn Write + Send)) -> io::Error {
    // SAFETY: listen on the listener's own descriptor, already listening: it only sets
    // the queue's length. A failure leaves std's 128.
    unsafe { libc::listen(listener.as_raw_fd(), BACKLOG) };
    let shared = Shared {
        reader: Mutex::new(reader),
        log: Mutex::new(Log::new(out)),
        open: Mutex::new(Open::default()),
    };
    let shared = &shared;
    std::thread::scope(|scope| {
        let mut failures = 0u32;
        loop {
            let stream = match listener.accept() {
                Ok((stream, _)) => Arc::new(stream),
                // Out of descriptors, a connection reset before it was accepted...: wait
                // a little and go on, unless it never stops.
                Err(e) => {
                    failures += 1;
                    if failures > 1000 {
                        return e;
                    }
                    shared.say(&format!("gpucap metrics: accept: {e}"));
                    std::thread::sleep(Duration::from_millis(100));
                    continue;
                }
            };
            failures = 0;
            let (id, full) = lock(&shared.open).admit(Arc::clone(&stream), MAX_CONNECTIONS);
            if full {
                shared.say(&format!(
                    "gpucap metrics: {MAX_CONNECTIONS} connections open (the most it \
                     serves at once): closing the oldest for each new one"
                ));
            }
            let spawned = std::thread::Builder::new()
                .name("gpucap-metrics".into())
                .stack_size(STACK)
                .spawn_scoped(scope, move || {
                    exchange(&stream, shared);
                    lock(&shared.open).leave(id);
                });
            if let Err(e) = spawned {
                lock(&shared.open).leave(id);
                shared.say(&format!("gpucap metrics: cannot start a thread: {e}"));
            }
        }
    })
}

/// One request and its answer, each within its time.
fn exchange(stream: &TcpStream, shared: &Shared) {
    let _ = stream.set_nodelay(true);
    let Some(head) = read_head(stream, Instant::now() + REQUEST_TIME) else {
        return;
    };
    let answer = answer(&head, || scrape(&mut lock(&shared.reader), &shared.log));
    let _ = write_before(stream, &answer, Instant::now() + ANSWER_TIME);
}

/// One reading of the pools as an exposition; what changed is logged.
fn scrape(reader: &mut Reader, log: &Mutex<Log>) -> Result<String, String> {
    match reader.read() {
        Ok(readings) => {
            let mut log = lock(log);
            log.note(&readings);
            log.notes(reader.notes());
            Ok(exposition(
                &readings,
                reader.lone(),
                reader.unreadable(),
                reader.hami(),
            ))
        }
        Err(e) => {
            lock(log).line(&e);
            Err(e)
        }
    }
}

/// The server's log: a line when a pool becomes readable or unreadable (not at every
/// scrape: a sidecar may wait a long time for the first member).
pub struct Log<'a> {
    out: &'a mut (dyn Write + Send),
    /// Per pool label and user, the last error (None: readable).
    last: HashMap<(String, String), Option<String>>,
    last_line: Option<String>,
    /// `--all`'s last lines besides the pools' (`Reader::notes`).
    last_notes: Vec<String>,
}

impl<'a> Log<'a> {
    pub fn new(out: &'a mut (dyn Write + Send)) -> Log<'a> {
        Log {
            out,
            last: HashMap::new(),
            last_line: None,
            last_notes: Vec::new(),
        }
    }

    fn note(&mut self, readings: &[Reading]) {
        self.last_line = None;
        for r in readings {
            let now = r.result.as_ref().err().map(|(_, e)| e.clone());
            let key = (r.label.clone(), r.user.clone());
            let before = self.last.insert(key, now.clone());
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

    /// `--all`'s lines besides the pools': each when it comes, not again while it stays.
    fn notes(&mut self, notes: &[String]) {
        for n in notes.iter().filter(|n| !self.last_notes.contains(n)) {
            let _ = writeln!(self.out, "{n}");
        }
        let _ = self.out.flush();
        self.last_notes = notes.to_vec();
    }

    fn line(&mut self, line: &str) {
        if self.last_line.as_deref() != Some(line) {
            let _ = writeln!(self.out, "{line}");
            let _ = self.out.flush();
            self.last_line = Some(line.to_string());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::tests::reading;
    use crate::pool::tests::view;
    use std::io::Read;

    /// At the bound, a new connection is taken and the oldest is shut down (its peer
    /// reads the end of the stream); the others stay open.
    #[test]
    fn the_oldest_connection_makes_room() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let mut open = Open::default();
        let mut clients = Vec::new();
        let mut ids = Vec::new();
        for _ in 0..3 {
            let c = TcpStream::connect(addr).unwrap();
            c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            clients.push(c);
            let (s, _) = listener.accept().unwrap();
            ids.push(open.admit(Arc::new(s), 2));
        }
        assert_eq!(ids, [(0, false), (1, false), (2, true)]);
        assert_eq!(
            open.streams.iter().map(|(k, _)| *k).collect::<Vec<_>>(),
            [1, 2]
        );
        let mut buf = [0u8; 1];
        assert_eq!(clients[0].read(&mut buf).unwrap(), 0, "closed");
        clients[1].set_nonblocking(true).unwrap();
        assert_eq!(
            clients[1].read(&mut buf).unwrap_err().kind(),
            io::ErrorKind::WouldBlock,
            "still open"
        );
        open.leave(1);
        open.leave(7);
        assert_eq!(
            open.streams.iter().map(|(k, _)| *k).collect::<Vec<_>>(),
            [2]
        );
    }

    #[test]
    fn the_log_says_what_changed_once() {
        let mut out = Vec::new();
        {
            let mut log = Log::new(&mut out);
            let down = || Reading {
                label: "p".into(),
                user: "alice".into(),
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

    /// `--all`'s lines beside the pools (root's own directory, a lone file): each once
    /// while it stays, again when it comes back; two users' pools of one name are two.
    #[test]
    fn the_log_says_each_note_once_while_it_stays() {
        let mut out = Vec::new();
        {
            let mut log = Log::new(&mut out);
            let (a, b) = ("gpucap: a".to_string(), "gpucap: b".to_string());
            log.notes(std::slice::from_ref(&a));
            log.notes(&[a.clone(), b.clone()]);
            log.notes(std::slice::from_ref(&b));
            log.notes(&[a.clone(), b]);
            let mut bobs = reading("train", view());
            bobs.user = "bob".into();
            log.note(&[reading("train", view()), bobs]);
        }
        let out = String::from_utf8(out).unwrap();
        assert_eq!(
            out,
            "gpucap: a\ngpucap: b\ngpucap: a\n\
             gpucap metrics: pool train readable (file /p/train.pool)\n\
             gpucap metrics: pool train readable (file /p/train.pool)\n"
        );
    }
}
