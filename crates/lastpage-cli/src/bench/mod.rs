//! Benchmarks over the embedded engine. [`insert`] is the harness every insert benchmark runs
//! through; [`compare`] drives it over a grid of configurations; [`render`] draws reports.

pub mod compare;
pub mod insert;
pub mod render;
