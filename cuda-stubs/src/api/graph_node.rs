//! CUDA 12.2's generic graph node calls: `cuGraphAddNode` (and `_v2`, `_v3`, which take
//! edge data), `cuGraphNodeSetParams` (`_v2`) and `cuGraphExecNodeSetParams`, given a
//! `CUgraphNodeParams` (the node's type and that type's own parameter struct): a kernel,
//! memcpy, memset, memory allocation or memory free node is made or changed as by its own
//! call (`graph.rs`); another type is `CUDA_ERROR_NOT_SUPPORTED`, as the fake's own calls
//! for those are stubs.

use std::ptr::addr_of_mut;

use crate::abi::types::{CUdeviceptr, CUgraphNodeParams, CudaKernelNodeParams};
use crate::abi::{CUDA_ERROR_NOT_SUPPORTED, CUDA_SUCCESS, CUresult, CuResult, inp, note};
use crate::api::graph::{
    add_kernel_node, copy_of, cuGraphAddMemAllocNode, cuGraphAddMemFreeNode, cuGraphAddMemcpyNode,
    cuGraphAddMemsetNode, cuGraphExecMemcpyNodeSetParams, cuGraphExecMemsetNodeSetParams,
    memset_of, set_exec_kernel, set_kernel_node,
};
use crate::model::graph::{self, Node};
use libc::c_void;

/// CUgraphNodeType values the fake makes.
const KERNEL: i32 = 0;
const MEMCPY: i32 = 1;
const MEMSET: i32 = 2;
const MEM_ALLOC: i32 = 10;
const MEM_FREE: i32 = 11;

/// The driver's answer as the exports' result.
fn rc(r: CUresult) -> CuResult {
    if r == CUDA_SUCCESS { Ok(()) } else { Err(r) }
}

/// The union of `params`, where the type's own struct lies, as `u64` words (a memcpy's
/// `CUDA_MEMCPY3D` follows its flags and context, two words in; a memset's context follows
/// its six fields: word 5).
fn union_of(params: *mut CUgraphNodeParams) -> *mut u64 {
    // SAFETY: only the address is taken; the caller checked `params` is not NULL.
    unsafe { addr_of_mut!((*params).params) }.cast::<u64>()
}

/// The word `i` of the union, read.
fn word(params: *mut CUgraphNodeParams, i: usize) -> Result<u64, CUresult> {
    // SAFETY: `i` < 29, inside the caller's 232-byte union.
    inp(unsafe { union_of(params).add(i) })
}

/// A node made from `params` in `graph` after `deps` (n of them).
fn add_node(
    ph: *mut usize,
    graph: usize,
    deps: *const usize,
    n: usize,
    params: *mut CUgraphNodeParams,
) -> CuResult {
    let p = inp(params)?;
    let u = union_of(params);
    note(|| format!("type {}", p.type_));
    // SAFETY (each call): the union holds the type's own parameter struct, read by the call
    // made for that type; a context or flags word is read from where the header puts it.
    unsafe {
        match p.type_ {
            KERNEL => add_kernel_node(ph, graph, deps, n, inp(u.cast::<CudaKernelNodeParams>())?),
            MEMCPY => {
                let ctx = word(params, 1)? as usize;
                rc(cuGraphAddMemcpyNode(
                    ph,
                    graph,
                    deps,
                    n,
                    u.add(2).cast(),
                    ctx,
                ))
            }
            MEMSET => {
                let ctx = word(params, 5)? as usize;
                rc(cuGraphAddMemsetNode(ph, graph, deps, n, u.cast(), ctx))
            }
            MEM_ALLOC => rc(cuGraphAddMemAllocNode(ph, graph, deps, n, u.cast())),
            MEM_FREE => {
                let dptr: CUdeviceptr = word(params, 0)?;
                rc(cuGraphAddMemFreeNode(ph, graph, deps, n, dptr))
            }
            _ => Err(CUDA_ERROR_NOT_SUPPORTED),
        }
    }
}

crate::abi::exports! {
    fn cuGraphAddNode(ph: *mut usize, graph: usize, deps: *const usize, n: usize, params: *mut CUgraphNodeParams) {
        add_node(ph, graph, deps, n, params)
    }

    // The edge data (CUDA 12.3's edge types and ports) is taken as the default edges.
    fn cuGraphAddNode_v2 | cuGraphAddNode_v3 (ph: *mut usize, graph: usize, deps: *const usize, edges: *const c_void, n: usize, params: *mut CUgraphNodeParams) {
        let _ = edges;
        add_node(ph, graph, deps, n, params)
    }

    // A graph's kernel, memcpy or memset node given new parameters (`_v2`: CUDA 13.4's name
    // for the same call).
    fn cuGraphNodeSetParams | cuGraphNodeSetParams_v2 (node: usize, params: *mut CUgraphNodeParams) {
        let p = inp(params)?;
        let u = union_of(params);
        match p.type_ {
            KERNEL => set_kernel_node(node, inp(u.cast::<CudaKernelNodeParams>())?),
            // SAFETY: a memcpy node's CUDA_MEMCPY3D lies two words into the union.
            MEMCPY => graph::set_node(node, Node::Memcpy(copy_of(&inp(unsafe { u.add(2) }.cast())?)?)),
            MEMSET => graph::set_node(node, Node::Memset(memset_of(u.cast())?)),
            _ => Err(CUDA_ERROR_NOT_SUPPORTED),
        }
    }

    // An executable graph's kernel, memcpy or memset node given new parameters.
    fn cuGraphExecNodeSetParams(exec: usize, node: usize, params: *mut CUgraphNodeParams) {
        let p = inp(params)?;
        let u = union_of(params);
        // SAFETY: as in `add_node`.
        unsafe {
            match p.type_ {
                KERNEL => set_exec_kernel(exec, node, inp(u.cast::<CudaKernelNodeParams>())?),
                MEMCPY => {
                    let ctx = word(params, 1)? as usize;
                    rc(cuGraphExecMemcpyNodeSetParams(exec, node, u.add(2).cast(), ctx))
                }
                MEMSET => {
                    let ctx = word(params, 5)? as usize;
                    rc(cuGraphExecMemsetNodeSetParams(exec, node, u.cast(), ctx))
                }
                _ => Err(CUDA_ERROR_NOT_SUPPORTED),
            }
        }
    }
}
