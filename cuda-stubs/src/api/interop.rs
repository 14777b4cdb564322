//! Graphics interop (OpenGL, EGL, VDPAU): the entry points a real Linux driver exports
//! (cudaGL.h, cudaEGL.h, cudaVDPAU.h) and hands out through cuGetProcAddress — cudart
//! fetches them all at start-up. The fake has no graphics: each answers as the driver does
//! where no interop is possible: no OpenGL context or VDPAU device is ever current
//! (CUDA_ERROR_INVALID_GRAPHICS_CONTEXT, no devices listed), no EGL stream, image or
//! graphics resource can be valid (CUDA_ERROR_INVALID_HANDLE). `cuGLInit` (a no-op since
//! CUDA 3.0) succeeds and `cuGLCtxCreate` makes a plain context, as `cuCtxCreate`.

use crate::abi::{CUDA_ERROR_INVALID_HANDLE, CUDA_ERROR_INVALID_VALUE, CUresult, CuResult, out};
use crate::model::ctx::Ctx;
use crate::model::device::cfg;
use libc::{c_int, c_uint, c_void};

/// CUDA_ERROR_INVALID_GRAPHICS_CONTEXT: no OpenGL context or VDPAU device is current.
const CUDA_ERROR_INVALID_GRAPHICS_CONTEXT: CUresult = 219;

/// Initialised, then no graphics context.
fn no_graphics() -> CuResult {
    cfg()?;
    Err(CUDA_ERROR_INVALID_GRAPHICS_CONTEXT)
}

/// Initialised, then no valid EGL object.
fn no_egl() -> CuResult {
    cfg()?;
    Err(CUDA_ERROR_INVALID_HANDLE)
}

/// cuGLGetDevices(_v2): no CUDA device corresponds to the (absent) current GL context.
fn gl_devices(count: *mut c_uint) -> CuResult {
    cfg()?;
    if count.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    out(count, 0)?;
    Err(CUDA_ERROR_INVALID_GRAPHICS_CONTEXT)
}

crate::abi::exports! {
    fn cuGLInit() {
        cfg().map(|_| ())
    }

    fn cuGLCtxCreate | cuGLCtxCreate_v2 (pctx: *mut Ctx, flags: c_uint, dev: c_int) {
        super::context::create(pctx, flags, dev)
    }

    fn cuGLGetDevices | cuGLGetDevices_v2 (count: *mut c_uint, devices: *mut c_int, size: c_uint, list: c_int) {
        let _ = (devices, size, list);
        gl_devices(count)
    }

    fn cuGraphicsGLRegisterBuffer(res: *mut *mut c_void, buffer: c_uint, flags: c_uint) {
        let _ = (res, buffer, flags);
        no_graphics()
    }

    fn cuGraphicsGLRegisterImage(res: *mut *mut c_void, image: c_uint, target: c_uint, flags: c_uint) {
        let _ = (res, image, target, flags);
        no_graphics()
    }

    fn cuGLRegisterBufferObject | cuGLUnregisterBufferObject | cuGLUnmapBufferObject (buffer: c_uint) {
        let _ = buffer;
        no_graphics()
    }

    fn cuGLSetBufferObjectMapFlags(buffer: c_uint, flags: c_uint) {
        let _ = (buffer, flags);
        no_graphics()
    }

    fn cuGLUnmapBufferObjectAsync(buffer: c_uint, stream: usize) {
        let _ = (buffer, stream);
        no_graphics()
    }

    fn cuGLMapBufferObject | cuGLMapBufferObject_v2 | cuGLMapBufferObject_v2_ptds (dptr: *mut c_void, size: *mut c_void, buffer: c_uint) {
        let _ = (dptr, size, buffer);
        no_graphics()
    }

    fn cuGLMapBufferObjectAsync | cuGLMapBufferObjectAsync_v2 | cuGLMapBufferObjectAsync_v2_ptsz (dptr: *mut c_void, size: *mut c_void, buffer: c_uint, stream: usize) {
        let _ = (dptr, size, buffer, stream);
        no_graphics()
    }

    fn cuVDPAUGetDevice(pdev: *mut c_int, vdp_device: c_uint, get_proc_address: *mut c_void) {
        let _ = (pdev, vdp_device, get_proc_address);
        no_graphics()
    }

    fn cuVDPAUCtxCreate | cuVDPAUCtxCreate_v2 (pctx: *mut Ctx, flags: c_uint, dev: c_int, vdp_device: c_uint, get_proc_address: *mut c_void) {
        let _ = (pctx, flags, dev, vdp_device, get_proc_address);
        no_graphics()
    }

    fn cuGraphicsVDPAURegisterVideoSurface | cuGraphicsVDPAURegisterOutputSurface (res: *mut *mut c_void, surface: c_uint, flags: c_uint) {
        let _ = (res, surface, flags);
        no_graphics()
    }

    fn cuGraphicsEGLRegisterImage(res: *mut *mut c_void, image: *mut c_void, flags: c_uint) {
        let _ = (res, image, flags);
        no_egl()
    }

    fn cuGraphicsResourceGetMappedEglFrame(frame: *mut c_void, res: *mut c_void, index: c_uint, level: c_uint) {
        let _ = (frame, res, index, level);
        no_egl()
    }

    fn cuEGLStreamConsumerConnect | cuEGLStreamProducerConnect (conn: *mut c_void, stream: *mut c_void) {
        let _ = (conn, stream);
        no_egl()
    }

    fn cuEGLStreamConsumerConnectWithFlags(conn: *mut c_void, stream: *mut c_void, flags: c_uint) {
        let _ = (conn, stream, flags);
        no_egl()
    }

    fn cuEGLStreamConsumerDisconnect | cuEGLStreamProducerDisconnect (conn: *mut c_void) {
        let _ = conn;
        no_egl()
    }

    fn cuEGLStreamConsumerAcquireFrame(conn: *mut c_void, res: *mut c_void, stream: *mut c_void, timeout: c_uint) {
        let _ = (conn, res, stream, timeout);
        no_egl()
    }

    fn cuEGLStreamConsumerReleaseFrame(conn: *mut c_void, res: *mut c_void, stream: *mut c_void) {
        let _ = (conn, res, stream);
        no_egl()
    }

    // (The frame is passed by value, then the stream: neither is read.)
    fn cuEGLStreamProducerPresentFrame(conn: *mut c_void) {
        let _ = conn;
        no_egl()
    }

    fn cuEGLStreamProducerReturnFrame(conn: *mut c_void, frame: *mut c_void, stream: *mut c_void) {
        let _ = (conn, frame, stream);
        no_egl()
    }
}
