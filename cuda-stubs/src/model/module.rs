//! Modules, libraries, functions and kernels. The fake executes no kernel: a module is the
//! list of names its image gives (crate::image), a function a handle naming one of them, and
//! a launch of a valid function handle is a no-op (api/module.rs). A module's globals are
//! real device memory: linear allocations of their size, made at the first
//! cuModuleGetGlobal of each (charged to the device, freed at unload or when the context
//! ends).
//!
//! A library (cuLibraryLoadData) is context-independent: it holds one module whose
//! functions are its kernels' functions in every context. As CUDA's lazy loading (the
//! default since CUDA 11.7) does, a library takes no device memory at its load (driver
//! 580: 0 bytes) and takes it in a context only when it is first used there (a kernel
//! launched or its function asked for, a global asked for): its globals (each context its
//! own) and FAKECUDA_LIBRARY_MEM bytes for its code (default 0; PyTorch's first kernel took
//! 92 MiB on an H200, docs/gpu-runs/2026-11-26-h100/torch-lazy-loading.txt), given back
//! when the context ends or the library is unloaded.
//!
//! Under eager loading (`CUDA_MODULE_LOADING=EAGER`, `Config::eager`) the same memory is
//! taken where the driver then takes it (its documentation of `cuLibraryLoadData`; the
//! H200 took 732 MiB more with PyTorch's context, the same file): a module's kernels at the
//! module's load ([`load_kernels`]), a library in every context of the process at its
//! load ([`library_into`]) and in a context made later at its creation
//! ([`libraries_into`]); a first use then loads nothing.

use super::HashMap;
use std::sync::{LazyLock, Mutex, MutexGuard};

use super::ctx::{Ctx, device_of};
use super::device::{cfg, ledger};
use super::linear::{self, Kind};
use super::os::new_handle;
use crate::abi::types::CUdeviceptr;
use crate::abi::{
    CUDA_ERROR_INVALID_HANDLE, CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_NOT_FOUND, CUresult, CuResult,
    note,
};
use crate::image::Names;
use libc::c_uint;

pub const CUDA_ERROR_INVALID_IMAGE: CUresult = 200;

#[derive(Debug)]
struct Module {
    /// The context it was loaded in (0: a library's module).
    ctx: Ctx,
    names: Names,
    /// name -> CUfunction handle (the same handle for the same name).
    functions: HashMap<String, usize>,
    /// name -> (device pointer, size) of the globals allocated so far.
    globals: HashMap<String, (CUdeviceptr, u64)>,
    /// What its kernels' code took on its context's device (FAKECUDA_FUNCTION_MEM for each
    /// function asked for: CUDA's lazy loading loads a module's kernel at its
    /// cuModuleGetFunction, NVIDIA's Lazy Loading guide), and that device.
    code: u64,
    code_dev: usize,
}

#[derive(Debug, Clone)]
pub struct Function {
    pub module: usize,
    pub name: String,
    /// Attributes set with cuFuncSetAttribute / cuKernelSetAttribute.
    pub attrs: HashMap<i32, i32>,
    /// The local memory each of its threads takes (its image's `.local` declarations):
    /// a launch grows the context's stack to it (`limit::grow_stack`).
    pub local: u64,
    /// Whether its code is loaded: a handle `cuModuleEnumerateFunctions` handed out is
    /// "partially loaded" under lazy loading, its code taken at the first call that needs
    /// it ([`load_function`]).
    pub loaded: bool,
}

#[derive(Debug, Clone)]
struct Kernel {
    library: usize,
    name: String,
    /// Its twin function handle (the library's module's `name`): a launch of the kernel
    /// finds it by handle, with no name to hash and compare.
    function: usize,
}

#[derive(Default)]
struct Registry {
    modules: HashMap<usize, Module>,
    functions: HashMap<usize, Function>,
    /// CUlibrary -> its module.
    libraries: HashMap<usize, usize>,
    kernels: HashMap<usize, Kernel>,
    /// (CUlibrary, context) -> what the library took there at its first use.
    resident: HashMap<(usize, Ctx), InContext>,
}

