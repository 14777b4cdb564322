//! CUDA graphs as far as their memory goes: graphs of memory nodes (`cuGraphAddMemAllocNode`,
//! `cuGraphAddMemFreeNode`, or `cuMemAllocAsync`/`cuMemFreeAsync` on a capturing stream), of
//! kernel nodes (a launch of the graph launches them, which runs nothing) and of memcpy and
//! memset nodes (added, or async copies and memsets on a capturing stream: a launch of the
//! graph makes them, in order), their executable graphs, and each device's graph memory
//! pool, modelled on the driver:
//!
//! - An alloc node gets its address when it is made (fixed for the node's life); no
//!   device memory is taken then.
//! - An executable graph needs physical memory for its allocations: its footprint, the
//!   sizes of its alloc nodes in whole 2 MiB granules, per device (no reuse between the
//!   allocations of one graph). The device's graph pool reserves it at `cuGraphInstantiate`
//!   (a program that instantiated a graph holds the memory until it trims: "CUDA graph
//!   instantiation reserves per-device memory that survives cudaGraphExecDestroy", as users
//!   of CUDA 13.2 report), taking first what the pool holds unbound, growing by the rest
//!   (charged to the device: OUT_OF_MEMORY when it does not fit). A graph unbound by a trim
//!   reserves again at its next `cuGraphUpload` or `cuGraphLaunch`.
//! - A launch runs at once: its allocations are live together (`USED_MEM_HIGH`), and those
//!   it frees are free again when it returns; an allocation the graph does not free stays
//!   live (used) until `cuMemFree`/`cuMemFreeAsync`, a free node of a later launch, or the
//!   next launch of an exec made with `AUTO_FREE_ON_LAUNCH`; relaunching before is an error.
//! - `cuGraphExecDestroy` unbinds the exec's memory: it stays reserved (cached for other
//!   graphs) until `cuDeviceGraphMemTrim`, which gives back every byte not bound to an
//!   exec with live allocations (no graph runs while the fake returns).
//!
//! Files: `graph/nodes.rs` (what each kind of node holds), `graph/pool.rs` (a device's
//! graph memory pool: reserved, bound and used bytes), `graph/capture.rs` (stream capture
//! and the calls a capture forbids); graphs and executable graphs here.

use super::HashMap;
use std::sync::{LazyLock, Mutex, MutexGuard};

use super::device::ledger;
use super::os::{map_anonymous, new_handle, unmap};
use crate::abi::types::{
    CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH, CUmemAccessDesc, CUmemPoolProps,
};
use crate::abi::{CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_OUT_OF_MEMORY, CUresult, CuResult};
use fake_gpu::identity::MAX_DEVICES;

mod capture;
mod nodes;
mod pool;

pub use capture::{
    begin_capture, capture_of, capture_status, capture_work, end_capture, refuse_during_capture,
};
pub use nodes::{AllocNode, Copy1d, KernelNode, Memset, Node};
pub use pool::{GraphPool, granules};

#[derive(Debug)]
struct Exec {
    /// Bytes bound per device while `bound`.
    footprint: Vec<(usize, u64)>,
    /// The alloc and free nodes, copied at instantiation.
    nodes: Vec<Node>,
    /// The graph's kernel nodes at instantiation (whose parameters an update may set).
    kernels: Vec<usize>,
    /// Its memcpy and memset nodes, in the graph's order, with the copy or fill each makes
    /// (an update may change it), and its kernel nodes whose threads take local memory
    /// (the stack grows to it when the graph runs).
    work: Vec<(usize, Node)>,
    bound: bool,
    auto_free: bool,
    /// Allocations a launch left live: (dptr, device, size).
    live: Vec<(u64, usize, u64)>,
}

#[derive(Default)]
struct Graphs {
    /// Graph -> its nodes' handles, in order.
    graphs: HashMap<usize, Vec<usize>>,
    nodes: HashMap<usize, (usize, Node)>,
    execs: HashMap<usize, Exec>,
    /// Per device ordinal (MAX_DEVICES of them).
    pools: Vec<GraphPool>,
    /// Allocations left live by an exec destroyed since: dptr -> (device, granules).
    orphans: HashMap<u64, (usize, u64, u64)>,
    /// Capturing stream -> its capture (`graph/capture.rs`).
    capturing: HashMap<usize, capture::Capture>,
    next_capture_id: u64,
}

static GRAPHS: LazyLock<Mutex<Graphs>> = LazyLock::new(|| {
    Mutex::new(Graphs {
        pools: vec![GraphPool::default(); MAX_DEVICES],
        ..Default::default()
    })
});

