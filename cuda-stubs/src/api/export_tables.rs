//! `cuGetExportTable`: the driver's private tables that NVIDIA's libcudart (and libraries
//! built on it: cuBLAS, cuDNN, ...) asks for by UUID. Each table is an array of words: most
//! start with the table's byte size, the rest are function pointers ("slots"). The layouts
//! were learnt from ZLUDA's reverse engineering (vosen/ZLUDA, `dark_api`) and from tracing
//! what cudart calls (FAKECUDA_TRACE); nothing here is NVIDIA's or ZLUDA's code.
//!
//! Every slot is either implemented (below) or a stub that logs its call under
//! FAKECUDA_TRACE (`fakecuda: TABLE[n](...) -> CUDA_ERROR_NOT_SUPPORTED`) and returns
//! CUDA_ERROR_NOT_SUPPORTED; STUBS.md lists the stubs, README.md the tables. A UUID the fake
//! does not know gets CUDA_ERROR_INVALID_VALUE and a NULL table (logged under trace).

use crate::abi::*;
use crate::api::device::attribute;
use crate::api::module::load_module;
use crate::integrity::{self, CheckDevice, CheckInput};
use crate::model::cls;
use crate::model::ctx::{self, Ctx, current};
use crate::model::device::{cfg, check_dev, uuid_v2};
use libc::{c_char, c_int, c_uint, c_void};

/// What a slot holds.
#[derive(Clone, Copy)]
pub enum Slot {
    /// The table's size in bytes (slots x 8).
    Size,
    /// A word the fake leaves 0 (cudart reads it as "absent").
    Null,
    /// A size word of a sub-table of `n` slots (f8cff951 holds several sub-tables).
    SubSize(usize),
    /// An implemented function.
    Fn(*const c_void),
    /// A logging stub (returns CUDA_ERROR_NOT_SUPPORTED).
    Stub(*const c_void),
}

/// A table as cudart reads it.
#[repr(C)]
pub struct Words<const N: usize>([*const c_void; N]);

// SAFETY: the tables are immutable after compilation: function addresses and sizes.
unsafe impl<const N: usize> Sync for Words<N> {}

impl<const N: usize> Words<N> {
    const fn build(slots: &[Slot; N]) -> Self {
        let mut w = [std::ptr::null::<c_void>(); N];
        let mut i = 0;
        while i < N {
            w[i] = match slots[i] {
                Slot::Size => (N * 8) as *const c_void,
                Slot::Null => std::ptr::null(),
                Slot::SubSize(n) => (n * 8) as *const c_void,
                Slot::Fn(f) | Slot::Stub(f) => f,
            };
            i += 1;
        }
        Words(w)
    }

    fn addr(&'static self) -> *const c_void {
        self.0.as_ptr().cast()
    }
}

/// One table: its name, UUID (as cudart passes it: 16 bytes), slots and words.
#[cfg_attr(not(test), allow(dead_code))]
pub struct Table {
    pub name: &'static str,
    pub uuid: [u8; 16],
    pub slots: &'static [Slot],
    words: fn() -> *const c_void,
}

// SAFETY: see Words.
unsafe impl Sync for Table {}

/// Defines a logging stub per (function name, "TABLE[n]").
macro_rules! slot_stubs {
    ($($f:ident = $label:literal),* $(,)?) => {$(
        extern "C" fn $f() -> CUresult {
            call($label, || "...".to_string(), || Err(CUDA_ERROR_NOT_SUPPORTED))
        }
    )*};
}

