//! A multicast object as VMM memory (`model::multicast` is the API's side): a handle
//! with a memfd of its own and no device memory, the devices it was made for and those added,
//! and the memory bound to it.

use super::physical::{Backing, Phys, new_handle, own_memfd_named};
use super::vmm;
use crate::abi::types::CUmemAllocationProp;
use crate::abi::{CUDA_ERROR_OUT_OF_MEMORY, CUresult};

/// A multicast binding: memory bound to a multicast object, `size` bytes of `handle`.
pub(in crate::model) struct MulticastBinding {
    pub(in crate::model) handle: u64,
    pub(in crate::model) size: usize,
}

/// The devices of a multicast object: how many it was made for (`made_for`), and those
/// added so far (`cuMulticastAddDevice`).
pub(in crate::model) struct MulticastDevices {
    pub(in crate::model) made_for: u32,
    pub(in crate::model) added: Vec<usize>,
}

/// A new multicast object of `size` bytes per device for `devices` devices
/// (`model::multicast`): a sparse memfd of its own, so that it can be mapped, charged to
/// no device.
pub(in crate::model) fn create_multicast(size: usize, devices: u32) -> Result<u64, CUresult> {
    let fd = own_memfd_named("fakecuda-multicast", size).ok_or(CUDA_ERROR_OUT_OF_MEMORY)?;
    let mut v = vmm();
    // SAFETY: CUmemAllocationProp is plain data; all zeros is a valid value.
    let prop: CUmemAllocationProp = unsafe { std::mem::zeroed() };
    let h = new_handle(
        &mut v,
        Phys {
            backing: Backing::Own { fd },
            size,
            dev: 0,
            prop,
            handle_refs: 1,
            mappings: 0,
            imported: false,
            host: false,
            multicast: true,
        },
    );
    v.multicast_devices.insert(
        h,
        MulticastDevices {
            made_for: devices,
            added: Vec::new(),
        },
    );
    Ok(h)
}
