//! CUDA arrays and mipmapped arrays (see `gpucap_core::arrays`).

use std::ffi::c_int;

use super::current::current_device;
use super::{On, Target, reserve, shim};
use crate::driver::forward::Real;
use crate::driver::queries;
use crate::driver::types::{
    Array3DDescriptor, Array3DDescriptorV1, ArrayDescriptor, ArrayDescriptorV1,
    CUDA_ERROR_OUT_OF_MEMORY, CUDA_SUCCESS, CuResult, Handle, In, Out,
};
use crate::state::{SHIM, array_map};
use gpucap_core::arrays;
use gpucap_core::arrays::Shape;

// ---------------------------------------------------------------------------
// CUDA arrays (see `arrays` for the estimate and why the size is asked afterwards).

/// Reserves the estimate, calls the driver, resizes to the size the driver reports;
/// destroys the array and refuses if that breaks the cap.
pub(super) fn array_charged(
    api: &str,
    shape: Option<Shape>,
    levels: u32,
    mipmapped: bool,
    handle: Out<Handle>,
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
    let bytes = arrays::estimate(&shape, levels);
    let target = match reserve(api, On::Current(device), bytes, bytes) {
        Ok(t) => t,
        Err(rc) => return rc,
    };
    let rc = call();
    let (CUDA_SUCCESS, Target::Charged(mut r)) = (rc, target) else {
        return rc;
    };
    // The driver succeeded and filled the handle (a driver that wrote none: nothing
    // to charge it to).
    let Some(h) = handle.get() else {
        return rc;
    };
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

pub(super) fn shape_2d(desc: In<ArrayDescriptor>) -> Option<Shape> {
    desc.get().map(|d| Shape {
        width: d.width as u64,
        height: d.height as u64,
        depth: 0,
        format: d.format,
        channels: d.channels,
        flags: 0,
    })
}

pub(super) fn shape_3d(desc: In<Array3DDescriptor>) -> Option<Shape> {
    desc.get().map(|d| Shape {
        width: d.width as u64,
        height: d.height as u64,
        depth: d.depth as u64,
        format: d.format,
        channels: d.channels,
        flags: d.flags,
    })
}

pub fn array_create(
    real: Real<(Out<Handle>, In<ArrayDescriptor>)>,
    handle: Out<Handle>,
    desc: In<ArrayDescriptor>,
) -> CuResult {
    array_charged("cuArrayCreate", shape_2d(desc), 1, false, handle, || {
        real.call(handle, desc)
    })
}

pub fn array_3d_create(
    real: Real<(Out<Handle>, In<Array3DDescriptor>)>,
    handle: Out<Handle>,
    desc: In<Array3DDescriptor>,
) -> CuResult {
    array_charged("cuArray3DCreate", shape_3d(desc), 1, false, handle, || {
        real.call(handle, desc)
    })
}

pub fn array_create_v1(
    real: Real<(Out<Handle>, In<ArrayDescriptorV1>)>,
    handle: Out<Handle>,
    desc: In<ArrayDescriptorV1>,
) -> CuResult {
    let shape = desc.get().map(|d| Shape {
        width: d.width.into(),
        height: d.height.into(),
        depth: 0,
        format: d.format,
        channels: d.channels,
        flags: 0,
    });
    array_charged("cuArrayCreate", shape, 1, false, handle, || {
        real.call(handle, desc)
    })
}

pub fn array_3d_create_v1(
    real: Real<(Out<Handle>, In<Array3DDescriptorV1>)>,
    handle: Out<Handle>,
    desc: In<Array3DDescriptorV1>,
) -> CuResult {
    let shape = desc.get().map(|d| Shape {
        width: d.width.into(),
        height: d.height.into(),
        depth: d.depth.into(),
        format: d.format,
        channels: d.channels,
        flags: d.flags,
    });
    array_charged("cuArray3DCreate", shape, 1, false, handle, || {
        real.call(handle, desc)
    })
}

pub fn array_destroy(real: Real<(Handle,)>, handle: Handle) -> CuResult {
    super::vmm::array_unmapped(handle as u64, || {
        array_released(false, handle, || real.call(handle))
    })
}

pub fn mipmapped_array_create(
    real: Real<(Out<Handle>, In<Array3DDescriptor>, u32)>,
    handle: Out<Handle>,
    desc: In<Array3DDescriptor>,
    levels: u32,
) -> CuResult {
    array_charged(
        "cuMipmappedArrayCreate",
        shape_3d(desc),
        levels,
        true,
        handle,
        || real.call(handle, desc, levels),
    )
}

pub fn mipmapped_array_destroy(real: Real<(Handle,)>, handle: Handle) -> CuResult {
    super::vmm::array_unmapped(handle as u64, || {
        array_released(true, handle, || real.call(handle))
    })
}
