//! A table at run time: its clustered B+tree (which holds the rows), its nonclustered B+trees,
//! its identity counter, and the typed operations on rows.
//!
//! Record layout:
//! - Clustered index: key = the clustered key columns, memcomparable-encoded (plus an 8-byte
//!   uniquifier if the index is not unique); value = the other columns, plus any varchar,
//!   nvarchar or varbinary key columns (whose key encoding drops trailing spaces or zeros),
//!   row-encoded.
//! - Unique nonclustered index: key = its columns; value = the clustered key (the locator).
//! - Non-unique nonclustered index: key = its columns followed by the clustered key; value empty.

use smallvec::SmallVec;
use std::cell::Cell;
use std::ops::{Bound, Range};
use std::sync::Arc;

use lastpage_storage::btree::{
    BTree, BTreeError, CompareAndUpdate, Direction, GeneratedKeyError, InsertPath, RangeIter,
    TreeCheck, TreeOptions, batch_item_range,
};
use lastpage_storage::limits::{
    BATCH_BUFFER_KEPT_BYTES, BATCH_BUFFER_RESERVE_MAX_BYTES, BORROWED_ROW_INLINE_COLUMNS,
    INDEX_LOOKUP_MAX_PASSES, INSERT_SCRATCH_KEPT_BYTES, LANE_IDENTITY_MAX_INCREMENT,
    MAX_RECORD_BYTES,
};
use lastpage_storage::scratch::with_scratch;
use lastpage_storage::sync::{AtomicBool, Ordering};
use lastpage_storage::wal::{Record, TxnId, record};
use std::borrow::{Borrow, Cow};

use crate::catalog::{CatalogEntry, IndexTrees};
use crate::computed::Evaluator;
use crate::database::Session;
use crate::encoding::{
    decode_key, decode_key_column, decode_row, encode_key_value, encode_row,
    push_lowest_value_start,
};
use crate::error::{EngineError, Result};
use crate::identity::{IdentityState, ReservationLog};
use crate::locks::{LockKey, LockPatience};
use crate::pending::{HeldPendingDeletes, PendingDeletes};
use crate::row_bytes::RowBytes;
use crate::schema::{ColumnDef, DefaultValue, IndexDef, IndexOptions, TableDef, Uniqueness};
use crate::txn::WriteScope;
use crate::types::{
    DataType, DateTime2, Decimal, MAX_BYTE_LENGTH, MAX_NCHAR_LENGTH, Uuid, Value, ValueError,
    ValueErrorKind,
};
use crate::uniquifier::Uniquifiers;

/// A row: one value per column, in column order.
pub type Row = Vec<Value>;

/// A row completed from values the caller keeps (see [`Table::complete_borrowed_into`]): a
/// value its column's type holds as it is stays borrowed. Inline up to
/// [`BORROWED_ROW_INLINE_COLUMNS`] columns, so that a single-row insert builds it without an
/// allocation.
type BorrowedRow<'v> = SmallVec<[Cow<'v, Value>; BORROWED_ROW_INLINE_COLUMNS]>;

/// A completed row an identity-keyed insert takes: owned values ([`Row`]), or values borrowed
/// from the caller where their types allow ([`BorrowedRow`], from a [`PreparedInsert`]).
trait CompletedRow {
    type Value: Borrow<Value>;

    /// The values, in column order.
    fn values(&self) -> &[Self::Value];

    /// The row as owned values, which nonclustered entries are made from; `None` for borrowed
    /// values, which only tables without nonclustered indexes take.
    fn owned(&mut self) -> Option<&mut Row>;

    /// The values, owned, for an error message.
    fn owned_copy(&self) -> Cow<'_, [Value]>;
}

impl CompletedRow for Row {
    type Value = Value;

    fn values(&self) -> &[Value] {
        self
    }

    fn owned(&mut self) -> Option<&mut Row> {
        Some(self)
    }

    fn owned_copy(&self) -> Cow<'_, [Value]> {
        Cow::Borrowed(self)
    }
}

impl<'v> CompletedRow for BorrowedRow<'v> {
    type Value = Cow<'v, Value>;

    fn values(&self) -> &[Cow<'v, Value>] {
        self
    }

    fn owned(&mut self) -> Option<&mut Row> {
        None
    }

    fn owned_copy(&self) -> Cow<'_, [Value]> {
        Cow::Owned(self.iter().map(|value| value.as_ref().clone()).collect())
    }
}

/// The values an insert supplies, by column position. Columns left out get their identity
/// value, their default, or NULL.
#[derive(Clone, Debug, Default)]
pub struct InsertRow {
    values: Vec<(usize, Value)>,
}

impl InsertRow {
    /// A row that supplies no columns yet.
    pub fn new() -> Self {
        InsertRow::default()
    }

    /// Supplies `value` for the column at `column`.
    pub fn set(mut self, column: usize, value: impl Into<Value>) -> Self {
        self.values.push((column, value.into()));
        self
    }

    /// A row supplying a copy of `values[i]` for `columns[i]`: what an insert of borrowed
    /// values takes into a table it cannot write them to as they are.
    fn copied(columns: &[usize], values: &[Value]) -> Self {
        InsertRow {
            values: columns
                .iter()
                .copied()
                .zip(values.iter().cloned())
                .collect(),
        }
    }
}

/// An insert of a fixed list of columns into one table, checked once and run many times with
/// values the caller keeps, as a prepared `INSERT ... VALUES (@p1, ...)` binds its parameters
/// (made by [`Table::prepare_insert`]). Into a table clustered on its identity alone without
/// nonclustered indexes (the table the seeds' workload inserts into), nothing is built per
/// row: values their columns' types hold as they are are encoded where they lie. Into other
/// tables each run copies the values into a row and inserts it as [`Table::insert`] does.
#[derive(Clone, Debug)]
pub struct PreparedInsert {
    table: Arc<Table>,
    columns: Vec<usize>,
    /// For each of the table's columns, the position of its value in a row, if supplied.
    slots: Vec<Option<usize>>,
}

impl PreparedInsert {
    /// The table the insert goes into.
    pub fn table(&self) -> &Arc<Table> {
        &self.table
    }

    /// Inserts one row: `values` holds one value per prepared column, in their order. Returns
    /// the row's identity value, if the table has an identity column. Autocommit or within the
    /// session's transaction, atomic, and checked like [`Table::insert`]; a row with a
    /// different number of values fails.
    pub fn insert(&self, session: &Session, values: &[Value]) -> Result<Option<i64>> {
        let table = &self.table;
        let values = supplied_row(&self.columns, 1, values)?;
        if table.identity_keyed && table.nonclustered.is_empty() {
            return session.write(table, |scope| {
                let mut row = BorrowedRow::new();
                table.complete_borrowed_into(&self.slots, values, &mut row)?;
                table.insert_with_identity_key(scope, &mut row).map(Some)
            });
        }
        table.insert(session, InsertRow::copied(&self.columns, values))
    }
}

/// `row`, the `row_number`-th (from 1) of an insert that supplies `columns`, if it has one
/// value per column.
fn supplied_row<'v>(columns: &[usize], row_number: usize, row: &'v [Value]) -> Result<&'v [Value]> {
    if row.len() == columns.len() {
        Ok(row)
    } else {
        Err(EngineError::InsertArity {
            row: row_number,
            expected: columns.len(),
            got: row.len(),
        })
    }
}

/// A key range over a leading prefix of an index's key columns. A bound with fewer values
/// than key columns covers every key that starts with them.
#[derive(Clone, Debug)]
pub struct KeyRange {
    /// Lower bound.
    pub lower: Bound<Vec<Value>>,
    /// Upper bound.
    pub upper: Bound<Vec<Value>>,
}

impl KeyRange {
    /// Every key.
    pub fn all() -> Self {
        KeyRange {
            lower: Bound::Unbounded,
            upper: Bound::Unbounded,
        }
    }
}

/// What the integrity check of one table found.
#[derive(Clone, Debug, PartialEq)]
pub struct TableCheck {
    /// The table.
    pub table: String,
    /// Rows in the clustered index.
    pub rows: u64,
    /// Each index's tree check, clustered first.
    pub indexes: Vec<(String, TreeCheck)>,
}

/// One index at run time.
pub(crate) struct Index {
    pub(crate) def: IndexDef,
    /// Positions of the key columns in the table.
    column_ids: Vec<usize>,
    /// Types of the key columns.
    types: Vec<DataType>,
    /// The uniquifiers of a non-unique clustered index, whose every key ends in one (8 bytes,
    /// hidden); `None` for every other index.
    uniquifiers: Option<Uniquifiers>,
    /// One tree per partition (one for an unpartitioned table).
    pub(crate) trees: Vec<BTree>,
}

impl Index {
    /// The tree of partition `partition`.
    fn tree(&self, partition: usize) -> &BTree {
        &self.trees[partition]
    }

    /// Encodes the index's columns of `row` into `out`.
    fn encode_columns(&self, row: &[Value], out: &mut Vec<u8>) -> Result<()> {
        for (&column, data_type) in self.column_ids.iter().zip(&self.types) {
            encode_key_value(data_type, &row[column], out)?;
        }
        Ok(())
    }

    /// Whether the index is unique and `column` (the identity) is not among its key columns:
    /// then its keys are not fresh, and an insert must lock them.
    fn unique_without(&self, column: usize) -> bool {
        self.def.uniqueness.is_unique() && !self.column_ids.contains(&column)
    }

    /// The key's columns as text, for duplicate-key messages.
    fn describe_key(&self, row: &[Value]) -> String {
        // A row missing (a batch's failed row whose record did not decode) shows as `?`.
        self.column_ids
            .iter()
            .map(|&column| {
                row.get(column)
                    .map_or_else(|| "?".to_owned(), Value::to_string)
            })
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// Where an insert's identity value comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum IdentityFill {
    /// A value taken earlier (a batch takes a block at once).
    Preassigned(i64),
    /// Leave the column NULL: the clustered tree makes the value as it inserts the row. (What
    /// a table without an identity column passes too.)
    LeaveToTree,
}

/// At most how many rows an `InsertRun` record's row list is allocated for up front.
const RUN_ROWS_RESERVED_MAX: usize = 4096;

/// Bytes of the hidden uniquifier at the end of a non-unique clustered key.
const UNIQUIFIER_BYTES: usize = 8;

/// A clustered record found by a lookup: its partition, key and value.
type FoundRecord = (usize, Vec<u8>, Vec<u8>);

thread_local! {
    /// A single-row insert's values, kept per thread (see [`with_scratch`]) so that an insert
    /// neither allocates nor frees the vector.
    static ROW_SCRATCH: Cell<Row> = const { Cell::new(Vec::new()) };
    /// A single-row insert's encoded value, likewise (moved out when the change is kept).
    static VALUE_SCRATCH: Cell<Vec<u8>> = const { Cell::new(Vec::new()) };
    /// The key the tree makes for a single-row insert of an identity key, likewise.
    static KEY_SCRATCH: Cell<Vec<u8>> = const { Cell::new(Vec::new()) };
    /// The buffer of this thread's last multi-row insert (see [`take_batch_buffer`]).
    static BATCH_BUFFER: Cell<Option<Arc<Vec<u8>>>> = const { Cell::new(None) };
}

/// An empty buffer for a multi-row insert's encoded rows: the thread's last one if nothing
/// holds it any more (the transaction that inserted those rows has ended), else a new one.
/// Reusing it matters: a 1,000-row batch's buffer is about the size at which the allocator
/// maps fresh memory for every request, and faulting it in cost more than its rows' own
/// allocations did.
fn take_batch_buffer() -> Vec<u8> {
    let mut buffer = BATCH_BUFFER
        .take()
        .and_then(|shared| Arc::try_unwrap(shared).ok())
        .unwrap_or_default();
    buffer.clear();
    buffer
}

/// Marks the end of the row just encoded into a batch's `buffer`; after the first of
/// `row_count` rows, reserves room for the others if they are the size of the first.
fn end_batch_row(buffer: &mut Vec<u8>, value_ends: &mut Vec<usize>, row_count: usize) {
    if value_ends.is_empty() {
        reserve_for_batch(buffer, row_count);
    }
    value_ends.push(buffer.len());
}

/// Reserves room in a batch's `buffer`, which holds its first row, for the other rows of
/// `row_count` if they are the size of the first, up to `BATCH_BUFFER_RESERVE_MAX_BYTES` (more
/// grows as usual). The guess is only a guess: a long first row in a batch of millions of
/// short ones asked for tens of GB at once, and a failed allocation aborts the process.
fn reserve_for_batch(buffer: &mut Vec<u8>, row_count: usize) {
    let guess = buffer.len().saturating_mul(row_count.saturating_sub(1));
    buffer.reserve(guess.min(BATCH_BUFFER_RESERVE_MAX_BYTES));
}

/// Keeps `buffer` as the thread's batch buffer, unless it grew past `BATCH_BUFFER_KEPT_BYTES`.
fn keep_batch_buffer(buffer: &Arc<Vec<u8>>) {
    if buffer.capacity() <= BATCH_BUFFER_KEPT_BYTES {
        BATCH_BUFFER.set(Some(Arc::clone(buffer)));
    }
}

/// A row of a multi-row insert ready to go in: its partition, where its clustered key and
/// value lie in the statement's buffer of encoded rows, and its nonclustered entries.
type PreparedRow = (usize, Range<usize>, Range<usize>, Vec<(Vec<u8>, Vec<u8>)>);

/// One change to one row, as clustered records (the nonclustered entries follow from them):
/// what the log records, what undo inverts and what recovery replays.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum RowChange {
    /// A row was inserted.
    Insert {
        partition: usize,
        key: RowBytes,
        value: RowBytes,
    },
    /// A row was deleted.
    Delete {
        partition: usize,
        key: RowBytes,
        old_value: RowBytes,
    },
    /// A row's value changed (its clustered key did not; a key change is a delete and an
    /// insert).
    Update {
        partition: usize,
        key: RowBytes,
        old_value: RowBytes,
        new_value: RowBytes,
    },
}

impl RowChange {
    /// The change that undoes this one, reusing its bytes.
    pub(crate) fn into_inverse(self) -> RowChange {
        match self {
            RowChange::Insert {
                partition,
                key,
                value,
            } => RowChange::Delete {
                partition,
                key,
                old_value: value,
            },
            RowChange::Delete {
                partition,
                key,
                old_value,
            } => RowChange::Insert {
                partition,
                key,
                value: old_value,
            },
            RowChange::Update {
                partition,
                key,
                old_value,
                new_value,
            } => RowChange::Update {
                partition,
                key,
                old_value: new_value,
                new_value: old_value,
            },
        }
    }

    /// The log record of this change by `txn` to `table`. Records name the partition's
    /// clustered tree.
    pub(crate) fn to_record<'a>(&'a self, txn: TxnId, table: &Table) -> Record<'a> {
        match self {
            RowChange::Insert {
                partition,
                key,
                value,
            } => Record::Insert {
                txn,
                index_id: table.clustered.tree(*partition).index_id(),
                key: Cow::Borrowed(key),
                value: Cow::Borrowed(value),
            },
            RowChange::Delete {
                partition,
                key,
                old_value,
            } => Record::Delete {
                txn,
                index_id: table.clustered.tree(*partition).index_id(),
                key: Cow::Borrowed(key),
                old_value: Cow::Borrowed(old_value),
            },
            RowChange::Update {
                partition,
                key,
                old_value,
                new_value,
            } => Record::Update {
                txn,
                index_id: table.clustered.tree(*partition).index_id(),
                key: Cow::Borrowed(key),
                old_value: Cow::Borrowed(old_value),
                new_value: Cow::Borrowed(new_value),
            },
        }
    }

    /// The log record of the next changes of `changes` (by `txn`, to `table`), and how many of
    /// them it covers. Two or more inserts into the same partition in a row become one
    /// `InsertRun` record of at most `max_payload_bytes` (a longer run takes several); anything
    /// else is one record per change. `changes` must not be empty.
    pub(crate) fn next_log_record<'a>(
        changes: impl Iterator<Item = &'a RowChange>,
        txn: TxnId,
        table: &Table,
        max_payload_bytes: usize,
    ) -> (Record<'a>, usize) {
        let mut changes = changes.peekable();
        let first = changes.next().expect("a change to log");
        let RowChange::Insert { partition, .. } = first else {
            return (first.to_record(txn, table), 1);
        };
        let same_partition = |change: &RowChange| match change {
            RowChange::Insert {
                partition: other, ..
            } => other == partition,
            _ => false,
        };
        // A single-row statement (the common case) allocates no run.
        if !changes.peek().is_some_and(|second| same_partition(second)) {
            return (first.to_record(txn, table), 1);
        }
        let mut payload_bytes = record::INSERT_RUN_FIXED_BYTES;
        // Room for every change left (a run stops at `max_payload_bytes`, so only a bound).
        let mut rows = Vec::with_capacity((changes.size_hint().0 + 1).min(RUN_ROWS_RESERVED_MAX));
        for change in std::iter::once(first).chain(changes) {
            let RowChange::Insert { key, value, .. } = change else {
                break;
            };
            let row_bytes = record::insert_run_row_bytes(key, value);
            if !same_partition(change) || payload_bytes + row_bytes > max_payload_bytes {
                break;
            }
            payload_bytes += row_bytes;
            rows.push((Cow::Borrowed(&key[..]), Cow::Borrowed(&value[..])));
        }
        let covered = rows.len();
        if covered < 2 {
            // Rows too large to share a record (only with a tiny log buffer).
            return (first.to_record(txn, table), 1);
        }
        let record = Record::InsertRun {
            txn,
            index_id: table.clustered.tree(*partition).index_id(),
            rows,
        };
        (record, covered)
    }

    /// The changes a log record describes, in `partition`: one, or each row of an
    /// `InsertRun`. `record` was decoded from `payload` (its bytes, shared): each key and value
    /// is a range of `payload` rather than a copy of its own, so that replaying a batch's
    /// record costs no allocation per row (copying every row out of the record, and freeing
    /// each copy after it was applied, was about a quarter of the replay of a 1 GiB log).
    pub(crate) fn from_record(
        partition: usize,
        record: Record<'_>,
        payload: &Arc<Vec<u8>>,
    ) -> Result<Vec<RowChange>> {
        let bytes = |part: Cow<'_, [u8]>| RowBytes::within(payload, part);
        Ok(match record {
            Record::Insert { key, value, .. } => vec![RowChange::Insert {
                partition,
                key: bytes(key),
                value: bytes(value),
            }],
            Record::InsertRun { rows, .. } => rows
                .into_iter()
                .map(|(key, value)| RowChange::Insert {
                    partition,
                    key: bytes(key),
                    value: bytes(value),
                })
                .collect(),
            Record::Delete { key, old_value, .. } => vec![RowChange::Delete {
                partition,
                key: bytes(key),
                old_value: bytes(old_value),
            }],
            Record::Update {
                key,
                old_value,
                new_value,
                ..
            } => vec![RowChange::Update {
                partition,
                key: bytes(key),
                old_value: bytes(old_value),
                new_value: bytes(new_value),
            }],
            other => {
                return Err(EngineError::Storage(format!(
                    "a {:?} log record is not a row change",
                    other.kind()
                )));
            }
        })
    }
}

/// A table.
pub struct Table {
    id: u32,
    name: String,
    columns: Vec<ColumnDef>,
    clustered: Index,
    nonclustered: Vec<Index>,
    identity: Option<IdentityState>,
    /// Columns stored in the clustered record's value: those not in the clustered key, and
    /// varchar, nvarchar and varbinary key columns (their key encoding drops trailing pad).
    value_columns: Vec<usize>,
    value_types: Vec<DataType>,
    /// `value_columns` as a range, when they are consecutive (so no copy is needed to encode).
    value_columns_range: Option<std::ops::Range<usize>>,
    /// The computed columns, in column order, each with how it is evaluated.
    computed_columns: Vec<(usize, Evaluator)>,
    /// Whether the clustered key is the identity column alone, ascending, with no computed
    /// column (which could depend on the identity value): then the clustered tree makes the
    /// identity key itself, under the latch of the leaf the row goes on (a sequence lane's, or
    /// the last leaf).
    identity_keyed: bool,
    /// Whether every key an insert locks is one nobody has seen: the clustered key contains the
    /// identity column, and so does every unique nonclustered index (a unique key without it,
    /// a customer's code say, may be one another transaction inserted and has not committed:
    /// an insert of the same value must wait for that transaction to end, and then fails only
    /// if it committed). Decided once, like `identity_keyed`: inserts ask on every row.
    inserts_only_fresh_keys: bool,
    /// Hash partitioning, if the table is partitioned.
    partitioning: Option<Partitioning>,
    /// The definition the table was created from, for the catalog.
    definition: TableDef,
    /// Set once the table is dropped: a handle kept from before then refuses reads, and writes
    /// that would go to a table nobody can reach again (see `Database::drop_table`).
    dropped: AtomicBool,
    /// The instance number of the database the table belongs to: a statement through a
    /// session of another database is refused, since it would take that database's locks and
    /// write that database's log under this table's index ids.
    database: u64,
    /// Rows deleted by transactions that have not ended, for READ COMMITTED lookups.
    pending_deletes: PendingDeletes,
}

