//! Modules, libraries, functions, kernels and the JIT linker (launches and occupancy:
//! `launch.rs`).
//!
//! The fake executes no kernel. Images load (cubin, PTX, fat binaries, fat binary
//! wrappers) and give the names they hold (crate::image); a launch of a valid function or
//! kernel handle with a valid configuration succeeds and does nothing: results of
//! computations are not meaningful, memory behaviour is. The linker gathers the names of
//! what is added and completes into a small cubin naming them.

use crate::model::HashMap;
use std::ffi::CString;
use std::sync::{LazyLock, Mutex};

use crate::abi::{
    CUDA_ERROR_INVALID_HANDLE, CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_NOT_FOUND, CUresult, CuResult,
    cstr, note, out,
};
use crate::image::{self, Kind, Names};
use crate::model::ctx::current;
use crate::model::device::{cfg, check_dev};
use crate::model::module::{self, CUDA_ERROR_INVALID_IMAGE};
use libc::{c_char, c_int, c_uint, c_void};

/// Copies `len` bytes at `p`.
///
/// # Safety
/// `p..p+len` must be readable (the caller's image).
unsafe fn bytes_at(p: *const u8, len: usize) -> Vec<u8> {
    // SAFETY: the caller guarantees the range is readable.
    unsafe { std::slice::from_raw_parts(p, len) }.to_vec()
}

/// The names of the image at `p` (cubin, PTX text, fat binary or its wrapper).
fn read_image(p: *const c_void) -> Result<Names, CUresult> {
    if p.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let p = p.cast::<u8>();
    // The first bytes up to a NUL (at most 16): the 4-byte magic of every binary image
    // here has no NUL, and PTX is NUL-terminated text.
    // SAFETY: the caller's image; read as a C string it is readable up to its first NUL.
    let prefix: Vec<u8> = unsafe { std::ffi::CStr::from_ptr(p.cast()) }
        .to_bytes()
        .iter()
        .take(16)
        .copied()
        .collect();
    let head = match image::kind(&prefix) {
        // SAFETY: a binary image holds at least its 16-byte header.
        Some(Kind::Elf | Kind::Fatbin | Kind::FatbinWrapper) => unsafe { bytes_at(p, 16) },
        _ => prefix,
    };
    match image::kind(&head) {
        Some(Kind::Ptx) => {
            // SAFETY: NUL-terminated PTX text.
            let text = unsafe { std::ffi::CStr::from_ptr(p.cast()) }.to_string_lossy();
            // PTX begins with its `.version` directive: other text is not an image (the
            // real driver answers CUDA_ERROR_INVALID_IMAGE for "not an image").
            if !image::has_ptx_version(&text) {
                return Err(CUDA_ERROR_INVALID_IMAGE);
            }
            Ok(image::ptx_names(&text))
        }
        Some(Kind::Elf) => {
            // SAFETY: an ELF image holds its 64-byte header.
            let hdr = unsafe { bytes_at(p, 64) };
            // SAFETY: the section header table lies inside the image.
            let len = image::elf_len(&hdr, |o, l| unsafe { bytes_at(p.add(o), l) })
                .ok_or(CUDA_ERROR_INVALID_IMAGE)?;
            // SAFETY: the image spans `len` bytes (its sections and section headers).
            let elf = unsafe { bytes_at(p, len) };
            image::elf_names(&elf).ok_or(CUDA_ERROR_INVALID_IMAGE)
        }
        Some(Kind::Fatbin) => {
            let len = image::fatbin_len(&head).ok_or(CUDA_ERROR_INVALID_IMAGE)?;
            // SAFETY: the fat binary spans its header plus the size the header gives.
            let fb = unsafe { bytes_at(p, len) };
            image::fatbin_names(&fb).ok_or(CUDA_ERROR_INVALID_IMAGE)
        }
        Some(Kind::FatbinWrapper) => {
            let data = usize::from_le_bytes(head[8..16].try_into().unwrap());
            let names = read_image(data as *const c_void)?;
            Ok(names)
        }
        None => Err(CUDA_ERROR_INVALID_IMAGE),
    }
}

