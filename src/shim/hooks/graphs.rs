//! CUDA graph memory (see `gpucap_core::graphs`): what graph memory nodes take, charged
//! as the driver reserves it. Around `cuGraphInstantiate*`, `cuGraphUpload`,
//! `cuGraphLaunch`, `cuGraphExecDestroy` and `cuDeviceGraphMemTrim` the device's graph
//! memory figure is read from the driver and the device's one graph charge settled to it.
//! Before a call that can still fail, what the exec may make the driver reserve is
//! reserved against the cap (the process's and its pool's): one the cap cannot take is
//! refused with `CUDA_ERROR_OUT_OF_MEMORY` and gpucap's line before the driver is called.

use std::ffi::{c_char, c_int, c_void};
use std::ptr::null_mut;

use super::first_use::{Use, first_use};
use super::{checked_device, reserve_on, shim, visible_count, written_handle};
use crate::driver::forward::Real;
use crate::driver::types::{
    CU_GRAPH_NODE_TYPE_KERNEL, CUDA_ERROR_INVALID_DEVICE, CUDA_SUCCESS, CuResult,
    GraphNodeParamsHead, Handle, In, InstantiateParams, KernelNodeParams, KernelNodeParamsV1, Out,
    Stream,
};
use crate::driver::{graph_queries, queries};
use crate::log::log;
use crate::state::{GRAPHS, LAUNCHED, SHIM, Shim};
use gpucap_core::config::MAX_DEVICES;
use gpucap_core::graphs::{self, Settle};
use gpucap_core::kernels::launch_key;
use gpucap_core::ledger::{Charge, Reservation};
use gpucap_core::residents::Gauge;

/// `cuGraphInstantiate`'s arguments: the exec, the graph, the error node, the log
/// buffer and its size.
type InstantiateArgs<'a> = (Out<'a, Handle>, Handle, Out<'a, Handle>, *mut c_char, usize);

pub fn graph_instantiate(
    real: Real<InstantiateArgs>,
    exec: Out<Handle>,
    graph: Handle,
    err_node: Out<Handle>,
    log_buffer: *mut c_char,
    size: usize,
) -> CuResult {
    instantiated("cuGraphInstantiate", exec, graph, || {
        real.call(exec, graph, err_node, log_buffer, size)
    })
}

pub fn graph_instantiate_with_flags(
    real: Real<(Out<Handle>, Handle, u64)>,
    exec: Out<Handle>,
    graph: Handle,
    flags: u64,
) -> CuResult {
    instantiated("cuGraphInstantiateWithFlags", exec, graph, || {
        real.call(exec, graph, flags)
    })
}

pub fn graph_instantiate_with_params(
    real: Real<(Out<Handle>, Handle, *mut InstantiateParams)>,
    exec: Out<Handle>,
    graph: Handle,
    params: *mut InstantiateParams,
) -> CuResult {
    instantiated("cuGraphInstantiateWithParams", exec, graph, || {
        real.call(exec, graph, params)
    })
}

/// `cuGraphAddKernelNode*`'s arguments: the node, the graph, its dependencies and their
/// count, the node's parameters (`P`: CUDA 10's or 12's layout).
type AddKernelNodeArgs<'a, P> = (Out<'a, Handle>, Handle, *const Handle, usize, In<'a, P>);
/// `cuGraphAddNode_v2`'s arguments: as `cuGraphAddNode`'s, with the edge data.
type AddNodeV2Args<'a> = (
    Out<'a, Handle>,
    Handle,
    *const Handle,
    *const c_void,
    usize,
    In<'a, GraphNodeParamsHead>,
);

/// `cuGraphAddKernelNode_v2`: the node's kernel loaded into its context first, measured
/// (`launches::load_for_graph`), then the node made.
pub fn graph_add_kernel_node(
    real: Real<AddKernelNodeArgs<KernelNodeParams>>,
    node: Out<Handle>,
    graph: Handle,
    deps: *const Handle,
    n: usize,
    params: In<KernelNodeParams>,
) -> CuResult {
    kernel_first("cuGraphAddKernelNode", node_kernel(params), || {
        real.call(node, graph, deps, n, params)
    })
}

