//! Unit tests of the private export tables (cuGetExportTable) and of modules, libraries,
//! launches and the linker, calling the exports directly.

use std::ffi::c_void;
use std::ptr::{null, null_mut};

use crate::abi::{
    CUDA_ERROR_INVALID_CLUSTER_SIZE, CUDA_ERROR_INVALID_CONTEXT, CUDA_ERROR_INVALID_HANDLE,
    CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_NOT_FOUND, CUDA_SUCCESS, CUresult,
};
use crate::api::copy::{cuMemcpyDtoH_v2, cuMemcpyHtoD_v2};
use crate::api::export_tables::{Slot, TABLES, cuGetExportTable, stub_slots, uuid_text};
use crate::api::launch::{
    cuLaunchKernel, cuOccupancyMaxActiveClusters, cuOccupancyMaxPotentialClusterSize,
};
use crate::api::module::{
    cuFuncGetAttribute, cuFuncGetName, cuFuncSetAttribute, cuKernelGetFunction, cuLibraryGetGlobal,
    cuLibraryGetKernel, cuLibraryLoadData, cuLibraryUnload, cuLinkAddData_v2, cuLinkComplete,
    cuLinkCreate_v2, cuLinkDestroy, cuModuleGetFunction, cuModuleGetGlobal_v2, cuModuleLoadData,
    cuModuleLoadDataEx, cuModuleLoadFatBinary, cuModuleUnload,
};
use crate::api_tests::{setup, used};
use crate::image::build_elf;
use crate::image::tests::tiny_fatbin;

fn table(uuid: &str) -> (CUresult, *const usize) {
    let mut t: *const c_void = std::ptr::dangling::<c_void>();
    let mut id = [0u8; 16];
    let hex: String = uuid.chars().filter(|c| *c != '-').collect();
    for (i, b) in id.iter_mut().enumerate() {
        *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap();
    }
    // SAFETY: valid pointers to locals.
    let r = unsafe { cuGetExportTable(&mut t, &id) };
    (r, t.cast())
}

/// Reads word `i` of a table.
fn word(t: *const usize, i: usize) -> usize {
    // SAFETY: `t` is one of the fake's static tables, longer than `i`.
    unsafe { *t.add(i) }
}

#[test]
fn every_known_table_is_answered_with_its_size_and_functions() {
    let _g = setup();
    for t in &TABLES {
        let (r, words) = table(&uuid_text(&t.uuid));
        assert_eq!(r, CUDA_SUCCESS, "{}", t.name);
        assert!(!words.is_null());
        for (i, s) in t.slots.iter().enumerate() {
            let w = word(words, i);
            match s {
                Slot::Size => assert_eq!(w, t.slots.len() * 8, "{}[{i}]", t.name),
                Slot::SubSize(n) => assert_eq!(w, n * 8, "{}[{i}]", t.name),
                Slot::Null => assert_eq!(w, 0, "{}[{i}]", t.name),
                Slot::Fn(f) | Slot::Stub(f) => assert_eq!(w, *f as usize, "{}[{i}]", t.name),
            }
        }
    }
    // The tables cudart cannot start without.
    for must in [
        "6bd5fb6c-5bf4-e74a-8987-d93912fd9df9",
        "c693336e-1121-df11-a8c3-68f355d89593",
        "d4082055-bde6-704b-8d34-ba123c66e1f2",
    ] {
        assert_eq!(table(must).0, CUDA_SUCCESS, "{must}");
    }
}

#[test]
fn an_unknown_table_is_refused_with_null() {
    let _g = setup();
    let (r, t) = table("00000000-1111-2222-3333-444444444444");
    assert_eq!(r, CUDA_ERROR_INVALID_VALUE);
    assert!(t.is_null());
    // SAFETY: NULL output pointer: refused, nothing written.
    assert_eq!(
        unsafe { cuGetExportTable(null_mut(), null()) },
        CUDA_ERROR_INVALID_VALUE
    );
}

#[test]
fn export_table_listing_matches_the_build() {
    let (stubs, functions) = stub_slots();
    let stubs: Vec<&str> = stubs.iter().map(String::as_str).collect();
    fake_gpu::stubs_doc::check(
        std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/STUBS.md")),
        "cuGetExportTable",
        &stubs,
        functions,
    );
}

type ClsPut = unsafe extern "C" fn(
    usize,
    usize,
    usize,
    Option<unsafe extern "C" fn(usize, usize, usize)>,
) -> CUresult;
type ClsGet = unsafe extern "C" fn(*mut usize, usize, usize) -> CUresult;
type ClsDel = unsafe extern "C" fn(usize, usize) -> CUresult;
type Primary = unsafe extern "C" fn(*mut usize, i32) -> CUresult;

#[test]
fn context_local_storage_and_primary_context_slots() {
    let (_g, ctx) = setup();
    let (_, cls) = table("c693336e-1121-df11-a8c3-68f355d89593");
    let (_, rt) = table("6bd5fb6c-5bf4-e74a-8987-d93912fd9df9");
    // SAFETY: the slots hold functions of these signatures (export_tables/).
    unsafe {
        let put: ClsPut = std::mem::transmute(word(cls, 0));
        let del: ClsDel = std::mem::transmute(word(cls, 1));
        let get: ClsGet = std::mem::transmute(word(cls, 2));
        let mut v = 0usize;
        assert_eq!(
            get(&mut v, 0, 0x51),
            CUDA_ERROR_INVALID_HANDLE,
            "nothing stored yet"
        );
        assert_eq!(put(0, 0x51, 0xabc, None), CUDA_SUCCESS);
        assert_eq!(
            get(&mut v, ctx, 0x51),
            CUDA_SUCCESS,
            "NULL means the current context"
        );
        assert_eq!(v, 0xabc);
        assert_eq!(del(ctx, 0x51), CUDA_SUCCESS);
        assert_eq!(get(&mut v, 0, 0x51), CUDA_ERROR_INVALID_HANDLE);
        assert_eq!(
            put(0x1234, 1, 2, None),
            CUDA_ERROR_INVALID_CONTEXT,
            "not a context"
        );

        let primary: Primary = std::mem::transmute(word(rt, 2));
        let mut p = 0;
        assert_eq!(primary(&mut p, 0), CUDA_SUCCESS);
        assert_eq!(p, ctx, "the device's primary context");
        assert_eq!(primary(&mut p, 99), 101, "CUDA_ERROR_INVALID_DEVICE");
    }
}

type Integrity = unsafe extern "C" fn(u32, u64, *mut [u64; 2]) -> CUresult;

#[test]
fn integrity_slot_answers_the_hmac_of_this_process() {
    let _g = setup();
    let (_, t) = table("d4082055-bde6-704b-8d34-ba123c66e1f2");
    let (_, rt) = table("6bd5fb6c-5bf4-e74a-8987-d93912fd9df9");
    // SAFETY: slot 1 holds the integrity function.
    let f: Integrity = unsafe { std::mem::transmute(word(t, 1)) };
    let mut got = [0u64; 2];
    assert_eq!(unsafe { f(13022, 1_800_000_000, &mut got) }, CUDA_SUCCESS);
    let want = crate::integrity::check(
        &crate::integrity::CheckInput {
            driver_version: 13050,
            version: 13022,
            pid: std::process::id(),
            // SAFETY: no preconditions.
            thread: unsafe { libc::pthread_self() } as u32,
            cudart_table: rt as usize,
            integrity_table: t as usize,
            function: word(t, 1),
            unix_seconds: 1_800_000_000,
        },
        &[crate::integrity::CheckDevice {
            uuid: crate::model::device::uuid_v2(0),
            pci_domain: 0,
            pci_bus: 1,
            pci_device: 0,
        }],
    );
    assert_eq!(got, want);
    let mut other = [0u64; 2];
    assert_eq!(unsafe { f(13022, 1_800_000_001, &mut other) }, CUDA_SUCCESS);
    assert_ne!(other, got, "the time is part of it");
}

