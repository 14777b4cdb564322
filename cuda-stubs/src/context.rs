//! Contexts: primary contexts per device and created ones, current per thread (a stack).
//!
//! Usage counts: a created context starts at 1; cuCtxAttach adds one to the current context,
//! cuCtxDetach takes one and destroys the context at zero (as cuCtxDestroy, which destroys
//! whatever the count). A primary context's usage count is its retain count: attach and
//! detach on it act as cuDevicePrimaryCtxRetain / cuDevicePrimaryCtxRelease (detach to zero
//! also pops it from the calling thread's stack, as a destroy does).

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::Mutex;

use once_cell::sync::Lazy;

use crate::abi::*;
use crate::device::{cfg, check_dev};
use libc::{c_char, c_int, c_uint, c_void};

/// CUcontext is the address of a leaked 8-byte box: unique and never reused.
pub type Ctx = usize;

#[derive(Debug, Clone, Copy)]
struct CtxInfo {
    dev: usize,
    flags: u32,
    primary: bool,
    /// Usage count of a created context (cuCtxCreate: 1, cuCtxAttach +1, cuCtxDetach -1);
    /// a primary context counts in `Primary::refcount` instead.
    usage: u32,
}

#[derive(Debug, Default, Clone, Copy)]
struct Primary {
    ctx: Ctx,
    refcount: u32,
    flags: u32,
}

#[derive(Default)]
struct Registry {
    live: HashMap<Ctx, CtxInfo>,
    primary: Vec<Primary>,
}

static REGISTRY: Lazy<Mutex<Registry>> = Lazy::new(Default::default);
static LIMITS: Lazy<Mutex<HashMap<c_int, usize>>> = Lazy::new(Default::default);

thread_local! {
    static STACK: RefCell<Vec<Ctx>> = const { RefCell::new(Vec::new()) };
    /// The last context `current()` validated on this thread, its device and the
    /// generation it was valid in: the common case (the same context, nothing
    /// destroyed since) then costs no lock. A real driver's current-context lookup
    /// is a thread-local read too; the benchmark of the shim calls it per allocation.
    static LAST: std::cell::Cell<(Ctx, usize, u64)> = const { std::cell::Cell::new((0, 0, u64::MAX)) };
}

/// Bumped whenever a context stops being valid (destroyed, primary released to zero
/// or reset), which voids every thread's `LAST`.
static GENERATION: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

fn invalidate_current_caches() {
    GENERATION.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
}

fn new_handle() -> Ctx {
    Box::into_raw(Box::new(0u64)) as Ctx
}

fn registry() -> std::sync::MutexGuard<'static, Registry> {
    REGISTRY.lock().unwrap_or_else(|e| e.into_inner())
}

/// The primary context handle of `dev` (created on first use, stable for the process).
fn primary_of(reg: &mut Registry, dev: usize) -> Ctx {
    if reg.primary.len() <= dev {
        reg.primary.resize(dev + 1, Primary::default());
    }
    if reg.primary[dev].ctx == 0 {
        let ctx = new_handle();
        reg.primary[dev].ctx = ctx;
        reg.live.insert(
            ctx,
            CtxInfo {
                dev,
                flags: 0,
                primary: true,
                usage: 0,
            },
        );
    }
    reg.primary[dev].ctx
}

/// The calling thread's current context and its device; CUDA_ERROR_INVALID_CONTEXT if none.
pub fn current() -> Result<(Ctx, usize), CUresult> {
    cfg()?;
    let top = STACK
        .with(|s| s.borrow().last().copied())
        .ok_or(CUDA_ERROR_INVALID_CONTEXT)?;
    let generation = GENERATION.load(std::sync::atomic::Ordering::Acquire);
    let (ctx, dev, valid_in) = LAST.with(|l| l.get());
    if ctx == top && valid_in == generation {
        return Ok((top, dev));
    }
    let reg = registry();
    let info = reg.live.get(&top).ok_or(CUDA_ERROR_INVALID_CONTEXT)?;
    if info.primary && reg.primary[info.dev].refcount == 0 {
        return Err(CUDA_ERROR_INVALID_CONTEXT);
    }
    LAST.with(|l| l.set((top, info.dev, generation)));
    Ok((top, info.dev))
}