slot_stubs! {
    cupti_1 = "CUPTI[1]",
    cupti_2 = "CUPTI[2]",
    cupti_3 = "CUPTI[3]",
    cupti_4 = "CUPTI[4]",
    cupti_5 = "CUPTI[5]",
    cupti_6 = "CUPTI[6]",
    cupti_7 = "CUPTI[7]",
    cupti_8 = "CUPTI[8]",
    cupti_9 = "CUPTI[9]",
    cupti_10 = "CUPTI[10]",
    cupti_11 = "CUPTI[11]",
    cupti_12 = "CUPTI[12]",
    cupti_13 = "CUPTI[13]",
    cupti_14 = "CUPTI[14]",
    cupti_15 = "CUPTI[15]",
    cupti_16 = "CUPTI[16]",
    cupti_17 = "CUPTI[17]",
    cupti_18 = "CUPTI[18]",
    cupti_19 = "CUPTI[19]",
    cupti_20 = "CUPTI[20]",
    cupti_21 = "CUPTI[21]",
    cupti_22 = "CUPTI[22]",
    cupti_23 = "CUPTI[23]",
    cupti_24 = "CUPTI[24]",
    cupti_25 = "CUPTI[25]",
    cupti_26 = "CUPTI[26]",
    cupti_27 = "CUPTI[27]",
    cupti_28 = "CUPTI[28]",
    cupti_29 = "CUPTI[29]",
    cupti_30 = "CUPTI[30]",
    cupti_31 = "CUPTI[31]",
    cupti_32 = "CUPTI[32]",
    cupti_33 = "CUPTI[33]",
    cupti_34 = "CUPTI[34]",
    cupti_35 = "CUPTI[35]",
    cupti_36 = "CUPTI[36]",
    cupti_37 = "CUPTI[37]",
    cupti_38 = "CUPTI[38]",
    cupti_39 = "CUPTI[39]",
    cupti_40 = "CUPTI[40]",
    cupti_41 = "CUPTI[41]",
    cupti_42 = "CUPTI[42]",
    cupti_43 = "CUPTI[43]",
    cupti_44 = "CUPTI[44]",
    cupti_45 = "CUPTI[45]",
    cupti_46 = "CUPTI[46]",
    cupti_47 = "CUPTI[47]",
    cupti_48 = "CUPTI[48]",
    cupti_49 = "CUPTI[49]",
    cupti_50 = "CUPTI[50]",
    cupti_51 = "CUPTI[51]",
    cupti_52 = "CUPTI[52]",
    cupti_53 = "CUPTI[53]",
    cupti_54 = "CUPTI[54]",
    cupti_55 = "CUPTI[55]",
    cupti_56 = "CUPTI[56]",
    cupti_57 = "CUPTI[57]",
    cupti_58 = "CUPTI[58]",
    cupti_59 = "CUPTI[59]",
    cupti_60 = "CUPTI[60]",
    cupti_61 = "CUPTI[61]",
    cupti_62 = "CUPTI[62]",
    cupti_63 = "CUPTI[63]",
    cupti_64 = "CUPTI[64]",
    cupti_65 = "CUPTI[65]",
    cupti_66 = "CUPTI[66]",
    cupti_67 = "CUPTI[67]",
    cupti_68 = "CUPTI[68]",
    cupti_69 = "CUPTI[69]",
    cupti_70 = "CUPTI[70]",
    cupti_71 = "CUPTI[71]",
    cupti_72 = "CUPTI[72]",
    cupti_73 = "CUPTI[73]",
    cupti_74 = "CUPTI[74]",
    cupti_75 = "CUPTI[75]",
    cupti_76 = "CUPTI[76]",
    cupti_77 = "CUPTI[77]",
    cupti_78 = "CUPTI[78]",
    cupti_79 = "CUPTI[79]",
    cupti_80 = "CUPTI[80]",
    cupti_81 = "CUPTI[81]",
    cupti_82 = "CUPTI[82]",
    cupti_83 = "CUPTI[83]",
    cupti_84 = "CUPTI[84]",
    cupti_85 = "CUPTI[85]",
    cupti_86 = "CUPTI[86]",
    cupti_87 = "CUPTI[87]",
    cupti_88 = "CUPTI[88]",
    cupti_89 = "CUPTI[89]",
    cupti_90 = "CUPTI[90]",
    cupti_91 = "CUPTI[91]",
    cupti_92 = "CUPTI[92]",
    cupti_93 = "CUPTI[93]",
    cupti_94 = "CUPTI[94]",
    cupti_95 = "CUPTI[95]",
    cupti_96 = "CUPTI[96]",
    cupti_97 = "CUPTI[97]",
    cupti_98 = "CUPTI[98]",
    cupti_99 = "CUPTI[99]",
    cupti_100 = "CUPTI[100]",
    cupti_101 = "CUPTI[101]",
    cupti_102 = "CUPTI[102]",
    cupti_103 = "CUPTI[103]",
    cupti_104 = "CUPTI[104]",
    cupti_105 = "CUPTI[105]",
    cupti_106 = "CUPTI[106]",
    cupti_107 = "CUPTI[107]",
    cupti_108 = "CUPTI[108]",
    cupti_109 = "CUPTI[109]",
    cupti_110 = "CUPTI[110]",
    cupti_111 = "CUPTI[111]",
    cupti_112 = "CUPTI[112]",
    cupti_113 = "CUPTI[113]",
    cupti_114 = "CUPTI[114]",
    cupti_115 = "CUPTI[115]",
    cupti_116 = "CUPTI[116]",
    cupti_117 = "CUPTI[117]",
    cupti_118 = "CUPTI[118]",
    cupti_119 = "CUPTI[119]",
    cupti_120 = "CUPTI[120]",
    cupti_121 = "CUPTI[121]",
    cupti_122 = "CUPTI[122]",
    cupti_123 = "CUPTI[123]",
    cupti_124 = "CUPTI[124]",
    cupti_125 = "CUPTI[125]",
    cupti_126 = "CUPTI[126]",
    cupti_127 = "CUPTI[127]",
    cudart_3 = "CUDART_INTERFACE[3]", cudart_4 = "CUDART_INTERFACE[4]",
    cudart_5 = "CUDART_INTERFACE[5]", cudart_9 = "CUDART_INTERFACE[9]",
    cudart_10 = "CUDART_INTERFACE[10]", cudart_11 = "CUDART_INTERFACE[11]",
    tls_1 = "TOOLS_TLS[1]", tls_3 = "TOOLS_TLS[3]",
    hooks_3 = "TOOLS_RUNTIME_CALLBACK_HOOKS[3]",
    cls_3 = "CONTEXT_LOCAL_STORAGE[3]",
    checks_1 = "CONTEXT_CHECKS[1]",
    integrity_2 = "INTEGRITY_CHECK[2]",
    identity_1 = "CONTEXT_IDENTITY[1]", identity_2 = "CONTEXT_IDENTITY[2]",
    identity_3 = "CONTEXT_IDENTITY[3]",
    rt13_2 = "RUNTIME_13[2]", rt13_5 = "RUNTIME_13[5]", rt13_7 = "RUNTIME_13[7]",
    rt13_8 = "RUNTIME_13[8]", rt13_9 = "RUNTIME_13[9]", rt13_11 = "RUNTIME_13[11]",
    rt13_15 = "RUNTIME_13[15]", rt13_16 = "RUNTIME_13[16]", rt13_17 = "RUNTIME_13[17]",
    rt13_18 = "RUNTIME_13[18]", rt13_19 = "RUNTIME_13[19]", rt13_20 = "RUNTIME_13[20]",
    rt13_23 = "RUNTIME_13[23]", rt13_24 = "RUNTIME_13[24]", rt13_26 = "RUNTIME_13[26]",
    rt13_27 = "RUNTIME_13[27]", rt13_28 = "RUNTIME_13[28]", rt13_29 = "RUNTIME_13[29]",
    rt13_30 = "RUNTIME_13[30]", rt13_31 = "RUNTIME_13[31]", rt13_32 = "RUNTIME_13[32]",
    rt13_33 = "RUNTIME_13[33]", rt13_34 = "RUNTIME_13[34]", rt13_35 = "RUNTIME_13[35]",
    rt13_36 = "RUNTIME_13[36]",
}

