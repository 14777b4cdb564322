//! What the deprecated launches (`cuLaunch`, `cuLaunchGrid`, `cuLaunchGridAsync`, CUDA 2.0's)
//! take from earlier calls on the function: its block (`cuFuncSetBlockShape`; none set:
//! 0 x 0 x 0, which no launch accepts) and its dynamic shared memory
//! (`cuFuncSetSharedSize`), kept by function handle for the life of the process.

use super::HashMap;
use std::sync::{LazyLock, Mutex};

use super::module;
use crate::abi::{CUDA_ERROR_INVALID_HANDLE, CUresult, CuResult};
use libc::c_uint;

/// A function's block and dynamic shared memory for the deprecated launches.
#[derive(Debug, Clone, Copy, Default)]
pub struct Shape {
    pub block: [c_uint; 3],
    pub shared: c_uint,
}

static SHAPES: LazyLock<Mutex<HashMap<usize, Shape>>> = LazyLock::new(Default::default);

/// Changes function `f`'s shape (CUDA_ERROR_INVALID_HANDLE for no such function).
pub fn set(f: usize, change: impl FnOnce(&mut Shape)) -> CuResult {
    module::get_function(f).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    let mut shapes = SHAPES.lock().unwrap_or_else(|e| e.into_inner());
    change(shapes.entry(f).or_default());
    Ok(())
}

/// Function `f`'s shape (CUDA_ERROR_INVALID_HANDLE for no such function).
pub fn of(f: usize) -> Result<Shape, CUresult> {
    module::get_function(f).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    let shapes = SHAPES.lock().unwrap_or_else(|e| e.into_inner());
    Ok(shapes.get(&f).copied().unwrap_or_default())
}
