//! CUDA graphs as far as their memory goes (see `model::graph`): graphs of memory alloc and
//! free nodes, of kernel nodes (which run nothing) and of memcpy and memset nodes (which copy
//! and fill when the graph is launched), their executable graphs (instantiate,
//! upload, launch, destroy), the nodes' queries, and each device's graph memory
//! (attributes, trim). Stream capture is in `api/stream.rs` and `api/pool.rs`.

use crate::abi::types::{
    CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT, CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH,
    CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT, CU_GRAPH_MEM_ATTR_USED_MEM_HIGH,
    CU_MEM_ALLOCATION_TYPE_PINNED, CU_MEM_LOCATION_TYPE_DEVICE, CU_MEMORYTYPE_DEVICE,
    CU_MEMORYTYPE_HOST, CU_MEMORYTYPE_UNIFIED, CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD, CUdeviceptr,
    CudaGraphInstantiateParams, CudaKernelNodeParams, CudaKernelNodeParamsV1,
    CudaMemAllocNodeParams, CudaMemcpy3d, CudaMemsetNodeParams, Memcpy3dSide,
};
use crate::abi::{
    CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_NOT_SUPPORTED, CUresult, CuResult, inp, note, out,
};
use crate::model::address::check_range;
use crate::model::ctx::{current, device_of};
use crate::model::device::{cfg, check_dev};
use crate::model::graph::{self, Copy1d, KernelNode, Memset, Node};
use crate::model::{module, stream};
use libc::{c_char, c_int, c_uint, c_void};

/// Instantiation flags the driver knows: AUTO_FREE_ON_LAUNCH, UPLOAD, DEVICE_LAUNCH,
/// USE_NODE_PRIORITY.
const INSTANTIATE_FLAGS: u64 = 0xF;

/// The dependencies of a new node: `n` nodes of `graph` (NULL only for none).
fn check_deps(graph: usize, deps: *const usize, n: usize) -> CuResult {
    if deps.is_null() && n > 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let nodes = graph::nodes(graph)?;
    for i in 0..n {
        // SAFETY: the caller passes an array of `n` node handles.
        let d = inp(unsafe { deps.add(i) })?;
        if !nodes.contains(&d) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
    }
    Ok(())
}

/// A kernel node: its kernel (`func`, else `kern`), grid and block checked as a launch's
/// are, in the current context (the fake's kernels belong to no context: a `ctx` given
/// with `kern` is not checked); the parameters are kept as given (the node runs nothing,
/// `cuGraphKernelNodeGetParams` returns them). Parameters given both as `kernelParams` and
/// `extra` are CUDA_ERROR_INVALID_VALUE (`cuda.h`).
pub(crate) fn add_kernel_node(
    ph: *mut usize,
    graph: usize,
    deps: *const usize,
    n: usize,
    p: CudaKernelNodeParams,
) -> CuResult {
    if ph.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    check_deps(graph, deps, n)?;
    let (f, local) = kernel_of(p)?;
    let node = graph::add_kernel(
        graph,
        KernelNode {
            local,
            ..kernel_node(&p)
        },
    )?;
    note(|| format!("node={node:#x} {}", function_name(f)));
    out(ph, node)
}

/// The function a kernel node's parameters launch, checked as a launch's, in the current
/// context (see [`add_kernel_node`]), and the local memory its threads take.
fn kernel_of(p: CudaKernelNodeParams) -> Result<(usize, u64), CUresult> {
    let (ctx, dev) = current()?;
    let k = p.v1;
    if !k.kernel_params.is_null() && !k.extra.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let f = module::launchable(if k.func != 0 { k.func } else { p.kern })?;
    module::check_dims(k.grid, k.block)?;
    let local = module::use_in_context(f, ctx, dev)?;
    Ok((f, local))
}

/// What a kernel node keeps of its parameters (all of them).
fn kernel_node(p: &CudaKernelNodeParams) -> KernelNode {
    let k = &p.v1;
    KernelNode {
        func: k.func,
        grid: k.grid,
        block: k.block,
        shared_mem_bytes: k.shared_mem_bytes,
        kernel_params: k.kernel_params as usize,
        extra: k.extra as usize,
        kern: p.kern,
        ctx: p.ctx,
        local: 0,
    }
}

