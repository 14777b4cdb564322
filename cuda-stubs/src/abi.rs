//! The C ABI edge, at the bottom of the crate (it imports nothing of it): result codes, the
//! `exports!` macro that wraps every exported entry point (no unwinding across the boundary,
//! tracing), raw-pointer helpers, and in `types` the C types and enum values.

pub mod errors;
pub mod types;

use std::cell::RefCell;
use std::fmt::Write as _;
use std::panic::{AssertUnwindSafe, catch_unwind};

pub type CUresult = u32;
/// What an entry point's body returns: Ok(()) is CUDA_SUCCESS.
pub type CuResult = Result<(), CUresult>;

pub const CUDA_SUCCESS: CUresult = 0;
pub const CUDA_ERROR_INVALID_VALUE: CUresult = 1;
pub const CUDA_ERROR_OUT_OF_MEMORY: CUresult = 2;
pub const CUDA_ERROR_NOT_INITIALIZED: CUresult = 3;
pub const CUDA_ERROR_INVALID_DEVICE: CUresult = 101;
pub const CUDA_ERROR_INVALID_CONTEXT: CUresult = 201;
pub const CUDA_ERROR_INVALID_HANDLE: CUresult = 400;
pub const CUDA_ERROR_ILLEGAL_STATE: CUresult = 401;
pub const CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED: CUresult = 900;
pub const CUDA_ERROR_STREAM_CAPTURE_INVALIDATED: CUresult = 901;
pub const CUDA_ERROR_INVALID_CLUSTER_SIZE: CUresult = 912;
pub const CUDA_ERROR_NOT_FOUND: CUresult = 500;
pub const CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED: CUresult = 712;
pub const CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED: CUresult = 713;
pub const CUDA_ERROR_NOT_SUPPORTED: CUresult = 801;
pub const CUDA_ERROR_UNKNOWN: CUresult = 999;

/// FAKECUDA_TRACE is on.
pub fn tracing() -> bool {
    fake_gpu::trace::enabled()
}

/// Writes one `fakecuda:` line to stderr.
pub fn log(msg: &str) {
    fake_gpu::trace::log("fakecuda", msg);
}

thread_local! {
    /// Output details an entry point adds to its trace line (`note`).
    static NOTES: RefCell<String> = const { RefCell::new(String::new()) };
}

/// Adds `detail` (e.g. the returned pointer) to the current call's trace line.
pub fn note(detail: impl FnOnce() -> String) {
    if tracing() {
        // try_with: an entry point may be called from an exit handler, after this thread's
        // locals are gone (cudart's clean-up at exit does).
        let _ = NOTES.try_with(|n| {
            let mut n = n.borrow_mut();
            let sep = if n.is_empty() { " [" } else { ", " };
            n.push_str(sep);
            n.push_str(&detail());
        });
    }
}

/// Runs an entry point body: catches panics (CUDA_ERROR_UNKNOWN), traces name, args, result.
pub fn call(
    name: &str,
    args: impl FnOnce() -> String,
    body: impl FnOnce() -> CuResult,
) -> CUresult {
    let args = if tracing() { Some(args()) } else { None };
    let res = match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => CUDA_SUCCESS,
        Ok(Err(code)) => code,
        Err(_) => {
            log(&format!(
                "{name}: internal panic, returning CUDA_ERROR_UNKNOWN"
            ));
            CUDA_ERROR_UNKNOWN
        }
    };
    if let Some(args) = args {
        let notes = NOTES
            .try_with(|n| std::mem::take(&mut *n.borrow_mut()))
            .unwrap_or_default();
        let notes = if notes.is_empty() { notes } else { notes + "]" };
        log(&format!(
            "{name}({args}) -> {}{notes}",
            errors::error_name(res).unwrap_or("?")
        ));
    }
    res
}

/// How an argument shows in a trace line: sizes and small integers in decimal, other large
/// integers (device pointers, handles) and pointers in hex.
pub trait TraceArg {
    fn trace(&self, s: &mut String, decimal: bool);
}

macro_rules! trace_int {
    ($($t:ty),*) => {$(
        impl TraceArg for $t {
            fn trace(&self, s: &mut String, decimal: bool) {
                let v = *self as i128;
                let large = !decimal && !(0..=0xffff).contains(&v);
                let _ = if large { write!(s, "{:#x}", self) } else { write!(s, "{}", self) };
            }
        }
    )*};
}
trace_int!(u8, u16, u32, u64, usize, i32, i64);

