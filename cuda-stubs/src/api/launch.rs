//! Launches and occupancy. The fake executes no kernel: a launch of a valid function or
//! kernel handle with a valid configuration succeeds and does nothing (on a capturing
//! stream it becomes a kernel node of the graph); occupancy is that of an H100-like device.
//! The deprecated launches (`cuLaunch`, `cuLaunchGrid`, `cuLaunchGridAsync`, replaced by
//! `cuLaunchKernel` in CUDA 4.0) take the block and shared memory set on the function
//! before (`cuFuncSetBlockShape`, `cuFuncSetSharedSize`) and launch as `cuLaunchKernel`
//! does; the parameters set with `cuParamSet*` are checked for a valid function and kept
//! nowhere (no kernel runs). `cuLaunchCooperativeKernelMultiDevice` (deprecated since CUDA
//! 11.3) launches on several devices at once, each in its stream's context.

use std::ptr::null_mut;

use crate::abi::{
    CUDA_ERROR_INVALID_CLUSTER_SIZE, CUDA_ERROR_INVALID_HANDLE, CUDA_ERROR_INVALID_VALUE, CUresult,
    CuResult, inp, note, out,
};
use crate::model::ctx::current;
use crate::model::device::cfg;
use crate::model::graph::{self, KernelNode, Node};
use crate::model::{module, stream};
use libc::{c_int, c_uint, c_void};

/// A launch: a valid function (or kernel), grid and block, stream. Does nothing; on a
/// capturing stream it becomes a kernel node of the capture's graph, with its parameters
/// (`k`: the handle given, dynamic shared memory, the caller's argument pointers; `ctx`
/// the context it is launched in).
fn launch(k: KernelNode, stream_h: usize) -> CuResult {
    let (ctx, dev) = current()?;
    let given = k.func;
    let f = module::launchable(given)?;
    module::check_dims(k.grid, k.block)?;
    stream::check(stream_h)?;
    let local = module::use_in_context(f, ctx, dev)?;
    let node = || Node::Kernel(KernelNode { ctx, local, ..k });
    let captured = graph::capture_work(stream_h, node).transpose()?;
    if captured.is_none() {
        // Its threads' local memory: the context's stack grows to it.
        if local > 0 {
            crate::model::limit::grow_stack(ctx, dev, local)?;
        }
        crate::model::limit::take_late_limits(ctx, dev)?;
    }
    note(|| {
        let name = module::get_function(f).map(|f| f.name).unwrap_or_default();
        let handle = if given == f { "function" } else { "kernel" };
        match captured {
            Some(node) => format!("{name}: captured as node {node:#x}; a {handle} handle"),
            None => format!("{name}: not executed; a {handle} handle"),
        }
    });
    Ok(())
}

/// A deprecated launch of function `f` on a `w` x `h` grid: the block and shared memory
/// set on it before (none set: a 0 x 0 x 0 block, refused as `cuLaunchKernel` refuses it).
fn launch_shaped(f: usize, w: c_int, h: c_int, stream_h: usize) -> CuResult {
    let grid = |n: c_int| c_uint::try_from(n).map_err(|_| CUDA_ERROR_INVALID_VALUE);
    let shape = crate::model::launch_shape::of(f)?;
    let k = kernel(
        f,
        [grid(w)?, grid(h)?, 1],
        shape.block,
        shape.shared,
        null_mut(),
        null_mut(),
    );
    launch(k, stream_h)
}

/// A parameter of function `f` set at `offset` for the deprecated launches: checked, kept
/// nowhere (the fake runs no kernel).
fn param(f: usize, offset: c_int) -> CuResult {
    module::get_function(f).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    if offset < 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    Ok(())
}

/// A launch's parameters as a kernel node keeps them (no context yet).
fn kernel(
    f: usize,
    grid: [c_uint; 3],
    block: [c_uint; 3],
    shared_mem_bytes: c_uint,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> KernelNode {
    KernelNode {
        func: f,
        grid,
        block,
        shared_mem_bytes,
        kernel_params: params as usize,
        extra: extra as usize,
        kern: 0,
        ctx: 0,
        local: 0,
    }
}

/// CUDA_LAUNCH_PARAMS: one device's launch of `cuLaunchCooperativeKernelMultiDevice`.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct MultiDeviceLaunch {
    pub(crate) function: usize,
    pub(crate) grid: [c_uint; 3],
    pub(crate) block: [c_uint; 3],
    pub(crate) shared: c_uint,
    pub(crate) stream: usize,
    pub(crate) params: *mut *mut c_void,
}

