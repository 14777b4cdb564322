//! The device of the calling thread's current context, which every allocation of linear
//! memory is charged to. With one visible GPU it is 0, not asked. With several, each
//! thread keeps the device it last asked the driver for; every call that can change
//! what is current on a thread (`cuCtxSetCurrent`, `cuCtxPushCurrent`,
//! `cuCtxPopCurrent`, `cuCtxCreate`, `cuCtxDestroy`, `cuCtxDetach`, the primary
//! context's release and reset, and the deprecated graphics-interop creators
//! `cuGLCtxCreate` and `cuVDPAUCtxCreate`, which make and push a context gpucap does not
//! charge) goes through the hooks below or in `contexts.rs`, which forget it, before and
//! after the driver's call, so the next allocation asks again. A context destroyed by
//! another thread leaves this thread's device in place: the driver then refuses the
//! allocation and its reservation is rolled back.
//!
//! Each thread also keeps its current context once asked (`cuCtxGetCurrent`), forgotten
//! by the same calls, with one GPU or several: a kernel handle's launch (one handle for
//! every context, `launches.rs`) is looked up by (kernel, context), and asking the driver
//! at each launch made one driver call per launch. A context destroyed by another thread
//! leaves its handle here, as the driver leaves it current on this thread: the driver
//! refuses the launch.

use std::cell::Cell;
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

use crate::driver::forward::Real;
use crate::driver::types::{CUDA_SUCCESS, CuResult, Handle, Out};
use crate::driver::{calls, queries};

/// Set by `cuInit` when the driver shows this process exactly one GPU: then the device
/// of any current context is 0, known without asking the driver.
static ONE_GPU: AtomicBool = AtomicBool::new(false);

/// Not known: ask the driver.
const UNKNOWN: c_int = -1;

thread_local! {
    /// The device of this thread's current context, as the driver last said.
    static DEVICE: Cell<c_int> = const { Cell::new(UNKNOWN) };
    /// This thread's current context, as the driver last said (null: not known).
    static CONTEXT: Cell<Handle> = const { Cell::new(std::ptr::null_mut()) };
}

/// Called by `cuInit` once the driver is up: how many GPUs this process sees.
pub(super) fn note_visible_gpus(count: Option<usize>) {
    ONE_GPU.store(count == Some(1), Relaxed);
}

/// Whether the process sees exactly one GPU.
#[inline]
pub(super) fn one_gpu() -> bool {
    ONE_GPU.load(Relaxed)
}

/// The device of the calling thread's current context (with one visible GPU: 0, not
/// asked; whether a context is current at all is then the driver's to say when it
/// gets the call, and [`reserve`] asks before refusing). None: no context is current.
#[inline]
pub(super) fn current_device() -> Option<c_int> {
    if one_gpu() {
        return Some(0);
    }
    let known = thread_device();
    if known != UNKNOWN {
        return Some(known);
    }
    let device = context_device()?;
    DEVICE.with(|d| d.set(device));
    Some(device)
}

/// The device of the calling thread's current context if known without a driver call:
/// 0 with one visible GPU, else what this thread last asked since its context last
/// changed.
#[inline]
pub(super) fn known_device() -> Option<usize> {
    if one_gpu() {
        return Some(0);
    }
    usize::try_from(thread_device()).ok()
}

/// This thread's remembered device. Out of line: the compiler would otherwise compute
/// the thread-local's address (a call into the dynamic linker) before the one-GPU test.
#[inline(never)]
fn thread_device() -> c_int {
    DEVICE.with(Cell::get)
}

/// The calling thread's current context: the one it last asked the driver for since
/// its context last changed, else asked now (None: none is current, asked again next
/// time). No lock, no allocation: a launch's path.
#[inline]
pub(super) fn current_context() -> Option<Handle> {
    let known = CONTEXT.with(Cell::get);
    if !known.is_null() {
        return Some(known);
    }
    let ctx = queries::current_context()?;
    CONTEXT.with(|c| c.set(ctx));
    Some(ctx)
}

/// The device of the calling thread's current context, asked of the driver.
pub(super) fn context_device() -> Option<c_int> {
    let mut dev: c_int = -1;
    (calls::cuCtxGetDevice(Out::from(&mut dev))? == CUDA_SUCCESS).then_some(dev)
}

/// Runs a driver call that may change the calling thread's current context: the device
/// this thread remembers is forgotten before and after it.
pub(super) fn moves_current(call: impl FnOnce() -> CuResult) -> CuResult {
    forget();
    let rc = call();
    forget();
    rc
}

fn forget() {
    DEVICE.with(|d| d.set(UNKNOWN));
    CONTEXT.with(|c| c.set(std::ptr::null_mut()));
}

pub fn ctx_set_current(real: Real<(Handle,)>, ctx: Handle) -> CuResult {
    moves_current(|| real.call(ctx))
}

pub fn ctx_push_current(real: Real<(Handle,)>, ctx: Handle) -> CuResult {
    moves_current(|| real.call(ctx))
}

pub fn ctx_pop_current(real: Real<(Out<Handle>,)>, pctx: Out<Handle>) -> CuResult {
    moves_current(|| real.call(pctx))
}

/// `cuGLCtxCreate`: a context made and pushed, not charged (deprecated since CUDA 5.0).
pub fn gl_ctx_create(
    real: Real<(Out<Handle>, u32, c_int)>,
    pctx: Out<Handle>,
    flags: u32,
    dev: c_int,
) -> CuResult {
    moves_current(|| real.call(pctx, flags, dev))
}

/// `cuVDPAUCtxCreate`: as `cuGLCtxCreate`.
pub fn vdpau_ctx_create(
    real: Real<(Out<Handle>, u32, c_int, u32, *mut c_void)>,
    pctx: Out<Handle>,
    flags: u32,
    dev: c_int,
    vdp: u32,
    get: *mut c_void,
) -> CuResult {
    moves_current(|| real.call(pctx, flags, dev, vdp, get))
}
