//! Contexts (primary and created, the per-thread stack, usage counts), their limits and
//! cache configuration, and the profiler calls.

use crate::abi::CUresult;
use crate::abi::{
    CUDA_ERROR_INVALID_CONTEXT, CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_NOT_SUPPORTED, CuResult, note,
    out,
};
use crate::model::ctx::{self, Ctx, current, device_of};
use crate::model::device::{cfg, check_dev};
use crate::model::graph;
use crate::model::limit;
use crate::model::pool;
use crate::model::teardown;
use libc::{c_char, c_int, c_uint, c_void};

/// Sleeps half of `ms` milliseconds: a call that takes a while (FAKECUDA_CONTEXT_DELAY_MS,
/// FAKECUDA_LIMIT_DELAY_MS) sleeps one half before it takes or gives back its memory, the
/// other after.
fn half_of(ms: u64) {
    if ms > 0 {
        std::thread::sleep(std::time::Duration::from_micros(ms * 500));
    }
}

/// Half of FAKECUDA_CONTEXT_DELAY_MS (see [`half_of`]).
fn half_delay() -> CuResult {
    half_of(cfg()?.context_delay_ms);
    Ok(())
}

/// `cuCtxSetLimit`s held open (FAKECUDA_LIMIT_HALFWAY, FAKECUDA_LIMIT_UNTIL).
static LIMITS_HELD: super::hold::Held = super::hold::Held::new();

pub(super) fn create(pctx: *mut Ctx, flags: c_uint, dev: c_int) -> CuResult {
    let dev = check_dev(dev)?;
    if pctx.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    half_delay()?;
    let ctx = ctx::create(dev, flags)?;
    if let Err(e) = eager_libraries(ctx, dev) {
        teardown::end(ctx::destroy(ctx)?);
        return Err(e);
    }
    half_delay()?;
    note(|| format!("ctx={ctx:#x}"));
    out(pctx, ctx)
}

/// Under eager loading, a context made now gets every library loaded so far
/// (`module::libraries_into`); lazily, each at its first use there.
fn eager_libraries(ctx: Ctx, dev: usize) -> CuResult {
    if cfg()?.eager {
        crate::model::module::libraries_into(ctx, dev)
    } else {
        Ok(())
    }
}

/// One reference more on the primary context of `dev` (the first activates it: it takes
/// its memory, and its time under FAKECUDA_CONTEXT_DELAY_MS), as `cuDevicePrimaryCtxRetain`
/// and `cuGreenCtxCreate` take one.
pub(super) fn retain_primary(dev: usize) -> Result<Ctx, CUresult> {
    let first = !ctx::primary_state(dev).1;
    if first {
        half_delay()?;
    }
    let ctx = ctx::retain_primary(dev)?;
    if first {
        if let Err(e) = eager_libraries(ctx, dev) {
            if let Some(ended) = ctx::release_primary(dev)? {
                teardown::end(ended);
            }
            return Err(e);
        }
        half_delay()?;
    }
    Ok(ctx)
}

crate::abi::exports! {
    fn cuDevicePrimaryCtxRetain(pctx: *mut Ctx, dev: c_int) {
        let dev = check_dev(dev)?;
        if pctx.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let ctx = retain_primary(dev)?;
        note(|| format!("ctx={ctx:#x}"));
        out(pctx, ctx)
    }

    fn cuDevicePrimaryCtxRelease | cuDevicePrimaryCtxRelease_v2 (dev: c_int) {
        let dev = check_dev(dev)?;
        if let Some(ended) = ctx::release_primary(dev)? {
            teardown::end(ended);
        }
        Ok(())
    }

    fn cuDevicePrimaryCtxReset | cuDevicePrimaryCtxReset_v2 (dev: c_int) {
        let dev = check_dev(dev)?;
        teardown::end(ctx::reset_primary(dev));
        Ok(())
    }

    fn cuDevicePrimaryCtxGetState(dev: c_int, flags: *mut c_uint, active: *mut c_int) {
        let (f, a) = ctx::primary_state(check_dev(dev)?);
        out(flags, f)?;
        out(active, a as c_int)
    }

    fn cuDevicePrimaryCtxSetFlags | cuDevicePrimaryCtxSetFlags_v2 (dev: c_int, flags: c_uint) {
        ctx::set_primary_flags(check_dev(dev)?, flags);
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
        if ctx == 0 {
            // NULL is not "the current context" here: the real driver answers INVALID_VALUE.
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        teardown::end(ctx::destroy(ctx)?);
        Ok(())
    }

    // Deprecated, still exported by CUDA 13: one more usage of the current context.
    fn cuCtxAttach(pctx: *mut Ctx, flags: c_uint) {
        cfg()?;
        if pctx.is_null() || flags != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let ctx = ctx::attach()?;
        note(|| format!("ctx={ctx:#x}"));
        out(pctx, ctx)
    }

    // One usage less; the context is destroyed when none is left. (The header asks for `ctx`
    // to be current; the fake does not insist.)
    fn cuCtxDetach(ctx: Ctx) {
        cfg()?;
        if let Some(ended) = ctx::detach(ctx)? {
            teardown::end(ended);
        }
        Ok(())
    }

    fn cuCtxSetCurrent(ctx: Ctx) {
        cfg()?;
        if ctx != 0 {
            ctx::check_live(ctx)?;
        }
        ctx::set_top(ctx);
        Ok(())
    }

    fn cuCtxGetCurrent(pctx: *mut Ctx) {
        cfg()?;
        out(pctx, ctx::top())
    }

    fn cuCtxPushCurrent | cuCtxPushCurrent_v2 (ctx: Ctx) {
        cfg()?;
        ctx::check_live(ctx)?;
        ctx::push(ctx);
        Ok(())
    }

    fn cuCtxPopCurrent | cuCtxPopCurrent_v2 (pctx: *mut Ctx) {
        cfg()?;
        let top = ctx::pop().ok_or(CUDA_ERROR_INVALID_CONTEXT)?;
        if !pctx.is_null() {
            out(pctx, top)?;
        }
        Ok(())
    }

    fn cuCtxGetDevice(device: *mut c_int) {
        out(device, current()?.1 as c_int)
    }

    fn cuCtxSynchronize() {
        graph::refuse_during_capture("cuCtxSynchronize")?;
        let (_, dev) = current()?;
        pool::sync(Some(dev));
        Ok(())
    }

    // CUDA 13.0: the given context (NULL: the current one).
    fn cuCtxSynchronize_v2(ctx: Ctx) {
        pool::sync(Some(device_of(ctx)?));
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
        out(flags, ctx::flags(ctx))
    }

    fn cuCtxSetFlags(flags: c_uint) {
        let (ctx, _) = current()?;
        ctx::set_flags(ctx, flags);
        Ok(())
    }

    fn cuCtxGetId(ctx: Ctx, id: *mut u64) {
        let ctx = if ctx == 0 { current()?.0 } else { ctx::check_live(ctx).map(|_| ctx)? };
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
        let (ctx, _) = current()?;
        out(value, limit::get(ctx, limit)?)
    }

    fn cuCtxSetLimit(limit: c_int, value: usize) {
        let (ctx, dev) = current()?;
        half_of(cfg()?.limit_delay_ms);
        let set = limit::set(ctx, dev, limit, value);
        let c = cfg()?;
        LIMITS_HELD.middle(c.limit_halfway.as_deref(), c.limit_until.as_deref());
        half_of(cfg()?.limit_delay_ms);
        set
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