/// A kernel node's parameters as `cuGraphKernelNodeGetParams_v2` returns them: as the node
/// was made with them.
fn kernel_params(node: usize) -> Result<CudaKernelNodeParams, CUresult> {
    cfg()?;
    let Node::Kernel(k) = graph::node(node)? else {
        return Err(CUDA_ERROR_INVALID_VALUE);
    };
    Ok(CudaKernelNodeParams {
        v1: CudaKernelNodeParamsV1 {
            func: k.func,
            grid: k.grid,
            block: k.block,
            shared_mem_bytes: k.shared_mem_bytes,
            kernel_params: k.kernel_params as *mut *mut c_void,
            extra: k.extra as *mut *mut c_void,
        },
        kern: k.kern,
        ctx: k.ctx,
    })
}

fn function_name(f: usize) -> String {
    module::get_function(f).map(|f| f.name).unwrap_or_default()
}

/// A graph's kernel node given new parameters (`cuGraphKernelNodeSetParams`,
/// `cuGraphNodeSetParams`): its new kernel loaded into the current context as at a node's
/// making ([`add_kernel_node`]); not a kernel node: CUDA_ERROR_INVALID_VALUE.
pub(crate) fn set_kernel_node(node: usize, p: CudaKernelNodeParams) -> CuResult {
    cfg()?;
    let Node::Kernel(_) = graph::node(node)? else {
        return Err(CUDA_ERROR_INVALID_VALUE);
    };
    let (f, local) = kernel_of(p)?;
    graph::set_node(
        node,
        Node::Kernel(KernelNode {
            local,
            ..kernel_node(&p)
        }),
    )?;
    note(|| function_name(f));
    Ok(())
}

/// An update of a kernel node in an executable graph: the node one of the kernel nodes of
/// the graph it was instantiated from, the new parameters valid as a new node's. Nothing
/// is kept (the node runs nothing).
pub(crate) fn set_exec_kernel(exec: usize, node: usize, p: CudaKernelNodeParams) -> CuResult {
    graph::exec_kernel(exec, node)?;
    let (f, _) = kernel_of(p)?;
    note(|| function_name(f));
    Ok(())
}

/// One side of a memcpy node's CUDA_MEMCPY3D as an address: host, device or unified
/// memory at X bytes (CUDA arrays, and rows or slices beyond the first, are
/// CUDA_ERROR_NOT_SUPPORTED: the fake makes linear copies only); `reserved` must be NULL.
fn side(s: &Memcpy3dSide) -> Result<(u64, bool), CUresult> {
    if s.reserved != 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    if s.y != 0 || s.z != 0 {
        return Err(CUDA_ERROR_NOT_SUPPORTED);
    }
    let (base, device) = match s.memory_type {
        CU_MEMORYTYPE_HOST => (s.host as u64, false),
        CU_MEMORYTYPE_DEVICE | CU_MEMORYTYPE_UNIFIED => (s.device, true),
        3 => return Err(CUDA_ERROR_NOT_SUPPORTED), // CU_MEMORYTYPE_ARRAY
        _ => return Err(CUDA_ERROR_INVALID_VALUE),
    };
    let at = base
        .checked_add(s.x_in_bytes as u64)
        .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    Ok((at, device))
}

/// A memcpy node's copy: one row of `WidthInBytes` (a height and depth of 1), its device
/// ranges checked now as a copy's are; they are checked again when the node runs.
pub(crate) fn copy_of(p: &CudaMemcpy3d) -> Result<Copy1d, CUresult> {
    current()?;
    if p.height != 1 || p.depth != 1 {
        return Err(CUDA_ERROR_NOT_SUPPORTED);
    }
    let ((dst, dst_device), (src, src_device)) = (side(&p.dst)?, side(&p.src)?);
    let c = Copy1d {
        dst,
        dst_device,
        src,
        src_device,
        n: p.width_in_bytes,
    };
    check_copy(&c)?;
    Ok(c)
}

fn check_copy(c: &Copy1d) -> CuResult {
    if c.n == 0 {
        return Ok(());
    }
    if c.dst == 0 || c.src == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    if c.src_device {
        check_range(c.src, c.n, false)?;
    }
    if c.dst_device {
        check_range(c.dst, c.n, true)?;
    }
    Ok(())
}

/// Makes a memcpy node's copy (its graph launched).
fn run_copy(c: &Copy1d) -> CuResult {
    check_copy(c)?;
    super::copy::copy(c.dst as usize, c.src as usize, c.n)
}

/// A memset node's fill, checked now as a memset's arguments and range are (in the current
/// context); it is checked again when the node runs.
pub(crate) fn memset_of(p: *const CudaMemsetNodeParams) -> Result<Memset, CUresult> {
    current()?;
    let p = inp(p)?;
    let m = Memset {
        dst: p.dst,
        pitch: p.pitch,
        value: p.value,
        element_size: p.element_size,
        width: p.width,
        height: p.height,
    };
    super::copy::check_set(&m)?;
    Ok(m)
}

