//! Shareable handles (cuMemExportToShareableHandle, cuMemImportFromShareableHandle): a
//! handle with a memfd of its own exported as a new fd, and an fd imported as a handle
//! the exporter pays for.

use libc::c_int;

use super::physical::{Backing, Phys, new_handle};
use super::vmm;
use crate::abi::types::{
    CU_MEM_ALLOCATION_TYPE_PINNED, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
    CU_MEM_LOCATION_TYPE_DEVICE, CUmemAllocationProp, CUmemLocation,
};
use crate::abi::{CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_OUT_OF_MEMORY, CUresult};
use crate::model::ctx::current;
use crate::model::device::ledger;
use crate::model::os::page_size;

/// A new fd of the handle's memfd for the caller to own (cuMemExportToShareableHandle):
/// only handles created with the fd handle type requested, or imported, have one.
pub fn export_fd(handle: u64) -> Result<c_int, CUresult> {
    let fd = match vmm()
        .phys
        .get(&handle)
        .ok_or(CUDA_ERROR_INVALID_VALUE)?
        .backing
    {
        Backing::Own { fd } => fd,
        Backing::Arena { .. } => return Err(CUDA_ERROR_INVALID_VALUE),
    };
    // SAFETY: duplicating our own memfd for the caller to own.
    let dup = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) };
    if dup < 0 {
        return Err(CUDA_ERROR_OUT_OF_MEMORY);
    }
    Ok(dup)
}

/// A handle over the memory behind the caller's `fd` (cuMemImportFromShareableHandle), not
/// charged (the exporter pays): (handle, size). It lives on the exporter's device if this
/// process sees it (read from the memfd's name), else on the current device.
pub fn import(fd: c_int) -> Result<(u64, usize), CUresult> {
    let ledger = ledger()?;
    // SAFETY: fstat of the caller's fd into a zeroed buffer.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    if fd < 0 || unsafe { libc::fstat(fd, &mut st) } != 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let size = st.st_size as usize;
    if size == 0 || !size.is_multiple_of(page_size()) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // The exporter named the memfd after its physical device: use that device if this
    // process sees it, else the current one.
    let phys = std::fs::read_link(format!("/proc/self/fd/{fd}"))
        .ok()
        .and_then(|t| {
            let t = t.to_string_lossy().into_owned();
            let rest = &t[t.find("fakecuda-vmm-d")? + "fakecuda-vmm-d".len()..];
            rest.split(|c: char| !c.is_ascii_digit())
                .next()?
                .parse::<usize>()
                .ok()
        });
    let dev = phys
        .and_then(|p| (0..ledger.devices()).find(|&d| ledger.phys(d) == p))
        .or_else(|| current().ok().map(|c| c.1))
        .unwrap_or(0);
    // SAFETY: duplicating the caller's fd; the caller keeps (and closes) theirs.
    let own = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) };
    if own < 0 {
        return Err(CUDA_ERROR_OUT_OF_MEMORY);
    }
    // SAFETY: CUmemAllocationProp is plain data; all zeros is a valid value.
    let mut prop: CUmemAllocationProp = unsafe { std::mem::zeroed() };
    prop.type_ = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.requested_handle_types = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    prop.location = CUmemLocation {
        type_: CU_MEM_LOCATION_TYPE_DEVICE,
        id: dev as c_int,
    };
    let mut v = vmm();
    let h = new_handle(
        &mut v,
        Phys {
            backing: Backing::Own { fd: own },
            size,
            dev,
            prop,
            handle_refs: 1,
            mappings: 0,
            imported: true,
            host: false,
            multicast: false,
        },
    );
    Ok((h, size))
}
