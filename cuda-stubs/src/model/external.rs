//! Memory imported from another API (cuImportExternalMemory, cuDestroyExternalMemory):
//! Vulkan, OpenGL or another process exported it as an fd, and the other API allocated it,
//! so importing it takes no device memory here (its buffers, mapped by
//! `linear::map_external`, take none either). The driver owns the fd once the import
//! succeeded, as CUDA's documentation of `CU_EXTERNAL_MEMORY_HANDLE_TYPE_OPAQUE_FD` says,
//! and closes it at the destroy; buffers already mapped keep their own mapping.

use super::HashMap;
use std::sync::LazyLock;
use std::sync::Mutex;

use super::os::new_handle;
use crate::abi::{CUDA_ERROR_INVALID_HANDLE, CUDA_ERROR_INVALID_VALUE, CUresult, CuResult};
use libc::c_int;

/// One imported object.
#[derive(Debug, Clone, Copy)]
pub struct Imported {
    pub fd: c_int,
    /// Bytes the importer said the object has.
    pub size: u64,
}

static OBJECTS: LazyLock<Mutex<HashMap<usize, Imported>>> = LazyLock::new(Default::default);

fn objects() -> std::sync::MutexGuard<'static, HashMap<usize, Imported>> {
    OBJECTS.lock().unwrap_or_else(|e| e.into_inner())
}

/// Imports `size` bytes of the memory behind `fd` (taking the fd): the new object's handle.
/// CUDA_ERROR_INVALID_VALUE when the fd is not open or holds fewer bytes.
pub fn import(fd: c_int, size: u64) -> Result<usize, CUresult> {
    // SAFETY: fstat of the caller's fd into a zeroed buffer.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    if fd < 0 || size == 0 || unsafe { libc::fstat(fd, &mut st) } != 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    if (st.st_size as u64) < size {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let h = new_handle();
    objects().insert(h, Imported { fd, size });
    Ok(h)
}

/// The object behind `handle`.
pub fn get(handle: usize) -> Result<Imported, CUresult> {
    objects()
        .get(&handle)
        .copied()
        .ok_or(CUDA_ERROR_INVALID_HANDLE)
}

/// Destroys the object (its fd closed); buffers mapped onto it stay mapped until freed.
pub fn destroy(handle: usize) -> CuResult {
    let o = objects().remove(&handle).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    // SAFETY: the fd the import took over; ours to close.
    unsafe { libc::close(o.fd) };
    Ok(())
}
