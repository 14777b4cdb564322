//! Kernel launches and the calls that load kernels (see `gpucap_core::kernels`): the first
//! launch of each function on each device is measured as a first use (`first_use`), after
//! the stack its kernel needs is grown; later launches of it there pay one lookup in the map
//! of functions seen (the deprecated `cuLaunch`, `cuLaunchGrid` and `cuLaunchGridAsync`
//! alike). `cuKernelGetFunction` loads a library's kernel into the current
//! context too, `cuModuleGetFunction` a module's (lazy loading loads a module's kernels
//! there; a library's variables: `globals`), and a graph's kernel nodes are
//! loaded before the driver takes them (`load_for_graph`): each measured the same way (the
//! calls that load a partially loaded function: `functions`). Unloads credit what those
//! loads took.

use std::ffi::{c_int, c_void};

use super::current::{current_context, current_device, known_device};
use super::first_use::{Seen, Use, first_use, load_if_partial, seen, takes_nothing_at_launch};
use crate::driver::forward::Real;
use crate::driver::types::{
    CText, CUDA_SUCCESS, CuResult, Handle, In, LaunchConfigHead, Out, Stream,
};
use crate::driver::{graph_queries, kernel_queries};
use crate::state::{ESTIMATES, KERNEL_HANDLES, KERNELS, LAUNCHED};
use gpucap_core::kernels::{self, launch_key};

type Params = *mut *mut c_void;
/// `cuLaunchKernel`'s arguments: the function, the grid and block sizes, the shared
/// memory, the stream, the kernel's parameters and the extra options.
type LaunchArgs = (
    Handle,
    u32,
    u32,
    u32,
    u32,
    u32,
    u32,
    u32,
    Stream,
    Params,
    Params,
);
/// `cuLaunchCooperativeKernel`'s: as [`LaunchArgs`] without the extra options.
type CooperativeArgs = (Handle, u32, u32, u32, u32, u32, u32, u32, Stream, Params);

#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub fn launch_kernel(
    real: Real<LaunchArgs>,
    f: Handle,
    gx: u32,
    gy: u32,
    gz: u32,
    bx: u32,
    by: u32,
    bz: u32,
    shared: u32,
    stream: Stream,
    params: Params,
    extra: Params,
) -> CuResult {
    let call = || real.call(f, gx, gy, gz, bx, by, bz, shared, stream, params, extra);
    launched("cuLaunchKernel", f, stream, call)
}

#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub fn launch_cooperative_kernel(
    real: Real<CooperativeArgs>,
    f: Handle,
    gx: u32,
    gy: u32,
    gz: u32,
    bx: u32,
    by: u32,
    bz: u32,
    shared: u32,
    stream: Stream,
    params: Params,
) -> CuResult {
    let call = || real.call(f, gx, gy, gz, bx, by, bz, shared, stream, params);
    launched("cuLaunchCooperativeKernel", f, stream, call)
}

#[inline(always)]
pub fn launch_kernel_ex(
    real: Real<(In<LaunchConfigHead>, Handle, Params, Params)>,
    config: In<LaunchConfigHead>,
    f: Handle,
    params: Params,
    extra: Params,
) -> CuResult {
    let call = || real.call(config, f, params, extra);
    let stream = config.get().map_or(std::ptr::null_mut(), |c| c.stream);
    launched("cuLaunchKernelEx", f, stream, call)
}

/// `cuLaunch` (deprecated: a 1 x 1 grid of the block `cuFuncSetBlockShape` set): a launch
/// as `cuLaunchKernel`'s, measured at its first use in the context alike.
#[inline(always)]
pub fn launch(real: Real<(Handle,)>, f: Handle) -> CuResult {
    launched("cuLaunch", f, std::ptr::null_mut(), || real.call(f))
}

/// `cuLaunchGrid` (deprecated, the default stream): as [`launch`].
#[inline(always)]
pub fn launch_grid(real: Real<(Handle, c_int, c_int)>, f: Handle, w: c_int, h: c_int) -> CuResult {
    launched("cuLaunchGrid", f, std::ptr::null_mut(), || {
        real.call(f, w, h)
    })
}

