//! A context's limits (cuCtxSetLimit / cuCtxGetLimit), each context its own, and the
//! device memory the stack limit takes. An H100 with driver 580 took 4,152,360,960 bytes
//! at `cuCtxSetLimit(CU_LIMIT_STACK_SIZE, 16 KiB)`: (16 KiB - the default 1 KiB) for each
//! of 132 SMs x 2,048 resident threads, in whole 2 MiB pages (its default stack is part
//! of the context's memory). The fake takes the same at the call and gives it back when
//! the limit is lowered or the context ends. Raising the malloc heap took nothing at the
//! call on that driver (it is taken later), and takes nothing here; with
//! `FAKECUDA_HEAP_AT_LAUNCH` the context's next kernel launch (direct or a graph's) takes
//! it (`take_late_limits`), kept until the context ends. A raised printf FIFO takes
//! nothing at the call either, and with `FAKECUDA_PRINTF_AT_LAUNCH` is taken the same way.

use super::HashMap;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{LazyLock, Mutex, MutexGuard};

use libc::c_int;

use super::ctx::Ctx;
use super::device::{cfg, ledger};
use crate::abi::{CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_UNKNOWN, CUresult, CuResult};

pub const STACK_SIZE: c_int = 0;
const PRINTF_FIFO_SIZE: c_int = 1;
const MALLOC_HEAP_SIZE: c_int = 2;
const DEV_RUNTIME_SYNC_DEPTH: c_int = 3;
const DEV_RUNTIME_PENDING_LAUNCH_COUNT: c_int = 4;
const MAX_L2_FETCH_GRANULARITY: c_int = 5;
const PERSISTING_L2_CACHE_SIZE: c_int = 6;
/// Whether the context is a CUDA-in-Graphics one (`cuda.h` of CUDA 12.5 to 13.5: "Can only
/// be queried, cannot be set"). The fake makes no CIG context (`cuCtxCreate_v4` ignores
/// `cigParams`), so it is 0. cuDNN 9 asks it at each handle it creates (TensorFlow's first
/// convolution asked it 12 times). CU_LIMIT_SHMEM_SIZE (7) and
/// CU_LIMIT_CIG_SHMEM_FALLBACK_ENABLED (9) stay unknown: no program was seen asking them,
/// and what a driver answers for an ordinary context is not recorded.
const CIG_ENABLED: c_int = 8;

/// The stack every thread has by default, inside the context's memory.
const DEFAULT_STACK: usize = 1024;
/// Resident threads the stack is laid out for: MULTIPROCESSOR_COUNT x
/// MAX_THREADS_PER_MULTIPROCESSOR (132 x 2,048, as the fake's device says).
const STACK_THREADS: u64 = 132 * 2048;
const PAGE: u64 = 2 << 20;

/// The default value of `limit`, or None for a limit that does not exist.
pub fn default_of(limit: c_int) -> Option<usize> {
    Some(match limit {
        STACK_SIZE => DEFAULT_STACK,
        PRINTF_FIFO_SIZE => 1 << 20,
        MALLOC_HEAP_SIZE => 8 << 20,
        DEV_RUNTIME_SYNC_DEPTH => 2,
        DEV_RUNTIME_PENDING_LAUNCH_COUNT => 2048,
        MAX_L2_FETCH_GRANULARITY => 32,
        PERSISTING_L2_CACHE_SIZE => 0,
        _ => return None,
    })
}

/// The device memory a stack of `per_thread` bytes takes beyond the context's own.
pub fn stack_bytes(per_thread: usize) -> u64 {
    let extra = (per_thread.saturating_sub(DEFAULT_STACK) as u64).saturating_mul(STACK_THREADS);
    extra.div_ceil(PAGE).saturating_mul(PAGE)
}

/// The device memory a malloc heap of `bytes` takes beyond the context's own (its default
/// 8 MiB is part of the context's memory), in whole 2 MiB pages.
pub fn heap_bytes(bytes: usize) -> u64 {
    let extra = bytes.saturating_sub(8 << 20) as u64;
    extra.div_ceil(PAGE).saturating_mul(PAGE)
}

