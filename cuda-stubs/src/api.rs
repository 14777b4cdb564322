//! The exported driver API, one family per file: each entry point (an `exports!` block)
//! reads its C arguments, asks the model, and writes its outputs. Nothing below imports it.

pub mod array;
pub mod context;
pub mod copy;
pub mod device;
pub mod export_tables;
pub mod external;
pub mod graph;
pub mod graph_node;
pub mod green;
mod hold;
pub mod interop;
pub mod ipc;
pub mod launch;
pub mod memory;
pub mod module;
pub mod multicast;
pub mod pool;
pub mod procaddr;
pub mod stream;
pub mod tensor_map;
pub mod vmm;
