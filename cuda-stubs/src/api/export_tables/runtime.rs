//! The tables cudart's runtime calls the driver through: CUDART_INTERFACE (its fat
//! binaries, primary contexts, compilers) and CUDA 13's RUNTIME_13 sub-tables.

use libc::{c_char, c_int, c_uint, c_void};

use super::{Slot, Words, slot};
use crate::abi::{CUDA_ERROR_NOT_SUPPORTED, CUresult, call, cstr, fmt_args, note, out};
use crate::api::module::load_module;
use crate::model::ctx::{self, Ctx};
use crate::model::device::check_dev;

slot_stubs! {
    cudart_3 = "CUDART_INTERFACE[3]",
    cudart_4 = "CUDART_INTERFACE[4]",
    cudart_5 = "CUDART_INTERFACE[5]",
    cudart_9 = "CUDART_INTERFACE[9]",
    cudart_10 = "CUDART_INTERFACE[10]",
    cudart_11 = "CUDART_INTERFACE[11]",
    rt13_2 = "RUNTIME_13[2]",
    rt13_5 = "RUNTIME_13[5]",
    rt13_7 = "RUNTIME_13[7]",
    rt13_8 = "RUNTIME_13[8]",
    rt13_9 = "RUNTIME_13[9]",
    rt13_11 = "RUNTIME_13[11]",
    rt13_15 = "RUNTIME_13[15]",
    rt13_16 = "RUNTIME_13[16]",
    rt13_17 = "RUNTIME_13[17]",
    rt13_18 = "RUNTIME_13[18]",
    rt13_19 = "RUNTIME_13[19]",
    rt13_20 = "RUNTIME_13[20]",
    rt13_23 = "RUNTIME_13[23]",
    rt13_24 = "RUNTIME_13[24]",
    rt13_26 = "RUNTIME_13[26]",
    rt13_27 = "RUNTIME_13[27]",
    rt13_28 = "RUNTIME_13[28]",
    rt13_29 = "RUNTIME_13[29]",
    rt13_30 = "RUNTIME_13[30]",
    rt13_31 = "RUNTIME_13[31]",
    rt13_32 = "RUNTIME_13[32]",
    rt13_33 = "RUNTIME_13[33]",
    rt13_34 = "RUNTIME_13[34]",
    rt13_35 = "RUNTIME_13[35]",
    rt13_36 = "RUNTIME_13[36]",
}

// --- CUDART_INTERFACE (6bd5fb6c-5bf4-e74a-8987-d93912fd9df9) ------------------------------

/// [1]: loads the fat binary a `__fatBinC_Wrapper_t` points at (cudart's registered kernels).
unsafe extern "C" fn cudart_module_from_fatbin(
    pmod: *mut usize,
    wrapper: *const c_void,
) -> CUresult {
    slot(
        "CUDART_INTERFACE[1]",
        || fmt_args(&[("module", &pmod), ("wrapper", &wrapper)]),
        || load_module(pmod, wrapper),
    )
}

/// [2]: the primary context handle of a device. cudart asks for it while it enumerates the
/// devices, before it retains the context itself (cuDevicePrimaryCtxRetain): no reference is
/// taken here and an inactive context stays inactive (so its memory is taken, and measured by
/// gpucap, at that retain).
unsafe extern "C" fn cudart_primary_context(pctx: *mut Ctx, dev: c_int) -> CUresult {
    slot(
        "CUDART_INTERFACE[2]",
        || fmt_args(&[("pctx", &pctx), ("dev", &dev)]),
        || {
            let dev = check_dev(dev)?;
            let c = ctx::primary_handle(dev);
            note(|| format!("ctx={c:#x}"));
            out(pctx, c)
        },
    )
}

/// [6]: as [1], with options the fake ignores.
unsafe extern "C" fn cudart_module_from_fatbin_ex(
    pmod: *mut usize,
    wrapper: *const c_void,
    a3: *mut c_void,
    a4: *mut c_void,
    a5: c_uint,
) -> CUresult {
    slot(
        "CUDART_INTERFACE[6]",
        || {
            fmt_args(&[
                ("module", &pmod),
                ("wrapper", &wrapper),
                ("a3", &a3),
                ("a4", &a4),
                ("a5", &a5),
            ])
        },
        || load_module(pmod, wrapper),
    )
}

/// [7]: called with one word; nothing to do.
unsafe extern "C" fn cudart_7(arg: usize) -> CUresult {
    slot(
        "CUDART_INTERFACE[7]",
        || fmt_args(&[("arg", &arg)]),
        || Ok(()),
    )
}

