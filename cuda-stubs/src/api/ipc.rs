//! Legacy CUDA IPC: cuIpcGetMemHandle, cuIpcOpenMemHandle(_v2), cuIpcCloseMemHandle.

use crate::abi::types::{CUdeviceptr, CUipcMemHandle};
use crate::abi::{CUDA_ERROR_INVALID_VALUE, TraceArg, note, out};
use crate::model::ctx::current;
use crate::model::device::{cfg, ledger};
use crate::model::ipc::{self, Contents};
use crate::model::linear;
use libc::c_uint;

/// A handle shows in trace lines as the process and allocation it names.
impl TraceArg for CUipcMemHandle {
    fn trace(&self, s: &mut String, _decimal: bool) {
        match Contents::parse(self) {
            Some(c) => s.push_str(&format!("{{pid {} alloc {}}}", c.pid, c.id)),
            None => s.push_str("{?}"),
        }
    }
}

crate::abi::exports! {
    fn cuIpcGetMemHandle(handle: *mut CUipcMemHandle, dptr: CUdeviceptr) {
        let l = ledger()?;
        if handle.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let (_, a) = linear::export_ipc(dptr as usize)?;
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
        // The device the memory lives on if this process sees it, else the current one.
        let dev = (0..l.devices()).find(|&d| l.phys(d) == c.phys as usize).unwrap_or(cur_dev);
        let (base, mapped) = ipc::open(&c, dev)?;
        if mapped {
            note(|| format!("ptr={base:#x}"));
        }
        out(pdptr, base as CUdeviceptr)
    }

    fn cuIpcCloseMemHandle(dptr: CUdeviceptr) {
        cfg()?;
        ipc::close(dptr as usize)
    }
}