#[test]
fn modules_of_a_cubin_name_kernels_and_hold_real_globals() {
    let _g = setup();
    let elf = build_elf(&["vector_add"], &[("counter", 24)]);
    let before = used();
    unsafe {
        let mut m = 0;
        assert_eq!(cuModuleLoadData(&mut m, elf.as_ptr().cast()), CUDA_SUCCESS);
        assert_eq!(
            used() - before,
            24,
            "a module's globals are device memory from its load"
        );
        let mut f = 0;
        assert_eq!(
            cuModuleGetFunction(&mut f, m, c"vector_add".as_ptr()),
            CUDA_SUCCESS
        );
        let mut again = 0;
        assert_eq!(
            cuModuleGetFunction(&mut again, m, c"vector_add".as_ptr()),
            CUDA_SUCCESS
        );
        assert_eq!(f, again, "one handle per name");
        assert_eq!(
            cuModuleGetFunction(&mut again, m, c"nope".as_ptr()),
            CUDA_ERROR_NOT_FOUND
        );

        let (mut g, mut size) = (0u64, 0usize);
        assert_eq!(
            cuModuleGetGlobal_v2(&mut g, &mut size, m, c"counter".as_ptr()),
            CUDA_SUCCESS
        );
        assert_eq!(size, 24);
        assert_eq!(used() - before, 24, "the lookup allocates nothing more");
        let data = [7u8; 24];
        let mut back = [0u8; 24];
        assert_eq!(cuMemcpyHtoD_v2(g, data.as_ptr().cast(), 24), CUDA_SUCCESS);
        assert_eq!(
            cuMemcpyDtoH_v2(back.as_mut_ptr().cast(), g, 24),
            CUDA_SUCCESS
        );
        assert_eq!(back, data);
        assert_eq!(
            cuModuleGetGlobal_v2(&mut g, &mut size, m, c"missing".as_ptr()),
            CUDA_ERROR_NOT_FOUND
        );

        // Launches are no-ops on a valid handle and configuration.
        assert_eq!(
            cuLaunchKernel(f, 1, 1, 1, 256, 1, 1, 0, 0, null_mut(), null_mut()),
            CUDA_SUCCESS
        );
        assert_eq!(
            cuLaunchKernel(f, 0, 1, 1, 256, 1, 1, 0, 0, null_mut(), null_mut()),
            CUDA_ERROR_INVALID_VALUE
        );
        assert_eq!(
            cuLaunchKernel(f, 1, 1, 1, 2048, 1, 1, 0, 0, null_mut(), null_mut()),
            CUDA_ERROR_INVALID_VALUE
        );
        assert_eq!(
            cuLaunchKernel(0x99, 1, 1, 1, 1, 1, 1, 0, 0, null_mut(), null_mut()),
            CUDA_ERROR_INVALID_HANDLE
        );
        assert_eq!(
            cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, 0x77, null_mut(), null_mut()),
            CUDA_ERROR_INVALID_HANDLE,
            "bad stream"
        );
        let mut v = 0;
        assert_eq!(cuFuncGetAttribute(&mut v, 0, f), CUDA_SUCCESS);
        assert_eq!(v, 1024);
        assert_eq!(cuFuncSetAttribute(f, 8, 65536), CUDA_SUCCESS);
        assert_eq!(cuFuncGetAttribute(&mut v, 8, f), CUDA_SUCCESS);
        assert_eq!(v, 65536);

        assert_eq!(cuModuleUnload(m), CUDA_SUCCESS);
        assert_eq!(used(), before, "unloading frees the globals");
        assert_eq!(
            cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, 0, null_mut(), null_mut()),
            CUDA_ERROR_INVALID_HANDLE
        );
        assert_eq!(cuModuleUnload(m), CUDA_ERROR_INVALID_HANDLE);
    }
}

#[test]
fn ptx_fatbins_wrappers_and_garbage() {
    let _g = setup();
    unsafe {
        let mut m = 0;
        let mut f = 0;
        let ptx = c".version 8.0\n.target sm_90\n.visible .entry ptx_kernel(\n.param .u64 a\n)\n{\nret;\n}\n";
        assert_eq!(
            cuModuleLoadDataEx(&mut m, ptx.as_ptr().cast(), 0, null_mut(), null_mut()),
            CUDA_SUCCESS
        );
        assert_eq!(
            cuModuleGetFunction(&mut f, m, c"ptx_kernel".as_ptr()),
            CUDA_SUCCESS
        );

        let fb = tiny_fatbin(&[(2, build_elf(&["in_fatbin"], &[]), 0x11)]);
        assert_eq!(
            cuModuleLoadFatBinary(&mut m, fb.as_ptr().cast()),
            CUDA_SUCCESS
        );
        assert_eq!(
            cuModuleGetFunction(&mut f, m, c"in_fatbin".as_ptr()),
            CUDA_SUCCESS
        );
        assert_eq!(
            cuModuleGetFunction(&mut f, m, c"other".as_ptr()),
            CUDA_ERROR_NOT_FOUND
        );

        // A wrapper {magic, version, data, filename} as nvcc registers it.
        let wrapper: [u64; 3] = [0x0000_0001_4662_43B1, fb.as_ptr() as u64, 0];
        assert_eq!(
            cuModuleLoadData(&mut m, wrapper.as_ptr().cast()),
            CUDA_SUCCESS
        );
        assert_eq!(
            cuModuleGetFunction(&mut f, m, c"in_fatbin".as_ptr()),
            CUDA_SUCCESS
        );

        // A compressed entry: its names are unknown, any name is accepted.
        let z = tiny_fatbin(&[(2, vec![1, 2, 3, 4], 0x2011)]);
        assert_eq!(cuModuleLoadData(&mut m, z.as_ptr().cast()), CUDA_SUCCESS);
        assert_eq!(
            cuModuleGetFunction(&mut f, m, c"anything".as_ptr()),
            CUDA_SUCCESS
        );

        let garbage = [
            0x01u8, 0x02, 0x03, 0x04, 0x05, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
        ];
        assert_eq!(
            cuModuleLoadData(&mut m, garbage.as_ptr().cast()),
            200,
            "CUDA_ERROR_INVALID_IMAGE"
        );
    }
}

/// A library of `image` (no options), loaded.
pub(crate) unsafe fn load_library(image: &[u8]) -> usize {
    let mut lib = 0;
    // SAFETY: `image` is a whole image; no options.
    let rc = unsafe {
        cuLibraryLoadData(
            &mut lib,
            image.as_ptr().cast(),
            null_mut(),
            null_mut(),
            0,
            null_mut(),
            null_mut(),
            0,
        )
    };
    assert_eq!(rc, CUDA_SUCCESS);
    lib
}