/// How a partitioned table spreads its rows: by the value of an integer column modulo the
/// number of partitions (what the seeds build with `InsertID % 16` and a partition function
/// with one partition per value). Every index is aligned: a row's entries all live in the
/// same partition's trees.
#[derive(Clone, Copy, Debug)]
struct Partitioning {
    /// The partitioning column.
    column: usize,
    /// Its position in the clustered key.
    key_position: usize,
    /// Number of partitions.
    count: usize,
}

/// Most partitions a table may have.
pub const MAX_PARTITIONS: u16 = 1024;

/// The partition of an integer value: its remainder modulo `count`, made non-negative.
fn partition_of_value(value: &Value, count: usize) -> usize {
    let number = match value {
        Value::TinyInt(v) => i64::from(*v),
        Value::SmallInt(v) => i64::from(*v),
        Value::Int(v) => i64::from(*v),
        Value::BigInt(v) => *v,
        _ => 0,
    };
    usize::try_from(number.rem_euclid(count as i64)).unwrap_or(0)
}

impl std::fmt::Debug for Table {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Table")
            .field("id", &self.id)
            .field("name", &self.name)
            .field("columns", &self.columns.len())
            .field("partitions", &self.partition_count())
            .finish_non_exhaustive()
    }
}

impl Table {
    /// Builds the table. `make_tree` makes each index's tree, one per partition, clustered
    /// index first: a new one, or one reattached from a checkpoint image.
    pub(crate) fn create(
        database: u64,
        id: u32,
        def: TableDef,
        make_tree: &mut dyn FnMut(TreeOptions) -> Result<BTree>,
    ) -> Result<Table> {
        // A PRIMARY KEY's columns are NOT NULL, as in SQL Server ("if nullability isn't
        // specified, all columns participating in a PRIMARY KEY constraint have their
        // nullability set to NOT NULL"): a NULL key was stored before.
        let mut def = def;
        let primary_key_columns: Vec<String> = def
            .clustered
            .iter()
            .chain(&def.nonclustered)
            .filter(|index| index.uniqueness == Uniqueness::PrimaryKey)
            .flat_map(|index| index.columns.iter().cloned())
            .collect();
        for column in &mut def.columns {
            if primary_key_columns
                .iter()
                .any(|name| name.eq_ignore_ascii_case(&column.name))
            {
                column.nullable = false;
            }
        }
        let definition = def.clone();
        let invalid = |reason: String| EngineError::InvalidDefinition {
            table: def.name.clone(),
            reason,
        };
        if def.columns.is_empty() {
            return Err(invalid("a table needs at least one column".into()));
        }
        for (position, column) in def.columns.iter().enumerate() {
            column
                .data_type
                .validate()
                .map_err(|error| error.with_column(&column.name))?;
            if def.columns[..position]
                .iter()
                .any(|earlier| earlier.name.eq_ignore_ascii_case(&column.name))
            {
                return Err(invalid(format!(
                    "column '{}' is defined twice",
                    column.name
                )));
            }
            if let Some(identity) = column.identity {
                if identity.increment == 0 {
                    return Err(invalid(format!(
                        "the identity increment of '{}' is zero",
                        column.name
                    )));
                }
                if !matches!(
                    column.data_type,
                    DataType::TinyInt | DataType::SmallInt | DataType::Int | DataType::BigInt
                ) {
                    return Err(invalid(format!(
                        "identity column '{}' must be an integer type",
                        column.name
                    )));
                }
                if column.computed.is_some() || column.default.is_some() {
                    return Err(invalid(format!(
                        "identity column '{}' cannot have a default or an expression",
                        column.name
                    )));
                }
            }
        }
        // Checked and resolved before any tree is made, like the rest of the definition.
        let mut computed_columns = Vec::new();
        for (position, column) in def.columns.iter().enumerate() {
            if let Some(computed) = &column.computed {
                let evaluator = Evaluator::new(computed, &def.columns).map_err(|reason| {
                    invalid(format!("computed column '{}': {reason}", column.name))
                })?;
                computed_columns.push((position, evaluator));
            }
        }
        let identities: Vec<usize> = (0..def.columns.len())
            .filter(|&position| def.columns[position].identity.is_some())
            .collect();
        if identities.len() > 1 {
            return Err(invalid("a table can have only one identity column".into()));
        }
        let find_column = |name: &str| -> Result<usize> {
            def.columns
                .iter()
                .position(|column| column.name.eq_ignore_ascii_case(name))
                .ok_or_else(|| EngineError::UnknownColumn {
                    table: def.name.clone(),
                    column: name.to_owned(),
                })
        };
        let clustered_def = def.clustered.clone().unwrap_or_else(|| {
            IndexDef::new(format!("heap_{}", def.name), &[], Uniqueness::NonUnique)
        });
        // The partitioning is checked before any tree is made: a definition refused afterwards
        // would make and free a tree per partition and index for nothing.
        let partition_column = match &def.partition {
            None => None,
            Some(partition) => {
                let column = find_column(&partition.column)?;
                if !matches!(
                    def.columns[column].data_type,
                    DataType::TinyInt | DataType::SmallInt | DataType::Int | DataType::BigInt
                ) {
                    return Err(invalid(format!(
                        "partitioning column '{}' must be an integer column",
                        partition.column
                    )));
                }
                if !(1..=MAX_PARTITIONS).contains(&partition.partitions) {
                    return Err(invalid(format!(
                        "a table has 1 to {MAX_PARTITIONS} partitions, not {}",
                        partition.partitions
                    )));
                }
                // As SQL Server requires of a unique index, the partitioning column must be
                // part of the clustered key, so a row's partition follows from its key; and of
                // every unique nonclustered index, whose trees are per partition too: without
                // the column, two partitions could each hold the same key once.
                let names_column = |index: &IndexDef| {
                    index
                        .columns
                        .iter()
                        .any(|name| name.eq_ignore_ascii_case(&def.columns[column].name))
                };
                if !names_column(&clustered_def) {
                    return Err(invalid(format!(
                        "partitioning column '{}' must be part of the clustered key",
                        partition.column
                    )));
                }
                if let Some(index) = def
                    .nonclustered
                    .iter()
                    .find(|index| index.uniqueness.is_unique() && !names_column(index))
                {
                    return Err(invalid(format!(
                        "partitioning column '{}' must be part of the key of unique index '{}'",
                        partition.column, index.name
                    )));
                }
                Some(column)
            }
        };
        let partition_count = def
            .partition
            .as_ref()
            .map_or(1, |partition| usize::from(partition.partitions));
        let mut build_index = |index: &IndexDef, clustered: bool| -> Result<Index> {
            let column_ids = index
                .columns
                .iter()
                .map(|name| find_column(name))
                .collect::<Result<Vec<_>>>()?;
            if column_ids.is_empty() && !clustered {
                return Err(invalid(format!("index '{}' has no columns", index.name)));
            }
            let options = TreeOptions {
                latch_policy: index.options.latch_policy,
                insert_path: index.options.insert_path,
                optimize_for_sequential_key: index.options.optimize_for_sequential_key,
            };
            let trees = (0..partition_count)
                .map(|_| make_tree(options))
                .collect::<Result<Vec<_>>>()?;
            Ok(Index {
                types: column_ids
                    .iter()
                    .map(|&column| def.columns[column].data_type)
                    .collect(),
                column_ids,
                uniquifiers: (clustered && !index.uniqueness.is_unique()).then(Uniquifiers::new),
                def: index.clone(),
                trees,
            })
        };
        let clustered = build_index(&clustered_def, true)?;
        let mut nonclustered = Vec::with_capacity(def.nonclustered.len());
        for index in &def.nonclustered {
            if std::iter::once(&clustered_def)
                .chain(def.nonclustered.iter())
                .filter(|other| other.name.eq_ignore_ascii_case(&index.name))
                .count()
                > 1
            {
                return Err(invalid(format!(
                    "index name '{}' is used twice",
                    index.name
                )));
            }
            nonclustered.push(build_index(index, false)?);
        }
        let partitioning = partition_column.map(|column| Partitioning {
            column,
            key_position: clustered
                .column_ids
                .iter()
                .position(|&key_column| key_column == column)
                .expect("the partitioning column was checked to be in the clustered key"),
            count: partition_count,
        });
        // Columns outside the clustered key live in the record's value. So do variable-length
        // text and binary key columns: their key encoding drops trailing spaces (and zero
        // bytes), as SQL Server's comparison does, but a read must return the stored value.
        let value_columns: Vec<usize> = (0..def.columns.len())
            .filter(|column| {
                !clustered.column_ids.contains(column)
                    || matches!(
                        def.columns[*column].data_type,
                        DataType::VarChar(_) | DataType::NVarChar(_) | DataType::VarBinary(_)
                    )
            })
            .collect();
        let identity = identities.first().map(|&column| {
            let identity = def.columns[column].identity.expect("filtered on identity");
            IdentityState::new(
                column,
                def.columns[column].data_type,
                identity.seed,
                identity.increment,
            )
        });
        let identity_keyed = identity.as_ref().is_some_and(|identity| {
            identity.increment > 0
                && clustered.column_ids == [identity.column]
                && clustered.def.uniqueness.is_unique()
                && def.columns.iter().all(|column| column.computed.is_none())
                && partitioning.is_none()
        });
        let inserts_only_fresh_keys = identity.as_ref().is_some_and(|identity| {
            clustered.column_ids.contains(&identity.column)
                && !nonclustered
                    .iter()
                    .any(|index| index.unique_without(identity.column))
        });
        let value_columns_range = match (value_columns.first(), value_columns.last()) {
            (Some(&first), Some(&last)) if last - first + 1 == value_columns.len() => {
                Some(first..last + 1)
            }
            _ => None,
        };
        Ok(Table {
            definition,
            dropped: AtomicBool::new(false),
            database,
            pending_deletes: PendingDeletes::default(),
            value_columns_range,
            partitioning,
            identity_keyed,
            inserts_only_fresh_keys,
            id,
            value_types: value_columns
                .iter()
                .map(|&column| def.columns[column].data_type)
                .collect(),
            value_columns,
            computed_columns,
            identity,
            clustered,
            nonclustered,
            columns: def.columns,
            name: def.name,
        })
    }

    /// The table's id.
    pub fn id(&self) -> u32 {
        self.id
    }

    /// The table's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Rows of this table deleted by transactions that have not ended (see `pending.rs`).
    pub(crate) fn pending_deletes(&self) -> &PendingDeletes {
        &self.pending_deletes
    }

    /// Whether the table has been dropped (this handle was taken before).
    pub fn is_dropped(&self) -> bool {
        self.dropped.load(Ordering::Acquire)
    }

    /// Marks the table dropped: from now on reads and writes through any handle of it fail.
    pub(crate) fn mark_dropped(&self) {
        self.dropped.store(true, Ordering::Release);
    }

    /// Fails with `UnknownTable` (SQL Server's "Invalid object name") if the table has been
    /// dropped (a statement through a handle kept from before finds no table), or if `session`
    /// is one of another database (which has no such table).
    pub(crate) fn check_usable_by(&self, session: &Session) -> Result<()> {
        if self.is_dropped() || self.database != session.db().instance() {
            return Err(EngineError::UnknownTable(self.name.clone()));
        }
        Ok(())
    }

    /// The columns, in order.
    pub fn columns(&self) -> &[ColumnDef] {
        &self.columns
    }

    /// The position of the column called `name` (case-insensitive).
    pub fn column_index(&self, name: &str) -> Result<usize> {
        self.columns
            .iter()
            .position(|column| column.name.eq_ignore_ascii_case(name))
            .ok_or_else(|| EngineError::UnknownColumn {
                table: self.name.clone(),
                column: name.to_owned(),
            })
    }

    /// Rows in the table. Exact when no write is in flight.
    pub fn row_count(&self) -> u64 {
        // Saturating, though the open refuses a count above `limits::MAX_TREE_ROWS` (far
        // from overflowing this sum): a plain sum of forged counts overflowed before it did,
        // and a wrong count must never be a panic.
        self.clustered
            .trees
            .iter()
            .map(BTree::row_count)
            .fold(0, u64::saturating_add)
    }

    /// The clustered index's trees, one per partition (for statistics and checks).
    pub fn clustered_trees(&self) -> &[BTree] {
        &self.clustered.trees
    }

    /// The number of partitions (1 if the table is not partitioned).
    pub fn partition_count(&self) -> usize {
        self.partitioning
            .map_or(1, |partitioning| partitioning.count)
    }

    /// The partition a complete row belongs to.
    fn partition_of_row(&self, row: &[Value]) -> usize {
        self.partitioning.map_or(0, |partitioning| {
            partition_of_value(&row[partitioning.column], partitioning.count)
        })
    }

    /// The partition a clustered search key falls in, if the key includes the partitioning
    /// column; `None` means every partition must be searched.
    fn partition_of_key(&self, key: &[Value]) -> Result<Option<usize>> {
        let Some(partitioning) = self.partitioning else {
            return Ok(Some(0));
        };
        let Some(value) = key.get(partitioning.key_position) else {
            return Ok(None);
        };
        let converted = self.columns[partitioning.column]
            .data_type
            .coerce(value.clone())?;
        Ok(Some(partition_of_value(&converted, partitioning.count)))
    }

    /// Switches an index's insert path (every partition's tree). Both paths keep the same
    /// layout, so this takes effect for the next insert, without a rebuild. In a durable
    /// database the change is logged and flushed before it takes effect, and a reopened
    /// database keeps it.
    pub fn set_insert_path(
        &self,
        session: &Session,
        index_name: &str,
        path: lastpage_storage::btree::InsertPath,
    ) -> Result<()> {
        self.alter_index(session, index_name, |options| options.insert_path = path)
    }

    /// Switches OPTIMIZE_FOR_SEQUENTIAL_KEY of an index, without a rebuild, as
    /// `ALTER INDEX … SET (OPTIMIZE_FOR_SEQUENTIAL_KEY = ON)` does. In a durable database the
    /// change is logged and flushed before it takes effect, and a reopened database keeps it.
    pub fn set_optimize_for_sequential_key(
        &self,
        session: &Session,
        index_name: &str,
        enabled: bool,
    ) -> Result<()> {
        self.alter_index(session, index_name, |options| {
            options.optimize_for_sequential_key = enabled;
        })
    }

    /// Changes the run-time options of the index called `index_name` with `change`, through
    /// the database (which logs the change first).
    fn alter_index(
        &self,
        session: &Session,
        index_name: &str,
        change: impl FnOnce(&mut IndexOptions),
    ) -> Result<()> {
        let position = self.index_position(index_name)?;
        if position == 0 && self.definition.clustered.is_none() {
            // SQL Server's ALTER INDEX needs an index, which a heap has not; its hidden tree
            // has no definition to keep the options in.
            return Err(EngineError::InvalidDefinition {
                table: self.name.clone(),
                reason: "a heap has no index whose options could be changed".into(),
            });
        }
        session.db().alter_index(session, self, position, change)
    }

    /// The current options of the index at `position` (the clustered index first, then the
    /// nonclustered ones in order): the definition's latch policy, and the insert path and
    /// flow control setting its trees have now.
    pub(crate) fn index_options(&self, position: usize) -> IndexOptions {
        let index = self
            .indexes()
            .nth(position)
            .expect("a position of one of the table's indexes");
        let tree = index.tree(0).options();
        IndexOptions {
            latch_policy: index.def.options.latch_policy,
            insert_path: tree.insert_path,
            optimize_for_sequential_key: tree.optimize_for_sequential_key,
        }
    }

    /// Gives every tree of the index at `position` (see [`Table::indexes`]) an insert path and
    /// a flow control setting (the options that can change after the trees are made).
    pub(crate) fn apply_index_options(
        &self,
        position: usize,
        insert_path: lastpage_storage::btree::InsertPath,
        optimize_for_sequential_key: bool,
    ) -> Result<()> {
        let index = self.indexes().nth(position).ok_or_else(|| {
            EngineError::Storage(format!(
                "table {} has no index at position {position}",
                self.id
            ))
        })?;
        for tree in &index.trees {
            tree.set_insert_path(insert_path);
            tree.set_optimize_for_sequential_key(optimize_for_sequential_key);
        }
        Ok(())
    }

    /// Every index's name and trees (one per partition), clustered first.
    pub fn trees(&self) -> impl Iterator<Item = (&str, &[BTree])> {
        self.indexes()
            .map(|index| (index.def.name.as_str(), index.trees.as_slice()))
    }

    /// The identity value the next insert would get (SQL Server's IDENT_CURRENT + increment).
    pub fn next_identity(&self) -> Option<i64> {
        self.identity.as_ref().map(IdentityState::next)
    }

    /// Inserts one row; returns its identity value, if the table has an identity column.
    pub fn insert(self: &Arc<Self>, session: &Session, row: InsertRow) -> Result<Option<i64>> {
        session.write(self, |scope| self.insert_row(scope, row))
    }

    /// Prepares an insert that supplies `columns` (by position, each once; the others get
    /// their identity value, default or NULL), to run many times with
    /// [`PreparedInsert::insert`]. The column list is checked here, once: an unknown column,
    /// an identity or computed column, or a column named twice fails.
    pub fn prepare_insert(self: &Arc<Self>, columns: &[usize]) -> Result<PreparedInsert> {
        Ok(PreparedInsert {
            slots: self.supplied_slots(columns)?,
            columns: columns.to_vec(),
            table: Arc::clone(self),
        })
    }

    /// Inserts one row, naming its columns.
    pub fn insert_named(
        self: &Arc<Self>,
        session: &Session,
        values: &[(&str, Value)],
    ) -> Result<Option<i64>> {
        let mut row = InsertRow::new();
        for (name, value) in values {
            row = row.set(self.column_index(name)?, value.clone());
        }
        self.insert(session, row)
    }

    /// Inserts many rows as one statement (the batching remedy): each leaf is latched once per
    /// run of rows that land on it, not once per row, and an identity table hands the batch a
    /// contiguous block of values. The statement is atomic: if any row is rejected, the rows of
    /// the batch already inserted are removed again and one error is returned, found in this
    /// order: every row's values are checked first (NULLs, conversions, sizes), then the rows go
    /// into the clustered index, then into each nonclustered index in turn (row by row, every
    /// index, for a batch that goes in at the tail), and the error is the first row's rejected
    /// at the first step that rejects any (so a duplicate clustered key in a later row is
    /// reported before a duplicate unique nonclustered key in an earlier one);
    /// readers never see the batch's rows before it commits (its rows are locked even where
    /// fresh identity keys otherwise need no lock, an in-memory database's autocommit
    /// statement: a later row can still fail, on a full database, and take the batch's rows
    /// back; see `Table::visible_rows_cannot_fail`).
    pub fn insert_batch(
        self: &Arc<Self>,
        session: &Session,
        rows: Vec<InsertRow>,
    ) -> Result<Vec<Option<i64>>> {
        session.write(self, |scope| self.insert_batch_in(scope, rows))
    }

