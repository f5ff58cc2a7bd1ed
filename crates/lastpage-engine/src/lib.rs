//! The embedded API of lastpage: databases, tables, typed rows, indexes and sessions.
//!
//! ```
//! use lastpage_engine::{ColumnDef, DataType, Database, DatabaseOptions, IndexDef, InsertRow, TableDef, Uniqueness, Value};
//!
//! let db = Database::create(DatabaseOptions::default()).unwrap();
//! let table = db
//!     .create_table(
//!         TableDef::new("Orders")
//!             .column(ColumnDef::new("Id", DataType::Int).identity(1, 1))
//!             .column(ColumnDef::new("Customer", DataType::VarChar(100)).not_null())
//!             .clustered(IndexDef::new("PK_Orders", &["Id"], Uniqueness::PrimaryKey)),
//!     )
//!     .unwrap();
//! let session = db.session();
//! let id = table.insert(&session, InsertRow::new().set(1, "ACME")).unwrap();
//! assert_eq!(id, Some(1));
//! let row = table.get(&session, &[Value::Int(1)]).unwrap().unwrap();
//! assert_eq!(row[1], Value::from("ACME"));
//! ```
//!
//! Nothing in this crate knows SQL: the SQL layer above translates statements into these calls.

pub mod catalog;
mod computed;
pub mod database;
pub mod encoding;
#[doc(hidden)]
pub mod ended_writes;
pub mod error;
#[doc(hidden)]
pub mod identity;
pub mod locks;
#[doc(hidden)]
pub mod pending;
pub mod recovery;
mod row_bytes;
pub mod schema;
pub mod table;
pub mod txn;
pub mod types;
#[doc(hidden)]
pub mod uniquifier;

pub use database::{CheckpointStats, Database, DatabaseOptions, Session};
pub use error::{EngineError, Result};
pub use lastpage_storage::btree::{Direction, InsertPath};
pub use lastpage_storage::latch::LatchPolicy;
pub use lastpage_storage::stats::{LatchClass, WaitSnapshot, WaitStat, WaitType};
pub use recovery::RecoveryStats;
pub use schema::{
    ColumnDef, Computed, DefaultValue, Expr, IndexDef, IndexOptions, PartitionDef, TableDef,
    Uniqueness,
};
pub use table::{InsertRow, KeyRange, PreparedInsert, Row, Table, TableCheck};
pub use txn::{CommitTicket, Durability, UndoStats};
pub use types::{DataType, Value};
