//! The catalog of a durable database as one byte blob: every table's definition plus the
//! run-time state needed to reopen it (its B-tree roots, row counts, next identity value) and
//! the database-wide counters. Each checkpoint image of the data file stores one such blob.
//!
//! # Format
//!
//! Everything is little-endian. The blob is
//!
//! ```text
//! +---------------+---------------+-----------------+-----------+----------------+
//! | magic (8 B)   | version (u32) | body length u32 | body      | CRC32C (u32)   |
//! | "LPCATLG\0"   | = 3           |                 |           | of all before  |
//! +---------------+---------------+-----------------+-----------+----------------+
//! ```
//!
//! The body is the catalog's counters (`next_table_id` u32, `next_index_id` u32,
//! `next_txn_id` u64, `checkpoint_lsn` u64, `oldest_active_lsn` u64, `clean_shutdown` a bool
//! byte), then a u32 count of
//! tables and each table in turn:
//!
//! * `table_id` u32, the name (a string: u32 byte length, then UTF-8);
//! * a u32 count of columns, each: name, data type (a tag byte, see [`DataType`] tags below,
//!   then the type's parameters), nullable (a bool byte, 0 or 1), default (a tag byte: 0 none,
//!   1 constant followed by a u32 length and the value in the row encoding of
//!   [`crate::encoding`] as a one-column row of the column's type, 2 `SYSUTCDATETIME()`, 3
//!   `NEWID()`), identity (a bool byte, then seed i64 and increment i64 when set), and a
//!   computed column's expression (a bool byte, then the expression when set: a tag byte per
//!   node in prefix order, 1 a column followed by its name, 2 an integer i64, 3 `%` followed
//!   by its two operands, 4 `ABS` followed by its operand; at most
//!   `limits::COMPUTED_EXPRESSION_MAX_DEPTH` levels deep);
//! * the clustered index (a bool byte, then the index when set), a u32 count of nonclustered
//!   indexes and each index: name, a u32 count of key column names, the names, uniqueness (a
//!   tag byte), latch policy (a tag byte), insert path (a tag byte), optimize-for-sequential-key
//!   (a bool byte);
//! * partitioning (a bool byte, then the column name and the partition count u16 when set);
//! * whether the table is logged (a bool byte);
//! * the trees: a u32 count of indexes (the clustered one, which a heap has too, then the
//!   nonclustered ones in order), each a u32 partition count and, per partition, the index id
//!   u32, the root page id u32, the row count u64, and a u32 count of spare leaves followed by
//!   their page ids u32 (pages the tree allocated for its next splits and has not linked yet;
//!   see `BTree::restore_spare_leaves`);
//! * the next identity value (a bool byte, then an i64 when set);
//! * the uniquifier blocks handed out (a bool byte, then a u64 when set), set exactly when the
//!   table's clustered index is not unique or it is a heap.
//!
//! After the tables, a u32 count of *dropped trees*, each: the index id u32, the root page id
//! u32, and a u32 count of spare leaves followed by their page ids u32. These are the trees of
//! tables dropped while a handle still used them, whose pages could not be freed yet: the next
//! open frees them (see `Database::reclaim_dropped_tables`).
//!
//! Data type tags: 1 `tinyint`, 2 `smallint`, 3 `int`, 4 `bigint`, 5 `bit`, 6
//! `decimal(p,s)` (p u8, s u8), 7 `money`, 8 `char(n)`, 9 `varchar(n)`, 10 `nchar(n)`, 11
//! `nvarchar(n)` (n u16 each), 12 `datetime2(p)` (p u8), 13 `date`, 14 `uniqueidentifier`, 15
//! `varbinary(n)` (n u16). Zero is never a valid tag, so a zeroed region does not decode.
//!
//! Version 2 is version 3 without the dropped trees, the uniquifier blocks and the computed
//! expressions (it could hold no computed column), and version 1 is
//! version 2 without the spare leaves; both are still read (with no dropped trees, and trees with no spare leaves),
//! so that a database written by an earlier build opens. A version 1 database's spare leaves
//! were never recorded, so they stay allocated and unreachable.
//!
//! Decoding checks the magic, the CRC, the version, every length against the bytes that are
//! left (so a corrupt length cannot make it allocate more than the blob's size), every tag,
//! and the consistency of the parts (one tree list per index, one entry per partition, an
//! identity value exactly for tables with an identity column, unique table and index ids
//! below the catalog's counters, spare leaves that are nobody's root and named once). Anything wrong is an [`EngineError::CorruptCatalog`]; it
//! never panics.
//!
//! Closures cannot be stored: a column computed by a function or a [`DefaultValue::Function`]
//! default makes
//! [`Catalog::encode`] fail with [`EngineError::NotPersistable`], and [`check_persistable`]
//! lets `CREATE TABLE` in a durable database refuse such a table before it exists.

use std::collections::HashSet;

use lastpage_storage::btree::InsertPath;
use lastpage_storage::latch::LatchPolicy;

use crate::encoding::{decode_row, encode_row};
use crate::error::{EngineError, Result};
use crate::schema::{
    ColumnDef, Computed, DefaultValue, Expr, Identity, IndexDef, IndexOptions, PartitionDef,
    TableDef, Uniqueness,
};
use crate::types::{DataType, Value};
use lastpage_storage::limits::COMPUTED_EXPRESSION_MAX_DEPTH;