/// [8]: loads a fat binary given by its header (not a wrapper), options ignored.
unsafe extern "C" fn cudart_module_from_fatbin_header(
    header: *const c_void,
    pmod: *mut usize,
    a3: *mut c_void,
    a4: *mut c_void,
    a5: c_uint,
) -> CUresult {
    slot(
        "CUDART_INTERFACE[8]",
        || {
            fmt_args(&[
                ("header", &header),
                ("module", &pmod),
                ("a3", &a3),
                ("a4", &a4),
                ("a5", &a5),
            ])
        },
        || load_module(pmod, header),
    )
}

/// [12]: loads the PTX compiler and friends in a real driver; nothing to load here.
unsafe extern "C" fn cudart_load_compilers() -> CUresult {
    slot("CUDART_INTERFACE[12]", String::new, || Ok(()))
}

pub(super) const CUDART_SLOTS: [Slot; 13] = [
    Slot::Size,
    Slot::Fn(cudart_module_from_fatbin as *const c_void),
    Slot::Fn(cudart_primary_context as *const c_void),
    Slot::Stub(cudart_3 as *const c_void),
    Slot::Stub(cudart_4 as *const c_void),
    Slot::Stub(cudart_5 as *const c_void),
    Slot::Fn(cudart_module_from_fatbin_ex as *const c_void),
    Slot::Fn(cudart_7 as *const c_void),
    Slot::Fn(cudart_module_from_fatbin_header as *const c_void),
    Slot::Stub(cudart_9 as *const c_void),
    Slot::Stub(cudart_10 as *const c_void),
    Slot::Stub(cudart_11 as *const c_void),
    Slot::Fn(cudart_load_compilers as *const c_void),
];
pub(super) static CUDART: Words<13> = Words::build(&CUDART_SLOTS);

// --- RUNTIME_13 (f8cff951-2146-8b4e-b9e2-fb469e7c0dd9): CUDA 13 sub-tables -----------------

/// [1]: a library reports a message: `(domain, severity, printf format, va_list)`. The
/// format is shown under trace (its arguments are not formatted).
unsafe extern "C" fn rt13_log(
    domain: *const c_char,
    severity: c_int,
    format: *const c_char,
    args: *mut c_void,
) -> CUresult {
    slot(
        "RUNTIME_13[1]",
        || fmt_args(&[("severity", &severity), ("args", &args)]),
        || {
            note(|| {
                format!(
                    "{}: {}",
                    cstr(domain).unwrap_or("?"),
                    cstr(format).unwrap_or("?")
                )
            });
            Ok(())
        },
    )
}

/// [25] (slot 3 of the sub-table at 22): the runtime's requirements of the driver are met.
unsafe extern "C" fn rt13_requirements(
    requirement: c_uint,
    state: *const c_void,
    reqs: *const c_void,
) -> CUresult {
    slot(
        "RUNTIME_13[25]",
        || {
            fmt_args(&[
                ("requirement", &requirement),
                ("state", &state),
                ("reqs", &reqs),
            ])
        },
        || Ok(()),
    )
}

pub(super) const RT13_SLOTS: [Slot; 37] = [
    Slot::SubSize(3),
    Slot::Fn(rt13_log as *const c_void),
    Slot::Stub(rt13_2 as *const c_void),
    Slot::Null,
    Slot::SubSize(2),
    Slot::Stub(rt13_5 as *const c_void),
    Slot::SubSize(4),
    Slot::Stub(rt13_7 as *const c_void),
    Slot::Stub(rt13_8 as *const c_void),
    Slot::Stub(rt13_9 as *const c_void),
    Slot::SubSize(2),
    Slot::Stub(rt13_11 as *const c_void),
    Slot::Null,
    Slot::Null,
    Slot::SubSize(7),
    Slot::Stub(rt13_15 as *const c_void),
    Slot::Stub(rt13_16 as *const c_void),
    Slot::Stub(rt13_17 as *const c_void),
    Slot::Stub(rt13_18 as *const c_void),
    Slot::Stub(rt13_19 as *const c_void),
    Slot::Stub(rt13_20 as *const c_void),
    Slot::Null,
    Slot::SubSize(15),
    Slot::Stub(rt13_23 as *const c_void),
    Slot::Stub(rt13_24 as *const c_void),
    Slot::Fn(rt13_requirements as *const c_void),
    Slot::Stub(rt13_26 as *const c_void),
    Slot::Stub(rt13_27 as *const c_void),
    Slot::Stub(rt13_28 as *const c_void),
    Slot::Stub(rt13_29 as *const c_void),
    Slot::Stub(rt13_30 as *const c_void),
    Slot::Stub(rt13_31 as *const c_void),
    Slot::Stub(rt13_32 as *const c_void),
    Slot::Stub(rt13_33 as *const c_void),
    Slot::Stub(rt13_34 as *const c_void),
    Slot::Stub(rt13_35 as *const c_void),
    Slot::Stub(rt13_36 as *const c_void),
];
pub(super) static RT13: Words<37> = Words::build(&RT13_SLOTS);