fn graphs() -> MutexGuard<'static, Graphs> {
    GRAPHS.lock().unwrap_or_else(|e| e.into_inner())
}

impl Graphs {
    fn alloc_node(&self, dptr: u64) -> Option<&AllocNode> {
        self.nodes.values().find_map(|(_, n)| match n {
            Node::Alloc(a) if a.dptr == dptr => Some(a),
            _ => None,
        })
    }

    fn add(&mut self, graph: usize, node: Node) -> Result<usize, CUresult> {
        let list = self
            .graphs
            .get_mut(&graph)
            .ok_or(CUDA_ERROR_INVALID_VALUE)?;
        let h = new_handle();
        list.push(h);
        self.nodes.insert(h, (graph, node));
        Ok(h)
    }

    /// Binds `exec`'s footprint if it is not bound: all devices or none.
    fn bind(&mut self, exec: usize) -> CuResult {
        let l = ledger()?;
        let e = self.execs.get(&exec).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        if e.bound {
            return Ok(());
        }
        let footprint = e.footprint.clone();
        let mut done: Vec<(usize, u64, u64)> = Vec::new();
        for &(dev, need) in &footprint {
            let grow = self.pools[dev].growth(need);
            if grow > 0
                && let Err(rc) = l.charge(dev, grow)
            {
                for &(d, n, g) in &done {
                    let p = &mut self.pools[d];
                    (p.bound, p.reserved) = (p.bound - n, p.reserved - g);
                    l.uncharge(d, g);
                }
                return Err(rc);
            }
            self.pools[dev].bind(need, grow);
            done.push((dev, need, grow));
        }
        self.execs.get_mut(&exec).expect("checked above").bound = true;
        Ok(())
    }

    /// Frees a graph allocation left live by a launch; false if `dptr` is none.
    fn free_live(&mut self, dptr: u64) -> bool {
        if let Some((dev, size, held)) = self.orphans.remove(&dptr) {
            let p = &mut self.pools[dev];
            p.used -= size;
            p.bound -= held;
            return true;
        }
        for e in self.execs.values_mut() {
            if let Some(i) = e.live.iter().position(|&(p, _, _)| p == dptr) {
                let (_, dev, size) = e.live.swap_remove(i);
                self.pools[dev].used -= size;
                return true;
            }
        }
        false
    }
}

/// A new, empty graph.
pub fn create() -> usize {
    let h = new_handle();
    graphs().graphs.insert(h, Vec::new());
    h
}

/// Whether `graph` exists.
pub fn exists(graph: usize) -> bool {
    graphs().graphs.contains_key(&graph)
}

/// cuGraphDestroy: the graph and its nodes go (their addresses with them); executable
/// graphs made from it stay.
pub fn destroy(graph: usize) -> CuResult {
    let mut g = graphs();
    let nodes = g.graphs.remove(&graph).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    for h in nodes {
        if let Some((_, Node::Alloc(a))) = g.nodes.remove(&h) {
            unmap(a.dptr as usize, a.size as usize);
        }
    }
    g.capturing.retain(|_, c| c.graph != graph);
    Ok(())
}

/// An alloc node of `size` bytes on `dev`: its address is reserved now, no memory taken.
pub fn add_alloc(
    graph: usize,
    dev: usize,
    size: u64,
    props: CUmemPoolProps,
    access: Vec<CUmemAccessDesc>,
) -> Result<(usize, u64), CUresult> {
    let mut g = graphs();
    if !g.graphs.contains_key(&graph) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let len = usize::try_from(size).map_err(|_| CUDA_ERROR_OUT_OF_MEMORY)?;
    let dptr = map_anonymous(len).ok_or(CUDA_ERROR_OUT_OF_MEMORY)? as u64;
    let node = Node::Alloc(AllocNode {
        dev,
        size,
        dptr,
        props,
        access,
    });
    Ok((g.add(graph, node)?, dptr))
}

/// A free node of a graph allocation (of this graph or another; once per graph).
pub fn add_free(graph: usize, dptr: u64) -> Result<usize, CUresult> {
    let mut g = graphs();
    let list = g.graphs.get(&graph).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let twice = list
        .iter()
        .any(|h| matches!(g.nodes.get(h), Some((_, Node::Free(p))) if *p == dptr));
    if twice || g.alloc_node(dptr).is_none() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    g.add(graph, Node::Free(dptr))
}

/// A memcpy node of `graph`.
pub fn add_memcpy(graph: usize, c: Copy1d) -> Result<usize, CUresult> {
    graphs().add(graph, Node::Memcpy(c))
}

/// A memset node of `graph`.
pub fn add_memset(graph: usize, m: Memset) -> Result<usize, CUresult> {
    graphs().add(graph, Node::Memset(m))
}