#[test]
fn libraries_kernels_and_the_linker() {
    let _g = setup();
    let elf = build_elf(&["lib_kernel"], &[("lib_global", 8)]);
    unsafe {
        let lib = load_library(&elf);
        let mut k = 0;
        assert_eq!(
            cuLibraryGetKernel(&mut k, lib, c"lib_kernel".as_ptr()),
            CUDA_SUCCESS
        );
        assert_eq!(
            cuLibraryGetKernel(&mut k, lib, c"nope".as_ptr()),
            CUDA_ERROR_NOT_FOUND
        );
        assert_eq!(
            cuLibraryGetKernel(&mut k, lib, c"lib_kernel".as_ptr()),
            CUDA_SUCCESS
        );
        let mut f = 0;
        assert_eq!(cuKernelGetFunction(&mut f, k), CUDA_SUCCESS);
        assert_eq!(
            cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, 0, null_mut(), null_mut()),
            CUDA_SUCCESS
        );
        assert_eq!(
            cuLaunchKernel(k, 1, 1, 1, 1, 1, 1, 0, 0, null_mut(), null_mut()),
            CUDA_SUCCESS,
            "a kernel launches as a function"
        );
        let mut name: *const libc::c_char = null();
        assert_eq!(cuFuncGetName(&mut name, f), CUDA_SUCCESS);
        assert_eq!(
            std::ffi::CStr::from_ptr(name).to_str().unwrap(),
            "lib_kernel"
        );
        let (mut g, mut size) = (0u64, 0usize);
        assert_eq!(
            cuLibraryGetGlobal(&mut g, &mut size, lib, c"lib_global".as_ptr()),
            CUDA_SUCCESS
        );
        assert_eq!(size, 8);
        assert_eq!(cuLibraryUnload(lib), CUDA_SUCCESS);
        assert_eq!(cuKernelGetFunction(&mut f, k), CUDA_ERROR_INVALID_HANDLE);

        // The linker completes into an image naming what was added.
        let mut state = 0;
        assert_eq!(
            cuLinkCreate_v2(0, null_mut(), null_mut(), &mut state),
            CUDA_SUCCESS
        );
        let ptx = b".version 8.0\n.entry linked_a()\n{\n}\n";
        assert_eq!(
            cuLinkAddData_v2(
                state,
                1,
                ptx.as_ptr().cast(),
                ptx.len(),
                c"a.ptx".as_ptr(),
                0,
                null_mut(),
                null_mut()
            ),
            CUDA_SUCCESS
        );
        let cubin = build_elf(&["linked_b"], &[]);
        assert_eq!(
            cuLinkAddData_v2(
                state,
                3,
                cubin.as_ptr().cast(),
                cubin.len(),
                c"b.cubin".as_ptr(),
                0,
                null_mut(),
                null_mut()
            ),
            CUDA_SUCCESS
        );
        let (mut out, mut out_size): (*const c_void, usize) = (null(), 0);
        assert_eq!(cuLinkComplete(state, &mut out, &mut out_size), CUDA_SUCCESS);
        assert!(out_size > 0);
        let mut m = 0;
        assert_eq!(cuModuleLoadData(&mut m, out), CUDA_SUCCESS);
        for n in [c"linked_a", c"linked_b"] {
            assert_eq!(
                cuModuleGetFunction(&mut f, m, n.as_ptr()),
                CUDA_SUCCESS,
                "{n:?}"
            );
        }
        assert_eq!(cuLinkDestroy(state), CUDA_SUCCESS);
        assert_eq!(cuLinkDestroy(state), CUDA_ERROR_INVALID_HANDLE);
    }
}

/// A kernel launched on a capturing stream becomes a kernel node (PyTorch's
/// `torch.cuda.graph` warned "The CUDA Graph is empty" while launches ran at once); one
/// launched on another stream does not.
#[test]
fn launches_on_a_capturing_stream_are_kernel_nodes() {
    let _g = setup();
    use crate::api::graph::{
        cuGraphDestroy, cuGraphExecDestroy, cuGraphGetNodes, cuGraphInstantiateWithFlags,
        cuGraphLaunch, cuGraphNodeGetType,
    };
    use crate::api::stream::{
        cuStreamBeginCapture_v2, cuStreamCreate, cuStreamDestroy_v2, cuStreamEndCapture,
    };
    let elf = build_elf(&["captured_kernel"], &[]);
    unsafe {
        let lib = load_library(&elf);
        let (mut k, mut f) = (0, 0);
        assert_eq!(
            cuLibraryGetKernel(&mut k, lib, c"captured_kernel".as_ptr()),
            CUDA_SUCCESS
        );
        assert_eq!(cuKernelGetFunction(&mut f, k), CUDA_SUCCESS);
        let (mut s, mut other) = (0usize, 0usize);
        assert_eq!(cuStreamCreate(&mut s, 1), CUDA_SUCCESS);
        assert_eq!(cuStreamCreate(&mut other, 1), CUDA_SUCCESS);
        assert_eq!(cuStreamBeginCapture_v2(s, 2), CUDA_SUCCESS, "relaxed mode");
        for h in [k, f] {
            assert_eq!(
                cuLaunchKernel(h, 1, 1, 1, 32, 1, 1, 0, s, null_mut(), null_mut()),
                CUDA_SUCCESS
            );
        }
        assert_eq!(
            cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, other, null_mut(), null_mut()),
            CUDA_SUCCESS
        );
        let mut graph = 0usize;
        assert_eq!(cuStreamEndCapture(s, &mut graph), CUDA_SUCCESS);
        let mut n = 0usize;
        assert_eq!(cuGraphGetNodes(graph, null_mut(), &mut n), CUDA_SUCCESS);
        assert_eq!(n, 2, "the two launches on the capturing stream");
        let mut nodes = [0usize; 2];
        assert_eq!(
            cuGraphGetNodes(graph, nodes.as_mut_ptr(), &mut n),
            CUDA_SUCCESS
        );
        for node in nodes {
            let mut t = -1;
            assert_eq!(cuGraphNodeGetType(node, &mut t), CUDA_SUCCESS);
            assert_eq!(t, 0, "CU_GRAPH_NODE_TYPE_KERNEL");
        }
        let mut exec = 0usize;
        assert_eq!(
            cuGraphInstantiateWithFlags(&mut exec, graph, 0),
            CUDA_SUCCESS
        );
        assert_eq!(cuGraphLaunch(exec, 0), CUDA_SUCCESS);
        assert_eq!(
            cuGraphLaunch(exec, 0),
            CUDA_SUCCESS,
            "kernels hold no memory"
        );
        assert_eq!(cuGraphExecDestroy(exec), CUDA_SUCCESS);
        assert_eq!(cuGraphDestroy(graph), CUDA_SUCCESS);
        for st in [s, other] {
            assert_eq!(cuStreamDestroy_v2(st), CUDA_SUCCESS);
        }
        assert_eq!(cuLibraryUnload(lib), CUDA_SUCCESS);
    }
}

/// `cuLibraryGetManaged` answers for a library's `__managed__` variables only (PTX
/// `.attribute(.managed)`), loading the library into the current context as
/// `cuLibraryGetGlobal` does: the same variable by either call.
#[test]
fn a_librarys_managed_variable_is_found_by_cu_library_get_managed() {
    let _g = setup();
    use crate::api::module::cuLibraryGetManaged;
    let ptx = b".version 8.0\n.target sm_90\n.address_size 64\n\
                .global .attribute(.managed) .align 4 .u32 counter;\n.global .u64 plain;\n\0";
    unsafe {
        let lib = load_library(ptx);
        let (mut p, mut n) = (0u64, 0usize);
        assert_eq!(
            cuLibraryGetManaged(&mut p, &mut n, lib, c"plain".as_ptr()),
            CUDA_ERROR_NOT_FOUND,
            "a global that is not managed"
        );
        assert_eq!(
            cuLibraryGetManaged(&mut p, &mut n, lib, c"counter".as_ptr()),
            CUDA_SUCCESS
        );
        assert!(p != 0);
        assert_eq!(n, 4);
        let (mut q, mut m) = (0u64, 0usize);
        assert_eq!(
            cuLibraryGetGlobal(&mut q, &mut m, lib, c"counter".as_ptr()),
            CUDA_SUCCESS
        );
        assert_eq!((q, m), (p, n), "the library's one copy in this context");
        assert_eq!(
            cuLibraryGetManaged(null_mut(), &mut n, lib, c"counter".as_ptr()),
            CUDA_SUCCESS,
            "the pointer may be left out"
        );
        assert_eq!(
            cuLibraryGetManaged(&mut p, &mut n, 0xdead, c"counter".as_ptr()),
            CUDA_ERROR_INVALID_HANDLE
        );
        assert_eq!(cuLibraryUnload(lib), CUDA_SUCCESS);
    }
}