/// `cuGraphAddKernelNode` (CUDA 10's parameters: a function): as `_v2`.
pub fn graph_add_kernel_node_v1(
    real: Real<AddKernelNodeArgs<KernelNodeParamsV1>>,
    node: Out<Handle>,
    graph: Handle,
    deps: *const Handle,
    n: usize,
    params: In<KernelNodeParamsV1>,
) -> CuResult {
    kernel_first("cuGraphAddKernelNode", function_node(params), || {
        real.call(node, graph, deps, n, params)
    })
}

/// `cuGraphExecKernelNodeSetParams_v2`: an executable graph's kernel node given another
/// kernel, loaded first as at the node's making.
pub fn graph_exec_kernel_node_set_params(
    real: Real<(Handle, Handle, In<KernelNodeParams>)>,
    exec: Handle,
    node: Handle,
    params: In<KernelNodeParams>,
) -> CuResult {
    kernel_first(
        "cuGraphExecKernelNodeSetParams",
        node_kernel(params),
        || real.call(exec, node, params),
    )
}

/// `cuGraphExecKernelNodeSetParams` (CUDA 10's parameters): as `_v2`.
pub fn graph_exec_kernel_node_set_params_v1(
    real: Real<(Handle, Handle, In<KernelNodeParamsV1>)>,
    exec: Handle,
    node: Handle,
    params: In<KernelNodeParamsV1>,
) -> CuResult {
    kernel_first(
        "cuGraphExecKernelNodeSetParams",
        function_node(params),
        || real.call(exec, node, params),
    )
}

/// `cuGraphAddNode` (CUDA 12.2's generic call): a kernel node's kernel loaded into its
/// context first, as at `cuGraphAddKernelNode_v2`; another type is the driver's alone.
pub fn graph_add_node(
    real: Real<AddKernelNodeArgs<GraphNodeParamsHead>>,
    node: Out<Handle>,
    graph: Handle,
    deps: *const Handle,
    n: usize,
    params: In<GraphNodeParamsHead>,
) -> CuResult {
    kernel_first("cuGraphAddNode", generic_kernel(params), || {
        real.call(node, graph, deps, n, params)
    })
}

/// `cuGraphAddNode_v2`, `_v3` (with edge data): as [`graph_add_node`].
pub fn graph_add_node_v2(
    real: Real<AddNodeV2Args>,
    node: Out<Handle>,
    graph: Handle,
    deps: *const Handle,
    edges: *const c_void,
    n: usize,
    params: In<GraphNodeParamsHead>,
) -> CuResult {
    kernel_first("cuGraphAddNode", generic_kernel(params), || {
        real.call(node, graph, deps, edges, n, params)
    })
}

/// `cuGraphExecNodeSetParams`: an executable graph's kernel node given another kernel,
/// loaded first as at `cuGraphExecKernelNodeSetParams_v2`.
pub fn graph_exec_node_set_params(
    real: Real<(Handle, Handle, In<GraphNodeParamsHead>)>,
    exec: Handle,
    node: Handle,
    params: In<GraphNodeParamsHead>,
) -> CuResult {
    kernel_first("cuGraphExecNodeSetParams", generic_kernel(params), || {
        real.call(exec, node, params)
    })
}

/// `cuGraphKernelNodeSetParams_v2`: a graph's kernel node given another kernel, loaded first
/// as at the node's making, so that no graph holds a kernel gpucap has not loaded (an
/// executable graph updated from it, `cuGraphExecUpdate`, takes it unmeasured otherwise).
pub fn graph_kernel_node_set_params(
    real: Real<(Handle, In<KernelNodeParams>)>,
    node: Handle,
    params: In<KernelNodeParams>,
) -> CuResult {
    kernel_first("cuGraphKernelNodeSetParams", node_kernel(params), || {
        real.call(node, params)
    })
}

/// `cuGraphKernelNodeSetParams` (CUDA 10's parameters): as `_v2`.
pub fn graph_kernel_node_set_params_v1(
    real: Real<(Handle, In<KernelNodeParamsV1>)>,
    node: Handle,
    params: In<KernelNodeParamsV1>,
) -> CuResult {
    kernel_first("cuGraphKernelNodeSetParams", function_node(params), || {
        real.call(node, params)
    })
}

