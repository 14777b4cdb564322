//! The per-context tables: CONTEXT_LOCAL_STORAGE (cudart's values per context),
//! CONTEXT_CHECKS and CONTEXT_IDENTITY.

use libc::c_void;

use super::{Slot, Words, slot};
use crate::abi::{
    CUDA_ERROR_INVALID_HANDLE, CUDA_ERROR_NOT_SUPPORTED, CUresult, call, fmt_args, log, out,
    tracing,
};
use crate::model::cls;
use crate::model::ctx::{self, Ctx, current};

slot_stubs! {
    cls_3 = "CONTEXT_LOCAL_STORAGE[3]",
    checks_1 = "CONTEXT_CHECKS[1]",
    identity_1 = "CONTEXT_IDENTITY[1]",
    identity_2 = "CONTEXT_IDENTITY[2]",
    identity_3 = "CONTEXT_IDENTITY[3]",
}

// --- CONTEXT_LOCAL_STORAGE (c693336e-1121-df11-a8c3-68f355d89593): no size word -----------

/// The context a slot acts on: the given one, or the current one for NULL.
fn ctx_or_current(c: Ctx) -> Result<Ctx, CUresult> {
    if c == 0 {
        Ok(current()?.0)
    } else {
        ctx::check_live(c).map(|_| c)
    }
}

/// [0]: stores `value` under `key` for the context, with a destructor called when it ends.
unsafe extern "C" fn cls_put(c: Ctx, key: usize, value: usize, dtor: cls::Dtor) -> CUresult {
    slot(
        "CONTEXT_LOCAL_STORAGE[0]",
        || {
            fmt_args(&[
                ("ctx", &c),
                ("key", &key),
                ("value", &value),
                ("dtor", &dtor),
            ])
        },
        || {
            cls::put(ctx_or_current(c)?, key, value, dtor);
            Ok(())
        },
    )
}

/// [1]: forgets `key` of the context.
unsafe extern "C" fn cls_delete(c: Ctx, key: usize) -> CUresult {
    slot(
        "CONTEXT_LOCAL_STORAGE[1]",
        || fmt_args(&[("ctx", &c), ("key", &key)]),
        || {
            cls::delete(ctx_or_current(c)?, key);
            Ok(())
        },
    )
}

/// [2]: the value under `key` (CUDA_ERROR_INVALID_HANDLE if none: cudart then creates it).
unsafe extern "C" fn cls_get(value: *mut usize, c: Ctx, key: usize) -> CUresult {
    slot(
        "CONTEXT_LOCAL_STORAGE[2]",
        || fmt_args(&[("value", &value), ("ctx", &c), ("key", &key)]),
        || {
            let v = cls::get(ctx_or_current(c)?, key).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
            out(value, v)
        },
    )
}

pub(super) const CLS_SLOTS: [Slot; 4] = [
    Slot::Fn(cls_put as *const c_void),
    Slot::Fn(cls_delete as *const c_void),
    Slot::Fn(cls_get as *const c_void),
    Slot::Stub(cls_3 as *const c_void),
];
pub(super) static CLS: Words<4> = Words::build(&CLS_SLOTS);

// --- CONTEXT_CHECKS (263e8860-7cd2-6143-92f6-bbd5006dfa7e) ---------------------------------

/// [2]: the context's check flags (always 0) and detail (NULL).
unsafe extern "C" fn checks_context(
    c: Ctx,
    flags: *mut u32,
    detail: *mut *const c_void,
) -> CUresult {
    slot(
        "CONTEXT_CHECKS[2]",
        || fmt_args(&[("ctx", &c), ("flags", &flags), ("detail", &detail)]),
        || {
            if !flags.is_null() {
                out(flags, 0)?;
            }
            if !detail.is_null() {
                out(detail, std::ptr::null())?;
            }
            Ok(())
        },
    )
}

/// [3]: a global check word: 0.
unsafe extern "C" fn checks_global() -> u32 {
    if tracing() {
        log("CONTEXT_CHECKS[3]() -> 0");
    }
    0
}

pub(super) const CHECKS_SLOTS: [Slot; 4] = [
    Slot::Size,
    Slot::Stub(checks_1 as *const c_void),
    Slot::Fn(checks_context as *const c_void),
    Slot::Fn(checks_global as *const c_void),
];
pub(super) static CHECKS: Words<4> = Words::build(&CHECKS_SLOTS);

// --- CONTEXT_IDENTITY (21318c60-9714-3248-8ca6-41ff7324c8f2) -------------------------------

/// [4]: the context's unique id, as cuCtxGetId.
unsafe extern "C" fn identity_ctx_id(c: Ctx, id: *mut u64) -> CUresult {
    slot(
        "CONTEXT_IDENTITY[4]",
        || fmt_args(&[("ctx", &c), ("id", &id)]),
        || out(id, ctx_or_current(c)? as u64),
    )
}

pub(super) const IDENTITY_SLOTS: [Slot; 5] = [
    Slot::Size,
    Slot::Stub(identity_1 as *const c_void),
    Slot::Stub(identity_2 as *const c_void),
    Slot::Stub(identity_3 as *const c_void),
    Slot::Fn(identity_ctx_id as *const c_void),
];
pub(super) static IDENTITY: Words<5> = Words::build(&IDENTITY_SLOTS);