/// The form of a table name two names are the same table by: ASCII letters folded to lower
/// case, as everywhere the engine compares names (columns and indexes too). The catalog's
/// check and the database's lookups must fold alike: when the check folded all of Unicode,
/// `É` and `é` were two tables to the database but a duplicate to the catalog, and every
/// checkpoint, and so every later open, failed.
pub(crate) fn table_name_key(name: &str) -> String {
    name.to_ascii_lowercase()
}

/// The first eight bytes of every encoded catalog.
pub const CATALOG_MAGIC: [u8; 8] = *b"LPCATLG\0";

/// The format version this build writes. It also reads [`CATALOG_FORMAT_VERSION_1`] and
/// [`CATALOG_FORMAT_VERSION_2`].
pub const CATALOG_FORMAT_VERSION: u32 = 3;

/// The format before spare leaves were recorded, still read.
pub const CATALOG_FORMAT_VERSION_1: u32 = 1;

/// The format before dropped trees were recorded, still read.
pub const CATALOG_FORMAT_VERSION_2: u32 = 2;

/// Bytes before the body: magic, version and body length.
const HEADER_LEN: usize = 8 + 4 + 4;
/// Bytes after the body: the CRC32C.
const TRAILER_LEN: usize = 4;

/// Why closure-backed columns are refused, shared by every message so they read alike.
const CLOSURE_REASON: &str = "a function cannot be stored (a computed column can be, as an \
     expression: ColumnDef::computed_expression; a default, once the SQL layer can store its text)";

/// The B-trees of one index: one tree per partition (one for an unpartitioned table). The
/// four vectors are indexed by partition and have the same length.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct IndexTrees {
    /// The index id of each partition's tree.
    pub index_id_per_partition: Vec<u32>,
    /// The root page id of each partition's tree.
    pub root_per_partition: Vec<u32>,
    /// The number of rows (index entries) in each partition's tree.
    pub rows_per_partition: Vec<u64>,
    /// The spare leaves of each partition's tree: allocated, formatted as empty leaves, not
    /// yet linked (see `BTree::spare_leaves`).
    pub spare_leaves_per_partition: Vec<Vec<u32>>,
}

/// A tree of a table dropped while a handle still used it: its pages are freed once nothing
/// uses it, or at the next open if the catalog is written before then.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DroppedTree {
    /// The tree's index id, stamped on its pages.
    pub index_id: u32,
    /// The tree's root page id.
    pub root: u32,
    /// The tree's spare leaves (see [`IndexTrees::spare_leaves_per_partition`]).
    pub spare_leaves: Vec<u32>,
}

/// One table in the catalog.
#[derive(Clone, Debug)]
pub struct CatalogEntry {
    /// The table's id.
    pub table_id: u32,
    /// The table's definition.
    pub definition: TableDef,
    /// The trees of every index: the clustered index first (a heap has one too, keyed by its
    /// hidden uniquifier), then the nonclustered indexes in definition order.
    pub index_trees: Vec<IndexTrees>,
    /// The next identity value to hand out; set exactly when the table has an identity column.
    pub next_identity: Option<i64>,
    /// The uniquifier blocks handed out (see `Uniquifiers::blocks_taken`), for a table whose
    /// clustered index is not unique (a heap's too): the open continues past them without
    /// reading the rows. `None` for every other table, and in catalogs written before it was
    /// recorded (versions 1 and 2), whose open reads the rows instead.
    pub uniquifier_blocks: Option<u64>,
}

impl CatalogEntry {
    /// The index ids of every tree, index by index (clustered first), partition by partition:
    /// the order `Table::create` asks for trees in.
    pub fn index_ids(&self) -> impl Iterator<Item = u32> + '_ {
        self.index_trees
            .iter()
            .flat_map(|trees| trees.index_id_per_partition.iter().copied())
    }
}

/// The whole catalog of a durable database.
#[derive(Clone, Debug)]
pub struct Catalog {
    /// The format version: [`CATALOG_FORMAT_VERSION`] for catalogs this build encodes or
    /// decodes.
    pub format_version: u32,
    /// The next table id to hand out.
    pub next_table_id: u32,
    /// The next index id to hand out.
    pub next_index_id: u32,
    /// The next transaction id to hand out.
    pub next_txn_id: u64,
    /// The log sequence number of the checkpoint that wrote this catalog.
    pub checkpoint_lsn: u64,
    /// The oldest log sequence number a transaction active at the checkpoint still needs.
    pub oldest_active_lsn: u64,
    /// Whether this checkpoint was the last act of a clean shutdown ([`Database::close`]).
    /// Tables that are not logged keep their rows only then.
    ///
    /// [`Database::close`]: crate::Database::close
    pub clean_shutdown: bool,
    /// The tables.
    pub tables: Vec<CatalogEntry>,
    /// The trees of dropped tables whose pages are not free yet.
    pub dropped_trees: Vec<DroppedTree>,
}

impl Default for Catalog {
    /// An empty catalog of the current format whose counters start at 1, as a new database's.
    fn default() -> Self {
        Catalog {
            format_version: CATALOG_FORMAT_VERSION,
            next_table_id: 1,
            next_index_id: 1,
            next_txn_id: 1,
            checkpoint_lsn: 0,
            oldest_active_lsn: 0,
            clean_shutdown: false,
            tables: Vec::new(),
            dropped_trees: Vec::new(),
        }
    }
}