/// The deprecated launches take the block and shared memory set on the function before:
/// none set, the block is 0 x 0 x 0 and the launch is refused as `cuLaunchKernel` refuses
/// it; set, `cuLaunch`, `cuLaunchGrid` and `cuLaunchGridAsync` launch. The parameter calls
/// check the function and the offset.
#[test]
fn the_deprecated_launches_use_the_shape_set_on_the_function() {
    let _g = setup();
    use crate::api::launch::{
        cuFuncSetBlockShape, cuFuncSetSharedSize, cuLaunch, cuLaunchGrid, cuLaunchGridAsync,
        cuParamSetSize, cuParamSetf, cuParamSeti, cuParamSetv,
    };
    let elf = build_elf(&["old_kernel"], &[]);
    unsafe {
        let mut m = 0usize;
        assert_eq!(cuModuleLoadData(&mut m, elf.as_ptr().cast()), CUDA_SUCCESS);
        let mut f = 0usize;
        assert_eq!(
            cuModuleGetFunction(&mut f, m, c"old_kernel".as_ptr()),
            CUDA_SUCCESS
        );
        assert_eq!(cuLaunch(f), CUDA_ERROR_INVALID_VALUE, "no block shape set");
        assert_eq!(cuFuncSetBlockShape(f, 32, -1, 1), CUDA_ERROR_INVALID_VALUE);
        assert_eq!(cuFuncSetBlockShape(f, 32, 2, 1), CUDA_SUCCESS);
        assert_eq!(cuFuncSetSharedSize(f, 1024), CUDA_SUCCESS);
        let v = 5u32;
        assert_eq!(cuParamSeti(f, 0, 3), CUDA_SUCCESS);
        assert_eq!(cuParamSetf(f, 4, 1.5), CUDA_SUCCESS);
        assert_eq!(cuParamSetv(f, 8, (&raw const v).cast(), 4), CUDA_SUCCESS);
        assert_eq!(cuParamSetv(f, 8, null(), 4), CUDA_ERROR_INVALID_VALUE);
        assert_eq!(cuParamSeti(f, -4, 3), CUDA_ERROR_INVALID_VALUE);
        assert_eq!(cuParamSetSize(f, 12), CUDA_SUCCESS);
        assert_eq!(cuParamSetSize(0xdead, 12), CUDA_ERROR_INVALID_HANDLE);
        assert_eq!(
            cuFuncSetBlockShape(0xdead, 1, 1, 1),
            CUDA_ERROR_INVALID_HANDLE
        );
        assert_eq!(cuLaunch(f), CUDA_SUCCESS);
        assert_eq!(cuLaunchGrid(f, 4, 2), CUDA_SUCCESS);
        assert_eq!(
            cuLaunchGrid(f, 0, 2),
            CUDA_ERROR_INVALID_VALUE,
            "an empty grid"
        );
        assert_eq!(cuLaunchGrid(f, 4, -1), CUDA_ERROR_INVALID_VALUE);
        assert_eq!(cuLaunchGridAsync(f, 4, 2, 0), CUDA_SUCCESS);
        assert_eq!(cuLaunch(0xdead), CUDA_ERROR_INVALID_HANDLE);
        assert_eq!(
            cuFuncSetBlockShape(f, 2048, 1, 1),
            CUDA_SUCCESS,
            "checked at the launch"
        );
        assert_eq!(
            cuLaunch(f),
            CUDA_ERROR_INVALID_VALUE,
            "2,048 threads a block"
        );
        assert_eq!(cuModuleUnload(m), CUDA_SUCCESS);
    }
}

/// `cuLaunchCooperativeKernelMultiDevice` (deprecated since CUDA 11.3) checks every launch
/// first: a list, at most one launch a device, no default stream, known flags; then launches
/// each in its stream's context (here one device, a stream of its primary context).
#[test]
fn the_multi_device_launch_checks_each_launch_then_makes_it_in_its_streams_context() {
    let _g = setup();
    use crate::api::launch::{MultiDeviceLaunch, cuLaunchCooperativeKernelMultiDevice};
    use crate::api::stream::{cuStreamCreate, cuStreamDestroy_v2};
    let elf = build_elf(&["coop"], &[]);
    unsafe {
        let mut m = 0usize;
        assert_eq!(cuModuleLoadData(&mut m, elf.as_ptr().cast()), CUDA_SUCCESS);
        let mut f = 0usize;
        assert_eq!(
            cuModuleGetFunction(&mut f, m, c"coop".as_ptr()),
            CUDA_SUCCESS
        );
        let mut s = 0usize;
        assert_eq!(cuStreamCreate(&mut s, 1), CUDA_SUCCESS);
        let one = |stream: usize, block: u32| MultiDeviceLaunch {
            function: f,
            grid: [1, 1, 1],
            block: [block, 1, 1],
            shared: 0,
            stream,
            params: std::ptr::null_mut(),
        };
        let launch = |list: &[MultiDeviceLaunch], flags: u32| {
            cuLaunchCooperativeKernelMultiDevice(list.as_ptr(), list.len() as u32, flags)
        };
        assert_eq!(launch(&[one(s, 32)], 0), CUDA_SUCCESS);
        assert_eq!(launch(&[one(s, 32)], 3), CUDA_SUCCESS, "both sync flags");
        assert_eq!(launch(&[], 0), CUDA_ERROR_INVALID_VALUE, "no launch");
        assert_eq!(
            launch(&[one(s, 32)], 4),
            CUDA_ERROR_INVALID_VALUE,
            "an unknown flag"
        );
        assert_eq!(
            launch(&[one(0, 32)], 0),
            CUDA_ERROR_INVALID_VALUE,
            "the default stream"
        );
        assert_eq!(
            launch(&[one(s, 32), one(s, 32)], 0),
            CUDA_ERROR_INVALID_VALUE,
            "two launches on one device (of one)"
        );
        assert_eq!(
            launch(&[one(s, 2048)], 0),
            CUDA_ERROR_INVALID_VALUE,
            "2,048 threads a block"
        );
        assert_eq!(
            launch(&[one(0xdead, 32)], 0),
            CUDA_ERROR_INVALID_HANDLE,
            "no such stream"
        );
        assert_eq!(cuStreamDestroy_v2(s), CUDA_SUCCESS);
        assert_eq!(cuModuleUnload(m), CUDA_SUCCESS);
    }
}