/// Loads the image at `image` as a module of the current context. Its globals are device
/// memory from the load on, as on the real driver (whose free memory drops at a module's
/// load, not at a global's first lookup); a load they do not fit fails.
pub fn load_module(pmod: *mut usize, image: *const c_void) -> CuResult {
    let (ctx, dev) = current()?;
    if pmod.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let names = read_image(image)?;
    let m = module::load(ctx, names);
    let loaded = module::allocate_globals(m, ctx, dev).and_then(|()| {
        // Eager loading loads its kernels now too (lazy: at their first use).
        if cfg()?.eager {
            module::load_kernels(m)
        } else {
            Ok(())
        }
    });
    if let Err(e) = loaded {
        let _ = module::unload(m);
        return Err(e);
    }
    held()?;
    out(pmod, m)
}

/// Module and library loads held open (FAKECUDA_LOAD_HALFWAY, FAKECUDA_LOAD_UNTIL).
static LOADS_HELD: super::hold::Held = super::hold::Held::new();

/// A load's memory is taken: held open where the test asks.
fn held() -> CuResult {
    let c = cfg()?;
    LOADS_HELD.middle(c.load_halfway.as_deref(), c.load_until.as_deref());
    Ok(())
}

/// Loads a library (`names`, its image's) and hands it out at `library`; under eager
/// loading it is loaded into every active context of the process now (a load they do not
/// fit fails, nothing kept), lazily into each at its first use there otherwise.
fn load_library(library: *mut usize, names: crate::image::Names) -> CuResult {
    let lib = module::load_library(names);
    if cfg()?.eager
        && let Err(e) = module::library_into(lib, &crate::model::ctx::active())
    {
        let _ = module::unload_library(lib);
        return Err(e);
    }
    held()?;
    note(|| format!("library={lib:#x}"));
    out(library, lib)
}

fn read_file(fname: *const c_char) -> Result<Vec<u8>, CUresult> {
    let path = cstr(fname).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let mut data = std::fs::read(path).map_err(|_| CUDA_ERROR_FILE_NOT_FOUND)?;
    data.push(0);
    Ok(data)
}

const CUDA_ERROR_FILE_NOT_FOUND: CUresult = 301;

fn global_out(dptr: *mut u64, bytes: *mut usize, module: usize, name: *const c_char) -> CuResult {
    let (ctx, dev) = current()?;
    let name = cstr(name).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    global_answer(dptr, bytes, module::global(module, name, ctx, dev)?)
}

/// Writes a global's address and size where the caller asked for them.
fn global_answer(dptr: *mut u64, bytes: *mut usize, (ptr, size): (u64, u64)) -> CuResult {
    note(|| format!("ptr={ptr:#x}, size={size}"));
    if !dptr.is_null() {
        out(dptr, ptr)?;
    }
    if !bytes.is_null() {
        out(bytes, size as usize)?;
    }
    Ok(())
}

/// Names handed out by cuFuncGetName / cuKernelGetName: kept for the life of the process.
static NAMES: LazyLock<Mutex<HashMap<String, &'static CString>>> = LazyLock::new(Default::default);

fn name_out(pname: *mut *const c_char, name: &str) -> CuResult {
    let mut names = NAMES.lock().unwrap_or_else(|e| e.into_inner());
    let c = *names.entry(name.to_string()).or_insert_with(|| {
        Box::leak(Box::new(
            CString::new(name.replace('\0', "")).unwrap_or_default(),
        ))
    });
    out(pname, c.as_ptr())
}

/// cuFuncGetAttribute of a function the fake knows nothing about but its name: an sm_90
/// kernel that needs no shared or local memory, as many registers as a simple kernel.
fn func_attribute(f: &module::Function, attr: c_int) -> Result<c_int, CUresult> {
    if let Some(&v) = f.attrs.get(&attr) {
        return Ok(v);
    }
    Ok(match attr {
        0 => 1024,                                           // MAX_THREADS_PER_BLOCK
        1 | 2 => 0,                                          // SHARED_SIZE_BYTES, CONST_SIZE_BYTES
        3 => c_int::try_from(f.local).unwrap_or(c_int::MAX), // LOCAL_SIZE_BYTES
        4 => 32,                                             // NUM_REGS
        5 | 6 => 90,                                         // PTX_VERSION, BINARY_VERSION
        7 => 0,                                              // CACHE_MODE_CA
        8 => 0,       // MAX_DYNAMIC_SHARED_SIZE_BYTES (until set)
        9 => -1,      // PREFERRED_SHARED_MEMORY_CARVEOUT
        10..=15 => 0, // cluster attributes
        16 => 0,      // CLUSTER_SCHEDULING_POLICY_PREFERENCE
        _ => return Err(CUDA_ERROR_INVALID_VALUE),
    })
}

