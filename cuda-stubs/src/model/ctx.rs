//! Contexts: primary and created ones, current per thread (a stack), usage counts, limits.
//!
//! Usage counts: a created context starts at 1; cuCtxAttach adds one to the current context,
//! cuCtxDetach takes one and destroys the context at zero (as cuCtxDestroy, which destroys
//! whatever the count). A primary context's usage count is its retain count: attach and
//! detach on it act as cuDevicePrimaryCtxRetain / cuDevicePrimaryCtxRelease (detach to zero
//! also pops it from the calling thread's stack, as a destroy does).
//!
//! A context that ends is returned as `Ended`: what lived in it goes with it (teardown.rs).

use super::HashMap;
use std::cell::RefCell;
use std::sync::Mutex;

use std::sync::LazyLock;

use super::device::{cfg, ledger};
use super::os::new_handle;
use crate::abi::{CUDA_ERROR_INVALID_CONTEXT, CUDA_ERROR_INVALID_VALUE, CUresult, CuResult};

/// CUcontext is the address of a leaked 8-byte box: unique and never reused.
pub type Ctx = usize;

/// A context that stopped being valid (destroyed, or a primary context released to zero or
/// reset): its allocations must be freed and, if `context_mem`, its FAKECUDA_CONTEXT_MEM
/// given back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ended {
    pub ctx: Ctx,
    pub dev: usize,
    pub context_mem: bool,
}

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

static REGISTRY: LazyLock<Mutex<Registry>> = LazyLock::new(Default::default);

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
        .try_with(|s| s.borrow().last().copied())
        .ok()
        .flatten()
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

/// The calling thread's top context (0 if its stack is empty).
pub fn top() -> Ctx {
    STACK
        .try_with(|s| s.borrow().last().copied().unwrap_or(0))
        .unwrap_or(0)
}