    /// Inserts many rows as one statement, like [`Table::insert_batch`], from values the
    /// caller keeps: `columns` names the columns every row supplies (by position, each once;
    /// the others get their identity value, default or NULL), and each item of `rows` holds
    /// one value per column, in that order. This is the way to ingest without building an
    /// [`InsertRow`] (and its values) per row, as a prepared statement binds its parameters:
    /// into a table whose batches go in at the tail (clustered on its identity alone, no
    /// nonclustered index, no computed column, the default insert path), values the column
    /// types hold as they are are encoded where they lie, never copied; other tables copy
    /// them into rows and take them as `insert_batch` does.
    ///
    /// The column list is checked once for the batch: an unknown column, an identity or
    /// computed column, or a column named twice fails the statement, as does a row with a
    /// different number of values.
    pub fn insert_batch_values<'v, I>(
        self: &Arc<Self>,
        session: &Session,
        columns: &[usize],
        rows: I,
    ) -> Result<Vec<Option<i64>>>
    where
        I: IntoIterator<Item = &'v [Value]>,
        I::IntoIter: ExactSizeIterator,
    {
        let slots = self.supplied_slots(columns)?;
        // The rows are counted by collecting them (a pointer each), not by the iterator's
        // `len`: `ExactSizeIterator` is a safe trait, and a `len` that lies must not make the
        // batch drop rows or index past its end. Pushed one by one, because `collect` sizes
        // its vector by the iterator's word too (and a claim of `usize::MAX` panics there).
        let mut collected: Vec<&[Value]> = Vec::new();
        for row in rows {
            collected.push(row);
        }
        let rows = collected;
        session.write(self, |scope| {
            let rows = rows
                .iter()
                .enumerate()
                .map(|(index, row)| supplied_row(columns, index + 1, row));
            // With nonclustered indexes the batch keeps every completed row until its identity
            // values are known: those rows own their values (the copying path below).
            if rows.len() > 0 && self.batches_at_tail() && self.nonclustered.is_empty() {
                let row_count = rows.len();
                self.insert_batch_at_tail(scope, row_count, |buffer, value_ends| {
                    let mut values = BorrowedRow::new();
                    for row in rows {
                        self.complete_borrowed_into(&slots, row?, &mut values)?;
                        self.encode_clustered_value(&values, buffer)?;
                        end_batch_row(buffer, value_ends, row_count);
                    }
                    Ok(Vec::new())
                })
            } else {
                let rows = rows
                    .map(|row| Ok(InsertRow::copied(columns, row?)))
                    .collect::<Result<Vec<_>>>()?;
                self.insert_batch_in(scope, rows)
            }
        })
    }

    fn insert_batch_in(
        self: &Arc<Self>,
        scope: &mut WriteScope<'_>,
        rows: Vec<InsertRow>,
    ) -> Result<Vec<Option<i64>>> {
        if !rows.is_empty() && self.batches_at_tail() {
            let row_count = rows.len();
            let keep_rows = !self.nonclustered.is_empty();
            return self.insert_batch_at_tail(scope, row_count, |buffer, value_ends| {
                let mut kept = Vec::with_capacity(if keep_rows { row_count } else { 0 });
                let mut values = Vec::with_capacity(self.columns.len());
                for row in rows {
                    self.complete_row_into(row, IdentityFill::LeaveToTree, &mut values)?;
                    self.encode_clustered_value(&values, buffer)?;
                    end_batch_row(buffer, value_ends, row_count);
                    if keep_rows {
                        let next = Vec::with_capacity(self.columns.len());
                        kept.push(std::mem::replace(&mut values, next));
                    }
                }
                Ok(kept)
            });
        }
        let mut next_identity = self.take_identity(scope, rows.len() as u64)?;
        // One buffer of values serves every row in turn: the records are what the batch keeps
        // (a failed row's values are decoded from its record for the error message). Every
        // row's clustered key and value are encoded into one shared buffer (see `RowBytes`).
        let mut identities = Vec::with_capacity(rows.len());
        let mut records: Vec<PreparedRow> = Vec::with_capacity(rows.len());
        let mut values = Vec::with_capacity(self.columns.len());
        let mut buffer = take_batch_buffer();
        let row_count = rows.len();
        for row in rows {
            let preassigned = next_identity;
            if let (Some(next), Some(identity)) = (next_identity.as_mut(), self.identity.as_ref()) {
                *next += identity.increment;
            }
            let identity = preassigned.map_or(IdentityFill::LeaveToTree, IdentityFill::Preassigned);
            identities.push(self.complete_row_into(row, identity, &mut values)?);
            let key_start = buffer.len();
            self.encode_clustered_key(&values, &mut buffer)?;
            let key_end = buffer.len();
            self.encode_clustered_value(&values, &mut buffer)?;
            let (key, value) = buffer[key_start..].split_at(key_end - key_start);
            self.check_sizes(&self.clustered, key, value)?;
            let entries = self.nonclustered_entries(&values, key)?;
            if key_start == 0 {
                reserve_for_batch(&mut buffer, row_count);
            }
            records.push((
                self.partition_of_row(&values),
                key_start..key_end,
                key_end..buffer.len(),
                entries,
            ));
        }
        let buffer = Arc::new(buffer);
        keep_batch_buffer(&buffer);
        // Fresh keys need no lock against other writers, but a batch can still fail after
        // some of its rows are in the trees (a later row or entry that finds the database
        // full), and readers must not see those rows before they are taken back.
        if scope.needs_locks(
            self.inserts_only_fresh_keys && self.visible_rows_cannot_fail(records.len()),
        ) {
            self.lock_batch(scope, &buffer, &records)?;
        }
        let sort_for_log = scope.logs_changes() && self.partition_count() > 1;
        scope.logged(self, |changes| {
            self.apply_batch(&buffer, &records)?;
            // Each partition's rows side by side, so the log writes one run per partition rather
            // than one record per row (inserts of distinct keys may be logged and undone in any
            // order). The sort is stable: rows keep their order within a partition.
            if sort_for_log {
                records.sort_by_key(|record| record.0);
            }
            for (partition, key, value, _) in records {
                changes.push(RowChange::Insert {
                    partition,
                    key: RowBytes::shared(&buffer, key),
                    value: RowBytes::shared(&buffer, value),
                });
            }
            Ok(())
        })?;
        Ok(identities)
    }

    /// The identity column's state and type, for a table clustered on its identity alone
    /// (`identity_keyed`, which implies one).
    fn identity_and_type(&self) -> (&IdentityState, DataType) {
        let identity = self
            .identity
            .as_ref()
            .expect("identity_keyed implies an identity column");
        (identity, identity.data_type)
    }

    /// Takes `count` consecutive identity values for a write through `scope` and returns the
    /// first, or `None` if the table has no identity column (see `IdentityState::take`).
    fn take_identity(&self, scope: &WriteScope<'_>, count: u64) -> Result<Option<i64>> {
        let first = self
            .identity
            .as_ref()
            .map(|identity| identity.take(count, self.reservation_log(scope)))
            .transpose()?;
        if let Some(first) = first {
            self.identity_taken_outside_lane(first, count);
        }
        Ok(first)
    }

    /// Tells the clustered tree's sequence lanes that the calling thread took `count` identity
    /// values from `first` on outside them (a batch, or a row of a table whose rows do not go
    /// through the lanes), so that the thread's next single row gets a larger value than these
    /// (see `BTree::sequence_taken_outside_lane`): one session's values keep ascending.
    fn identity_taken_outside_lane(&self, first: i64, count: u64) {
        if let Some(identity) = &self.identity
            && self.identity_keyed
            && identity.increment > 0
            && count > 0
        {
            let steps = i64::try_from(count - 1).unwrap_or(i64::MAX);
            let last = first.saturating_add(steps.saturating_mul(identity.increment));
            self.clustered.tree(0).sequence_taken_outside_lane(last);
        }
    }

    /// Whether a multi-row insert goes in at the tail with keys made there (see
    /// [`Table::insert_batch_at_tail`]): a table clustered on its identity alone, with no
    /// unique nonclustered index (its keys would have to be locked, and waited for, before
    /// the batch reaches the tail), on the default insert path.
    fn batches_at_tail(&self) -> bool {
        self.identity_keyed
            && self
                .nonclustered
                .iter()
                .all(|index| !index.def.uniqueness.is_unique())
            && self.clustered.tree(0).insert_path() == InsertPath::Default
    }

    /// A multi-row insert of `row_count` rows into a table [`Table::batches_at_tail`] says yes
    /// for. `encode_values` completes every row and encodes its clustered value into the
    /// buffer it is given, marking each row's end with [`end_batch_row`] (a row that fails its
    /// checks fails the statement before anything is inserted), and returns the completed
    /// rows if the table has nonclustered indexes (nothing otherwise); then, under the tree's
    /// tail gate, the batch takes its
    /// identity values as one block, locks their keys with one range lock (as
    /// [`Table::lock_batch`] does for other batches) and appends its rows, page after page
    /// (`BTree::insert_batch_with_generated_keys`). Taking the block at the tail is what keeps
    /// concurrent batches in order there: blocks taken beforehand reach the end of the index
    /// in any order, and every batch that arrives after a larger block splits pages in the
    /// middle (measured: leaves three quarters full, and 100 sessions inserting 100-row
    /// batches three times slower than single rows).
    fn insert_batch_at_tail(
        self: &Arc<Self>,
        scope: &mut WriteScope<'_>,
        row_count: usize,
        encode_values: impl FnOnce(&mut Vec<u8>, &mut Vec<usize>) -> Result<Vec<Row>>,
    ) -> Result<Vec<Option<i64>>> {
        let (identity, data_type) = self.identity_and_type();
        let mut buffer = take_batch_buffer();
        let mut value_ends = Vec::with_capacity(row_count);
        let mut rows = encode_values(&mut buffer, &mut value_ends)?;
        debug_assert_eq!(value_ends.len(), row_count, "one end per row");
        let buffer = Arc::new(buffer);
        keep_batch_buffer(&buffer);
        let encoded: Vec<&[u8]> = (0..row_count)
            .map(|row| &buffer[batch_item_range(&value_ends, row)])
            .collect();
        let locker = scope
            .needs_locks(self.visible_rows_cannot_fail(row_count))
            .then(|| scope.fresh_locker(self));
        let keep_changes = scope.keeps_changes();
        let reservation_log = self.reservation_log(scope);
        let tree = self.clustered.tree(0);
        let mut first_id = 0;
        let applied = scope.logged(self, |changes| {
            let mut keys = Vec::with_capacity(row_count * 9);
            let mut key_ends = Vec::with_capacity(row_count);
            let make_keys = |keys: &mut Vec<u8>, ends: &mut Vec<usize>| {
                first_id = identity.take(row_count as u64, reservation_log)?;
                self.identity_taken_outside_lane(first_id, row_count as u64);
                // `take` reserved the whole block, so no value of it overflows an i64.
                for row in 0..row_count as i64 {
                    let id = first_id + row * identity.increment;
                    encode_key_value(&data_type, &identity_as_value(id, data_type)?, keys)?;
                    ends.push(keys.len());
                }
                if let Some(locker) = &locker {
                    locker.lock_range(
                        &keys[batch_item_range(ends, 0)],
                        &keys[batch_item_range(ends, row_count - 1)],
                    )?;
                }
                Ok::<(), EngineError>(())
            };
            if let Err((inserted, error)) =
                tree.insert_batch_with_generated_keys(&encoded, make_keys, &mut keys, &mut key_ends)
            {
                let error = match error {
                    GeneratedKeyError::Key(error) => error,
                    GeneratedKeyError::Tree(error) => {
                        // The failed row's values, for the message, if its key was made.
                        let values = (inserted < key_ends.len())
                            .then(|| {
                                self.decode_record(
                                    &keys[batch_item_range(&key_ends, inserted)],
                                    encoded[inserted],
                                )
                                .ok()
                            })
                            .flatten()
                            .unwrap_or_default();
                        self.storage_error(&self.clustered, error, &values)
                    }
                };
                let rows = (0..inserted).map(|row| &keys[batch_item_range(&key_ends, row)]);
                return Err(self.take_back_keys(tree, rows, error));
            }
            if !rows.is_empty() {
                let entries = self.insert_batch_entries(&mut rows, first_id, &keys, &key_ends);
                if let Err(error) = entries {
                    let rows = (0..row_count).map(|row| &keys[batch_item_range(&key_ends, row)]);
                    return Err(self.take_back_keys(tree, rows, error));
                }
            }
            if keep_changes {
                let keys = Arc::new(keys);
                for row in 0..row_count {
                    changes.push(RowChange::Insert {
                        partition: 0,
                        key: RowBytes::shared(&keys, batch_item_range(&key_ends, row)),
                        value: RowBytes::shared(&buffer, batch_item_range(&value_ends, row)),
                    });
                }
            }
            Ok(())
        });
        if let Some(locker) = locker {
            scope.adopt_locks(locker);
        }
        applied?;
        Ok((0..row_count as i64)
            .map(|row| Some(first_id + row * identity.increment))
            .collect())
    }

    /// Inserts the nonclustered entries of a batch whose rows [`Table::insert_batch_at_tail`]
    /// appended: `rows` are the completed rows, whose identity values (from `first_id` on)
    /// and clustered keys (`keys`, ending at `key_ends`) are now known. The indexes are not
    /// unique, so no entry needs a lock: each ends in its row's fresh clustered key. Each row
    /// goes in as a single row's entries do ([`Table::nonclustered_entries`],
    /// [`Table::insert_nonclustered`], which undoes that row's entries if one is rejected); a
    /// rejected row also removes the entries of the rows before it and returns the error, and
    /// the caller removes the clustered records.
    fn insert_batch_entries(
        &self,
        rows: &mut [Row],
        first_id: i64,
        keys: &[u8],
        key_ends: &[usize],
    ) -> Result<()> {
        let (identity, data_type) = self.identity_and_type();
        let mut inserted: Vec<Vec<(Vec<u8>, Vec<u8>)>> = Vec::with_capacity(rows.len());
        for (row, values) in rows.iter_mut().enumerate() {
            // `take` reserved the whole block, so no value of it overflows.
            let id = first_id + row as i64 * identity.increment;
            let key = &keys[batch_item_range(key_ends, row)];
            let entries = identity_as_value(id, data_type).and_then(|id| {
                values[identity.column] = id;
                let entries = self.nonclustered_entries(values, key)?;
                self.insert_nonclustered(0, values, key, &entries)?;
                Ok(entries)
            });
            match entries {
                Ok(entries) => inserted.push(entries),
                Err(error) => {
                    let mut take_back = TakeBack::default();
                    for (index, (entry_key, _)) in inserted
                        .iter()
                        .rev()
                        .flat_map(|entries| self.nonclustered.iter().zip(entries))
                    {
                        take_back.delete(index.tree(0), entry_key);
                    }
                    return Err(take_back.outcome(&self.name, error));
                }
            }
        }
        Ok(())
    }

    /// Inserts a batch's prepared records: clustered index first, then each nonclustered
    /// index, each as one batch per partition. If any entry is rejected, removes everything
    /// the batch inserted and returns the error of the first row (in row order) that the first
    /// rejecting index rejected.
    fn apply_batch(&self, buffer: &[u8], records: &[PreparedRow]) -> Result<()> {
        // `done` remembers what went in (index position, partition, row), for the undo. The
        // vectors are sized up front: grown row by row, their reallocations cost as much as a
        // row's insert.
        let mut done: Vec<(usize, usize, usize)> =
            Vec::with_capacity(records.len() * (1 + self.nonclustered.len()));
        let mut members: Vec<usize> = Vec::with_capacity(records.len());
        let mut entries: Vec<(&[u8], &[u8])> = Vec::with_capacity(records.len());
        let mut failure: Option<(usize, EngineError)> = None;
        let indexes: Vec<&Index> = std::iter::once(&self.clustered)
            .chain(&self.nonclustered)
            .collect();
        let entry_of = |position: usize, row: usize| -> (&[u8], &[u8]) {
            let (_, key, value, nonclustered) = &records[row];
            if position == 0 {
                (&buffer[key.clone()], &buffer[value.clone()])
            } else {
                let (entry_key, entry_value) = &nonclustered[position - 1];
                (entry_key.as_slice(), entry_value.as_slice())
            }
        };
        for (position, index) in indexes.iter().enumerate() {
            for partition in 0..self.partition_count() {
                members.clear();
                members.extend((0..records.len()).filter(|&row| records[row].0 == partition));
                entries.clear();
                entries.extend(members.iter().map(|&row| entry_of(position, row)));
                for (&row, result) in members
                    .iter()
                    .zip(index.tree(partition).insert_batch(&entries))
                {
                    match result {
                        Ok(()) => done.push((position, partition, row)),
                        Err(error) => {
                            if failure.as_ref().is_none_or(|(first, _)| row < *first) {
                                // The batch encoded the record itself, so it decodes; should it
                                // not, that error says more than a key it cannot name.
                                let (_, key, value, _) = &records[row];
                                let error = self
                                    .decode_record(&buffer[key.clone()], &buffer[value.clone()])
                                    .map(|values| self.storage_error(index, error, &values));
                                failure = Some((row, error.unwrap_or_else(|error| error)));
                            }
                        }
                    }
                }
            }
            if failure.is_some() {
                break;
            }
        }
        if let Some((_, error)) = failure {
            let mut take_back = TakeBack::default();
            for &(position, partition, row) in done.iter().rev() {
                take_back.delete(indexes[position].tree(partition), entry_of(position, row).0);
            }
            return Err(take_back.outcome(&self.name, error));
        }
        Ok(())
    }

    /// Inserts one row: completes it, then either lets the clustered tree make the identity key
    /// under the latch of the leaf the row goes on (see [`Table::identity_keyed`]) or inserts
    /// the finished row.
    fn insert_row(
        self: &Arc<Self>,
        scope: &mut WriteScope<'_>,
        row: InsertRow,
    ) -> Result<Option<i64>> {
        if self.identity_keyed {
            return with_scratch(&ROW_SCRATCH, INSERT_SCRATCH_KEPT_BYTES, |values| {
                self.complete_row_into(row, IdentityFill::LeaveToTree, values)?;
                if scope.needs_locks(self.inserts_only_fresh_keys) {
                    self.lock_unique_entries_without_identity(scope, values)?;
                }
                self.insert_with_identity_key(scope, values).map(Some)
            });
        }
        let taken = self.take_identity(scope, 1)?;
        let fill = taken.map_or(IdentityFill::LeaveToTree, IdentityFill::Preassigned);
        let (values, identity) = self.complete_row(row, fill)?;
        let key = self.clustered_key(&values)?;
        let value = self.clustered_value(&values)?;
        self.check_sizes(&self.clustered, &key, &value)?;
        let entries = self.nonclustered_entries(&values, &key)?;
        // The row's nonclustered entries go in after its record and may still fail (a full
        // database), taking the record out again: then readers must not have seen it.
        if scope.needs_locks(self.inserts_only_fresh_keys && self.visible_rows_cannot_fail(1)) {
            self.lock_entries(scope, &key, &entries)?;
        }
        let partition = self.partition_of_row(&values);
        scope.logged(self, |changes| {
            self.insert_prepared(partition, &values, &key, &value, &entries)?;
            changes.push(RowChange::Insert {
                partition,
                key: key.into(),
                value: value.into(),
            });
            Ok(())
        })?;
        Ok(identity)
    }

    /// Locks the keys of a row's unique nonclustered entries that do not contain the identity
    /// value, for an insert whose identity the tree makes (see [`Table::identity_keyed`]):
    /// those keys do not depend on it, so they are locked before the row goes in, as
    /// [`Table::lock_unique_entries`] locks them on the other paths (the keys with the identity
    /// are fresh and need no lock).
    fn lock_unique_entries_without_identity(
        &self,
        scope: &mut WriteScope<'_>,
        values: &[Value],
    ) -> Result<()> {
        let (identity, _) = self.identity_and_type();
        for (position, index) in self.nonclustered.iter().enumerate() {
            if index.unique_without(identity.column) {
                // The entry's key as `nonclustered_entry` makes it: a unique entry's key is its
                // columns alone.
                let mut key = Vec::with_capacity(32);
                index.encode_columns(values, &mut key)?;
                scope.lock_row(self, position + 1, &key)?;
            }
        }
        Ok(())
    }

    /// Whether a statement inserting `rows` rows of fresh identity keys can no longer fail
    /// once any of its rows is in the clustered tree, so that it may leave them unlocked where a
    /// fresh key otherwise needs no lock (an in-memory database's autocommit statement; see
    /// `WriteScope::needs_locks`): a reader would otherwise return a row that never commits.
    /// True only for a single row without nonclustered indexes, whose record is the last
    /// thing the statement puts in. A nonclustered entry made afterwards can still fail (a
    /// duplicate unique key, a full database) and take the row out again. So can a later row
    /// of a batch: its rows go in one after another and become visible as they go, and a row
    /// that needs a page the database cannot give (`DatabaseOptions::max_pages`, in memory
    /// too) fails the statement, whose rows are then taken back. Readers returned such rows
    /// when batches were left unlocked
    /// (`read_committed_tail.rs::readers_never_see_rows_of_a_batch_that_fails_when_the_database_is_full`).
    fn visible_rows_cannot_fail(&self, rows: usize) -> bool {
        rows == 1 && self.nonclustered.is_empty()
    }

    /// Whether the clustered key is the identity column alone: then a batch's rows, which take
    /// one block of identity values, are every key between its lowest and its highest.
    fn key_is_identity(&self) -> bool {
        self.identity
            .as_ref()
            .is_some_and(|identity| self.clustered.column_ids == [identity.column])
    }

    /// Locks a batch's new rows. When the clustered key is the identity alone, the batch's keys
    /// are fresh and contiguous, so one range lock from the lowest to the highest stands for a
    /// row lock each (it costs as much as one; a lock per row cost a fifth of a durable batch's
    /// time); unique nonclustered keys are locked row by row as always.
    fn lock_batch(
        &self,
        scope: &mut WriteScope<'_>,
        buffer: &[u8],
        records: &[PreparedRow],
    ) -> Result<()> {
        let (Some(first), true) = (records.first(), self.key_is_identity()) else {
            for (_, key, _, entries) in records {
                self.lock_entries(scope, &buffer[key.clone()], entries)?;
            }
            return Ok(());
        };
        let (mut low, mut high) = (&buffer[first.1.clone()], &buffer[first.1.clone()]);
        for (_, key, _, _) in &records[1..] {
            let key = &buffer[key.clone()];
            if key < low {
                low = key;
            } else if key > high {
                high = key;
            }
        }
        scope.lock_range(self, low, high)?;
        for (_, _, _, entries) in records {
            self.lock_unique_entries(scope, entries)?;
        }
        Ok(())
    }

    /// Locks a new row's clustered key and its unique nonclustered keys (so that a key a
    /// transaction deleted cannot be taken by another before the first one commits).
    fn lock_entries(
        &self,
        scope: &mut WriteScope<'_>,
        key: &[u8],
        entries: &[(Vec<u8>, Vec<u8>)],
    ) -> Result<()> {
        scope.lock_row(self, 0, key)?;
        self.lock_unique_entries(scope, entries)
    }

    /// Locks a new row's unique nonclustered keys.
    fn lock_unique_entries(
        &self,
        scope: &mut WriteScope<'_>,
        entries: &[(Vec<u8>, Vec<u8>)],
    ) -> Result<()> {
        for (position, (index, (entry_key, _))) in self.nonclustered.iter().zip(entries).enumerate()
        {
            if index.def.uniqueness.is_unique() {
                scope.lock_row(self, position + 1, entry_key)?;
            }
        }
        Ok(())
    }

    /// Locks a stored row: its clustered key, then the unique nonclustered keys its value gives
    /// it ([`Table::row_lock_keys`]).
    fn lock_row_entries(&self, scope: &mut WriteScope<'_>, key: &[u8], value: &[u8]) -> Result<()> {
        self.row_lock_keys(key, value)?
            .into_iter()
            .try_for_each(|lock| scope.lock(lock))
    }

    /// The lock resources of a stored row, in the order they are locked: its clustered key, then
    /// the keys of its unique nonclustered indexes' entries.
    fn row_lock_keys(&self, key: &[u8], value: &[u8]) -> Result<SmallVec<[LockKey; 2]>> {
        let mut locks = SmallVec::new();
        locks.push(crate::txn::lock_key(self.id, 0, key));
        if self
            .nonclustered
            .iter()
            .any(|index| index.def.uniqueness.is_unique())
        {
            let row = self.decode_record(key, value)?;
            let entries = self.nonclustered_entries(&row, key)?;
            for (position, (index, (entry_key, _))) in
                self.nonclustered.iter().zip(&entries).enumerate()
            {
                if index.def.uniqueness.is_unique() {
                    locks.push(crate::txn::lock_key(self.id, position + 1, entry_key));
                }
            }
        }
        Ok(locks)
    }

    /// Fills in identity (as `identity` says), defaults and computed columns, converts every
    /// value to its column's type and checks nullability.
    fn complete_row(&self, row: InsertRow, identity: IdentityFill) -> Result<(Row, Option<i64>)> {
        let mut values = Vec::with_capacity(self.columns.len());
        let identity = self.complete_row_into(row, identity, &mut values)?;
        Ok((values, identity))
    }

    /// [`Table::complete_row`] into `values` (cleared first), returning the identity value.
    /// Inlined into both callers: through a reference the single-row path's pushes cost more.
    #[inline(always)]
    fn complete_row_into(
        &self,
        row: InsertRow,
        identity: IdentityFill,
        values: &mut Row,
    ) -> Result<Option<i64>> {
        values.clear();
        for &(column, _) in &row.values {
            self.check_supplied_column(column)?;
        }
        let mut identity_value = None;
        let mut fill = |position: usize, supplied: Option<Value>| -> Result<Value> {
            let definition = &self.columns[position];
            Ok(match supplied {
                Some(value) => value,
                None => match (&self.identity, &definition.default) {
                    (Some(state), _) if state.column == position => {
                        let value = match identity {
                            IdentityFill::LeaveToTree => None,
                            IdentityFill::Preassigned(value) => Some(value),
                        };
                        identity_value = value;
                        match value {
                            Some(value) => identity_as_value(value, definition.data_type)?,
                            None => Value::Null,
                        }
                    }
                    (_, Some(default)) => self.evaluate_default(&definition.name, default)?,
                    _ => Value::Null,
                },
            })
        };
        if row.values.is_sorted_by(|a, b| a.0 < b.0) {
            // The usual case (columns supplied in table order, each once): merge the supplied
            // values in without a per-row table of them.
            let mut supplied = row.values.into_iter().peekable();
            for position in 0..self.columns.len() {
                let value = supplied.next_if(|&(column, _)| column == position);
                values.push(fill(position, value.map(|(_, value)| value))?);
            }
        } else {
            // Any order, and a column supplied twice keeps its last value.
            let mut supplied: Vec<Option<Value>> = vec![None; self.columns.len()];
            for (column, value) in row.values {
                supplied[column] = Some(value);
            }
            for (position, value) in supplied.into_iter().enumerate() {
                values.push(fill(position, value)?);
            }
        }
        let deferred = self
            .identity
            .as_ref()
            .filter(|_| identity == IdentityFill::LeaveToTree)
            .map(|state| state.column);
        self.finish_row(values, deferred)?;
        Ok(identity_value)
    }

    /// Fails unless an insert may supply a value for the column at `column`: it exists, and it
    /// is neither an identity nor a computed column.
    #[inline]
    fn check_supplied_column(&self, column: usize) -> Result<()> {
        let Some(definition) = self.columns.get(column) else {
            return Err(EngineError::UnknownColumn {
                table: self.name.clone(),
                column: format!("#{column}"),
            });
        };
        if definition.identity.is_some() {
            return Err(EngineError::ExplicitIdentity {
                table: self.name.clone(),
            });
        }
        if definition.computed.is_some() {
            return Err(EngineError::ComputedColumn {
                column: definition.name.clone(),
            });
        }
        Ok(())
    }

    /// Checks the column list of [`Table::insert_batch_values`] and returns, for each of the
    /// table's columns, where its value lies in a supplied row, if it is supplied.
    fn supplied_slots(&self, columns: &[usize]) -> Result<Vec<Option<usize>>> {
        let mut slots = vec![None; self.columns.len()];
        for (slot, &column) in columns.iter().enumerate() {
            self.check_supplied_column(column)?;
            if slots[column].replace(slot).is_some() {
                return Err(EngineError::DuplicateInsertColumn {
                    column: self.columns[column].name.clone(),
                });
            }
        }
        Ok(slots)
    }

    /// [`Table::complete_row_into`] for a row of borrowed values (`row[slot]` for each column
    /// `slots` marks supplied) into a table without computed columns whose identity the tree
    /// fills in ([`IdentityFill::LeaveToTree`]): a value its column's type holds as it is
    /// stays borrowed.
    fn complete_borrowed_into<'v>(
        &self,
        slots: &[Option<usize>],
        row: &'v [Value],
        values: &mut BorrowedRow<'v>,
    ) -> Result<()> {
        debug_assert!(self.computed_columns.is_empty());
        values.clear();
        let identity_column = self.identity.as_ref().map(|state| state.column);
        for (position, slot) in slots.iter().enumerate() {
            let value = match (slot, &self.columns[position].default) {
                (Some(slot), _) => Cow::Borrowed(&row[*slot]),
                // Left NULL for the tree to fill in, and not checked: it is not NULL then.
                (None, _) if identity_column == Some(position) => {
                    values.push(Cow::Owned(Value::Null));
                    continue;
                }
                (None, Some(default)) => {
                    Cow::Owned(self.evaluate_default(&self.columns[position].name, default)?)
                }
                (None, None) => Cow::Owned(Value::Null),
            };
            values.push(self.coerce_column(position, value)?);
        }
        Ok(())
    }

    /// Converts `value` to the type of the column at `position` (a borrowed value the type
    /// holds as it is stays borrowed) and checks it against the column's nullability, as
    /// [`Table::finish_row`] does for owned values.
    fn coerce_column<'v>(&self, position: usize, value: Cow<'v, Value>) -> Result<Cow<'v, Value>> {
        let definition = &self.columns[position];
        let converted = definition
            .data_type
            .coerce_cow(value)
            .map_err(|error| error.with_column(&definition.name))?;
        self.check_nullable(definition, &converted)?;
        Ok(converted)
    }

    /// Fails if `value` (converted to `definition`'s type) is NULL and the column is NOT NULL.
    fn check_nullable(&self, definition: &ColumnDef, value: &Value) -> Result<()> {
        if value.is_null() && !definition.nullable {
            return Err(EngineError::NullNotAllowed {
                table: self.name.clone(),
                column: definition.name.clone(),
                statement: "INSERT",
            });
        }
        Ok(())
    }

    /// The value of column `column`'s default.
    fn evaluate_default(&self, column: &str, default: &DefaultValue) -> Result<Value> {
        Ok(match default {
            DefaultValue::Constant(value) => value.clone(),
            DefaultValue::CurrentUtcDateTime => Value::DateTime2(DateTime2::now_utc()),
            DefaultValue::NewId => Value::Uuid(Uuid::new_v4()),
            DefaultValue::Function(function) => self.call_supplied(column, || function())?,
        })
    }

    /// Calls a function the caller supplied for column `column` (a computed column's expression
    /// or a function default), turning a panic into [`EngineError::FunctionPanicked`]: the
    /// statement then fails and is undone like any failed statement. Unwinding through the
    /// engine instead left the statement's row locks held for ever (its transaction was dropped
    /// without ending), so every later reader and writer of those rows waited for ever, and in
    /// an explicit transaction the half-run statement stayed applied.
    fn call_supplied<T>(&self, column: &str, function: impl FnOnce() -> Result<T>) -> Result<T> {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(function)).unwrap_or_else(|panic| {
            let message = panic
                .downcast_ref::<&str>()
                .map(|text| (*text).to_owned())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "(no message)".to_owned());
            Err(EngineError::FunctionPanicked {
                table: self.name.clone(),
                column: column.to_owned(),
                message,
            })
        })
    }

    /// Evaluates computed columns, converts values to their column types and checks NULLs
    /// (except in `deferred_identity`, which is filled in later).
    fn finish_row(&self, values: &mut [Value], deferred_identity: Option<usize>) -> Result<()> {
        for &(column, _) in &self.computed_columns {
            values[column] = Value::Null;
        }
        for (column, evaluator) in &self.computed_columns {
            values[*column] = match evaluator {
                Evaluator::Expression(expression) => expression.evaluate(values)?,
                Evaluator::Function(function) => {
                    let name = &self.columns[*column].name;
                    self.call_supplied(name, || function(values))?
                }
            };
        }
        // Owned values go straight through `coerce`: through `coerce_column`'s `Cow` the
        // single-row insert cost 4% more instructions.
        for (position, (definition, value)) in
            self.columns.iter().zip(values.iter_mut()).enumerate()
        {
            if deferred_identity == Some(position) {
                continue;
            }
            let converted = definition
                .data_type
                .coerce(std::mem::replace(value, Value::Null))
                .map_err(|error| error.with_column(&definition.name))?;
            self.check_nullable(definition, &converted)?;
            *value = converted;
        }
        Ok(())
    }

    /// Encodes the clustered key of a complete row, with a fresh uniquifier if the index needs
    /// one.
    fn clustered_key(&self, values: &[Value]) -> Result<Vec<u8>> {
        let mut key = Vec::with_capacity(32);
        self.encode_clustered_key(values, &mut key)?;
        Ok(key)
    }

    /// [`Table::clustered_key`] appended to `out`.
    fn encode_clustered_key(&self, values: &[Value], out: &mut Vec<u8>) -> Result<()> {
        self.clustered.encode_columns(values, out)?;
        if let Some(uniquifiers) = &self.clustered.uniquifiers {
            let value = uniquifiers.take().ok_or_else(|| {
                EngineError::Storage(format!(
                    "table '{}': the uniquifiers of its non-unique clustered index are used up \
                     (all 2^24 blocks of 2^40 values are handed out or lie below a value its \
                     rows hold)",
                    self.name
                ))
            })?;
            out.extend_from_slice(&value.to_be_bytes());
        }
        Ok(())
    }

    /// Encodes the clustered record's value: the columns `value_columns` names.
    fn clustered_value(&self, values: &[Value]) -> Result<Vec<u8>> {
        let mut value = Vec::new();
        self.encode_clustered_value(values, &mut value)?;
        Ok(value)
    }

    /// [`Table::clustered_value`] appended to `out`.
    fn encode_clustered_value<V: Borrow<Value>>(
        &self,
        values: &[V],
        out: &mut Vec<u8>,
    ) -> Result<()> {
        if let Some(stored) = self.value_columns_range.clone() {
            // The usual shape (key columns first): the stored columns are one slice of the row,
            // encoded where they are.
            encode_row(&self.value_types, &values[stored], out)?;
        } else {
            let stored: Vec<&Value> = self
                .value_columns
                .iter()
                .map(|&column| values[column].borrow())
                .collect();
            encode_row(&self.value_types, &stored, out)?;
        }
        Ok(())
    }

    /// The key and value of `index`'s entry for a row whose clustered key is `locator`.
    fn nonclustered_entry(
        &self,
        index: &Index,
        values: &[Value],
        locator: &[u8],
    ) -> Result<(Vec<u8>, Vec<u8>)> {
        let mut key = Vec::with_capacity(32 + locator.len());
        index.encode_columns(values, &mut key)?;
        if index.def.uniqueness.is_unique() {
            Ok((key, locator.to_vec()))
        } else {
            key.extend_from_slice(locator);
            Ok((key, Vec::new()))
        }
    }

    fn check_sizes(&self, index: &Index, key: &[u8], value: &[u8]) -> Result<()> {
        match lastpage_storage::btree::check_record_size(key, value) {
            Ok(()) => Ok(()),
            Err(BTreeError::KeyTooLarge { len, max }) => Err(EngineError::KeyTooLarge {
                index: index.def.name.clone(),
                size: len,
                max,
            }),
            Err(BTreeError::RecordTooLarge { len, .. }) => Err(EngineError::RowTooLarge {
                size: len,
                max: MAX_RECORD_BYTES,
            }),
            Err(other) => Err(self.storage_error(index, other, &[])),
        }
    }

    fn storage_error(&self, index: &Index, error: BTreeError, values: &[Value]) -> EngineError {
        match error {
            BTreeError::DuplicateKey => {
                let key = index.describe_key(values);
                match index.def.uniqueness {
                    Uniqueness::PrimaryKey | Uniqueness::UniqueConstraint => {
                        EngineError::DuplicateKey {
                            constraint_kind: if index.def.uniqueness == Uniqueness::PrimaryKey {
                                "PRIMARY KEY"
                            } else {
                                "UNIQUE KEY"
                            },
                            constraint: index.def.name.clone(),
                            table: self.name.clone(),
                            key,
                        }
                    }
                    Uniqueness::UniqueIndex | Uniqueness::NonUnique => {
                        EngineError::DuplicateIndexKey {
                            index: index.def.name.clone(),
                            table: self.name.clone(),
                            key,
                        }
                    }
                }
            }
            BTreeError::KeyTooLarge { len, max } => EngineError::KeyTooLarge {
                index: index.def.name.clone(),
                size: len,
                max,
            },
            BTreeError::RecordTooLarge { len, max } => EngineError::RowTooLarge { size: len, max },
            BTreeError::PoolFull(full) => EngineError::PoolFull(full),
            BTreeError::Storage(error) => EngineError::Storage(error.to_string()),
            invalid @ BTreeError::InvalidBatch(_) => EngineError::Storage(invalid.to_string()),
        }
    }

    /// Inserts a prepared row into every index, undoing what it did if any index rejects it.
    fn insert_prepared(
        &self,
        partition: usize,
        values: &[Value],
        key: &[u8],
        value: &[u8],
        entries: &[(Vec<u8>, Vec<u8>)],
    ) -> Result<()> {
        self.clustered
            .tree(partition)
            .insert(key, value)
            .map_err(|error| self.storage_error(&self.clustered, error, values))?;
        self.insert_nonclustered(partition, values, key, entries)
    }

    /// Inserts a row whose clustered key is its identity column alone: the clustered tree calls
    /// back for the key while it holds the leaf the row goes on (the thread's sequence lane's
    /// leaf for INT and BIGINT identities, see the storage crate's `btree/lanes.rs`; the last
    /// leaf otherwise), so every insert goes at the end of its leaf's keys, and keys ascend per
    /// session (across sessions too on the last leaf). Returns the identity value.
    ///
    /// When the row needs a lock, the callback takes it too, before the leaf's latch is
    /// released: from the moment a reader can see the row, the lock hides it until commit. The
    /// lock cannot wait, as nobody else can know the new key yet.
    fn insert_with_identity_key<R: CompletedRow>(
        self: &Arc<Self>,
        scope: &mut WriteScope<'_>,
        values: &mut R,
    ) -> Result<i64> {
        with_scratch(&VALUE_SCRATCH, INSERT_SCRATCH_KEPT_BYTES, |value| {
            self.encode_clustered_value(values.values(), value)?;
            self.insert_encoded_with_identity_key(scope, values, value)
        })
    }

    /// [`Table::insert_with_identity_key`] once the row's value is encoded in `value`. The
    /// value is moved into the statement's change only if the change is kept (logged or
    /// undoable); otherwise the buffer goes back to its thread for the next insert.
    fn insert_encoded_with_identity_key<R: CompletedRow>(
        self: &Arc<Self>,
        scope: &mut WriteScope<'_>,
        values: &mut R,
        value: &mut Vec<u8>,
    ) -> Result<i64> {
        let (identity, data_type) = self.identity_and_type();
        let keep_change = scope.keeps_changes();
        let locker = scope
            .needs_locks(self.visible_rows_cannot_fail(1))
            .then(|| scope.fresh_locker(self));
        let reservation_log = self.reservation_log(scope);
        let id = scope.logged(self, |changes| {
            with_scratch(&KEY_SCRATCH, INSERT_SCRATCH_KEPT_BYTES, |key| {
                let make_key = |id: i64, key: &mut Vec<u8>| {
                    encode_key_value(&data_type, &identity_as_value(id, data_type)?, key)?;
                    if let Some(locker) = &locker {
                        locker.lock(key)?;
                    }
                    Ok::<(), EngineError>(())
                };
                // INT and BIGINT identities take their values in blocks, one per sequence lane
                // (see the storage crate's `btree/lanes.rs`): ascending per session, spread over
                // several leaves. Narrower types, and increments so large that a few blocks would
                // use up the type's range, take one value at a time (SQL Server's IDENTITY cache
                // is small for narrow types for the same reason).
                let lanes = matches!(data_type, DataType::Int | DataType::BigInt)
                    && identity.increment <= LANE_IDENTITY_MAX_INCREMENT;
                let step = if lanes { identity.increment } else { 0 };
                let mut make_key = make_key;
                let mut insert = |step: i64, key: &mut Vec<u8>| {
                    self.clustered.tree(0).insert_with_sequence_key(
                        value,
                        step,
                        |rows| identity.take(rows, reservation_log),
                        &mut make_key,
                        key,
                    )
                };
                let mut inserted = insert(step, key);
                // A lane reserves a whole block of values (up to a page's worth of rows) at
                // once, which fails with an overflow within a block's width of the end of
                // BIGINT's range although values are left: every single-row insert there
                // failed. The failed reservation took no value and inserted nothing (the lane
                // is left without a block), so the row takes one value the way narrower types
                // do; should that overflow too, the range is used up.
                if step > 0
                    && matches!(
                        inserted,
                        Err(GeneratedKeyError::Key(EngineError::IdentityOverflow { .. }))
                    )
                {
                    inserted = insert(0, key);
                }
                let id = inserted.map_err(|error| match error {
                    GeneratedKeyError::Key(error) => error,
                    GeneratedKeyError::Tree(error) => {
                        self.storage_error(&self.clustered, error, &values.owned_copy())
                    }
                })?;
                // The record is in: anything that fails from here takes it back.
                let take_back =
                    |error| self.take_back_keys(self.clustered.tree(0), [&key[..]], error);
                if let Some(values) = values.owned() {
                    values[identity.column] =
                        identity_as_value(id, data_type).map_err(take_back)?;
                    self.insert_nonclustered_with_identity_key(values, key)?;
                } else if !self.nonclustered.is_empty() {
                    // Not reached: `PreparedInsert` borrows values only for tables without
                    // nonclustered indexes. Should that change, the row must not go in
                    // without its entries.
                    return Err(take_back(EngineError::Storage(
                        "a row of borrowed values cannot feed nonclustered indexes".into(),
                    )));
                }
                if keep_change {
                    changes.push(RowChange::Insert {
                        partition: 0,
                        key: std::mem::take(key).into(),
                        value: std::mem::take(value).into(),
                    });
                }
                Ok(id)
            })
        });
        if let Some(locker) = locker {
            scope.adopt_locks(locker);
        }
        id
    }

    /// The nonclustered entries of a row the clustered tree has just given its identity key
    /// `key` (see [`Table::insert_encoded_with_identity_key`]); if they cannot be made, the
    /// clustered record goes again.
    fn insert_nonclustered_with_identity_key(&self, values: &Row, key: &[u8]) -> Result<()> {
        if self.nonclustered.is_empty() {
            return Ok(());
        }
        let entries = match self.nonclustered_entries(values, key) {
            Ok(entries) => entries,
            Err(error) => return Err(self.take_back_keys(self.clustered.tree(0), [key], error)),
        };
        self.insert_nonclustered(0, values, key, &entries)
    }

    /// Takes `keys` out of `tree` again after a statement failed with `error` part way, and
    /// returns the statement's error (see [`TakeBack`]).
    fn take_back_keys<'k>(
        &self,
        tree: &BTree,
        keys: impl IntoIterator<Item = &'k [u8]>,
        error: EngineError,
    ) -> EngineError {
        let mut take_back = TakeBack::default();
        for key in keys {
            take_back.delete(tree, key);
        }
        take_back.outcome(&self.name, error)
    }

    /// The nonclustered entries of a row whose clustered key is `key`, size-checked.
    fn nonclustered_entries(
        &self,
        values: &[Value],
        key: &[u8],
    ) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        let mut entries = Vec::with_capacity(self.nonclustered.len());
        for index in &self.nonclustered {
            let (nc_key, nc_value) = self.nonclustered_entry(index, values, key)?;
            self.check_sizes(index, &nc_key, &nc_value)?;
            entries.push((nc_key, nc_value));
        }
        Ok(entries)
    }

    /// Inserts a row's nonclustered entries after its clustered record `key`; if an index
    /// rejects its entry, removes what was inserted, the clustered record included.
    fn insert_nonclustered(
        &self,
        partition: usize,
        values: &[Value],
        key: &[u8],
        entries: &[(Vec<u8>, Vec<u8>)],
    ) -> Result<()> {
        for (position, (index, (nc_key, nc_value))) in
            self.nonclustered.iter().zip(entries).enumerate()
        {
            if let Err(error) = index.tree(partition).insert(nc_key, nc_value) {
                let mut take_back = TakeBack::default();
                for (earlier, (earlier_key, _)) in
                    self.nonclustered.iter().zip(entries).take(position)
                {
                    take_back.delete(earlier.tree(partition), earlier_key);
                }
                take_back.delete(self.clustered.tree(partition), key);
                return Err(take_back.outcome(&self.name, self.storage_error(index, error, values)));
            }
        }
        Ok(())
    }

    /// Converts and encodes a (prefix of a) key of `index`, or returns `None` if a value is
    /// longer than any value of its column's kind, outside its column's range (a bigint
    /// looked up in an int column) or a number or instant its column cannot hold exactly (1.5
    /// in an int column, noon in a date column), so no stored key can equal it (SQL Server finds no row then, rather than
    /// failing or rounding).
    fn encode_lookup_key(&self, index: &Index, key: &[Value]) -> Result<Option<Vec<u8>>> {
        match self.encode_search_key(index, key) {
            Ok(SearchKey::Encoded(encoded)) => Ok(Some(encoded)),
            Ok(SearchKey::OutOfRange { .. } | SearchKey::Beside { .. }) => Ok(None),
            Err(EngineError::Value(error)) if error.kind() == ValueErrorKind::Truncation => {
                Ok(None)
            }
            Err(error) => Err(error),
        }
    }

    /// Converts and encodes a (prefix of a) key of `index`. A number or instant outside its
    /// column's range is not an error but [`SearchKey::OutOfRange`], and one the column cannot
    /// hold exactly is not rounded but [`SearchKey::Beside`] (see [`ExactValue`]): either
    /// still compares with the rows, as SQL Server compares it.
    fn encode_search_key(&self, index: &Index, key: &[Value]) -> Result<SearchKey> {
        if key.len() > index.types.len() {
            return Err(EngineError::KeyArity {
                index: index.def.name.clone(),
                expected: index.types.len(),
                got: key.len(),
            });
        }
        let mut encoded = Vec::with_capacity(32);
        for ((value, data_type), &column) in key.iter().zip(&index.types).zip(&index.column_ids) {
            // A number, date or uniqueidentifier has a higher precedence than text, so SQL Server
            // compares it with a text column by converting the column (every row, failing on
            // text that does not convert), which no index on the text can answer. Converting
            // the value to text instead compared text ('05' missed 5, '10' sorted below it):
            // refused, with the way out in the message.
            if data_type.is_text()
                && !matches!(value, Value::Null | Value::String(_) | Value::Binary(_))
            {
                return Err(EngineError::Value(
                    ValueError::conversion(format!(
                        "cannot search the {} column '{}' for a {} value: SQL Server compares \
                         them by converting the column's text (the type of lower precedence) \
                         row by row, which no index on it can do; pass the value as text",
                        data_type.name(),
                        self.columns[column].name,
                        value.data_type_name(),
                    ))
                    .with_column(&self.columns[column].name),
                ));
            }
            // A number or an instant compares exactly, as SQL Server compares it (in the type
            // of higher precedence): 1.5 equals no INT, and lies between the keys 1 and 2,
            // where converting it would have rounded it onto one.
            let exact = ExactValue::of(data_type, value);
            // BIT converts every nonzero number to 1 rather than to the nearest bit, so a number
            // it cannot hold is placed here: below 0, between 0 and 1, or above 1.
            if *data_type == DataType::Bit
                && let Some(ExactValue::Number(number)) = exact
            {
                let one = Decimal::from(1i64);
                if number < Decimal::ZERO || number > one {
                    return Ok(SearchKey::OutOfRange {
                        prefix: encoded,
                        above: number > one,
                    });
                }
                if number > Decimal::ZERO && number < one {
                    encode_key_value(data_type, &Value::Bit(false), &mut encoded)?;
                    return Ok(SearchKey::Beside {
                        key: encoded,
                        above: true,
                    });
                }
            }
            let (converted, encoding_type) = match data_type.coerce(value.clone()) {
                Ok(converted) => match exact.and_then(|exact| exact.cmp_converted(&converted)) {
                    Some(order @ (std::cmp::Ordering::Less | std::cmp::Ordering::Greater)) => {
                        encode_key_value(data_type, &converted, &mut encoded)?;
                        return Ok(SearchKey::Beside {
                            key: encoded,
                            above: order == std::cmp::Ordering::Greater,
                        });
                    }
                    _ => (Ok(converted), *data_type),
                },
                // A search value longer than its column equals no row but still sorts among
                // them ('abcd' between 'abc' and 'abd' of a varchar(3) key), as SQL Server
                // compares it: the key encoding of text and binary does not depend on the
                // declared length, so it is encoded as the widest type of its kind. One longer
                // than that still fails (a lookup finds no row, a range bound is an error).
                Err(error) if error.kind() == ValueErrorKind::Truncation => {
                    match widest_of_kind(data_type) {
                        Some(widest) => (widest.coerce(value.clone()), widest),
                        None => (Err(error), *data_type),
                    }
                }
                // A number or instant beyond its column's range sorts above (or below) every
                // value of the column, whatever follows it in the key.
                Err(error) if error.kind() == ValueErrorKind::Overflow && exact.is_some() => {
                    return Ok(SearchKey::OutOfRange {
                        prefix: encoded,
                        above: exact.is_some_and(ExactValue::is_positive),
                    });
                }
                Err(error) => (Err(error), *data_type),
            };
            let converted =
                converted.map_err(|error| error.with_column(&self.columns[column].name))?;
            encode_key_value(&encoding_type, &converted, &mut encoded)?;
        }
        Ok(SearchKey::Encoded(encoded))
    }

    /// Whether a search key names exactly one record of the clustered index.
    fn is_exact_clustered_key(&self, key: &[Value]) -> bool {
        key.len() == self.clustered.types.len() && self.clustered.uniquifiers.is_none()
    }

    /// Rebuilds a row from a clustered record.
    fn decode_record(&self, key: &[u8], value: &[u8]) -> Result<Row> {
        let (key_values, _) = decode_key(&self.clustered.types, key)?;
        let stored = decode_row(&self.value_types, value)?;
        let mut row = vec![Value::Null; self.columns.len()];
        for (&column, value) in self.clustered.column_ids.iter().zip(key_values) {
            row[column] = value;
        }
        for (&column, value) in self.value_columns.iter().zip(stored) {
            row[column] = value;
        }
        Ok(row)
    }

    /// Finds the clustered record for a search key: exact for a unique key, the first match
    /// for a prefix or a non-unique key. Returns the record's partition, key and value.
    fn find_record(&self, key: &[Value]) -> Result<Option<FoundRecord>> {
        let Some(encoded) = self.encode_lookup_key(&self.clustered, key)? else {
            return Ok(None);
        };
        let partitions = match self.partition_of_key(key)? {
            Some(partition) => partition..partition + 1,
            None => 0..self.partition_count(),
        };
        let upper = prefix_end(&encoded);
        let mut first: Option<FoundRecord> = None;
        for partition in partitions {
            let tree = self.clustered.tree(partition);
            let found = if self.is_exact_clustered_key(key) {
                tree.get(&encoded)
                    .map_err(storage_failure)?
                    .map(|value| (encoded.clone(), value))
            } else {
                let upper = upper.as_deref().map_or(Bound::Unbounded, Bound::Excluded);
                let mut range = tree.range(Bound::Included(&encoded), upper, Direction::Forward);
                let first = range.next();
                if let Some(error) = range.take_error() {
                    return Err(storage_failure(error));
                }
                first
            };
            if let Some((found_key, value)) = found
                && first.as_ref().is_none_or(|(_, best, _)| found_key < *best)
            {
                first = Some((partition, found_key, value));
            }
        }
        Ok(first)
    }

    /// [`Table::find_record`] for READ COMMITTED: a row that a transaction other than `me`
    /// deleted and has not ended, lying where it would have been found, is waited for (LCK_M_S)
    /// and the lookup made again, so that a miss, or a first match, is a committed one (see
    /// `pending.rs`). Also returns the database's count of ended writes read before the tree
    /// read that found the record, for [`Table::committed_value`].
    fn find_record_waiting(
        &self,
        session: &Session,
        me: Option<TxnId>,
        key: &[Value],
    ) -> Result<(Option<FoundRecord>, u64)> {
        let db = session.db();
        let read = || {
            let ended_writes = db.ended_writes();
            Ok((self.find_record(key)?, ended_writes))
        };
        // A deleted row where the read found nothing: from the search key up to the match, or
        // to the search's end.
        let missed = |held: &HeldPendingDeletes<'_>, (found, _): &(Option<FoundRecord>, u64)| {
            let Some(encoded) = self.encode_lookup_key(&self.clustered, key)? else {
                return Ok(None);
            };
            let exact = self.is_exact_clustered_key(key);
            let search_end = if exact { None } else { prefix_end(&encoded) };
            let upper = match (found, &search_end) {
                (Some((_, found_key, _)), _) => Bound::Excluded(found_key.as_slice()),
                (None, _) if exact => Bound::Included(encoded.as_slice()),
                (None, Some(end)) => Bound::Excluded(end.as_slice()),
                (None, None) => Bound::Unbounded,
            };
            Ok(held.first_of_others(me, Bound::Included(&encoded), upper))
        };
        self.read_waiting_for_deleters(session, me, read, missed)
    }

    /// Runs a read under the READ COMMITTED protocol of `pending.rs`. The read (`read`) is
    /// accepted if the table's set of deleted rows was quiet meanwhile; otherwise the set is
    /// held still, the read is made again unless nothing was noted or cleared since it began,
    /// and `missed` names a row that a transaction other than `me` deleted and has not ended,
    /// which that read would have found. Its deleter is waited for, and everything starts
    /// again.
    fn read_waiting_for_deleters<T>(
        &self,
        session: &Session,
        me: Option<TxnId>,
        read: impl Fn() -> Result<T>,
        missed: impl Fn(&HeldPendingDeletes<'_>, &T) -> Result<Option<(Vec<u8>, TxnId)>>,
    ) -> Result<T> {
        let mut waited_for = None;
        loop {
            let version = self.pending_deletes.version();
            let result = read()?;
            if self.pending_deletes.quiet_since(version) {
                return Ok(result);
            }
            let held = self.pending_deletes.hold();
            // Every note and clear moves the version on under the set's lock, which is held
            // now: if the version is the one read before the read began, the set did not change
            // during the read, and the read saw it as it is held, as a read made now would. Then
            // the read stands, as a scan's rows read ahead do (`RowIter::deleted_in_gap`). This
            // saves a second descent whenever rows of the table are noted, which is every
            // statement of a transaction that deletes many rows, and every read of the table
            // while it is open.
            let result = if self.pending_deletes.version() == version {
                result
            } else {
                read()?
            };
            let Some(deleted) = missed(&held, &result)? else {
                return Ok(result);
            };
            drop(held);
            self.wait_for_deleter(session, me, deleted, &mut waited_for)?;
        }
    }

    /// Waits (LCK_M_S) for the transaction that noted `deleted` (a clustered key and that
    /// transaction) to end; `waited_for` is the note this reader waited for last. A deleter
    /// clears its notes before it releases its locks, so the same note cannot be found again
    /// once a wait for it returned: if it were, waiting again would spin, and it is reported.
    fn wait_for_deleter(
        &self,
        session: &Session,
        me: Option<TxnId>,
        deleted: (Vec<u8>, TxnId),
        waited_for: &mut Option<(Vec<u8>, TxnId)>,
    ) -> Result<()> {
        if waited_for.as_ref() == Some(&deleted) {
            return Err(EngineError::Storage(format!(
                "table '{}': a row deleted by transaction {} is still noted after its lock was \
                 released",
                self.name, deleted.1.0
            )));
        }
        let db = session.db();
        db.locks()
            .wait_for_shared(
                me,
                &crate::txn::lock_key(self.id, 0, &deleted.0),
                db.lock_timeout(),
            )
            .map_err(|error| session.lock_error(error))?;
        // The deleter's end may have been refused (see `Table::committed_value`).
        db.check_usable()?;
        *waited_for = Some(deleted);
        Ok(())
    }

    /// Looks up a row by its clustered key (the first match of a key prefix). A row another
    /// transaction inserted, changed or deleted and has not committed is waited for.
    pub fn get(&self, session: &Session, key: &[Value]) -> Result<Option<Row>> {
        let _attribution = session.attribute();
        session.db().check_usable()?;
        self.check_usable_by(session)?;
        let me = session.current_txn_id();
        loop {
            let (found, ended_writes) = self.find_record_waiting(session, me, key)?;
            let Some((partition, key, value)) = found else {
                return Ok(None);
            };
            match self.committed_value(session, partition, &key, value, Some(ended_writes))? {
                Some(value) => return Ok(Some(self.decode_record(&key, &value)?)),
                // Gone once its writer ended: look again (a later match may be committed).
                None => continue,
            }
        }
    }

    /// READ COMMITTED: the committed value of clustered record `key`, which a lookup read as
    /// `value`, or `None` if the row is not (or no longer) there.
    ///
    /// A row is committed when no other transaction holds an exclusive lock on it, because
    /// writers lock a row before it becomes visible and release the lock only once the row is
    /// final. The quick check (lock table only) is enough if no write ended since the read
    /// (`read_at`: the database's count of ended writes before it; `None` when unknown): the
    /// row unlocked now and no writer ended meanwhile means it was unlocked when it was read,
    /// so what was read was committed. A write that ended in between may have held the row
    /// then: a rollback can remove a row, and a transaction that changed a row twice commits
    /// its second value after the first was read (a reader once returned such a first value,
    /// never committed). Writers count themselves after their last change and before their
    /// locks go, so the count is read after the lock check. Otherwise the row is read again
    /// with the lock checked under the leaf's latch; a locked row is waited for (LCK_M_S) and
    /// read again, and so is a row gone meanwhile that a transaction still open deleted (see
    /// `pending.rs`).
    fn committed_value(
        &self,
        session: &Session,
        partition: usize,
        key: &[u8],
        value: Vec<u8>,
        read_at: Option<u64>,
    ) -> Result<Option<Vec<u8>>> {
        self.committed_value_noting_waits(session, partition, key, value, read_at, &mut false)
    }

    /// [`Table::committed_value`], setting `waited` if it waited for the row's lock (the row's
    /// writer ended meanwhile, and may have moved it).
    fn committed_value_noting_waits(
        &self,
        session: &Session,
        partition: usize,
        key: &[u8],
        value: Vec<u8>,
        read_at: Option<u64>,
        waited: &mut bool,
    ) -> Result<Option<Vec<u8>>> {
        let db = session.db();
        let reader = session.current_txn_id();
        let lock = crate::txn::lock_key(self.id, 0, key);
        let locks = db.locks();
        if let Some(read_at) = read_at
            && !locks.is_locked_by_other(reader, &lock)
            && db.ended_writes() == read_at
        {
            return Ok(Some(value));
        }
        // Every wait for this row shares one timeout, however many writers come and go (a new
        // one can lock the row between a wait's end and the read after it); each wait had the
        // whole timeout before. Fixed at the first wait, so a read that waits for nothing reads
        // no clock.
        let mut patience = None;
        let mut wait_for_row = || {
            let patience =
                *patience.get_or_insert_with(|| LockPatience::from_now(db.lock_timeout()));
            locks
                .wait_for_shared_within(reader, &lock, patience)
                .map_err(|error| session.lock_error(error))
        };
        loop {
            let read = self
                .clustered
                .tree(partition)
                .get_with(key, |current| {
                    (locks.is_locked_by_other(reader, &lock), current.to_vec())
                })
                .map_err(storage_failure)?;
            match read {
                None => {
                    // Gone since it was read: deleted (by a transaction that may still roll
                    // back) or a rolled-back insert. Only a deletion not yet committed is noted;
                    // ask with the set held still and the row read again under it.
                    let held = self.pending_deletes.hold();
                    if self
                        .clustered
                        .tree(partition)
                        .get(key)
                        .map_err(storage_failure)?
                        .is_some()
                    {
                        continue;
                    }
                    let exact = Bound::Included(key);
                    if held.first_of_others(reader, exact, exact).is_none() {
                        db.check_usable()?;
                        return Ok(None);
                    }
                    drop(held);
                    *waited = true;
                    wait_for_row()?;
                }
                Some((false, current)) => {
                    // A writer whose commit or rollback was refused (the database closed or
                    // failed) lets its locks go with its changes still in the trees: what this
                    // read finds may never have committed. The refusal marks the database
                    // before the locks go, so a read after them sees the mark.
                    db.check_usable()?;
                    return Ok(Some(current));
                }
                Some((true, _)) => {
                    *waited = true;
                    wait_for_row()?;
                }
            }
        }
    }

    fn index(&self, name: &str) -> Result<&Index> {
        self.index_position(name)
            .map(|position| self.indexes().nth(position).expect("found there"))
    }

    /// The position of the index called `name` in [`Table::indexes`].
    fn index_position(&self, name: &str) -> Result<usize> {
        self.indexes()
            .position(|index| index.def.name.eq_ignore_ascii_case(name))
            .ok_or_else(|| EngineError::UnknownIndex {
                table: self.name.clone(),
                index: name.to_owned(),
            })
    }

    /// Every index, the clustered one (which a heap has too) first, then the nonclustered ones
    /// in order: the order of the catalog's tree lists and of logged index changes.
    fn indexes(&self) -> impl Iterator<Item = &Index> {
        std::iter::once(&self.clustered).chain(&self.nonclustered)
    }

    /// The index id of every tree of every index (log records name trees by it).
    pub(crate) fn index_ids(&self) -> impl Iterator<Item = u32> + '_ {
        self.indexes()
            .flat_map(|index| index.trees.iter().map(BTree::index_id))
    }

    /// Takes every tree out of a dropped table that nothing else uses (`&mut` proves it), for
    /// its pages to be freed (see `Database::reclaim_dropped_tables`). The table is left with
    /// no trees and is not used again.
    pub(crate) fn take_trees(&mut self) -> Vec<BTree> {
        std::iter::once(&mut self.clustered)
            .chain(&mut self.nonclustered)
            .flat_map(|index| std::mem::take(&mut index.trees))
            .collect()
    }

    /// Looks rows up through the nonclustered index `index_name` by (a prefix of) its key. A
    /// row another transaction inserted, changed or deleted and has not committed is waited
    /// for, and a row is returned only if its committed values match.
    pub fn get_by_index(
        &self,
        session: &Session,
        index_name: &str,
        key: &[Value],
    ) -> Result<Vec<Row>> {
        let _attribution = session.attribute();
        session.db().check_usable()?;
        self.check_usable_by(session)?;
        let index = self.index(index_name)?;
        let Some(encoded) = self.encode_lookup_key(index, key)? else {
            return Ok(Vec::new());
        };
        let me = session.current_txn_id();
        // A noted row whose noted values (its committed ones, for a row that existed before its
        // deleter: see `PendingDeletes::note`) have an entry under the search key that the
        // read did not find.
        let missed = |held: &HeldPendingDeletes<'_>, candidates: &Vec<FoundRecord>| {
            // A transaction that deleted rows of a table it holds whole noted none of them: any
            // of them may have had an entry under the search key.
            if let Some(whole_table) = held.whole_table_of_others(me) {
                return Ok(Some(whole_table));
            }
            for (record_key, partition, deleter, value) in held.of_others(me) {
                if candidates.iter().any(|(found_partition, found_key, _)| {
                    *found_partition == partition && found_key == record_key
                }) {
                    continue;
                }
                let row = self.decode_record(record_key, value)?;
                if self.row_in_index_prefix(index, &row, record_key, &encoded)? {
                    return Ok(Some((record_key.to_vec(), deleter)));
                }
            }
            Ok(None)
        };
        for pass in 1.. {
            let candidates = self.read_waiting_for_deleters(
                session,
                me,
                || self.index_candidates(index, &encoded),
                missed,
            )?;
            let (rows, look_again) =
                self.committed_index_matches(session, index, &encoded, candidates)?;
            // Another pass reads everything again (rows this one returned may have moved
            // since), but only when a row found was gone or did not match, and at most a few
            // times, so writers that never stop cannot starve the lookup: a row moved more often
            // than that may be missed, as a scan may miss it.
            if !look_again || pass >= INDEX_LOOKUP_MAX_PASSES {
                return Ok(rows);
            }
        }
        unreachable!("the passes end by returning")
    }

    /// The rows among one pass's `candidates` (read through `index`) whose committed values
    /// have an entry there that starts with `prefix`, and whether the index must be read
    /// again: a candidate found gone, or changed so that it no longer matches, may have taken
    /// its entry elsewhere (a row moved to another clustered key keeps its entry here).
    fn committed_index_matches(
        &self,
        session: &Session,
        index: &Index,
        prefix: &[u8],
        candidates: Vec<FoundRecord>,
    ) -> Result<(Vec<Row>, bool)> {
        // The index is read a leaf at a time, so a row whose entry moved from one end of the
        // search key's range to the other meanwhile can be found twice: each row is returned
        // once.
        let mut seen = std::collections::HashSet::with_capacity(candidates.len());
        let mut rows = Vec::with_capacity(candidates.len());
        // Whether this pass waited for a writer (only `committed_value_noting_waits` needs it),
        // and whether what it found may be out of date.
        let (mut waited, mut look_again) = (false, false);
        for (partition, record_key, read) in candidates {
            if !seen.insert((partition, record_key.clone())) {
                continue;
            }
            let value = self.committed_value_noting_waits(
                session,
                partition,
                &record_key,
                read.clone(),
                None,
                &mut waited,
            )?;
            let Some(value) = value else {
                // Gone: deleted, or moved to another clustered key with the same entry here
                // (an update of its key), by a writer that may have ended before this check
                // without this lookup waiting for it. Read the index again, as `get` does. This
                // once looked again only after a wait, taking a row gone without one for a
                // deleted one: a row moved (and committed) between the index read and this
                // check was skipped, and a lookup of a unique value a committed row held all
                // along found nothing (`tests/update_model.rs`, concurrent part).
                look_again = true;
                continue;
            };
            let row = self.decode_record(&record_key, &value)?;
            if self.row_in_index_prefix(index, &row, &record_key, prefix)? {
                rows.push(row);
            } else {
                // Found through an entry under the key, but its committed values do not match:
                // the row changed since that entry was read, or was being changed as it was
                // read (a change puts the row's new entries in, then its value, then takes its
                // old entries out, so the read may have found an old entry and the new value
                // together). Either way another row may have taken the entry's key meanwhile
                // (a swap of two rows' unique values commits both at once), so the index is
                // read again, as for a row gone. This once looked again only when the value
                // had changed since the read and after a wait: a value read half way through
                // a swap, equal to the one committed, let a lookup of a unique value a
                // committed row held all along return nothing.
                look_again = true;
            }
        }
        Ok((rows, look_again))
    }

    /// The clustered records whose entries in `index` start with `prefix`, in every partition,
    /// as read now (committed or not).
    fn index_candidates(&self, index: &Index, prefix: &[u8]) -> Result<Vec<FoundRecord>> {
        let upper = prefix_end(prefix);
        let upper = upper.as_deref().map_or(Bound::Unbounded, Bound::Excluded);
        let mut candidates = Vec::new();
        for partition in 0..self.partition_count() {
            let mut range =
                index
                    .tree(partition)
                    .range(Bound::Included(prefix), upper, Direction::Forward);
            for (index_key, index_value) in range.by_ref() {
                if std::ptr::eq(index, &self.clustered) {
                    candidates.push((partition, index_key, index_value));
                    continue;
                }
                let locator = self.locator(index, &index_key, &index_value)?;
                if let Some(value) = self
                    .clustered
                    .tree(partition)
                    .get(&locator)
                    .map_err(storage_failure)?
                {
                    candidates.push((partition, locator, value));
                }
            }
            if let Some(error) = range.take_error() {
                return Err(storage_failure(error));
            }
        }
        Ok(candidates)
    }

    /// Whether `row` (clustered key `record_key`) has an entry in `index` that starts with
    /// `prefix`.
    fn row_in_index_prefix(
        &self,
        index: &Index,
        row: &[Value],
        record_key: &[u8],
        prefix: &[u8],
    ) -> Result<bool> {
        if std::ptr::eq(index, &self.clustered) {
            return Ok(record_key.starts_with(prefix));
        }
        let (entry_key, _) = self.nonclustered_entry(index, row, record_key)?;
        Ok(entry_key.starts_with(prefix))
    }

    /// The clustered key a nonclustered entry points at.
    fn locator(&self, index: &Index, key: &[u8], value: &[u8]) -> Result<Vec<u8>> {
        if index.def.uniqueness.is_unique() || std::ptr::eq(index, &self.clustered) {
            return Ok(value.to_vec());
        }
        let (_, consumed) = decode_key(&index.types, key)?;
        Ok(key[consumed..].to_vec())
    }

    /// Scans rows in clustered key order within `range`. Bound values compare with the rows as
    /// SQL Server compares them: a text or binary bound longer than its column (up to the
    /// longest value of its kind) falls between the rows it sorts between, as does a number or
    /// instant its column cannot hold exactly (1.5 between the INT keys 1 and 2, noon between
    /// two DATE keys), and a number or instant beyond its column's range above or below every
    /// row with the same leading values.
    pub fn scan<'a>(
        &'a self,
        session: &'a Session,
        range: &KeyRange,
        direction: Direction,
    ) -> Result<RowIter<'a>> {
        let _attribution = session.attribute();
        session.db().check_usable()?;
        self.check_usable_by(session)?;
        let full = |key: &[Value]| self.is_exact_clustered_key(key);
        let empty = || Ok(RowIter::empty(self, session, direction));
        let lower = match &range.lower {
            Bound::Unbounded => Bound::Unbounded,
            Bound::Included(key) | Bound::Excluded(key) => {
                match self.encode_search_key(&self.clustered, key)? {
                    SearchKey::Encoded(encoded) => match &range.lower {
                        Bound::Excluded(_) if !full(key) => match prefix_end(&encoded) {
                            Some(end) => Bound::Included(end),
                            None => return empty(),
                        },
                        Bound::Excluded(_) => Bound::Excluded(encoded),
                        _ => Bound::Included(encoded),
                    },
                    // Above the column's range: no row with this prefix is that high, so the
                    // range starts after them all.
                    SearchKey::OutOfRange {
                        prefix,
                        above: true,
                    } => match prefix_end(&prefix) {
                        Some(end) => Bound::Included(end),
                        None => return empty(),
                    },
                    // Below it: every row with this prefix and a value (not NULL) there is
                    // in range, as for any bound NULL sorts below.
                    SearchKey::OutOfRange {
                        mut prefix,
                        above: false,
                    } => {
                        push_lowest_value_start(&mut prefix);
                        Bound::Included(prefix)
                    }
                    // Between two keys of the column: the range starts after (or at) every
                    // key with the column value it converts to.
                    SearchKey::Beside { key, above: true } => match prefix_end(&key) {
                        Some(end) => Bound::Included(end),
                        None => return empty(),
                    },
                    SearchKey::Beside { key, above: false } => Bound::Included(key),
                }
            }
        };
        let upper = match &range.upper {
            Bound::Unbounded => Bound::Unbounded,
            Bound::Included(key) | Bound::Excluded(key) => {
                match self.encode_search_key(&self.clustered, key)? {
                    SearchKey::Encoded(encoded) => match &range.upper {
                        Bound::Included(_) if !full(key) => {
                            prefix_end(&encoded).map_or(Bound::Unbounded, Bound::Excluded)
                        }
                        Bound::Included(_) => Bound::Included(encoded),
                        _ => Bound::Excluded(encoded),
                    },
                    // Above the column's range: every row with this prefix is in range.
                    SearchKey::OutOfRange {
                        prefix,
                        above: true,
                    } => prefix_end(&prefix).map_or(Bound::Unbounded, Bound::Excluded),
                    // Below it: no row with this prefix and a value there is that low (a
                    // NULL there sorts below every bound, as for any bound).
                    SearchKey::OutOfRange {
                        mut prefix,
                        above: false,
                    } => {
                        push_lowest_value_start(&mut prefix);
                        Bound::Excluded(prefix)
                    }
                    // Between two keys of the column: the range ends after (or before) every
                    // key with the column value it converts to.
                    SearchKey::Beside { key, above: true } => {
                        prefix_end(&key).map_or(Bound::Unbounded, Bound::Excluded)
                    }
                    SearchKey::Beside { key, above: false } => Bound::Excluded(key),
                }
            }
        };
        Ok(RowIter::new(self, session, lower, upper, direction))
    }

    /// Updates the row with clustered key `key`, setting each `(column, value)`; returns
    /// whether a row was found. Nonclustered indexes follow. Changing clustered key columns
    /// moves the row. A column named twice fails the statement, as T-SQL's `SET c = 1, c = 2`
    /// does (error 264), rather than keep one of the values.
    pub fn update(
        self: &Arc<Self>,
        session: &Session,
        key: &[Value],
        changes: &[(usize, Value)],
    ) -> Result<bool> {
        for (index, (column, _)) in changes.iter().enumerate() {
            if changes[..index]
                .iter()
                .any(|(earlier, _)| earlier == column)
                && let Some(definition) = self.columns.get(*column)
            {
                return Err(EngineError::DuplicateUpdateColumn {
                    column: definition.name.clone(),
                });
            }
            let definition =
                self.columns
                    .get(*column)
                    .ok_or_else(|| EngineError::UnknownColumn {
                        table: self.name.clone(),
                        column: format!("#{column}"),
                    })?;
            if definition.identity.is_some() || definition.computed.is_some() {
                return Err(EngineError::ReadOnlyColumn {
                    table: self.name.clone(),
                    column: definition.name.clone(),
                });
            }
        }
        session.write(self, |scope| {
            let Some((partition, record_key, old_value)) = self.find_locked(scope, key)? else {
                return Ok(false);
            };
            let old_row = self.decode_record(&record_key, &old_value)?;
            let mut new_row = old_row.clone();
            for (column, value) in changes {
                new_row[*column] = value.clone();
            }
            // `finish_row` is shared with inserts and names the INSERT in its NULL error;
            // SQL Server's message 515 names the statement that failed, so an update's says
            // "UPDATE fails." instead.
            self.finish_row(&mut new_row, None)
                .map_err(|error| match error {
                    EngineError::NullNotAllowed { table, column, .. } => {
                        EngineError::NullNotAllowed {
                            table,
                            column,
                            statement: "UPDATE",
                        }
                    }
                    other => other,
                })?;
            let mut new_key = Vec::with_capacity(record_key.len());
            self.clustered.encode_columns(&new_row, &mut new_key)?;
            let old_key_columns = &record_key[..record_key.len()
                - if self.clustered.uniquifiers.is_some() {
                    UNIQUIFIER_BYTES
                } else {
                    0
                }];
            if new_key != old_key_columns || self.partition_of_row(&new_row) != partition {
                // The row moves: a delete and an insert, each logged; if the insert is
                // rejected, the statement's rollback puts the old row back.
                let key = self.clustered_key(&new_row)?;
                let value = self.clustered_value(&new_row)?;
                self.check_sizes(&self.clustered, &key, &value)?;
                let entries = self.nonclustered_entries(&new_row, &key)?;
                self.lock_entries(scope, &key, &entries)?;
                let new_partition = self.partition_of_row(&new_row);
                scope.note_pending_delete(self, partition, &record_key, &old_value);
                scope.logged(self, |changes| {
                    let delete = RowChange::Delete {
                        partition,
                        key: record_key.clone().into(),
                        old_value: old_value.clone().into(),
                    };
                    self.apply_change(&delete)?;
                    changes.push(delete);
                    self.insert_prepared(new_partition, &new_row, &key, &value, &entries)?;
                    changes.push(RowChange::Insert {
                        partition: new_partition,
                        key: key.into(),
                        value: value.into(),
                    });
                    Ok(())
                })?;
                return Ok(true);
            }
            let new_value = self.clustered_value(&new_row)?;
            self.check_sizes(&self.clustered, &record_key, &new_value)?;
            // The row's new unique keys (its clustered key is held already, so locking it
            // again only finds it held).
            let new_entries = self.nonclustered_entries(&new_row, &record_key)?;
            self.lock_entries(scope, &record_key, &new_entries)?;
            if !self.nonclustered.is_empty() {
                // Entries of the old values may leave their indexes: lookups through them wait.
                scope.note_pending_delete(self, partition, &record_key, &old_value);
            }
            let update = RowChange::Update {
                partition,
                key: record_key.into(),
                old_value: old_value.into(),
                new_value: new_value.into(),
            };
            scope.logged(self, |changes| {
                self.apply_change(&update)?;
                changes.push(update.clone());
                Ok(true)
            })
        })
    }

    /// Finds the clustered record for a search key and locks it exclusively (and its unique
    /// nonclustered keys), then reads it again: the version returned is the one the lock
    /// protects.
    fn find_locked(
        &self,
        scope: &mut WriteScope<'_>,
        key: &[Value],
    ) -> Result<Option<FoundRecord>> {
        self.find_locked_with(scope, key, || {})
    }

    /// [`Table::find_locked`], running `after_read` between each read of the row and its lock
    /// requests: the moment another transaction can change the version read (tests make it
    /// change there).
    ///
    /// A version that changed under the lock requests (another transaction changed or
    /// deleted it, and committed, while this one waited) is looked up again. The locks taken
    /// for the versions left behind are then released, except those the version returned
    /// needs too: this transaction read nothing under them (the version it read was thrown
    /// away) and changed nothing, and it did not hold them before this call, so strict
    /// two-phase locking does not ask for them, and kept to the end of the transaction they
    /// blocked other sessions on keys it no longer needed (the unique key a row had before
    /// the change, or the clustered key of a row that moved or went away). Locks it held before
    /// the call stay, whatever it did under them.
    ///
    /// The same goes for a call that fails: a lock request that timed out part-way (the row's
    /// clustered key granted, one of its unique keys not), a deadlock, or a failed read. The
    /// statement read nothing under the locks it got and changes nothing after the error, so
    /// they too are released, rather than blocking other sessions until the transaction ends
    /// (a transaction goes on after a lock timeout, as in SQL Server).
    fn find_locked_with(
        &self,
        scope: &mut WriteScope<'_>,
        key: &[Value],
        mut after_read: impl FnMut(),
    ) -> Result<Option<FoundRecord>> {
        let held = scope.locks_held();
        let mut looked_again = false;
        let found = loop {
            let (session, me) = scope.reader();
            let db = session.db();
            let (found, read_at) = match self.find_record_waiting(session, Some(me), key) {
                Ok(read) => read,
                Err(error) => break Err(error),
            };
            let Some((partition, record_key, value)) = found else {
                break Ok(None);
            };
            after_read();
            if let Err(error) = self.lock_row_entries(scope, &record_key, &value) {
                break Err(error);
            }
            // The version read is the row's current one if no write ended since before the
            // read: another transaction changes a row only holding its lock, which it lets go
            // only after counting itself among the ended writes (at its end, or its statement's
            // rollback), and this transaction holds the lock now. So the row is read again only
            // when a write ended meanwhile, as `Table::committed_value` reads a row again; that
            // saves a descent of every update and delete that nobody else's end overtook.
            if db.ended_writes() == read_at {
                break Ok(Some((partition, record_key, value)));
            }
            match self
                .clustered
                .tree(partition)
                .get(&record_key)
                .map_err(storage_failure)
            {
                Ok(Some(current)) if current == value => {
                    break Ok(Some((partition, record_key, current)));
                }
                Err(error) => break Err(error),
                // Changed or deleted while this transaction waited for the lock: look again.
                Ok(_) => looked_again = true,
            }
        };
        if looked_again || found.is_err() {
            // Only after a second look or a failure can a lock taken here belong to no version
            // returned.
            let needed = match &found {
                Ok(Some((_, record_key, value))) => self.row_lock_keys(record_key, value)?,
                _ => SmallVec::new(),
            };
            scope.release_locks_taken_since(held, |lock| needed.contains(lock));
        }
        found
    }

    /// Applies the changes of one log record (replay), in order. The rows of an `InsertRun`
    /// record (distinct keys, one partition, so their order does not matter) go into a table
    /// without nonclustered indexes as one batch, in key order, which latches each leaf once
    /// for all the rows that belong on it instead of once per row through the tail gate (that
    /// per-row path was over half of the replay of a 1 GiB log).
    pub(crate) fn apply_changes(&self, changes: &[RowChange]) -> Result<()> {
        if let [RowChange::Insert { partition, .. }, _, ..] = changes
            && self.nonclustered.is_empty()
        {
            let entries: Option<Vec<(&[u8], &[u8])>> = changes
                .iter()
                .map(|change| match change {
                    RowChange::Insert {
                        partition: other,
                        key,
                        value,
                    } if other == partition => Some((&key[..], &value[..])),
                    _ => None,
                })
                .collect();
            if let Some(entries) = entries {
                let results = self.clustered.tree(*partition).insert_batch(&entries);
                for (result, (key, value)) in results.into_iter().zip(&entries) {
                    result.map_err(|error| self.clustered_insert_error(error, key, value))?;
                }
                return Ok(());
            }
        }
        changes
            .iter()
            .try_for_each(|change| self.apply_change(change))
    }

    /// The error of a clustered record that could not go in, naming the row: decoded only
    /// now, for the message.
    fn clustered_insert_error(&self, error: BTreeError, key: &[u8], value: &[u8]) -> EngineError {
        match self.decode_record(key, value) {
            Ok(row) => self.storage_error(&self.clustered, error, &row),
            Err(undecodable) => undecodable,
        }
    }

    /// Applies a change to the trees, nonclustered entries included: the forward half of an
    /// update or a delete, an undo, or a replayed log record. Fails (changing nothing) if the
    /// trees do not hold what the change expects.
    pub(crate) fn apply_change(&self, change: &RowChange) -> Result<()> {
        match change {
            RowChange::Insert {
                partition,
                key,
                value,
            } if self.nonclustered.is_empty() => {
                // Nothing to derive from the row (the common case of a replayed insert): the
                // clustered record goes in as it is, and only a failure decodes it, for the
                // message.
                self.clustered
                    .tree(*partition)
                    .insert(key, value)
                    .map_err(|error| self.clustered_insert_error(error, key, value))
            }
            RowChange::Insert {
                partition,
                key,
                value,
            } => {
                let row = self.decode_record(key, value)?;
                let entries = self.nonclustered_entries(&row, key)?;
                self.insert_prepared(*partition, &row, key, value, &entries)
            }
            RowChange::Delete {
                partition,
                key,
                old_value,
            } => {
                let row = self.decode_record(key, old_value)?;
                if self.delete_record(*partition, key, &row)? {
                    Ok(())
                } else {
                    Err(EngineError::Storage(format!(
                        "table '{}': the row to delete is not there",
                        self.name
                    )))
                }
            }
            RowChange::Update {
                partition,
                key,
                old_value,
                new_value,
            } => self.apply_update(*partition, key, old_value, new_value),
        }
    }

    /// The change that takes back the insert of the row with clustered key `key` into
    /// `partition` by the transaction being rolled back: its delete, with the value read back
    /// from the tree, for the transaction's undo list keeps no copy of an inserted row's value
    /// (see `txn.rs`, `UndoChange`).
    ///
    /// The value in the tree is the one the insert logged. The row is still exclusively locked
    /// by the transaction (by its own lock, or by the table's that the transaction escalated
    /// to), so no other transaction changed it, and undo runs newest first, so
    /// every later change of the row by the transaction itself (an update, or a delete and an
    /// insert back) was undone before this. The read latches the row's leaf as the delete
    /// path's own read of a row does ([`Table::delete`] reads the row it deletes under the
    /// leaf's latch, then [`Table::apply_change`] deletes it); the row's lock keeps it
    /// unchanged in between. The caller applies the returned delete as it applied the delete
    /// built from a kept value before: the same log record (compensation) and the same
    /// nonclustered entries removed, as both follow from the value.
    ///
    /// A row that is not there is a bug (the insert's own rollback is the only thing that can
    /// remove it): the error names the table and the key, and nothing is changed, so the
    /// rollback stops the database as for any change that cannot be undone.
    pub(crate) fn delete_of_inserted_row(
        &self,
        partition: usize,
        key: RowBytes,
    ) -> Result<RowChange> {
        let value = self
            .clustered
            .tree(partition)
            .get(&key)
            .map_err(storage_failure)?;
        match value {
            Some(value) => Ok(RowChange::Delete {
                partition,
                key,
                old_value: value.into(),
            }),
            None => {
                // The key decoded to its columns when it can be, for the message, else as bytes.
                let described = match decode_key(&self.clustered.types, &key) {
                    Ok((values, _)) => values
                        .iter()
                        .map(Value::to_string)
                        .collect::<Vec<_>>()
                        .join(", "),
                    Err(_) => format!("{:02x?}", &key[..]),
                };
                Err(EngineError::Storage(format!(
                    "internal error: table '{}': the row with clustered key ({described}) that \
                     the transaction inserted into partition {partition} is not there to take \
                     back",
                    self.name
                )))
            }
        }
    }

    /// Replaces a row's value in place, moving its nonclustered entries whose keys change. New
    /// entries go in first, so a unique violation is found before the row changes.
    fn apply_update(
        &self,
        partition: usize,
        key: &[u8],
        old_value: &[u8],
        new_value: &[u8],
    ) -> Result<()> {
        let old_row = self.decode_record(key, old_value)?;
        let new_row = self.decode_record(key, new_value)?;
        let mut added: Vec<(&Index, Vec<u8>)> = Vec::new();
        let mut removed: Vec<(&Index, Vec<u8>)> = Vec::new();
        let mut failure = None;
        for index in &self.nonclustered {
            // An entry that cannot be built fails the change like one that cannot go in: the
            // entries already added to earlier indexes are taken out again below.
            let entries = self
                .nonclustered_entry(index, &old_row, key)
                .and_then(|(old_key, _)| {
                    let (new_key, new_value) = self.nonclustered_entry(index, &new_row, key)?;
                    Ok((old_key, new_key, new_value))
                });
            let (old_key, new_key, new_entry_value) = match entries {
                Ok(entries) => entries,
                Err(error) => {
                    failure = Some(error);
                    break;
                }
            };
            if old_key == new_key {
                continue;
            }
            if let Err(error) = self.check_sizes(index, &new_key, &new_entry_value) {
                failure = Some(error);
                break;
            }
            match index.tree(partition).insert(&new_key, &new_entry_value) {
                Ok(()) => {
                    added.push((index, new_key));
                    removed.push((index, old_key));
                }
                Err(error) => {
                    failure = Some(self.storage_error(index, error, &new_row));
                    break;
                }
            }
        }
        let take_back = |added: &[(&Index, Vec<u8>)], error: EngineError| {
            let mut take_back = TakeBack::default();
            for (index, key) in added {
                take_back.delete(index.tree(partition), key);
            }
            take_back.outcome(&self.name, error)
        };
        if let Some(error) = failure {
            return Err(take_back(&added, error));
        }
        let updated = match self
            .clustered
            .tree(partition)
            .compare_and_update(key, old_value, new_value)
        {
            Ok(updated) => updated,
            Err(error) => {
                let error = self.storage_error(&self.clustered, error, &new_row);
                return Err(take_back(&added, error));
            }
        };
        match updated {
            CompareAndUpdate::Updated => {
                for (index, key) in removed {
                    if let Err(error) = index.tree(partition).delete(&key) {
                        // The row holds its new value and its new entries are in; the old
                        // entry left behind would find the row under a key it no longer has.
                        return Err(stopped_part_way(
                            &self.name,
                            &format!(
                                "changed a row but could not remove its old entry from index \
                                 '{}' ({error})",
                                index.def.name
                            ),
                        ));
                    }
                }
                Ok(())
            }
            CompareAndUpdate::Changed | CompareAndUpdate::NotFound => Err(take_back(
                &added,
                EngineError::Storage(format!(
                    "table '{}': the row to update does not hold the expected value",
                    self.name
                )),
            )),
        }
    }

    /// Removes a record and its nonclustered entries.
    fn delete_record(&self, partition: usize, key: &[u8], row: &[Value]) -> Result<bool> {
        if self
            .clustered
            .tree(partition)
            .delete(key)
            .map_err(storage_failure)?
            .is_none()
        {
            return Ok(false);
        }
        for index in &self.nonclustered {
            // The record is gone: an entry left behind would point at no row.
            let removed = self
                .nonclustered_entry(index, row, key)
                .and_then(|(entry_key, _)| {
                    index
                        .tree(partition)
                        .delete(&entry_key)
                        .map_err(storage_failure)
                });
            if let Err(error) = removed {
                return Err(stopped_part_way(
                    &self.name,
                    &format!(
                        "removed a row but could not remove its entry from index '{}' \
                         ({error})",
                        index.def.name
                    ),
                ));
            }
        }
        Ok(true)
    }

    /// Deletes the row with clustered key `key` (the first match of a non-unique key); returns
    /// whether a row was deleted.
    pub fn delete(self: &Arc<Self>, session: &Session, key: &[Value]) -> Result<bool> {
        session.write(self, |scope| {
            let Some((partition, record_key, value)) = self.find_locked(scope, key)? else {
                return Ok(false);
            };
            scope.note_pending_delete(self, partition, &record_key, &value);
            let delete = RowChange::Delete {
                partition,
                key: record_key.into(),
                old_value: value.into(),
            };
            scope.logged(self, |changes| {
                self.apply_change(&delete)?;
                changes.push(delete.clone());
                Ok(true)
            })
        })
    }

    /// Appends a reservation of identity values ahead to `db`'s log, without waiting for it,
    /// if the table is logged and has an identity column (see `identity.rs`).
    pub(crate) fn reserve_identity_ahead(&self, db: &crate::database::Database) -> Result<()> {
        match (&self.identity, db.wal()) {
            (Some(identity), Some(wal)) if self.is_logged() => {
                identity.reserve_ahead(ReservationLog {
                    db,
                    wal,
                    table_id: self.id,
                })
            }
            _ => Ok(()),
        }
    }

    /// Where identity values taken for a write through `scope` are reserved: the log, if the
    /// write is logged. Not borrowed from the scope, so that a closure given the scope can use
    /// it.
    fn reservation_log<'s>(&self, scope: &WriteScope<'s>) -> Option<ReservationLog<'s>> {
        let db = scope.logging_db()?;
        Some(ReservationLog {
            db,
            wal: db.wal()?,
            table_id: self.id,
        })
    }

    /// Whether the table's changes are logged.
    pub(crate) fn is_logged(&self) -> bool {
        self.definition.logged
    }

    /// The table's catalog entry: its definition, trees and identity counter (read while
    /// writers are paused, for a checkpoint).
    pub(crate) fn catalog_entry(&self) -> CatalogEntry {
        // The definition with the options its indexes have now (see `alter_index`).
        let mut definition = self.definition.clone();
        if let Some(clustered) = &mut definition.clustered {
            clustered.options = self.index_options(0);
        }
        for (position, index) in definition.nonclustered.iter_mut().enumerate() {
            index.options = self.index_options(position + 1);
        }
        CatalogEntry {
            table_id: self.id,
            definition,
            index_trees: self
                .indexes()
                .map(|index| IndexTrees {
                    index_id_per_partition: index.trees.iter().map(BTree::index_id).collect(),
                    root_per_partition: index.trees.iter().map(BTree::root).collect(),
                    rows_per_partition: index.trees.iter().map(BTree::row_count).collect(),
                    spare_leaves_per_partition: index
                        .trees
                        .iter()
                        .map(BTree::spare_leaves)
                        .collect(),
                })
                .collect(),
            next_identity: self.identity.as_ref().map(IdentityState::restart_value),
            uniquifier_blocks: self
                .clustered
                .uniquifiers
                .as_ref()
                .map(Uniquifiers::blocks_taken),
        }
    }

    /// Raises the identity counter to at least `next`.
    pub(crate) fn raise_identity(&self, next: i64) {
        if let Some(identity) = &self.identity {
            identity.raise(next);
        }
    }

    /// Makes the table's new uniquifiers lie past every one its rows hold, which an earlier
    /// process handed out (before, a heap reopened by a new process refused every insert as a
    /// duplicate key). The open calls it for a table of a catalog written before the uniquifier
    /// blocks were recorded (versions 1 and 2); a later catalog's count spares it the reading.
    pub(crate) fn raise_uniquifiers_past_rows(&self) -> Result<()> {
        if let (Some(uniquifiers), Some(highest)) =
            (&self.clustered.uniquifiers, self.highest_uniquifier()?)
        {
            uniquifiers.raise_past(highest);
        }
        Ok(())
    }

    /// Makes the table's new uniquifiers come from blocks past the first `blocks` (the blocks an
    /// earlier process had handed out by its last checkpoint, see `Uniquifiers::blocks_taken`).
    pub(crate) fn raise_uniquifier_blocks(&self, blocks: u64) {
        if let Some(uniquifiers) = &self.clustered.uniquifiers {
            uniquifiers.raise_to_block(blocks);
        }
    }

    /// Makes the table's new uniquifiers lie past those of the rows `changes` insert (the
    /// changes of one log record, which recovery replays): rows an earlier process inserted
    /// after its last checkpoint, whose blocks the checkpoint's count does not cover.
    pub(crate) fn note_recovered_uniquifiers(&self, changes: &[RowChange]) {
        let Some(uniquifiers) = &self.clustered.uniquifiers else {
            return;
        };
        let highest = changes
            .iter()
            .filter_map(|change| match change {
                RowChange::Insert { key, .. } => key.last_chunk::<UNIQUIFIER_BYTES>(),
                _ => None,
            })
            .map(|suffix| u64::from_be_bytes(*suffix))
            .max();
        if let Some(highest) = highest {
            uniquifiers.raise_past(highest);
        }
    }

    /// The highest uniquifier the clustered index holds, if it is not unique and has rows. A
    /// heap's keys are their uniquifiers, so its last key is read; any other non-unique
    /// index ends every key in one, so its keys are all read.
    fn highest_uniquifier(&self) -> Result<Option<u64>> {
        if self.clustered.uniquifiers.is_none() {
            return Ok(None);
        }
        let heap = self.clustered.column_ids.is_empty();
        let direction = if heap {
            Direction::Backward
        } else {
            Direction::Forward
        };
        let mut highest = None;
        for tree in &self.clustered.trees {
            let mut keys = tree.range(Bound::Unbounded, Bound::Unbounded, direction);
            for (key, _) in keys.by_ref() {
                let Some(suffix) = key.last_chunk::<UNIQUIFIER_BYTES>() else {
                    return Err(EngineError::Storage(format!(
                        "table '{}': a clustered key of {} bytes cannot end in a uniquifier",
                        self.name,
                        key.len()
                    )));
                };
                highest = highest.max(Some(u64::from_be_bytes(*suffix)));
                if heap {
                    break;
                }
            }
            if let Some(error) = keys.take_error() {
                return Err(storage_failure(error));
            }
        }
        Ok(highest)
    }

    /// Raises the identity counter past every value up to and including `up_to` (in the order
    /// values are handed out): the last value an identity reservation (a log record) covers,
    /// or the farthest value replayed rows hold.
    pub(crate) fn raise_identity_past(&self, up_to: i64) {
        if let Some(identity) = &self.identity {
            self.raise_identity(up_to.saturating_add(identity.increment));
        }
    }

    /// Raises the identity counter past the identity values of the rows `changes` insert (the
    /// changes of one log record). The farthest value is found first and raised once: a raise
    /// takes the reservation mutex, and one record of a batch holds hundreds of rows (replaying
    /// a 1 GiB log spent about an eighth of its time raising row by row). When the identity is
    /// a key column, only that column of each key is decoded.
    pub(crate) fn note_recovered_identities(&self, changes: &[RowChange]) -> Result<()> {
        let Some(identity) = &self.identity else {
            return Ok(());
        };
        let key_position = self
            .clustered
            .column_ids
            .iter()
            .position(|&column| column == identity.column);
        let mut farthest = None;
        for change in changes {
            let RowChange::Insert { key, value, .. } = change else {
                continue;
            };
            let used_value = match key_position {
                Some(position) => decode_key_column(&self.clustered.types, key, position)?,
                None => self.decode_record(key, value)?.swap_remove(identity.column),
            };
            // An identity column holds integers only; a NULL holds no value.
            let Some(used) = used_value.as_i64() else {
                continue;
            };
            farthest = Some(farthest.map_or(used, |far| identity.farther(far, used)));
        }
        if let Some(used) = farthest {
            self.raise_identity_past(used);
        }
        Ok(())
    }

    /// Checks every index's trees; that in every partition every index holds one entry per
    /// row; that every row lives in the partition its partitioning value names; and that every
    /// row's nonclustered entries are present and point back at it.
    pub fn check_integrity(&self) -> Result<TableCheck> {
        let mut indexes = Vec::new();
        let mut rows = 0;
        for partition in 0..self.partition_count() {
            let clustered = self.clustered.tree(partition).check_integrity()?;
            rows += clustered.rows;
            indexes.push((self.clustered.def.name.clone(), clustered));
            for index in &self.nonclustered {
                let check = index.tree(partition).check_integrity()?;
                if check.rows != clustered.rows {
                    return Err(EngineError::Integrity(format!(
                        "table '{}', partition {partition}: index '{}' has {} entries but the clustered index has {} rows",
                        self.name, index.def.name, check.rows, clustered.rows
                    )));
                }
                indexes.push((index.def.name.clone(), check));
            }
            if self.nonclustered.is_empty() && self.partitioning.is_none() {
                continue;
            }
            let mut rows = self.clustered.tree(partition).range(
                Bound::Unbounded,
                Bound::Unbounded,
                Direction::Forward,
            );
            for (key, value) in rows.by_ref() {
                let row = self.decode_record(&key, &value)?;
                if self.partition_of_row(&row) != partition {
                    return Err(EngineError::Integrity(format!(
                        "table '{}': the row with key ({}) is in partition {partition} but belongs in partition {}",
                        self.name,
                        self.clustered.describe_key(&row),
                        self.partition_of_row(&row)
                    )));
                }
                for index in &self.nonclustered {
                    let (entry_key, entry_value) = self.nonclustered_entry(index, &row, &key)?;
                    if index
                        .tree(partition)
                        .get(&entry_key)
                        .map_err(storage_failure)?
                        .as_deref()
                        != Some(entry_value.as_slice())
                    {
                        return Err(EngineError::Integrity(format!(
                            "table '{}': index '{}' has no entry for the row with key ({})",
                            self.name,
                            index.def.name,
                            self.clustered.describe_key(&row)
                        )));
                    }
                }
            }
            if let Some(error) = rows.take_error() {
                return Err(storage_failure(error));
            }
        }
        Ok(TableCheck {
            table: self.name.clone(),
            rows,
            indexes,
        })
    }
}

