//! Multicast objects (CUDA 12.1+: `cuMulticastCreate`, `cuMulticastAddDevice`,
//! `cuMulticastBindMem`/`BindAddr` and their `_v2`, `cuMulticastUnbind`), under
//! `FAKECUDA_MULTICAST=1` (off, every call is `CUDA_ERROR_NOT_SUPPORTED` and
//! `CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED` is 0, as on a GPU without NVLink multicast).
//!
//! As NVIDIA's driver API documents it: the object is a handle (released with
//! `cuMemRelease`, mapped with `cuMemMap` once every device it was made for was added) whose
//! `size` is "the maximum amount of memory that can be bound to this multicast object per
//! device"; the programming guide's example says of a new object "this has no devices and
//! no physical memory associated yet". So the object, and adding a device to it, take no
//! device memory here. What is bound is `cuMemCreate` memory (by handle, or by the address
//! it is mapped at), which was charged to its device when it was made. A binding holds that
//! memory as a mapping does (`cuMemRelease`: memory is freed once "all outstanding
//! references" are gone): a handle released and unmapped while bound keeps its memory until
//! `cuMulticastUnbind`, or until the object itself goes (its last release and unmap).
//! The real driver's answer to that case is not recorded (`edges.multicast.*` in
//! tests/c/driver_probe.c); this is the reading that never lets memory escape a count.
//!
//! The fake keeps objects within one process (an exported object's fd imports as plain
//! memory), and a bind before every device was added fails with
//! `CUDA_ERROR_INVALID_VALUE` where the driver would wait for the other processes.

use super::vmm::{MulticastBinding, MulticastDevices, vmm};
use crate::abi::{CUDA_ERROR_INVALID_DEVICE, CUDA_ERROR_INVALID_VALUE, CUresult, CuResult};

/// Whether every value is a whole number of granules.
fn aligned(values: &[usize]) -> bool {
    values
        .iter()
        .all(|v| v.is_multiple_of(super::vmm::GRANULARITY))
}

/// A new multicast object for `devices` devices, `size` bytes bindable per device.
pub fn create(devices: u32, size: usize) -> Result<u64, CUresult> {
    if devices == 0 || size == 0 || !aligned(&[size]) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    super::vmm::create_multicast(size, devices)
}

/// Adds device `dev` to the devices of object `mc` (no memory taken).
pub fn add_device(mc: u64, dev: usize) -> CuResult {
    let mut v = vmm();
    let devices = v
        .multicast_devices
        .get_mut(&mc)
        .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    if devices.added.contains(&dev) || devices.added.len() >= devices.made_for as usize {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    devices.added.push(dev);
    Ok(())
}

/// The devices of object `mc`, once every device it was made for was added.
fn complete(
    all: &super::HashMap<u64, MulticastDevices>,
    mc: u64,
) -> Result<&MulticastDevices, CUresult> {
    let devices = all.get(&mc).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    if devices.added.len() < devices.made_for as usize {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    Ok(devices)
}

/// Binds `size` bytes of handle `mem` from `mem_offset` at `mc_offset` of object `mc` for
/// device `dev` (None: the memory's own device, as `cuMulticastBindMem` does).
pub fn bind(
    mc: u64,
    dev: Option<usize>,
    mc_offset: usize,
    mem: u64,
    mem_offset: usize,
    size: usize,
) -> CuResult {
    let mut v = vmm();
    let devices = complete(&v.multicast_devices, mc)?;
    let mc_size = v.phys.get(&mc).ok_or(CUDA_ERROR_INVALID_VALUE)?.size;
    let p = v
        .phys
        .get(&mem)
        .filter(|p| p.bindable())
        .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let dev = dev.unwrap_or(p.dev);
    if !devices.added.contains(&dev) || !devices.added.contains(&p.dev) {
        return Err(CUDA_ERROR_INVALID_DEVICE);
    }
    let fits = mem_offset.checked_add(size).is_some_and(|e| e <= p.size)
        && mc_offset.checked_add(size).is_some_and(|e| e <= mc_size);
    if size == 0 || !aligned(&[mc_offset, mem_offset, size]) || !fits {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let end = mc_offset + size;
    let overlaps = v
        .bindings
        .range((mc, dev, 0)..(mc, dev, end))
        .any(|(&(_, _, off), b)| off + b.size > mc_offset);
    if overlaps {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    v.bindings
        .insert((mc, dev, mc_offset), MulticastBinding { handle: mem, size });
    v.phys.get_mut(&mem).unwrap().handle_refs += 1;
    Ok(())
}

/// Binds `size` bytes of the memory mapped at `ptr` (`cuMulticastBindAddr`).
pub fn bind_addr(
    mc: u64,
    dev: Option<usize>,
    mc_offset: usize,
    ptr: usize,
    size: usize,
) -> CuResult {
    let (base, m) = super::vmm::mapping_at(ptr).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    if ptr.checked_add(size).is_none_or(|e| e > base + m.size) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    bind(mc, dev, mc_offset, m.handle, ptr - base, size)
}

/// Unbinds what is bound on `dev` inside `[mc_offset, mc_offset + size)` of `mc`; the
/// memory of a handle nothing else holds is freed.
pub fn unbind(mc: u64, dev: usize, mc_offset: usize, size: usize) -> CuResult {
    let mut v = vmm();
    v.multicast_devices
        .get(&mc)
        .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let end = mc_offset
        .checked_add(size)
        .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let keys: Vec<_> = v
        .bindings
        .range((mc, dev, mc_offset)..(mc, dev, end))
        .filter(|((_, _, off), b)| off + b.size <= end)
        .map(|(&k, _)| k)
        .collect();
    if keys.is_empty() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    for k in keys {
        let b = v.bindings.remove(&k).unwrap();
        v.unhold(b.handle);
    }
    Ok(())
}
