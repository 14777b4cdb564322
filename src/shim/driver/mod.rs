//! The real driver, below the hooks: its C types (`types`), the one list of hooked
//! functions with their signatures and the shim's own calls of them (`hooked`), the
//! safe forwarding call the hooks get (`forward`), typed calls of functions the shim
//! uses but does not intercept (`calls`), the queries the core's driver
//! traits need (`queries`; a graph's alloc nodes and the graph memory figures in
//! `graph_queries`; modules', libraries' and kernels' in `kernel_queries`), and NVML read below the shim's own hooks (`nvml_direct`).

pub mod calls;
pub mod forward;
pub mod graph_queries;
pub mod hooked;
pub mod kernel_queries;
pub mod nvml_direct;
pub mod queries;
pub mod types;