/// Converts an identity value to its column's type, reporting overflow as SQL Server does.
fn identity_as_value(value: i64, data_type: DataType) -> Result<Value> {
    let overflow = || EngineError::IdentityOverflow {
        data_type: data_type.name(),
    };
    Ok(match data_type {
        DataType::TinyInt => Value::TinyInt(u8::try_from(value).map_err(|_| overflow())?),
        DataType::SmallInt => Value::SmallInt(i16::try_from(value).map_err(|_| overflow())?),
        DataType::Int => Value::Int(i32::try_from(value).map_err(|_| overflow())?),
        _ => Value::BigInt(value),
    })
}

/// A search key as [`Table::encode_search_key`] makes it.
enum SearchKey {
    /// The encoded key (prefix).
    Encoded(Vec<u8>),
    /// A value is a number or instant beyond its column's range: `above` (or below) every value
    /// the column can hold. `prefix` encodes the values before it.
    OutOfRange { prefix: Vec<u8>, above: bool },
    /// A value is a number or instant its column cannot hold exactly (1.5 in an INT column): it
    /// lies just `above` (or below) every key that starts with `key`, which encodes the values
    /// before it and the column value it converts to.
    Beside { key: Vec<u8>, above: bool },
}

/// A search value that a search compares exactly with the values of its column rather than
/// converting it to the column's type first (which may round it onto a key).
#[derive(Clone, Copy)]
enum ExactValue {
    /// A number searched for in a numeric column.
    Number(Decimal),
    /// A date or datetime2 searched for in a date or datetime2 column.
    Instant(DateTime2),
}