/// `cuGraphNodeSetParams` (`_v2`): as [`graph_kernel_node_set_params`] for a kernel node.
pub fn graph_node_set_params(
    real: Real<(Handle, In<GraphNodeParamsHead>)>,
    node: Handle,
    params: In<GraphNodeParamsHead>,
) -> CuResult {
    kernel_first("cuGraphNodeSetParams", generic_kernel(params), || {
        real.call(node, params)
    })
}

/// A generic node's kernel, as [`node_kernel`]: nulls for another type of node.
fn generic_kernel(params: In<GraphNodeParamsHead>) -> (Handle, Handle, Handle) {
    match params.get() {
        Some(p) if p.node_type == CU_GRAPH_NODE_TYPE_KERNEL => {
            (p.kernel.func, p.kernel.kern, p.kernel.ctx)
        }
        _ => (null_mut(), null_mut(), null_mut()),
    }
}

/// A kernel node's function, kernel handle and context (nulls where the program passed no
/// parameters: the driver's own error follows).
fn node_kernel(params: In<KernelNodeParams>) -> (Handle, Handle, Handle) {
    params
        .get()
        .map_or((null_mut(), null_mut(), null_mut()), |p| {
            (p.func, p.kern, p.ctx)
        })
}

/// As [`node_kernel`], for CUDA 10's parameters (a function only).
fn function_node(params: In<KernelNodeParamsV1>) -> (Handle, Handle, Handle) {
    (
        params.get().map_or(null_mut(), |p| p.func),
        null_mut(),
        null_mut(),
    )
}

/// `call` (a kernel node made or changed) once the node's kernel is loaded into its
/// context, measured (`launches::load_for_graph`); refused before the driver is called
/// where the cap cannot take what it is expected to load.
fn kernel_first(
    api: &str,
    (func, kern, ctx): (Handle, Handle, Handle),
    call: impl FnOnce() -> CuResult,
) -> CuResult {
    match super::launches::load_for_graph(api, func, kern, ctx) {
        Err(rc) => rc,
        Ok(()) => call(),
    }
}

pub fn graph_upload(real: Real<(Handle, Stream)>, exec: Handle, stream: Stream) -> CuResult {
    on_stream("cuGraphUpload", real, exec, stream)
}

pub fn graph_launch(real: Real<(Handle, Stream)>, exec: Handle, stream: Stream) -> CuResult {
    if super::limits::late_limit_raised() {
        return late_limit_launch(real, exec, stream);
    }
    on_stream("cuGraphLaunch", real, exec, stream)
}

/// A graph's launch once the program raised the malloc heap (or the printf FIFO, the
/// pending-launch buffer, `limits::late_limit_raised`): the driver takes a raised heap at
/// a later launch (which one is not recorded: `heap-when.py --graph` asks), a graph's as
/// much as a kernel's, so each executable graph's first launch after a raise
/// is measured as a kernel's first use is (`first_use`; its charge kept with the
/// context). Its graph memory is settled inside the measured call: measured by the
/// driver's figure for this process, that charge is taken out of the launch's figure.
#[cold]
#[inline(never)]
fn late_limit_launch(real: Real<(Handle, Stream)>, exec: Handle, stream: Stream) -> CuResult {
    let launch = || on_stream("cuGraphLaunch", real, exec, stream);
    let Some(d) = super::current::current_device().and_then(|d| usize::try_from(d).ok()) else {
        return launch();
    };
    let key = launch_key(exec as u64, d);
    if LAUNCHED.contains(key) {
        return launch();
    }
    first_use("cuGraphLaunch", Use::of(key), d, launch, || None, || 0)
}

/// `cuGraphUpload` and `cuGraphLaunch`: an executable graph's memory reserved again if
/// it does not hold it (see [`run`]). A process without graph memory pays one load.
#[inline(always)]
fn on_stream(api: &str, real: Real<(Handle, Stream)>, exec: Handle, stream: Stream) -> CuResult {
    let call = || real.call(exec, stream);
    if !GRAPHS.any() {
        return call();
    }
    run(api, exec, call)
}