/// Checks that `def` can be stored in a durable database's catalog: no computed column, no
/// function default, and every constant default converts to its column's type (the catalog
/// stores it in the column's row encoding). `CREATE TABLE` in a durable database calls this
/// before creating anything, so the table is refused up front rather than at the next
/// checkpoint.
pub fn check_persistable(def: &TableDef) -> Result<()> {
    for column in &def.columns {
        persistable_default(def, column)?;
    }
    Ok(())
}

/// The default of `column` as the catalog stores it (a constant converted to the column's
/// type), or the [`EngineError::NotPersistable`] error if the column cannot be stored.
fn persistable_default(def: &TableDef, column: &ColumnDef) -> Result<Option<StoredDefault>> {
    let refuse = |reason: String| EngineError::NotPersistable {
        table: def.name.clone(),
        column: column.name.clone(),
        reason,
    };
    if matches!(column.computed, Some(Computed::Function(_))) {
        return Err(refuse(format!(
            "is computed by a function; {CLOSURE_REASON}"
        )));
    }
    Ok(match &column.default {
        None => None,
        Some(DefaultValue::Function(_)) => {
            return Err(refuse(format!("has a function default; {CLOSURE_REASON}")));
        }
        Some(DefaultValue::CurrentUtcDateTime) => Some(StoredDefault::CurrentUtcDateTime),
        Some(DefaultValue::NewId) => Some(StoredDefault::NewId),
        Some(DefaultValue::Constant(value)) => {
            // Inserts convert the default to the column's type anyway, so storing it converted
            // changes nothing they see, and it is what the row encoding needs.
            let value = column.data_type.coerce(value.clone()).map_err(|error| {
                refuse(format!(
                    "has a default that does not convert to {}: {error}",
                    column.data_type.name()
                ))
            })?;
            let mut bytes = Vec::new();
            encode_row(
                &[column.data_type],
                std::slice::from_ref(&value),
                &mut bytes,
            )
            .map_err(|error| {
                refuse(format!(
                    "has a default that cannot be encoded as {}: {error}",
                    column.data_type.name()
                ))
            })?;
            Some(StoredDefault::Constant(bytes))
        }
    })
}

/// A default in its stored form.
enum StoredDefault {
    Constant(Vec<u8>),
    CurrentUtcDateTime,
    NewId,
}

const DEFAULT_NONE: u8 = 0;
const DEFAULT_CONSTANT: u8 = 1;
const DEFAULT_UTC_NOW: u8 = 2;
const DEFAULT_NEW_ID: u8 = 3;

/// The tags of a stored computed expression's nodes (see the module documentation).
const EXPR_COLUMN: u8 = 1;
const EXPR_INTEGER: u8 = 2;
const EXPR_MODULO: u8 = 3;
const EXPR_ABS: u8 = 4;

/// Appends `expr` in its stored form: a tag byte per node, in prefix order.
fn put_expr(out: &mut Vec<u8>, expr: &Expr) -> Result<()> {
    match expr {
        Expr::Column(name) => {
            out.push(EXPR_COLUMN);
            put_str(out, name)?;
        }
        Expr::Integer(value) => {
            out.push(EXPR_INTEGER);
            out.extend_from_slice(&value.to_le_bytes());
        }
        Expr::Modulo(left, right) => {
            out.push(EXPR_MODULO);
            put_expr(out, left)?;
            put_expr(out, right)?;
        }
        Expr::Abs(operand) => {
            out.push(EXPR_ABS);
            put_expr(out, operand)?;
        }
    }
    Ok(())
}