impl ExactValue {
    /// `value` as an exact value for a column of `data_type`, if both are numeric or both
    /// temporal.
    fn of(data_type: &DataType, value: &Value) -> Option<ExactValue> {
        match data_type {
            DataType::TinyInt
            | DataType::SmallInt
            | DataType::Int
            | DataType::BigInt
            | DataType::Bit
            | DataType::Decimal { .. }
            | DataType::Money => value.as_exact_number().map(ExactValue::Number),
            DataType::Date | DataType::DateTime2(_) => {
                value.as_exact_instant().map(ExactValue::Instant)
            }
            _ => None,
        }
    }

    /// How the value compares with `converted`, what it converted to in its column's type.
    fn cmp_converted(self, converted: &Value) -> Option<std::cmp::Ordering> {
        match self {
            ExactValue::Number(number) => converted.as_exact_number().map(|c| number.cmp(&c)),
            ExactValue::Instant(instant) => converted.as_exact_instant().map(|c| instant.cmp(&c)),
        }
    }

    /// Whether a value beyond its column's range lies above it (rather than below). An
    /// instant can only leave it upwards, by rounding past 9999-12-31.
    fn is_positive(self) -> bool {
        match self {
            ExactValue::Number(number) => number > Decimal::ZERO,
            ExactValue::Instant(_) => true,
        }
    }
}