/// `cuGraphExecDestroy`: the driver may give back the exec's graph memory (see
/// [`giving_back`]).
pub fn graph_exec_destroy(real: Real<(Handle,)>, exec: Handle) -> CuResult {
    if !GRAPHS.any() {
        return real.call(exec); // no exec has graph memory: one load
    }
    let devices = GRAPHS.devices(exec as u64);
    // No more than the exec's own memory goes with it (a driver may keep it for reuse
    // until a trim); an exec whose nodes could not be listed: as much as the device holds.
    let most = |d| match GRAPHS.footprint_of(exec as u64, d) {
        0 => u64::MAX,
        bytes => bytes,
    };
    giving_back(&devices, most, || {
        let rc = real.call(exec);
        if rc == CUDA_SUCCESS {
            GRAPHS.destroyed(exec as u64);
        }
        rc
    })
}

/// `cuDeviceGraphMemTrim`: the driver gives back the device's graph memory no graph holds
/// (see [`giving_back`]).
pub fn device_graph_mem_trim(real: Real<(c_int,)>, dev: c_int) -> CuResult {
    let Ok(d) = usize::try_from(dev) else {
        return real.call(dev);
    };
    giving_back(
        &[d],
        |_| u64::MAX,
        || {
            let rc = real.call(dev);
            if rc == CUDA_SUCCESS {
                GRAPHS.trimmed(d);
            }
            rc
        },
    )
}

/// Runs `call`, which may make the driver give back graph memory on `devices`: as much as
/// it may give back (each device's graph charge, or the driver's figure if more; at most
/// `most` of the device) is announced to the pool first, as any free is, so that a member
/// measuring what the driver took for it meanwhile does not take these bytes off its
/// charge (a stack lowered beside a member trimming 256 MiB of graph memory, unannounced,
/// was credited those 256 MiB too); after the call each device's charge is settled to the
/// driver's figure and the announcement ends.
fn giving_back(
    devices: &[usize],
    most: impl Fn(usize) -> u64,
    call: impl FnOnce() -> CuResult,
) -> CuResult {
    let bounds = || {
        devices
            .iter()
            .map(|&d| {
                let figure = queries::Contexts.graph_reserved(d).unwrap_or(0);
                Charge {
                    device: d,
                    bytes: figure.max(GRAPHS.charged(d)).min(most(d)),
                }
            })
            .collect()
    };
    super::residents::announced_release(bounds, || {
        let rc = call();
        if rc == CUDA_SUCCESS {
            devices.iter().for_each(|&d| settle(d, None));
        }
        rc
    })
}

/// An instantiation: the graph's alloc nodes reserved first, the exec recorded after.
fn instantiated(
    api: &str,
    exec: Out<Handle>,
    graph: Handle,
    call: impl FnOnce() -> CuResult,
) -> CuResult {
    let shim = match shim() {
        Ok(s) => s,
        Err(rc) => return rc,
    };
    // Each kernel never used in the context is loaded there first, measured (what lazy
    // loading takes for the graph), so that asking its local memory loads nothing
    // unmeasured. Then the stack: it grows to the most local memory when the graph runs;
    // raised (or refused) now, as for a launch.
    if let Some(d) = super::current::current_device().and_then(|d| usize::try_from(d).ok()) {
        let kernels = graph_queries::graph_kernels(graph);
        for k in &kernels {
            if let Err(rc) = super::launches::load_for_graph(api, k.func, k.kern, k.ctx) {
                return rc;
            }
        }
        let local = graph_queries::max_local(&kernels, d as c_int);
        if let Err(rc) = super::limits::stack_for_launch(api, d, local, || false) {
            return rc;
        }
    }
    let Some(allocs) = graph_queries::graph_allocs(graph) else {
        return unlisted(shim, api, exec, call);
    };
    let need = graphs::footprint(allocs);
    if need.is_empty() {
        return call();
    }
    let held = match reserve_expected(shim, api, None, &need) {
        Ok(h) => h,
        Err(rc) => return rc,
    };
    let rc = call();
    if rc == CUDA_SUCCESS {
        GRAPHS.instantiated(written_handle(exec) as u64, need.clone());
    }
    settle_all(need.iter().map(|&(d, _)| d), held);
    rc
}

