//! Unit tests of graph nodes and stream capture (memset and memcpy nodes, what a capturing
//! stream records, kernel nodes' parameters), calling the exports directly. The graph
//! memory and launch tests are in `module_tests.rs`.

use std::ffi::c_void;
use std::ptr::{null, null_mut};

use crate::abi::types::{
    CU_GRAPH_NODE_TYPE_KERNEL, CU_GRAPH_NODE_TYPE_MEMCPY, CU_GRAPH_NODE_TYPE_MEMSET,
    CU_MEM_ALLOCATION_TYPE_PINNED, CU_MEM_LOCATION_TYPE_DEVICE, CUgraphNodeParams,
    CudaKernelNodeParams, CudaKernelNodeParamsV1, CudaMemAllocNodeParams, CudaMemsetNodeParams,
};
use crate::abi::{CUDA_ERROR_INVALID_HANDLE, CUDA_ERROR_INVALID_VALUE, CUDA_SUCCESS};
use crate::api::copy::{
    cuMemcpyAsync, cuMemcpyDtoDAsync_v2, cuMemcpyDtoH_v2, cuMemcpyDtoHAsync_v2_ptsz,
    cuMemcpyHtoD_v2, cuMemcpyHtoDAsync_v2, cuMemcpyPeerAsync, cuMemsetD2D16Async, cuMemsetD8Async,
    cuMemsetD8Async_ptsz, cuMemsetD32Async,
};
use crate::api::graph::{
    cuGraphAddKernelNode, cuGraphAddKernelNode_v2, cuGraphAddMemsetNode, cuGraphCreate,
    cuGraphDestroy, cuGraphExecDestroy, cuGraphExecKernelNodeSetParams_v2,
    cuGraphExecMemsetNodeSetParams, cuGraphGetNodes, cuGraphInstantiateWithFlags,
    cuGraphKernelNodeGetParams, cuGraphKernelNodeGetParams_v2, cuGraphLaunch,
    cuGraphMemsetNodeGetParams, cuGraphNodeGetType,
};
use crate::api::launch::{LaunchConfig, cuLaunchKernel, cuLaunchKernelEx};
use crate::api::memory::{cuMemAlloc_v2, cuMemFree_v2};
use crate::api::module::{cuKernelGetFunction, cuLibraryGetKernel, cuLibraryUnload};
use crate::api::stream::{
    cuStreamBeginCapture_v2, cuStreamCreate, cuStreamDestroy_v2, cuStreamEndCapture,
    cuStreamSynchronize,
};
use crate::api_tests::setup;
use crate::image::build_elf;
use crate::module_tests::load_library;

/// `n` bytes of device memory at `p`, read back.
fn back(p: u64, n: usize) -> Vec<u8> {
    let mut v = vec![0u8; n];
    // SAFETY: a buffer of `n` bytes.
    assert_eq!(
        unsafe { cuMemcpyDtoH_v2(v.as_mut_ptr().cast(), p, n) },
        CUDA_SUCCESS
    );
    v
}

/// The nodes of `graph` and their types.
fn nodes_of(graph: usize) -> Vec<(usize, i32)> {
    let mut n = 0usize;
    // SAFETY (both calls): valid pointers to locals and a buffer of `n` handles.
    assert_eq!(
        unsafe { cuGraphGetNodes(graph, null_mut(), &mut n) },
        CUDA_SUCCESS
    );
    let mut nodes = vec![0usize; n];
    assert_eq!(
        unsafe { cuGraphGetNodes(graph, nodes.as_mut_ptr(), &mut n) },
        CUDA_SUCCESS
    );
    nodes
        .into_iter()
        .map(|h| {
            let mut t = -1;
            // SAFETY: a valid pointer to a local.
            assert_eq!(unsafe { cuGraphNodeGetType(h, &mut t) }, CUDA_SUCCESS);
            (h, t)
        })
        .collect()
}

