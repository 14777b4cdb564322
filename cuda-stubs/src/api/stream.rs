//! Streams and events (synchronous: work is done when issued), stream capture (of
//! stream-ordered allocations and frees into a graph's memory nodes, of launches into kernel
//! nodes, of async copies and memsets into memcpy and memset nodes: see `model::graph`;
//! other work on a capturing stream runs at once), host functions and stream callbacks (run
//! at once).

use std::ptr::null_mut;

use crate::abi::types::{
    CU_STREAM_CAPTURE_MODE_GLOBAL, CU_STREAM_CAPTURE_MODE_RELAXED, CU_STREAM_CAPTURE_STATUS_NONE,
    HostFn, StreamCallback,
};
use crate::abi::{
    CUDA_ERROR_INVALID_HANDLE, CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
    CUDA_SUCCESS, CuResult, inp, note, out,
};
use crate::model::ctx::{Ctx, current};
use crate::model::device::cfg;
use crate::model::graph;
use crate::model::pool;
use crate::model::stream::{self, check, context_of};
use libc::{c_int, c_uint, c_void};

fn create(ph: *mut usize, flags: c_uint, priority: c_int) -> CuResult {
    let (ctx, dev) = current()?;
    if ph.is_null() || flags > 1 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let h = stream::create(ctx, dev, flags, priority);
    note(|| format!("stream={h:#x}"));
    out(ph, h)
}

fn elapsed(ms: *mut f32, start: usize, end: usize) -> CuResult {
    let (s, e) = (stream::event(start)?, stream::event(end)?);
    if ms.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    if (s.flags | e.flags) & 2 != 0 {
        return Err(CUDA_ERROR_INVALID_HANDLE); // CU_EVENT_DISABLE_TIMING
    }
    match (s.recorded, e.recorded) {
        (Some(a), Some(b)) => {
            let d = if b >= a {
                (b - a).as_secs_f32()
            } else {
                -(a - b).as_secs_f32()
            };
            out(ms, d * 1000.0)
        }
        _ => Err(CUDA_ERROR_INVALID_HANDLE),
    }
}

/// Writes `v` through an optional output pointer (NULL: nothing to write).
fn out_opt<T>(p: *mut T, v: T) -> CuResult {
    if p.is_null() { Ok(()) } else { out(p, v) }
}

/// cuStreamGetCaptureInfo (every version): whether the stream captures, its capture id and
/// graph. The status is required; the other outputs are optional and written as the driver
/// does when not capturing (id 0, no graph) and with no dependencies or edge data (the fake
/// keeps none). Edge data needs dependencies.
#[allow(clippy::too_many_arguments)]
fn capture_info(
    stream: usize,
    status: *mut c_int,
    id: *mut u64,
    graph: *mut usize,
    deps: *mut *const usize,
    edges: *mut *const c_void,
    count: *mut usize,
) -> CuResult {
    check(stream)?;
    if status.is_null() || (!edges.is_null() && deps.is_null()) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let (status_now, g, cid) =
        graph::capture_status(stream).unwrap_or((CU_STREAM_CAPTURE_STATUS_NONE, 0, 0));
    out(status, status_now)?;
    out_opt(id, cid)?;
    out_opt(graph, g)?;
    out_opt(deps, std::ptr::null())?;
    out_opt(edges, std::ptr::null())?;
    out_opt(count, 0)
}