/// XLA's command buffers (TensorFlow's jit-compiled steps) build graphs node by node
/// (cuGraphAddKernelNode_v2), instantiate and launch them, and update a kernel node of the
/// executable graph before a later launch (cuGraphExecKernelNodeSetParams_v2): Keras's
/// `fit` failed with "Failed to add kernel node to a CUDA graph" while these were stubs.
#[test]
fn kernel_nodes_are_added_and_updated_as_xla_does() {
    let _g = setup();
    use crate::api::graph::{
        cuGraphAddKernelNode, cuGraphAddKernelNode_v2, cuGraphCreate, cuGraphDestroy,
        cuGraphExecDestroy, cuGraphExecKernelNodeSetParams_v2, cuGraphGetNodes,
        cuGraphInstantiateWithFlags, cuGraphLaunch, cuGraphNodeGetType,
    };
    let elf = build_elf(&["node_kernel"], &[]);
    let params = |func, kern, grid, block| {
        crate::graph_tests::kernel_params(func, kern, [grid, 1, 1], [block, 1, 1], 0)
    };
    unsafe {
        let lib = load_library(&elf);
        let (mut k, mut f) = (0, 0);
        assert_eq!(
            cuLibraryGetKernel(&mut k, lib, c"node_kernel".as_ptr()),
            CUDA_SUCCESS
        );
        assert_eq!(cuKernelGetFunction(&mut f, k), CUDA_SUCCESS);
        let mut g = 0usize;
        assert_eq!(cuGraphCreate(&mut g, 0), CUDA_SUCCESS);
        // A function; a kernel (func NULL), after the first; the CUDA 10 layout.
        let (mut a, mut b, mut c) = (0usize, 0usize, 0usize);
        assert_eq!(
            cuGraphAddKernelNode_v2(&mut a, g, null(), 0, &params(f, 0, 4, 128)),
            CUDA_SUCCESS
        );
        assert_eq!(
            cuGraphAddKernelNode_v2(&mut b, g, &a, 1, &params(0, k, 4, 128)),
            CUDA_SUCCESS
        );
        assert_eq!(
            cuGraphAddKernelNode(&mut c, g, &b, 1, &params(f, 0, 1, 32).v1),
            CUDA_SUCCESS
        );
        let mut t = -1;
        assert_eq!(cuGraphNodeGetType(b, &mut t), CUDA_SUCCESS);
        assert_eq!(t, 0, "CU_GRAPH_NODE_TYPE_KERNEL");
        let mut n = 0usize;
        assert_eq!(cuGraphGetNodes(g, null_mut(), &mut n), CUDA_SUCCESS);
        assert_eq!(n, 3);
        // Refused as a launch would be, or as the header says.
        let mut x = 0usize;
        assert_eq!(
            cuGraphAddKernelNode_v2(&mut x, g, null(), 0, &params(0, 0, 4, 128)),
            CUDA_ERROR_INVALID_HANDLE,
            "no kernel, as a launch of a NULL function"
        );
        for (p, why) in [
            (params(f, 0, 0, 128), "an empty grid"),
            (params(f, 0, 4, 2048), "a block of more than 1024 threads"),
        ] {
            assert_eq!(
                cuGraphAddKernelNode_v2(&mut x, g, null(), 0, &p),
                CUDA_ERROR_INVALID_VALUE,
                "{why}"
            );
        }
        let mut both = params(f, 0, 4, 128);
        let mut buf = [null_mut::<c_void>(); 1];
        both.v1.kernel_params = buf.as_mut_ptr();
        both.v1.extra = buf.as_mut_ptr();
        assert_eq!(
            cuGraphAddKernelNode_v2(&mut x, g, null(), 0, &both),
            CUDA_ERROR_INVALID_VALUE,
            "kernelParams and extra both given"
        );
        let stranger = 0xdead_usize;
        assert_eq!(
            cuGraphAddKernelNode_v2(&mut x, g, &stranger, 1, &params(f, 0, 4, 128)),
            CUDA_ERROR_INVALID_VALUE,
            "a dependency not of the graph"
        );
        assert_eq!(cuGraphGetNodes(g, null_mut(), &mut n), CUDA_SUCCESS);
        assert_eq!(n, 3, "nothing added by a refusal");

        let mut exec = 0usize;
        assert_eq!(cuGraphInstantiateWithFlags(&mut exec, g, 0), CUDA_SUCCESS);
        assert_eq!(cuGraphLaunch(exec, 0), CUDA_SUCCESS);
        assert_eq!(
            cuGraphExecKernelNodeSetParams_v2(exec, b, &params(f, 0, 8, 256)),
            CUDA_SUCCESS
        );
        assert_eq!(cuGraphLaunch(exec, 0), CUDA_SUCCESS);
        assert_eq!(
            cuGraphExecKernelNodeSetParams_v2(exec, b, &params(f, 0, 0, 256)),
            CUDA_ERROR_INVALID_VALUE,
            "an empty grid"
        );
        assert_eq!(
            cuGraphExecKernelNodeSetParams_v2(exec, stranger, &params(f, 0, 8, 256)),
            CUDA_ERROR_INVALID_VALUE,
            "not a node of the exec's graph"
        );
        // A node added after instantiation is not in the exec.
        let mut late = 0usize;
        assert_eq!(
            cuGraphAddKernelNode_v2(&mut late, g, null(), 0, &params(f, 0, 1, 32)),
            CUDA_SUCCESS
        );
        assert_eq!(
            cuGraphExecKernelNodeSetParams_v2(exec, late, &params(f, 0, 1, 32)),
            CUDA_ERROR_INVALID_VALUE
        );
        assert_eq!(cuGraphExecDestroy(exec), CUDA_SUCCESS);
        assert_eq!(
            cuGraphExecKernelNodeSetParams_v2(exec, b, &params(f, 0, 8, 256)),
            CUDA_ERROR_INVALID_VALUE,
            "a destroyed exec"
        );
        assert_eq!(cuGraphDestroy(g), CUDA_SUCCESS);
        assert_eq!(cuLibraryUnload(lib), CUDA_SUCCESS);
    }
}

/// XLA's command buffers copy device to device inside their graphs (cuGraphAddMemcpyNode)
/// and retarget the copies between launches (cuGraphExecMemcpyNodeSetParams): a launch
/// makes the copy, real bytes, as the exec last set it. Keras's `fit` failed with "Failed
/// to add memcpy d2d node to a CUDA graph" while these were stubs.
#[test]
fn memcpy_nodes_copy_when_the_graph_is_launched() {
    let _g = setup();
    use crate::abi::types::{CudaMemcpy3d, Memcpy3dSide};
    use crate::api::graph::{
        cuGraphAddMemcpyNode, cuGraphCreate, cuGraphDestroy, cuGraphExecDestroy,
        cuGraphExecMemcpyNodeSetParams, cuGraphInstantiateWithFlags, cuGraphLaunch,
        cuGraphNodeGetType,
    };
    use crate::api::memory::{cuMemAlloc_v2, cuMemFree_v2};
    const DEVICE: i32 = 2;
    let side = |t: i32, device: u64, x: usize| Memcpy3dSide {
        x_in_bytes: x,
        y: 0,
        z: 0,
        lod: 0,
        memory_type: t,
        host: 0,
        device,
        array: 0,
        reserved: 0,
        pitch: 0,
        height: 0,
    };
    let d2d = |dst: u64, src: u64, n: usize| CudaMemcpy3d {
        src: side(DEVICE, src, 0),
        dst: side(DEVICE, dst, 0),
        width_in_bytes: n,
        height: 1,
        depth: 1,
    };
    unsafe {
        let (mut a, mut b, mut c) = (0u64, 0u64, 0u64);
        for p in [&mut a, &mut b, &mut c] {
            assert_eq!(cuMemAlloc_v2(p, 4096), CUDA_SUCCESS);
        }
        let bytes: Vec<u8> = (0..4096u32).map(|i| (i * 7 % 251) as u8).collect();
        assert_eq!(
            cuMemcpyHtoD_v2(a, bytes.as_ptr().cast(), 4096),
            CUDA_SUCCESS
        );
        let mut g = 0usize;
        assert_eq!(cuGraphCreate(&mut g, 0), CUDA_SUCCESS);
        let mut node = 0usize;
        assert_eq!(
            cuGraphAddMemcpyNode(&mut node, g, null(), 0, &d2d(b, a, 4096), 0),
            CUDA_SUCCESS
        );
        let mut t = -1;
        assert_eq!(cuGraphNodeGetType(node, &mut t), CUDA_SUCCESS);
        assert_eq!(t, 1, "CU_GRAPH_NODE_TYPE_MEMCPY");
        // Refused: beyond the allocation, a reserved field set, what the fake does not copy.
        let mut x = 0usize;
        assert_eq!(
            cuGraphAddMemcpyNode(&mut x, g, null(), 0, &d2d(b, a, 4097), 0),
            CUDA_ERROR_INVALID_VALUE
        );
        let mut bad = d2d(b, a, 16);
        bad.src.reserved = 1;
        assert_eq!(
            cuGraphAddMemcpyNode(&mut x, g, null(), 0, &bad, 0),
            CUDA_ERROR_INVALID_VALUE
        );
        let mut rows = d2d(b, a, 16);
        rows.height = 2;
        let mut array = d2d(b, a, 16);
        array.dst.memory_type = 3;
        for p in [rows, array] {
            assert_eq!(
                cuGraphAddMemcpyNode(&mut x, g, null(), 0, &p, 0),
                crate::abi::CUDA_ERROR_NOT_SUPPORTED
            );
        }
        let mut exec = 0usize;
        assert_eq!(cuGraphInstantiateWithFlags(&mut exec, g, 0), CUDA_SUCCESS);
        let back = |p: u64| {
            let mut v = vec![0u8; 4096];
            assert_eq!(
                cuMemcpyDtoH_v2(v.as_mut_ptr().cast(), p, 4096),
                CUDA_SUCCESS
            );
            v
        };
        assert_eq!(back(b), vec![0u8; 4096], "nothing copied before the launch");
        assert_eq!(cuGraphLaunch(exec, 0), CUDA_SUCCESS);
        assert_eq!(back(b), bytes);
        // Retargeted in the exec: the next launch copies to c, from its second half.
        assert_eq!(
            cuGraphExecMemcpyNodeSetParams(exec, node, &d2d(c, a + 2048, 2048), 0),
            CUDA_SUCCESS
        );
        assert_eq!(cuGraphLaunch(exec, 0), CUDA_SUCCESS);
        assert_eq!(back(c)[..2048], bytes[2048..]);
        assert_eq!(
            cuGraphExecMemcpyNodeSetParams(exec, 0xdead, &d2d(c, a, 16), 0),
            CUDA_ERROR_INVALID_VALUE,
            "not a memcpy node of the exec's graph"
        );
        // Its memory freed, the copy is refused when the graph runs.
        assert_eq!(cuMemFree_v2(c), CUDA_SUCCESS);
        assert_eq!(cuGraphLaunch(exec, 0), CUDA_ERROR_INVALID_VALUE);
        assert_eq!(cuGraphExecDestroy(exec), CUDA_SUCCESS);
        assert_eq!(cuGraphDestroy(g), CUDA_SUCCESS);
        for p in [a, b] {
            assert_eq!(cuMemFree_v2(p), CUDA_SUCCESS);
        }
    }
}

