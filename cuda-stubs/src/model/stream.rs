//! Streams and events. All work is done synchronously when issued, so streams are always
//! idle and events complete when recorded; streams never capture, and each thread keeps
//! only its capture mode.

use super::HashMap;
use std::sync::Mutex;
use std::time::Instant;

use std::sync::LazyLock;

use super::ctx::{Ctx, current};
use super::device::cfg;
use super::os::new_handle;
use crate::abi::types::CU_STREAM_CAPTURE_MODE_GLOBAL;
use crate::abi::{CUDA_ERROR_INVALID_HANDLE, CUresult, CuResult};
use libc::{c_int, c_uint};

#[derive(Debug, Clone, Copy)]
pub struct StreamInfo {
    pub ctx: Ctx,
    pub dev: usize,
    pub flags: c_uint,
    pub priority: c_int,
}

#[derive(Debug, Clone, Copy)]
pub struct EventInfo {
    pub flags: c_uint,
    /// The device of the context it was created in.
    pub dev: usize,
    pub recorded: Option<Instant>,
}

static STREAMS: LazyLock<Mutex<HashMap<usize, StreamInfo>>> = LazyLock::new(Default::default);
static EVENTS: LazyLock<Mutex<HashMap<usize, EventInfo>>> = LazyLock::new(Default::default);

/// CU_STREAM_LEGACY and CU_STREAM_PER_THREAD.
pub const SPECIAL_STREAMS: [usize; 3] = [0, 1, 2];

thread_local! {
    /// This thread's stream capture mode (cuThreadExchangeStreamCaptureMode).
    static CAPTURE_MODE: std::cell::Cell<c_int> = const { std::cell::Cell::new(CU_STREAM_CAPTURE_MODE_GLOBAL) };
}

fn streams() -> std::sync::MutexGuard<'static, HashMap<usize, StreamInfo>> {
    STREAMS.lock().unwrap_or_else(|e| e.into_inner())
}

fn events() -> std::sync::MutexGuard<'static, HashMap<usize, EventInfo>> {
    EVENTS.lock().unwrap_or_else(|e| e.into_inner())
}

/// The context and device a stream belongs to (the current ones for the default streams).
pub fn context_of(stream: usize) -> Result<(Ctx, usize), CUresult> {
    if SPECIAL_STREAMS.contains(&stream) {
        return current();
    }
    cfg()?;
    streams()
        .get(&stream)
        .map(|s| (s.ctx, s.dev))
        .ok_or(CUDA_ERROR_INVALID_HANDLE)
}

/// Validates a stream handle.
pub fn check(stream: usize) -> CuResult {
    context_of(stream).map(|_| ())
}

/// A new stream of context `ctx` on `dev` (priority clamped to the range the device has).
pub fn create(ctx: Ctx, dev: usize, flags: c_uint, priority: c_int) -> usize {
    let h = new_handle();
    streams().insert(
        h,
        StreamInfo {
            ctx,
            dev,
            flags,
            priority: priority.clamp(-5, 0),
        },
    );
    h
}

/// A created stream (None for the default streams and unknown handles).
pub fn get(stream: usize) -> Option<StreamInfo> {
    streams().get(&stream).copied()
}

/// Forgets a created stream; CUDA_ERROR_INVALID_HANDLE if there is no such stream.
pub fn destroy(stream: usize) -> CuResult {
    streams()
        .remove(&stream)
        .map(|_| ())
        .ok_or(CUDA_ERROR_INVALID_HANDLE)
}

/// A new event of device `dev`.
pub fn create_event(flags: c_uint, dev: usize) -> usize {
    let h = new_handle();
    events().insert(
        h,
        EventInfo {
            flags,
            dev,
            recorded: None,
        },
    );
    h
}

/// An event; CUDA_ERROR_INVALID_HANDLE if there is no such event.
pub fn event(event: usize) -> Result<EventInfo, CUresult> {
    cfg()?;
    events()
        .get(&event)
        .copied()
        .ok_or(CUDA_ERROR_INVALID_HANDLE)
}

/// Records `event` on `stream`: it completes at once, now.
pub fn record(event: usize, stream: usize) -> CuResult {
    check(stream)?;
    events()
        .get_mut(&event)
        .ok_or(CUDA_ERROR_INVALID_HANDLE)?
        .recorded = Some(Instant::now());
    Ok(())
}

/// Forgets an event; CUDA_ERROR_INVALID_HANDLE if there is no such event.
pub fn destroy_event(event: usize) -> CuResult {
    events()
        .remove(&event)
        .map(|_| ())
        .ok_or(CUDA_ERROR_INVALID_HANDLE)
}

/// Sets this thread's capture mode; the mode it had.
pub fn exchange_capture_mode(mode: c_int) -> c_int {
    CAPTURE_MODE.with(|m| m.replace(mode))
}

/// This thread's capture mode (`cuThreadExchangeStreamCaptureMode`; GLOBAL until set).
pub fn capture_mode() -> c_int {
    CAPTURE_MODE.with(|m| m.get())
}