/// A library loaded into a context: its code's bytes (FAKECUDA_LIBRARY_MEM) on device
/// `dev`, and its globals there.
#[derive(Debug, Default)]
struct InContext {
    dev: usize,
    code: u64,
    globals: HashMap<String, (CUdeviceptr, u64)>,
}

static REGISTRY: LazyLock<Mutex<Registry>> = LazyLock::new(Default::default);

fn registry() -> MutexGuard<'static, Registry> {
    REGISTRY.lock().unwrap_or_else(|e| e.into_inner())
}

/// Loads a module with these names in `ctx`; returns the CUmodule.
pub fn load(ctx: Ctx, names: Names) -> usize {
    let m = new_handle();
    note(|| {
        format!(
            "module={m:#x}, {} functions{}, {} globals",
            names.functions.len(),
            if names.open { " (and any name)" } else { "" },
            names.globals.len()
        )
    });
    registry().modules.insert(
        m,
        Module {
            ctx,
            names,
            functions: HashMap::default(),
            globals: HashMap::default(),
            code: 0,
            code_dev: 0,
        },
    );
    m
}

/// Unloads a module: its functions become invalid, its globals are freed.
pub fn unload(module: usize) -> CuResult {
    let m = {
        let mut reg = registry();
        let m = reg
            .modules
            .remove(&module)
            .ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        reg.functions.retain(|_, f| f.module != module);
        m
    };
    for (ptr, _) in m.globals.values() {
        // Already gone if its context ended.
        let _ = linear::free(*ptr);
    }
    release_code(&m);
    Ok(())
}

/// Gives back what a module's kernels' code took.
fn release_code(m: &Module) {
    if m.code > 0
        && let Ok(l) = ledger()
    {
        l.uncharge(m.code_dev, m.code);
    }
}

/// The function `name` of `module` (the same handle each time), loaded: CUDA's lazy
/// loading loads a module's kernel at its `cuModuleGetFunction` (see [`load_function`]).
/// NOT_FOUND when the image does not name it (unless part of the image could not be read).
pub fn function(module: usize, name: &str) -> Result<usize, CUresult> {
    let f = handle(module, name)?;
    load_function(f)?;
    Ok(f)
}

/// The function `name` of `module` as `cuModuleEnumerateFunctions` hands it out: the same
/// handle, "partially loaded" (NVIDIA's documentation of that call) where it was not
/// loaded yet: its code is taken by the first call that needs it ([`load_function`]).
pub fn enumerated(module: usize, name: &str) -> Result<usize, CUresult> {
    handle(module, name)
}

/// The handle of function `name` of `module`, made (not loaded) the first time.
fn handle(module: usize, name: &str) -> Result<usize, CUresult> {
    let mut reg = registry();
    let m = reg
        .modules
        .get_mut(&module)
        .ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    if let Some(&f) = m.functions.get(name) {
        return Ok(f);
    }
    if !m.names.open && !m.names.functions.iter().any(|n| n == name) {
        return Err(CUDA_ERROR_NOT_FOUND);
    }
    let local = m.names.local.get(name).copied().unwrap_or(0);
    let f = new_handle();
    m.functions.insert(name.to_string(), f);
    reg.functions.insert(
        f,
        Function {
            module,
            name: name.to_string(),
            attrs: HashMap::default(),
            local,
            loaded: false,
        },
    );
    Ok(f)
}

/// Loads function `f` where it is not loaded yet: a kernel of a module loaded in a context
/// takes FAKECUDA_FUNCTION_MEM there (a library's, at its first use in each context:
/// `library_in_context`). Called by `cuModuleGetFunction`, `cuFuncLoad`, the attribute
/// calls and every use in a context (a launch, a graph's kernel node): "CUDA APIs may load
/// the function automatically when called with partially loaded function handle". Any
/// other handle (a kernel's twin function of a library, loaded per context): nothing.
pub fn load_function(f: usize) -> CuResult {
    let code = cfg()?.function_mem;
    let mut reg = registry();
    let reg = &mut *reg;
    let Some(func) = reg.functions.get_mut(&f) else {
        return Ok(());
    };
    if func.loaded {
        return Ok(());
    }
    let m = reg
        .modules
        .get_mut(&func.module)
        .ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    if m.ctx != 0 && code > 0 {
        let dev = device_of(m.ctx)?;
        ledger()?.charge(dev, code)?;
        m.code += code;
        m.code_dev = dev;
    }
    func.loaded = true;
    Ok(())
}