fn memset(dst: u64, value: u32, element_size: u32, width: usize) -> CudaMemsetNodeParams {
    CudaMemsetNodeParams {
        dst,
        pitch: 0,
        value,
        element_size,
        width,
        height: 1,
    }
}

/// cuGraphAddMemsetNode: a fill checked as a memset's arguments are (elementSize 1, 2 or 4),
/// made when the graph is launched, as an update of the exec last set it; the node keeps
/// what it was made with.
#[test]
fn memset_nodes_fill_when_the_graph_is_launched() {
    let _g = setup();
    // SAFETY (all calls): valid pointers to locals, as a C caller would pass.
    unsafe {
        let mut a = 0u64;
        assert_eq!(cuMemAlloc_v2(&mut a, 4096), CUDA_SUCCESS);
        let mut g = 0usize;
        assert_eq!(cuGraphCreate(&mut g, 0), CUDA_SUCCESS);
        // Four rows of 16 words, 256 bytes apart.
        let rows = CudaMemsetNodeParams {
            dst: a,
            pitch: 256,
            value: 0xdead_beef,
            element_size: 4,
            width: 16,
            height: 4,
        };
        let mut node = 0usize;
        assert_eq!(
            cuGraphAddMemsetNode(&mut node, g, null(), 0, &rows, 0),
            CUDA_SUCCESS
        );
        let mut t = -1;
        assert_eq!(cuGraphNodeGetType(node, &mut t), CUDA_SUCCESS);
        assert_eq!(t, CU_GRAPH_NODE_TYPE_MEMSET);
        let mut got = memset(0, 0, 0, 0);
        assert_eq!(cuGraphMemsetNodeGetParams(node, &mut got), CUDA_SUCCESS);
        assert_eq!(
            (
                got.dst,
                got.pitch,
                got.value,
                got.element_size,
                got.width,
                got.height
            ),
            (a, 256, 0xdead_beef, 4, 16, 4)
        );
        // Refused as the header says, or as a memset would be.
        let mut x = 0usize;
        for (p, why) in [
            (memset(a, 0, 3, 16), "an element size of 3"),
            (memset(a, 0, 8, 16), "an element size of 8"),
            (
                memset(a + 2, 0, 4, 16),
                "a word fill not aligned to its word",
            ),
            (memset(a, 0, 1, 4097), "beyond the allocation"),
            (memset(0x10, 0, 1, 16), "not device memory"),
        ] {
            assert_eq!(
                cuGraphAddMemsetNode(&mut x, g, null(), 0, &p, 0),
                CUDA_ERROR_INVALID_VALUE,
                "{why}"
            );
        }
        assert_eq!(
            cuGraphAddMemsetNode(null_mut(), g, null(), 0, &memset(a, 0, 1, 1), 0),
            CUDA_ERROR_INVALID_VALUE
        );
        assert_eq!(
            cuGraphMemsetNodeGetParams(0xdead, &mut got),
            CUDA_ERROR_INVALID_VALUE,
            "not a node"
        );
        let mut exec = 0usize;
        assert_eq!(cuGraphInstantiateWithFlags(&mut exec, g, 0), CUDA_SUCCESS);
        assert_eq!(
            back(a, 4096),
            vec![0u8; 4096],
            "nothing set before the launch"
        );
        assert_eq!(cuGraphLaunch(exec, 0), CUDA_SUCCESS);
        let mem = back(a, 4096);
        for r in 0..4 {
            let row = &mem[r * 256..r * 256 + 64];
            assert!(
                row.chunks(4).all(|w| w == 0xdead_beef_u32.to_ne_bytes()),
                "row {r}"
            );
            assert!(mem[r * 256 + 64..(r + 1) * 256].iter().all(|&b| b == 0));
        }
        // Updated in the exec: bytes of 0x5a (the value's low byte) at the end.
        assert_eq!(
            cuGraphExecMemsetNodeSetParams(exec, node, &memset(a + 4000, 0x15a, 1, 96), 0),
            CUDA_SUCCESS
        );
        assert_eq!(cuGraphLaunch(exec, 0), CUDA_SUCCESS);
        assert_eq!(back(a + 4000, 96), vec![0x5a; 96]);
        assert_eq!(cuGraphMemsetNodeGetParams(node, &mut got), CUDA_SUCCESS);
        assert_eq!(got.value, 0xdead_beef, "the graph's node is unchanged");
        for (n, p, why) in [
            (node, memset(a, 0, 2, 4097), "beyond the allocation"),
            (
                0xdead,
                memset(a, 0, 1, 16),
                "not a node of the exec's graph",
            ),
        ] {
            assert_eq!(
                cuGraphExecMemsetNodeSetParams(exec, n, &p, 0),
                CUDA_ERROR_INVALID_VALUE,
                "{why}"
            );
        }
        // Its memory freed, the fill is refused when the graph runs.
        assert_eq!(cuMemFree_v2(a), CUDA_SUCCESS);
        assert_eq!(cuGraphLaunch(exec, 0), CUDA_ERROR_INVALID_VALUE);
        assert_eq!(cuGraphExecDestroy(exec), CUDA_SUCCESS);
        assert_eq!(cuGraphDestroy(g), CUDA_SUCCESS);
    }
}

