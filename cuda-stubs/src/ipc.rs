//! Legacy CUDA IPC: cuIpcGetMemHandle / cuIpcOpenMemHandle(_v2) / cuIpcCloseMemHandle.
//!
//! Exporting a cuMemAlloc allocation moves it onto a memfd (memory::export_ipc); the
//! 64-byte handle names the exporting process, that fd, the allocation id and its size.
//! Opening maps `/proc/PID/fd/FD` (same user, as with the real driver), after checking that
//! the fd still is that allocation's memfd. An opened mapping is not charged to this process:
//! the exporter pays for the memory (with FAKECUDA_SHARED, once, for everyone). Opening a
//! handle again returns the same address (reference counted). Unlike the real driver,
//! a process may open its own handles.

use std::collections::BTreeMap;
use std::sync::Mutex;

use once_cell::sync::Lazy;

use crate::abi::types::*;
use crate::abi::*;
use crate::context::current;
use crate::device::cfg;
use crate::memory::{PtrInfo, ledger, unmap};
use libc::c_uint;

impl TraceArg for CUipcMemHandle {
    fn trace(&self, s: &mut String, _decimal: bool) {
        match Contents::parse(self) {
            Some(c) => s.push_str(&format!("{{pid {} alloc {}}}", c.pid, c.id)),
            None => s.push_str("{?}"),
        }
    }
}

const MAGIC: &[u8; 8] = b"FAKEIPC1";

/// What a handle says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Contents {
    pid: u32,
    fd: i32,
    size: u64,
    len: u64,
    phys: u32,
    id: u64,
}

impl Contents {
    fn encode(&self) -> CUipcMemHandle {
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

    fn parse(h: &CUipcMemHandle) -> Option<Contents> {
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

    /// The memfd name memory::export_ipc gives the allocation.
    fn memfd_name(&self) -> String {
        format!("fakecuda-ipc-{}-{}", self.pid, self.id)
    }
}

#[derive(Debug, Clone, Copy)]
struct Opened {
    len: usize,
    size: usize,
    dev: usize,
    refs: u32,
    key: (u32, u64),
}

static OPENED: Lazy<Mutex<BTreeMap<usize, Opened>>> = Lazy::new(Default::default);

fn opened() -> std::sync::MutexGuard<'static, BTreeMap<usize, Opened>> {
    OPENED.lock().unwrap_or_else(|e| e.into_inner())
}

/// Pointer information of an opened IPC mapping containing `ptr`.
pub fn lookup(ptr: usize) -> Option<PtrInfo> {
    let m = opened();
    let (&base, o) = m.range(..=ptr).next_back()?;
    (ptr < base + o.len).then_some(PtrInfo {
        base,
        size: o.size,
        dev: o.dev,
        ctx: current().map(|c| c.0).unwrap_or(0),
        managed: false,
        pool: 0,
        id: o.key.1,
        host: false,
    })
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

crate::abi::exports! {
    fn cuIpcGetMemHandle(handle: *mut CUipcMemHandle, dptr: CUdeviceptr) {
        let l = ledger()?;
        if handle.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let (_, a) = crate::memory::export_ipc(dptr as usize)?;
        let c = Contents {
            pid: std::process::id(),
            fd: a.ipc_fd,
            size: a.size,
            len: a.len as u64,
            phys: l.phys(a.dev) as u32,
            id: a.id,
        };
        out(handle, c.encode())
    }

    fn cuIpcOpenMemHandle | cuIpcOpenMemHandle_v2 (pdptr: *mut CUdeviceptr, handle: CUipcMemHandle, flags: c_uint) {
        let (_, cur_dev) = current()?;
        let l = ledger()?;
        if pdptr.is_null() || flags & !1 != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let c = Contents::parse(&handle).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        let key = (c.pid, c.id);
        let mut m = opened();
        if let Some((&base, o)) = m.iter_mut().find(|(_, o)| o.key == key) {
            o.refs += 1;
            return out(pdptr, base as CUdeviceptr);
        }
        let base = open_mapping(&c)?;
        // The device the memory lives on if this process sees it, else the current one.
        let dev = (0..l.devices()).find(|&d| l.phys(d) == c.phys as usize).unwrap_or(cur_dev);
        m.insert(base, Opened { len: c.len as usize, size: c.size as usize, dev, refs: 1, key });
        note(|| format!("ptr={base:#x}"));
        out(pdptr, base as CUdeviceptr)
    }

    fn cuIpcCloseMemHandle(dptr: CUdeviceptr) {
        cfg()?;
        let mut m = opened();
        let o = m.get_mut(&(dptr as usize)).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        o.refs -= 1;
        if o.refs == 0 {
            let len = o.len;
            m.remove(&(dptr as usize));
            unmap(dptr as usize, len);
        }
        Ok(())
    }
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
