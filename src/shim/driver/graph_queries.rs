//! What the graph hooks ask the real driver (below the hooks): the alloc nodes of a graph,
//! its kernel nodes and the most local memory their threads take,
//! the device's graph memory figures, and whether a stream captures; and the shim's own
//! queries kept out of a capture's way (`relaxed`).

use std::ffi::{c_int, c_void};
use std::ptr::null_mut;

use super::calls;
use super::types::{
    CU_GRAPH_NODE_TYPE_GRAPH, CU_GRAPH_NODE_TYPE_KERNEL, CU_GRAPH_NODE_TYPE_MEM_ALLOC,
    CU_MEM_LOCATION_TYPE_DEVICE, CUDA_SUCCESS, Handle, KernelNodeParams, MemAllocNodeParams,
};

/// `CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT`, `CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT`.
const USED_MEM_CURRENT: c_int = 0;
const RESERVED_MEM_CURRENT: c_int = 2;

/// How deep child graphs are followed.
const MAX_DEPTH: u32 = 8;

/// The alloc nodes of `graph` and of its child graphs: (CUDA ordinal, bytes). None when
/// the driver cannot list them (the graph is invalid, or the driver has no graphs: its
/// own answer to the call follows).
pub fn graph_allocs(graph: Handle) -> Option<Vec<(usize, u64)>> {
    let mut out = Vec::new();
    visit(graph, 0, &mut |node, t| {
        if t == CU_GRAPH_NODE_TYPE_MEM_ALLOC {
            out.push(alloc_of(node)?);
        }
        Some(())
    })?;
    Some(out)
}

/// A kernel node's function (null where the node was made with a kernel handle), kernel
/// handle and context (null: the current one), as `cuGraphKernelNodeGetParams_v2` says.
#[derive(Clone, Copy)]
pub struct KernelNode {
    pub func: Handle,
    pub kern: Handle,
    pub ctx: Handle,
}

/// The kernel nodes of `graph` and of its child graphs whose parameters the driver gives
/// (none without `cuGraphKernelNodeGetParams_v2`, or where it cannot list the nodes).
pub fn graph_kernels(graph: Handle) -> Vec<KernelNode> {
    let Some(get) = calls::cuGraphKernelNodeGetParams_v2() else {
        return Vec::new();
    };
    let mut out = Vec::new();
    let _ = visit(graph, 0, &mut |node, t| {
        if t == CU_GRAPH_NODE_TYPE_KERNEL {
            // SAFETY: plain old data, all-zero is a valid value.
            let mut p: KernelNodeParams = unsafe { std::mem::zeroed() };
            // SAFETY: a kernel node the driver listed; `p` has the driver's layout.
            if unsafe { get(node, &mut p) } == CUDA_SUCCESS {
                out.push(KernelNode {
                    func: p.func,
                    kern: p.kern,
                    ctx: p.ctx,
                });
            }
        }
        Some(())
    });
    out
}

/// The most local memory a thread of any of `kernels` takes on `device`: a graph's
/// launch grows the context's stack to it, as a launch does. 0 where the driver does not
/// say.
pub fn max_local(kernels: &[KernelNode], device: c_int) -> u64 {
    kernels
        .iter()
        .map(|k| match k.func.is_null() {
            false => super::kernel_queries::local_size(k.func, None),
            true => super::kernel_queries::local_size(k.kern, Some(device)),
        })
        .max()
        .unwrap_or(0)
}

/// Calls `each` with every node of `graph` and its type, going into child graphs (to
/// [`MAX_DEPTH`]); None where the driver cannot list them or `each` says so.
fn visit(
    graph: Handle,
    depth: u32,
    each: &mut dyn FnMut(Handle, c_int) -> Option<()>,
) -> Option<()> {
    let get_nodes = calls::cuGraphGetNodes()?;
    let node_type = calls::cuGraphNodeGetType()?;
    let mut count = 0usize;
    // SAFETY: the driver writes the count through a valid out-pointer.
    if unsafe { get_nodes(graph, null_mut(), &mut count) } != CUDA_SUCCESS {
        return None;
    }
    let mut nodes: Vec<Handle> = vec![null_mut(); count];
    // SAFETY: room for `count` handles; the driver writes at most that many.
    if count > 0 && unsafe { get_nodes(graph, nodes.as_mut_ptr(), &mut count) } != CUDA_SUCCESS {
        return None;
    }
    nodes.truncate(count);
    for node in nodes {
        let mut t: c_int = -1;
        // SAFETY: a node the driver listed; valid out-pointer.
        if unsafe { node_type(node, &mut t) } != CUDA_SUCCESS {
            return None;
        }
        if t == CU_GRAPH_NODE_TYPE_GRAPH && depth < MAX_DEPTH {
            let child_of = calls::cuGraphChildGraphNodeGetGraph()?;
            let mut child: Handle = null_mut();
            // SAFETY: a child-graph node the driver listed; valid out-pointer.
            if unsafe { child_of(node, &mut child) } != CUDA_SUCCESS {
                return None;
            }
            visit(child, depth + 1, each)?;
        } else {
            each(node, t)?;
        }
    }
    Some(())
}