/// cuBLAS asks at cublasCreate how many clusters of 1 to 16 blocks fit (PyTorch's first
/// matrix product): it failed with CUBLAS_STATUS_NOT_INITIALIZED while these were stubs.
#[test]
fn occupancy_of_clusters_as_cublas_asks_it() {
    let _g = setup();
    /// CUlaunchConfig and CUlaunchAttribute as a C caller lays them out.
    #[repr(C)]
    struct Config {
        grid: [u32; 3],
        block: [u32; 3],
        shared: u32,
        stream: usize,
        attrs: *mut Attr,
        num_attrs: u32,
    }
    #[repr(C)]
    struct Attr {
        id: u32,
        pad: u32,
        value: [u32; 16],
    }
    let elf = build_elf(&["clustered"], &[]);
    unsafe {
        let mut m = 0;
        assert_eq!(cuModuleLoadData(&mut m, elf.as_ptr().cast()), CUDA_SUCCESS);
        let mut f = 0;
        assert_eq!(
            cuModuleGetFunction(&mut f, m, c"clustered".as_ptr()),
            CUDA_SUCCESS
        );
        let clusters = |x: u32, with_attr: bool| {
            let mut value = [0u32; 16];
            value[..3].copy_from_slice(&[x, 1, 1]);
            let mut attr = Attr {
                id: 4,
                pad: 0,
                value,
            };
            let c = Config {
                grid: [x * 4, 32, 1],
                block: [128, 1, 1],
                shared: 0,
                stream: 0,
                attrs: &mut attr,
                num_attrs: u32::from(with_attr),
            };
            let mut n = -1;
            let rc = cuOccupancyMaxActiveClusters(&mut n, f, (&c as *const Config).cast());
            (rc, n)
        };
        // 132 multiprocessors of 16 blocks of 128 threads: 2112 blocks, in clusters.
        assert_eq!(clusters(1, true), (CUDA_SUCCESS, 2112));
        assert_eq!(clusters(4, true), (CUDA_SUCCESS, 528));
        assert_eq!(clusters(8, true), (CUDA_SUCCESS, 264));
        assert_eq!(clusters(9, true).0, CUDA_ERROR_INVALID_CLUSTER_SIZE);
        assert_eq!(clusters(4, false).0, CUDA_ERROR_INVALID_CLUSTER_SIZE);
        let c = Config {
            grid: [1, 1, 1],
            block: [128, 1, 1],
            shared: 0,
            stream: 0,
            attrs: null_mut(),
            num_attrs: 0,
        };
        let mut size = 0;
        assert_eq!(
            cuOccupancyMaxPotentialClusterSize(&mut size, f, (&c as *const Config).cast()),
            CUDA_SUCCESS
        );
        assert_eq!(size, 8);
        assert_eq!(
            cuOccupancyMaxPotentialClusterSize(&mut size, 12345, (&c as *const Config).cast()),
            CUDA_ERROR_INVALID_HANDLE
        );
    }
}

unsafe extern "C" fn log_callback() {}

/// PyTorch registers a driver log callback at start-up (CUDA 12.9's cuLogs*).
#[test]
fn log_callbacks_register_and_unregister() {
    let _g = setup();
    use crate::api::device::{cuLogsCurrent, cuLogsRegisterCallback, cuLogsUnregisterCallback};
    unsafe {
        let mut h = 0usize;
        assert_eq!(
            cuLogsRegisterCallback(Some(log_callback), null_mut(), &mut h),
            CUDA_SUCCESS
        );
        assert_ne!(h, 0);
        assert_eq!(
            cuLogsRegisterCallback(None, null_mut(), &mut h),
            CUDA_ERROR_INVALID_VALUE
        );
        let mut it = 7u32;
        assert_eq!(cuLogsCurrent(&mut it, 0), CUDA_SUCCESS);
        assert_eq!(it, 0);
        assert_eq!(cuLogsUnregisterCallback(h), CUDA_SUCCESS);
        assert_eq!(
            cuLogsUnregisterCallback(h),
            CUDA_ERROR_INVALID_VALUE,
            "already gone"
        );
    }
}