/// `cuLaunchCooperativeKernelMultiDevice` (deprecated since CUDA 11.3): `n` launches, each
/// on a stream of its own device's context (not a default stream), of the same grid, block
/// and shared memory, every device able (`COOPERATIVE_MULTI_DEVICE_LAUNCH`); each checked
/// first, then each made in its stream's context as `cuLaunchCooperativeKernel` makes one.
fn launch_multi_device(list: *const MultiDeviceLaunch, n: c_uint, flags: c_uint) -> CuResult {
    let cfg = cfg()?;
    if list.is_null() || n == 0 || n as usize > cfg.visible.len() || flags & !3 != 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: the caller's array of `n` launches (checked non-null above).
    let all = unsafe { std::slice::from_raw_parts(list, n as usize) };
    let mut devices = Vec::with_capacity(all.len());
    for e in all {
        if stream::SPECIAL_STREAMS.contains(&e.stream) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let (ctx, dev) = stream::context_of(e.stream)?;
        let same = (e.grid, e.block, e.shared) == (all[0].grid, all[0].block, all[0].shared);
        if devices.iter().any(|&(_, d)| d == dev) || !same {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        module::launchable(e.function)?;
        module::check_dims(e.grid, e.block)?;
        devices.push((ctx, dev));
    }
    for (e, &(ctx, _)) in all.iter().zip(&devices) {
        crate::model::ctx::push(ctx);
        let k = kernel(e.function, e.grid, e.block, e.shared, e.params, null_mut());
        let rc = launch(k, e.stream);
        crate::model::ctx::pop();
        rc?;
    }
    Ok(())
}

/// CUlaunchConfig (CUDA 12 layout): grid, block, shared memory, stream, attributes.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct LaunchConfig {
    pub(crate) grid: [c_uint; 3],
    pub(crate) block: [c_uint; 3],
    pub(crate) shared: c_uint,
    pub(crate) stream: usize,
    pub(crate) attrs: *mut c_void,
    pub(crate) num_attrs: c_uint,
}

/// The fake's occupancy: 2048 threads per multiprocessor, at most 32 blocks.
fn blocks_per_sm(block_size: c_int) -> Result<c_int, CUresult> {
    if block_size <= 0 || block_size > 1024 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    Ok((2048 / block_size).min(32))
}

fn potential_block_size(
    min_grid: *mut c_int,
    block: *mut c_int,
    f: usize,
    limit: c_int,
) -> CuResult {
    module::launchable(f)?;
    let size = if limit > 0 { limit.min(1024) } else { 1024 };
    out(min_grid, blocks_per_sm(size)? * 132)?;
    out(block, size)
}

/// CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION: the value holds the cluster's x, y, z in blocks.
const LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION: u32 = 4;

/// CUlaunchAttribute: the id, padding, then a 64-byte value union.
#[repr(C)]
#[derive(Clone, Copy)]
struct LaunchAttribute {
    id: u32,
    pad: u32,
    value: [u32; 16],
}

/// The largest cluster the fake (an H100, compute capability 9.0) runs without the
/// non-portable cluster size attribute.
const PORTABLE_CLUSTER_SIZE: c_int = 8;

/// The blocks of one cluster that `config` asks for: its cluster dimension attribute, which
/// a function without a cluster size fixed at compile time (the fake's have none) needs
/// (CUDA_ERROR_INVALID_CLUSTER_SIZE without it, or beyond the portable size).
fn cluster_blocks(config: *const c_void) -> Result<(LaunchConfig, c_int), CUresult> {
    let c = inp(config.cast::<LaunchConfig>())?;
    let mut dims = None;
    for i in 0..c.num_attrs as usize {
        let a = inp(c
            .attrs
            .cast::<LaunchAttribute>()
            .wrapping_add(i)
            .cast_const())?;
        note(|| format!("attribute {} = {:?}", a.id, &a.value[..4]));
        if a.id == LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION {
            dims = Some([a.value[0], a.value[1], a.value[2]]);
        }
    }
    note(|| format!("grid {:?}, block {:?}", c.grid, c.block));
    let dims = dims.ok_or(CUDA_ERROR_INVALID_CLUSTER_SIZE)?;
    let blocks = dims.iter().map(|&d| d as u64).product::<u64>();
    if blocks == 0 || blocks > PORTABLE_CLUSTER_SIZE as u64 {
        return Err(CUDA_ERROR_INVALID_CLUSTER_SIZE);
    }
    if dims.iter().zip(c.grid).any(|(&d, g)| g % d != 0) {
        return Err(CUDA_ERROR_INVALID_CLUSTER_SIZE);
    }
    Ok((c, blocks as c_int))
}