impl TraceArg for f32 {
    fn trace(&self, s: &mut String, _decimal: bool) {
        let _ = write!(s, "{self}");
    }
}

impl<T> TraceArg for *const T {
    fn trace(&self, s: &mut String, _decimal: bool) {
        let _ = write!(s, "{self:p}");
    }
}

impl<T> TraceArg for *mut T {
    fn trace(&self, s: &mut String, _decimal: bool) {
        let _ = write!(s, "{self:p}");
    }
}

impl<T> TraceArg for Option<T> {
    fn trace(&self, s: &mut String, _decimal: bool) {
        s.push_str(if self.is_some() { "fn" } else { "NULL" });
    }
}

/// Formats the arguments of a traced call: `a=1, p=0x7f..`.
pub fn fmt_args(pairs: &[(&str, &dyn TraceArg)]) -> String {
    let mut s = String::new();
    for (i, (k, v)) in pairs.iter().enumerate() {
        s.push_str(if i == 0 { "" } else { ", " });
        s.push_str(k);
        s.push('=');
        let is_size = ["size", "bytes", "count", "width", "height", "pitch", "len"]
            .iter()
            .any(|w| k.contains(w));
        v.trace(&mut s, is_size || *k == "n");
    }
    s
}

/// Defines exported entry points. `fn a | b (args) { body }` exports `a` and `b` with the
/// same body, which returns `CuResult`. build.rs reads these `fn cu...` lines to know
/// which exports are implemented, so keep `fn` and the names on one line.
macro_rules! exports {
    ($( fn $first:ident $(| $alias:ident)* ( $($args:tt)* ) $body:block )*) => {
        $( $crate::abi::exports!(@names [$first $($alias)*] ($($args)*) $body); )*
    };
    (@names [$($name:ident)*] $args:tt $body:block) => {
        $( $crate::abi::exports!(@one $name $args $body); )*
    };
    (@one $name:ident ($($arg:ident : $ty:ty),* $(,)?) $body:block) => {
        #[unsafe(no_mangle)]
        #[allow(clippy::missing_safety_doc, unused_unsafe)]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> $crate::abi::CUresult {
            $crate::abi::call(
                stringify!($name),
                || $crate::abi::fmt_args(&[$((stringify!($arg), &$arg as &dyn $crate::abi::TraceArg)),*]),
                move || -> $crate::abi::CuResult { $body },
            )
        }
    };
}
pub(crate) use exports;

/// Exports each name as `extern "C" fn() -> CUresult` returning CUDA_ERROR_NOT_SUPPORTED.
/// A function that ignores its arguments is ABI-safe for any call on x86_64 SysV.
/// Also defines `STUBS`, their names (checked against STUBS.md by a test).
macro_rules! not_supported_stubs {
    ($($name:ident),* $(,)?) => {
        #[cfg(test)]
        pub(crate) const STUBS: &[&str] = &[$(stringify!($name)),*];
        $(
            #[unsafe(no_mangle)]
            pub extern "C" fn $name() -> $crate::abi::CUresult {
                $crate::abi::call(stringify!($name), || "...".to_string(), || Err($crate::abi::CUDA_ERROR_NOT_SUPPORTED))
            }
        )*
    };
}
pub(crate) use not_supported_stubs;

/// Writes `v` through the caller's output pointer; CUDA_ERROR_INVALID_VALUE when it is NULL.
pub fn out<T>(p: *mut T, v: T) -> CuResult {
    if p.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-null output pointer supplied by the C caller for a value of this type.
    unsafe { p.write_unaligned(v) };
    Ok(())
}

/// Reads the caller's input struct; CUDA_ERROR_INVALID_VALUE when the pointer is NULL.
pub fn inp<T: Copy>(p: *const T) -> Result<T, CUresult> {
    if p.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-null input pointer supplied by the C caller for a value of this type.
    Ok(unsafe { p.read_unaligned() })
}

/// Reads a NUL-terminated C string from the caller (None for NULL or non-UTF-8).
pub fn cstr<'a>(p: *const libc::c_char) -> Option<&'a str> {
    if p.is_null() {
        return None;
    }
    // SAFETY: non-null NUL-terminated string supplied by the C caller.
    unsafe { std::ffi::CStr::from_ptr(p) }.to_str().ok()
}
