//! Recovery: replaying the logical log onto the last checkpoint image.
//!
//! The image holds exactly the effect of every log record before its checkpoint LSN (writers
//! change the trees and append their record inside the checkpoint gate, which the checkpoint
//! holds exclusively while it captures the pages). Recovery reads the log once, from the
//! first record of the oldest transaction active at the checkpoint, and then, only if some
//! transaction never ended, goes back over it:
//!
//! - A row change at or after the checkpoint LSN is applied as it is read, whatever becomes of
//!   its transaction (repeating history, as ARIES does). An aborted transaction's rollback is in
//!   the log as compensating changes, so applying everything nets it out.
//! - A row change before the checkpoint LSN is already in the image.
//! - Transactions with no commit or abort record at the end of the log are losers: all their
//!   changes are in the trees now, and they are undone, newest first, read back from the log a
//!   chunk at a time ([`read_newest_first`]).
//!
//! Nothing is held per change, so a transaction of any size is recovered in bounded memory (a
//! log position per [`lastpage_storage::limits::WAL_READ_BACK_CHUNK_BYTES`] of changes read,
//! and a transaction id per transaction open). Applying changes in log order is safe because
//! a transaction holds exclusive locks on every row it changes until its commit or abort
//! record is appended, so two transactions' changes to the same row are in the log in the
//! order they were made, and changes to different rows commute.
//!
//! Every insert record raises its table's identity counter above the value it holds, whether
//! or not its transaction committed, and every identity reservation raises it past the values
//! the reservation covers: an identity value is never handed out twice (see `identity.rs`).
//!
//! The log's end is the first record that fails its checksum or is cut short (a torn tail).

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use lastpage_io::FileSystem;
use lastpage_storage::limits::MAX_TXN_ID;
use lastpage_storage::wal::{LogReader, Lsn, RawRecord, ReadBackMarks, Record, read_newest_first};

use crate::catalog::{Catalog, CatalogEntry, insert_path_of_tag, insert_path_tag, table_name_key};
use crate::database::Database;
use crate::error::{EngineError, Result};
use crate::schema::IndexOptions;
use crate::table::{RowChange, Table};

/// What recovery did when a durable database was opened.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RecoveryStats {
    /// Where reading started.
    pub log_start: u64,
    /// The log's end (where new records go).
    pub log_end: u64,
    /// Bytes of log read.
    pub log_bytes: u64,
    /// Log records read.
    pub records: u64,
    /// Row changes and schema changes read at or after the checkpoint's LSN: what the image
    /// does not hold. (Records before it were read only to undo transactions open at the
    /// checkpoint; commits, aborts and identity reservations after it change no row.)
    pub changes_after_checkpoint: u64,
    /// Transactions whose changes after the checkpoint were applied.
    pub committed_txns: u64,
    /// Transactions that never ended, whose changes were undone.
    pub loser_txns: u64,
    /// Row changes applied.
    pub redone_changes: u64,
    /// Row changes undone.
    pub undone_changes: u64,
    /// Reading and applying the log.
    pub replay_duration: Duration,
    /// Pages written back to the data file while the log was replayed (so that the checkpoint
    /// ending recovery need not write them).
    pub pages_written_during_replay: u64,
    /// The checkpoint that ends recovery, in microseconds.
    pub checkpoint_us: u64,
    /// All of opening the database.
    pub duration: Duration,
}

/// Schema-record tags (the first byte of a `Schema` record's description).
const SCHEMA_CREATE: u8 = 1;
const SCHEMA_DROP: u8 = 2;
const SCHEMA_INDEX_OPTIONS: u8 = 3;