/// Replaces the top of the calling thread's stack with `ctx` (cuCtxSetCurrent; 0 pops).
pub fn set_top(ctx: Ctx) {
    let _ = STACK.try_with(|s| {
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

/// Pushes `ctx` on the calling thread's stack.
pub fn push(ctx: Ctx) {
    let _ = STACK.try_with(|s| s.borrow_mut().push(ctx));
}

/// Pops the calling thread's top context.
pub fn pop() -> Option<Ctx> {
    STACK.try_with(|s| s.borrow_mut().pop()).ok().flatten()
}

/// CUDA_ERROR_INVALID_CONTEXT unless `ctx` is a context handle this process made.
pub fn check_live(ctx: Ctx) -> CuResult {
    if registry().live.contains_key(&ctx) {
        Ok(())
    } else {
        Err(CUDA_ERROR_INVALID_CONTEXT)
    }
}

/// The contexts that hold device memory now, with their devices: every created context
/// and each active primary context (what an eagerly loaded library is loaded into).
pub fn active() -> Vec<(Ctx, usize)> {
    let reg = registry();
    reg.live
        .iter()
        .filter(|(_, info)| {
            !info.primary || reg.primary.get(info.dev).is_some_and(|p| p.refcount > 0)
        })
        .map(|(&ctx, info)| (ctx, info.dev))
        .collect()
}

/// Takes one reference on the primary context of `dev` (cuDevicePrimaryCtxRetain); the
/// first one activates it, which takes its context memory.
pub fn retain_primary(dev: usize) -> Result<Ctx, CUresult> {
    let mut reg = registry();
    let ctx = primary_of(&mut reg, dev);
    if reg.primary[dev].refcount == 0 {
        // Activating the primary context takes its memory.
        ledger()?.charge_context(dev, cfg()?.context_mem)?;
    }
    reg.primary[dev].refcount += 1;
    Ok(ctx)
}

/// Takes one reference off the primary context of `dev` (cuDevicePrimaryCtxRelease, or
/// cuCtxDetach on it); at zero it is deactivated and returned as ended.
/// CUDA_ERROR_INVALID_CONTEXT if it is not active.
pub fn release_primary(dev: usize) -> Result<Option<Ended>, CUresult> {
    release_primary_locked(&mut registry(), dev)
}

fn release_primary_locked(reg: &mut Registry, dev: usize) -> Result<Option<Ended>, CUresult> {
    let ctx = primary_of(reg, dev);
    let p = &mut reg.primary[dev];
    if p.refcount == 0 {
        return Err(CUDA_ERROR_INVALID_CONTEXT);
    }
    p.refcount -= 1;
    if p.refcount > 0 {
        return Ok(None);
    }
    invalidate_current_caches();
    Ok(Some(Ended {
        ctx,
        dev,
        context_mem: true,
    }))
}

/// cuDevicePrimaryCtxReset: the primary context of `dev` is deactivated whatever its count
/// (its context memory goes only if it was active) and its flags are cleared.
pub fn reset_primary(dev: usize) -> Ended {
    let mut reg = registry();
    let ctx = primary_of(&mut reg, dev);
    let was_active = reg.primary[dev].refcount > 0;
    reg.primary[dev].refcount = 0;
    reg.primary[dev].flags = 0;
    invalidate_current_caches();
    Ended {
        ctx,
        dev,
        context_mem: was_active,
    }
}

/// The primary context handle of `dev`, without taking a reference (it may be inactive).
pub fn primary_handle(dev: usize) -> Ctx {
    primary_of(&mut registry(), dev)
}

/// (flags, active) of the primary context of `dev`.
pub fn primary_state(dev: usize) -> (u32, bool) {
    let mut reg = registry();
    primary_of(&mut reg, dev);
    let p = reg.primary[dev];
    (p.flags, p.refcount > 0)
}

/// Sets the flags of the primary context of `dev`.
pub fn set_primary_flags(dev: usize, flags: u32) {
    let mut reg = registry();
    let ctx = primary_of(&mut reg, dev);
    reg.primary[dev].flags = flags;
    if let Some(info) = reg.live.get_mut(&ctx) {
        info.flags = flags;
    }
}

/// Creates a context of `dev` (cuCtxCreate): it takes its context memory, has usage count 1
/// and becomes the calling thread's current context.
pub fn create(dev: usize, flags: u32) -> Result<Ctx, CUresult> {
    ledger()?.charge_context(dev, cfg()?.context_mem)?;
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
    push(ctx);
    Ok(ctx)
}

/// Destroys the created context `ctx` from a held registry: it is popped from the calling
/// thread's stack. CUDA_ERROR_INVALID_CONTEXT for a primary or unknown context.
fn destroy_locked(
    mut reg: std::sync::MutexGuard<'static, Registry>,
    ctx: Ctx,
) -> Result<Ended, CUresult> {
    let dev = match reg.live.get(&ctx) {
        Some(info) if !info.primary => info.dev,
        _ => return Err(CUDA_ERROR_INVALID_CONTEXT),
    };
    reg.live.remove(&ctx);
    invalidate_current_caches();
    drop(reg);
    let _ = STACK.try_with(|s| s.borrow_mut().retain(|&c| c != ctx));
    Ok(Ended {
        ctx,
        dev,
        context_mem: true,
    })
}

/// Destroys the created context `ctx` whatever its usage count (cuCtxDestroy).
pub fn destroy(ctx: Ctx) -> Result<Ended, CUresult> {
    destroy_locked(registry(), ctx)
}

/// One more usage of the calling thread's current context (cuCtxAttach).
pub fn attach() -> Result<Ctx, CUresult> {
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
    Ok(ctx)
}

/// One usage less of `ctx` (cuCtxDetach); the context ends when none is left, and is popped
/// from the calling thread's stack.
pub fn detach(ctx: Ctx) -> Result<Option<Ended>, CUresult> {
    let mut reg = registry();
    let info = *reg.live.get(&ctx).ok_or(CUDA_ERROR_INVALID_CONTEXT)?;
    if info.primary {
        let ended = release_primary_locked(&mut reg, info.dev)?;
        drop(reg);
        if ended.is_some() {
            let _ = STACK.try_with(|s| s.borrow_mut().retain(|&c| c != ctx));
        }
        return Ok(ended);
    }
    let usage = &mut reg.live.get_mut(&ctx).unwrap().usage;
    *usage -= 1;
    if *usage == 0 {
        return destroy_locked(reg, ctx).map(Some);
    }
    Ok(None)
}

/// The flags of a context (0 if it is unknown).
pub fn flags(ctx: Ctx) -> u32 {
    registry().live.get(&ctx).map(|i| i.flags).unwrap_or(0)
}

/// Sets the flags of a context.
pub fn set_flags(ctx: Ctx, flags: u32) {
    if let Some(info) = registry().live.get_mut(&ctx) {
        info.flags = flags;
    }
}