/// The device of a context handle (NULL means the current one).
pub fn device_of(ctx: Ctx) -> Result<usize, CUresult> {
    if ctx == 0 {
        return current().map(|c| c.1);
    }
    registry()
        .live
        .get(&ctx)
        .map(|i| i.dev)
        .ok_or(CUDA_ERROR_INVALID_CONTEXT)
}

fn set_top(ctx: Ctx) {
    STACK.with(|s| {
        let mut s = s.borrow_mut();
        match (s.last_mut(), ctx) {
            (Some(_), 0) => {
                s.pop();
            }
            (Some(top), c) => *top = c,
            (None, 0) => {}
            (None, c) => s.push(c),
        }
    });
}

fn check_live(ctx: Ctx) -> CuResult {
    if registry().live.contains_key(&ctx) {
        Ok(())
    } else {
        Err(CUDA_ERROR_INVALID_CONTEXT)
    }
}

/// Gives back the FAKECUDA_CONTEXT_MEM of a context of `dev` that went away.
fn release_context_mem(dev: usize) {
    if let (Ok(l), Ok(c)) = (crate::memory::ledger(), cfg()) {
        l.release_context(dev, c.context_mem);
    }
}

/// Takes one reference off the primary context of `dev` (cuDevicePrimaryCtxRelease, or
/// cuCtxDetach on it); at zero it is deactivated: its allocations are freed and its context
/// memory given back. CUDA_ERROR_INVALID_CONTEXT if it is not active.
fn release_primary(mut reg: std::sync::MutexGuard<'static, Registry>, dev: usize) -> CuResult {
    let ctx = primary_of(&mut reg, dev);
    let p = &mut reg.primary[dev];
    if p.refcount == 0 {
        return Err(CUDA_ERROR_INVALID_CONTEXT);
    }
    p.refcount -= 1;
    if p.refcount == 0 {
        invalidate_current_caches();
        drop(reg);
        crate::memory::free_all_of_context(ctx);
        release_context_mem(dev);
    }
    Ok(())
}

/// Destroys the created context `ctx` (cuCtxDestroy, or cuCtxDetach to zero): it is popped
/// from the calling thread's stack, its allocations and arrays are freed, its context memory
/// given back. CUDA_ERROR_INVALID_CONTEXT for a primary or unknown context.
fn destroy(mut reg: std::sync::MutexGuard<'static, Registry>, ctx: Ctx) -> CuResult {
    let dev = match reg.live.get(&ctx) {
        Some(info) if !info.primary => info.dev,
        _ => return Err(CUDA_ERROR_INVALID_CONTEXT),
    };
    reg.live.remove(&ctx);
    invalidate_current_caches();
    drop(reg);
    STACK.with(|s| s.borrow_mut().retain(|&c| c != ctx));
    crate::memory::free_all_of_context(ctx);
    release_context_mem(dev);
    Ok(())
}

fn create(pctx: *mut Ctx, flags: c_uint, dev: c_int) -> CuResult {
    let dev = check_dev(dev)?;
    if pctx.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    crate::memory::ledger()?.charge_context(dev, cfg()?.context_mem)?;
    let ctx = new_handle();
    registry().live.insert(
        ctx,
        CtxInfo {
            dev,
            flags,
            primary: false,
            usage: 1,
        },
    );
    STACK.with(|s| s.borrow_mut().push(ctx));
    note(|| format!("ctx={ctx:#x}"));
    out(pctx, ctx)
}