/// An alloc node's device and size.
fn alloc_of(node: Handle) -> Option<(usize, u64)> {
    let get = calls::cuGraphMemAllocNodeGetParams()?;
    // SAFETY: plain old data, all-zero is a valid value.
    let mut p: MemAllocNodeParams = unsafe { std::mem::zeroed() };
    // SAFETY: an alloc node the driver listed; `p` has the driver's layout.
    if unsafe { get(node, &mut p) } != CUDA_SUCCESS
        || p.pool_props.location_type != CU_MEM_LOCATION_TYPE_DEVICE
    {
        return None;
    }
    Some((
        usize::try_from(p.pool_props.location_id).ok()?,
        p.bytesize as u64,
    ))
}

/// The graph memory `device` holds reserved (`cuDeviceGetGraphMemAttribute`,
/// `RESERVED_MEM_CURRENT`); None if the driver does not answer.
pub fn graph_reserved(device: usize) -> Option<u64> {
    attribute(device, RESERVED_MEM_CURRENT)
}

/// The graph memory `device` holds reserved, and what live graph allocations use of it.
pub fn graph_figures(device: usize) -> Option<(u64, u64)> {
    Some((
        attribute(device, RESERVED_MEM_CURRENT)?,
        attribute(device, USED_MEM_CURRENT)?,
    ))
}

fn attribute(device: usize, attr: c_int) -> Option<u64> {
    let get = calls::cuDeviceGetGraphMemAttribute()?;
    let mut v = 0u64;
    let dev = c_int::try_from(device).ok()?;
    // SAFETY: the attribute is a 64-bit value written through a valid out-pointer.
    (unsafe { get(dev, attr, (&mut v as *mut u64).cast::<c_void>()) } == CUDA_SUCCESS).then_some(v)
}

/// Whether `stream` is capturing (work on it goes into a graph, not to the device).
pub fn capturing(stream: Handle) -> bool {
    let Some(is) = calls::cuStreamIsCapturing() else {
        return false;
    };
    let mut status: c_int = 0;
    // SAFETY: the caller's stream; valid out-pointer.
    unsafe { is(stream, &mut status) == CUDA_SUCCESS && status != 0 }
}

/// `CU_STREAM_CAPTURE_MODE_RELAXED`.
const CAPTURE_MODE_RELAXED: c_int = 2;

/// Runs `query`, a driver call the shim makes for itself (a measurement), with this
/// thread's stream capture mode relaxed, then sets the mode back: a capture under way
/// (this thread's, or another's begun in global mode) forbids "potentially unsafe" calls
/// and is invalidated by one (`cuThreadExchangeStreamCaptureMode`'s documentation; a
/// GPU-sharing shim's own `cuCtxSynchronize` inside a hook broke llama.cpp's CUDA graphs
/// so: nvshare issue 28), and a first launch inside a capture is measured there. Never
/// around the program's own call. A driver without the entry point: `query` as it is.
pub fn relaxed<T>(query: impl FnOnce() -> T) -> T {
    let Some(exchange) = calls::cuThreadExchangeStreamCaptureMode() else {
        return query();
    };
    let mut mode = CAPTURE_MODE_RELAXED;
    // SAFETY: a valid in-out pointer to a local mode.
    let swapped = unsafe { exchange(&mut mode) } == CUDA_SUCCESS;
    let out = query();
    if swapped {
        // SAFETY: as above; `mode` holds the thread's mode from before.
        let _ = unsafe { exchange(&mut mode) };
    }
    out
}
