//! Copies (cuMemcpy*) and memsets (cuMemset*): memmove and fill over ranges checked to be
//! accessible memory. Streams are synchronous, so the async forms only check the stream,
//! but on a stream in capture they record a memcpy or memset node in the capture's graph
//! instead. A graph's memcpy and memset nodes make their copies and fills here too (when
//! the graph is launched: `api/graph.rs`).

use crate::abi::types::CUdeviceptr;
use crate::abi::{CUDA_ERROR_INVALID_VALUE, CUresult, CuResult, note};
use crate::model::address::check_range;
use crate::model::ctx::Ctx;
use crate::model::device::cfg;
use crate::model::graph::{self, Copy1d, Memset, Node};
use crate::model::stream;
use libc::c_void;

/// `n` bytes from `src` to `dst`, their device ranges checked by the caller (a graph's
/// memcpy node's too: `api/graph.rs`).
pub(crate) fn copy(dst: usize, src: usize, n: usize) -> CuResult {
    if n == 0 {
        return Ok(());
    }
    if dst == 0 || src == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: both ranges were validated as accessible memory of n bytes (device ranges by
    // check_range, host ranges are the caller's responsibility as with the real driver).
    unsafe { libc::memmove(dst as *mut c_void, src as *const c_void, n) };
    Ok(())
}

/// Work issued on `stream`: when the stream captures, recorded as `node` in the capture's
/// graph (true), its checks made when the graph is launched, none now (cuDNN and cuBLAS
/// capture a memset to a placeholder address, which a real driver records); false when it
/// does not capture (the work is to be done now).
fn captured(stream: usize, node: impl FnOnce() -> Node) -> Result<bool, CUresult> {
    stream::check(stream)?;
    let Some(h) = graph::capture_work(stream, node) else {
        return Ok(false);
    };
    let h = h?;
    note(|| format!("captured as node {h:#x}"));
    Ok(true)
}

/// A memcpy node's copy of `n` bytes, a side of device memory range-checked when it runs.
fn copy_node(dst: u64, dst_device: bool, src: u64, src_device: bool, n: usize) -> Node {
    Node::Memcpy(Copy1d {
        dst,
        dst_device,
        src,
        src_device,
        n,
    })
}

/// A memset node's fill: `height` rows of `width` elements of `element_size` bytes.
fn set_node(
    dst: CUdeviceptr,
    pitch: usize,
    value: u32,
    element_size: u32,
    width: usize,
    height: usize,
) -> Node {
    Node::Memset(Memset {
        dst,
        pitch,
        value,
        element_size,
        width,
        height,
    })
}

fn htod(dst: CUdeviceptr, src: *const c_void, n: usize) -> CuResult {
    cfg()?;
    check_range(dst, n, true)?;
    copy(dst as usize, src as usize, n)
}

fn dtoh(dst: *mut c_void, src: CUdeviceptr, n: usize) -> CuResult {
    cfg()?;
    check_range(src, n, false)?;
    copy(dst as usize, src as usize, n)
}

fn dtod(dst: CUdeviceptr, src: CUdeviceptr, n: usize) -> CuResult {
    cfg()?;
    check_range(src, n, false)?;
    check_range(dst, n, true)?;
    copy(dst as usize, src as usize, n)
}

/// The bytes that `height` rows of `width` elements of `esz` bytes, `pitch` bytes apart,
/// span from `dst`, checked as writable device memory, `dst` and `pitch` as aligned to the
/// element (None: nothing to fill).
fn fill_span(
    dst: CUdeviceptr,
    pitch: usize,
    esz: usize,
    width: usize,
    height: usize,
) -> Result<Option<usize>, CUresult> {
    if !(dst as usize).is_multiple_of(esz) || !pitch.is_multiple_of(esz) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let row = width.checked_mul(esz).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    if height == 0 || width == 0 {
        return Ok(None);
    }
    let span = pitch
        .checked_mul(height - 1)
        .and_then(|s| s.checked_add(row))
        .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    check_range(dst, span, true)?;
    Ok(Some(span))
}

/// Fills `count` elements of `E` at `dst`, rows of `width` elements `pitch` bytes apart.
fn fill<E: Copy>(
    dst: CUdeviceptr,
    pitch: usize,
    value: E,
    width: usize,
    height: usize,
) -> CuResult {
    cfg()?;
    if fill_span(dst, pitch, std::mem::size_of::<E>(), width, height)?.is_none() {
        return Ok(());
    }
    for r in 0..height {
        let p = (dst as usize + r * pitch) as *mut E;
        // SAFETY: the whole span was validated as writable device memory, p is aligned.
        let s = unsafe { std::slice::from_raw_parts_mut(p, width) };
        s.fill(value);
    }
    Ok(())
}

/// The pitch a memset node's rows are apart: unused (0) for one row.
fn node_pitch(m: &Memset) -> usize {
    if m.height > 1 { m.pitch } else { 0 }
}

/// Checks a memset node's fill as a memset's arguments are checked (an element size of 1,
/// 2 or 4 bytes), without making it.
pub(crate) fn check_set(m: &Memset) -> CuResult {
    cfg()?;
    if ![1, 2, 4].contains(&m.element_size) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    fill_span(
        m.dst,
        node_pitch(m),
        m.element_size as usize,
        m.width,
        m.height,
    )
    .map(|_| ())
}

/// Makes a memset node's fill (its graph launched), checked as a memset is: the value's low
/// bytes.
pub(crate) fn set(m: &Memset) -> CuResult {
    let (dst, pitch, v) = (m.dst, node_pitch(m), m.value);
    match m.element_size {
        1 => fill(dst, pitch, v as u8, m.width, m.height),
        2 => fill(dst, pitch, v as u16, m.width, m.height),
        4 => fill(dst, pitch, v, m.width, m.height),
        _ => Err(CUDA_ERROR_INVALID_VALUE),
    }
}

crate::abi::exports! {
    fn cuMemcpy | cuMemcpy_ptds (dst: CUdeviceptr, src: CUdeviceptr, n: usize) {
        cfg()?;
        copy(dst as usize, src as usize, n)
    }

    fn cuMemcpyAsync | cuMemcpyAsync_ptsz (dst: CUdeviceptr, src: CUdeviceptr, n: usize, stream: usize) {
        if captured(stream, || copy_node(dst, false, src, false, n))? {
            return Ok(());
        }
        copy(dst as usize, src as usize, n)
    }

    fn cuMemcpyPeer | cuMemcpyPeer_ptds (dst: CUdeviceptr, dst_ctx: Ctx, src: CUdeviceptr, src_ctx: Ctx, n: usize) {
        let _ = (dst_ctx, src_ctx);
        dtod(dst, src, n)
    }

    fn cuMemcpyPeerAsync | cuMemcpyPeerAsync_ptsz (dst: CUdeviceptr, dst_ctx: Ctx, src: CUdeviceptr, src_ctx: Ctx, n: usize, stream: usize) {
        let _ = (dst_ctx, src_ctx);
        if captured(stream, || copy_node(dst, true, src, true, n))? {
            return Ok(());
        }
        dtod(dst, src, n)
    }

    fn cuMemcpyHtoD_v2 | cuMemcpyHtoD_v2_ptds (dst: CUdeviceptr, src: *const c_void, n: usize) {
        htod(dst, src, n)
    }

    fn cuMemcpyDtoH_v2 | cuMemcpyDtoH_v2_ptds (dst: *mut c_void, src: CUdeviceptr, n: usize) {
        dtoh(dst, src, n)
    }

    fn cuMemcpyDtoD_v2 | cuMemcpyDtoD_v2_ptds (dst: CUdeviceptr, src: CUdeviceptr, n: usize) {
        dtod(dst, src, n)
    }

    fn cuMemcpyHtoDAsync_v2 | cuMemcpyHtoDAsync_v2_ptsz (dst: CUdeviceptr, src: *const c_void, n: usize, stream: usize) {
        if captured(stream, || copy_node(dst, true, src as u64, false, n))? {
            return Ok(());
        }
        htod(dst, src, n)
    }

    fn cuMemcpyDtoHAsync_v2 | cuMemcpyDtoHAsync_v2_ptsz (dst: *mut c_void, src: CUdeviceptr, n: usize, stream: usize) {
        if captured(stream, || copy_node(dst as u64, false, src, true, n))? {
            return Ok(());
        }
        dtoh(dst, src, n)
    }

    fn cuMemcpyDtoDAsync_v2 | cuMemcpyDtoDAsync_v2_ptsz (dst: CUdeviceptr, src: CUdeviceptr, n: usize, stream: usize) {
        if captured(stream, || copy_node(dst, true, src, true, n))? {
            return Ok(());
        }
        dtod(dst, src, n)
    }

    fn cuMemsetD8_v2 | cuMemsetD8_v2_ptds (dst: CUdeviceptr, value: u8, n: usize) {
        fill(dst, 0, value, n, 1)
    }

    fn cuMemsetD16_v2 | cuMemsetD16_v2_ptds (dst: CUdeviceptr, value: u16, n: usize) {
        fill(dst, 0, value, n, 1)
    }

    fn cuMemsetD32_v2 | cuMemsetD32_v2_ptds (dst: CUdeviceptr, value: u32, n: usize) {
        fill(dst, 0, value, n, 1)
    }

    fn cuMemsetD8Async | cuMemsetD8Async_ptsz (dst: CUdeviceptr, value: u8, n: usize, stream: usize) {
        if captured(stream, || set_node(dst, 0, value.into(), 1, n, 1))? {
            return Ok(());
        }
        fill(dst, 0, value, n, 1)
    }

    fn cuMemsetD16Async | cuMemsetD16Async_ptsz (dst: CUdeviceptr, value: u16, n: usize, stream: usize) {
        if captured(stream, || set_node(dst, 0, value.into(), 2, n, 1))? {
            return Ok(());
        }
        fill(dst, 0, value, n, 1)
    }

    fn cuMemsetD32Async | cuMemsetD32Async_ptsz (dst: CUdeviceptr, value: u32, n: usize, stream: usize) {
        if captured(stream, || set_node(dst, 0, value, 4, n, 1))? {
            return Ok(());
        }
        fill(dst, 0, value, n, 1)
    }

    fn cuMemsetD2D8_v2 | cuMemsetD2D8_v2_ptds (dst: CUdeviceptr, pitch: usize, value: u8, width: usize, height: usize) {
        fill(dst, pitch, value, width, height)
    }

    fn cuMemsetD2D16_v2 | cuMemsetD2D16_v2_ptds (dst: CUdeviceptr, pitch: usize, value: u16, width: usize, height: usize) {
        fill(dst, pitch, value, width, height)
    }

    fn cuMemsetD2D32_v2 | cuMemsetD2D32_v2_ptds (dst: CUdeviceptr, pitch: usize, value: u32, width: usize, height: usize) {
        fill(dst, pitch, value, width, height)
    }

    fn cuMemsetD2D8Async | cuMemsetD2D8Async_ptsz (dst: CUdeviceptr, pitch: usize, value: u8, width: usize, height: usize, stream: usize) {
        if captured(stream, || set_node(dst, pitch, value.into(), 1, width, height))? {
            return Ok(());
        }
        fill(dst, pitch, value, width, height)
    }

    fn cuMemsetD2D16Async | cuMemsetD2D16Async_ptsz (dst: CUdeviceptr, pitch: usize, value: u16, width: usize, height: usize, stream: usize) {
        if captured(stream, || set_node(dst, pitch, value.into(), 2, width, height))? {
            return Ok(());
        }
        fill(dst, pitch, value, width, height)
    }

    fn cuMemsetD2D32Async | cuMemsetD2D32Async_ptsz (dst: CUdeviceptr, pitch: usize, value: u32, width: usize, height: usize, stream: usize) {
        if captured(stream, || set_node(dst, pitch, value, 4, width, height))? {
            return Ok(());
        }
        fill(dst, pitch, value, width, height)
    }
}