/// cuDNN and cuBLAS capture a stream with a memset of 128 bytes to a placeholder address: a
/// real driver records it (the fake refused it with CUDA_ERROR_INVALID_VALUE, running it at
/// once). It is a memset node now; the range is checked when the graph is launched.
#[test]
fn a_captured_memset_is_a_node_checked_when_the_graph_runs() {
    let _g = setup();
    const PLACEHOLDER: u64 = 0x2848a0;
    // SAFETY (all calls): valid pointers to locals, as a C caller would pass.
    unsafe {
        let mut s = 0usize;
        assert_eq!(cuStreamCreate(&mut s, 1), CUDA_SUCCESS);
        assert_eq!(
            cuMemsetD8Async(PLACEHOLDER, 0, 128, s),
            CUDA_ERROR_INVALID_VALUE,
            "not capturing: done at once, and refused"
        );
        assert_eq!(cuStreamBeginCapture_v2(s, 0), CUDA_SUCCESS);
        assert_eq!(cuMemsetD8Async(PLACEHOLDER, 0, 128, s), CUDA_SUCCESS);
        assert_eq!(
            cuMemsetD8Async(PLACEHOLDER, 0, 128, 0xdead),
            CUDA_ERROR_INVALID_HANDLE,
            "an invalid stream, as ever"
        );
        let mut graph = 0usize;
        assert_eq!(cuStreamEndCapture(s, &mut graph), CUDA_SUCCESS);
        let nodes = nodes_of(graph);
        assert_eq!(nodes.len(), 1);
        assert_eq!(nodes[0].1, CU_GRAPH_NODE_TYPE_MEMSET);
        let mut p = memset(0, 7, 0, 0);
        assert_eq!(cuGraphMemsetNodeGetParams(nodes[0].0, &mut p), CUDA_SUCCESS);
        assert_eq!(
            (p.dst, p.value, p.element_size, p.width, p.height),
            (PLACEHOLDER, 0, 1, 128, 1)
        );
        let mut exec = 0usize;
        assert_eq!(
            cuGraphInstantiateWithFlags(&mut exec, graph, 0),
            CUDA_SUCCESS
        );
        assert_eq!(
            cuGraphLaunch(exec, 0),
            CUDA_ERROR_INVALID_VALUE,
            "not device memory, found when the fill is made"
        );
        assert_eq!(cuGraphExecDestroy(exec), CUDA_SUCCESS);
        assert_eq!(cuGraphDestroy(graph), CUDA_SUCCESS);
        assert_eq!(cuStreamDestroy_v2(s), CUDA_SUCCESS);
    }
}