/// Whether function `f`'s code is loaded (`cuFuncIsLoaded`); a handle of no module's
/// function (a kernel's twin, loaded per context): true.
pub fn is_loaded(f: usize) -> bool {
    registry().functions.get(&f).is_none_or(|f| f.loaded)
}

/// The names of the functions `module` is known to hold.
pub fn function_names(module: usize) -> Result<Vec<String>, CUresult> {
    let reg = registry();
    let m = reg.modules.get(&module).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    Ok(m.names.functions.clone())
}

/// The global `name` of `module`: (device pointer, size), allocated on first use in `ctx`
/// (on `dev`) and zero-filled. NOT_FOUND when the image does not name it.
pub fn global(
    module: usize,
    name: &str,
    ctx: Ctx,
    dev: usize,
) -> Result<(CUdeviceptr, u64), CUresult> {
    let size = {
        let reg = registry();
        let m = reg.modules.get(&module).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        if let Some(&g) = m.globals.get(name) {
            return Ok(g);
        }
        // A library's module (cuLibraryGetModule): its globals are the library's in the
        // context, loaded there with its code at this first use, as cuLibraryGetGlobal does.
        if m.ctx == 0
            && let Some((&lib, _)) = reg.libraries.iter().find(|&(_, &lm)| lm == module)
        {
            drop(reg);
            return library_global(lib, name, ctx, dev);
        }
        *m.names.globals.get(name).ok_or(CUDA_ERROR_NOT_FOUND)?
    };
    let ctx = if ctx == 0 {
        registry().modules[&module].ctx
    } else {
        ctx
    };
    let ptr = linear::alloc(dev, ctx, size.max(1), Kind::Device)?;
    let mut reg = registry();
    match reg.modules.get_mut(&module) {
        Some(m) => {
            let g = *m.globals.entry(name.to_string()).or_insert((ptr, size));
            if g.0 != ptr {
                drop(reg);
                let _ = linear::free(ptr);
            }
            Ok(g)
        }
        None => {
            drop(reg);
            let _ = linear::free(ptr);
            Err(CUDA_ERROR_INVALID_HANDLE)
        }
    }
}

/// Allocates every global a module's image names (at its load).
pub fn allocate_globals(module: usize, ctx: Ctx, dev: usize) -> CuResult {
    let names: Vec<String> = registry()
        .modules
        .get(&module)
        .map(|m| m.names.globals.keys().cloned().collect())
        .unwrap_or_default();
    for name in names {
        global(module, &name, ctx, dev)?;
    }
    Ok(())
}

/// Under eager loading (`Config::eager`): every kernel the module's image names is loaded
/// with the module, each taking FAKECUDA_FUNCTION_MEM, as the driver loads them then.
pub fn load_kernels(module: usize) -> CuResult {
    function_names(module)?
        .iter()
        .try_for_each(|name| function(module, name).map(drop))
}

/// Under eager loading: library `lib` is loaded into each of `contexts` (context,
/// device) at its load, as the driver loads it into every context of the process then.
pub fn library_into(lib: usize, contexts: &[(Ctx, usize)]) -> CuResult {
    contexts
        .iter()
        .try_for_each(|&(ctx, dev)| library_in_context(lib, ctx, dev))
}

/// Under eager loading: every library loaded so far is loaded into context `ctx` of
/// `dev` at its creation.
pub fn libraries_into(ctx: Ctx, dev: usize) -> CuResult {
    let libraries: Vec<usize> = registry().libraries.keys().copied().collect();
    libraries
        .into_iter()
        .try_for_each(|lib| library_in_context(lib, ctx, dev))
}

/// The function behind a CUfunction handle.
pub fn get_function(f: usize) -> Option<Function> {
    registry().functions.get(&f).cloned()
}

