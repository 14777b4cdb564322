//! The lookups of a library's variables, which under lazy loading load the library into the
//! current context where nothing of it was used there yet: `cuLibraryGetGlobal` (cudart's
//! `cudaGetSymbolAddress`, `cudaMemcpyToSymbol`), `cuLibraryGetManaged` (a `__managed__`
//! variable), and `cuModuleGetGlobal` on a library's module (`cuLibraryGetModule`, remembered
//! here). Each is measured once per library and context as a first use of the library
//! (`first_use`), charged with it (credited at its unload or the context's end); a module
//! loaded in a context holds its globals from its load (measured there), so its lookups
//! are forwarded.

use super::current::{current_context, current_device, known_device};
use super::first_use::{Use, first_use};
use crate::driver::forward::Real;
use crate::driver::types::{CText, CUDA_SUCCESS, CuResult, Handle, Out};
use crate::state::{LAUNCHED, LIBRARY_MODULES};
use gpucap_core::kernels::{self, launch_key};

/// `cuLibraryGetGlobal`: under lazy loading the library is loaded into the current
/// context for its global here, if no kernel of it was used there yet (the fake loads its
/// code and globals; cudart reaches a `__device__` variable so, `cudaGetSymbolAddress`,
/// `cudaMemcpyToSymbol`): measured once per library and context as a first use of the
/// library, charged with it (credited at its unload or the context's end), and its later
/// kernels' first launches find it loaded.
pub fn library_get_global(
    real: Real<(*mut u64, *mut usize, Handle, CText)>,
    dptr: *mut u64,
    bytes: *mut usize,
    library: Handle,
    name: CText,
) -> CuResult {
    let call = || real.call(dptr, bytes, library, name);
    library_used("cuLibraryGetGlobal", library, call)
}

/// `cuLibraryGetManaged`: a library's `__managed__` variable, registered when the library
/// is loaded into a context ("at least one", NVIDIA's documentation): measured as
/// [`library_get_global`] is (what the driver loads there, if anything, is charged).
pub fn library_get_managed(
    real: Real<(*mut u64, *mut usize, Handle, CText)>,
    dptr: *mut u64,
    bytes: *mut usize,
    library: Handle,
    name: CText,
) -> CuResult {
    let call = || real.call(dptr, bytes, library, name);
    library_used("cuLibraryGetManaged", library, call)
}

/// `cuLibraryGetModule`: the library's module, remembered, so that a global reached
/// through it is measured as the library's is.
pub fn library_get_module(
    real: Real<(Out<Handle>, Handle)>,
    module: Out<Handle>,
    library: Handle,
) -> CuResult {
    let rc = real.call(module, library);
    if rc == CUDA_SUCCESS
        && let Some(m) = module.get().filter(|m| !m.is_null())
    {
        LIBRARY_MODULES.insert(launch_key(m as u64, 0));
    }
    rc
}

/// `cuModuleGetGlobal_v2`: a module loaded in a context holds its globals from its load
/// (measured there); a library's module (`cuLibraryGetModule`) loads the library into the
/// current context for the global, as `cuLibraryGetGlobal` does: measured so (the module
/// its owner, credited at the library's unload).
pub fn module_get_global(
    real: Real<(*mut u64, *mut usize, Handle, CText)>,
    dptr: *mut u64,
    bytes: *mut usize,
    module: Handle,
    name: CText,
) -> CuResult {
    module_global(module, || real.call(dptr, bytes, module, name))
}

/// `cuModuleGetGlobal` (CUDA 2.0's, 32-bit pointer and size): as [`module_get_global`].
pub fn module_get_global_v1(
    real: Real<(*mut u32, *mut u32, Handle, CText)>,
    dptr: *mut u32,
    bytes: *mut u32,
    module: Handle,
    name: CText,
) -> CuResult {
    module_global(module, || real.call(dptr, bytes, module, name))
}

/// A global of `module` looked up by `call`: measured where the module is a library's.
fn module_global(module: Handle, call: impl FnMut() -> CuResult) -> CuResult {
    let mut call = call;
    if !LIBRARY_MODULES.contains(launch_key(module as u64, 0)) {
        return call();
    }
    library_used("cuModuleGetGlobal", module, call)
}

/// A call `api` that loads library (or library module) `owner` into the current context
/// where nothing of it was used there yet: measured once per owner and context as a first
/// use, charged with the owner (credited at the library's unload or the context's end).
fn library_used(api: &str, owner: Handle, call: impl FnMut() -> CuResult) -> CuResult {
    let mut call = call;
    let Some(d) = known_device().or_else(|| current_device().and_then(|d| usize::try_from(d).ok()))
    else {
        return call();
    };
    let Some(ctx) = current_context() else {
        return call();
    };
    let key = kernels::context_key(owner as u64, ctx as u64, d);
    if LAUNCHED.contains(key) {
        return call();
    }
    first_use(api, Use::of(key), d, call, || None, || owner as u64)
}