/// The widest type whose key encoding is that of `data_type`'s values, for a text or binary
/// type (whose encoding does not depend on the declared length); `None` for other types.
fn widest_of_kind(data_type: &DataType) -> Option<DataType> {
    match data_type {
        DataType::Char(_) | DataType::VarChar(_) => Some(DataType::VarChar(MAX_BYTE_LENGTH)),
        DataType::NChar(_) | DataType::NVarChar(_) => Some(DataType::NVarChar(MAX_NCHAR_LENGTH)),
        DataType::VarBinary(_) => Some(DataType::VarBinary(MAX_BYTE_LENGTH)),
        _ => None,
    }
}

/// The smallest byte string greater than every string that starts with `prefix`, or `None`
/// if there is none (the prefix is empty or all 0xFF).
fn prefix_end(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < u8::MAX {
            end.push(last + 1);
            return Some(end);
        }
    }
    None
}

/// Rows of a scan, in key order. For a partitioned table it merges the partitions' scans,
/// which are each in key order, by always taking the smallest (or, backwards, the largest)
/// next key.
///
/// READ COMMITTED: a row read ahead is returned only once it is committed (see
/// `Table::committed_value`), and a row that a transaction still open deleted is waited for
/// rather than skipped: before returning a row (or ending), the scan looks for such a row in
/// the gap between the row it returned last and this one. The gap check is consistent with
/// the rows read ahead only if nothing was noted or cleared since they were read (see
/// `pending.rs`); when something was, the scan reads ahead again, from just past the last row it
/// returned, with the set of deleted rows held still.
pub struct RowIter<'a> {
    table: &'a Table,
    session: &'a Session,
    partitions: Vec<RangeIter<'a>>,
    /// The next record of each partition's scan, read ahead; `None` once that scan is done.
    heads: Vec<Option<(Vec<u8>, Vec<u8>)>>,
    direction: Direction,
    /// The scan's bounds (encoded clustered keys); the one the scan starts from moves past
    /// each row returned.
    lower: Bound<Vec<u8>>,
    upper: Bound<Vec<u8>>,
    /// The database's count of ended writes before the rows read ahead were (when the scan
    /// started, or when it last read ahead again): once it changes, every record read ahead
    /// may hold a value that was never committed (rolled back, or changed again before its
    /// transaction committed), so each is read again (see [`Table::committed_value`]).
    ended_writes: u64,
    /// The table's version of deleted rows (`PendingDeletes::version`) read before the rows
    /// read ahead were.
    pending_version: u64,
    /// The range holds no key (the bounds above then mean nothing).
    empty: bool,
    /// The deleted row this scan waited for last (see [`Table::wait_for_deleter`]).
    waited_for: Option<(Vec<u8>, TxnId)>,
}