/// cuStreamBeginCapture: a created stream (not the legacy NULL stream) starts capturing
/// into a new graph.
fn begin_capture(stream: usize, mode: c_int) -> CuResult {
    check(stream)?;
    if !(0..=CU_STREAM_CAPTURE_MODE_RELAXED).contains(&mode) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    if stream <= 1 {
        return Err(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    }
    graph::begin_capture(stream, mode)
}

crate::abi::exports! {
    fn cuStreamCreate(ph: *mut usize, flags: c_uint) {
        create(ph, flags, 0)
    }

    fn cuStreamCreateWithPriority(ph: *mut usize, flags: c_uint, priority: c_int) {
        create(ph, flags, priority)
    }

    fn cuStreamDestroy | cuStreamDestroy_v2 (stream: usize) {
        cfg()?;
        stream::destroy(stream)
    }

    fn cuStreamSynchronize | cuStreamSynchronize_ptsz (stream: usize) {
        let (_, dev) = context_of(stream)?;
        pool::sync(Some(dev));
        Ok(())
    }

    fn cuStreamQuery | cuStreamQuery_ptsz (stream: usize) {
        check(stream)
    }

    fn cuStreamWaitEvent | cuStreamWaitEvent_ptsz (stream: usize, event: usize, flags: c_uint) {
        let _ = flags;
        check(stream)?;
        stream::event(event).map(|_| ())
    }

    fn cuStreamGetPriority | cuStreamGetPriority_ptsz (stream: usize, priority: *mut c_int) {
        check(stream)?;
        out(priority, stream::get(stream).map(|s| s.priority).unwrap_or(0))
    }

    fn cuStreamGetFlags | cuStreamGetFlags_ptsz (stream: usize, flags: *mut c_uint) {
        check(stream)?;
        out(flags, stream::get(stream).map(|s| s.flags).unwrap_or(0))
    }

    fn cuStreamGetCtx | cuStreamGetCtx_ptsz (stream: usize, pctx: *mut Ctx) {
        out(pctx, context_of(stream)?.0)
    }

    fn cuStreamGetCtx_v2 | cuStreamGetCtx_v2_ptsz (stream: usize, pctx: *mut Ctx, pgreen: *mut usize) {
        out(pctx, context_of(stream)?.0)?;
        if !pgreen.is_null() {
            out(pgreen, 0)?;
        }
        Ok(())
    }

    // No stream of the fake belongs to a green context (it makes none): NULL, as the
    // driver answers for a stream of an ordinary context (cuDNN asks of a side stream).
    fn cuStreamGetGreenCtx(stream: usize, pgreen: *mut usize) {
        context_of(stream)?;
        out(pgreen, crate::model::green::of_stream(stream))
    }

    fn cuStreamGetDevice | cuStreamGetDevice_ptsz (stream: usize, device: *mut c_int) {
        out(device, context_of(stream)?.1 as c_int)
    }

    fn cuStreamGetId | cuStreamGetId_ptsz (stream: usize, id: *mut u64) {
        check(stream)?;
        out(id, stream as u64)
    }

    fn cuStreamIsCapturing | cuStreamIsCapturing_ptsz (stream: usize, status: *mut c_int) {
        check(stream)?;
        let now = graph::capture_status(stream).map_or(CU_STREAM_CAPTURE_STATUS_NONE, |(s, _, _)| s);
        out(status, now)
    }

    // CUDA 10.0: (stream), global mode.
    fn cuStreamBeginCapture | cuStreamBeginCapture_ptsz (stream: usize) {
        begin_capture(stream, CU_STREAM_CAPTURE_MODE_GLOBAL)
    }

    fn cuStreamBeginCapture_v2 | cuStreamBeginCapture_v2_ptsz (stream: usize, mode: c_int) {
        begin_capture(stream, mode)
    }

    fn cuStreamEndCapture | cuStreamEndCapture_ptsz (stream: usize, pgraph: *mut usize) {
        check(stream)?;
        if pgraph.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        out(pgraph, graph::end_capture(stream)?)
    }

    // CUDA 10.1: (status, id).
    fn cuStreamGetCaptureInfo | cuStreamGetCaptureInfo_ptsz (stream: usize, status: *mut c_int, id: *mut u64) {
        capture_info(stream, status, id, null_mut(), null_mut(), null_mut(), null_mut())
    }

    // CUDA 11.3: (status, id, graph, dependencies, count).
    fn cuStreamGetCaptureInfo_v2 | cuStreamGetCaptureInfo_v2_ptsz (stream: usize, status: *mut c_int, id: *mut u64, graph: *mut usize, deps: *mut *const usize, count: *mut usize) {
        capture_info(stream, status, id, graph, deps, null_mut(), count)
    }

    // CUDA 12.3: (status, id, graph, dependencies, edge data, count).
    fn cuStreamGetCaptureInfo_v3 | cuStreamGetCaptureInfo_v3_ptsz (stream: usize, status: *mut c_int, id: *mut u64, graph: *mut usize, deps: *mut *const usize, edges: *mut *const c_void, count: *mut usize) {
        capture_info(stream, status, id, graph, deps, edges, count)
    }

    // Swaps this thread's capture mode with `*mode` (GLOBAL 0, THREAD_LOCAL 1, RELAXED 2).
    fn cuThreadExchangeStreamCaptureMode(mode: *mut c_int) {
        cfg()?;
        let new = inp(mode.cast_const())?;
        if !(CU_STREAM_CAPTURE_MODE_GLOBAL..=CU_STREAM_CAPTURE_MODE_RELAXED).contains(&new) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let old = stream::exchange_capture_mode(new);
        note(|| format!("old mode={old}"));
        out(mode, old)
    }

    fn cuLaunchHostFunc | cuLaunchHostFunc_ptsz (stream: usize, func: HostFn, user_data: *mut c_void) {
        check(stream)?;
        let f = func.ok_or(CUDA_ERROR_INVALID_VALUE)?;
        // SAFETY: the caller's host function, called with its own user data as CUDA would.
        unsafe { f(user_data) };
        Ok(())
    }

    fn cuStreamAddCallback | cuStreamAddCallback_ptsz (stream: usize, callback: StreamCallback, user_data: *mut c_void, flags: c_uint) {
        check(stream)?;
        if flags != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let f = callback.ok_or(CUDA_ERROR_INVALID_VALUE)?;
        // SAFETY: the caller's callback, called with (stream, CUDA_SUCCESS, user data) as CUDA would.
        unsafe { f(stream, CUDA_SUCCESS, user_data) };
        Ok(())
    }

    fn cuEventCreate(ph: *mut usize, flags: c_uint) {
        cfg()?;
        let (_, dev) = current()?;
        if ph.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let h = stream::create_event(flags, dev);
        note(|| format!("event={h:#x}"));
        out(ph, h)
    }

    fn cuEventRecord | cuEventRecord_ptsz (event: usize, stream: usize) {
        stream::record(event, stream)
    }

    fn cuEventRecordWithFlags | cuEventRecordWithFlags_ptsz (event: usize, stream: usize, flags: c_uint) {
        let _ = flags;
        stream::record(event, stream)
    }

    fn cuEventSynchronize(event: usize) {
        let e = stream::event(event)?;
        pool::sync(Some(e.dev));
        Ok(())
    }

    fn cuEventQuery(event: usize) {
        stream::event(event).map(|_| ())
    }

    fn cuEventDestroy | cuEventDestroy_v2 (event: usize) {
        cfg()?;
        stream::destroy_event(event)
    }

    fn cuEventElapsedTime | cuEventElapsedTime_v2 (ms: *mut f32, start: usize, end: usize) {
        elapsed(ms, start, end)
    }
}
