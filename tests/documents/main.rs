//! The documents and the tree: the book's links and quick start, the documents' figures,
//! the shape of the code, and the test suite's own skip rule.
//!
//! One test binary of the suite (docs/src/fake-gpu.md, "The test suite"); each module is
//! a file of this folder, and its tests are named `<module>::<test>`.

#[path = "../common/mod.rs"]
mod common;

mod architecture;
mod doc_figures;
mod quickstart;
mod readme;
mod skip_rule;
mod test_profile;
