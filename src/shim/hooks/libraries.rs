//! `cuLibraryLoadData`, `cuLibraryLoadFromFile`: under CUDA's lazy loading (the default)
//! a library takes nothing at its load, and each context takes its copy at a first use
//! there (`launches`). Under eager loading (`CUDA_MODULE_LOADING=EAGER`) the driver loads
//! it into every context of the process at the load (NVIDIA's `cuLibraryLoadData`
//! documentation; an H200 with PyTorch: 732 MiB more with its context, cuBLAS's first
//! matmul 512 MiB against 98 MiB lazily, docs/gpu-runs/2026-11-26-h100): measured on each
//! GPU where the process holds a context, charged there, and recorded with each
//! context's copy (credited when that context ends or the library is unloaded).
//! A later context takes its copies at its creation, measured with it.

use std::ffi::{c_int, c_void};

use super::contexts::pool_marks;
use super::residents::{
    Again, judge_measured, made_again, record_more, resident_in, try_charge_undoable,
};
use super::shim;
use crate::driver::forward::Real;
use crate::driver::types::{CText, CUDA_SUCCESS, CuResult, Handle, Out, SavedValues};
use crate::driver::{kernel_queries, queries};
use crate::log::log;
use crate::state::{CONTEXTS, KERNELS, SHIM};
use gpucap_core::config::MAX_DEVICES;
use gpucap_core::contexts::{DeviceLock, Unmeasured};
use gpucap_core::ledger::Charge;
use gpucap_core::residents::{self, again::Loads};

/// A `cuLibraryLoad*` call: the library, the code (an image, or a file's name), options.
type Load<'a, Code> = Real<(
    Out<'a, Handle>,
    Code,
    *mut c_int,
    *mut *mut c_void,
    u32,
    *mut c_int,
    *mut *mut c_void,
    u32,
)>;

/// What a library is loaded from, which names the entry point.
pub trait Code: Copy {
    const API: &'static str;
}
/// `cuLibraryLoadData`'s image.
impl Code for *const c_void {
    const API: &'static str = "cuLibraryLoadData";
}
/// `cuLibraryLoadFromFile`'s file name.
impl Code for CText<'_> {
    const API: &'static str = "cuLibraryLoadFromFile";
}

/// `cuLibraryLoadData` and `cuLibraryLoadFromFile`: both rows of the hook table name this
/// function, `C` told apart by its argument.
#[allow(clippy::too_many_arguments)]
pub fn library_load<C: Code>(
    real: Load<'_, C>,
    library: Out<Handle>,
    code: C,
    jit_options: *mut c_int,
    jit_values: *mut *mut c_void,
    num_jit: u32,
    lib_options: *mut c_int,
    lib_values: *mut *mut c_void,
    num_lib: u32,
) -> CuResult {
    // A load made again passes the values the program passed, not the driver's outputs.
    let saved = [
        SavedValues::save(jit_values, num_jit),
        SavedValues::save(lib_values, num_lib),
    ];
    let mut made = false;
    library_loaded(C::API, library, || {
        if std::mem::replace(&mut made, true) {
            saved.iter().for_each(SavedValues::restore);
        }
        real.call(
            library,
            code,
            jit_options,
            jit_values,
            num_jit,
            lib_options,
            lib_values,
            num_lib,
        )
    })
}

/// A library load made by `call`, its handle written to `out`. Lazily: forwarded. Under
/// eager loading, with the device lock of every GPU where the process holds a context
/// (taken in ascending order; every other path holds one at a time), the free memory of
/// each is measured around the load (other members' traffic taken out in a pool), as a
/// module load is. What the cap (or the pool) cannot take on any of them is unloaded
/// again (announced to the pool as a free) and refused with `CUDA_ERROR_OUT_OF_MEMORY`,
/// as a module load is, or loaded again where a figure may be the pool's traffic
/// (`residents::again::Loads`, one judge per GPU). A load that cannot be measured is
/// refused under a cap.
fn library_loaded(api: &str, out: Out<Handle>, mut call: impl FnMut() -> CuResult) -> CuResult {
    if !kernel_queries::eager_loading() {
        return call();
    }
    if let Err(rc) = shim() {
        return rc;
    }
    let mut loads: Vec<Loads> = (0..MAX_DEVICES).map(|_| Loads::default()).collect();
    made_again(api, |last| {
        library_once(api, out, &mut call, last, &mut loads)
    })
}

