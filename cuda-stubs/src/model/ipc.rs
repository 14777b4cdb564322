//! Legacy CUDA IPC handles (cuIpcGetMemHandle / cuIpcOpenMemHandle / cuIpcCloseMemHandle).
//!
//! Exporting a cuMemAlloc allocation moves it onto a memfd (linear::export_ipc); the
//! 64-byte handle names the exporting process, that fd, the allocation id and its size.
//! Opening maps `/proc/PID/fd/FD` (same user, as with the real driver), after checking that
//! the fd still is that allocation's memfd. An opened mapping is not charged to this process:
//! the exporter pays for the memory (with FAKECUDA_SHARED, once, for everyone). Opening a
//! handle again returns the same address (reference counted). Unlike the real driver,
//! a process may open its own handles.

use std::collections::BTreeMap;
use std::sync::Mutex;

use std::sync::LazyLock;

use super::os::unmap;
use crate::abi::types::CUipcMemHandle;
use crate::abi::{CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_OUT_OF_MEMORY, CUresult, CuResult};

const MAGIC: &[u8; 8] = b"FAKEIPC1";

/// What a handle says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Contents {
    /// The exporting process.
    pub pid: u32,
    /// Its fd of the allocation's memfd.
    pub fd: i32,
    /// Bytes of the allocation.
    pub size: u64,
    /// Bytes mapped (size rounded up to pages).
    pub len: u64,
    /// The physical device it lives on.
    pub phys: u32,
    /// The allocation's id (linear::Alloc::id).
    pub id: u64,
}

impl Contents {
    pub fn encode(&self) -> CUipcMemHandle {
        let mut b = [0u8; 64];
        b[0..8].copy_from_slice(MAGIC);
        b[8..12].copy_from_slice(&self.pid.to_le_bytes());
        b[12..16].copy_from_slice(&self.fd.to_le_bytes());
        b[16..24].copy_from_slice(&self.size.to_le_bytes());
        b[24..32].copy_from_slice(&self.len.to_le_bytes());
        b[32..36].copy_from_slice(&self.phys.to_le_bytes());
        b[40..48].copy_from_slice(&self.id.to_le_bytes());
        CUipcMemHandle { reserved: b }
    }

    pub fn parse(h: &CUipcMemHandle) -> Option<Contents> {
        let b = &h.reserved;
        if &b[0..8] != MAGIC {
            return None;
        }
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().unwrap());
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap());
        Some(Contents {
            pid: u32_at(8),
            fd: u32_at(12) as i32,
            size: u64_at(16),
            len: u64_at(24),
            phys: u32_at(32),
            id: u64_at(40),
        })
    }

    /// The memfd name linear::export_ipc gives the allocation.
    fn memfd_name(&self) -> String {
        format!("fakecuda-ipc-{}-{}", self.pid, self.id)
    }
}

/// An opened handle's mapping.
#[derive(Debug, Clone, Copy)]
pub struct Opened {
    /// Bytes mapped.
    pub len: usize,
    /// Bytes of the allocation.
    pub size: usize,
    /// The device (ordinal) it counts as.
    pub dev: usize,
    refs: u32,
    /// (exporter pid, allocation id).
    pub key: (u32, u64),
}

static OPENED: LazyLock<Mutex<BTreeMap<usize, Opened>>> = LazyLock::new(Default::default);

fn opened() -> std::sync::MutexGuard<'static, BTreeMap<usize, Opened>> {
    OPENED.lock().unwrap_or_else(|e| e.into_inner())
}

/// The opened mapping containing `ptr`: (its start, the mapping).
pub fn opened_at(ptr: usize) -> Option<(usize, Opened)> {
    let m = opened();
    let (&base, o) = m.range(..=ptr).next_back()?;
    (ptr < base + o.len).then_some((base, *o))
}

fn open_mapping(c: &Contents) -> Result<usize, CUresult> {
    let path = format!("/proc/{}/fd/{}", c.pid, c.fd);
    // The fd must still be that allocation's memfd (not freed, fd number not reused).
    let target = std::fs::read_link(&path).map_err(|_| CUDA_ERROR_INVALID_VALUE)?;
    if !target
        .to_string_lossy()
        .contains(&format!("{} ", c.memfd_name()))
    {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let cpath = std::ffi::CString::new(path).unwrap();
    // SAFETY: opening a /proc fd link with a NUL-terminated path.
    let fd = unsafe { libc::open(cpath.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: a fresh shared mapping of the exporter's memfd; the fd is not needed after.
    let p = unsafe {
        let p = libc::mmap(
            std::ptr::null_mut(),
            c.len as usize,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd,
            0,
        );
        libc::close(fd);
        p
    };
    if p == libc::MAP_FAILED {
        return Err(CUDA_ERROR_OUT_OF_MEMORY);
    }
    Ok(p as usize)
}

/// Opens the handle `c` (cuIpcOpenMemHandle) as memory of device `dev`: (address, whether
/// it was mapped now). A handle opened before gives the same address, one more reference.
pub fn open(c: &Contents, dev: usize) -> Result<(usize, bool), CUresult> {
    let key = (c.pid, c.id);
    let mut m = opened();
    if let Some((&base, o)) = m.iter_mut().find(|(_, o)| o.key == key) {
        o.refs += 1;
        return Ok((base, false));
    }
    let base = open_mapping(c)?;
    m.insert(
        base,
        Opened {
            len: c.len as usize,
            size: c.size as usize,
            dev,
            refs: 1,
            key,
        },
    );
    Ok((base, true))
}

/// Drops one reference to the mapping at `ptr` (cuIpcCloseMemHandle); unmaps it at the last.
pub fn close(ptr: usize) -> CuResult {
    let mut m = opened();
    let o = m.get_mut(&ptr).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    o.refs -= 1;
    if o.refs == 0 {
        let len = o.len;
        m.remove(&ptr);
        unmap(ptr, len);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handle_round_trip() {
        let c = Contents {
            pid: 42,
            fd: 7,
            size: 1000,
            len: 4096,
            phys: 3,
            id: 99,
        };
        assert_eq!(Contents::parse(&c.encode()), Some(c));
        assert_eq!(Contents::parse(&CUipcMemHandle { reserved: [0; 64] }), None);
        assert_eq!(std::mem::size_of::<CUipcMemHandle>(), 64);
    }
}