/// `cuLaunchGridAsync` (deprecated, on `stream`): as [`launch`].
#[inline(always)]
pub fn launch_grid_async(
    real: Real<(Handle, c_int, c_int, Stream)>,
    f: Handle,
    w: c_int,
    h: c_int,
    stream: Stream,
) -> CuResult {
    launched("cuLaunchGridAsync", f, stream, || {
        real.call(f, w, h, stream)
    })
}

/// `cuKernelGetFunction`: the kernel is loaded into the current context here, if not
/// yet; measured once per kernel and context, as a first launch, and the function it
/// gives (that context's) is then seen.
pub fn kernel_get_function(
    real: Real<(Out<Handle>, Handle)>,
    out: Out<Handle>,
    kernel: Handle,
) -> CuResult {
    let call = || real.call(out, kernel);
    let Some(d) = known_device().or_else(|| current_device().and_then(|d| usize::try_from(d).ok()))
    else {
        return call();
    };
    let Some(ctx) = current_context() else {
        return call();
    };
    let key = kernels::context_key(kernel as u64, ctx as u64, d);
    if LAUNCHED.contains(key) {
        return call();
    }
    kernel_loaded(key, d, out, kernel, call)
}

/// `cuKernelGetFunction`'s first use of `kernel` in the current context (under `key`, on
/// device `d`), measured; seen (a later launch of the kernel handle not measured) only
/// where that launch takes nothing: a kernel past the stack grows it at its first launch,
/// measured there. Out of line: the call's later uses pay one lookup, no more.
#[cold]
#[inline(never)]
fn kernel_loaded(
    key: u64,
    d: usize,
    out: Out<Handle>,
    kernel: Handle,
    call: impl FnMut() -> CuResult,
) -> CuResult {
    // The driver wrote the function handle where the caller asked.
    let function = || out.get();
    let owner = || kernel_queries::function_owner(kernel);
    let used = Use {
        key,
        seen: Seen::IfItsLaunchTakesNothing,
    };
    first_use("cuKernelGetFunction", used, d, call, function, owner)
}

/// Kernel handle `kernel` loaded into the current context (device `d`) by gpucap's own
/// `cuKernelGetFunction` (out of a capture's way, as its measurements are), measured as its
/// first use there under `key`, and seen where its launch takes nothing more: ahead of a
/// graph that takes it or a launch gpucap cannot measure itself, so that no question gpucap
/// asks about it (its threads' local memory, `cuKernelGetAttribute`) is the call that loads
/// it, unmeasured.
/// `CUDA_ERROR_OUT_OF_MEMORY`: refused before anything was loaded.
fn load_kernel(api: &str, kernel: Handle, key: u64, d: usize) -> CuResult {
    let got = std::cell::Cell::new(std::ptr::null_mut());
    let load = || {
        graph_queries::relaxed(|| {
            let mut f: Handle = std::ptr::null_mut();
            let rc = crate::driver::hooked::real::cuKernelGetFunction(Out::from(&mut f), kernel);
            got.set(f);
            rc.unwrap_or(CUDA_SUCCESS)
        })
    };
    let function = || Some(got.get()).filter(|f| !f.is_null());
    let used = Use {
        key,
        seen: Seen::IfItsLaunchTakesNothing,
    };
    first_use(api, used, d, load, function, || {
        kernel_queries::function_owner(kernel)
    })
}

