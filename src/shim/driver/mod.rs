//! The real driver, below the hooks: its C types (`types`), typed calls of functions
//! the hooks use but do not intercept (`calls`), the queries the core's driver
//! traits need (`queries`; a graph's alloc nodes and the graph memory figures in
//! `graph_queries`), and NVML read below the shim's own hooks (`nvml_direct`).

pub mod calls;
pub mod graph_queries;
pub mod nvml_direct;
pub mod queries;
pub mod types;
