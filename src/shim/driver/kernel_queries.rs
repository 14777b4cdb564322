//! The driver's answers about modules, libraries and kernels that the hooks of first
//! uses, library loads and stacks grown at a launch need: a function's owner, a kernel's
//! local memory, the device's resident threads, the loading mode; and the unloads of a
//! module or library the shim refuses after the fact. Each a plain driver call; a driver
//! that lacks the function answers "unknown".

use std::ffi::c_int;
use std::ptr::null_mut;

use super::calls;
use super::hooked::real;
use super::types::{CUDA_ERROR_NOT_FOUND, CUDA_SUCCESS, CuResult, Handle};

/// The library a kernel handle comes from, else the module of a function handle (0:
/// the driver says neither).
pub fn function_owner(f: Handle) -> u64 {
    let ask = |call: Option<unsafe extern "C" fn(*mut Handle, Handle) -> u32>| {
        let call = call?;
        let mut owner: Handle = null_mut();
        // SAFETY: a valid out-pointer; the driver checks the handle (an error if it is
        // not of that kind).
        (unsafe { call(&mut owner, f) } == CUDA_SUCCESS && !owner.is_null()).then_some(owner as u64)
    };
    ask(calls::cuKernelGetLibrary())
        .or_else(|| ask(calls::cuFuncGetModule()))
        .unwrap_or(0)
}

/// The library of a kernel handle (None: `f` is not one, e.g. a function handle).
pub fn kernel_library(f: Handle) -> Option<u64> {
    let call = calls::cuKernelGetLibrary()?;
    let mut lib: Handle = null_mut();
    // SAFETY: a valid out-pointer; the driver checks the handle (an error for any
    // handle that is not a kernel's).
    (unsafe { call(&mut lib, f) } == CUDA_SUCCESS && !lib.is_null()).then_some(lib as u64)
}

/// The module of a library (None: the driver does not say).
pub fn library_module(lib: Handle) -> Option<u64> {
    let call = calls::cuLibraryGetModule()?;
    let mut module: Handle = null_mut();
    // SAFETY: a valid out-pointer; the library is the caller's.
    (unsafe { call(&mut module, lib) } == CUDA_SUCCESS && !module.is_null())
        .then_some(module as u64)
}

/// The local memory each thread of function `f` takes
/// (`CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES`), or of kernel handle `f` (`cuLibraryGetKernel`'s)
/// on device `kernel_on`; 0 where the driver does not say.
pub fn local_size(f: Handle, kernel_on: Option<c_int>) -> u64 {
    const LOCAL_SIZE_BYTES: c_int = 3;
    let mut bytes: c_int = 0;
    let rc = match kernel_on {
        // SAFETY: a valid out-pointer; the driver checks the handle and the device.
        Some(d) => calls::cuKernelGetAttribute()
            .map(|get| unsafe { get(&mut bytes, LOCAL_SIZE_BYTES, f, d) }),
        // SAFETY: as above.
        None => {
            calls::cuFuncGetAttribute().map(|get| unsafe { get(&mut bytes, LOCAL_SIZE_BYTES, f) })
        }
    };
    match rc {
        Some(CUDA_SUCCESS) => u64::try_from(bytes).unwrap_or(0),
        _ => 0,
    }
}

/// The threads device `d` holds resident at once (MULTIPROCESSOR_COUNT x
/// MAX_THREADS_PER_MULTIPROCESSOR): what each byte more of stack a thread is multiplied
/// by (an H100 took (16 KiB - 1 KiB) x 132 x 2,048 bytes for a 16 KiB stack).
pub fn resident_threads(d: c_int) -> Option<u64> {
    let get = calls::cuDeviceGetAttribute()?;
    let attribute = |a: c_int| {
        let mut v: c_int = 0;
        // SAFETY: a valid out-pointer; the driver checks the attribute and the device.
        (unsafe { get(&mut v, a, d) } == CUDA_SUCCESS)
            .then(|| u64::try_from(v).ok())
            .flatten()
    };
    Some(attribute(16)?.saturating_mul(attribute(39)?))
}

/// Whether the driver loads modules eagerly (`CUDA_MODULE_LOADING=EAGER`: a module's
/// kernels with it, a library into every context at its load and into later contexts at
/// their creation), so that a first use loads nothing. Asked once the driver answers;
/// lazy (measure first uses) where it cannot say.
pub fn eager_loading() -> bool {
    use std::sync::atomic::{AtomicU8, Ordering::Relaxed};
    /// 0: not asked yet; 1: eager; 2: lazy, or the driver cannot say.
    static MODE: AtomicU8 = AtomicU8::new(0);
    match MODE.load(Relaxed) {
        1 => true,
        2 => false,
        _ => {
            let Some(call) = calls::cuModuleGetLoadingMode() else {
                MODE.store(2, Relaxed);
                return false;
            };
            let mut mode: c_int = 0;
            // SAFETY: a valid out-pointer.
            if unsafe { call(&mut mode) } != CUDA_SUCCESS {
                return false; // before cuInit: asked again later
            }
            // CU_MODULE_EAGER_LOADING (1) or CU_MODULE_LAZY_LOADING (2).
            let eager = mode == 1;
            MODE.store(if eager { 1 } else { 2 }, Relaxed);
            eager
        }
    }
}

/// Unloads a library the shim refuses after the fact.
pub fn unload_library(lib: Handle) -> CuResult {
    // The library the driver just loaded.
    real::cuLibraryUnload(lib).unwrap_or(CUDA_ERROR_NOT_FOUND)
}

/// Unloads a module the shim refuses after the fact.
pub fn unload_module(module: Handle) {
    // The module the driver just loaded.
    let _ = real::cuModuleUnload(module);
}

/// `cuFuncLoad(f)`: function `f` loaded into its context if lazy loading has not yet
/// (CUDA 12.4). None: the driver has no such call.
pub fn load_function(f: Handle) -> Option<u32> {
    let load = calls::cuFuncLoad()?;
    // SAFETY: the program's function handle; the driver checks it.
    Some(unsafe { load(f) })
}

/// Whether function `f` is loaded (`cuFuncIsLoaded`, CUDA 12.4): false for a "partially
/// loaded" handle of `cuModuleEnumerateFunctions`, which the first call needing it loads.
/// None: the driver does not say (no such call: its functions are loaded when handed out).
pub fn is_loaded(f: Handle) -> Option<bool> {
    let ask = calls::cuFuncIsLoaded()?;
    let mut state: c_int = -1;
    // SAFETY: a valid out-pointer; the driver checks the handle.
    (unsafe { ask(&mut state, f) } == CUDA_SUCCESS).then_some(state != 0)
}