/// A kernel node of a graph (`func`, a function, or `kernel`, a kernel handle, to run in
/// `ctx`: null for the current context), before the driver takes it into a graph
/// (`cuGraphAddKernelNode`, `cuGraphExecKernelNodeSetParams`, `cuGraphInstantiate*`): if
/// it was never used in the current context, it is loaded there now, measured as a first
/// use (a kernel handle by `cuKernelGetFunction`, a function by `cuFuncLoad` where the
/// driver says it is partially loaded), so that what lazy loading loads for the graph is charged wherever the
/// driver would load it (at the node's making, the instantiation or the graph's first
/// run). Err: refused (`CUDA_ERROR_OUT_OF_MEMORY`) before anything was loaded. A node
/// of another context than the current one is left to the driver.
pub(super) fn load_for_graph(
    api: &str,
    func: Handle,
    kernel: Handle,
    ctx: Handle,
) -> Result<(), CuResult> {
    let Some(d) = known_device().or_else(|| current_device().and_then(|d| usize::try_from(d).ok()))
    else {
        return Ok(());
    };
    let Some(current) = current_context() else {
        return Ok(());
    };
    if !ctx.is_null() && ctx != current {
        return Ok(());
    }
    let rc = if func.is_null() && !kernel.is_null() {
        let key = kernels::context_key(kernel as u64, current as u64, d);
        if LAUNCHED.contains(key) {
            return Ok(());
        }
        load_kernel(api, kernel, key, d)
    } else if !func.is_null() {
        let key = launch_key(func as u64, d);
        if LAUNCHED.contains(key) {
            return Ok(());
        }
        // Its attributes asked only once it is loaded: a CUDA call with a partially loaded
        // function may load it (`cuModuleEnumerateFunctions`' documentation), unmeasured.
        let rc = load_if_partial(api, func, d);
        if rc == CUDA_SUCCESS && takes_nothing_at_launch(func) {
            seen(key);
        }
        rc
    } else {
        return Ok(());
    };
    match rc {
        crate::driver::types::CUDA_ERROR_OUT_OF_MEMORY => Err(rc),
        _ => Ok(()), // loaded, or the driver's own error, which its call will give
    }
}

/// A launch (or a lookup that loads) of function or kernel `f`, made by `call`: measured
/// as its first use in the current context if it is one, else forwarded. A function
/// handle belongs to one context (one key per device is one per context, and a launch
/// after the first costs one lookup); a kernel handle (`cuLibraryGetKernel`) is used in
/// every context, and each context loads it anew: its key names the context too.
#[inline(always)]
fn launched(api: &str, f: Handle, stream: Stream, mut call: impl FnMut() -> CuResult) -> CuResult {
    match device_if_first_launch(f) {
        None => call(),
        Some(d) => launch_unseen(api, f, d, stream, call),
    }
}

/// The device of the current context if a launch of `f` there may be its first as a
/// function (None: `f` was launched there, or there is no context: the driver answers).
#[inline(always)]
fn device_if_first_launch(f: Handle) -> Option<usize> {
    let d = match known_device() {
        Some(d) => d,
        None => usize::try_from(current_device()?).ok()?,
    };
    (!LAUNCHED.contains(launch_key(f as u64, d))).then_some(d)
}

/// A launch of `f`, not seen as a function on device `d`: a kernel handle is looked up
/// by its key in the thread's current context (the one its context hooks last saw,
/// `current.rs`: no driver call, every launch of a kernel handle comes here); a
/// function's first use is measured.
#[inline(always)]
fn launch_unseen(
    api: &str,
    f: Handle,
    d: usize,
    stream: Stream,
    mut call: impl FnMut() -> CuResult,
) -> CuResult {
    let Some((key, kernel_on)) = key_in_context(f, d) else {
        return call();
    };
    // A function's key was looked up already (`device_if_first_launch`).
    if kernel_on.is_some() && LAUNCHED.contains(key) {
        return call();
    }
    first_launch(api, f, key, d, kernel_on, stream, call)
}

/// `f`'s key among the uses seen on device `d`, and for a kernel handle the device its
/// attributes are asked on: a function's key names the function and device (a function
/// belongs to one context); a kernel handle's the current context too (one handle for
/// every context, each loading it anew). None: a kernel handle with no context current
/// (the driver answers).
#[inline(always)]
fn key_in_context(f: Handle, d: usize) -> Option<(u64, Option<c_int>)> {
    if !is_kernel(f) {
        return Some((launch_key(f as u64, d), None));
    }
    let ctx = current_context()?;
    let key = kernels::context_key(f as u64, ctx as u64, d);
    Some((key, c_int::try_from(d).ok()))
}