crate::abi::exports! {
    fn cuLaunchKernel | cuLaunchKernel_ptsz (f: usize, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint, shared_bytes: c_uint, hstream: usize, params: *mut *mut c_void, extra: *mut *mut c_void) {
        launch(kernel(f, [gx, gy, gz], [bx, by, bz], shared_bytes, params, extra), hstream)
    }

    fn cuLaunchCooperativeKernel | cuLaunchCooperativeKernel_ptsz (f: usize, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint, shared_bytes: c_uint, hstream: usize, params: *mut *mut c_void) {
        launch(kernel(f, [gx, gy, gz], [bx, by, bz], shared_bytes, params, null_mut()), hstream)
    }

    fn cuLaunchCooperativeKernelMultiDevice(list: *const MultiDeviceLaunch, n: c_uint, flags: c_uint) {
        launch_multi_device(list, n, flags)
    }

    fn cuLaunchKernelEx | cuLaunchKernelEx_ptsz (config: *const c_void, f: usize, params: *mut *mut c_void, extra: *mut *mut c_void) {
        let c = inp(config.cast::<LaunchConfig>())?;
        let _ = (c.attrs, c.num_attrs);
        launch(kernel(f, c.grid, c.block, c.shared, params, extra), c.stream)
    }

    fn cuFuncSetBlockShape(f: usize, x: c_int, y: c_int, z: c_int) {
        let dim = |n: c_int| c_uint::try_from(n).map_err(|_| CUDA_ERROR_INVALID_VALUE);
        let block = [dim(x)?, dim(y)?, dim(z)?];
        crate::model::launch_shape::set(f, |s| s.block = block)
    }

    fn cuFuncSetSharedSize(f: usize, bytes: c_uint) {
        crate::model::launch_shape::set(f, |s| s.shared = bytes)
    }

    fn cuParamSetSize(f: usize, bytes: c_uint) {
        let _ = bytes;
        param(f, 0)
    }

    fn cuParamSeti(f: usize, offset: c_int, value: c_uint) {
        let _ = value;
        param(f, offset)
    }

    fn cuParamSetf(f: usize, offset: c_int, value: f32) {
        let _ = value;
        param(f, offset)
    }

    fn cuParamSetv(f: usize, offset: c_int, ptr: *const c_void, bytes: c_uint) {
        if ptr.is_null() && bytes > 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        param(f, offset)
    }

    fn cuLaunch(f: usize) {
        launch_shaped(f, 1, 1, 0)
    }

    fn cuLaunchGrid(f: usize, w: c_int, h: c_int) {
        launch_shaped(f, w, h, 0)
    }

    fn cuLaunchGridAsync(f: usize, w: c_int, h: c_int, hstream: usize) {
        launch_shaped(f, w, h, hstream)
    }

    fn cuOccupancyMaxActiveBlocksPerMultiprocessor(num_blocks: *mut c_int, func: usize, block_size: c_int, dyn_smem: usize) {
        cfg()?;
        let _ = dyn_smem;
        module::launchable(func)?;
        out(num_blocks, blocks_per_sm(block_size)?)
    }

    fn cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(num_blocks: *mut c_int, func: usize, block_size: c_int, dyn_smem: usize, flags: c_uint) {
        cfg()?;
        let _ = (dyn_smem, flags);
        module::launchable(func)?;
        out(num_blocks, blocks_per_sm(block_size)?)
    }

    fn cuOccupancyMaxPotentialBlockSize(min_grid: *mut c_int, block_size: *mut c_int, func: usize, smem_fn: *mut c_void, dyn_smem: usize, limit: c_int) {
        cfg()?;
        let _ = (smem_fn, dyn_smem);
        potential_block_size(min_grid, block_size, func, limit)
    }

    fn cuOccupancyMaxPotentialBlockSizeWithFlags(min_grid: *mut c_int, block_size: *mut c_int, func: usize, smem_fn: *mut c_void, dyn_smem: usize, limit: c_int, flags: c_uint) {
        cfg()?;
        let _ = (smem_fn, dyn_smem, flags);
        potential_block_size(min_grid, block_size, func, limit)
    }

    // The clusters of the config's size that fit on the fake's 132 multiprocessors at
    // once, each holding blocks_per_sm blocks of the config's block size (cuBLAS asks at
    // cublasCreate).
    fn cuOccupancyMaxActiveClusters(num_clusters: *mut c_int, func: usize, config: *const c_void) {
        cfg()?;
        module::launchable(func)?;
        let (c, blocks) = cluster_blocks(config)?;
        let threads = c.block.iter().map(|&b| b as u64).product::<u64>();
        let per_sm = blocks_per_sm(c_int::try_from(threads).map_err(|_| CUDA_ERROR_INVALID_VALUE)?)?;
        note(|| format!("cluster of {blocks} blocks"));
        out(num_clusters, per_sm * 132 / blocks)
    }

    // The portable maximum (8 blocks): the fake's functions allow no non-portable size.
    fn cuOccupancyMaxPotentialClusterSize(cluster_size: *mut c_int, func: usize, config: *const c_void) {
        cfg()?;
        module::launchable(func)?;
        inp(config.cast::<LaunchConfig>())?;
        out(cluster_size, PORTABLE_CLUSTER_SIZE)
    }

    fn cuOccupancyAvailableDynamicSMemPerBlock(dyn_smem: *mut usize, func: usize, num_blocks: c_int, block_size: c_int) {
        cfg()?;
        let _ = (num_blocks, block_size);
        module::launchable(func)?;
        out(dyn_smem, 232_448)
    }
}