/// Sets the copy or fill (`work`) a memcpy or memset node of the graph `exec` was
/// instantiated from makes in `exec`: CUDA_ERROR_INVALID_VALUE if it is no such node, or
/// a node of the other kind.
pub fn set_exec_work(exec: usize, node: usize, work: Node) -> CuResult {
    let mut g = graphs();
    let e = g.execs.get_mut(&exec).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let slot = e.work.iter_mut().find(|(h, _)| *h == node);
    let (_, old) = slot.ok_or(CUDA_ERROR_INVALID_VALUE)?;
    if std::mem::discriminant(old) != std::mem::discriminant(&work) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    *old = work;
    Ok(())
}

/// A node of a graph given new parameters of its kind (`cuGraphKernelNodeSetParams`,
/// `cuGraphNodeSetParams`): CUDA_ERROR_INVALID_VALUE for no such node or another kind.
/// Executable graphs made from the graph keep what they were made with.
pub fn set_node(node: usize, work: Node) -> CuResult {
    let mut g = graphs();
    let (_, old) = g.nodes.get_mut(&node).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    if std::mem::discriminant(old) != std::mem::discriminant(&work) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    *old = work;
    Ok(())
}

/// A kernel node of `graph`.
pub fn add_kernel(graph: usize, k: KernelNode) -> Result<usize, CUresult> {
    graphs().add(graph, Node::Kernel(k))
}

/// The nodes of `graph`, in the order they were added.
pub fn nodes(graph: usize) -> Result<Vec<usize>, CUresult> {
    graphs()
        .graphs
        .get(&graph)
        .cloned()
        .ok_or(CUDA_ERROR_INVALID_VALUE)
}

/// A node; CUDA_ERROR_INVALID_VALUE if there is no such node.
pub fn node(node: usize) -> Result<Node, CUresult> {
    graphs()
        .nodes
        .get(&node)
        .map(|(_, n)| n.clone())
        .ok_or(CUDA_ERROR_INVALID_VALUE)
}

/// The address of an alloc node's access descriptors (owned by the node).
pub fn access_of(node: usize) -> *const CUmemAccessDesc {
    match graphs().nodes.get(&node) {
        Some((_, Node::Alloc(a))) if !a.access.is_empty() => a.access.as_ptr(),
        _ => std::ptr::null(),
    }
}

/// cuGraphInstantiate*: an executable graph of `graph`, its memory reserved now.
pub fn instantiate(graph: usize, flags: u64) -> Result<usize, CUresult> {
    let mut g = graphs();
    let list = g.graphs.get(&graph).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let nodes: Vec<Node> = list
        .iter()
        .filter_map(|h| g.nodes.get(h))
        .map(|(_, n)| n.clone())
        .collect();
    let kernels: Vec<usize> = list
        .iter()
        .copied()
        .filter(|h| matches!(g.nodes.get(h), Some((_, Node::Kernel(_)))))
        .collect();
    let work: Vec<(usize, Node)> = list
        .iter()
        .filter_map(|h| match g.nodes.get(h) {
            Some((_, n @ (Node::Memcpy(_) | Node::Memset(_)))) => Some((*h, n.clone())),
            // A kernel whose threads take local memory: its launch grows the stack.
            Some((_, n @ Node::Kernel(k))) if k.local > 0 => Some((*h, n.clone())),
            _ => None,
        })
        .collect();
    let mut footprint: Vec<(usize, u64)> = Vec::new();
    for n in &nodes {
        if let Node::Alloc(a) = n {
            match footprint.iter_mut().find(|(d, _)| *d == a.dev) {
                Some((_, b)) => *b = b.saturating_add(granules(a.size)),
                None => footprint.push((a.dev, granules(a.size))),
            }
        }
    }
    let exec = new_handle();
    let e = Exec {
        footprint,
        nodes,
        kernels,
        work,
        bound: false,
        auto_free: flags & CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH != 0,
        live: Vec::new(),
    };
    g.execs.insert(exec, e);
    if let Err(rc) = g.bind(exec) {
        g.execs.remove(&exec);
        return Err(rc);
    }
    Ok(exec)
}

/// Whether `node` is a kernel node of the graph `exec` was instantiated from (an update of
/// its parameters in `exec` may be made): CUDA_ERROR_INVALID_VALUE if not.
pub fn exec_kernel(exec: usize, node: usize) -> CuResult {
    match graphs().execs.get(&exec) {
        Some(e) if e.kernels.contains(&node) => Ok(()),
        _ => Err(CUDA_ERROR_INVALID_VALUE),
    }
}