impl Catalog {
    /// Encodes the catalog. Fails with [`EngineError::NotPersistable`] for a table with a
    /// computed column or a function default, and with [`EngineError::InvalidCatalog`] when
    /// the catalog is inconsistent (the checks [`Catalog::decode`] makes), so that every blob
    /// this writes decodes again.
    pub fn encode(&self) -> Result<Vec<u8>> {
        let invalid = |reason: String| EngineError::InvalidCatalog(reason);
        if self.format_version != CATALOG_FORMAT_VERSION {
            return Err(invalid(format!(
                "format version {} cannot be written; this build writes version {CATALOG_FORMAT_VERSION}",
                self.format_version
            )));
        }
        self.check_consistency().map_err(invalid)?;

        let mut out = Vec::new();
        out.extend_from_slice(&CATALOG_MAGIC);
        out.extend_from_slice(&CATALOG_FORMAT_VERSION.to_le_bytes());
        // The body length is filled in once the body is written.
        out.extend_from_slice(&[0; 4]);

        out.extend_from_slice(&self.next_table_id.to_le_bytes());
        out.extend_from_slice(&self.next_index_id.to_le_bytes());
        out.extend_from_slice(&self.next_txn_id.to_le_bytes());
        out.extend_from_slice(&self.checkpoint_lsn.to_le_bytes());
        out.extend_from_slice(&self.oldest_active_lsn.to_le_bytes());
        put_bool(&mut out, self.clean_shutdown);
        put_count(&mut out, self.tables.len())?;
        for entry in &self.tables {
            encode_entry(entry, &mut out)?;
        }
        put_count(&mut out, self.dropped_trees.len())?;
        for tree in &self.dropped_trees {
            out.extend_from_slice(&tree.index_id.to_le_bytes());
            out.extend_from_slice(&tree.root.to_le_bytes());
            put_count(&mut out, tree.spare_leaves.len())?;
            for page in &tree.spare_leaves {
                out.extend_from_slice(&page.to_le_bytes());
            }
        }

        let body_len = u32::try_from(out.len() - HEADER_LEN)
            .map_err(|_| invalid("the catalog is larger than 4 GiB".into()))?;
        out[12..16].copy_from_slice(&body_len.to_le_bytes());
        let crc = crc32c::crc32c(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        Ok(out)
    }

    /// Decodes a catalog written by [`Catalog::encode`]. Any corruption (wrong magic, CRC or
    /// version, truncation, trailing bytes, unknown tags, invalid types, inconsistent counts)
    /// is an [`EngineError::CorruptCatalog`].
    pub fn decode(bytes: &[u8]) -> Result<Catalog> {
        if bytes.len() < HEADER_LEN + TRAILER_LEN {
            return Err(corrupt(format!(
                "{} bytes are too few for a catalog",
                bytes.len()
            )));
        }
        if bytes[..8] != CATALOG_MAGIC {
            return Err(corrupt("the magic number is wrong".into()));
        }
        let (covered, trailer) = bytes.split_at(bytes.len() - TRAILER_LEN);
        let stored_crc = u32::from_le_bytes([trailer[0], trailer[1], trailer[2], trailer[3]]);
        if crc32c::crc32c(covered) != stored_crc {
            return Err(corrupt("the checksum does not match".into()));
        }
        let mut header = Cursor::new(&covered[8..HEADER_LEN]);
        let format_version = header.u32()?;
        if !(CATALOG_FORMAT_VERSION_1..=CATALOG_FORMAT_VERSION).contains(&format_version) {
            return Err(corrupt(format!(
                "format version {format_version} is not supported; this build reads versions \
                 {CATALOG_FORMAT_VERSION_1} to {CATALOG_FORMAT_VERSION}"
            )));
        }
        let body_len = header.u32()?;
        let body = &covered[HEADER_LEN..];
        if usize::try_from(body_len).ok() != Some(body.len()) {
            return Err(corrupt(format!(
                "the header gives a body of {body_len} bytes, but {} follow",
                body.len()
            )));
        }

        let mut r = Cursor::new(body);
        let next_table_id = r.u32()?;
        let next_index_id = r.u32()?;
        let next_txn_id = r.u64()?;
        let checkpoint_lsn = r.u64()?;
        let oldest_active_lsn = r.u64()?;
        let clean_shutdown = r.bool()?;
        // A table takes at least 24 bytes: its id, an empty name, three counts and four flags.
        let table_count = r.count(24)?;
        let mut tables = Vec::with_capacity(table_count);
        for _ in 0..table_count {
            tables.push(decode_entry(&mut r, format_version)?);
        }
        let mut dropped_trees = Vec::new();
        if format_version >= CATALOG_FORMAT_VERSION {
            // A dropped tree takes at least 12 bytes: index id, root and spare leaf count.
            let count = r.count(12)?;
            dropped_trees.reserve(count);
            for _ in 0..count {
                let index_id = r.u32()?;
                let root = r.u32()?;
                let spares = r.count(4)?;
                let spare_leaves = (0..spares).map(|_| r.u32()).collect::<Result<_>>()?;
                dropped_trees.push(DroppedTree {
                    index_id,
                    root,
                    spare_leaves,
                });
            }
        }
        if !r.is_empty() {
            return Err(corrupt(format!(
                "{} bytes follow the last table",
                r.remaining()
            )));
        }
        let catalog = Catalog {
            format_version,
            next_table_id,
            next_index_id,
            next_txn_id,
            checkpoint_lsn,
            oldest_active_lsn,
            clean_shutdown,
            tables,
            dropped_trees,
        };
        catalog.check_consistency().map_err(corrupt)?;
        Ok(catalog)
    }

    /// The checks shared by encoding and decoding: each table's trees match its indexes and
    /// partitions, its identity value matches its identity column, its types are valid, and
    /// table ids, table names and index ids are unique and below the counters.
    fn check_consistency(&self) -> std::result::Result<(), String> {
        let mut table_ids = HashSet::new();
        let mut table_names = HashSet::new();
        let mut index_ids = HashSet::new();
        let mut roots = HashSet::new();
        let mut spare_leaves = HashSet::new();
        // Every table's tree has an index id of its own (log records name trees by it), every
        // tree its own spare leaves, and a dropped tree's root is no other tree's: the open
        // frees a dropped tree's pages, and would free a page another tree still used. A
        // dropped tree may share its index id with a table's: a table that is not logged,
        // emptied after a crash, keeps its index ids for its new trees, and its old ones are
        // listed here until their pages are free. (Tables' roots are not checked against each
        // other, which catalogs written before dropped trees were recorded do not promise
        // either.)
        let mut claim_tree = |index_id: u32, root: u32, spares: &[u32], owner: &str| {
            if index_id >= self.next_index_id {
                return Err(format!(
                    "{owner} has index id {index_id}, not below the next index id {}",
                    self.next_index_id
                ));
            }
            if owner != DROPPED_TREE && !index_ids.insert(index_id) {
                return Err(format!("index id {index_id} is used twice"));
            }
            if !roots.insert(root) && owner == DROPPED_TREE {
                return Err(format!(
                    "page {root} is the root of a dropped tree and another"
                ));
            }
            for &page in spares {
                if !spare_leaves.insert(page) {
                    return Err(format!("page {page} is named twice as a spare leaf"));
                }
            }
            Ok(())
        };
        for entry in &self.tables {
            let def = &entry.definition;
            let name = &def.name;
            if entry.table_id >= self.next_table_id {
                return Err(format!(
                    "table '{name}' has id {}, not below the next table id {}",
                    entry.table_id, self.next_table_id
                ));
            }
            if !table_ids.insert(entry.table_id) {
                return Err(format!("table id {} is used twice", entry.table_id));
            }
            if !table_names.insert(table_name_key(name)) {
                return Err(format!("table name '{name}' is used twice"));
            }
            for column in &def.columns {
                column.data_type.validate().map_err(|error| {
                    format!("column '{}' of table '{name}': {error}", column.name)
                })?;
                // A stored expression must be one `Table::create` accepts: not too deep, and
                // reading integer columns of the table.
                if let Some(computed @ Computed::Expression(_)) = &column.computed {
                    crate::computed::Evaluator::new(computed, &def.columns).map_err(|reason| {
                        format!(
                            "computed column '{}' of table '{name}': {reason}",
                            column.name
                        )
                    })?;
                }
                if column
                    .identity
                    .is_some_and(|identity| identity.increment == 0)
                {
                    return Err(format!(
                        "identity column '{}' of table '{name}' has increment zero",
                        column.name
                    ));
                }
            }
            let has_identity = def.columns.iter().any(|column| column.identity.is_some());
            if has_identity != entry.next_identity.is_some() {
                return Err(format!(
                    "table '{name}' {} an identity column but {} a next identity value",
                    if has_identity { "has" } else { "has no" },
                    if entry.next_identity.is_some() {
                        "has"
                    } else {
                        "has no"
                    },
                ));
            }
            // Recorded from version 3 on, for exactly the tables that number uniquifiers.
            let has_uniquifiers = def
                .clustered
                .as_ref()
                .is_none_or(|index| !index.uniqueness.is_unique());
            let recorded = has_uniquifiers && self.format_version >= CATALOG_FORMAT_VERSION;
            if entry.uniquifier_blocks.is_some() != recorded {
                return Err(format!(
                    "table '{name}' {} uniquifiers but {} a count of uniquifier blocks",
                    if has_uniquifiers { "has" } else { "has no" },
                    if entry.uniquifier_blocks.is_some() {
                        "has"
                    } else {
                        "has no"
                    },
                ));
            }
            let partitions = match &def.partition {
                Some(partition) if partition.partitions == 0 => {
                    return Err(format!("table '{name}' has zero partitions"));
                }
                Some(partition) => usize::from(partition.partitions),
                None => 1,
            };
            let indexes = 1 + def.nonclustered.len();
            if entry.index_trees.len() != indexes {
                return Err(format!(
                    "table '{name}' has {indexes} indexes but trees for {}",
                    entry.index_trees.len()
                ));
            }
            for (position, trees) in entry.index_trees.iter().enumerate() {
                let lengths = [
                    trees.index_id_per_partition.len(),
                    trees.root_per_partition.len(),
                    trees.rows_per_partition.len(),
                    trees.spare_leaves_per_partition.len(),
                ];
                if lengths != [partitions; 4] {
                    return Err(format!(
                        "index {position} of table '{name}' has {partitions} partitions but \
                         {} index ids, {} roots, {} row counts and {} spare leaf lists",
                        lengths[0], lengths[1], lengths[2], lengths[3]
                    ));
                }
                for ((&index_id, &root), spares) in trees
                    .index_id_per_partition
                    .iter()
                    .zip(&trees.root_per_partition)
                    .zip(&trees.spare_leaves_per_partition)
                {
                    claim_tree(index_id, root, spares, &format!("table '{name}'"))?;
                }
            }
        }
        for tree in &self.dropped_trees {
            claim_tree(tree.index_id, tree.root, &tree.spare_leaves, DROPPED_TREE)?;
        }
        // Checked once every root is known: a tree's root may come after the spare naming it.
        if let Some(page) = spare_leaves.intersection(&roots).next() {
            return Err(format!(
                "page {page} is named as a spare leaf and as a root"
            ));
        }
        Ok(())
    }
}

/// How the consistency check names a dropped tree.
const DROPPED_TREE: &str = "a dropped tree";

fn corrupt(reason: String) -> EngineError {
    EngineError::CorruptCatalog(reason)
}

// ---------------------------------------------------------------------------------------------
// Encoding
// ---------------------------------------------------------------------------------------------

fn encode_entry(entry: &CatalogEntry, out: &mut Vec<u8>) -> Result<()> {
    let def = &entry.definition;
    out.extend_from_slice(&entry.table_id.to_le_bytes());
    put_str(out, &def.name)?;
    put_count(out, def.columns.len())?;
    for column in &def.columns {
        let default = persistable_default(def, column)?;
        put_str(out, &column.name)?;
        put_data_type(out, column.data_type);
        put_bool(out, column.nullable);
        match default {
            None => out.push(DEFAULT_NONE),
            Some(StoredDefault::Constant(bytes)) => {
                out.push(DEFAULT_CONSTANT);
                put_bytes(out, &bytes)?;
            }
            Some(StoredDefault::CurrentUtcDateTime) => out.push(DEFAULT_UTC_NOW),
            Some(StoredDefault::NewId) => out.push(DEFAULT_NEW_ID),
        }
        put_bool(out, column.identity.is_some());
        if let Some(identity) = column.identity {
            out.extend_from_slice(&identity.seed.to_le_bytes());
            out.extend_from_slice(&identity.increment.to_le_bytes());
        }
        // `persistable_default` has refused a computed column's function.
        let expression = match &column.computed {
            Some(Computed::Expression(expr)) => Some(expr),
            _ => None,
        };
        put_bool(out, expression.is_some());
        if let Some(expr) = expression {
            put_expr(out, expr)?;
        }
    }
    put_bool(out, def.clustered.is_some());
    if let Some(index) = &def.clustered {
        put_index(out, index)?;
    }
    put_count(out, def.nonclustered.len())?;
    for index in &def.nonclustered {
        put_index(out, index)?;
    }
    put_bool(out, def.partition.is_some());
    if let Some(partition) = &def.partition {
        put_str(out, &partition.column)?;
        out.extend_from_slice(&partition.partitions.to_le_bytes());
    }
    put_bool(out, def.logged);
    put_count(out, entry.index_trees.len())?;
    for trees in &entry.index_trees {
        // The consistency check has made the four vectors the same length.
        put_count(out, trees.index_id_per_partition.len())?;
        for (((index_id, root), rows), spare_leaves) in trees
            .index_id_per_partition
            .iter()
            .zip(&trees.root_per_partition)
            .zip(&trees.rows_per_partition)
            .zip(&trees.spare_leaves_per_partition)
        {
            out.extend_from_slice(&index_id.to_le_bytes());
            out.extend_from_slice(&root.to_le_bytes());
            out.extend_from_slice(&rows.to_le_bytes());
            put_count(out, spare_leaves.len())?;
            for page in spare_leaves {
                out.extend_from_slice(&page.to_le_bytes());
            }
        }
    }
    put_bool(out, entry.next_identity.is_some());
    if let Some(next) = entry.next_identity {
        out.extend_from_slice(&next.to_le_bytes());
    }
    put_bool(out, entry.uniquifier_blocks.is_some());
    if let Some(blocks) = entry.uniquifier_blocks {
        out.extend_from_slice(&blocks.to_le_bytes());
    }
    Ok(())
}

fn put_index(out: &mut Vec<u8>, index: &IndexDef) -> Result<()> {
    put_str(out, &index.name)?;
    put_count(out, index.columns.len())?;
    for column in &index.columns {
        put_str(out, column)?;
    }
    out.push(match index.uniqueness {
        Uniqueness::NonUnique => 0,
        Uniqueness::PrimaryKey => 1,
        Uniqueness::UniqueConstraint => 2,
        Uniqueness::UniqueIndex => 3,
    });
    out.push(match index.options.latch_policy {
        LatchPolicy::Fifo => 0,
        LatchPolicy::Adaptive => 1,
    });
    out.push(insert_path_tag(index.options.insert_path));
    put_bool(out, index.options.optimize_for_sequential_key);
    Ok(())
}

/// The insert path's tag byte, in the catalog and in logged index changes.
pub(crate) fn insert_path_tag(path: InsertPath) -> u8 {
    match path {
        InsertPath::Classic => 0,
        InsertPath::Default => 1,
    }
}

/// The insert path of a tag byte written by [`insert_path_tag`].
pub(crate) fn insert_path_of_tag(tag: u8) -> Result<InsertPath> {
    match tag {
        0 => Ok(InsertPath::Classic),
        1 => Ok(InsertPath::Default),
        tag => Err(corrupt(format!("unknown insert path tag {tag}"))),
    }
}

fn put_data_type(out: &mut Vec<u8>, data_type: DataType) {
    match data_type {
        DataType::TinyInt => out.push(1),
        DataType::SmallInt => out.push(2),
        DataType::Int => out.push(3),
        DataType::BigInt => out.push(4),
        DataType::Bit => out.push(5),
        DataType::Decimal { precision, scale } => out.extend_from_slice(&[6, precision, scale]),
        DataType::Money => out.push(7),
        DataType::Char(n) => put_tag_u16(out, 8, n),
        DataType::VarChar(n) => put_tag_u16(out, 9, n),
        DataType::NChar(n) => put_tag_u16(out, 10, n),
        DataType::NVarChar(n) => put_tag_u16(out, 11, n),
        DataType::DateTime2(p) => out.extend_from_slice(&[12, p]),
        DataType::Date => out.push(13),
        DataType::UniqueIdentifier => out.push(14),
        DataType::VarBinary(n) => put_tag_u16(out, 15, n),
    }
}

fn put_tag_u16(out: &mut Vec<u8>, tag: u8, n: u16) {
    out.push(tag);
    out.extend_from_slice(&n.to_le_bytes());
}

fn put_bool(out: &mut Vec<u8>, value: bool) {
    out.push(u8::from(value));
}

fn put_count(out: &mut Vec<u8>, count: usize) -> Result<()> {
    let count = u32::try_from(count).map_err(|_| {
        EngineError::InvalidCatalog(format!("{count} items are too many for one list"))
    })?;
    out.extend_from_slice(&count.to_le_bytes());
    Ok(())
}

fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) -> Result<()> {
    put_count(out, bytes.len())?;
    out.extend_from_slice(bytes);
    Ok(())
}

