//! Unit tests of graph nodes and stream capture (memset and memcpy nodes, what a capturing
//! stream records, kernel nodes' parameters), calling the exports directly. The graph
//! memory and launch tests are in `module_tests.rs`.

use std::ptr::{null, null_mut};

use crate::abi::types::{CU_GRAPH_NODE_TYPE_MEMSET, CudaMemsetNodeParams};
use crate::abi::{CUDA_ERROR_INVALID_VALUE, CUDA_SUCCESS};
use crate::api::copy::cuMemcpyDtoH_v2;
use crate::api::graph::{
    cuGraphAddMemsetNode, cuGraphCreate, cuGraphDestroy, cuGraphExecDestroy,
    cuGraphExecMemsetNodeSetParams, cuGraphInstantiateWithFlags, cuGraphLaunch,
    cuGraphMemsetNodeGetParams, cuGraphNodeGetType,
};
use crate::api::memory::{cuMemAlloc_v2, cuMemFree_v2};
use crate::api_tests::setup;

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