impl<'a> RowIter<'a> {
    fn new(
        table: &'a Table,
        session: &'a Session,
        lower: Bound<Vec<u8>>,
        upper: Bound<Vec<u8>>,
        direction: Direction,
    ) -> Self {
        let mut iter = RowIter {
            table,
            session,
            partitions: Vec::new(),
            heads: Vec::new(),
            direction,
            lower,
            upper,
            ended_writes: session.db().ended_writes(),
            pending_version: table.pending_deletes.version(),
            empty: false,
            waited_for: None,
        };
        iter.read_ahead();
        iter
    }

    /// A scan of a range that holds no key.
    fn empty(table: &'a Table, session: &'a Session, direction: Direction) -> Self {
        RowIter {
            table,
            session,
            partitions: Vec::new(),
            heads: Vec::new(),
            direction,
            lower: Bound::Unbounded,
            upper: Bound::Unbounded,
            ended_writes: 0,
            pending_version: 0,
            empty: true,
            waited_for: None,
        }
    }

    /// Starts each partition's scan within the current bounds and reads its first record.
    fn read_ahead(&mut self) {
        let (table, lower, upper) = (self.table, &self.lower, &self.upper);
        self.partitions = table
            .clustered
            .trees
            .iter()
            .map(|tree| {
                tree.range(
                    lower.as_ref().map(Vec::as_slice),
                    upper.as_ref().map(Vec::as_slice),
                    self.direction,
                )
            })
            .collect();
        self.heads = self.partitions.iter_mut().map(Iterator::next).collect();
    }