/// Graph memory: reserved at instantiation, kept for reuse after the exec goes, given back
/// at a trim; the figures PyTorch's cudaMallocAsync backend reads follow it.
#[test]
fn graph_memory_is_reserved_at_instantiation_and_given_back_at_a_trim() {
    let _g = setup();
    use crate::abi::types::{
        CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT, CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH,
        CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT, CU_GRAPH_MEM_ATTR_USED_MEM_HIGH,
        CU_GRAPH_NODE_TYPE_MEM_ALLOC, CU_MEM_ALLOCATION_TYPE_PINNED, CU_MEM_LOCATION_TYPE_DEVICE,
        CU_STREAM_CAPTURE_STATUS_ACTIVE, CUmemLocation, CUmemPoolProps, CudaMemAllocNodeParams,
    };
    use crate::api::graph::{
        cuDeviceGetGraphMemAttribute, cuDeviceGraphMemTrim, cuDeviceSetGraphMemAttribute,
        cuGraphAddMemAllocNode, cuGraphAddMemFreeNode, cuGraphCreate, cuGraphDestroy,
        cuGraphExecDestroy, cuGraphGetNodes, cuGraphInstantiateWithFlags, cuGraphLaunch,
        cuGraphNodeGetType, cuGraphUpload,
    };
    use crate::api::pool::{cuMemAllocAsync, cuMemFreeAsync};
    use crate::api::stream::{
        cuStreamBeginCapture_v2, cuStreamCreate, cuStreamDestroy_v2, cuStreamEndCapture,
        cuStreamIsCapturing,
    };
    const MIB: usize = 1 << 20;
    let attr = |a| {
        let mut v = 7u64;
        assert_eq!(
            unsafe { cuDeviceGetGraphMemAttribute(0, a, &mut v) },
            CUDA_SUCCESS
        );
        v as usize
    };
    let props = |dev| CUmemPoolProps {
        alloc_type: CU_MEM_ALLOCATION_TYPE_PINNED,
        handle_types: 0,
        location: CUmemLocation {
            type_: CU_MEM_LOCATION_TYPE_DEVICE,
            id: dev,
        },
        win32_security_attributes: 0,
        max_size: 0,
        usage: 0,
        reserved: [0; 54],
    };
    unsafe {
        cuDeviceGraphMemTrim(0);
        let base = used();
        let (mut g, mut node, mut exec) = (0usize, 0usize, 0usize);
        assert_eq!(cuGraphCreate(&mut g, 0), CUDA_SUCCESS);
        let mut p = CudaMemAllocNodeParams {
            pool_props: props(0),
            access_descs: null(),
            access_desc_count: 0,
            bytesize: 100 * MIB + 1,
            dptr: 0,
        };
        assert_eq!(
            cuGraphAddMemAllocNode(&mut node, g, null(), 0, &mut p),
            CUDA_SUCCESS
        );
        assert_ne!(p.dptr, 0);
        let mut free = 0usize;
        assert_eq!(
            cuGraphAddMemFreeNode(&mut free, g, &node, 1, p.dptr),
            CUDA_SUCCESS
        );
        assert_eq!(
            cuGraphAddMemFreeNode(&mut free, g, &node, 1, p.dptr),
            CUDA_ERROR_INVALID_VALUE,
            "freed twice"
        );
        assert_eq!(used(), base, "a node takes no memory");
        let mut n = 0usize;
        assert_eq!(cuGraphGetNodes(g, null_mut(), &mut n), CUDA_SUCCESS);
        assert_eq!(n, 2);
        let mut t = 0;
        assert_eq!(cuGraphNodeGetType(node, &mut t), CUDA_SUCCESS);
        assert_eq!(t, CU_GRAPH_NODE_TYPE_MEM_ALLOC);
        assert_eq!(cuGraphInstantiateWithFlags(&mut exec, g, 0), CUDA_SUCCESS);
        assert_eq!(used(), base + 102 * MIB, "reserved in whole 2 MiB granules");
        assert_eq!(
            (
                attr(CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT),
                attr(CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT)
            ),
            (102 * MIB, 0)
        );
        assert_eq!(cuGraphLaunch(exec, 0), CUDA_SUCCESS);
        assert_eq!(
            cuGraphLaunch(exec, 0),
            CUDA_SUCCESS,
            "freed in the graph: relaunchable"
        );
        assert_eq!(
            (
                attr(CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT),
                attr(CU_GRAPH_MEM_ATTR_USED_MEM_HIGH)
            ),
            (0, 100 * MIB + 1)
        );
        assert_eq!(cuGraphExecDestroy(exec), CUDA_SUCCESS);
        assert_eq!(
            used(),
            base + 102 * MIB,
            "kept for reuse after the exec goes"
        );
        assert_eq!(cuGraphInstantiateWithFlags(&mut exec, g, 0), CUDA_SUCCESS);
        assert_eq!(used(), base + 102 * MIB, "reused");
        assert_eq!(cuDeviceGraphMemTrim(0), CUDA_SUCCESS);
        assert_eq!(used(), base, "an idle graph's memory goes at a trim");
        assert_eq!(cuGraphUpload(exec, 0), CUDA_SUCCESS);
        assert_eq!(used(), base + 102 * MIB, "and comes back at its upload");
        // An allocation the graph does not free stays live after the launch.
        let mut g2 = 0usize;
        assert_eq!(cuGraphCreate(&mut g2, 0), CUDA_SUCCESS);
        p.bytesize = 4 * MIB;
        assert_eq!(
            cuGraphAddMemAllocNode(&mut node, g2, null(), 0, &mut p),
            CUDA_SUCCESS
        );
        let mut e2 = 0usize;
        assert_eq!(cuGraphInstantiateWithFlags(&mut e2, g2, 0), CUDA_SUCCESS);
        assert_eq!(cuGraphLaunch(e2, 0), CUDA_SUCCESS);
        assert_eq!(attr(CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT), 4 * MIB);
        assert_eq!(
            cuGraphLaunch(e2, 0),
            CUDA_ERROR_INVALID_VALUE,
            "its allocation is live"
        );
        assert_eq!(cuGraphExecDestroy(e2), CUDA_SUCCESS);
        assert_eq!(cuDeviceGraphMemTrim(0), CUDA_SUCCESS);
        assert_eq!(used(), base + 4 * MIB, "a live allocation is never trimmed");
        assert_eq!(cuMemFreeAsync(p.dptr, 0), CUDA_SUCCESS);
        assert_eq!(cuDeviceGraphMemTrim(0), CUDA_SUCCESS);
        assert_eq!(used(), base);
        // Stream capture of cuMemAllocAsync/cuMemFreeAsync makes the same nodes.
        let mut s = 0usize;
        assert_eq!(cuStreamCreate(&mut s, 1), CUDA_SUCCESS);
        assert_eq!(
            cuStreamBeginCapture_v2(0, 0),
            900,
            "the legacy stream cannot capture"
        );
        assert_eq!(cuStreamBeginCapture_v2(s, 0), CUDA_SUCCESS);
        let mut st = 0;
        assert_eq!(cuStreamIsCapturing(s, &mut st), CUDA_SUCCESS);
        assert_eq!(st, CU_STREAM_CAPTURE_STATUS_ACTIVE);
        let mut d = 0u64;
        assert_eq!(cuMemAllocAsync(&mut d, 8 * MIB, s), CUDA_SUCCESS);
        assert_eq!(cuMemFreeAsync(d, s), CUDA_SUCCESS);
        assert_eq!(used(), base, "captured: nothing allocated");
        let mut cg = 0usize;
        assert_eq!(cuStreamEndCapture(s, &mut cg), CUDA_SUCCESS);
        assert_eq!(
            cuStreamEndCapture(s, &mut cg),
            401,
            "CUDA_ERROR_ILLEGAL_STATE"
        );
        assert_eq!(cuGraphGetNodes(cg, null_mut(), &mut n), CUDA_SUCCESS);
        assert_eq!(n, 2);
        assert_eq!(cuGraphInstantiateWithFlags(&mut e2, cg, 0), CUDA_SUCCESS);
        assert_eq!(used(), base + 8 * MIB);
        let mut hi = 0u64;
        assert_eq!(
            cuDeviceSetGraphMemAttribute(0, CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH, &mut hi),
            CUDA_SUCCESS
        );
        assert_eq!(attr(CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH), 8 * MIB);
        assert_eq!(
            cuDeviceSetGraphMemAttribute(0, 0, &mut hi),
            CUDA_ERROR_INVALID_VALUE
        );
        assert_eq!(
            cuDeviceGetGraphMemAttribute(0, 4, &mut hi),
            CUDA_ERROR_INVALID_VALUE
        );
        assert_eq!(
            cuDeviceGetGraphMemAttribute(5, 0, &mut hi),
            101,
            "CUDA_ERROR_INVALID_DEVICE"
        );
        for e in [exec, e2] {
            assert_eq!(cuGraphExecDestroy(e), CUDA_SUCCESS);
        }
        for gr in [g, g2, cg] {
            assert_eq!(cuGraphDestroy(gr), CUDA_SUCCESS);
        }
        assert_eq!(cuStreamDestroy_v2(s), CUDA_SUCCESS);
        assert_eq!(cuDeviceGraphMemTrim(0), CUDA_SUCCESS);
        assert_eq!(used(), base);
    }
}

