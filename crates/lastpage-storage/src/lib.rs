//! The storage layer of lastpage: fixed-size pages, page latches, wait statistics and the
//! clustered B+tree.
//!
//! Nothing here knows SQL, tables or column types: the B+tree stores byte-string keys that
//! compare with `memcmp` and opaque byte-string values. The engine crate above encodes typed
//! rows into that shape.

pub mod btree;
pub mod buffer;
mod datafile;
pub mod latch;
pub mod limits;
pub mod page;
pub mod page_memory;
pub mod scratch;
pub mod stats;
pub mod sync;
pub mod wal;