    /// The partition whose head comes next in the scan's order, if any.
    fn best_head(&self) -> Option<usize> {
        let mut best: Option<usize> = None;
        for (position, head) in self.heads.iter().enumerate() {
            let Some((key, _)) = head else {
                continue;
            };
            let better = best.is_none_or(|best| {
                let best_key = &self.heads[best]
                    .as_ref()
                    .expect("only heads that exist are chosen")
                    .0;
                match self.direction {
                    Direction::Forward => key < best_key,
                    Direction::Backward => key > best_key,
                }
            });
            if better {
                best = Some(position);
            }
        }
        best
    }

    /// A row that a transaction other than the reader deleted and has not ended, lying between
    /// the last row returned and the head `best` (or the scan's end), if any; the rows read ahead
    /// are read again first if the set changed since they were read.
    fn deleted_in_gap(&mut self, best: &mut Option<usize>) -> Option<(Vec<u8>, TxnId)> {
        let pending = &self.table.pending_deletes;
        if pending.quiet_since(self.pending_version) {
            return None;
        }
        let held = pending.hold();
        let version = pending.version();
        if version != self.pending_version {
            self.pending_version = version;
            self.ended_writes = self.session.db().ended_writes();
            self.read_ahead();
            *best = self.best_head();
        }
        let head = best.map(|best| {
            let key = &self.heads[best].as_ref().expect("a chosen head exists").0;
            Bound::Excluded(key.as_slice())
        });
        let (lower, upper) = match self.direction {
            Direction::Forward => (
                self.lower.as_ref().map(Vec::as_slice),
                head.unwrap_or(self.upper.as_ref().map(Vec::as_slice)),
            ),
            Direction::Backward => (
                head.unwrap_or(self.lower.as_ref().map(Vec::as_slice)),
                self.upper.as_ref().map(Vec::as_slice),
            ),
        };
        held.first_of_others(self.session.current_txn_id(), lower, upper)
    }
}

impl Iterator for RowIter<'_> {
    type Item = Result<Row>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.empty {
            return None;
        }
        // The scan's waits (row locks, page latches as it reads on) happen here, after `scan`
        // returned: they are the scanning session's too.
        let _attribution = self.session.attribute();
        loop {
            let mut best = self.best_head();
            if let Some(deleted) = self.deleted_in_gap(&mut best) {
                let me = self.session.current_txn_id();
                let waited =
                    self.table
                        .wait_for_deleter(self.session, me, deleted, &mut self.waited_for);
                if let Err(error) = waited {
                    return Some(Err(error));
                }
                // The deleter's clear moved the version on: the next round reads ahead again
                // and finds the row if the delete was rolled back.
                continue;
            }
            let Some(best) = best else {
                // Every partition's scan ended; one that ended on a read error says so.
                return self
                    .partitions
                    .iter_mut()
                    .find_map(RangeIter::take_error)
                    .map(|error| Err(storage_failure(error)));
            };
            let next = self.partitions[best].next();
            let (key, value) = std::mem::replace(&mut self.heads[best], next)?;
            let row = match self.table.committed_value(
                self.session,
                best,
                &key,
                value,
                Some(self.ended_writes),
            ) {
                Ok(Some(value)) => Some(self.table.decode_record(&key, &value)),
                Ok(None) => None,
                Err(error) => return Some(Err(error)),
            };
            // The scan resumes past this row if it has to read ahead again.
            match self.direction {
                Direction::Forward => self.lower = Bound::Excluded(key),
                Direction::Backward => self.upper = Bound::Excluded(key),
            }
            if row.is_some() {
                return row;
            }
        }
    }
}

/// Maps a tree error from a read path (no key or row to describe) to an engine error.
/// Takes back what a statement that failed part way had already put into the trees. These
/// changes are in neither the transaction's undo list nor the log yet (a statement's changes
/// join both only once it succeeds), so nothing else can take them back: a take-back that fails
/// (a page it needs cannot be read) leaves them in the trees, where readers would see them and
/// a checkpoint would write them into the image, with no log record to undo them. The statement
/// then stops the database, as a rollback that fails does ([`TakeBack::outcome`],
/// `WriteScope::logged`).
#[derive(Default)]
struct TakeBack {
    /// The first delete that failed, if any.
    failure: Option<BTreeError>,
}

impl TakeBack {
    /// Removes `key` from `tree`, remembering the first failure.
    fn delete(&mut self, tree: &BTree, key: &[u8]) {
        if let Err(error) = tree.delete(key) {
            self.failure.get_or_insert(error);
        }
    }

    /// The statement's error: `error` if everything was taken back, else
    /// [`EngineError::DatabaseFailed`] naming both.
    fn outcome(self, table: &str, error: EngineError) -> EngineError {
        match self.failure {
            None => error,
            Some(failure) => stopped_part_way(
                table,
                &format!(
                    "failed part way ({error}), and taking back what it had done failed too \
                     ({failure})"
                ),
            ),
        }
    }
}

/// The error of a change to `table` that stopped half done (`what` says how):
/// [`EngineError::DatabaseFailed`], which `WriteScope::logged` turns into a stopped database
/// (a rollback's undo, into [`crate::database::Database::fail_rollback`]'s).
fn stopped_part_way(table: &str, what: &str) -> EngineError {
    EngineError::DatabaseFailed(format!("a change to table '{table}' {what}"))
}

fn storage_failure(error: BTreeError) -> EngineError {
    match error {
        BTreeError::PoolFull(full) => EngineError::PoolFull(full),
        other => EngineError::Storage(other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::{BATCH_BUFFER_RESERVE_MAX_BYTES, RowChange, prefix_end, reserve_for_batch};
    use crate::encoding::encode_key;
    use crate::{
        ColumnDef, DataType, Database, DatabaseOptions, IndexDef, TableDef, Uniqueness, Value,
    };

    /// A batch's buffer reserves room for its other rows by its first row's size, but never
    /// more than `BATCH_BUFFER_RESERVE_MAX_BYTES`: a 3.2M-row batch whose first row was long
    /// asked for 25 GB at once, and the failed allocation aborted the process.
    #[test]
    fn a_batch_reserves_at_most_the_cap_whatever_its_first_row() {
        let mut buffer = vec![7u8; 8_000];
        reserve_for_batch(&mut buffer, 10_000_000);
        assert!(buffer.capacity() <= 8_000 + BATCH_BUFFER_RESERVE_MAX_BYTES);
        assert!(buffer.capacity() >= 8_000 + BATCH_BUFFER_RESERVE_MAX_BYTES / 2);
        let mut small = vec![7u8; 100];
        reserve_for_batch(&mut small, 1_000);
        assert!(small.capacity() >= 100 * 1_000);
        let mut single = vec![7u8; 100];
        reserve_for_batch(&mut single, 1);
        assert_eq!(single.len(), 100);
    }

    /// Taking back an insert reads the row's value back from the tree; a row that is not
    /// there (a bug) fails with an error that names the table and the key, and changes
    /// nothing.
    #[test]
    fn the_delete_of_an_inserted_row_reads_its_value_or_names_the_missing_row() {
        let db = Database::create(DatabaseOptions::default()).unwrap();
        let table = db
            .create_table(
                TableDef::new("T")
                    .column(ColumnDef::new("K", DataType::Int).not_null())
                    .column(ColumnDef::new("V", DataType::VarChar(10)).not_null())
                    .clustered(IndexDef::new("PK", &["K"], Uniqueness::PrimaryKey)),
            )
            .unwrap();
        let session = db.session();
        let row = crate::InsertRow::new().set(0, 7).set(1, "seven");
        table.insert(&session, row).unwrap();
        let key = |k: i32| {
            let mut key = Vec::new();
            encode_key(&[DataType::Int], &[Value::Int(k)], &mut key).unwrap();
            key
        };
        let stored = table.clustered.tree(0).get(&key(7)).unwrap().unwrap();
        let delete = table.delete_of_inserted_row(0, key(7).into()).unwrap();
        assert_eq!(
            delete,
            RowChange::Delete {
                partition: 0,
                key: key(7).into(),
                old_value: stored.into(),
            }
        );
        let missing = table.delete_of_inserted_row(0, key(8).into()).unwrap_err();
        assert!(
            missing.to_string().contains(
                "internal error: table 'T': the row with clustered key (8) that the \
                 transaction inserted into partition 0 is not there to take back"
            ),
            "{missing}"
        );
        assert_eq!(table.row_count(), 1);
    }

    /// Replay raises a table's identity once per log record: past the farthest value the
    /// record's rows hold, whichever row holds it, for ascending and descending identities.
    #[test]
    fn recovered_identities_raise_the_counter_past_the_farthest_value_of_a_record() {
        let db = Database::create(DatabaseOptions::default()).unwrap();
        for (name, increment, values, restart) in
            [("Up", 1, [5, 9, 7], 10), ("Down", -1, [-5, -9, -7], -10)]
        {
            let table = db
                .create_table(
                    TableDef::new(name)
                        .column(ColumnDef::new("Id", DataType::Int).identity(increment, increment))
                        .clustered(IndexDef::new("PK", &["Id"], Uniqueness::PrimaryKey)),
                )
                .unwrap();
            let changes: Vec<RowChange> = values
                .iter()
                .map(|&value| {
                    let mut key = Vec::new();
                    encode_key(&[DataType::Int], &[Value::Int(value)], &mut key).unwrap();
                    RowChange::Insert {
                        partition: 0,
                        key: key.into(),
                        value: Vec::new().into(),
                    }
                })
                .collect();
            table.note_recovered_identities(&changes).unwrap();
            let identity = table.identity.as_ref().unwrap();
            assert_eq!(identity.restart_value(), restart, "{name}");
        }
    }

    #[test]
    fn prefix_end_is_the_next_string_after_every_extension() {
        assert_eq!(prefix_end(&[1, 2]), Some(vec![1, 3]));
        assert_eq!(prefix_end(&[1, 0xFF]), Some(vec![2]));
        assert_eq!(prefix_end(&[0xFF, 0xFF]), None);
        assert_eq!(prefix_end(&[]), None);
    }
}

#[cfg(test)]
pub(crate) mod test_tables {
    use std::sync::Arc;
    use std::time::Duration;

    use crate::{
        ColumnDef, DataType, Database, DatabaseOptions, IndexDef, Table, TableDef, Uniqueness,
    };

    /// An in-memory database whose lock requests wait at most `lock_timeout`, holding
    /// `T(K INT PRIMARY KEY, U INT NOT NULL)` with an index on U of `uniqueness` (named
    /// `UX_U` if unique, `IX_U` if not): the smallest table whose rows have entries in a
    /// second index, for the unit tests of index lookups and their locks.
    pub(crate) fn k_u_table(
        lock_timeout: Option<Duration>,
        uniqueness: Uniqueness,
    ) -> (Database, Arc<Table>) {
        k_u_table_in(
            DatabaseOptions {
                lock_timeout,
                ..DatabaseOptions::default()
            },
            uniqueness,
        )
    }

    /// [`k_u_table`] in an in-memory database opened with `options`.
    pub(crate) fn k_u_table_in(
        options: DatabaseOptions,
        uniqueness: Uniqueness,
    ) -> (Database, Arc<Table>) {
        let db = Database::create(options).unwrap();
        let name = if uniqueness.is_unique() {
            "UX_U"
        } else {
            "IX_U"
        };
        let table = db
            .create_table(
                TableDef::new("T")
                    .column(ColumnDef::new("K", DataType::Int).not_null())
                    .column(ColumnDef::new("U", DataType::Int).not_null())
                    .clustered(IndexDef::new("PK", &["K"], Uniqueness::PrimaryKey))
                    .nonclustered(IndexDef::new(name, &["U"], uniqueness)),
            )
            .unwrap();
        (db, table)
    }
}

#[cfg(test)]
mod index_lookup_tests {
    use crate::{InsertRow, Uniqueness, Value};

    /// A lookup through a unique index found the entry of a row, and the row moved to another
    /// clustered key (its U unchanged) and committed before the lookup checked it: the
    /// lookup's pass must say to read the index again, where the entry now leads to the row at
    /// its new key. It skipped the row instead, as if it had been deleted, and the lookup
    /// returned nothing for a value a committed row held all along
    /// (`tests/update_model.rs`'s concurrent part found it; this is that interleaving, its
    /// steps run one after another). Then the same for a row whose unique value went to
    /// another row in one commit, and for a row read half way through such a swap.
    #[test]
    fn an_index_lookup_reads_again_when_a_row_moved_after_it_was_found() {
        let (db, table) = super::test_tables::k_u_table(None, Uniqueness::UniqueIndex);
        let (reader, writer) = (db.session(), db.session());
        let row = |k: i32| InsertRow::new().set(0, k).set(1, 10);
        table.insert(&writer, row(1)).unwrap();
        let index = table.index("UX_U").unwrap();
        let encoded = table
            .encode_lookup_key(index, &[Value::Int(10)])
            .unwrap()
            .unwrap();
        let candidates = table.index_candidates(index, &encoded).unwrap();
        assert_eq!(candidates.len(), 1);
        // The row moves (autocommit) between the index read and the check.
        assert!(
            table
                .update(&writer, &[Value::Int(1)], &[(0, Value::Int(2))])
                .unwrap()
        );
        let (rows, look_again) = table
            .committed_index_matches(&reader, index, &encoded, candidates)
            .unwrap();
        assert!(
            rows.is_empty(),
            "the row is no longer at the key the pass found"
        );
        assert!(
            look_again,
            "a row gone since the index was read must send the lookup back to the index"
        );
        // And the whole lookup finds it at its new key.
        let found = table
            .get_by_index(&reader, "UX_U", &[Value::Int(10)])
            .unwrap();
        assert_eq!(found, [vec![Value::Int(2), Value::Int(10)]]);

        // The same for a row whose U moved to another row in one commit: the pass read the
        // first row's entry, and the second row holds the value once the check comes.
        table
            .insert(&writer, InsertRow::new().set(0, 5).set(1, 20))
            .unwrap();
        let candidates = table.index_candidates(index, &encoded).unwrap();
        writer.begin().unwrap();
        for (k, u) in [(2, -1), (5, 10), (2, 20)] {
            assert!(
                table
                    .update(&writer, &[Value::Int(k)], &[(1, Value::Int(u))])
                    .unwrap()
            );
        }
        writer.commit().unwrap();
        let (rows, look_again) = table
            .committed_index_matches(&reader, index, &encoded, candidates)
            .unwrap();
        assert!(rows.is_empty());
        assert!(
            look_again,
            "a row changed since the index was read must send the lookup back to the index"
        );
        let found = table
            .get_by_index(&reader, "UX_U", &[Value::Int(10)])
            .unwrap();
        assert_eq!(found, [vec![Value::Int(5), Value::Int(10)]]);

        // That swap read half way: a change of a unique value puts the row's new entry in,
        // then its value, then takes its old entry out, so a lookup of U=20 could find row 5's
        // old entry (20 -> 5) together with its new value (U=10), which the swap then
        // committed as it was. Row 5 has no match for 20, and neither its value (unchanged
        // since the read) nor its lock (gone by the check) told the pass that row 2 took 20.
        let half_way = table.index_candidates(index, &encoded).unwrap();
        assert_eq!(half_way.len(), 1, "row 5, U=10");
        let twenty = table
            .encode_lookup_key(index, &[Value::Int(20)])
            .unwrap()
            .unwrap();
        let (rows, look_again) = table
            .committed_index_matches(&reader, index, &twenty, half_way)
            .unwrap();
        assert!(rows.is_empty());
        assert!(
            look_again,
            "a row found under a key its committed values do not have must send the lookup \
             back to the index"
        );
        let found = table
            .get_by_index(&reader, "UX_U", &[Value::Int(20)])
            .unwrap();
        assert_eq!(found, [vec![Value::Int(2), Value::Int(20)]]);
    }
}

#[cfg(test)]
mod find_locked_tests {
    use std::cell::Cell;
    use std::time::Duration;

    use crate::locks::{LockError, LockMode, TxnId};
    use crate::{EngineError, InsertRow, Uniqueness, Value};

    /// An update looks a row up, then locks it (and its unique keys) and reads it again; a row
    /// that another transaction changed or deleted and committed in between is looked up
    /// again. The locks of the version left behind used to stay until the transaction ended:
    /// here the unique key U=10 of a row changed to U=20, and the clustered key of a row
    /// deleted, both of which the transaction never read nor changed, blocked another session
    /// (error 1222 with a zero lock timeout) until the commit. The change happens at the
    /// seam `find_locked_with` offers, between the read and the lock requests, run one step
    /// after another.
    #[test]
    fn a_write_that_looks_again_keeps_no_lock_of_the_version_it_left() {
        let (db, table) =
            super::test_tables::k_u_table(Some(Duration::ZERO), Uniqueness::UniqueIndex);
        let (writer, changer, other) = (db.session(), db.session(), db.session());
        let row = |k: i32, u: i32| InsertRow::new().set(0, k).set(1, u);
        table.insert(&changer, row(1, 10)).unwrap();
        table.insert(&changer, row(2, 30)).unwrap();
        let timed_out = |result: Result<(), EngineError>| {
            matches!(result, Err(EngineError::Lock(LockError::Timeout { .. })))
        };
        writer.begin().unwrap();

        // Row 1 changes from U=10 to U=20 after the writer read it.
        let first_read = Cell::new(true);
        let found = writer
            .write(&table, |scope| {
                table.find_locked_with(scope, &[Value::Int(1)], || {
                    if first_read.replace(false) {
                        let changed =
                            table.update(&changer, &[Value::Int(1)], &[(1, Value::Int(20))]);
                        assert!(changed.unwrap());
                    }
                })
            })
            .unwrap()
            .expect("the row is there");
        assert_eq!(
            table.decode_record(&found.1, &found.2).unwrap(),
            [Value::Int(1), Value::Int(20)]
        );
        // U=10 is free: the writer holds nothing of the version it left.
        table.insert(&other, row(3, 10)).unwrap();
        // The version found stays locked: its clustered key and its unique key.
        assert!(timed_out(table.insert(&other, row(4, 20)).map(drop)));
        assert!(timed_out(
            table
                .update(&other, &[Value::Int(1)], &[(1, Value::Int(21))])
                .map(drop)
        ));

        // Row 2 is deleted after the writer read it: the writer finds nothing, and keeps no
        // lock of the row it read (nor of its unique key, U=30).
        let first_read = Cell::new(true);
        let found = writer
            .write(&table, |scope| {
                table.find_locked_with(scope, &[Value::Int(2)], || {
                    if first_read.replace(false) {
                        assert!(table.delete(&changer, &[Value::Int(2)]).unwrap());
                    }
                })
            })
            .unwrap();
        assert!(found.is_none());
        table.insert(&other, row(2, 30)).unwrap();

        writer.commit().unwrap();
        let reader = db.session();
        let rows: Vec<_> = [1, 2, 3]
            .into_iter()
            .map(|k| table.get(&reader, &[Value::Int(k)]).unwrap())
            .collect();
        assert_eq!(
            rows,
            [
                Some(vec![Value::Int(1), Value::Int(20)]),
                Some(vec![Value::Int(2), Value::Int(30)]),
                Some(vec![Value::Int(3), Value::Int(10)]),
            ]
        );
    }

    /// An update whose lock requests time out part-way keeps none of the locks it got. Here
    /// another transaction holds the lock of the row's unique key U=10 but not of its clustered
    /// key: the writer gets the clustered key K=1, then times out on U=10 (error 1222). Its
    /// transaction goes on, and the clustered key it got used to stay locked until the end,
    /// blocking every other session's change to row 1 although the writer changed nothing.
    #[test]
    fn a_write_whose_lock_requests_time_out_part_way_keeps_none_of_them() {
        let (db, table) =
            super::test_tables::k_u_table(Some(Duration::ZERO), Uniqueness::UniqueIndex);
        let (writer, other) = (db.session(), db.session());
        let row = |k: i32, u: i32| InsertRow::new().set(0, k).set(1, u);
        table.insert(&other, row(1, 10)).unwrap();
        let (_, record_key, value) = table
            .find_record_waiting(&other, None, &[Value::Int(1)])
            .unwrap()
            .0
            .expect("the row is there");
        let [_, unique] = &table.row_lock_keys(&record_key, &value).unwrap()[..] else {
            panic!("a row of T(K, U UNIQUE) has two lock keys");
        };
        // A transaction that is not a session's: it holds only the unique key's lock.
        let holder = TxnId(u64::MAX >> 1);
        db.locks()
            .acquire(holder, unique, LockMode::Exclusive, None)
            .unwrap();

        writer.begin().unwrap();
        let update = table.update(&writer, &[Value::Int(1)], &[(1, Value::Int(20))]);
        assert!(
            matches!(update, Err(EngineError::Lock(LockError::Timeout { .. }))),
            "{update:?}"
        );
        // The writer's transaction is still open and holds no lock of row 1: once the holder
        // is gone, another session changes the row (with a zero lock timeout).
        db.locks().release_all(holder, std::slice::from_ref(unique));
        assert!(
            table
                .update(&other, &[Value::Int(1)], &[(1, Value::Int(30))])
                .unwrap()
        );
        writer.commit().unwrap();
        assert_eq!(
            table.get(&db.session(), &[Value::Int(1)]).unwrap(),
            Some(vec![Value::Int(1), Value::Int(30)])
        );
    }
}
