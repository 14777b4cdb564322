//! The tables a tool (profiler, debugger) attaches through: TOOLS_TLS,
//! TOOLS_RUNTIME_CALLBACK_HOOKS and CUPTI's. No tool is attached to the fake.

use libc::c_void;

use super::{Slot, Words, slot};
use crate::abi::{CUDA_ERROR_NOT_SUPPORTED, CUresult, CuResult, call, fmt_args, out};
use crate::model::ctx::{self, Ctx};
use crate::model::device::cfg;

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
    tls_1 = "TOOLS_TLS[1]",
    tls_3 = "TOOLS_TLS[3]",
    hooks_3 = "TOOLS_RUNTIME_CALLBACK_HOOKS[3]",
}

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

pub(super) const TLS_SLOTS: [Slot; 4] = [
    Slot::Size,
    Slot::Stub(tls_1 as *const c_void),
    Slot::Fn(tls_current_context as *const c_void),
    Slot::Stub(tls_3 as *const c_void),
];
pub(super) static TLS: Words<4> = Words::build(&TLS_SLOTS);

// --- TOOLS_RUNTIME_CALLBACK_HOOKS (a094798c-2e74-2e74-93f2-0800200c0a66) -------------------

/// Zeroed buffers the runtime reads its tool callbacks from (no tool is attached): `N`
/// elements of `T`, and `N` is the size the slot reports.
struct HookBuffer<T, const N: usize>(std::cell::UnsafeCell<[T; N]>);
// SAFETY: the fake never reads or writes these; cudart owns their contents.
unsafe impl<T, const N: usize> Sync for HookBuffer<T, N> {}
/// cudart 13 counts this one in 8-byte words: it reads a word at byte 0x750 (PyTorch's
/// `cudaGetDriverEntryPointByVersion`), past the end of the 1024 bytes the fake once gave,
/// which crashed when the fake's .bss ended there. 1024 words, as ZLUDA gives.
static HOOKS_BUFFER_2: HookBuffer<u64, 1024> = HookBuffer(std::cell::UnsafeCell::new([0; 1024]));
static HOOKS_BUFFER_6: HookBuffer<u8, 14> = HookBuffer(std::cell::UnsafeCell::new([0; 14]));

fn hook_buffer<T, const N: usize>(
    b: &'static HookBuffer<T, N>,
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

/// [2]: a buffer of 1024 8-byte words and its size (1024).
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

pub(super) const HOOKS_SLOTS: [Slot; 7] = [
    Slot::Size,
    Slot::Fn(hooks_1 as *const c_void),
    Slot::Fn(hooks_buffer_2 as *const c_void),
    Slot::Stub(hooks_3 as *const c_void),
    Slot::Fn(hooks_4 as *const c_void),
    Slot::Fn(hooks_5 as *const c_void),
    Slot::Fn(hooks_buffer_6 as *const c_void),
];
pub(super) static HOOKS: Words<7> = Words::build(&HOOKS_SLOTS);

// --- CUPTI (7cb63f9b-9ca4-8e42-a484-beb66e6aed7f) -------------------------------------------

/// CUPTI (NVIDIA's profiling library; JAX's start-up version check calls `cuptiGetVersion`)
/// asks for this table and fails without it; none of its slots is called by
/// `cuptiGetVersion` or by the framework runs here. Its layout is not known: a size word
/// and 127 logging stubs (a profiler attaching through it would find them).
pub(super) const CUPTI_SLOTS: [Slot; 128] = [
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
pub(super) static CUPTI: Words<128> = Words::build(&CUPTI_SLOTS);

#[cfg(test)]
mod tests {
    use super::*;

    /// Slot [2] hands cudart a buffer it reads as `size` 8-byte words (cudart 13 reads the
    /// one at byte 0x750): all of them must be the fake's.
    #[test]
    fn the_hooks_buffer_holds_the_words_it_reports() {
        let (mut ptr, mut size) = (std::ptr::null_mut(), 0usize);
        // SAFETY: both out-pointers are live locals.
        let r = unsafe { hooks_buffer_2(&mut ptr, &mut size) };
        assert_eq!(r, 0);
        assert_eq!(ptr, HOOKS_BUFFER_2.0.get().cast());
        let bytes = std::mem::size_of_val(&HOOKS_BUFFER_2);
        assert!(
            size * 8 <= bytes,
            "{size} words reported, {bytes} bytes held"
        );
        assert!(0x750 + 8 <= bytes, "cudart reads the word at 0x750");
        assert_eq!(ptr as usize % 8, 0, "word-aligned");
    }
}