/// Linker states: the names gathered so far, and the image handed out at completion.
#[derive(Default)]
struct Link {
    names: Names,
    image: Vec<u8>,
}

static LINKS: LazyLock<Mutex<HashMap<usize, Link>>> = LazyLock::new(Default::default);

/// CUmoduleLoadingMode as the driver answers it: CU_MODULE_LAZY_LOADING (2), CUDA's
/// default since 12.2, unless `CUDA_MODULE_LOADING=EAGER` (CU_MODULE_EAGER_LOADING, 1;
/// `Config::eager`), and the fake loads as it answers (`model::module`). CUDA's runtime
/// asks it: told eager, cudart 12.9 asks for every function of every module it
/// registers when it loads them (49,086 under TensorFlow), which it does not left lazy.
pub(crate) fn loading_mode(eager: bool) -> c_int {
    if eager { 1 } else { 2 }
}

fn links() -> std::sync::MutexGuard<'static, HashMap<usize, Link>> {
    LINKS.lock().unwrap_or_else(|e| e.into_inner())
}

fn link_add(state: usize, names: Names) -> CuResult {
    let mut l = links();
    let link = l.get_mut(&state).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    for f in names.functions {
        if !link.names.functions.contains(&f) {
            link.names.functions.push(f);
        }
    }
    link.names.globals.extend(names.globals);
    link.names.open |= names.open;
    Ok(())
}

/// The names of `size` bytes at `data` (an image, or PTX text of that length).
fn names_of_data(data: *const c_void, size: usize) -> Result<Names, CUresult> {
    if data.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: the caller passes `size` readable bytes.
    let mut bytes = unsafe { bytes_at(data.cast(), size) };
    bytes.push(0);
    read_image(bytes.as_ptr().cast())
}

/// Under FAKECUDA_KERNEL_ATTRIBUTE_LOADS: a kernel's attribute asked or set on device
/// `dev` while a context of `dev` is current loads the kernel into that context, as
/// `cuKernelGetFunction` does (what a real driver does there is not recorded yet).
fn attribute_loads(kernel: usize, dev: usize) -> CuResult {
    if !cfg()?.kernel_attribute_loads {
        return Ok(());
    }
    match current() {
        Ok((ctx, d)) if d == dev => {
            module::use_in_context(module::kernel_function(kernel)?, ctx, dev).map(|_| ())
        }
        _ => Ok(()),
    }
}