/// Async copies and memsets on a capturing stream are recorded in order and made, real
/// bytes, when the graph is launched; on another stream they are done at once.
#[test]
fn captured_copies_and_memsets_run_when_the_graph_is_launched() {
    let _g = setup();
    const N: usize = 4096;
    // SAFETY (all calls): valid pointers to locals and buffers of N bytes.
    unsafe {
        let (mut a, mut b, mut c, mut d) = (0u64, 0u64, 0u64, 0u64);
        for p in [&mut a, &mut b, &mut c, &mut d] {
            assert_eq!(cuMemAlloc_v2(p, N), CUDA_SUCCESS);
        }
        let bytes: Vec<u8> = (0..N as u32).map(|i| (i * 13 % 251) as u8).collect();
        let other_bytes: Vec<u8> = bytes.iter().map(|b| b ^ 0xff).collect();
        assert_eq!(cuMemcpyHtoD_v2(a, bytes.as_ptr().cast(), N), CUDA_SUCCESS);
        let (mut s, mut other) = (0usize, 0usize);
        assert_eq!(cuStreamCreate(&mut s, 1), CUDA_SUCCESS);
        assert_eq!(cuStreamCreate(&mut other, 1), CUDA_SUCCESS);
        let mut host = vec![0u8; N];
        assert_eq!(cuStreamBeginCapture_v2(s, 2), CUDA_SUCCESS);
        // a -> host, then a filled with words; other_bytes -> b -> c (peer) -> d (unified).
        assert_eq!(
            cuMemcpyDtoHAsync_v2_ptsz(host.as_mut_ptr().cast(), a, N, s),
            CUDA_SUCCESS
        );
        assert_eq!(cuMemsetD32Async(a, 0x0102_0304, N / 4, s), CUDA_SUCCESS);
        assert_eq!(
            cuMemcpyHtoDAsync_v2(b, other_bytes.as_ptr().cast(), N, s),
            CUDA_SUCCESS
        );
        assert_eq!(cuMemcpyPeerAsync(c, 0, b, 0, N, s), CUDA_SUCCESS);
        assert_eq!(cuMemcpyAsync(d, c, N, s), CUDA_SUCCESS);
        // Rows of 16 halves, 512 bytes apart, then one byte over the first.
        assert_eq!(cuMemsetD2D16Async(d, 512, 0xabcd, 16, 8, s), CUDA_SUCCESS);
        assert_eq!(cuMemsetD8Async_ptsz(d, 0x11, 1, s), CUDA_SUCCESS);
        assert_eq!(cuMemcpyDtoDAsync_v2(b, a, 8, s), CUDA_SUCCESS);
        // Another stream does its work at once.
        assert_eq!(
            cuMemsetD8Async(c + N as u64 - 1, 0x77, 1, other),
            CUDA_SUCCESS
        );
        assert_eq!(back(c + N as u64 - 1, 1), [0x77]);
        let mut graph = 0usize;
        assert_eq!(cuStreamEndCapture(s, &mut graph), CUDA_SUCCESS);
        let (copy, set) = (CU_GRAPH_NODE_TYPE_MEMCPY, CU_GRAPH_NODE_TYPE_MEMSET);
        let types: Vec<i32> = nodes_of(graph).into_iter().map(|(_, t)| t).collect();
        assert_eq!(types, [copy, set, copy, copy, copy, set, set, copy]);
        let mut exec = 0usize;
        assert_eq!(
            cuGraphInstantiateWithFlags(&mut exec, graph, 0),
            CUDA_SUCCESS
        );
        assert_eq!(host, vec![0u8; N], "nothing copied before the launch");
        assert_eq!(back(a, N), bytes, "nothing set before the launch");
        assert_eq!(back(b, N), vec![0u8; N]);
        assert_eq!(cuGraphLaunch(exec, 0), CUDA_SUCCESS);
        assert_eq!(host, bytes, "copied before the memset that follows it");
        let words: Vec<u8> = 0x0102_0304_u32.to_ne_bytes().repeat(N / 4);
        assert_eq!(back(a, N), words);
        assert_eq!(back(b, N)[..8], words[..8]);
        assert_eq!(back(b, N)[8..], other_bytes[8..]);
        assert_eq!(
            back(c, N),
            other_bytes,
            "the other stream's byte overwritten"
        );
        let mut want = other_bytes.clone();
        for r in 0..8 {
            let row = &mut want[r * 512..r * 512 + 32];
            row.copy_from_slice(&0xabcd_u16.to_ne_bytes().repeat(16));
        }
        want[0] = 0x11;
        assert_eq!(back(d, N), want);
        // A device range freed since is refused when the graph runs again.
        assert_eq!(cuMemFree_v2(c), CUDA_SUCCESS);
        assert_eq!(cuGraphLaunch(exec, 0), CUDA_ERROR_INVALID_VALUE);
        assert_eq!(cuGraphExecDestroy(exec), CUDA_SUCCESS);
        assert_eq!(cuGraphDestroy(graph), CUDA_SUCCESS);
        for p in [a, b, d] {
            assert_eq!(cuMemFree_v2(p), CUDA_SUCCESS);
        }
        for st in [s, other] {
            assert_eq!(cuStreamDestroy_v2(st), CUDA_SUCCESS);
        }
    }
}

