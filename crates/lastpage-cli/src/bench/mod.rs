//! Benchmarks over the embedded engine. [`insert`] is the harness every insert benchmark runs
//! through; [`compare`] and [`matrix`] drive it over grids of configurations; [`ideal`] is the
//! no-B-tree reference the matrix measures against; [`render`] draws reports; [`durable`]
//! measures durable inserts against SQLite ([`sqlite`]) on a disk whose own limits [`disk`]
//! measures first, beside the machine's park-and-wake ceiling ([`wakeups`]); [`recovery`] times the recovery of a large log; [`checkpoint`] measures
//! what a checkpoint costs the writers running through it.

pub mod checkpoint;
pub mod compare;
pub mod disk;
pub mod durable;
pub mod ideal;
pub mod insert;
pub mod matrix;
pub mod recovery;
pub mod render;
pub mod sqlite;
pub mod wakeups;