crate::abi::exports! {
    fn cuModuleLoadData(pmod: *mut usize, image: *const c_void) {
        load_module(pmod, image)
    }

    fn cuModuleLoadDataEx(pmod: *mut usize, image: *const c_void, num_options: c_uint, options: *mut c_int, values: *mut *mut c_void) {
        let _ = (num_options, options, values);
        load_module(pmod, image)
    }

    fn cuModuleLoadFatBinary(pmod: *mut usize, fat_cubin: *const c_void) {
        load_module(pmod, fat_cubin)
    }

    fn cuModuleLoad(pmod: *mut usize, fname: *const c_char) {
        let data = read_file(fname)?;
        load_module(pmod, data.as_ptr().cast())
    }

    fn cuModuleUnload(hmod: usize) {
        cfg()?;
        module::unload(hmod)
    }

    fn cuModuleGetFunction(hfunc: *mut usize, hmod: usize, name: *const c_char) {
        cfg()?;
        let name = cstr(name).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        if hfunc.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let f = module::function(hmod, name)?;
        note(|| format!("func={f:#x}"));
        out(hfunc, f)
    }

    fn cuModuleGetGlobal_v2(dptr: *mut u64, bytes: *mut usize, hmod: usize, name: *const c_char) {
        global_out(dptr, bytes, hmod, name)
    }

    fn cuModuleGetFunctionCount(count: *mut c_uint, hmod: usize) {
        cfg()?;
        out(count, module::function_names(hmod)?.len() as c_uint)
    }

    fn cuModuleEnumerateFunctions(functions: *mut usize, num: c_uint, hmod: usize) {
        cfg()?;
        let names = module::function_names(hmod)?;
        if functions.is_null() || (num as usize) < names.len() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        for (i, n) in names.iter().enumerate() {
            // SAFETY: the caller's array holds `num` >= names.len() handles.
            out(unsafe { functions.add(i) }, module::enumerated(hmod, n)?)?;
        }
        Ok(())
    }

    // As the driver answers: lazy unless CUDA_MODULE_LOADING=EAGER (see `loading_mode`).
    fn cuModuleGetLoadingMode(mode: *mut c_int) {
        out(mode, loading_mode(cfg()?.eager))
    }

    fn cuLibraryLoadData(library: *mut usize, code: *const c_void, jit_options: *mut c_int, jit_values: *mut *mut c_void, num_jit: c_uint, lib_options: *mut c_int, lib_values: *mut *mut c_void, num_lib: c_uint) {
        cfg()?;
        let _ = (jit_options, jit_values, num_jit, lib_options, lib_values, num_lib);
        if library.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        load_library(library, read_image(code)?)
    }

    fn cuLibraryLoadFromFile(library: *mut usize, fname: *const c_char, jit_options: *mut c_int, jit_values: *mut *mut c_void, num_jit: c_uint, lib_options: *mut c_int, lib_values: *mut *mut c_void, num_lib: c_uint) {
        cfg()?;
        let _ = (jit_options, jit_values, num_jit, lib_options, lib_values, num_lib);
        if library.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let data = read_file(fname)?;
        load_library(library, read_image(data.as_ptr().cast())?)
    }

    fn cuLibraryUnload(library: usize) {
        cfg()?;
        module::unload_library(library)
    }

    fn cuLibraryGetKernel(kernel: *mut usize, library: usize, name: *const c_char) {
        cfg()?;
        let name = cstr(name).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        if kernel.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        out(kernel, module::kernel(library, name)?)
    }

    fn cuLibraryGetModule(pmod: *mut usize, library: usize) {
        cfg()?;
        out(pmod, module::library_module(library)?)
    }

    fn cuLibraryGetGlobal(dptr: *mut u64, bytes: *mut usize, library: usize, name: *const c_char) {
        // The library is loaded into the current context for it (each context its own).
        let (ctx, dev) = current()?;
        let name = cstr(name).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        note(|| name.to_string());
        global_answer(dptr, bytes, module::library_global(library, name, ctx, dev)?)
    }

    // A `__managed__` variable of the library (one of its globals marked managed): the
    // library is loaded into the current context for it, as for cuLibraryGetGlobal (the
    // fake keeps the variable with the library's copy in that context: a real driver's
    // managed memory is one for every device). Another name: CUDA_ERROR_NOT_FOUND.
    fn cuLibraryGetManaged(dptr: *mut u64, bytes: *mut usize, library: usize, name: *const c_char) {
        let (ctx, dev) = current()?;
        let name = cstr(name).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        note(|| name.to_string());
        if !module::library_managed(library, name)? {
            return Err(CUDA_ERROR_NOT_FOUND);
        }
        global_answer(dptr, bytes, module::library_global(library, name, ctx, dev)?)
    }

    fn cuLibraryGetKernelCount(count: *mut c_uint, library: usize) {
        cfg()?;
        out(count, module::function_names(module::library_module(library)?)?.len() as c_uint)
    }

    fn cuLibraryEnumerateKernels(kernels: *mut usize, num: c_uint, library: usize) {
        cfg()?;
        let names = module::function_names(module::library_module(library)?)?;
        if kernels.is_null() || (num as usize) < names.len() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        for (i, n) in names.iter().enumerate() {
            // SAFETY: the caller's array holds `num` >= names.len() handles.
            out(unsafe { kernels.add(i) }, module::kernel(library, n)?)?;
        }
        Ok(())
    }

    fn cuKernelGetFunction(pfunc: *mut usize, kernel: usize) {
        let (ctx, dev) = current()?;
        let f = module::kernel_function(kernel)?;
        module::use_in_context(f, ctx, dev)?;
        note(|| format!("function={f:#x}"));
        out(pfunc, f)
    }

    fn cuKernelGetLibrary(plib: *mut usize, kernel: usize) {
        cfg()?;
        out(plib, module::kernel_info(kernel)?.0)
    }

    fn cuKernelGetName(pname: *mut *const c_char, kernel: usize) {
        cfg()?;
        name_out(pname, &module::kernel_info(kernel)?.1)
    }

    fn cuKernelGetAttribute(pi: *mut c_int, attrib: c_int, kernel: usize, dev: c_int) {
        let dev = check_dev(dev)?;
        attribute_loads(kernel, dev)?;
        let f = module::get_function(module::kernel_function(kernel)?).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        out(pi, func_attribute(&f, attrib)?)
    }

    fn cuKernelSetAttribute(attrib: c_int, val: c_int, kernel: usize, dev: c_int) {
        let dev = check_dev(dev)?;
        attribute_loads(kernel, dev)?;
        let f = module::kernel_function(kernel)?;
        module::set_attribute(f, attrib, val)
    }

    fn cuKernelSetCacheConfig(kernel: usize, config: c_int, dev: c_int) {
        check_dev(dev)?;
        let _ = config;
        module::kernel_function(kernel).map(|_| ())
    }

    fn cuFuncGetAttribute(pi: *mut c_int, attrib: c_int, hfunc: usize) {
        cfg()?;
        let h = module::launchable(hfunc)?;
        module::load_function(h)?;
        let f = module::get_function(h).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        out(pi, func_attribute(&f, attrib)?)
    }

    fn cuFuncSetAttribute(hfunc: usize, attrib: c_int, value: c_int) {
        cfg()?;
        let f = module::launchable(hfunc)?;
        module::load_function(f)?;
        module::set_attribute(f, attrib, value)
    }

    fn cuFuncSetCacheConfig(hfunc: usize, config: c_int) {
        cfg()?;
        let _ = config;
        module::launchable(hfunc).map(|_| ())
    }

    fn cuFuncSetSharedMemConfig(hfunc: usize, config: c_int) {
        cfg()?;
        let _ = config;
        module::launchable(hfunc).map(|_| ())
    }

    fn cuFuncGetModule(pmod: *mut usize, hfunc: usize) {
        cfg()?;
        let f = module::get_function(module::launchable(hfunc)?).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        out(pmod, f.module)
    }

    fn cuFuncGetName(pname: *mut *const c_char, hfunc: usize) {
        cfg()?;
        let f = module::get_function(module::launchable(hfunc)?).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        name_out(pname, &f.name)
    }

    // CU_FUNCTION_LOADING_STATE_LOADED (1), or UNLOADED (0): a handle
    // cuModuleEnumerateFunctions gave, partially loaded until a call loads it.
    fn cuFuncIsLoaded(state: *mut c_int, hfunc: usize) {
        cfg()?;
        out(state, c_int::from(module::is_loaded(module::launchable(hfunc)?)))
    }

    // Loads a partially loaded function (its code taken now); a loaded one: nothing.
    fn cuFuncLoad(hfunc: usize) {
        cfg()?;
        module::load_function(module::launchable(hfunc)?)
    }

    fn cuLinkCreate | cuLinkCreate_v2 (num_options: c_uint, options: *mut c_int, values: *mut *mut c_void, state: *mut usize) {
        cfg()?;
        let _ = (num_options, options, values);
        if state.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let h = crate::model::os::new_handle();
        links().insert(h, Link::default());
        out(state, h)
    }

    fn cuLinkAddData | cuLinkAddData_v2 (state: usize, ty: c_int, data: *const c_void, size: usize, name: *const c_char, num_options: c_uint, options: *mut c_int, values: *mut *mut c_void) {
        let _ = (ty, name, num_options, options, values);
        link_add(state, names_of_data(data, size)?)
    }

    fn cuLinkAddFile | cuLinkAddFile_v2 (state: usize, ty: c_int, path: *const c_char, num_options: c_uint, options: *mut c_int, values: *mut *mut c_void) {
        let _ = (ty, num_options, options, values);
        let data = read_file(path)?;
        link_add(state, read_image(data.as_ptr().cast())?)
    }

    fn cuLinkComplete(state: usize, cubin: *mut *const c_void, size: *mut usize) {
        let mut l = links();
        let link = l.get_mut(&state).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        let functions: Vec<&str> = link.names.functions.iter().map(String::as_str).collect();
        let globals: Vec<(&str, u64)> = link.names.globals.iter().map(|(n, s)| (n.as_str(), *s)).collect();
        link.image = image::build_elf(&functions, &globals);
        out(cubin, link.image.as_ptr().cast())?;
        out(size, link.image.len())
    }

    fn cuLinkDestroy(state: usize) {
        links().remove(&state).map(|_| ()).ok_or(CUDA_ERROR_INVALID_HANDLE)
    }
}