fn put_str(out: &mut Vec<u8>, text: &str) -> Result<()> {
    put_bytes(out, text.as_bytes())
}

// ---------------------------------------------------------------------------------------------
// Decoding
// ---------------------------------------------------------------------------------------------

fn decode_entry(r: &mut Cursor<'_>, format_version: u32) -> Result<CatalogEntry> {
    let table_id = r.u32()?;
    let name = r.string()?;
    // A column takes at least 8 bytes: an empty name, a type tag and three flag bytes.
    let column_count = r.count(8)?;
    let mut columns = Vec::with_capacity(column_count);
    for _ in 0..column_count {
        let column_name = r.string()?;
        let data_type = r.data_type()?;
        let nullable = r.bool()?;
        let default = match r.u8()? {
            DEFAULT_NONE => None,
            DEFAULT_CONSTANT => {
                let bytes = r.bytes()?;
                // The row decoder trusts its types to be valid, so check this one first.
                data_type.validate().map_err(|error| {
                    corrupt(format!("column '{column_name}' of '{name}': {error}"))
                })?;
                let mut values = decode_row(&[data_type], bytes).map_err(|error| {
                    corrupt(format!(
                        "the default of column '{column_name}' of '{name}': {error}"
                    ))
                })?;
                let value = values.pop().unwrap_or(Value::Null);
                // The encoder stores constants converted to the column's type, so a value the
                // conversion would still change (a datetime2 finer than its precision, say)
                // was not written by it.
                if data_type.coerce(value.clone()).ok().as_ref() != Some(&value) {
                    return Err(corrupt(format!(
                        "the default of column '{column_name}' of '{name}' is not a {} value",
                        data_type.name()
                    )));
                }
                Some(DefaultValue::Constant(value))
            }
            DEFAULT_UTC_NOW => Some(DefaultValue::CurrentUtcDateTime),
            DEFAULT_NEW_ID => Some(DefaultValue::NewId),
            tag => return Err(corrupt(format!("unknown default tag {tag}"))),
        };
        let identity = if r.bool()? {
            Some(Identity {
                seed: r.i64()?,
                increment: r.i64()?,
            })
        } else {
            None
        };
        let computed = if format_version >= CATALOG_FORMAT_VERSION && r.bool()? {
            Some(Computed::Expression(r.expr(COMPUTED_EXPRESSION_MAX_DEPTH)?))
        } else {
            None
        };
        columns.push(ColumnDef {
            name: column_name,
            data_type,
            nullable,
            default,
            identity,
            computed,
        });
    }
    let clustered = if r.bool()? { Some(r.index()?) } else { None };
    // An index takes at least 12 bytes: an empty name, a column count and four tag bytes.
    let nonclustered_count = r.count(12)?;
    let mut nonclustered = Vec::with_capacity(nonclustered_count);
    for _ in 0..nonclustered_count {
        nonclustered.push(r.index()?);
    }
    let partition = if r.bool()? {
        Some(PartitionDef {
            column: r.string()?,
            partitions: r.u16()?,
        })
    } else {
        None
    };
    let logged = r.bool()?;
    // A tree list takes at least its 4-byte partition count.
    let tree_count = r.count(4)?;
    let mut index_trees = Vec::with_capacity(tree_count);
    for _ in 0..tree_count {
        // A partition takes 16 bytes: index id, root and row count; and in version 2 at least
        // the 4 of its spare leaf count.
        let has_spare_leaves = format_version != CATALOG_FORMAT_VERSION_1;
        let partitions = r.count(if has_spare_leaves { 20 } else { 16 })?;
        let mut trees = IndexTrees {
            index_id_per_partition: Vec::with_capacity(partitions),
            root_per_partition: Vec::with_capacity(partitions),
            rows_per_partition: Vec::with_capacity(partitions),
            spare_leaves_per_partition: Vec::with_capacity(partitions),
        };
        for _ in 0..partitions {
            trees.index_id_per_partition.push(r.u32()?);
            trees.root_per_partition.push(r.u32()?);
            trees.rows_per_partition.push(r.u64()?);
            let mut spare_leaves = Vec::new();
            if has_spare_leaves {
                let count = r.count(4)?;
                spare_leaves.reserve(count);
                for _ in 0..count {
                    spare_leaves.push(r.u32()?);
                }
            }
            trees.spare_leaves_per_partition.push(spare_leaves);
        }
        index_trees.push(trees);
    }
    let next_identity = if r.bool()? { Some(r.i64()?) } else { None };
    let uniquifier_blocks = if format_version >= CATALOG_FORMAT_VERSION && r.bool()? {
        Some(r.u64()?)
    } else {
        None
    };
    Ok(CatalogEntry {
        table_id,
        definition: TableDef {
            name,
            columns,
            clustered,
            nonclustered,
            partition,
            logged,
        },
        index_trees,
        next_identity,
        uniquifier_blocks,
    })
}