/// The device memory a printf FIFO of `bytes` takes beyond the context's own (its default
/// 1 MiB is part of the context's memory), in whole 2 MiB pages.
pub fn fifo_bytes(bytes: usize) -> u64 {
    let extra = bytes.saturating_sub(1 << 20) as u64;
    extra.div_ceil(PAGE).saturating_mul(PAGE)
}

/// The memory each context's launches took for its raised heap and printf FIFO
/// (`take_late_limits`).
static LATE_TAKEN: LazyLock<Mutex<HashMap<Ctx, u64>>> = LazyLock::new(Default::default);

fn late_taken() -> MutexGuard<'static, HashMap<Ctx, u64>> {
    LATE_TAKEN.lock().unwrap_or_else(|e| e.into_inner())
}

/// Whether a context raised its malloc heap under `FAKECUDA_HEAP_AT_LAUNCH` or its printf
/// FIFO under `FAKECUDA_PRINTF_AT_LAUNCH`: until then a launch pays one load for them (the
/// fake's own launch is a benchmark's baseline).
static LATE_RAISED: AtomicBool = AtomicBool::new(false);

/// A kernel launch in `ctx` (on `dev`), direct or a graph's: a malloc heap raised under
/// `FAKECUDA_HEAP_AT_LAUNCH`, or a printf FIFO under `FAKECUDA_PRINTF_AT_LAUNCH`, beyond
/// what the context's launches took is taken now (CUDA_ERROR_OUT_OF_MEMORY, nothing
/// launched, when the device has not got it). Otherwise nothing.
#[inline]
pub fn take_late_limits(ctx: Ctx, dev: usize) -> CuResult {
    if !LATE_RAISED.load(Relaxed) {
        return Ok(());
    }
    take_raised(ctx, dev)
}

#[cold]
#[inline(never)]
fn take_raised(ctx: Ctx, dev: usize) -> CuResult {
    let c = cfg()?;
    let heap = if c.heap_at_launch {
        heap_bytes(get(ctx, MALLOC_HEAP_SIZE)?)
    } else {
        0
    };
    let fifo = if c.printf_at_launch {
        fifo_bytes(get(ctx, PRINTF_FIFO_SIZE)?)
    } else {
        0
    };
    let wants = heap + fifo;
    let mut h = late_taken();
    let had = h.get(&ctx).copied().unwrap_or(0);
    if wants > had {
        ledger()?.charge(dev, wants - had)?;
        h.insert(ctx, wants);
    }
    Ok(())
}

/// What each context set: (context, limit) -> value.
static VALUES: LazyLock<Mutex<HashMap<(Ctx, c_int), usize>>> = LazyLock::new(Default::default);

fn values() -> MutexGuard<'static, HashMap<(Ctx, c_int), usize>> {
    VALUES.lock().unwrap_or_else(|e| e.into_inner())
}

/// The value of `limit` in `ctx` (CUDA_ERROR_INVALID_VALUE for no such limit).
pub fn get(ctx: Ctx, limit: c_int) -> Result<usize, CUresult> {
    if limit == CIG_ENABLED {
        return Ok(0);
    }
    let default = default_of(limit).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    Ok(values().get(&(ctx, limit)).copied().unwrap_or(default))
}

/// Sets `limit` of `ctx` on device `dev`: a larger stack takes its memory first
/// (CUDA_ERROR_OUT_OF_MEMORY, the old value kept, when the device has not got it), a
/// smaller one gives memory back. A limit that can only be queried (CIG_ENABLED) or does
/// not exist is CUDA_ERROR_INVALID_VALUE.
pub fn set(ctx: Ctx, dev: usize, limit: c_int, value: usize) -> CuResult {
    let default = default_of(limit).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let mut v = values();
    let old = v.get(&(ctx, limit)).copied().unwrap_or(default);
    if limit == STACK_SIZE {
        if value < old && cfg()?.stack_lower_fails {
            return Err(CUDA_ERROR_UNKNOWN);
        }
        let (had, wants) = (stack_bytes(old), stack_bytes(value));
        let l = ledger()?;
        if wants > had {
            l.charge(dev, wants - had)?;
        } else if had > wants {
            l.uncharge(dev, had - wants);
        }
    }
    let late = match limit {
        MALLOC_HEAP_SIZE => cfg()?.heap_at_launch,
        PRINTF_FIFO_SIZE => cfg()?.printf_at_launch,
        _ => false,
    };
    if late && value > old {
        LATE_RAISED.store(true, Relaxed);
    }
    v.insert((ctx, limit), value);
    Ok(())
}