/// Sets an attribute of a function.
pub fn set_attribute(f: usize, attr: i32, value: i32) -> CuResult {
    let mut reg = registry();
    let func = reg.functions.get_mut(&f).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    func.attrs.insert(attr, value);
    Ok(())
}

/// A launch's grid and block as the device takes them (an H100's limits): no dimension 0,
/// at most 1024 threads a block, 64 in z, grids of at most 65535 in y and z.
pub fn check_dims(grid: [c_uint; 3], block: [c_uint; 3]) -> CuResult {
    let threads = block.iter().map(|&b| b as u64).product::<u64>();
    if grid.contains(&0)
        || block.contains(&0)
        || threads > 1024
        || block[2] > 64
        || grid[1] > 65535
        || grid[2] > 65535
    {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    Ok(())
}

/// A CUfunction or a CUkernel (CUDA 12 lets a kernel be launched as a function): the function.
pub fn launchable(f: usize) -> Result<usize, CUresult> {
    if registry().functions.contains_key(&f) {
        return Ok(f);
    }
    kernel_function(f)
}

/// Loads a library (its module has no context).
pub fn load_library(names: Names) -> usize {
    let module = load(0, names);
    let lib = new_handle();
    registry().libraries.insert(lib, module);
    lib
}

/// Unloads a library, its module and its kernels.
pub fn unload_library(lib: usize) -> CuResult {
    let (module, loaded) = {
        let mut reg = registry();
        let module = reg
            .libraries
            .remove(&lib)
            .ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        reg.kernels.retain(|_, k| k.library != lib);
        (module, release_resident(&mut reg, |l, _| l == lib))
    };
    loaded.into_iter().for_each(release);
    unload(module)
}

/// The module of a library.
pub fn library_module(lib: usize) -> Result<usize, CUresult> {
    registry()
        .libraries
        .get(&lib)
        .copied()
        .ok_or(CUDA_ERROR_INVALID_HANDLE)
}

/// The kernel `name` of a library (a CUkernel handle, the same one each time).
pub fn kernel(lib: usize, name: &str) -> Result<usize, CUresult> {
    let module = library_module(lib)?;
    let f = function(module, name)?;
    // The kernel handle is the function handle's twin: one per (library, name).
    let mut reg = registry();
    if let Some((&k, _)) = reg
        .kernels
        .iter()
        .find(|(_, k)| k.library == lib && k.name == name)
    {
        return Ok(k);
    }
    let k = new_handle();
    reg.kernels.insert(
        k,
        Kernel {
            library: lib,
            name: name.to_string(),
            function: f,
        },
    );
    Ok(k)
}

/// The library and name of a kernel.
pub fn kernel_info(k: usize) -> Result<(usize, String), CUresult> {
    registry()
        .kernels
        .get(&k)
        .map(|k| (k.library, k.name.clone()))
        .ok_or(CUDA_ERROR_INVALID_HANDLE)
}

/// The function of a kernel (valid in every context).
pub fn kernel_function(k: usize) -> Result<usize, CUresult> {
    registry()
        .kernels
        .get(&k)
        .map(|k| k.function)
        .ok_or(CUDA_ERROR_INVALID_HANDLE)
}

/// Function `f` (launchable) is used in context `ctx` of device `dev`: if it is a
/// library's, that library is loaded there (see [`library_in_context`]). Returns the
/// local memory each of its threads takes (`Function::local`).
pub fn use_in_context(f: usize, ctx: Ctx, dev: usize) -> Result<u64, CUresult> {
    let (lib, local, loaded) = {
        let reg = registry();
        let Some((module, local, loaded)) =
            reg.functions.get(&f).map(|f| (f.module, f.local, f.loaded))
        else {
            return Ok(0);
        };
        let lib = reg
            .libraries
            .iter()
            .find(|&(_, &m)| m == module)
            .map(|(&l, _)| l);
        (lib, local, loaded)
    };
    if !loaded {
        load_function(f)?; // a partially loaded function's first use
    }
    if let Some(lib) = lib {
        library_in_context(lib, ctx, dev)?;
    }
    Ok(local) // a module's function: loaded with its module
}

/// Loads library `lib` into context `ctx` of device `dev` if it is not there yet: its
/// code takes FAKECUDA_LIBRARY_MEM bytes, and each of its globals is allocated for
/// `ctx` (CUDA_ERROR_OUT_OF_MEMORY, nothing kept, when the device has not got it).
pub fn library_in_context(lib: usize, ctx: Ctx, dev: usize) -> CuResult {
    let code = cfg()?.library_mem;
    let wanted: Vec<(String, u64)> = {
        let reg = registry();
        if reg.resident.contains_key(&(lib, ctx)) {
            return Ok(());
        }
        let module = *reg.libraries.get(&lib).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        reg.modules[&module]
            .names
            .globals
            .iter()
            .map(|(n, &s)| (n.clone(), s))
            .collect()
    };
    let l = ledger()?;
    if code > 0 {
        l.charge(dev, code)?;
    }
    let mut here = InContext {
        dev,
        code,
        globals: HashMap::default(),
    };
    for (name, size) in wanted {
        match linear::alloc(dev, ctx, size.max(1), Kind::Device) {
            Ok(ptr) => {
                here.globals.insert(name, (ptr, size));
            }
            Err(e) => {
                release(here);
                return Err(e);
            }
        }
    }
    let mut reg = registry();
    if reg.resident.contains_key(&(lib, ctx)) || !reg.libraries.contains_key(&lib) {
        drop(reg);
        release(here); // another thread loaded it first, or it was unloaded meanwhile
        return Ok(());
    }
    reg.resident.insert((lib, ctx), here);
    Ok(())
}

/// Whether `name` is a `__managed__` variable of library `lib` (its image's PTX
/// `.attribute(.managed)`).
pub fn library_managed(lib: usize, name: &str) -> Result<bool, CUresult> {
    let reg = registry();
    let module = reg.libraries.get(&lib).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    Ok(reg
        .modules
        .get(module)
        .is_some_and(|m| m.names.managed.contains(name)))
}

/// The global `name` of library `lib` in context `ctx` (the library loaded there first).
pub fn library_global(
    lib: usize,
    name: &str,
    ctx: Ctx,
    dev: usize,
) -> Result<(CUdeviceptr, u64), CUresult> {
    library_in_context(lib, ctx, dev)?;
    registry()
        .resident
        .get(&(lib, ctx))
        .and_then(|r| r.globals.get(name).copied())
        .ok_or(CUDA_ERROR_NOT_FOUND)
}

/// Gives back what a library took in a context (its globals: already gone if the
/// context ended).
fn release(here: InContext) {
    for (ptr, _) in here.globals.values() {
        let _ = linear::free(*ptr);
    }
    if here.code > 0
        && let Ok(l) = ledger()
    {
        l.uncharge(here.dev, here.code);
    }
}

/// Gives back what libraries took in the contexts `gone` names (library, context).
fn release_resident(reg: &mut Registry, gone: impl Fn(usize, Ctx) -> bool) -> Vec<InContext> {
    let keys: Vec<(usize, Ctx)> = reg
        .resident
        .keys()
        .filter(|&&(l, c)| gone(l, c))
        .copied()
        .collect();
    keys.iter().filter_map(|k| reg.resident.remove(k)).collect()
}

/// The context ended: the modules loaded in it go (their globals went with its allocations).
pub fn end_context(ctx: Ctx) {
    let mut reg = registry();
    let libraries = release_resident(&mut reg, |_, c| c == ctx);
    let gone: Vec<usize> = reg
        .modules
        .iter()
        .filter(|(_, m)| m.ctx == ctx && ctx != 0)
        .map(|(&h, _)| h)
        .collect();
    let modules: Vec<Module> = gone.iter().filter_map(|h| reg.modules.remove(h)).collect();
    reg.functions.retain(|_, f| !gone.contains(&f.module));
    // A library's module (context 0) stays; globals it allocated in this context are gone.
    for m in reg.modules.values_mut() {
        m.globals
            .retain(|_, (ptr, _)| linear::lookup(*ptr as usize).is_some_and(|(_, a)| a.ctx != ctx));
    }
    drop(reg);
    // Their globals went with the context's allocations; their code is given back.
    libraries.into_iter().for_each(release);
    modules.iter().for_each(release_code);
}
