//! `cuGetExportTable`: the driver's private tables that NVIDIA's libcudart (and libraries
//! built on it: cuBLAS, cuDNN, ...) asks for by UUID. Each table is an array of words: most
//! start with the table's byte size, the rest are function pointers ("slots"). The layouts
//! were learnt from ZLUDA's reverse engineering (vosen/ZLUDA, `dark_api`) and from tracing
//! what cudart calls (FAKECUDA_TRACE); nothing here is NVIDIA's or ZLUDA's code.
//!
//! Every slot is either implemented (below) or a stub that logs its call under
//! FAKECUDA_TRACE (`fakecuda: TABLE[n](...) -> CUDA_ERROR_NOT_SUPPORTED`) and returns
//! CUDA_ERROR_NOT_SUPPORTED; STUBS.md lists the stubs, README.md the tables. A UUID the fake
//! does not know gets CUDA_ERROR_INVALID_VALUE and a NULL table (logged under trace).

use crate::abi::{CUDA_ERROR_INVALID_VALUE, CUresult, CuResult, call, inp, note, out};
use libc::c_void;

/// What a slot holds.
#[derive(Clone, Copy)]
pub enum Slot {
    /// The table's size in bytes (slots x 8).
    Size,
    /// A word the fake leaves 0 (cudart reads it as "absent").
    Null,
    /// A size word of a sub-table of `n` slots (f8cff951 holds several sub-tables).
    SubSize(usize),
    /// An implemented function.
    Fn(*const c_void),
    /// A logging stub (returns CUDA_ERROR_NOT_SUPPORTED).
    Stub(*const c_void),
}

/// A table as cudart reads it.
#[repr(C)]
pub struct Words<const N: usize>([*const c_void; N]);

// SAFETY: the tables are immutable after compilation: function addresses and sizes.
unsafe impl<const N: usize> Sync for Words<N> {}

impl<const N: usize> Words<N> {
    pub(super) const fn build(slots: &[Slot; N]) -> Self {
        let mut w = [std::ptr::null::<c_void>(); N];
        let mut i = 0;
        while i < N {
            w[i] = match slots[i] {
                Slot::Size => (N * 8) as *const c_void,
                Slot::Null => std::ptr::null(),
                Slot::SubSize(n) => (n * 8) as *const c_void,
                Slot::Fn(f) | Slot::Stub(f) => f,
            };
            i += 1;
        }
        Words(w)
    }

    pub(super) fn addr(&'static self) -> *const c_void {
        self.0.as_ptr().cast()
    }
}

/// One table: its name, UUID (as cudart passes it: 16 bytes), slots and words.
#[cfg_attr(not(test), allow(dead_code))]
pub struct Table {
    pub name: &'static str,
    pub uuid: [u8; 16],
    pub slots: &'static [Slot],
    words: fn() -> *const c_void,
}

// SAFETY: see Words.
unsafe impl Sync for Table {}

/// Defines a logging stub per (function name, "TABLE[n]").
macro_rules! slot_stubs {
    ($($f:ident = $label:literal),* $(,)?) => {$(
        extern "C" fn $f() -> CUresult {
            call($label, || "...".to_string(), || Err(CUDA_ERROR_NOT_SUPPORTED))
        }
    )*};
}

/// Runs a slot body like an entry point (traced, no unwinding).
pub(super) fn slot(
    name: &str,
    args: impl FnOnce() -> String,
    body: impl FnOnce() -> CuResult,
) -> CUresult {
    call(name, args, body)
}

// The tables, by what they serve (each file: its slots' functions, stubs and words).
mod context;
mod integrity;
mod runtime;
mod tools;

use context::{CHECKS, CHECKS_SLOTS, CLS, CLS_SLOTS, IDENTITY, IDENTITY_SLOTS};
use integrity::{INTEGRITY, INTEGRITY_SLOTS};
use runtime::{CUDART, CUDART_SLOTS, RT13, RT13_SLOTS};
use tools::{CUPTI, CUPTI_SLOTS, HOOKS, HOOKS_SLOTS, TLS, TLS_SLOTS};

const fn hex(c: u8) -> u8 {
    match c {
        b'0'..=b'9' => c - b'0',
        b'a'..=b'f' => c - b'a' + 10,
        _ => panic!("uuid: lower-case hex only"),
    }
}

