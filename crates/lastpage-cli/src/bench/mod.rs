//! Benchmarks over the embedded engine. [`insert`] is the harness every insert benchmark runs
//! through; [`compare`] and [`matrix`] drive it over grids of configurations; [`ideal`] is the
//! no-B-tree reference the matrix measures against; [`render`] draws reports; [`durable`]
//! measures durable inserts against SQLite ([`sqlite`]).

pub mod compare;
pub mod durable;
pub mod ideal;
pub mod insert;
pub mod matrix;
pub mod render;
pub mod sqlite;
