//! `cuMemAlloc*`, `cuMemFree*`: linear device memory, charged per pointer.

use super::current::{context_device, current_device};
use super::{
    On, Target, Word, arena, charge_freed, charged, charged_on, charged_short, checked_device,
    pointer_freed, reserve, short_path, uncharged_freed, written_pointer,
};
use crate::driver::forward::Real;
use crate::driver::hooked::real;
use crate::driver::types::{
    CUDA_ERROR_INVALID_DEVICE, CUDA_ERROR_OUT_OF_MEMORY, CUDA_SUCCESS, CuResult, Dptr, Out,
};
use crate::state::SHIM;
use gpucap_core::growth::GROWTH;
use gpucap_core::linear;

pub fn mem_alloc(real: Real<(Out<Dptr>, usize)>, dptr: Out<Dptr>, size: usize) -> CuResult {
    // Off the short path `charged_short` finds no device (one load of the short-path
    // byte, not two) and hands the call back.
    match charged_short(
        linear::charge(size as u64),
        || real.call(dptr, size),
        || written_pointer(dptr),
    ) {
        Ok(rc) => rc,
        Err(_) => mem_alloc_full(real, dptr, size),
    }
}

/// [`mem_alloc`] off the short path: growth mode's arena, or the full reservation.
/// A function of its own, left to the compiler to inline: forced out of line, every
/// call off the short path (growth mode, a pool) would pay a second frame; forced
/// inline, the short path would pay the full path's frame.
#[inline]
fn mem_alloc_full(real: Real<(Out<Dptr>, usize)>, dptr: Out<Dptr>, size: usize) -> CuResult {
    let api = "cuMemAlloc";
    if !short_path() && growth() && !dptr.is_null() {
        // Asked of the driver: the arena serves without calling it, so it must know
        // that a context is current.
        let Some(device) = context_device() else {
            // Without a context the driver answers with its error.
            return real.call(dptr, size);
        };
        let Some(d) = checked_device(&SHIM, device) else {
            return CUDA_ERROR_INVALID_DEVICE;
        };
        return match arena::alloc(api, d, size as u64) {
            Ok(base) => {
                // The caller's out-pointer, checked non-null above.
                dptr.set(base);
                CUDA_SUCCESS
            }
            Err(rc) => rc,
        };
    }
    charged_on(
        api,
        current_device(),
        size as u64,
        linear::charge(size as u64),
        || real.call(dptr, size),
        || written_pointer(dptr),
    )
}

/// Whether growth-only mode is on (false while misconfigured: callers fail then).
#[inline]
pub(super) fn growth() -> bool {
    SHIM.config().is_ok_and(|c| c.growth)
}

/// Frees `dptr` if growth mode served it.
// Inlined so that a free outside growth mode pays two loads, not a call (the body
// of `arena::free` stays out of line).
#[inline(always)]
pub(super) fn growth_free(dptr: Dptr) -> Option<CuResult> {
    if growth() && GROWTH.has_mappings() {
        arena::free(dptr)
    } else {
        None
    }
}

pub fn mem_alloc_managed(
    real: Real<(Out<Dptr>, usize, u32)>,
    dptr: Out<Dptr>,
    size: usize,
    flags: u32,
) -> CuResult {
    let target = match reserve(
        "cuMemAllocManaged",
        On::Current(current_device()),
        size as u64,
        size as u64,
    ) {
        Ok(t) => t,
        Err(rc) => return rc,
    };
    let rc = real.call(dptr, size, flags);
    if let (CUDA_SUCCESS, Target::Charged(r)) = (rc, target) {
        // Managed memory takes device memory as it is touched, not now.
        r.commit_unbacked(written_pointer(dptr));
    }
    rc
}

/// Pitch alignment the reservation assumes before the driver says the real pitch.
pub(super) const PITCH_GUESS: u64 = 512;

/// `cuMemAllocPitch`'s arguments: the pointer and pitch written, the width and height
/// asked, the element size.
type PitchArgs<'a, P, W> = (Out<'a, P>, Out<'a, W>, W, W, u32);

/// `cuMemAllocPitch_v2`, and the CUDA 2.x `cuMemAllocPitch` (32-bit pointer and sizes).
pub fn mem_alloc_pitch<P: Word, W: Word>(
    real: Real<PitchArgs<P, W>>,
    dptr: Out<P>,
    pitch: Out<W>,
    width: W,
    height: W,
    elem: u32,
) -> CuResult {
    let api = "cuMemAllocPitch";
    let guess = width
        .get()
        .checked_next_multiple_of(PITCH_GUESS)
        .and_then(|w| w.checked_mul(height.get()))
        .unwrap_or(u64::MAX);
    let on = On::Current(current_device());
    let target = match reserve(api, on, guess, linear::charge(guess)) {
        Ok(t) => t,
        Err(rc) => return rc,
    };
    let rc = real.call(dptr, pitch, width, height, elem);
    let (CUDA_SUCCESS, Target::Charged(mut r)) = (rc, target) else {
        return rc;
    };
    // The driver succeeded and filled both out-pointers.
    let ptr = written_pointer(dptr);
    let actual = pitch
        .get()
        .map_or(0, |p| p.get().saturating_mul(height.get()));
    if let Err(refusal) = SHIM.ledger.resize(&mut r, linear::charge(actual)) {
        // The driver padded more than the cap allows: give it back and refuse.
        SHIM.refused(api, r.charge().device, actual, refusal);
        let _ = real::cuMemFree_v2(ptr);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    r.commit(ptr);
    rc
}

/// `cuMemFree_v2`, and the CUDA 2.x `cuMemFree` (32-bit pointer). Stream-ordered
/// (pool) memory may be freed this way too.
pub fn mem_free<P: Word>(real: Real<(P,)>, dptr: P) -> CuResult {
    if !short_path() {
        return mem_free_full(real, dptr);
    }
    if let Some(c) = SHIM.ledger.take_quick(dptr.get()) {
        return charge_freed(dptr.get(), c, || real.call(dptr));
    }
    mem_free_full(real, dptr)
}

/// [`mem_free`] off the short path, or of a pointer whose entry is not where the short
/// path looks first (spilled in the live map, or not there: pool memory, a pointer gpucap
/// never charged). Left to the compiler to inline, as [`mem_alloc_full`].
#[inline]
fn mem_free_full<P: Word>(real: Real<(P,)>, dptr: P) -> CuResult {
    if short_path() {
        // The short path looked in the entry's home bucket: the rest of the map now.
        return match SHIM.ledger.take_rest(dptr.get()) {
            Some(c) => charge_freed(dptr.get(), c, || real.call(dptr)),
            None => uncharged_freed(dptr.get(), || real.call(dptr)),
        };
    }
    if let Some(rc) = growth_free(dptr.get()) {
        return rc;
    }
    pointer_freed(dptr.get(), || real.call(dptr))
}

// ---------------------------------------------------------------------------
// The CUDA 2.x variants (32-bit pointers and sizes), counted like their _v2.

pub fn mem_alloc_v1(real: Real<(Out<u32>, u32)>, dptr: Out<u32>, size: u32) -> CuResult {
    charged(
        "cuMemAlloc",
        size.into(),
        || real.call(dptr, size),
        || written_pointer(dptr),
    )
}