/// The first launch of function or kernel handle `f` (`kernel_on`: the device a kernel
/// handle's attributes are asked on) under `key`, measured as a first use, with gpucap's
/// question about its threads' local memory inside the measurement: whether a driver loads
/// a kernel handle's library at that question (`cuKernelGetAttribute`) or at the launch,
/// what it loads is charged. A kernel within the stack is launched in the same
/// measurement ([`asked_and_launched`]); one that needs a larger stack has it grown first
/// (`limits::stack_for_launch`: charged, or the launch refused before the driver grows it),
/// then its launch measured. A partially loaded function is loaded first, measured, before
/// its question. On a capturing stream nothing runs, so a stack it needs is not grown (a
/// graph's is raised at its instantiation): what lazy loading loads at the capture is
/// measured all the same, and `f` stays unseen for its first launch outside a capture,
/// which grows the stack.
#[cold]
#[inline(never)]
fn first_launch(
    api: &str,
    f: Handle,
    key: u64,
    d: usize,
    kernel_on: Option<c_int>,
    stream: Stream,
    mut call: impl FnMut() -> CuResult,
) -> CuResult {
    let local = match kernel_on {
        Some(on) => match asked_and_launched(api, f, key, d, on, &mut call) {
            Asked::Done(rc) => return rc,
            Asked::NeedsStack(local) => local,
        },
        None => {
            let loaded = load_if_partial(api, f, d);
            if loaded == crate::driver::types::CUDA_ERROR_OUT_OF_MEMORY {
                return loaded;
            }
            kernel_queries::local_size(f, None)
        }
    };
    let capturing = || graph_queries::capturing(stream);
    let grown = match super::limits::stack_for_launch(api, d, local, capturing) {
        Err(rc) => return rc,
        Ok(grown) => grown,
    };
    let function = move || kernel_on.is_none().then_some(f);
    let used = Use {
        key,
        seen: if grown { Seen::Yes } else { Seen::No },
    };
    first_use(api, used, d, call, function, || {
        kernel_queries::function_owner(f)
    })
}

/// What [`asked_and_launched`] did.
enum Asked {
    /// The launch was made (or refused): its result.
    Done(CuResult),
    /// The kernel's threads take this much local memory, more than the stack: not launched.
    NeedsStack(u64),
}

/// Kernel handle `f`'s first use in the current context (device `d`, `key`), measured as
/// one: its local memory asked on device `on` and, where it fits the stack, `call` (the
/// launch) made, both inside the measurement, so that whichever of them loads the library
/// is charged (also where the launch then fails: what was loaded stays); seen once launched.
/// One measurement, as a launch's was before the question moved into it.
fn asked_and_launched(
    api: &str,
    f: Handle,
    key: u64,
    d: usize,
    on: c_int,
    call: &mut impl FnMut() -> CuResult,
) -> Asked {
    let needs = std::cell::Cell::new(None);
    let launched = std::cell::Cell::new(None);
    let window = || {
        let local = kernel_queries::local_size(f, Some(on));
        if super::limits::fits_the_stack(local) {
            launched.set(Some(call()));
        } else {
            needs.set(Some(local)); // the stack grows first; the launch is measured after
        }
        CUDA_SUCCESS
    };
    let used = Use {
        key,
        seen: Seen::No,
    };
    let rc = first_use(
        api,
        used,
        d,
        window,
        || None,
        || kernel_queries::function_owner(f),
    );
    match (rc, needs.get(), launched.get()) {
        (CUDA_SUCCESS, Some(local), _) => Asked::NeedsStack(local),
        (CUDA_SUCCESS, None, Some(launch)) => {
            if launch == CUDA_SUCCESS {
                seen(key);
            }
            Asked::Done(launch)
        }
        (rc, _, _) => Asked::Done(rc), // refused before anything was asked or loaded
    }
}