/// Runs a slot body like an entry point (traced, no unwinding).
fn slot(name: &str, args: impl FnOnce() -> String, body: impl FnOnce() -> CuResult) -> CUresult {
    call(name, args, body)
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

const CUDART_SLOTS: [Slot; 13] = [
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
static CUDART: Words<13> = Words::build(&CUDART_SLOTS);

// --- TOOLS_TLS (42d85a81-23f6-cb47-8298-f6e78a3aecdc) -------------------------------------

/// [2]: the calling thread's current context (NULL if none), as cuCtxGetCurrent.
unsafe extern "C" fn tls_current_context(pctx: *mut Ctx) -> CUresult {
    slot(
        "TOOLS_TLS[2]",
        || fmt_args(&[("pctx", &pctx)]),
        || {
            cfg()?;
            out(pctx, ctx::top())
        },
    )
}

const TLS_SLOTS: [Slot; 4] = [
    Slot::Size,
    Slot::Stub(tls_1 as *const c_void),
    Slot::Fn(tls_current_context as *const c_void),
    Slot::Stub(tls_3 as *const c_void),
];
static TLS: Words<4> = Words::build(&TLS_SLOTS);

// --- TOOLS_RUNTIME_CALLBACK_HOOKS (a094798c-2e74-2e74-93f2-0800200c0a66) -------------------

/// Zeroed buffers the runtime reads its tool callbacks from (no tool is attached).
struct HookBuffer<const N: usize>(std::cell::UnsafeCell<[u8; N]>);
// SAFETY: the fake never reads or writes these; cudart owns their contents.
unsafe impl<const N: usize> Sync for HookBuffer<N> {}
static HOOKS_BUFFER_2: HookBuffer<1024> = HookBuffer(std::cell::UnsafeCell::new([0; 1024]));
static HOOKS_BUFFER_6: HookBuffer<14> = HookBuffer(std::cell::UnsafeCell::new([0; 14]));

fn hook_buffer<const N: usize>(
    b: &'static HookBuffer<N>,
    ptr: *mut *mut c_void,
    size: *mut usize,
) -> CuResult {
    if !ptr.is_null() {
        out(ptr, b.0.get().cast())?;
    }
    if !size.is_null() {
        out(size, N)?;
    }
    Ok(())
}

/// [2]: a 1024-byte buffer and its size.
unsafe extern "C" fn hooks_buffer_2(ptr: *mut *mut c_void, size: *mut usize) -> CUresult {
    slot(
        "TOOLS_RUNTIME_CALLBACK_HOOKS[2]",
        || fmt_args(&[("ptr", &ptr), ("size", &size)]),
        || hook_buffer(&HOOKS_BUFFER_2, ptr, size),
    )
}

/// [6]: a 14-byte buffer and its size.
unsafe extern "C" fn hooks_buffer_6(ptr: *mut *mut c_void, size: *mut usize) -> CUresult {
    slot(
        "TOOLS_RUNTIME_CALLBACK_HOOKS[6]",
        || fmt_args(&[("ptr", &ptr), ("size", &size)]),
        || hook_buffer(&HOOKS_BUFFER_6, ptr, size),
    )
}

/// [1] and [4]: called in pairs by cudart around its API calls (tool callbacks): no tool is
/// attached, nothing to do.
unsafe extern "C" fn hooks_1(a0: usize, a1: usize, a2: usize) -> CUresult {
    slot(
        "TOOLS_RUNTIME_CALLBACK_HOOKS[1]",
        || fmt_args(&[("a0", &a0), ("a1", &a1), ("a2", &a2)]),
        || Ok(()),
    )
}

unsafe extern "C" fn hooks_4(a0: usize, a1: usize, a2: usize) -> CUresult {
    slot(
        "TOOLS_RUNTIME_CALLBACK_HOOKS[4]",
        || fmt_args(&[("a0", &a0), ("a1", &a1), ("a2", &a2)]),
        || Ok(()),
    )
}

/// [5]: called by cudart as the process exits (PyTorch's); no tool is attached: nothing to do.
unsafe extern "C" fn hooks_5(a0: usize, a1: usize, a2: usize) -> CUresult {
    slot(
        "TOOLS_RUNTIME_CALLBACK_HOOKS[5]",
        || fmt_args(&[("a0", &a0), ("a1", &a1), ("a2", &a2)]),
        || Ok(()),
    )
}

const HOOKS_SLOTS: [Slot; 7] = [
    Slot::Size,
    Slot::Fn(hooks_1 as *const c_void),
    Slot::Fn(hooks_buffer_2 as *const c_void),
    Slot::Stub(hooks_3 as *const c_void),
    Slot::Fn(hooks_4 as *const c_void),
    Slot::Fn(hooks_5 as *const c_void),
    Slot::Fn(hooks_buffer_6 as *const c_void),
];
static HOOKS: Words<7> = Words::build(&HOOKS_SLOTS);

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

const CLS_SLOTS: [Slot; 4] = [
    Slot::Fn(cls_put as *const c_void),
    Slot::Fn(cls_delete as *const c_void),
    Slot::Fn(cls_get as *const c_void),
    Slot::Stub(cls_3 as *const c_void),
];
static CLS: Words<4> = Words::build(&CLS_SLOTS);

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

const CHECKS_SLOTS: [Slot; 4] = [
    Slot::Size,
    Slot::Stub(checks_1 as *const c_void),
    Slot::Fn(checks_context as *const c_void),
    Slot::Fn(checks_global as *const c_void),
];
static CHECKS: Words<4> = Words::build(&CHECKS_SLOTS);

// --- INTEGRITY_CHECK (d4082055-bde6-704b-8d34-ba123c66e1f2) --------------------------------

/// [1]: the value cudart checks the driver with (crate::integrity).
unsafe extern "C" fn integrity_check(
    version: u32,
    unix_seconds: u64,
    result: *mut [u64; 2],
) -> CUresult {
    slot(
        "INTEGRITY_CHECK[1]",
        || {
            fmt_args(&[
                ("version", &version),
                ("unix_seconds", &unix_seconds),
                ("result", &result),
            ])
        },
        || {
            let cfg = cfg()?;
            let devices: Vec<CheckDevice> = (0..cfg.visible.len())
                .map(|dev| CheckDevice {
                    uuid: uuid_v2(dev),
                    pci_domain: attribute(50, dev),
                    pci_bus: attribute(33, dev),
                    pci_device: attribute(34, dev),
                })
                .collect();
            let input = CheckInput {
                driver_version: cfg.driver_version as u32,
                version,
                pid: std::process::id(),
                // SAFETY: pthread_self has no preconditions.
                thread: unsafe { libc::pthread_self() } as u32,
                cudart_table: CUDART.addr() as usize,
                integrity_table: INTEGRITY.addr() as usize,
                function: integrity_check as *const c_void as usize,
                unix_seconds,
            };
            out(result, integrity::check(&input, &devices))
        },
    )
}

const INTEGRITY_SLOTS: [Slot; 3] = [
    Slot::Size,
    Slot::Fn(integrity_check as *const c_void),
    Slot::Stub(integrity_2 as *const c_void),
];
static INTEGRITY: Words<3> = Words::build(&INTEGRITY_SLOTS);

// --- CONTEXT_IDENTITY (21318c60-9714-3248-8ca6-41ff7324c8f2) -------------------------------

/// [4]: the context's unique id, as cuCtxGetId.
unsafe extern "C" fn identity_ctx_id(c: Ctx, id: *mut u64) -> CUresult {
    slot(
        "CONTEXT_IDENTITY[4]",
        || fmt_args(&[("ctx", &c), ("id", &id)]),
        || out(id, ctx_or_current(c)? as u64),
    )
}

const IDENTITY_SLOTS: [Slot; 5] = [
    Slot::Size,
    Slot::Stub(identity_1 as *const c_void),
    Slot::Stub(identity_2 as *const c_void),
    Slot::Stub(identity_3 as *const c_void),
    Slot::Fn(identity_ctx_id as *const c_void),
];
static IDENTITY: Words<5> = Words::build(&IDENTITY_SLOTS);

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

const RT13_SLOTS: [Slot; 37] = [
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
static RT13: Words<37> = Words::build(&RT13_SLOTS);

// --- CUPTI (7cb63f9b-9ca4-8e42-a484-beb66e6aed7f) -------------------------------------------

/// CUPTI (NVIDIA's profiling library; JAX's start-up version check calls `cuptiGetVersion`)
/// asks for this table and fails without it; none of its slots is called by
/// `cuptiGetVersion` or by the framework runs here. Its layout is not known: a size word
/// and 127 logging stubs (a profiler attaching through it would find them).
const CUPTI_SLOTS: [Slot; 128] = [
    Slot::Size,
    Slot::Stub(cupti_1 as *const c_void),
    Slot::Stub(cupti_2 as *const c_void),
    Slot::Stub(cupti_3 as *const c_void),
    Slot::Stub(cupti_4 as *const c_void),
    Slot::Stub(cupti_5 as *const c_void),
    Slot::Stub(cupti_6 as *const c_void),
    Slot::Stub(cupti_7 as *const c_void),
    Slot::Stub(cupti_8 as *const c_void),
    Slot::Stub(cupti_9 as *const c_void),
    Slot::Stub(cupti_10 as *const c_void),
    Slot::Stub(cupti_11 as *const c_void),
    Slot::Stub(cupti_12 as *const c_void),
    Slot::Stub(cupti_13 as *const c_void),
    Slot::Stub(cupti_14 as *const c_void),
    Slot::Stub(cupti_15 as *const c_void),
    Slot::Stub(cupti_16 as *const c_void),
    Slot::Stub(cupti_17 as *const c_void),
    Slot::Stub(cupti_18 as *const c_void),
    Slot::Stub(cupti_19 as *const c_void),
    Slot::Stub(cupti_20 as *const c_void),
    Slot::Stub(cupti_21 as *const c_void),
    Slot::Stub(cupti_22 as *const c_void),
    Slot::Stub(cupti_23 as *const c_void),
    Slot::Stub(cupti_24 as *const c_void),
    Slot::Stub(cupti_25 as *const c_void),
    Slot::Stub(cupti_26 as *const c_void),
    Slot::Stub(cupti_27 as *const c_void),
    Slot::Stub(cupti_28 as *const c_void),
    Slot::Stub(cupti_29 as *const c_void),
    Slot::Stub(cupti_30 as *const c_void),
    Slot::Stub(cupti_31 as *const c_void),
    Slot::Stub(cupti_32 as *const c_void),
    Slot::Stub(cupti_33 as *const c_void),
    Slot::Stub(cupti_34 as *const c_void),
    Slot::Stub(cupti_35 as *const c_void),
    Slot::Stub(cupti_36 as *const c_void),
    Slot::Stub(cupti_37 as *const c_void),
    Slot::Stub(cupti_38 as *const c_void),
    Slot::Stub(cupti_39 as *const c_void),
    Slot::Stub(cupti_40 as *const c_void),
    Slot::Stub(cupti_41 as *const c_void),
    Slot::Stub(cupti_42 as *const c_void),
    Slot::Stub(cupti_43 as *const c_void),
    Slot::Stub(cupti_44 as *const c_void),
    Slot::Stub(cupti_45 as *const c_void),
    Slot::Stub(cupti_46 as *const c_void),
    Slot::Stub(cupti_47 as *const c_void),
    Slot::Stub(cupti_48 as *const c_void),
    Slot::Stub(cupti_49 as *const c_void),
    Slot::Stub(cupti_50 as *const c_void),
    Slot::Stub(cupti_51 as *const c_void),
    Slot::Stub(cupti_52 as *const c_void),
    Slot::Stub(cupti_53 as *const c_void),
    Slot::Stub(cupti_54 as *const c_void),
    Slot::Stub(cupti_55 as *const c_void),
    Slot::Stub(cupti_56 as *const c_void),
    Slot::Stub(cupti_57 as *const c_void),
    Slot::Stub(cupti_58 as *const c_void),
    Slot::Stub(cupti_59 as *const c_void),
    Slot::Stub(cupti_60 as *const c_void),
    Slot::Stub(cupti_61 as *const c_void),
    Slot::Stub(cupti_62 as *const c_void),
    Slot::Stub(cupti_63 as *const c_void),
    Slot::Stub(cupti_64 as *const c_void),
    Slot::Stub(cupti_65 as *const c_void),
    Slot::Stub(cupti_66 as *const c_void),
    Slot::Stub(cupti_67 as *const c_void),
    Slot::Stub(cupti_68 as *const c_void),
    Slot::Stub(cupti_69 as *const c_void),
    Slot::Stub(cupti_70 as *const c_void),
    Slot::Stub(cupti_71 as *const c_void),
    Slot::Stub(cupti_72 as *const c_void),
    Slot::Stub(cupti_73 as *const c_void),
    Slot::Stub(cupti_74 as *const c_void),
    Slot::Stub(cupti_75 as *const c_void),
    Slot::Stub(cupti_76 as *const c_void),
    Slot::Stub(cupti_77 as *const c_void),
    Slot::Stub(cupti_78 as *const c_void),
    Slot::Stub(cupti_79 as *const c_void),
    Slot::Stub(cupti_80 as *const c_void),
    Slot::Stub(cupti_81 as *const c_void),
    Slot::Stub(cupti_82 as *const c_void),
    Slot::Stub(cupti_83 as *const c_void),
    Slot::Stub(cupti_84 as *const c_void),
    Slot::Stub(cupti_85 as *const c_void),
    Slot::Stub(cupti_86 as *const c_void),
    Slot::Stub(cupti_87 as *const c_void),
    Slot::Stub(cupti_88 as *const c_void),
    Slot::Stub(cupti_89 as *const c_void),
    Slot::Stub(cupti_90 as *const c_void),
    Slot::Stub(cupti_91 as *const c_void),
    Slot::Stub(cupti_92 as *const c_void),
    Slot::Stub(cupti_93 as *const c_void),
    Slot::Stub(cupti_94 as *const c_void),
    Slot::Stub(cupti_95 as *const c_void),
    Slot::Stub(cupti_96 as *const c_void),
    Slot::Stub(cupti_97 as *const c_void),
    Slot::Stub(cupti_98 as *const c_void),
    Slot::Stub(cupti_99 as *const c_void),
    Slot::Stub(cupti_100 as *const c_void),
    Slot::Stub(cupti_101 as *const c_void),
    Slot::Stub(cupti_102 as *const c_void),
    Slot::Stub(cupti_103 as *const c_void),
    Slot::Stub(cupti_104 as *const c_void),
    Slot::Stub(cupti_105 as *const c_void),
    Slot::Stub(cupti_106 as *const c_void),
    Slot::Stub(cupti_107 as *const c_void),
    Slot::Stub(cupti_108 as *const c_void),
    Slot::Stub(cupti_109 as *const c_void),
    Slot::Stub(cupti_110 as *const c_void),
    Slot::Stub(cupti_111 as *const c_void),
    Slot::Stub(cupti_112 as *const c_void),
    Slot::Stub(cupti_113 as *const c_void),
    Slot::Stub(cupti_114 as *const c_void),
    Slot::Stub(cupti_115 as *const c_void),
    Slot::Stub(cupti_116 as *const c_void),
    Slot::Stub(cupti_117 as *const c_void),
    Slot::Stub(cupti_118 as *const c_void),
    Slot::Stub(cupti_119 as *const c_void),
    Slot::Stub(cupti_120 as *const c_void),
    Slot::Stub(cupti_121 as *const c_void),
    Slot::Stub(cupti_122 as *const c_void),
    Slot::Stub(cupti_123 as *const c_void),
    Slot::Stub(cupti_124 as *const c_void),
    Slot::Stub(cupti_125 as *const c_void),
    Slot::Stub(cupti_126 as *const c_void),
    Slot::Stub(cupti_127 as *const c_void),
];
static CUPTI: Words<128> = Words::build(&CUPTI_SLOTS);

const fn hex(c: u8) -> u8 {
    match c {
        b'0'..=b'9' => c - b'0',
        b'a'..=b'f' => c - b'a' + 10,
        _ => panic!("uuid: lower-case hex only"),
    }
}

/// "6bd5fb6c-5bf4-e74a-8987-d93912fd9df9" as cudart passes it (the bytes in text order).
const fn uuid(s: &str) -> [u8; 16] {
    let b = s.as_bytes();
    let mut out = [0u8; 16];
    let (mut i, mut n) = (0, 0);
    while i < b.len() {
        if b[i] == b'-' {
            i += 1;
            continue;
        }
        out[n] = hex(b[i]) << 4 | hex(b[i + 1]);
        n += 1;
        i += 2;
    }
    out
}

/// Every table the fake answers.
pub static TABLES: [Table; 9] = [
    Table {
        name: "RUNTIME_13",
        uuid: uuid("f8cff951-2146-8b4e-b9e2-fb469e7c0dd9"),
        slots: &RT13_SLOTS,
        words: || RT13.addr(),
    },
    Table {
        name: "CUDART_INTERFACE",
        uuid: uuid("6bd5fb6c-5bf4-e74a-8987-d93912fd9df9"),
        slots: &CUDART_SLOTS,
        words: || CUDART.addr(),
    },
    Table {
        name: "TOOLS_RUNTIME_CALLBACK_HOOKS",
        uuid: uuid("a094798c-2e74-2e74-93f2-0800200c0a66"),
        slots: &HOOKS_SLOTS,
        words: || HOOKS.addr(),
    },
    Table {
        name: "TOOLS_TLS",
        uuid: uuid("42d85a81-23f6-cb47-8298-f6e78a3aecdc"),
        slots: &TLS_SLOTS,
        words: || TLS.addr(),
    },
    Table {
        name: "CONTEXT_LOCAL_STORAGE",
        uuid: uuid("c693336e-1121-df11-a8c3-68f355d89593"),
        slots: &CLS_SLOTS,
        words: || CLS.addr(),
    },
    Table {
        name: "CONTEXT_CHECKS",
        uuid: uuid("263e8860-7cd2-6143-92f6-bbd5006dfa7e"),
        slots: &CHECKS_SLOTS,
        words: || CHECKS.addr(),
    },
    Table {
        name: "INTEGRITY_CHECK",
        uuid: uuid("d4082055-bde6-704b-8d34-ba123c66e1f2"),
        slots: &INTEGRITY_SLOTS,
        words: || INTEGRITY.addr(),
    },
    Table {
        name: "CONTEXT_IDENTITY",
        uuid: uuid("21318c60-9714-3248-8ca6-41ff7324c8f2"),
        slots: &IDENTITY_SLOTS,
        words: || IDENTITY.addr(),
    },
    Table {
        name: "CUPTI",
        uuid: uuid("7cb63f9b-9ca4-8e42-a484-beb66e6aed7f"),
        slots: &CUPTI_SLOTS,
        words: || CUPTI.addr(),
    },
];

/// A UUID as text (`6bd5fb6c-5bf4-...`).
pub fn uuid_text(u: &[u8; 16]) -> String {
    let h: Vec<String> = u.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        h[..4].concat(),
        h[4..6].concat(),
        h[6..8].concat(),
        h[8..10].concat(),
        h[10..].concat()
    )
}

#[cfg_attr(not(test), allow(dead_code))]
/// The stub slots of every table, as `TABLE[n]` (STUBS.md lists them), and how many slots
/// hold functions.
pub fn stub_slots() -> (Vec<String>, usize) {
    let mut stubs = Vec::new();
    let mut functions = 0;
    for t in &TABLES {
        for (i, s) in t.slots.iter().enumerate() {
            match s {
                Slot::Stub(_) => {
                    stubs.push(format!("{}[{i}]", t.name));
                    functions += 1;
                }
                Slot::Fn(_) => functions += 1,
                _ => {}
            }
        }
    }
    (stubs, functions)
}

crate::abi::exports! {
    fn cuGetExportTable(table: *mut *const c_void, id: *const [u8; 16]) {
        if table.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        out(table, std::ptr::null())?;
        let id = inp(id)?;
        match TABLES.iter().find(|t| t.uuid == id) {
            Some(t) => {
                note(|| format!("{} {}", uuid_text(&id), t.name));
                out(table, (t.words)())
            }
            None => {
                note(|| format!("{}: unknown table", uuid_text(&id)));
                Err(CUDA_ERROR_INVALID_VALUE)
            }
        }
    }
}