/// cuGraphInstantiate* in the current context: the exec, or the error.
fn instantiate(ph: *mut usize, graph: usize, flags: u64) -> CuResult {
    current()?;
    if ph.is_null() || flags & !INSTANTIATE_FLAGS != 0 || !graph::exists(graph) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let exec = graph::instantiate(graph, flags)?;
    note(|| format!("exec={exec:#x}"));
    out(ph, exec)
}

crate::abi::exports! {
    fn cuGraphCreate(ph: *mut usize, flags: c_uint) {
        cfg()?;
        if flags != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let g = graph::create();
        note(|| format!("graph={g:#x}"));
        out(ph, g)
    }

    fn cuGraphDestroy(graph: usize) {
        cfg()?;
        graph::destroy(graph)
    }

    // Device memory of the pool's device; its address is fixed now, its memory taken when
    // an exec of the graph is instantiated.
    fn cuGraphAddMemAllocNode(ph: *mut usize, graph: usize, deps: *const usize, n: usize, params: *mut CudaMemAllocNodeParams) {
        cfg()?;
        let p = inp(params)?;
        if ph.is_null() || p.bytesize == 0 || p.pool_props.handle_types != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        check_deps(graph, deps, n)?;
        let props = p.pool_props;
        if props.alloc_type != CU_MEM_ALLOCATION_TYPE_PINNED || props.location.type_ != CU_MEM_LOCATION_TYPE_DEVICE {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let dev = check_dev(props.location.id).map_err(|_| CUDA_ERROR_INVALID_VALUE)?;
        if p.access_desc_count > 0 && p.access_descs.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let mut access = Vec::with_capacity(p.access_desc_count);
        for i in 0..p.access_desc_count {
            // SAFETY: the caller passes an array of `access_desc_count` descriptors.
            let d = inp(unsafe { p.access_descs.add(i) })?;
            if d.location.type_ != CU_MEM_LOCATION_TYPE_DEVICE || check_dev(d.location.id).is_err() {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
            access.push(d);
        }
        let (node, dptr) = graph::add_alloc(graph, dev, p.bytesize as u64, props, access)?;
        note(|| format!("node={node:#x} dptr={dptr:#x}"));
        // SAFETY: `params` was read above (not NULL); its `dptr` field is the output.
        out(unsafe { std::ptr::addr_of_mut!((*params).dptr) }, dptr)?;
        out(ph, node)
    }

    // CUDA 12's layout (kern, ctx); XLA's command buffers (TensorFlow's jit-compiled
    // functions) build their graphs with it.
    fn cuGraphAddKernelNode_v2(ph: *mut usize, graph: usize, deps: *const usize, n: usize, params: *const CudaKernelNodeParams) {
        add_kernel_node(ph, graph, deps, n, inp(params)?)
    }

    // CUDA 10's layout: the function only.
    fn cuGraphAddKernelNode(ph: *mut usize, graph: usize, deps: *const usize, n: usize, params: *const CudaKernelNodeParamsV1) {
        let v1 = inp(params)?;
        add_kernel_node(ph, graph, deps, n, CudaKernelNodeParams { v1, kern: 0, ctx: 0 })
    }

    // The parameters the node was made with (by cuGraphAddKernelNode*, or by a launch on a
    // capturing stream); an update of an exec does not change them. cuDNN reads the kernel
    // nodes of a graph it captured. Not a kernel node: CUDA_ERROR_INVALID_VALUE.
    fn cuGraphKernelNodeGetParams_v2(node: usize, params: *mut CudaKernelNodeParams) {
        out(params, kernel_params(node)?)
    }

    // CUDA 10's layout: `func` is the function of a node made with a kernel (`kern`).
    fn cuGraphKernelNodeGetParams(node: usize, params: *mut CudaKernelNodeParamsV1) {
        let p = kernel_params(node)?;
        let func = if p.v1.func != 0 { p.v1.func } else { module::launchable(p.kern).unwrap_or(0) };
        out(params, CudaKernelNodeParamsV1 { func, ..p.v1 })
    }

    // A graph's kernel node given another kernel (its executable graphs keep theirs; an
    // exec updated from the graph, cuGraphExecUpdate, would take it).
    fn cuGraphKernelNodeSetParams_v2(node: usize, params: *const CudaKernelNodeParams) {
        set_kernel_node(node, inp(params)?)
    }

    fn cuGraphKernelNodeSetParams(node: usize, params: *const CudaKernelNodeParamsV1) {
        let v1 = inp(params)?;
        set_kernel_node(node, CudaKernelNodeParams { v1, kern: 0, ctx: 0 })
    }

    // XLA updates its command buffers' kernels between runs with it.
    fn cuGraphExecKernelNodeSetParams_v2(exec: usize, node: usize, params: *const CudaKernelNodeParams) {
        set_exec_kernel(exec, node, inp(params)?)
    }

    fn cuGraphExecKernelNodeSetParams(exec: usize, node: usize, params: *const CudaKernelNodeParamsV1) {
        let v1 = inp(params)?;
        set_exec_kernel(exec, node, CudaKernelNodeParams { v1, kern: 0, ctx: 0 })
    }

    // A linear copy between host and device memory (XLA's command buffers add
    // device-to-device ones); `ctx` is the context it runs in (the fake checks the current).
    fn cuGraphAddMemcpyNode(ph: *mut usize, graph: usize, deps: *const usize, n: usize, params: *const CudaMemcpy3d, ctx: usize) {
        let _ = ctx;
        if ph.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        check_deps(graph, deps, n)?;
        let c = copy_of(&inp(params)?)?;
        let node = graph::add_memcpy(graph, c)?;
        note(|| format!("node={node:#x} {} bytes", c.n));
        out(ph, node)
    }

    fn cuGraphExecMemcpyNodeSetParams(exec: usize, node: usize, params: *const CudaMemcpy3d, ctx: usize) {
        let _ = ctx;
        let c = copy_of(&inp(params)?)?;
        graph::set_exec_work(exec, node, Node::Memcpy(c))
    }

    // A fill of device memory (CUDA_MEMSET_NODE_PARAMS: an element size of 1, 2 or 4
    // bytes, as `cuda.h` requires); `ctx` is the context it runs in (the fake checks the
    // current one).
    fn cuGraphAddMemsetNode(ph: *mut usize, graph: usize, deps: *const usize, n: usize, params: *const CudaMemsetNodeParams, ctx: usize) {
        let _ = ctx;
        if ph.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        check_deps(graph, deps, n)?;
        let m = memset_of(params)?;
        let node = graph::add_memset(graph, m)?;
        note(|| format!("node={node:#x} {} x {} bytes", m.width, m.element_size));
        out(ph, node)
    }

    // What the node was made with (an update of an exec does not change it).
    fn cuGraphMemsetNodeGetParams(node: usize, params: *mut CudaMemsetNodeParams) {
        cfg()?;
        let Node::Memset(m) = graph::node(node)? else {
            return Err(CUDA_ERROR_INVALID_VALUE);
        };
        out(params, CudaMemsetNodeParams {
            dst: m.dst,
            pitch: m.pitch,
            value: m.value,
            element_size: m.element_size,
            width: m.width,
            height: m.height,
        })
    }

    fn cuGraphExecMemsetNodeSetParams(exec: usize, node: usize, params: *const CudaMemsetNodeParams, ctx: usize) {
        let _ = ctx;
        let m = memset_of(params)?;
        graph::set_exec_work(exec, node, Node::Memset(m))
    }

    fn cuGraphAddMemFreeNode(ph: *mut usize, graph: usize, deps: *const usize, n: usize, dptr: CUdeviceptr) {
        cfg()?;
        if ph.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        check_deps(graph, deps, n)?;
        out(ph, graph::add_free(graph, dptr)?)
    }

    // NULL `nodes`: the count. Else up to `*count` nodes, the rest of the array NULL, and
    // `*count` the number written.
    // FAKECUDA_GRAPH_NODES_FAIL=1: a graph whose nodes cannot be listed.
    fn cuGraphGetNodes(graph: usize, nodes: *mut usize, count: *mut usize) {
        if cfg()?.graph_nodes_fail {
            return Err(CUDA_ERROR_NOT_SUPPORTED);
        }
        let all = graph::nodes(graph)?;
        if nodes.is_null() {
            return out(count, all.len());
        }
        let room = inp(count)?;
        for i in 0..room {
            // SAFETY: the caller passes an array of `*count` node handles.
            out(unsafe { nodes.add(i) }, all.get(i).copied().unwrap_or(0))?;
        }
        out(count, room.min(all.len()))
    }

    fn cuGraphNodeGetType(node: usize, t: *mut c_int) {
        cfg()?;
        out(t, graph::node(node)?.type_code())
    }

    // The access descriptors returned are the node's (valid while it lives).
    fn cuGraphMemAllocNodeGetParams(node: usize, params: *mut CudaMemAllocNodeParams) {
        cfg()?;
        let Node::Alloc(a) = graph::node(node)? else {
            return Err(CUDA_ERROR_INVALID_VALUE);
        };
        out(params, CudaMemAllocNodeParams {
            pool_props: a.props,
            access_descs: graph::access_of(node),
            access_desc_count: a.access.len(),
            bytesize: a.size as usize,
            dptr: a.dptr,
        })
    }

    fn cuGraphMemFreeNodeGetParams(node: usize, dptr: *mut CUdeviceptr) {
        cfg()?;
        let Node::Free(p) = graph::node(node)? else {
            return Err(CUDA_ERROR_INVALID_VALUE);
        };
        out(dptr, p)
    }

    // CUDA 10.0 and 11.0: (exec, graph, error node, log buffer, its size).
    fn cuGraphInstantiate | cuGraphInstantiate_v2 (ph: *mut usize, graph: usize, err_node: *mut usize, log: *mut c_char, size: usize) {
        let _ = (err_node, log, size);
        instantiate(ph, graph, 0)
    }

    fn cuGraphInstantiateWithFlags(ph: *mut usize, graph: usize, flags: u64) {
        if flags & CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE); // only with params (an upload stream)
        }
        instantiate(ph, graph, flags)
    }

    fn cuGraphInstantiateWithParams | cuGraphInstantiateWithParams_ptsz (ph: *mut usize, graph: usize, params: *mut CudaGraphInstantiateParams) {
        let p = inp(params)?;
        if p.flags & CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD != 0 {
            stream::check(p.upload_stream)?;
        }
        let rc = instantiate(ph, graph, p.flags);
        // CUgraphInstantiateResult: SUCCESS (0) or ERROR (1); no error node.
        // SAFETY: `params` was read above (not NULL); these fields are its outputs.
        unsafe {
            out(std::ptr::addr_of_mut!((*params).result_out), rc.is_err() as c_int)?;
            out(std::ptr::addr_of_mut!((*params).err_node_out), 0)?;
        }
        rc
    }

    fn cuGraphUpload | cuGraphUpload_ptsz (exec: usize, stream: usize) {
        stream::check(stream)?;
        graph::upload(exec)
    }

    // Kernels run nothing; memcpy and memset nodes copy and fill, in the order they were
    // added (the first that fails ends the launch with its error).
    fn cuGraphLaunch | cuGraphLaunch_ptsz (exec: usize, stream: usize) {
        stream::check(stream)?;
        for work in graph::launch(exec)? {
            match work {
                Node::Memcpy(c) => run_copy(&c)?,
                Node::Memset(m) => super::copy::set(&m)?,
                // Its threads' local memory: the context's stack grows to it, as at a launch.
                Node::Kernel(k) if k.local > 0 => {
                    let ctx = if k.ctx != 0 { k.ctx } else { current()?.0 };
                    crate::model::limit::grow_stack(ctx, device_of(ctx)?, k.local)?;
                }
                _ => {}
            }
        }
        if crate::model::limit::late_limit_raised() {
            // A raised heap is taken in each context its kernels run in, as at a launch.
            for ctx in graph::kernel_contexts(exec)? {
                let ctx = if ctx != 0 { ctx } else { current()?.0 };
                crate::model::limit::take_late_limits(ctx, device_of(ctx)?)?;
            }
        }
        Ok(())
    }

    fn cuGraphExecDestroy(exec: usize) {
        cfg()?;
        graph::exec_destroy(exec)
    }

    // USED/RESERVED_MEM_CURRENT/HIGH (0..3) of the device's graph memory.
    // PyTorch's cudaMallocAsync backend reads them.
    fn cuDeviceGetGraphMemAttribute(dev: c_int, attr: c_int, value: *mut u64) {
        let p = graph::pool(check_dev(dev)?);
        let v = match attr {
            CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT => p.used,
            CU_GRAPH_MEM_ATTR_USED_MEM_HIGH => p.used_high,
            CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT => p.reserved,
            CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH => p.reserved_high,
            _ => return Err(CUDA_ERROR_INVALID_VALUE),
        };
        out(value, v)
    }

    // Only the high-water marks (1, 3) may be reset, to 0: to the current figure.
    fn cuDeviceSetGraphMemAttribute(dev: c_int, attr: c_int, value: *mut u64) {
        let d = check_dev(dev)?;
        if attr != CU_GRAPH_MEM_ATTR_USED_MEM_HIGH && attr != CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH || inp(value)? != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        graph::reset_high(d, attr == CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH);
        Ok(())
    }

    fn cuDeviceGraphMemTrim(dev: c_int) {
        graph::trim(check_dev(dev)?);
        Ok(())
    }
}
