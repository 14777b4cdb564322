//! The nodes of a graph: what each kind holds (see `model::graph` for graphs, their
//! executable graphs and the graph memory pool).

use crate::abi::types::{
    CU_GRAPH_NODE_TYPE_KERNEL, CU_GRAPH_NODE_TYPE_MEM_ALLOC, CU_GRAPH_NODE_TYPE_MEM_FREE,
    CU_GRAPH_NODE_TYPE_MEMCPY, CU_GRAPH_NODE_TYPE_MEMSET, CUmemAccessDesc, CUmemPoolProps,
};

/// An alloc node's parameters (as `cuGraphMemAllocNodeGetParams` returns them).
#[derive(Debug, Clone)]
pub struct AllocNode {
    pub dev: usize,
    pub size: u64,
    pub dptr: u64,
    pub props: CUmemPoolProps,
    /// Owned by the node: `cuGraphMemAllocNodeGetParams` hands out their address.
    pub access: Vec<CUmemAccessDesc>,
}

/// A memcpy node's copy: `n` bytes from `src` to `dst`, each side device memory (checked
/// when the node runs) or host memory (the caller's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Copy1d {
    pub dst: u64,
    pub dst_device: bool,
    pub src: u64,
    pub src_device: bool,
    pub n: usize,
}

/// A kernel node's parameters, as it was made with them (CUDA_KERNEL_NODE_PARAMS_v2, as
/// `cuGraphKernelNodeGetParams_v2` returns them): the function or kernel, grid, block,
/// dynamic shared memory, the caller's `kernelParams` and `extra` pointers as given (the
/// fake copies no arguments: it does not know their sizes), `kern` and `ctx`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KernelNode {
    pub func: usize,
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub shared_mem_bytes: u32,
    pub kernel_params: usize,
    pub extra: usize,
    pub kern: usize,
    pub ctx: usize,
    /// The local memory each of its threads takes (`module::Function::local`): the graph's
    /// launch grows the context's stack to it, as a launch does.
    pub local: u64,
}

/// A memset node's fill: `width` elements of `element_size` bytes (1, 2 or 4) set to
/// `value` (its low bytes), in `height` rows `pitch` bytes apart (unused for one row), at
/// `dst` (device memory, checked when the node runs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Memset {
    pub dst: u64,
    pub pitch: usize,
    pub value: u32,
    pub element_size: u32,
    pub width: usize,
    pub height: usize,
}

#[derive(Debug, Clone)]
pub enum Node {
    Alloc(AllocNode),
    Free(u64),
    /// A kernel (added, or launched on a capturing stream; it takes no graph memory).
    Kernel(KernelNode),
    /// A linear copy, made when the graph is launched.
    Memcpy(Copy1d),
    /// A fill, made when the graph is launched.
    Memset(Memset),
}

impl Node {
    pub fn type_code(&self) -> i32 {
        match self {
            Node::Alloc(_) => CU_GRAPH_NODE_TYPE_MEM_ALLOC,
            Node::Free(_) => CU_GRAPH_NODE_TYPE_MEM_FREE,
            Node::Kernel(_) => CU_GRAPH_NODE_TYPE_KERNEL,
            Node::Memcpy(_) => CU_GRAPH_NODE_TYPE_MEMCPY,
            Node::Memset(_) => CU_GRAPH_NODE_TYPE_MEMSET,
        }
    }
}