/// cuGraphUpload: the exec's memory reserved if it is not.
pub fn upload(exec: usize) -> CuResult {
    graphs().bind(exec)
}

/// cuGraphLaunch: reserved if not yet, then run at once; the copies and fills its memcpy
/// and memset nodes make (those nodes), and its kernel nodes that take local memory, in
/// order, are returned for the caller to make.
pub fn launch(exec: usize) -> Result<Vec<Node>, CUresult> {
    let mut g = graphs();
    let e = g.execs.get(&exec).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    if !e.live.is_empty() && !e.auto_free {
        // Its allocations of the last launch are not freed yet.
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let stale: Vec<u64> = e.live.iter().map(|&(p, _, _)| p).collect();
    for p in stale {
        g.free_live(p);
    }
    g.bind(exec)?;
    let nodes = g.execs[&exec].nodes.clone();
    let own = |p: u64| {
        nodes
            .iter()
            .any(|n| matches!(n, Node::Alloc(a) if a.dptr == p))
    };
    let freed: Vec<u64> = nodes
        .iter()
        .filter_map(|n| match n {
            Node::Free(p) => Some(*p),
            _ => None,
        })
        .collect();
    // Every allocation of the launch is live at once, then those it frees go.
    let mut live = Vec::new();
    for n in &nodes {
        if let Node::Alloc(a) = n {
            g.pools[a.dev].allocated(a.size);
            live.push((a.dptr, a.dev, a.size));
        }
    }
    for p in freed {
        if own(p) {
            if let Some(i) = live.iter().position(|&(q, _, _)| q == p) {
                let (_, dev, size) = live.swap_remove(i);
                g.pools[dev].used -= size;
            }
        } else {
            g.free_live(p);
        }
    }
    let e = g.execs.get_mut(&exec).expect("checked above");
    e.live = live;
    Ok(e.work.iter().map(|(_, n)| n.clone()).collect())
}

/// The contexts (handles) the kernel nodes of executable graph `exec` run in (0: the current one).
pub fn kernel_contexts(exec: usize) -> Result<Vec<usize>, CUresult> {
    let g = graphs();
    let e = g.execs.get(&exec).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let mut ctxs: Vec<usize> = Vec::new();
    for n in &e.nodes {
        if let Node::Kernel(k) = n
            && !ctxs.contains(&k.ctx)
        {
            ctxs.push(k.ctx);
        }
    }
    Ok(ctxs)
}

/// cuGraphExecDestroy: its memory stays reserved, unbound, but for allocations it left
/// live, which stay bound until freed.
pub fn exec_destroy(exec: usize) -> CuResult {
    let mut g = graphs();
    let e = g.execs.remove(&exec).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    if e.bound {
        for &(dev, need) in &e.footprint {
            g.pools[dev].bound -= need;
        }
        for &(p, dev, size) in &e.live {
            g.pools[dev].bound += granules(size);
            g.orphans.insert(p, (dev, size, granules(size)));
        }
    }
    Ok(())
}

/// cuMemFree/cuMemFreeAsync of a graph allocation a launch left live; false if `dptr` is
/// not one.
pub fn free_live(dptr: u64) -> bool {
    graphs().free_live(dptr)
}

/// cuDeviceGraphMemTrim: every exec without live allocations is unbound, and what is not
/// bound goes back to the device.
pub fn trim(dev: usize) {
    let mut g = graphs();
    let mut unbound: Vec<(usize, u64)> = Vec::new();
    for e in g.execs.values_mut() {
        if e.bound && e.live.is_empty() && e.footprint.iter().any(|&(d, _)| d == dev) {
            // Unbound on every device it holds memory of (cached there until their trim).
            e.bound = false;
            unbound.extend_from_slice(&e.footprint);
        }
    }
    for (d, n) in unbound {
        g.pools[d].bound -= n;
    }
    let freed = g.pools[dev].trim();
    if freed > 0
        && let Ok(l) = ledger()
    {
        l.uncharge(dev, freed);
    }
}

/// A device's graph pool.
pub fn pool(dev: usize) -> GraphPool {
    graphs().pools[dev]
}

/// Resets a high-water mark to the current figure.
pub fn reset_high(dev: usize, reserved: bool) {
    let p = &mut graphs().pools[dev];
    if reserved {
        p.reserved_high = p.reserved;
    } else {
        p.used_high = p.used;
    }
}

/// A captured cuMemFreeAsync: a free node when `dptr` is a graph allocation (None when it
/// is not: freed at once).
pub fn captured_free(graph: usize, dptr: u64) -> Option<CuResult> {
    let is_graph_memory = graphs().alloc_node(dptr).is_some();
    is_graph_memory.then(|| add_free(graph, dptr).map(|_| ()))
}