crate::abi::exports! {
    fn cuDevicePrimaryCtxRetain(pctx: *mut Ctx, dev: c_int) {
        let dev = check_dev(dev)?;
        if pctx.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let mut reg = registry();
        let ctx = primary_of(&mut reg, dev);
        if reg.primary[dev].refcount == 0 {
            // Activating the primary context takes its memory.
            crate::memory::ledger()?.charge_context(dev, cfg()?.context_mem)?;
        }
        reg.primary[dev].refcount += 1;
        note(|| format!("ctx={ctx:#x}"));
        out(pctx, ctx)
    }

    fn cuDevicePrimaryCtxRelease | cuDevicePrimaryCtxRelease_v2 (dev: c_int) {
        let dev = check_dev(dev)?;
        release_primary(registry(), dev)
    }

    fn cuDevicePrimaryCtxReset | cuDevicePrimaryCtxReset_v2 (dev: c_int) {
        let dev = check_dev(dev)?;
        let mut reg = registry();
        let ctx = primary_of(&mut reg, dev);
        let was_active = reg.primary[dev].refcount > 0;
        reg.primary[dev].refcount = 0;
        reg.primary[dev].flags = 0;
        invalidate_current_caches();
        drop(reg);
        crate::memory::free_all_of_context(ctx);
        if was_active {
            release_context_mem(dev);
        }
        Ok(())
    }

    fn cuDevicePrimaryCtxGetState(dev: c_int, flags: *mut c_uint, active: *mut c_int) {
        let dev = check_dev(dev)?;
        let mut reg = registry();
        primary_of(&mut reg, dev);
        let p = reg.primary[dev];
        out(flags, p.flags)?;
        out(active, (p.refcount > 0) as c_int)
    }

    fn cuDevicePrimaryCtxSetFlags | cuDevicePrimaryCtxSetFlags_v2 (dev: c_int, flags: c_uint) {
        let dev = check_dev(dev)?;
        let mut reg = registry();
        let ctx = primary_of(&mut reg, dev);
        reg.primary[dev].flags = flags;
        if let Some(info) = reg.live.get_mut(&ctx) {
            info.flags = flags;
        }
        Ok(())
    }

    fn cuCtxCreate | cuCtxCreate_v2 (pctx: *mut Ctx, flags: c_uint, dev: c_int) {
        create(pctx, flags, dev)
    }

    fn cuCtxCreate_v3(pctx: *mut Ctx, params: *mut c_void, num_params: c_int, flags: c_uint, dev: c_int) {
        let _ = (params, num_params);
        create(pctx, flags, dev)
    }

    fn cuCtxCreate_v4(pctx: *mut Ctx, params: *mut c_void, flags: c_uint, dev: c_int) {
        let _ = params;
        create(pctx, flags, dev)
    }

    fn cuCtxDestroy | cuCtxDestroy_v2 (ctx: Ctx) {
        cfg()?;
        destroy(registry(), ctx)
    }

    // Deprecated, still exported by CUDA 13: one more usage of the current context.
    fn cuCtxAttach(pctx: *mut Ctx, flags: c_uint) {
        cfg()?;
        if pctx.is_null() || flags != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let (ctx, _) = current()?;
        let mut reg = registry();
        let info = *reg.live.get(&ctx).ok_or(CUDA_ERROR_INVALID_CONTEXT)?;
        if info.primary {
            let p = &mut reg.primary[info.dev];
            p.refcount = p.refcount.checked_add(1).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        } else {
            let usage = &mut reg.live.get_mut(&ctx).unwrap().usage;
            *usage = usage.checked_add(1).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        }
        note(|| format!("ctx={ctx:#x}"));
        out(pctx, ctx)
    }

    // One usage less; the context is destroyed when none is left. (The header asks for `ctx`
    // to be current; the fake does not insist.)
    fn cuCtxDetach(ctx: Ctx) {
        cfg()?;
        let mut reg = registry();
        let info = *reg.live.get(&ctx).ok_or(CUDA_ERROR_INVALID_CONTEXT)?;
        if info.primary {
            let last = reg.primary[info.dev].refcount == 1;
            release_primary(reg, info.dev)?;
            if last {
                STACK.with(|s| s.borrow_mut().retain(|&c| c != ctx));
            }
            return Ok(());
        }
        let usage = &mut reg.live.get_mut(&ctx).unwrap().usage;
        *usage -= 1;
        if *usage == 0 {
            destroy(reg, ctx)?;
        }
        Ok(())
    }

    fn cuCtxSetCurrent(ctx: Ctx) {
        cfg()?;
        if ctx != 0 {
            check_live(ctx)?;
        }
        set_top(ctx);
        Ok(())
    }

    fn cuCtxGetCurrent(pctx: *mut Ctx) {
        cfg()?;
        out(pctx, STACK.with(|s| s.borrow().last().copied().unwrap_or(0)))
    }

    fn cuCtxPushCurrent | cuCtxPushCurrent_v2 (ctx: Ctx) {
        cfg()?;
        check_live(ctx)?;
        STACK.with(|s| s.borrow_mut().push(ctx));
        Ok(())
    }

    fn cuCtxPopCurrent | cuCtxPopCurrent_v2 (pctx: *mut Ctx) {
        cfg()?;
        let top = STACK.with(|s| s.borrow_mut().pop()).ok_or(CUDA_ERROR_INVALID_CONTEXT)?;
        if !pctx.is_null() {
            out(pctx, top)?;
        }
        Ok(())
    }

    fn cuCtxGetDevice(device: *mut c_int) {
        out(device, current()?.1 as c_int)
    }

    fn cuCtxSynchronize() {
        let (_, dev) = current()?;
        crate::pool::sync(Some(dev));
        Ok(())
    }

    // CUDA 13.0: the given context (NULL: the current one).
    fn cuCtxSynchronize_v2(ctx: Ctx) {
        crate::pool::sync(Some(device_of(ctx)?));
        Ok(())
    }

    // CUDA 13.0: the device of the given context (NULL: the current one).
    fn cuCtxGetDevice_v2(device: *mut c_int, ctx: Ctx) {
        out(device, device_of(ctx)? as c_int)
    }

    fn cuCtxGetApiVersion(ctx: Ctx, version: *mut c_uint) {
        device_of(ctx)?;
        out(version, 3020)
    }

    fn cuCtxGetFlags(flags: *mut c_uint) {
        let (ctx, _) = current()?;
        let f = registry().live.get(&ctx).map(|i| i.flags).unwrap_or(0);
        out(flags, f)
    }

    fn cuCtxSetFlags(flags: c_uint) {
        let (ctx, _) = current()?;
        if let Some(info) = registry().live.get_mut(&ctx) {
            info.flags = flags;
        }
        Ok(())
    }

    fn cuCtxGetId(ctx: Ctx, id: *mut u64) {
        let ctx = if ctx == 0 { current()?.0 } else { check_live(ctx).map(|_| ctx)? };
        out(id, ctx as u64)
    }

    fn cuCtxGetStreamPriorityRange(least: *mut c_int, greatest: *mut c_int) {
        current()?;
        if !least.is_null() {
            out(least, 0)?;
        }
        if !greatest.is_null() {
            out(greatest, -5)?;
        }
        Ok(())
    }

    fn cuCtxGetLimit(value: *mut usize, limit: c_int) {
        current()?;
        let default = match limit {
            0 => 1024,           // STACK_SIZE
            1 => 1 << 20,        // PRINTF_FIFO_SIZE
            2 => 8 << 20,        // MALLOC_HEAP_SIZE
            3 => 2,              // DEV_RUNTIME_SYNC_DEPTH
            4 => 2048,           // DEV_RUNTIME_PENDING_LAUNCH_COUNT
            5 => 32,             // MAX_L2_FETCH_GRANULARITY
            6 => 0,              // PERSISTING_L2_CACHE_SIZE
            _ => return Err(CUDA_ERROR_INVALID_VALUE),
        };
        let v = LIMITS.lock().unwrap_or_else(|e| e.into_inner()).get(&limit).copied().unwrap_or(default);
        out(value, v)
    }

    fn cuCtxSetLimit(limit: c_int, value: usize) {
        current()?;
        if !(0..=6).contains(&limit) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        LIMITS.lock().unwrap_or_else(|e| e.into_inner()).insert(limit, value);
        Ok(())
    }

    // cudaProfiler.h. Deprecated: "starting with CUDA 12.0, it always returns
    // CUDA_ERROR_NOT_SUPPORTED", so the fake does too when it reports a driver of 12.0 or later.
    fn cuProfilerInitialize(config_file: *const c_char, output_file: *const c_char, output_mode: c_int) {
        let _ = (config_file, output_file, output_mode);
        if cfg()?.driver_version >= 12000 {
            return Err(CUDA_ERROR_NOT_SUPPORTED);
        }
        Ok(())
    }

    // Profiling of the current context on/off: no profiler is attached to the fake.
    fn cuProfilerStart() {
        current().map(|_| ())
    }

    fn cuProfilerStop() {
        current().map(|_| ())
    }

    fn cuCtxGetCacheConfig(config: *mut c_int) {
        current()?;
        out(config, 0)
    }

    fn cuCtxSetCacheConfig(config: c_int) {
        current()?;
        let _ = config;
        Ok(())
    }
}