/// The description of a created table, for its `Schema` record.
pub(crate) fn describe_create(entry: &CatalogEntry) -> Result<Vec<u8>> {
    // The catalog format checks its ids against its counters; the counters of a one-table
    // description are the ones just above the table's ids.
    let next_index_id = entry.index_ids().max().map_or(1, |max| max + 1);
    let catalog = Catalog {
        format_version: crate::catalog::CATALOG_FORMAT_VERSION,
        next_table_id: entry.table_id + 1,
        next_index_id,
        next_txn_id: 1,
        checkpoint_lsn: 0,
        oldest_active_lsn: 0,
        clean_shutdown: false,
        tables: vec![entry.clone()],
        dropped_trees: Vec::new(),
    };
    let mut description = vec![SCHEMA_CREATE];
    description.extend_from_slice(&catalog.encode()?);
    Ok(description)
}

/// The description of a dropped table, for its `Schema` record.
pub(crate) fn describe_drop(table_id: u32) -> Vec<u8> {
    let mut description = vec![SCHEMA_DROP];
    description.extend_from_slice(&table_id.to_le_bytes());
    description
}

/// The description of an index's changed run-time options, for its `Schema` record: the
/// table id (u32), the index's position among the table's indexes (u32: the clustered index,
/// which a heap has too, is 0, the nonclustered ones follow in order), the insert path (the
/// catalog's tag byte) and OPTIMIZE_FOR_SEQUENTIAL_KEY (a bool byte). The latch policy cannot
/// change.
pub(crate) fn describe_index_options(
    table_id: u32,
    position: u32,
    options: &IndexOptions,
) -> Vec<u8> {
    let mut description = vec![SCHEMA_INDEX_OPTIONS];
    description.extend_from_slice(&table_id.to_le_bytes());
    description.extend_from_slice(&position.to_le_bytes());
    description.push(insert_path_tag(options.insert_path));
    description.push(u8::from(options.optimize_for_sequential_key));
    description
}

/// Replays the log in `wal_dir` onto `db`, which holds the checkpoint image's tables.
pub(crate) fn replay(
    db: &Database,
    fs: Arc<dyn FileSystem>,
    wal_dir: &Path,
    catalog: Option<&Catalog>,
) -> Result<RecoveryStats> {
    let started = Instant::now();
    let checkpoint_lsn = catalog.map_or(0, |catalog| catalog.checkpoint_lsn);
    let start = catalog.map_or(0, |catalog| catalog.oldest_active_lsn.min(checkpoint_lsn));
    let storage = |error: lastpage_storage::wal::WalError| EngineError::Storage(error.to_string());
    let mut reader = LogReader::open(Arc::clone(&fs), wal_dir, Lsn(start)).map_err(storage)?;
    let mut stats = RecoveryStats {
        log_start: start,
        ..RecoveryStats::default()
    };
    let mut trees = tree_map(db);
    let mut tables = table_map(db);
    // Transactions with a row change read and no commit or abort record yet.
    let mut open: HashSet<u64> = HashSet::new();
    // Every row change is noted, so that those of the transactions that turn out never to
    // have ended can be read back newest first to be undone, a chunk at a time.
    let mut marks = ReadBackMarks::default();
    while let Some(raw) = reader.next_raw().map_err(storage)? {
        stats.records += 1;
        let lsn = raw.lsn.0;
        // The row changes of the record keep ranges of its bytes rather than copies.
        let payload = Arc::new(raw.payload);
        let record = RawRecord::decode_payload(raw.lsn, raw.kind, &payload).map_err(storage)?;
        if let Some(txn) = record.txn() {
            if txn.0 >= MAX_TXN_ID {
                return Err(corrupt(
                    lsn,
                    format!(
                        "a record of transaction {}, beyond any id the database hands out",
                        txn.0
                    ),
                ));
            }
            db.saw_txn_id(txn.0);
        }
        match record {
            Record::Insert { txn, index_id, .. }
            | Record::InsertRun { txn, index_id, .. }
            | Record::Delete { txn, index_id, .. }
            | Record::Update { txn, index_id, .. } => {
                if lsn >= checkpoint_lsn {
                    stats.changes_after_checkpoint += 1;
                }
                let Some((table, partition)) = trees.get(&index_id).cloned() else {
                    // A table dropped later in the log: nothing of it survives.
                    continue;
                };
                open.insert(txn.0);
                marks.note(raw.lsn, payload.len() as u64);
                let changes = RowChange::from_record(partition, record, &payload)?;
                table.note_recovered_identities(&changes)?;
                table.note_recovered_uniquifiers(&changes);
                if lsn >= checkpoint_lsn {
                    table.apply_changes(&changes).map_err(|error| {
                        corrupt(lsn, format!("replaying a logged change failed: {error}"))
                    })?;
                    stats.redone_changes += changes.len() as u64;
                }
            }
            Record::Commit { txn } | Record::Abort { txn } if open.remove(&txn.0) => {
                stats.committed_txns += 1;
            }
            Record::IdentityReserve { table_id, up_to } => {
                // A reservation of a table dropped later in the log names no table here.
                if let Some(table) = tables.get(&table_id) {
                    table.raise_identity_past(up_to);
                }
            }
            Record::Schema { description } if lsn >= checkpoint_lsn => {
                stats.changes_after_checkpoint += 1;
                apply_schema(db, &description, lsn)?;
                trees = tree_map(db);
                tables = table_map(db);
            }
            _ => {}
        }
    }
    if !open.is_empty() {
        stats.loser_txns = open.len() as u64;
        undo_losers(
            &fs,
            wal_dir,
            &marks,
            reader.position(),
            &open,
            &trees,
            &mut stats,
        )?;
    }
    stats.log_end = reader.position().0;
    stats.log_bytes = stats.log_end.saturating_sub(start);
    stats.replay_duration = started.elapsed();
    Ok(stats)
}