/// An instantiation of a graph whose memory nodes the driver would not list (an invalid
/// graph, whose call then fails; or a driver that does not say): what it needs is not
/// known, so nothing is reserved before the call. After it, the graph memory the driver
/// holds reserved (`RESERVED_MEM_CURRENT`) on each device the process sees is charged,
/// past the cap if need be (the driver took it already: said at warning level), never
/// taken as 0; the exec is kept so that its launches and its end settle those devices
/// again.
fn unlisted(
    shim: &'static Shim,
    api: &str,
    exec: Out<Handle>,
    call: impl FnOnce() -> CuResult,
) -> CuResult {
    let rc = call();
    if rc != CUDA_SUCCESS {
        return rc;
    }
    let devices: Vec<usize> = (0..visible_count().unwrap_or(1).min(MAX_DEVICES))
        .filter(|&d| checked_device(shim, d as c_int).is_some())
        .collect();
    log!(
        Warn,
        "{api}: the graph's memory nodes could not be listed: charged the graph memory the driver reserves for it"
    );
    GRAPHS.instantiated_unlisted(written_handle(exec) as u64, &devices);
    for d in devices {
        settle(d, None);
    }
    rc
}

/// An upload or launch of an exec with memory nodes: what it may reserve is reserved
/// first (nothing while it holds its memory); the figure is settled after either way.
fn run(api: &str, exec: Handle, call: impl FnOnce() -> CuResult) -> CuResult {
    let devices = GRAPHS.devices(exec as u64);
    if devices.is_empty() {
        return call();
    }
    let shim = match shim() {
        Ok(s) => s,
        Err(rc) => return rc,
    };
    let held = match reserve_expected(shim, api, Some(exec as u64), &GRAPHS.expected(exec as u64)) {
        Ok(h) => h,
        Err(rc) => return rc,
    };
    let rc = call();
    if rc == CUDA_SUCCESS {
        GRAPHS.held(exec as u64);
    }
    settle_all(devices.into_iter(), held);
    rc
}

/// Reserves what an exec (`exec`: None before it exists) whose memory needs `need` may
/// make the driver reserve on each device: its footprint less the driver's graph memory
/// that is surely idle there (see `graphs::expected_growth`). A device the cap cannot take
/// it on refuses it with gpucap's line, and what was reserved on the others goes back.
fn reserve_expected(
    shim: &'static Shim,
    api: &str,
    exec: Option<u64>,
    need: &[(usize, u64)],
) -> Result<Vec<(usize, Reservation<'static>)>, CuResult> {
    let mut held = Vec::with_capacity(need.len());
    for &(dev, bytes) in need {
        let d = c_int::try_from(dev)
            .ok()
            .and_then(|c| checked_device(shim, c))
            .ok_or(CUDA_ERROR_INVALID_DEVICE)?;
        let (reserved, used) = graph_queries::graph_figures(d).unwrap_or((0, 0));
        let grow = graphs::expected_growth(bytes, reserved, used, GRAPHS.footprint_on(d, exec));
        if grow > 0 {
            held.push((d, reserve_on(shim, api, d, grow)?));
        }
    }
    Ok(held)
}

fn settle_all(devices: impl Iterator<Item = usize>, mut held: Vec<(usize, Reservation<'static>)>) {
    for d in devices {
        let r = held
            .iter()
            .position(|(h, _)| *h == d)
            .map(|i| held.swap_remove(i).1);
        settle(d, r);
    }
}

/// Moves `d`'s graph charge to the driver's figure. A rise is taken out of `r` (what was
/// reserved for it); a rise beyond it was made by the driver already and is charged
/// whatever the cap says (`residents::charge_done`), with a warning; what `r` does not
/// cover is given back.
fn settle(d: usize, r: Option<Reservation<'static>>) {
    GRAPHS.settle(
        d,
        || queries::Contexts.graph_reserved(d),
        |change| match change {
            Settle::Charge(rise) => {
                let reserved = r.as_ref().map_or(0, |r| r.charge().bytes);
                let beyond = rise.saturating_sub(reserved);
                super::residents::charge_done(d, r, rise);
                if beyond > 0 {
                    log!(
                        Warn,
                        "the driver reserved {} more graph memory on GPU {d} than gpucap expected: charged",
                        gpucap_core::size::format_bytes(beyond)
                    );
                }
            }
            Settle::Credit(n) => SHIM.ledger.settle(Charge {
                device: d,
                bytes: n,
            }),
            Settle::Same => {}
        },
    );
}