/// One attempt of [`library_loaded`] (`last`: no other follows): Err where the library
/// was unloaded to be loaded again.
fn library_once(
    api: &str,
    out: Out<Handle>,
    call: &mut impl FnMut() -> CuResult,
    last: bool,
    loads: &mut [Loads],
) -> Result<CuResult, Again> {
    let locks: Vec<DeviceLock<'static>> = (0..MAX_DEVICES)
        .filter_map(|d| CONTEXTS.lock(d))
        .filter(|lock| !lock.contexts().is_empty())
        .collect();
    if locks.is_empty() {
        return Ok(call()); // no context yet: each takes its copies at its creation
    }
    let mut measured = Vec::with_capacity(locks.len());
    let rc = measure_each(&locks, &mut *call, &mut measured);
    // The driver succeeded and wrote the library's handle.
    let (CUDA_SUCCESS, Some(lib)) = (rc, out.get()) else {
        return Ok(rc);
    };
    let owners = [Some(lib as u64), kernel_queries::library_module(lib)];
    // Each GPU's figure (None: not measured, and no cap there).
    let mut figures = Vec::with_capacity(locks.len());
    let mut unmeasured = None;
    for (lock, (measured, doubt)) in locks.iter().zip(measured) {
        let d = lock.device();
        match judge_measured(api, "library", d, measured.map(residents::taken)) {
            Ok(Some(figure)) if figure > 0 => figures.push((lock, figure, doubt)),
            Ok(_) => {}
            Err(refused) => unmeasured = unmeasured.or(Some(refused)),
        }
    }
    // Unloads it (and hands the program no library), crediting the copies charged so far
    // (`launches::unloading` announces their charges), and announcing first as frees
    // the rest of what it may give back: the figures of the GPUs not charged, and what
    // the charged ones measured above their charges.
    let unload = |charged: &[u64]| {
        let most = || {
            figures
                .iter()
                .enumerate()
                .map(|(i, (lock, figure, _))| Charge {
                    device: lock.device(),
                    bytes: figure - charged.get(i).copied().unwrap_or(0).min(*figure),
                })
                .filter(|c| c.bytes > 0)
                .collect()
        };
        let unload = || super::launches::unloading(&owners, || kernel_queries::unload_library(lib));
        let _ = super::residents::announced_release(most, unload);
        out.set(std::ptr::null_mut());
    };
    if let Some(refused) = unmeasured {
        unload(&[]);
        return Ok(refused);
    }
    // What to charge on each GPU (each judged, each judge seeing this attempt), or made
    // again where any is.
    let judged: Vec<Option<u64>> = figures
        .iter()
        .map(|&(lock, figure, doubt)| {
            let d = lock.device();
            // Memory the process's own pools only cache is trimmed first, as for an
            // allocation.
            super::reclaim_for(&SHIM, d, figure);
            // A context made meanwhile takes a copy too: another start.
            let start = lock.contexts().len() as u64;
            let beyond = |b| SHIM.ledger.would_refuse_here(d, b);
            loads[d].judge(start, (figure, doubt), last, beyond).bytes()
        })
        .collect();
    let Some(judged) = judged.into_iter().collect::<Option<Vec<u64>>>() else {
        unload(&[]);
        return Err(Again::Unsure);
    };
    let mut charged = Vec::with_capacity(figures.len());
    for (&(lock, figure, _), bytes) in figures.iter().zip(judged) {
        let d = lock.device();
        // Refused where the check saw room: another member's guarantee holds it, or
        // another member took it meanwhile. Said at once: one load, one refusal.
        if let Err(not_taken) = try_charge_undoable(d, None, bytes, bytes, || unload(&charged)) {
            return Ok(not_taken.say(api));
        }
        charged.push(bytes);
        record_copies(lib, lock, bytes);
        log!(
            Debug,
            "{api}: the library takes {} on GPU {d} (loaded eagerly into {} context(s); measured {})",
            gpucap_core::size::format_bytes(bytes),
            lock.contexts().len(),
            gpucap_core::size::format_bytes(figure)
        );
    }
    Ok(rc)
}

/// Runs `call` measured on each of `locks`' devices (one measurement inside the next),
/// pushing each device's measurement and its window's doubt (`measure_with_doubt`) to
/// `measured` in the order of `locks` (an eager load here; a launch on several devices
/// in one call, `multi_device`).
pub(super) fn measure_each(
    locks: &[DeviceLock<'static>],
    call: &mut dyn FnMut() -> CuResult,
    measured: &mut Vec<(Result<i128, Unmeasured>, u64)>,
) -> CuResult {
    let Some((lock, rest)) = locks.split_first() else {
        return call();
    };
    let d = lock.device();
    let mut inner = Vec::with_capacity(rest.len());
    let (rc, taken, _, doubt) =
        lock.measure_with_doubt(&queries::Contexts, None, pool_marks(d), || {
            measure_each(rest, &mut *call, &mut inner)
        });
    measured.push((taken, doubt));
    measured.append(&mut inner);
    rc
}

/// Records `bytes`, what library `lib` took on `lock`'s device, as one copy in each of
/// the process's contexts there (each the same size; the rest of the division with the
/// first), under (context, library, library) in the kernels' charges: each copy is
/// credited when its context ends, all at the library's unload.
fn record_copies(lib: Handle, lock: &DeviceLock<'_>, bytes: u64) {
    let contexts = lock.contexts();
    let n = contexts.len().max(1) as u64;
    for (i, &ctx) in contexts.iter().enumerate() {
        let share = bytes / n + if i == 0 { bytes % n } else { 0 };
        let device = lock.device();
        let held = resident_in(
            ctx as Handle,
            lock,
            Charge {
                device,
                bytes: share,
            },
        );
        record_more(&KERNELS, (ctx, lib as u64, lib as u64), held);
    }
}