/// Undoes the row changes of the transactions in `losers` (which never ended), newest first,
/// reading them back from the log up to `end` a chunk at a time: every one of them is in the
/// trees by now (in the image, or replayed), and what their rollback would have done is what
/// undoing them does. A loser that rolled back statements has their compensations in the log
/// too; undoing those puts the statements' changes back, and undoing the changes, older, takes
/// them out again. Changes to tables dropped later in the log are skipped: nothing of those
/// tables survives.
fn undo_losers(
    fs: &Arc<dyn FileSystem>,
    wal_dir: &Path,
    marks: &ReadBackMarks,
    end: Lsn,
    losers: &HashSet<u64>,
    trees: &HashMap<u32, (Arc<Table>, usize)>,
    stats: &mut RecoveryStats,
) -> Result<()> {
    let storage = |error: lastpage_storage::wal::WalError| EngineError::Storage(error.to_string());
    let loser_change = |record: &Record<'_>| match record {
        Record::Insert { txn, index_id, .. }
        | Record::InsertRun { txn, index_id, .. }
        | Record::Delete { txn, index_id, .. }
        | Record::Update { txn, index_id, .. } => losers
            .contains(&txn.0)
            .then(|| trees.get(index_id))
            .flatten(),
        _ => None,
    };
    read_newest_first(
        fs,
        wal_dir,
        marks,
        end,
        |raw| Ok(loser_change(&raw.decode().map_err(storage)?).is_some()),
        |raw| {
            let lsn = raw.lsn;
            let payload = Arc::new(raw.payload);
            let record = RawRecord::decode_payload(lsn, raw.kind, &payload).map_err(storage)?;
            let Some((table, partition)) = loser_change(&record) else {
                return Ok(());
            };
            let changes = RowChange::from_record(*partition, record, &payload)?;
            for change in changes.into_iter().rev() {
                table
                    .apply_change(&change.into_inverse())
                    .map_err(|error| {
                        corrupt(
                            lsn.0,
                            format!("undoing an uncommitted change failed: {error}"),
                        )
                    })?;
                stats.undone_changes += 1;
            }
            Ok(())
        },
    )
}

fn corrupt(lsn: u64, reason: String) -> EngineError {
    EngineError::Storage(format!(
        "recovery cannot continue at log position {lsn}: {reason}"
    ))
}

/// Every table by its id (identity reservations name tables).
fn table_map(db: &Database) -> HashMap<u32, Arc<Table>> {
    db.tables()
        .into_iter()
        .map(|table| (table.id(), table))
        .collect()
}