/// A bounds-checked reader over the body. Every read that runs past the end is a
/// [`EngineError::CorruptCatalog`].
struct Cursor<'a> {
    bytes: &'a [u8],
}

impl<'a> Cursor<'a> {
    fn new(bytes: &'a [u8]) -> Self {
        Cursor { bytes }
    }

    fn remaining(&self) -> usize {
        self.bytes.len()
    }

    fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        if n > self.bytes.len() {
            return Err(corrupt(format!(
                "{n} bytes are needed but only {} are left",
                self.bytes.len()
            )));
        }
        let (head, tail) = self.bytes.split_at(n);
        self.bytes = tail;
        Ok(head)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N]> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }

    fn u8(&mut self) -> Result<u8> {
        Ok(self.array::<1>()?[0])
    }

    fn u16(&mut self) -> Result<u16> {
        Ok(u16::from_le_bytes(self.array()?))
    }

    fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    fn i64(&mut self) -> Result<i64> {
        Ok(i64::from_le_bytes(self.array()?))
    }

    fn bool(&mut self) -> Result<bool> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            other => Err(corrupt(format!("{other} is not a boolean byte"))),
        }
    }

    /// A u32 count of items that take at least `min_size` bytes each. Checking it against the
    /// bytes left means a corrupt count can never make the caller reserve more memory than
    /// the blob could describe.
    fn count(&mut self, min_size: usize) -> Result<usize> {
        let count = self.u32()?;
        let count = usize::try_from(count).unwrap_or(usize::MAX);
        if count.saturating_mul(min_size) > self.remaining() {
            return Err(corrupt(format!(
                "a count of {count} items does not fit in the {} bytes left",
                self.remaining()
            )));
        }
        Ok(count)
    }

    fn bytes(&mut self) -> Result<&'a [u8]> {
        let len = self.count(1)?;
        self.take(len)
    }

    /// A stored computed expression nesting at most `depth` levels (each level is a call, so a
    /// corrupt catalog cannot exhaust the stack).
    fn expr(&mut self, depth: usize) -> Result<Expr> {
        if depth == 0 {
            return Err(corrupt(format!(
                "a computed expression nests more than {COMPUTED_EXPRESSION_MAX_DEPTH} levels"
            )));
        }
        Ok(match self.u8()? {
            EXPR_COLUMN => Expr::Column(self.string()?),
            EXPR_INTEGER => Expr::Integer(self.i64()?),
            EXPR_MODULO => Expr::Modulo(
                Box::new(self.expr(depth - 1)?),
                Box::new(self.expr(depth - 1)?),
            ),
            EXPR_ABS => Expr::Abs(Box::new(self.expr(depth - 1)?)),
            tag => return Err(corrupt(format!("unknown computed expression tag {tag}"))),
        })
    }

    fn string(&mut self) -> Result<String> {
        let bytes = self.bytes()?;
        std::str::from_utf8(bytes)
            .map(str::to_owned)
            .map_err(|_| corrupt("a name is not valid UTF-8".into()))
    }

    fn data_type(&mut self) -> Result<DataType> {
        Ok(match self.u8()? {
            1 => DataType::TinyInt,
            2 => DataType::SmallInt,
            3 => DataType::Int,
            4 => DataType::BigInt,
            5 => DataType::Bit,
            6 => DataType::Decimal {
                precision: self.u8()?,
                scale: self.u8()?,
            },
            7 => DataType::Money,
            8 => DataType::Char(self.u16()?),
            9 => DataType::VarChar(self.u16()?),
            10 => DataType::NChar(self.u16()?),
            11 => DataType::NVarChar(self.u16()?),
            12 => DataType::DateTime2(self.u8()?),
            13 => DataType::Date,
            14 => DataType::UniqueIdentifier,
            15 => DataType::VarBinary(self.u16()?),
            tag => return Err(corrupt(format!("unknown data type tag {tag}"))),
        })
    }

    fn index(&mut self) -> Result<IndexDef> {
        let name = self.string()?;
        // A key column name takes at least its 4-byte length.
        let column_count = self.count(4)?;
        let mut columns = Vec::with_capacity(column_count);
        for _ in 0..column_count {
            columns.push(self.string()?);
        }
        let uniqueness = match self.u8()? {
            0 => Uniqueness::NonUnique,
            1 => Uniqueness::PrimaryKey,
            2 => Uniqueness::UniqueConstraint,
            3 => Uniqueness::UniqueIndex,
            tag => return Err(corrupt(format!("unknown uniqueness tag {tag}"))),
        };
        let latch_policy = match self.u8()? {
            0 => LatchPolicy::Fifo,
            1 => LatchPolicy::Adaptive,
            tag => return Err(corrupt(format!("unknown latch policy tag {tag}"))),
        };
        let insert_path = insert_path_of_tag(self.u8()?)?;
        let optimize_for_sequential_key = self.bool()?;
        Ok(IndexDef {
            name,
            columns,
            uniqueness,
            options: IndexOptions {
                latch_policy,
                insert_path,
                optimize_for_sequential_key,
            },
        })
    }
}