/// Whether a raised heap or printf FIFO waits to be taken at a launch (`take_late_limits`).
#[inline]
pub fn late_limit_raised() -> bool {
    LATE_RAISED.load(Relaxed)
}

/// A launch in `ctx` (on `dev`) of a kernel whose threads take `local` bytes of local
/// memory each: the driver grows the context's stack to it first, as large a stack as
/// `cuCtxSetLimit` would take, and keeps it (CUDA's `cuCtxSetLimit` documentation: "the
/// driver will set the limit to the maximum of value and what the kernel function
/// requires"; `CU_CTX_LMEM_RESIZE_TO_MAX`'s behaviour is the only one since CUDA 11).
/// CUDA_ERROR_OUT_OF_MEMORY, nothing launched, when the device has not got it.
pub fn grow_stack(ctx: Ctx, dev: usize, local: u64) -> CuResult {
    let local = usize::try_from(local).unwrap_or(usize::MAX);
    if local > get(ctx, STACK_SIZE)? {
        set(ctx, dev, STACK_SIZE, local)?;
    }
    Ok(())
}

/// The context ended: its limits go, and the memory its stack, heap and printf FIFO took.
pub fn end_context(ctx: Ctx, dev: usize) {
    let mut v = values();
    let stack = v.get(&(ctx, STACK_SIZE)).copied().unwrap_or(DEFAULT_STACK);
    v.retain(|(c, _), _| *c != ctx);
    drop(v);
    let heap = late_taken().remove(&ctx).unwrap_or(0);
    if let (Ok(l), bytes @ 1..) = (ledger(), stack_bytes(stack) + heap) {
        l.uncharge(dev, bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stack_takes_what_the_h100_took() {
        assert_eq!(stack_bytes(16 << 10), 4_152_360_960);
        assert_eq!(stack_bytes(DEFAULT_STACK), 0);
        assert_eq!(stack_bytes(512), 0);
        assert_eq!(stack_bytes(1025) % PAGE, 0);
    }

    #[test]
    fn the_printf_fifo_takes_what_it_was_raised_by_in_whole_pages() {
        assert_eq!(fifo_bytes(1 << 20), 0, "the default lives in the context");
        assert_eq!(fifo_bytes(65 << 20), 64 << 20);
        assert_eq!(fifo_bytes((1 << 20) + 1), PAGE);
    }

    #[test]
    fn the_heap_takes_what_it_was_raised_by_in_whole_pages() {
        assert_eq!(heap_bytes(8 << 20), 0, "the default lives in the context");
        assert_eq!(heap_bytes(4 << 20), 0);
        assert_eq!(heap_bytes((8 << 20) + (512 << 20)), 512 << 20);
        assert_eq!(heap_bytes((8 << 20) + 1), PAGE);
    }

    #[test]
    fn cig_enabled_is_zero_and_cannot_be_set() {
        let ctx: Ctx = 0x5eed;
        assert_eq!(get(ctx, CIG_ENABLED), Ok(0));
        assert_eq!(set(ctx, 0, CIG_ENABLED, 1), Err(CUDA_ERROR_INVALID_VALUE));
        assert_eq!(get(ctx, CIG_ENABLED), Ok(0));
        // The other limits CUDA 12.5 added for CIG contexts stay unknown.
        assert_eq!(get(ctx, 7), Err(CUDA_ERROR_INVALID_VALUE));
        assert_eq!(get(ctx, 9), Err(CUDA_ERROR_INVALID_VALUE));
    }
}