/// Every tree's index id, mapped to its table and partition (log records name trees).
fn tree_map(db: &Database) -> HashMap<u32, (Arc<Table>, usize)> {
    let mut map = HashMap::new();
    for table in db.tables() {
        for (partition, tree) in table.clustered_trees().iter().enumerate() {
            map.insert(tree.index_id(), (Arc::clone(&table), partition));
        }
    }
    map
}

/// Refuses a create-table record whose table id, index ids or name a live table already uses.
/// Ids only grow, so a real log never names one twice; a forged record that did would have the
/// replay send the live table's logged changes to whichever table its id map held last. And a
/// real log drops a table before it creates another of the same name; a forged record that
/// did not would replace the live table, and its rows with it.
fn refuse_ids_in_use(db: &Database, entry: &CatalogEntry, lsn: u64) -> Result<()> {
    let created: std::collections::HashSet<u32> = entry.index_ids().collect();
    let name = table_name_key(&entry.definition.name);
    for table in db.tables() {
        if table_name_key(table.name()) == name {
            return Err(corrupt(
                lsn,
                format!(
                    "a create-table record for table '{}' reuses the name of live table '{}'",
                    entry.definition.name,
                    table.name()
                ),
            ));
        }
        let mut clashes = Vec::new();
        if table.id() == entry.table_id {
            clashes.push(format!("table id {}", entry.table_id));
        }
        let mut shared: Vec<u32> = table
            .index_ids()
            .filter(|id| created.contains(id))
            .collect();
        shared.sort_unstable();
        if !shared.is_empty() {
            clashes.push(format!("index ids {shared:?}"));
        }
        if !clashes.is_empty() {
            return Err(corrupt(
                lsn,
                format!(
                    "a create-table record for table '{}' names {}, which live table '{}' \
                     already uses",
                    entry.definition.name,
                    clashes.join(" and "),
                    table.name()
                ),
            ));
        }
    }
    Ok(())
}

fn apply_schema(db: &Database, description: &[u8], lsn: u64) -> Result<()> {
    match description.split_first() {
        Some((&SCHEMA_CREATE, rest)) => {
            // The description's own check refuses ids it names twice.
            let catalog = Catalog::decode(rest).map_err(|error| {
                corrupt(lsn, format!("a malformed create-table record: {error}"))
            })?;
            for entry in &catalog.tables {
                refuse_ids_in_use(db, entry, lsn)?;
                db.recreate_table(entry)?;
            }
            Ok(())
        }
        Some((&SCHEMA_DROP, rest)) => {
            let id = rest
                .try_into()
                .map(u32::from_le_bytes)
                .map_err(|_| corrupt(lsn, "a malformed drop-table record".into()))?;
            db.forget_table(id);
            Ok(())
        }
        Some((&SCHEMA_INDEX_OPTIONS, rest)) => {
            let malformed = || corrupt(lsn, "a malformed index-options record".into());
            let &[t0, t1, t2, t3, p0, p1, p2, p3, path, flow_control] = rest else {
                return Err(malformed());
            };
            let table_id = u32::from_le_bytes([t0, t1, t2, t3]);
            let position = u32::from_le_bytes([p0, p1, p2, p3]);
            let insert_path = insert_path_of_tag(path).map_err(|_| malformed())?;
            let optimize_for_sequential_key = match flow_control {
                0 => false,
                1 => true,
                _ => return Err(malformed()),
            };
            // A table dropped later in the log is not here; nothing to change then.
            let Some(table) = db.tables().into_iter().find(|table| table.id() == table_id) else {
                return Ok(());
            };
            let position = usize::try_from(position).map_err(|_| malformed())?;
            table
                .apply_index_options(position, insert_path, optimize_for_sequential_key)
                .map_err(|error| corrupt(lsn, error.to_string()))
        }
        _ => Err(corrupt(lsn, "an unknown schema record".into())),
    }
}