/// "6bd5fb6c-5bf4-e74a-8987-d93912fd9df9" as cudart passes it (the bytes in text order).
const fn uuid(s: &str) -> [u8; 16] {
    let b = s.as_bytes();
    let mut out = [0u8; 16];
    let (mut i, mut n) = (0, 0);
    while i < b.len() {
        if b[i] == b'-' {
            i += 1;
            continue;
        }
        out[n] = hex(b[i]) << 4 | hex(b[i + 1]);
        n += 1;
        i += 2;
    }
    out
}

/// Every table the fake answers.
pub static TABLES: [Table; 9] = [
    Table {
        name: "RUNTIME_13",
        uuid: uuid("f8cff951-2146-8b4e-b9e2-fb469e7c0dd9"),
        slots: &RT13_SLOTS,
        words: || RT13.addr(),
    },
    Table {
        name: "CUDART_INTERFACE",
        uuid: uuid("6bd5fb6c-5bf4-e74a-8987-d93912fd9df9"),
        slots: &CUDART_SLOTS,
        words: || CUDART.addr(),
    },
    Table {
        name: "TOOLS_RUNTIME_CALLBACK_HOOKS",
        uuid: uuid("a094798c-2e74-2e74-93f2-0800200c0a66"),
        slots: &HOOKS_SLOTS,
        words: || HOOKS.addr(),
    },
    Table {
        name: "TOOLS_TLS",
        uuid: uuid("42d85a81-23f6-cb47-8298-f6e78a3aecdc"),
        slots: &TLS_SLOTS,
        words: || TLS.addr(),
    },
    Table {
        name: "CONTEXT_LOCAL_STORAGE",
        uuid: uuid("c693336e-1121-df11-a8c3-68f355d89593"),
        slots: &CLS_SLOTS,
        words: || CLS.addr(),
    },
    Table {
        name: "CONTEXT_CHECKS",
        uuid: uuid("263e8860-7cd2-6143-92f6-bbd5006dfa7e"),
        slots: &CHECKS_SLOTS,
        words: || CHECKS.addr(),
    },
    Table {
        name: "INTEGRITY_CHECK",
        uuid: uuid("d4082055-bde6-704b-8d34-ba123c66e1f2"),
        slots: &INTEGRITY_SLOTS,
        words: || INTEGRITY.addr(),
    },
    Table {
        name: "CONTEXT_IDENTITY",
        uuid: uuid("21318c60-9714-3248-8ca6-41ff7324c8f2"),
        slots: &IDENTITY_SLOTS,
        words: || IDENTITY.addr(),
    },
    Table {
        name: "CUPTI",
        uuid: uuid("7cb63f9b-9ca4-8e42-a484-beb66e6aed7f"),
        slots: &CUPTI_SLOTS,
        words: || CUPTI.addr(),
    },
];

/// A UUID as text (`6bd5fb6c-5bf4-...`).
pub fn uuid_text(u: &[u8; 16]) -> String {
    fake_gpu::identity::format_uuid("", u)
}

#[cfg_attr(not(test), allow(dead_code))]
/// The stub slots of every table, as `TABLE[n]` (STUBS.md lists them), and how many slots
/// hold functions.
pub fn stub_slots() -> (Vec<String>, usize) {
    let mut stubs = Vec::new();
    let mut functions = 0;
    for t in &TABLES {
        for (i, s) in t.slots.iter().enumerate() {
            match s {
                Slot::Stub(_) => {
                    stubs.push(format!("{}[{i}]", t.name));
                    functions += 1;
                }
                Slot::Fn(_) => functions += 1,
                _ => {}
            }
        }
    }
    (stubs, functions)
}

crate::abi::exports! {
    fn cuGetExportTable(table: *mut *const c_void, id: *const [u8; 16]) {
        if table.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        out(table, std::ptr::null())?;
        let id = inp(id)?;
        match TABLES.iter().find(|t| t.uuid == id) {
            Some(t) => {
                note(|| format!("{} {}", uuid_text(&id), t.name));
                out(table, (t.words)())
            }
            None => {
                note(|| format!("{}: unknown table", uuid_text(&id)));
                Err(CUDA_ERROR_INVALID_VALUE)
            }
        }
    }
}
