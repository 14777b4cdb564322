//! The real driver, below the hooks: its C types (`types`), typed calls of functions
//! the hooks use but do not intercept (`calls`), and the queries the core's driver
//! traits need (`queries`).

pub mod calls;
pub mod queries;
pub mod types;