/// CUDA's runtime asks the loading mode and, told eager, asks for every function of every
/// module it registers (cudart 12.9 under TensorFlow: 49,086). The driver answers lazy
/// (2) unless `CUDA_MODULE_LOADING=EAGER` (1); the fake answered eager before.
#[test]
fn the_loading_mode_is_lazy_unless_cuda_module_loading_says_eager() {
    use crate::api::module::{cuModuleGetLoadingMode, loading_mode};
    assert_eq!((loading_mode(false), loading_mode(true)), (2, 1));
    let _g = setup();
    let expected = loading_mode(crate::model::device::cfg().unwrap().eager);
    let mut mode = 0;
    // SAFETY: a valid out-pointer, as a C caller would pass.
    assert_eq!(unsafe { cuModuleGetLoadingMode(&mut mode) }, CUDA_SUCCESS);
    assert_eq!(mode, expected);
    // SAFETY: NULL, which the driver refuses.
    assert_ne!(unsafe { cuModuleGetLoadingMode(null_mut()) }, CUDA_SUCCESS);
}

/// A launch of a kernel whose threads take more local memory than the context's stack
/// grows the stack to it (the driver's `cuCtxSetLimit` documentation), with the memory a
/// `cuCtxSetLimit` to that size takes, kept; a kernel within the stack takes nothing.
#[test]
fn a_launch_grows_the_stack_to_its_kernels_local_memory() {
    use crate::api::context::{cuCtxGetLimit, cuCtxSetLimit};
    use crate::model::limit::stack_bytes;
    let _g = setup();
    let ptx = c".version 8.0\n.entry deep()\n{\n\t.local .align 16 .b8 __local_depot0[4096];\n ret;\n}\n.entry flat()\n{\n ret;\n}\n";
    unsafe {
        let mut m = 0;
        assert_eq!(cuModuleLoadData(&mut m, ptx.as_ptr().cast()), CUDA_SUCCESS);
        let (mut deep, mut flat) = (0, 0);
        assert_eq!(
            cuModuleGetFunction(&mut deep, m, c"deep".as_ptr()),
            CUDA_SUCCESS
        );
        assert_eq!(
            cuModuleGetFunction(&mut flat, m, c"flat".as_ptr()),
            CUDA_SUCCESS
        );
        let mut local = 0;
        assert_eq!(cuFuncGetAttribute(&mut local, 3, deep), CUDA_SUCCESS);
        assert_eq!(local, 4096, "LOCAL_SIZE_BYTES: its .local declarations");
        assert_eq!(cuCtxSetLimit(0, 1024), CUDA_SUCCESS);
        let before = used();
        let launch = |f| cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, 0, null_mut(), null_mut());
        assert_eq!(launch(flat), CUDA_SUCCESS);
        assert_eq!(used(), before, "a kernel within the stack takes nothing");
        assert_eq!(launch(deep), CUDA_SUCCESS);
        let mut stack = 0;
        assert_eq!(cuCtxGetLimit(&mut stack, 0), CUDA_SUCCESS);
        assert_eq!(stack, 4096, "the stack grown to the kernel's local memory");
        assert_eq!(used() - before, stack_bytes(4096) as usize);
        assert_eq!(launch(deep), CUDA_SUCCESS);
        assert_eq!(
            used() - before,
            stack_bytes(4096) as usize,
            "kept, taken once"
        );
        assert_eq!(cuCtxSetLimit(0, 1024), CUDA_SUCCESS);
        assert_eq!(used(), before, "lowered: given back");
        assert_eq!(cuModuleUnload(m), CUDA_SUCCESS);
    }
}

/// `cuModuleEnumerateFunctions` hands out "partially loaded" functions under lazy loading
/// (NVIDIA's documentation of that call): `cuFuncIsLoaded` says 0 until a call loads one
/// (`cuFuncLoad`, an attribute asked, a launch, `cuModuleGetFunction` of its name).
#[test]
fn enumerated_functions_are_partially_loaded_until_a_call_loads_them() {
    use crate::api::module::{
        cuFuncIsLoaded, cuFuncLoad, cuModuleEnumerateFunctions, cuModuleGetFunctionCount,
    };
    let _g = setup();
    let ptx = c".version 8.0\n.entry a()\n{\n ret;\n}\n.entry b()\n{\n ret;\n}\n.entry c()\n{\n ret;\n}\n.entry d()\n{\n ret;\n}\n";
    unsafe {
        let mut m = 0;
        assert_eq!(cuModuleLoadData(&mut m, ptx.as_ptr().cast()), CUDA_SUCCESS);
        let mut n = 0;
        assert_eq!(cuModuleGetFunctionCount(&mut n, m), CUDA_SUCCESS);
        assert_eq!(n, 4);
        let mut fs = [0usize; 4];
        assert_eq!(
            cuModuleEnumerateFunctions(fs.as_mut_ptr(), 4, m),
            CUDA_SUCCESS
        );
        let state = |f| {
            let mut s = -1;
            assert_eq!(cuFuncIsLoaded(&mut s, f), CUDA_SUCCESS);
            s
        };
        assert!(fs.iter().all(|&f| state(f) == 0), "partially loaded");
        let mut d = 0;
        assert_eq!(cuModuleGetFunction(&mut d, m, c"d".as_ptr()), CUDA_SUCCESS);
        assert!(fs.contains(&d), "the same handle as enumerated");
        assert_eq!(state(d), 1, "cuModuleGetFunction loads it");
        let rest: Vec<usize> = fs.iter().copied().filter(|&f| f != d).collect();
        assert_eq!(cuFuncLoad(rest[0]), CUDA_SUCCESS);
        assert_eq!(state(rest[0]), 1, "cuFuncLoad");
        let mut v = 0;
        assert_eq!(cuFuncGetAttribute(&mut v, 3, rest[1]), CUDA_SUCCESS);
        assert_eq!(state(rest[1]), 1, "an attribute asked");
        let launch = cuLaunchKernel(rest[2], 1, 1, 1, 1, 1, 1, 0, 0, null_mut(), null_mut());
        assert_eq!(launch, CUDA_SUCCESS);
        assert_eq!(state(rest[2]), 1, "a launch");
        assert_eq!(cuModuleUnload(m), CUDA_SUCCESS);
    }
}

/// A library's global reached through its module (`cuLibraryGetModule`, then
/// `cuModuleGetGlobal_v2`) is the library's global in the context, loaded there at that
/// first use as `cuLibraryGetGlobal` loads it: the same address, taken once.
#[test]
fn a_librarys_global_through_its_module_is_the_librarys() {
    use crate::api::module::cuLibraryGetModule;
    let _g = setup();
    let elf = build_elf(&["lib_kernel"], &[("lib_global", 4096)]);
    unsafe {
        let lib = load_library(&elf);
        let before = used();
        let mut module = 0;
        assert_eq!(cuLibraryGetModule(&mut module, lib), CUDA_SUCCESS);
        assert_eq!(used(), before, "the module asked: nothing loaded");
        let (mut via_module, mut via_library, mut bytes) = (0u64, 0u64, 0usize);
        let name = c"lib_global".as_ptr();
        assert_eq!(
            cuModuleGetGlobal_v2(&mut via_module, &mut bytes, module, name),
            CUDA_SUCCESS
        );
        assert_eq!(bytes, 4096);
        let loaded = used() - before;
        assert!(
            loaded >= 4096,
            "the library loaded with its global: {loaded}"
        );
        assert_eq!(
            cuLibraryGetGlobal(&mut via_library, &mut bytes, lib, name),
            CUDA_SUCCESS
        );
        assert_eq!(via_module, via_library, "one global, the library's");
        assert_eq!(used() - before, loaded, "taken once");
        assert_eq!(cuLibraryUnload(lib), CUDA_SUCCESS);
        assert_eq!(used(), before, "given back with the library");
    }
}
