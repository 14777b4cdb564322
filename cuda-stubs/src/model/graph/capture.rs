//! Stream capture: a stream begun capturing records its work as nodes of a new graph until
//! its capture ends. A capture keeps the mode it was begun in and the thread that began
//! it, for the calls it forbids (`cuThreadExchangeStreamCaptureMode`'s documentation): a
//! "potentially unsafe" call (the entry points FAKECUDA_CAPTURE_UNSAFE names) made by a
//! thread not in relaxed mode, while a capture of that thread not begun relaxed is under
//! way, or (the thread in the default, global mode) another thread's capture begun in
//! global mode, answers `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED` and invalidates those
//! captures: their status reads invalidated, work issued to them is refused, and their end
//! answers `CUDA_ERROR_STREAM_CAPTURE_INVALIDATED`, the graph discarded.

use std::thread::ThreadId;

use super::{Node, graphs};
use crate::abi::types::{
    CU_STREAM_CAPTURE_MODE_GLOBAL, CU_STREAM_CAPTURE_MODE_RELAXED, CU_STREAM_CAPTURE_STATUS_ACTIVE,
    CU_STREAM_CAPTURE_STATUS_INVALIDATED,
};
use crate::abi::{
    CUDA_ERROR_ILLEGAL_STATE, CUDA_ERROR_STREAM_CAPTURE_INVALIDATED,
    CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, CUresult, CuResult,
};
use crate::model::device::cfg;
use crate::model::os::new_handle;
use crate::model::stream;
use libc::c_int;

/// A capture under way on a stream.
pub struct Capture {
    pub graph: usize,
    id: u64,
    /// The mode it was begun in (`cuStreamBeginCapture_v2`).
    mode: c_int,
    /// The thread that began it.
    thread: ThreadId,
    /// A forbidden call ended it: it fails at its end.
    invalidated: bool,
}

/// cuStreamBeginCapture: `stream` captures into a new graph, in `mode`. Already capturing:
/// CUDA_ERROR_ILLEGAL_STATE.
pub fn begin_capture(stream: usize, mode: c_int) -> CuResult {
    let mut g = graphs();
    if g.capturing.contains_key(&stream) {
        return Err(CUDA_ERROR_ILLEGAL_STATE);
    }
    let graph = new_handle();
    g.graphs.insert(graph, Vec::new());
    g.next_capture_id += 1;
    let capture = Capture {
        graph,
        id: g.next_capture_id,
        mode,
        thread: std::thread::current().id(),
        invalidated: false,
    };
    g.capturing.insert(stream, capture);
    Ok(())
}

/// cuStreamEndCapture: the graph captured; not capturing: CUDA_ERROR_ILLEGAL_STATE; an
/// invalidated capture: CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, its graph discarded.
pub fn end_capture(stream: usize) -> Result<usize, CUresult> {
    let c = graphs()
        .capturing
        .remove(&stream)
        .ok_or(CUDA_ERROR_ILLEGAL_STATE)?;
    if c.invalidated {
        // Its nodes hold nothing yet that a destroyed graph would not give back.
        let _ = super::destroy(c.graph);
        return Err(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    }
    Ok(c.graph)
}

/// The graph and capture id of a capturing stream (None: it does not capture), or
/// CUDA_ERROR_STREAM_CAPTURE_INVALIDATED where its capture was invalidated: work issued to
/// it is refused.
pub fn capture_of(stream: usize) -> Result<Option<(usize, u64)>, CUresult> {
    let g = graphs();
    match g.capturing.get(&stream) {
        None => Ok(None),
        Some(c) if c.invalidated => Err(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED),
        Some(c) => Ok(Some((c.graph, c.id))),
    }
}

/// A stream's capture status (`CU_STREAM_CAPTURE_STATUS_*`), with its graph and capture
/// id: None when it does not capture.
pub fn capture_status(stream: usize) -> Option<(c_int, usize, u64)> {
    let g = graphs();
    let c = g.capturing.get(&stream)?;
    let status = match c.invalidated {
        true => CU_STREAM_CAPTURE_STATUS_INVALIDATED,
        false => CU_STREAM_CAPTURE_STATUS_ACTIVE,
    };
    Some((status, c.graph, c.id))
}

/// Work issued on `stream`: when it captures, `node` (made now) becomes a node of the
/// capture's graph: Some(its handle, or the error: CUDA_ERROR_STREAM_CAPTURE_INVALIDATED
/// for an invalidated capture); None when it does not capture.
pub fn capture_work(stream: usize, node: impl FnOnce() -> Node) -> Option<Result<usize, CUresult>> {
    let mut g = graphs();
    let c = g.capturing.get(&stream)?;
    if c.invalidated {
        return Some(Err(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED));
    }
    let graph = c.graph;
    Some(g.add(graph, node()))
}

/// `entry`, about to be made by this thread: refused with
/// CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, and the captures that forbid it invalidated,
/// where FAKECUDA_CAPTURE_UNSAFE names it and a capture forbids it (see the module's doc);
/// else Ok. One configuration read when nothing is named.
pub fn refuse_during_capture(entry: &str) -> CuResult {
    if !cfg()?.capture_unsafe.iter().any(|e| e == entry) {
        return Ok(());
    }
    let mode = stream::capture_mode();
    if mode == CU_STREAM_CAPTURE_MODE_RELAXED {
        return Ok(());
    }
    let me = std::thread::current().id();
    let mut g = graphs();
    let mut forbidden = false;
    for c in g.capturing.values_mut() {
        if forbids(c.thread == me, c.mode, mode) {
            c.invalidated = true;
            forbidden = true;
        }
    }
    if forbidden {
        return Err(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    }
    Ok(())
}

/// Whether a capture begun in `capture_mode` (by the calling thread: `own`) forbids a
/// potentially unsafe call by a thread in `thread_mode`: never in relaxed mode; a thread's
/// own capture unless begun relaxed; in global mode, another thread's capture begun global.
fn forbids(own: bool, capture_mode: c_int, thread_mode: c_int) -> bool {
    if thread_mode == CU_STREAM_CAPTURE_MODE_RELAXED {
        return false;
    }
    (own && capture_mode != CU_STREAM_CAPTURE_MODE_RELAXED)
        || (thread_mode == CU_STREAM_CAPTURE_MODE_GLOBAL
            && capture_mode == CU_STREAM_CAPTURE_MODE_GLOBAL)
}

#[cfg(test)]
mod tests {
    use super::forbids;

    /// CUDA's rules (`cuThreadExchangeStreamCaptureMode`), every combination: GLOBAL 0,
    /// THREAD_LOCAL 1, RELAXED 2.
    #[test]
    fn a_capture_forbids_unsafe_calls_as_cudas_modes_say() {
        for own in [true, false] {
            for capture in 0..=2 {
                for thread in 0..=2 {
                    let want = match (own, capture, thread) {
                        (_, _, 2) => false,
                        (true, 0 | 1, _) => true,
                        (_, 0, 0) => true,
                        _ => false,
                    };
                    assert_eq!(
                        forbids(own, capture, thread),
                        want,
                        "own {own}, capture begun in mode {capture}, thread in mode {thread}"
                    );
                }
            }
        }
    }
}
