//! CUDA arrays and mipmapped arrays (see `gpucap_core::arrays`).

use super::*;
use gpucap_core::arrays;

// ---------------------------------------------------------------------------
// CUDA arrays (see `arrays` for the estimate and why the size is asked afterwards).

/// Reserves the estimate, calls the driver, resizes to the size the driver reports;
/// destroys the array and refuses if that breaks the cap.
pub(super) fn array_charged(
    api: &str,
    shape: Option<Shape>,
    levels: u32,
    mipmapped: bool,
    handle: *mut Handle,
    call: impl FnOnce() -> CuResult,
) -> CuResult {
    let Some(shape) = shape.filter(|s| !s.takes_no_memory()) else {
        // No descriptor (the driver's error), or memory mapped in later from
        // cuMemCreate handles (charged there).
        if let Err(rc) = shim() {
            return rc;
        }
        return call();
    };
    let device = current_device();
    let target = match reserve(api, device, arrays::estimate(&shape, levels)) {
        Ok(t) => t,
        Err(rc) => return rc,
    };
    let rc = call();
    let (CUDA_SUCCESS, Target::Charged(mut r)) = (rc, target) else {
        return rc;
    };
    // SAFETY: the driver succeeded and filled the handle.
    let h = unsafe { *handle };
    let dev = r.charge().device;
    if let Some(actual) = queries::array_size(h, dev as c_int, mipmapped)
        && let Err(refusal) = SHIM.ledger.resize(&mut r, actual)
    {
        SHIM.refused(api, dev, actual, refusal);
        queries::destroy_array(h, mipmapped);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    array_map(mipmapped).insert(h as u64, r.charge());
    r.keep();
    SHIM.ledger.count_alloc(dev);
    rc
}

/// Destroys through the driver, crediting the array once the driver succeeded.
pub(super) fn array_released(
    mipmapped: bool,
    handle: Handle,
    call: impl FnOnce() -> CuResult,
) -> CuResult {
    if let Err(rc) = shim() {
        return rc;
    }
    let map = array_map(mipmapped);
    let taken = map.remove(handle as u64);
    // Announced to the pool before the driver frees it (see `Ledger::announce`).
    let freeing = taken.map(|c| SHIM.ledger.announce(c));
    let rc = call();
    match (rc, taken, freeing) {
        (CUDA_SUCCESS, _, Some(f)) => SHIM.ledger.settle_announced(f),
        (_, Some(c), Some(f)) => {
            SHIM.ledger.withdraw(f);
            map.insert(handle as u64, c);
        }
        _ => {}
    }
    rc
}

pub(super) fn shape_2d(desc: *const ArrayDescriptor) -> Option<Shape> {
    // SAFETY: a non-null descriptor is the caller's CUDA_ARRAY_DESCRIPTOR.
    unsafe { desc.as_ref() }.map(|d| Shape {
        width: d.width as u64,
        height: d.height as u64,
        depth: 0,
        format: d.format,
        channels: d.channels,
        flags: 0,
    })
}

pub(super) fn shape_3d(desc: *const Array3DDescriptor) -> Option<Shape> {
    // SAFETY: a non-null descriptor is the caller's CUDA_ARRAY3D_DESCRIPTOR.
    unsafe { desc.as_ref() }.map(|d| Shape {
        width: d.width as u64,
        height: d.height as u64,
        depth: d.depth as u64,
        format: d.format,
        channels: d.channels,
        flags: d.flags,
    })
}

pub fn array_create(
    real: unsafe extern "C" fn(*mut Handle, *const ArrayDescriptor) -> CuResult,
    handle: *mut Handle,
    desc: *const ArrayDescriptor,
) -> CuResult {
    // SAFETY (closure): forwarding the caller's arguments.
    array_charged(
        "cuArrayCreate",
        shape_2d(desc),
        1,
        false,
        handle,
        || unsafe { real(handle, desc) },
    )
}

pub fn array_3d_create(
    real: unsafe extern "C" fn(*mut Handle, *const Array3DDescriptor) -> CuResult,
    handle: *mut Handle,
    desc: *const Array3DDescriptor,
) -> CuResult {
    // SAFETY (closure): forwarding the caller's arguments.
    array_charged(
        "cuArray3DCreate",
        shape_3d(desc),
        1,
        false,
        handle,
        || unsafe { real(handle, desc) },
    )
}

pub fn array_create_v1(
    real: unsafe extern "C" fn(*mut Handle, *const ArrayDescriptorV1) -> CuResult,
    handle: *mut Handle,
    desc: *const ArrayDescriptorV1,
) -> CuResult {
    // SAFETY: a non-null descriptor is the caller's CUDA_ARRAY_DESCRIPTOR_v1.
    let shape = unsafe { desc.as_ref() }.map(|d| Shape {
        width: d.width.into(),
        height: d.height.into(),
        depth: 0,
        format: d.format,
        channels: d.channels,
        flags: 0,
    });
    // SAFETY (closure): forwarding the caller's arguments.
    array_charged("cuArrayCreate", shape, 1, false, handle, || unsafe {
        real(handle, desc)
    })
}

pub fn array_3d_create_v1(
    real: unsafe extern "C" fn(*mut Handle, *const Array3DDescriptorV1) -> CuResult,
    handle: *mut Handle,
    desc: *const Array3DDescriptorV1,
) -> CuResult {
    // SAFETY: a non-null descriptor is the caller's CUDA_ARRAY3D_DESCRIPTOR_v1.
    let shape = unsafe { desc.as_ref() }.map(|d| Shape {
        width: d.width.into(),
        height: d.height.into(),
        depth: d.depth.into(),
        format: d.format,
        channels: d.channels,
        flags: d.flags,
    });
    // SAFETY (closure): forwarding the caller's arguments.
    array_charged("cuArray3DCreate", shape, 1, false, handle, || unsafe {
        real(handle, desc)
    })
}

pub fn array_destroy(real: unsafe extern "C" fn(Handle) -> CuResult, handle: Handle) -> CuResult {
    // SAFETY (closure): forwarding the caller's argument.
    array_released(false, handle, || unsafe { real(handle) })
}

pub fn mipmapped_array_create(
    real: unsafe extern "C" fn(*mut Handle, *const Array3DDescriptor, u32) -> CuResult,
    handle: *mut Handle,
    desc: *const Array3DDescriptor,
    levels: u32,
) -> CuResult {
    // SAFETY (closure): forwarding the caller's arguments.
    array_charged(
        "cuMipmappedArrayCreate",
        shape_3d(desc),
        levels,
        true,
        handle,
        || unsafe { real(handle, desc, levels) },
    )
}

pub fn mipmapped_array_destroy(
    real: unsafe extern "C" fn(Handle) -> CuResult,
    handle: Handle,
) -> CuResult {
    // SAFETY (closure): forwarding the caller's argument.
    array_released(true, handle, || unsafe { real(handle) })
}