/// The fields of a kernel node's parameters, comparable.
type Fields = (usize, [u32; 3], [u32; 3], u32, usize, usize, usize, usize);

fn fields(p: &CudaKernelNodeParams) -> Fields {
    let k = &p.v1;
    let (params, extra) = (k.kernel_params as usize, k.extra as usize);
    (
        k.func,
        k.grid,
        k.block,
        k.shared_mem_bytes,
        params,
        extra,
        p.kern,
        p.ctx,
    )
}

/// A kernel node's parameters (CUDA 12's layout): function `func` or kernel `kern`,
/// `grid` blocks of `block` threads, `shared` bytes of shared memory, no arguments, no
/// context. Also `module_tests`' kernel-node test.
pub(crate) fn kernel_params(
    func: usize,
    kern: usize,
    grid: [u32; 3],
    block: [u32; 3],
    shared: u32,
) -> CudaKernelNodeParams {
    CudaKernelNodeParams {
        v1: CudaKernelNodeParamsV1 {
            func,
            grid,
            block,
            shared_mem_bytes: shared,
            kernel_params: null_mut(),
            extra: null_mut(),
        },
        kern,
        ctx: 0,
    }
}

/// cuDNN reads the kernel nodes of a graph it captured (cuGraphKernelNodeGetParams_v2, a
/// stub until now): a kernel node returns the parameters it was made with, by
/// cuGraphAddKernelNode(_v2) or by a launch on a capturing stream; another node is
/// CUDA_ERROR_INVALID_VALUE.
#[test]
fn kernel_nodes_return_the_parameters_they_were_made_with() {
    let (_g, ctx) = setup();
    let elf = build_elf(&["read_back"], &[]);
    let mut args = [null_mut::<c_void>(); 2];
    let mut extra = [null_mut::<c_void>(); 3];
    let params = |func, kern, shared| kernel_params(func, kern, [4, 2, 1], [128, 1, 1], shared);
    // SAFETY (all calls): valid pointers to locals, as a C caller would pass.
    unsafe {
        let lib = load_library(&elf);
        let (mut k, mut f) = (0, 0);
        assert_eq!(
            cuLibraryGetKernel(&mut k, lib, c"read_back".as_ptr()),
            CUDA_SUCCESS
        );
        assert_eq!(cuKernelGetFunction(&mut f, k), CUDA_SUCCESS);
        let mut g = 0usize;
        assert_eq!(cuGraphCreate(&mut g, 0), CUDA_SUCCESS);
        // A function with arguments; a kernel in a context with extra; CUDA 10's layout.
        let mut with_args = params(f, 0, 256);
        with_args.v1.kernel_params = args.as_mut_ptr();
        let mut with_extra = params(0, k, 0);
        with_extra.v1.extra = extra.as_mut_ptr();
        with_extra.ctx = ctx;
        let (mut a, mut b, mut c) = (0usize, 0usize, 0usize);
        assert_eq!(
            cuGraphAddKernelNode_v2(&mut a, g, null(), 0, &with_args),
            CUDA_SUCCESS
        );
        assert_eq!(
            cuGraphAddKernelNode_v2(&mut b, g, null(), 0, &with_extra),
            CUDA_SUCCESS
        );
        assert_eq!(
            cuGraphAddKernelNode(&mut c, g, null(), 0, &params(f, 0, 64).v1),
            CUDA_SUCCESS
        );
        let get = |node: usize| {
            let mut p = params(7, 7, 7);
            assert_eq!(cuGraphKernelNodeGetParams_v2(node, &mut p), CUDA_SUCCESS);
            fields(&p)
        };
        assert_eq!(get(a), fields(&with_args));
        assert_eq!(get(b), fields(&with_extra));
        assert_eq!(get(c), fields(&params(f, 0, 64)));
        let mut v1 = params(7, 0, 7).v1;
        assert_eq!(cuGraphKernelNodeGetParams(a, &mut v1), CUDA_SUCCESS);
        assert_eq!((v1.func, v1.shared_mem_bytes), (f, 256));
        assert_eq!(v1.kernel_params, args.as_mut_ptr());
        assert_eq!(cuGraphKernelNodeGetParams(b, &mut v1), CUDA_SUCCESS);
        assert_eq!(v1.func, f, "CUDA 10's layout: the kernel's function");
        assert_eq!(v1.extra, extra.as_mut_ptr());
        // An update of an exec leaves the graph's node as it was.
        let mut exec = 0usize;
        assert_eq!(cuGraphInstantiateWithFlags(&mut exec, g, 0), CUDA_SUCCESS);
        assert_eq!(
            cuGraphExecKernelNodeSetParams_v2(exec, a, &params(f, 0, 0)),
            CUDA_SUCCESS
        );
        assert_eq!(get(a), fields(&with_args));
        assert_eq!(cuGraphExecDestroy(exec), CUDA_SUCCESS);
        // Launches on a capturing stream: their parameters, in the launch's context.
        let mut s = 0usize;
        assert_eq!(cuStreamCreate(&mut s, 1), CUDA_SUCCESS);
        assert_eq!(cuStreamBeginCapture_v2(s, 0), CUDA_SUCCESS);
        assert_eq!(
            cuLaunchKernel(k, 3, 1, 1, 64, 2, 1, 512, s, args.as_mut_ptr(), null_mut()),
            CUDA_SUCCESS
        );
        let config = LaunchConfig {
            grid: [8, 1, 1],
            block: [32, 1, 1],
            shared: 1024,
            stream: s,
            attrs: null_mut(),
            num_attrs: 0,
        };
        assert_eq!(
            cuLaunchKernelEx(
                (&raw const config).cast(),
                f,
                null_mut(),
                extra.as_mut_ptr()
            ),
            CUDA_SUCCESS
        );
        let mut captured = 0usize;
        assert_eq!(cuStreamEndCapture(s, &mut captured), CUDA_SUCCESS);
        let nodes = nodes_of(captured);
        assert!(nodes.iter().all(|&(_, t)| t == CU_GRAPH_NODE_TYPE_KERNEL));
        let args_at = args.as_mut_ptr() as usize;
        let extra_at = extra.as_mut_ptr() as usize;
        assert_eq!(
            get(nodes[0].0),
            (k, [3, 1, 1], [64, 2, 1], 512, args_at, 0, 0, ctx),
            "the handle the launch was given"
        );
        assert_eq!(
            get(nodes[1].0),
            (f, [8, 1, 1], [32, 1, 1], 1024, 0, extra_at, 0, ctx)
        );
        // Not a kernel node, or no node.
        let mut m = 0u64;
        assert_eq!(cuMemAlloc_v2(&mut m, 64), CUDA_SUCCESS);
        let mut set = 0usize;
        assert_eq!(
            cuGraphAddMemsetNode(&mut set, g, null(), 0, &memset(m, 0, 1, 64), 0),
            CUDA_SUCCESS
        );
        let mut p = params(0, 0, 0);
        for node in [set, 0xdead] {
            assert_eq!(
                cuGraphKernelNodeGetParams_v2(node, &mut p),
                CUDA_ERROR_INVALID_VALUE
            );
            assert_eq!(
                cuGraphKernelNodeGetParams(node, &mut p.v1),
                CUDA_ERROR_INVALID_VALUE
            );
        }
        assert_eq!(
            cuGraphKernelNodeGetParams_v2(a, null_mut()),
            CUDA_ERROR_INVALID_VALUE
        );
        assert_eq!(cuMemFree_v2(m), CUDA_SUCCESS);
        for gr in [g, captured] {
            assert_eq!(cuGraphDestroy(gr), CUDA_SUCCESS);
        }
        assert_eq!(cuStreamDestroy_v2(s), CUDA_SUCCESS);
        assert_eq!(cuLibraryUnload(lib), CUDA_SUCCESS);
    }
}