/// Function or kernel handle `f` loaded in the current context (device `d`) for a launch
/// gpucap cannot measure itself (`cuLaunchCooperativeKernelMultiDevice`: one call on
/// several devices), as a first launch is before its launch: loaded where it is not (a
/// kernel handle in this context, a partially loaded function), measured, and its
/// threads' local memory asked after. Ok(None): launched here before (seen); Ok(Some):
/// its key and local memory, for the caller to grow the stack (`limits::stack_growth`,
/// `grow_stack`) and see it. Err: refused before anything loaded.
pub(super) fn loaded_for_launch(
    api: &str,
    f: Handle,
    d: usize,
) -> Result<Option<(u64, u64)>, CuResult> {
    let Some((key, kernel_on)) = key_in_context(f, d) else {
        return Ok(None); // no context: the driver answers
    };
    if LAUNCHED.contains(key) {
        return Ok(None);
    }
    let loaded = match kernel_on {
        Some(_) => load_kernel(api, f, key, d),
        None => load_if_partial(api, f, d),
    };
    if loaded == crate::driver::types::CUDA_ERROR_OUT_OF_MEMORY {
        return Err(loaded);
    }
    Ok(Some((key, kernel_queries::local_size(f, kernel_on))))
}

/// Whether `f` is a kernel handle (the driver names its library), remembered once seen.
#[inline]
fn is_kernel(f: Handle) -> bool {
    let key = launch_key(f as u64, 0);
    if KERNEL_HANDLES.contains(key) {
        return true;
    }
    let kernel = kernel_queries::kernel_library(f).is_some();
    if kernel {
        KERNEL_HANDLES.insert(key);
    }
    kernel
}

/// `cuModuleGetFunction`: CUDA's lazy loading loads a module's kernel here, not at
/// the module's load (NVIDIA's Lazy Loading guide); measured once per (module, name)
/// and device, as a first launch.
pub fn module_get_function(
    real: Real<(Out<Handle>, Handle, CText)>,
    out: Out<Handle>,
    module: Handle,
    name: CText,
) -> CuResult {
    let call = || real.call(out, module, name);
    let Some(d) = known_device().or_else(|| current_device().and_then(|d| usize::try_from(d).ok()))
    else {
        return call();
    };
    let Some(text) = name.bytes() else {
        return call(); // no name: the driver's own error
    };
    let key = kernels::name_key(module as u64, text, d);
    if LAUNCHED.contains(key) {
        return call();
    }
    // The driver wrote the function handle where the caller asked.
    let function = || out.get();
    first_use(
        "cuModuleGetFunction",
        Use::of(key),
        d,
        call,
        function,
        || module as u64,
    )
}

/// `cuLibraryUnload`: the kernels of the library its functions' first launches loaded go
/// with it, in every context (see [`unloading`]).
pub fn library_unload(real: Real<(Handle,)>, lib: Handle) -> CuResult {
    let owners = [Some(lib as u64), kernel_queries::library_module(lib)];
    unloading(&owners, || real.call(lib))
}

/// Runs `call`, the unload of the library or module `owners` name: what their functions'
/// first launches loaded is announced to the pool first (a free) and credited once the
/// driver unloaded them; kept if it refused. The functions seen are forgotten (the
/// driver may hand their handles to new functions), to be measured again.
pub(super) fn unloading(owners: &[Option<u64>], call: impl FnOnce() -> CuResult) -> CuResult {
    let taken = KERNELS.take_keys(|&(_, _, owner)| owner != 0 && owners.contains(&Some(owner)));
    let rc = super::residents::given_back(&KERNELS, taken, call);
    if rc == CUDA_SUCCESS {
        owners.iter().flatten().for_each(|&o| ESTIMATES.forget(o));
        LAUNCHED.clear();
        KERNEL_HANDLES.clear();
    }
    rc
}
