//! Green contexts (CUDA 12.4, see `model::green`): a device's multiprocessors as a
//! resource, split into partitions, a descriptor of one, and the green context made with
//! it, which retains the device's primary context for its life and is used through the
//! handle `cuCtxFromGreenCtx` gives (the primary context's, here); streams made in one.

use super::context::retain_primary;
use crate::abi::{CUDA_ERROR_INVALID_VALUE, CuResult, inp, note, out};
use crate::model::ctx::{self, Ctx, device_of};
use crate::model::device::{cfg, check_dev, ledger};
use crate::model::green::{self, DevResource, Green, SMS, TYPE_SM};
use crate::model::{stream, teardown};
use libc::{c_int, c_uint};

/// `CU_GREEN_CTX_DEFAULT_STREAM`: the only flag of `cuGreenCtxCreate`.
const DEFAULT_STREAM: c_uint = 1;
/// `CU_STREAM_NON_BLOCKING`: what `cuGreenCtxStreamCreate` requires.
const NON_BLOCKING: c_uint = 1;

/// Writes an SM resource of `sms` multiprocessors; only `CU_DEV_RESOURCE_TYPE_SM` exists.
fn sm_resource(res: *mut DevResource, ty: c_int, sms: u32) -> CuResult {
    if ty != TYPE_SM as c_int {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    out(res, DevResource::sm(sms))
}

/// One reference less on `dev`'s primary context; its end when it was the last.
fn release_primary(dev: usize) -> CuResult {
    if let Some(ended) = ctx::release_primary(dev)? {
        teardown::end(ended);
    }
    Ok(())
}

crate::abi::exports! {
    fn cuDeviceGetDevResource(dev: c_int, res: *mut DevResource, ty: c_int) {
        check_dev(dev)?;
        sm_resource(res, ty, SMS)
    }

    fn cuCtxGetDevResource(hctx: usize, res: *mut DevResource, ty: c_int) {
        device_of(hctx)?;
        sm_resource(res, ty, SMS)
    }

    // Partitions of at least minCount multiprocessors (rounded up to the minimum and the
    // alignment), as many as the input holds and *nbGroups asks (all it holds when
    // result is NULL, the count alone then); what is left in remaining.
    fn cuDevSmResourceSplitByCount(result: *mut DevResource, nb_groups: *mut c_uint, input: *const DevResource, remaining: *mut DevResource, flags: c_uint, min_count: c_uint) {
        cfg()?;
        let _ = flags;
        let input = inp(input)?;
        let asked = inp(nb_groups.cast_const())?;
        if input.ty != TYPE_SM {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let size = green::partition_size(min_count);
        let fits = input.sm_count / size;
        let n = if result.is_null() { fits } else { fits.min(asked) };
        if n == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        if !result.is_null() {
            for i in 0..n as usize {
                // SAFETY: the caller's array holds *nbGroups resources, n <= *nbGroups written.
                unsafe { result.add(i).write_unaligned(DevResource::sm(size)) };
            }
        }
        if !remaining.is_null() {
            out(remaining, DevResource::sm(input.sm_count - n * size))?;
        }
        note(|| format!("{n} partitions of {size} SMs"));
        out(nb_groups, n)
    }

    fn cuDevResourceGenerateDesc(desc: *mut usize, resources: *const DevResource, count: c_uint) {
        cfg()?;
        if resources.is_null() || count == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let mut sms = 0u32;
        for i in 0..count as usize {
            // SAFETY: the caller's array holds `count` resources.
            let r = inp(unsafe { resources.add(i) })?;
            if r.ty != TYPE_SM {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
            sms = sms.saturating_add(r.sm_count);
        }
        out(desc, green::new_desc(sms.min(SMS)))
    }

    // Retains the device's primary context (activating it takes its memory) and takes
    // FAKECUDA_GREEN_CTX_MEM of its own.
    fn cuGreenCtxCreate(ph: *mut usize, desc: usize, dev: c_int, flags: c_uint) {
        let dev = check_dev(dev)?;
        if ph.is_null() || flags & !DEFAULT_STREAM != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let sms = green::desc(desc)?;
        let primary = retain_primary(dev)?;
        let own = cfg()?.green_ctx_mem;
        if own > 0
            && let Err(e) = ledger()?.charge(dev, own)
        {
            release_primary(dev)?;
            return Err(e);
        }
        let h = green::insert(Green { dev, sms, primary });
        note(|| format!("green ctx={h:#x} of {sms} SMs"));
        out(ph, h)
    }

    fn cuGreenCtxDestroy(h: usize) {
        cfg()?;
        let g = green::remove(h)?;
        let own = cfg()?.green_ctx_mem;
        if own > 0 {
            ledger()?.uncharge(g.dev, own);
        }
        release_primary(g.dev)
    }

    fn cuCtxFromGreenCtx(pctx: *mut Ctx, h: usize) {
        out(pctx, green::get(h)?.primary)
    }

    fn cuGreenCtxGetDevResource(h: usize, res: *mut DevResource, ty: c_int) {
        sm_resource(res, ty, green::get(h)?.sms)
    }

    fn cuGreenCtxGetId(h: usize, id: *mut u64) {
        green::get(h)?;
        out(id, h as u64)
    }

    fn cuGreenCtxStreamCreate(ph: *mut usize, h: usize, flags: c_uint, priority: c_int) {
        let g = green::get(h)?;
        if ph.is_null() || flags & NON_BLOCKING == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let s = stream::create(g.primary, g.dev, flags, priority);
        green::stream_made(s, h);
        out(ph, s)
    }

    fn cuGreenCtxRecordEvent(h: usize, event: usize) {
        green::get(h)?;
        stream::event(event).map(|_| ())
    }

    fn cuGreenCtxWaitEvent(h: usize, event: usize) {
        green::get(h)?;
        stream::event(event).map(|_| ())
    }
}