/// `value` laid into a `CUgraphNodeParams` of type `ty` (its union's first bytes).
fn generic<T: Copy>(ty: i32, value: T) -> CUgraphNodeParams {
    // SAFETY: CUgraphNodeParams is plain data; all zeros is a valid value.
    let mut p: CUgraphNodeParams = unsafe { std::mem::zeroed() };
    p.type_ = ty;
    assert!(std::mem::size_of::<T>() <= std::mem::size_of_val(&p.params));
    // SAFETY: `T` fits in the union (checked), which is 8-byte aligned.
    unsafe { std::ptr::addr_of_mut!(p.params).cast::<T>().write(value) };
    p
}

/// CUDA 12.2's generic node calls make a kernel, memset, memory allocation or free node as
/// their own calls do (the allocation's address written back into the parameters), change
/// a graph's node (as `cuGraphKernelNodeSetParams` does a kernel node) and an executable
/// graph's kernel or memset node; another node type is not supported.
#[test]
fn generic_node_calls_make_and_change_nodes_as_their_own_calls_do() {
    let _g = setup();
    use crate::api::graph::cuGraphKernelNodeSetParams_v2;
    use crate::api::graph_node::{
        cuGraphAddNode, cuGraphAddNode_v2, cuGraphExecNodeSetParams, cuGraphNodeSetParams,
    };
    let elf = build_elf(&["generic_kernel"], &[]);
    // SAFETY (all calls): valid pointers to locals, as a C caller would pass.
    unsafe {
        let lib = load_library(&elf);
        let mut k = 0usize;
        assert_eq!(
            cuLibraryGetKernel(&mut k, lib, c"generic_kernel".as_ptr()),
            CUDA_SUCCESS
        );
        let mut a = 0u64;
        assert_eq!(cuMemAlloc_v2(&mut a, 4096), CUDA_SUCCESS);
        let mut g = 0usize;
        assert_eq!(cuGraphCreate(&mut g, 0), CUDA_SUCCESS);
        // SAFETY: plain data; zeros are valid.
        let mut kp: CudaKernelNodeParams = std::mem::zeroed();
        kp.kern = k;
        kp.v1.grid = [1, 1, 1];
        kp.v1.block = [32, 1, 1];
        let (mut kn, mut sn, mut an, mut fnode) = (0usize, 0usize, 0usize, 0usize);
        let mut kernel = generic(0, kp);
        assert_eq!(
            cuGraphAddNode(&mut kn, g, null(), 0, &mut kernel),
            CUDA_SUCCESS
        );
        let mut set = generic(2, memset(a, 7, 1, 64));
        assert_eq!(
            cuGraphAddNode_v2(&mut sn, g, &kn, null(), 1, &mut set),
            CUDA_SUCCESS
        );
        // SAFETY: plain data; zeros are valid.
        let mut ap: CudaMemAllocNodeParams = std::mem::zeroed();
        ap.pool_props.alloc_type = CU_MEM_ALLOCATION_TYPE_PINNED;
        ap.pool_props.location.type_ = CU_MEM_LOCATION_TYPE_DEVICE;
        ap.bytesize = 2 << 20;
        let mut alloc = generic(10, ap);
        assert_eq!(cuGraphAddNode(&mut an, g, &sn, 1, &mut alloc), CUDA_SUCCESS);
        let written = std::ptr::addr_of!(alloc.params)
            .cast::<CudaMemAllocNodeParams>()
            .read();
        assert_ne!(written.dptr, 0, "the allocation's address written back");
        let mut free = generic(11, written.dptr);
        assert_eq!(
            cuGraphAddNode(&mut fnode, g, &an, 1, &mut free),
            CUDA_SUCCESS
        );
        let types: Vec<i32> = nodes_of(g).into_iter().map(|(_, t)| t).collect();
        assert_eq!(types, vec![0, CU_GRAPH_NODE_TYPE_MEMSET, 10, 11]);
        let mut host = generic(3, 0u64);
        let mut x = 0usize;
        assert_eq!(
            cuGraphAddNode(&mut x, g, null(), 0, &mut host),
            crate::abi::CUDA_ERROR_NOT_SUPPORTED,
            "a host node"
        );
        // The graph's own nodes given new parameters: by the generic call and the kernel
        // node's own (a memset node is no kernel node).
        let mut set3 = generic(2, memset(a, 3, 1, 64));
        assert_eq!(cuGraphNodeSetParams(sn, &mut set3), CUDA_SUCCESS);
        let mut got = memset(0, 0, 0, 0);
        assert_eq!(cuGraphMemsetNodeGetParams(sn, &mut got), CUDA_SUCCESS);
        assert_eq!(got.value, 3);
        let mut kp2 = kp;
        kp2.v1.block = [64, 1, 1];
        assert_eq!(cuGraphKernelNodeSetParams_v2(kn, &kp2), CUDA_SUCCESS);
        let mut back_kp: CudaKernelNodeParams = std::mem::zeroed();
        assert_eq!(
            cuGraphKernelNodeGetParams_v2(kn, &mut back_kp),
            CUDA_SUCCESS
        );
        assert_eq!(back_kp.v1.block, [64, 1, 1]);
        assert_eq!(
            cuGraphKernelNodeSetParams_v2(sn, &kp2),
            CUDA_ERROR_INVALID_VALUE,
            "not a kernel node"
        );
        let mut exec = 0usize;
        assert_eq!(cuGraphInstantiateWithFlags(&mut exec, g, 0), CUDA_SUCCESS);
        let mut set2 = generic(2, memset(a, 9, 1, 64));
        assert_eq!(cuGraphExecNodeSetParams(exec, sn, &mut set2), CUDA_SUCCESS);
        assert_eq!(
            cuGraphExecNodeSetParams(exec, kn, &mut kernel),
            CUDA_SUCCESS
        );
        assert_eq!(cuGraphLaunch(exec, 0), CUDA_SUCCESS);
        assert_eq!(cuStreamSynchronize(0), CUDA_SUCCESS);
        assert_eq!(back(a, 64), vec![9u8; 64], "the exec's memset changed");
        assert_eq!(cuGraphExecDestroy(exec), CUDA_SUCCESS);
        assert_eq!(cuGraphDestroy(g), CUDA_SUCCESS);
        assert_eq!(cuMemFree_v2(a), CUDA_SUCCESS);
        assert_eq!(cuLibraryUnload(lib), CUDA_SUCCESS);
    }
}
