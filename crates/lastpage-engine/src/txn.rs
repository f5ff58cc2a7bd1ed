//! Transactions: autocommit and explicit, statement atomicity, undo, logging and commit.
//!
//! Every write runs inside a `WriteScope`: the session's explicit transaction if it has one,
//! otherwise an autocommit transaction that commits (or rolls back) when the statement ends.
//! A write follows one protocol, whatever the operation:
//!
//! 1. Row locks first (`WriteScope::lock_row`), outside every latch and outside the
//!    checkpoint gate, because they can wait. The exception is a key that did not exist
//!    before (an identity key the tree makes, or a batch's range of them): a `FreshLocker`
//!    locks it inside the gate, under the latch of the leaf it goes on, since such a lock
//!    never waits. An in-memory database's autocommit insert of fresh keys into a table
//!    without nonclustered indexes takes no lock at all (`WriteScope::needs_locks`).
//! 2. Then, inside the checkpoint gate (shared), the change to the trees and its log record
//!    (`WriteScope::logged`), so that a checkpoint sees either both or neither.
//! 3. The change joins the transaction's undo list. Rolling back applies the inverse changes
//!    in reverse order, and logs them too (compensation), so the log replays a rolled-back
//!    statement inside a transaction that later commits to its net effect. An insert's entry
//!    keeps the row's partition and clustered key but not its value, which undoing the insert
//!    reads back from the tree (see `UndoChange`).
//!    An explicit transaction in a durable database keeps at most
//!    [`UNDO_KEPT_ENTRIES`] entries between statements: past that, its changes to logged
//!    tables leave the list, and its rollback undoes them from the log, reading its own records
//!    back newest first (see `Spilled`). A transaction of any size then holds a bounded
//!    amount of memory for its undo.
//! 4. Commit appends a commit record, waits for it to be durable when the durability is FULL,
//!    and only then releases the locks: nobody reads a row before its commit is on disk. A
//!    pipelined commit ([`Session::commit_pipelined`]) releases them at once, as a DELAYED one
//!    does, and leaves the wait to its [`CommitTicket`].

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

#[cfg(doc)]
use lastpage_storage::limits::UNDO_KEPT_ENTRIES;
use lastpage_storage::limits::{WAL_INSERT_RUN_MAX_BYTES, WAL_RECORD_HEADER_BYTES};
use lastpage_storage::scratch::with_scratch;
use lastpage_storage::stats::{self, WaitAccumulator};
use lastpage_storage::sync::{AtomicBool, AtomicU64, Ordering};
use lastpage_storage::wal::{Lsn, RawRecord, ReadBackMarks, Record, TxnId};

use crate::database::{Database, Session};
use crate::error::{EngineError, Result};
use crate::locks::{LockKey, LockMode, TxnLocks};
use crate::row_bytes::RowBytes;
use crate::table::{RowChange, Table};

/// When a commit returns, relative to its log record reaching the disk. (Changes to a table
/// created with [`crate::TableDef::not_logged`] are not logged at all, whatever this says.)
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Durability {
    /// The commit returns once its log record is on disk (SQL Server's full durability).
    #[default]
    Full,
    /// The commit returns at once; the log is flushed in the background within
    /// [`crate::DatabaseOptions::delayed_flush_interval`] and by [`Database::flush_log`]
    /// (SQL Server's delayed durability). A crash loses at most that window of commits.
    Delayed,
}

impl Durability {
    /// The name used on the command line: `full` or `delayed`.
    pub fn name(self) -> &'static str {
        match self {
            Durability::Full => "full",
            Durability::Delayed => "delayed",
        }
    }
}

/// A transaction committed by [`Session::commit_pipelined`], whose commit record may not be on
/// disk yet.
#[must_use = "a pipelined commit is acknowledged only by waiting for its ticket"]
pub struct CommitTicket {
    db: Database,
    /// The committing session's wait statistics: the ticket's WRITELOG wait is the session's,
    /// whichever thread waits on it.
    session_waits: Arc<WaitAccumulator>,
    /// End LSN of the commit record, or `None` if the transaction logged nothing (or the
    /// database is in memory): then there is nothing to wait for.
    end: Option<Lsn>,
}

impl std::fmt::Debug for CommitTicket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CommitTicket")
            .field("end", &self.end)
            .field("durable", &self.is_durable())
            .finish()
    }
}

impl CommitTicket {
    /// Waits until the commit is durable (WRITELOG, if it has to wait). Fails if the log could
    /// not be made durable up to the commit: the commit then must not be acknowledged, and the
    /// database refuses further work until it is reopened.
    pub fn wait(self) -> Result<()> {
        let _attribution = stats::attribute_waits_to(Arc::clone(&self.session_waits));
        match (self.end, self.db.wal()) {
            (Some(end), Some(wal)) => wal.wait_durable(end).map_err(|error| self.db.fail(error)),
            _ => Ok(()),
        }
    }

    /// Whether the commit is durable already (a wait would return at once).
    pub fn is_durable(&self) -> bool {
        match (self.end, self.db.wal()) {
            (Some(end), Some(wal)) => wal.durable_lsn() >= end,
            _ => true,
        }
    }
}

/// One change a transaction made, as it would be undone.
pub(crate) struct UndoEntry {
    /// The table, or `None` for the table of the statement in progress: an autocommit
    /// statement that succeeds then never touches the table's reference count, which every
    /// session would otherwise increment and decrement on every row.
    table: Option<Arc<Table>>,
    change: UndoChange,
}

/// A change as the undo list keeps it: what undoing it needs, which for an insert is less than
/// what its log record holds.
///
/// An insert keeps its partition and clustered key only. Its value was half or more of what a
/// large transaction held per inserted row, and undoing the insert does not need a copy of it:
/// the value is read back from the tree when the insert is undone
/// ([`Table::delete_of_inserted_row`] says why the tree then holds exactly the inserted
/// value). The log record, written before the change joins the undo list, still gets the value.
///
/// Updates and deletes keep the whole change, as their old values are what undoing them puts
/// back; it is boxed so that every entry takes the room of an insert's (with the entry's table,
/// 48 bytes rather than 112 inline, in a list that doubles as it grows), at the cost of one
/// allocation per update or delete, next to the several such a change makes anyway.
enum UndoChange {
    /// A row was inserted into `partition` with clustered key `key`.
    Insert { partition: usize, key: RowBytes },
    /// Any other change, as it was logged.
    Other(Box<RowChange>),
}

impl From<RowChange> for UndoChange {
    fn from(change: RowChange) -> UndoChange {
        match change {
            RowChange::Insert { partition, key, .. } => UndoChange::Insert { partition, key },
            other => UndoChange::Other(Box::new(other)),
        }
    }
}

thread_local! {
    /// The changes of the statement in progress, between being made and joining the undo list
    /// (see [`WriteScope::logged`]), kept for the thread's next statement.
    static STAGED_CHANGES: Cell<Vec<RowChange>> = const { Cell::new(Vec::new()) };
}

/// Up to how many bytes of staged changes' room a thread keeps for its next statement (a large
/// batch's is freed).
const STAGED_CHANGES_KEPT_BYTES: usize = 64 << 10;

/// A transaction in progress.
pub(crate) struct Transaction {
    pub(crate) id: TxnId,
    /// Started by `begin` (true) or by a statement outside one (false).
    explicit: bool,
    durability: Durability,
    /// End LSN of the transaction's last log record, if it wrote any.
    last_lsn: Option<Lsn>,
    undo: Vec<UndoEntry>,
    locks: TxnLocks,
    /// Tables in which the transaction noted rows it deleted (see `pending.rs`), to be cleared
    /// when it ends.
    deleted_from: Vec<Arc<Table>>,
    /// The position in `undo` of the explicit transaction's first change to a table that is not
    /// logged (in a durable database), while such a change is still in the list: what sets
    /// and clears its session's [`ActiveSlot::unlogged_changes`].
    unlogged_undo_from: Option<usize>,
    /// Where the explicit transaction's log records are, to read them back (see [`Spilled`]).
    /// An autocommit transaction notes none: it never lets an undo entry go.
    log_marks: ReadBackMarks,
    /// The tables the explicit transaction's log records are for, kept to find the tables its
    /// records name when it undoes them from the log (see [`Spilled`]). Every logged change
    /// counts, not only those in the undo list: a statement rolled back has its changes and
    /// their compensations in the log, and undoing the transaction from the log undoes them too.
    logged_tables: Vec<Arc<Table>>,
    /// The changes that left the undo list, if any did.
    spilled: Option<Spilled>,
}

/// Changes a large explicit transaction let go from its undo list; its rollback undoes them from
/// the log.
///
/// Between statements, once the list holds [`UNDO_KEPT_ENTRIES`] entries
/// (`DatabaseOptions::undo_kept_entries`), all of them go, leaving only this: how far the
/// transaction's log records then reached (the tables they changed are in
/// `Transaction::logged_tables`). Every change the transaction made before that point is in the
/// log, and so is every compensation of a statement it rolled back (a statement's rollback is
/// over before the next statement starts).
/// Rolling the transaction back, once the list's own entries are undone, undoes every row
/// change the transaction logged before `end`, newest first, compensations included: undoing a
/// compensation puts a rolled-back statement's change back, and undoing that change, older,
/// takes it out again; recovery undoes a transaction that never ended the same way. The
/// records are read back a chunk at a time ([`ReadBackMarks`]), so the rollback holds a bounded
/// amount of memory too; they stay in the log while the transaction is active (a checkpoint
/// truncates the log only before the oldest active transaction's first record).
///
/// Only a transaction whose list holds changes to logged tables alone lets entries go: a change
/// to a table that is not logged can be undone only from the list.
struct Spilled {
    /// The end of the transaction's last log record when its entries last left the list.
    end: Lsn,
}

/// Counters of undo entries let go and changes undone from the log (see [`Spilled`]).
#[derive(Default)]
pub(crate) struct UndoCounters {
    spills: AtomicU64,
    entries_spilled: AtomicU64,
    undone_from_log: AtomicU64,
}

impl UndoCounters {
    pub(crate) fn snapshot(&self) -> UndoStats {
        UndoStats {
            spills: self.spills.load(Ordering::Relaxed),
            entries_spilled: self.entries_spilled.load(Ordering::Relaxed),
            undone_from_log: self.undone_from_log.load(Ordering::Relaxed),
        }
    }
}

/// What large transactions did with their undo lists since the database was opened
/// ([`Database::undo_stats`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UndoStats {
    /// Times a transaction let the entries of its undo list go.
    pub spills: u64,
    /// Undo entries let go.
    pub entries_spilled: u64,
    /// Row changes rollbacks undid by reading them back from the log.
    pub undone_from_log: u64,
}

/// A session's slot in the database's table of active transactions: the LSN of the first log
/// record of the session's current transaction, or [`NO_ACTIVE_LSN`]. A checkpoint reads every
/// slot to know how far back recovery may have to undo.
pub(crate) struct ActiveSlot {
    pub(crate) first_lsn: AtomicU64,
    /// Whether the session's transaction changed a table that is not logged (in a durable
    /// database) and has not ended. Nothing in the log can undo such a change, so a clean
    /// shutdown's checkpoint taken meanwhile must not call its image clean (see
    /// `Database::close`). Set inside the checkpoint gate that the change holds: for an
    /// autocommit statement, which records no undo entries, before it changes anything; for an
    /// explicit transaction, once a statement has left an undo entry for such a table. Cleared
    /// when the transaction ends, or when a statement's rollback takes back the last such
    /// entry (a failed statement that left nothing does not count).
    pub(crate) unlogged_changes: AtomicBool,
}

/// The value of an [`ActiveSlot`] whose session has no transaction that wrote to the log.
pub(crate) const NO_ACTIVE_LSN: u64 = u64::MAX;

impl ActiveSlot {
    pub(crate) fn new() -> ActiveSlot {
        ActiveSlot {
            first_lsn: AtomicU64::new(NO_ACTIVE_LSN),
            unlogged_changes: AtomicBool::new(false),
        }
    }
}

/// Adds a handle of `table` to `tables` unless they hold it already, looking from the newest:
/// a transaction's statements usually go on with the table of the last one.
fn keep_table(tables: &mut Vec<Arc<Table>>, table: &Arc<Table>) {
    if !tables.iter().rev().any(|kept| Arc::ptr_eq(kept, table)) {
        tables.push(Arc::clone(table));
    }
}

/// The lock resource of `key` in index `ordinal` of `table` (0: the clustered index).
pub(crate) fn lock_key(table_id: u32, ordinal: usize, key: &[u8]) -> LockKey {
    // The index's ordinal and the key are assembled on the stack when they fit (the usual: an
    // encoded identity key is 5 or 9 bytes, 7 or 11 with the ordinal), and only a longer key
    // goes through a vector.
    const ON_STACK_BYTES: usize = 64;
    let ordinal = (ordinal as u16).to_be_bytes();
    let mut prefixed = [0u8; ON_STACK_BYTES];
    match prefixed.get_mut(2..2 + key.len()) {
        Some(tail) => {
            tail.copy_from_slice(key);
            prefixed[..2].copy_from_slice(&ordinal);
            LockKey::new(table_id, &prefixed[..2 + key.len()])
        }
        None => LockKey::new(table_id, [&ordinal[..], key].concat()),
    }
}

/// Locks clustered keys that did not exist before: an identity key the tree makes under the
/// latch of the leaf the row goes on (a sequence lane's leaf, or the last leaf), or the range
/// of a batch's fresh identity keys. Such a lock never waits (nobody else can name the key
/// yet), so taking it under a latch cannot deadlock, and taking it there hides the row from
/// readers from the first moment they could see it.
pub(crate) struct FreshLocker<'s> {
    db: &'s Database,
    /// The session's id, for the error of a lock that failed (which cannot happen, as such a
    /// lock never waits, but would name the session as any other lock error).
    process_id: u64,
    table_id: u32,
    taken: RefCell<TxnLocks>,
}

impl FreshLocker<'_> {
    /// Locks `key` (a clustered key) exclusively.
    pub(crate) fn lock(&self, key: &[u8]) -> Result<()> {
        self.taken
            .borrow_mut()
            .acquire_fresh(self.db.locks(), lock_key(self.table_id, 0, key))
            .map_err(|error| EngineError::from_lock(error, self.process_id))
    }

    /// Locks every clustered key from `low` to `high` (inclusive) exclusively with one range
    /// lock (see [`LockManager::lock_range`](crate::locks::LockManager::lock_range)): a batch's
    /// fresh identity keys, made under the last leaf's latch.
    pub(crate) fn lock_range(&self, low: &[u8], high: &[u8]) -> Result<()> {
        self.taken
            .borrow_mut()
            .acquire_range(
                self.db.locks(),
                &lock_key(self.table_id, 0, low),
                &lock_key(self.table_id, 0, high),
                None,
            )
            .map_err(|error| EngineError::from_lock(error, self.process_id))
    }
}

/// The transaction a write runs in, for the length of one statement.
pub(crate) struct WriteScope<'s> {
    session: &'s Session,
    /// The statement's table.
    table: &'s Arc<Table>,
    txn: &'s mut Transaction,
    /// Whether this statement's changes are logged (a durable database and a logged table).
    log_changes: bool,
}

impl<'s> WriteScope<'s> {
    /// Whether this write must take row locks. An in-memory database's autocommit insert of a
    /// key that contains a fresh identity value needs none: no other transaction can hold a
    /// lock on a key that did not exist, and the insert commits the moment it is applied.
    pub(crate) fn needs_locks(&self, fresh_key: bool) -> bool {
        self.txn.explicit || self.session.db().is_durable() || !fresh_key
    }

    /// Whether the changes made through this scope must be recorded (see [`Changes::push`]):
    /// to be logged, or to be undone if a later statement of the transaction rolls it back. An
    /// autocommit statement that is not logged can leave its changes out, however many rows
    /// it changes: nothing reads them once the statement has succeeded, and a failing
    /// statement cleans up after itself before it records anything.
    pub(crate) fn keeps_changes(&self) -> bool {
        self.txn.explicit || self.log_changes
    }

    /// The database, if the changes made through this scope are written to its log. It is
    /// the session's, not borrowed from the scope.
    pub(crate) fn logging_db(&self) -> Option<&'s Database> {
        self.log_changes.then(|| self.session.db())
    }

    /// Whether the changes made through this scope are written to the log.
    pub(crate) fn logs_changes(&self) -> bool {
        self.log_changes
    }

    /// Locks a row exclusively until the transaction ends, waiting (LCK_M_X) if another
    /// transaction holds it. `ordinal` says which index `key` belongs to (0 for the clustered
    /// index, `1 + n` for nonclustered index `n`). Must be called outside the checkpoint gate
    /// and every latch.
    pub(crate) fn lock_row(&mut self, table: &Table, ordinal: usize, key: &[u8]) -> Result<()> {
        self.lock(lock_key(table.id(), ordinal, key))
    }

    /// [`WriteScope::lock_row`] of a lock resource made already (by [`lock_key`]).
    pub(crate) fn lock(&mut self, key: LockKey) -> Result<()> {
        let db = self.session.db();
        self.txn
            .locks
            .acquire(db.locks(), key, LockMode::Exclusive, db.lock_timeout())
            .map_err(|error| self.session.lock_error(error))
    }

    /// How many locks the transaction holds (ranges count one each), to be passed to
    /// [`WriteScope::release_locks_taken_since`].
    pub(crate) fn locks_held(&self) -> usize {
        self.txn.locks.keys().len()
    }

    /// Releases the row locks taken since the transaction held `held` locks (see
    /// [`WriteScope::locks_held`]) that `keep` does not keep: those of a row version that a
    /// write locked and then left, because the version changed under its lock request (see
    /// [`crate::locks::TxnLocks::release_taken_since`]). Nothing may have been changed under
    /// them.
    pub(crate) fn release_locks_taken_since(
        &mut self,
        held: usize,
        keep: impl Fn(&LockKey) -> bool,
    ) {
        let db = self.session.db();
        self.txn.locks.release_taken_since(db.locks(), held, keep);
    }

    /// Locks every clustered key from `low` to `high` (inclusive) exclusively until the
    /// transaction ends, with one range lock (see [`crate::locks::LockManager::lock_range`]):
    /// for the fresh keys of a batch insert. Must be called outside the checkpoint gate and
    /// every latch, before any of the keys is inserted.
    pub(crate) fn lock_range(&mut self, table: &Table, low: &[u8], high: &[u8]) -> Result<()> {
        let db = self.session.db();
        self.txn
            .locks
            .acquire_range(
                db.locks(),
                &lock_key(table.id(), 0, low),
                &lock_key(table.id(), 0, high),
                db.lock_timeout(),
            )
            .map_err(|error| self.session.lock_error(error))
    }

    /// The session the statement runs in, and its transaction.
    pub(crate) fn reader(&self) -> (&'s Session, TxnId) {
        (self.session, self.txn.id)
    }

    /// Notes that this transaction is about to delete the clustered record `key` of
    /// `partition` from `table`, whose value is `value` as the statement found it (or to change
    /// it so that nonclustered entries of it go), so that lookups wait for the transaction
    /// instead of missing the row (see `pending.rs`; [`crate::pending::PendingDeletes::note`]
    /// says when `value` is not the committed one, and why that is safe). Must be called after
    /// the row is locked and before anything of it leaves a tree; the note lasts until the
    /// transaction ends. A transaction that holds the whole table (it escalated) notes the
    /// table once instead ([`crate::pending::PendingDeletes::note_whole_table`]).
    pub(crate) fn note_pending_delete(
        &mut self,
        table: &Arc<Table>,
        partition: usize,
        key: &[u8],
        value: &[u8],
    ) {
        let pending = table.pending_deletes();
        if self.txn.locks.has_escalated(table.id()) {
            pending.note_whole_table(self.txn.id);
        } else {
            pending.note(self.txn.id, partition, key, value);
        }
        keep_table(&mut self.txn.deleted_from, table);
    }

    /// A locker for clustered keys made under a leaf latch (see [`FreshLocker`]).
    pub(crate) fn fresh_locker(&self, table: &Table) -> FreshLocker<'s> {
        let session: &'s Session = self.session;
        FreshLocker {
            db: session.db(),
            process_id: session.id(),
            table_id: table.id(),
            taken: RefCell::new(TxnLocks::new(self.txn.id)),
        }
    }

    /// Makes the locks a [`FreshLocker`] took the transaction's.
    pub(crate) fn adopt_locks(&mut self, locker: FreshLocker<'_>) {
        self.txn.locks.absorb(locker.taken.into_inner());
    }

    /// Runs `apply` (which changes the trees and records what it changed in [`Changes`])
    /// inside the checkpoint gate and logs the changes before leaving it; the changes join the
    /// undo list.
    pub(crate) fn logged<T>(
        &mut self,
        table: &Arc<Table>,
        apply: impl FnOnce(&mut Changes<'_>) -> Result<T>,
    ) -> Result<T> {
        self.logged_and_kept(table, true, apply)
    }

    /// [`WriteScope::logged`], keeping the changes in the undo list only if `undoable`: not
    /// those of an undo (compensations), which are logged but never undone themselves.
    fn logged_and_kept<T>(
        &mut self,
        table: &Arc<Table>,
        undoable: bool,
        apply: impl FnOnce(&mut Changes<'_>) -> Result<T>,
    ) -> Result<T> {
        let session = self.session;
        let db = session.db();
        let _gate = db.enter_gate();
        db.check_not_closed()?;
        let unlogged = !self.log_changes && db.is_durable();
        if unlogged && !self.txn.explicit {
            session
                .active_slot()
                .unlogged_changes
                .store(true, Ordering::Release);
        }
        // The changes are staged as they were made, whole, because their log record needs
        // all of them (an insert's value too); only then do they join the undo list, in the
        // form undoing them needs (see `UndoChange`).
        with_scratch(&STAGED_CHANGES, STAGED_CHANGES_KEPT_BYTES, |staged| {
            let result = apply(&mut Changes { staged }).map_err(|error| match error {
                // A change that stopped half done (see `table::TakeBack`) stops the database
                // before the gate opens, so no checkpoint captures the half.
                EngineError::DatabaseFailed(message) => db.fail_change(message),
                other => other,
            });
            if staged.is_empty() {
                return result;
            }
            // Still inside the gate, so no checkpoint can capture the change without the mark.
            // (A compensation sets it at the position it would have had in the undo list, which
            // the end of its rollback finds past the list's end, and clears.)
            if unlogged && self.txn.explicit && self.txn.unlogged_undo_from.is_none() {
                self.txn.unlogged_undo_from = Some(self.txn.undo.len());
                session
                    .active_slot()
                    .unlogged_changes
                    .store(true, Ordering::Release);
            }
            // Changes made before a failure are logged and kept in the undo list too: the
            // statement's rollback undoes them with logged compensations. They join the list
            // even if their log record fails, as they did when the list held them while they
            // were logged.
            let logged = if self.log_changes {
                self.log(db, table, staged)
            } else {
                Ok(())
            };
            if undoable {
                self.keep_for_undo(table, staged);
            }
            logged?;
            result
        })
    }

    /// Moves a statement's `staged` changes (logged already, if they are logged) into the undo
    /// list, in the form undoing them needs (see [`UndoChange`]), leaving `staged` empty.
    fn keep_for_undo(&mut self, table: &Arc<Table>, staged: &mut Vec<RowChange>) {
        // An explicit transaction keeps its entries past the statement, so its batches' keys
        // are moved out of the buffer their rows' values share: the entries then keep only the
        // keys alive. An autocommit statement's entries go with it, buffer and all.
        if self.txn.explicit {
            pack_shared_insert_keys(staged);
        }
        let owner = (!Arc::ptr_eq(table, self.table)).then(|| Arc::clone(table));
        self.txn
            .undo
            .extend(staged.drain(..).map(|change| UndoEntry {
                table: owner.clone(),
                change: change.into(),
            }));
    }

    /// Logs a statement's changes.
    fn log(&mut self, db: &Database, table: &Arc<Table>, entries: &[RowChange]) -> Result<()> {
        let Some(wal) = db.wal() else {
            return Ok(());
        };
        let max_run_bytes = WAL_INSERT_RUN_MAX_BYTES.min(
            wal.max_record_bytes()
                .saturating_sub(WAL_RECORD_HEADER_BYTES),
        );
        if self.txn.explicit {
            keep_table(&mut self.txn.logged_tables, table);
        }
        let mut next = 0;
        while next < entries.len() {
            let (record, covered) = RowChange::next_log_record(
                entries[next..].iter(),
                self.txn.id,
                table,
                max_run_bytes,
            );
            next += covered;
            let (first, end) = wal.append_at(&record).map_err(|error| db.fail(error))?;
            if self.txn.explicit {
                self.txn.log_marks.note(first, record.payload_len() as u64);
            }
            if self.txn.last_lsn.is_none() {
                self.session
                    .active_slot()
                    .first_lsn
                    .store(first.0, Ordering::Release);
            }
            self.txn.last_lsn = Some(end);
        }
        Ok(())
    }
}

/// Where a write records the changes it made (see [`WriteScope::logged`]), to be logged and
/// then to join the transaction's undo list.
pub(crate) struct Changes<'a> {
    staged: &'a mut Vec<RowChange>,
}

impl Changes<'_> {
    /// Records a change.
    pub(crate) fn push(&mut self, change: RowChange) {
        self.staged.push(change);
    }
}

/// Gives the clustered keys of a batch's inserts, which are ranges of the one buffer that
/// holds all the batch's keys and values (see `RowBytes`), one buffer of their own: an undo
/// entry keeps an inserted row's key but not its value, and while any range of the batch's
/// buffer is kept, all of it is, values included. One allocation and a copy of the keys per
/// statement (against one per row had each key been copied alone) lets the buffer go once
/// the statement's changes are logged, or serve the thread's next batch.
fn pack_shared_insert_keys(changes: &mut [RowChange]) {
    let mut key_bytes = 0;
    let mut largest_buffer = 0;
    for change in changes.iter() {
        if let RowChange::Insert {
            key: RowBytes::Shared { buffer, range },
            ..
        } = change
        {
            key_bytes += range.len();
            largest_buffer = largest_buffer.max(buffer.len());
        }
    }
    // Nothing is gained when the keys are all their buffer holds: a batch at the tail makes
    // its keys in a buffer of their own.
    if key_bytes == 0 || key_bytes >= largest_buffer {
        return;
    }
    let mut keys = Vec::with_capacity(key_bytes);
    for change in changes.iter() {
        if let RowChange::Insert {
            key: key @ RowBytes::Shared { .. },
            ..
        } = change
        {
            keys.extend_from_slice(key);
        }
    }
    let keys = Arc::new(keys);
    let mut start = 0;
    for change in changes.iter_mut() {
        if let RowChange::Insert {
            key: key @ RowBytes::Shared { .. },
            ..
        } = change
        {
            let end = start + key.len();
            *key = RowBytes::shared(&keys, start..end);
            start = end;
        }
    }
}

impl Session {
    /// Begins an explicit transaction (BEGIN TRANSACTION) with the database's durability.
    pub fn begin(&self) -> Result<()> {
        self.begin_with(self.db().default_durability())
    }

    /// Begins an explicit transaction with a chosen durability (SQL Server's
    /// `COMMIT WITH (DELAYED_DURABILITY = ON)` chosen up front).
    pub fn begin_with(&self, durability: Durability) -> Result<()> {
        self.db().check_usable()?;
        let mut slot = self.txn_slot();
        if slot.is_some() {
            return Err(EngineError::Transaction(
                "a transaction is already open in this session; nested transactions are not \
                 supported"
                    .into(),
            ));
        }
        *slot = Some(
            self.db()
                .new_transaction(true, durability, self.take_spare_undo())?,
        );
        Ok(())
    }

    /// Whether an explicit transaction is open.
    pub fn in_transaction(&self) -> bool {
        self.txn_slot().is_some()
    }

    /// Commits the explicit transaction.
    pub fn commit(&self) -> Result<()> {
        let txn = self.take_to_commit()?;
        let _attribution = self.attribute();
        self.finish_commit(txn)
    }

    /// Commits the explicit transaction without waiting for its commit record to reach the
    /// disk, and asks the background log flusher to flush now. The returned ticket's
    /// [`CommitTicket::wait`] returns once the commit is durable (or fails if the log cannot be
    /// made durable).
    ///
    /// This is for one thread that ingests many transactions: it builds the next transaction
    /// while the log flusher writes and syncs the previous one, and acknowledges each
    /// transaction to whoever asked for it only when its ticket's wait returns. Every
    /// acknowledged transaction is as durable as a FULL commit; what the caller gives up is the
    /// FULL commit's visibility rule. Until the flush, the commit is a DELAYED one: its locks are
    /// released now, so other sessions can read its rows before they are on disk, and a crash
    /// before the flush loses it (the ticket's wait would not have returned). A ticket dropped
    /// without waiting leaves exactly a DELAYED commit behind.
    pub fn commit_pipelined(&self) -> Result<CommitTicket> {
        let txn = self.take_to_commit()?;
        let _attribution = self.attribute();
        let appended = self
            .check_can_commit()
            .and_then(|()| self.append_end(&txn, Record::Commit { txn: txn.id }));
        self.end_transaction(txn);
        let end = appended?;
        if end.is_some() {
            self.db().request_log_flush();
        }
        Ok(CommitTicket {
            db: self.db().clone(),
            session_waits: self.waits_accumulator(),
            end,
        })
    }

    /// Takes the explicit transaction out of the session to commit it.
    fn take_to_commit(&self) -> Result<Transaction> {
        self.txn_slot().take().ok_or_else(|| {
            EngineError::Transaction(
                "The COMMIT TRANSACTION request has no corresponding BEGIN TRANSACTION.".into(),
            )
        })
    }

    /// Rolls the explicit transaction back.
    pub fn rollback(&self) -> Result<()> {
        let txn = self.txn_slot().take().ok_or_else(|| {
            EngineError::Transaction(
                "The ROLLBACK TRANSACTION request has no corresponding BEGIN TRANSACTION.".into(),
            )
        })?;
        let _attribution = self.attribute();
        self.finish_rollback(txn)
    }

    /// Runs one write statement: in the explicit transaction if one is open, otherwise in an
    /// autocommit transaction. If the statement fails, everything it changed is undone (the
    /// transaction stays open); an autocommit transaction commits when the statement succeeds.
    pub(crate) fn write<T>(
        &self,
        table: &Arc<Table>,
        statement: impl FnOnce(&mut WriteScope<'_>) -> Result<T>,
    ) -> Result<T> {
        let db = self.db();
        db.check_usable()?;
        table.check_usable_by(self)?;
        let _attribution = self.attribute();
        let mut slot = self.txn_slot();
        let mut autocommit = None;
        let txn: &mut Transaction = match slot.as_mut() {
            Some(txn) => txn,
            None => autocommit.insert(db.new_transaction(
                false,
                db.default_durability(),
                self.take_spare_undo(),
            )?),
        };
        let savepoint = txn.undo.len();
        let log_changes = db.wal().is_some() && table.is_logged();
        let mut scope = WriteScope {
            session: self,
            table,
            txn,
            log_changes,
        };
        let mut result = statement(&mut scope);
        let txn = txn_of(&mut slot, &mut autocommit);
        if result.is_err() {
            // A failed statement may have shown rows to readers (inside the trees, before its
            // own cleanup) that are now gone: count it as a rollback before its locks go.
            if let Err(error) = self.undo_to(txn, savepoint, Some(table)) {
                result = Err(error);
            }
            db.note_ended_write();
        } else if txn.explicit {
            // The transaction outlives the statement: its undo entries name their table.
            for entry in &mut txn.undo[savepoint..] {
                entry.table.get_or_insert_with(|| Arc::clone(table));
            }
        }
        // Between statements, where no statement counts on its place in the list of locks:
        // a transaction that has taken many row locks on a table trades them for one lock on
        // the whole table, so that a large one does not hold memory for every row it touched.
        if txn.explicit
            && let Some(threshold) = db.lock_escalation_threshold()
            && txn.locks.escalate_if_large(db.locks(), threshold) > 0
        {
            // The rows it deleted from a table it now holds whole are noted once for all, and
            // so is every row it deletes there later: its notes hold nothing per row any more.
            for table in &txn.deleted_from {
                if txn.locks.has_escalated(table.id()) {
                    table.pending_deletes().note_whole_table(txn.id);
                }
            }
        }
        // Likewise for its undo list, which then lets its entries go (see `Spilled`).
        if txn.explicit && txn.undo.len() >= db.undo_kept_entries() {
            txn.spill_undo(db);
        }
        drop(slot);
        match (autocommit, result) {
            (Some(txn), Ok(value)) => self.finish_commit(txn).map(|()| value),
            (Some(txn), Err(error)) => {
                self.finish_rollback(txn)?;
                Err(error)
            }
            (None, result) => result,
        }
    }

    /// Undoes the transaction's changes after `savepoint`, newest first, logging each inverse
    /// change as the transaction's own. `statement_table` is the table of entries that name
    /// none (those of the statement in progress). If a change cannot be undone, the database
    /// stops ([`Database::fail_rollback`]).
    fn undo_to(
        &self,
        txn: &mut Transaction,
        savepoint: usize,
        statement_table: Option<&Arc<Table>>,
    ) -> Result<()> {
        let id = txn.id;
        self.undo_entries_to(txn, savepoint, statement_table)
            .map_err(|error| self.db().fail_rollback(id, error))?;
        // With the last change to a table that is not logged taken back, the pages hold none
        // of the transaction's changes to such tables any more (each compensation was applied
        // inside the gate, before this).
        if txn
            .unlogged_undo_from
            .is_some_and(|from| from >= txn.undo.len())
        {
            txn.unlogged_undo_from = None;
            self.active_slot()
                .unlogged_changes
                .store(false, Ordering::Release);
        }
        Ok(())
    }

    fn undo_entries_to(
        &self,
        txn: &mut Transaction,
        savepoint: usize,
        statement_table: Option<&Arc<Table>>,
    ) -> Result<()> {
        while txn.undo.len() > savepoint {
            let UndoEntry {
                table: entry_table,
                change,
            } = txn.undo.pop().expect("len > savepoint");
            let table = entry_table.as_ref().or(statement_table).ok_or_else(|| {
                EngineError::Transaction(
                    "an undo entry of an earlier statement names no table".into(),
                )
            })?;
            // An insert's entry has no value: its delete reads it back from the tree, inside the
            // gate like the delete itself.
            self.compensate(txn, table, || match change {
                UndoChange::Insert { partition, key } => {
                    table.delete_of_inserted_row(partition, key)
                }
                UndoChange::Other(change) => Ok(change.into_inverse()),
            })?;
        }
        Ok(())
    }

    /// Applies the change `inverse` makes (inside the checkpoint gate, where it is made) to
    /// `table` and logs it as the transaction's own compensation, which is not undoable itself
    /// and stays out of the undo list.
    fn compensate(
        &self,
        txn: &mut Transaction,
        table: &Arc<Table>,
        inverse: impl FnOnce() -> Result<RowChange>,
    ) -> Result<()> {
        let log_changes = self.db().wal().is_some() && table.is_logged();
        let mut scope = WriteScope {
            session: self,
            table,
            txn,
            log_changes,
        };
        scope.logged_and_kept(table, false, |changes| {
            // An undo that cannot get a page would stop the database, so it is not held to the
            // configured page limit: at the limit, putting back a deleted row whose room
            // another insert took needs a split.
            lastpage_storage::buffer::past_page_limit(|| {
                let inverse = inverse()?;
                table.apply_change(&inverse)?;
                changes.push(inverse);
                Ok(())
            })
        })
    }

    /// Undoes the changes the transaction let go from its undo list (see [`Spilled`]), newest
    /// first, reading their records back from the log. Called once the list is empty.
    fn undo_spilled(&self, txn: &mut Transaction) -> Result<()> {
        let Some(spilled) = txn.spilled.take() else {
            return Ok(());
        };
        let id = txn.id;
        let db = self.db();
        let wal = db.wal().ok_or_else(|| {
            EngineError::Transaction("undo entries were let go in a database without a log".into())
        })?;
        // The records must be in the log's files to be read back; a failure to make them so is
        // the log's failure, which stops the database like any other.
        wal.wait_until_durable(spilled.end)
            .map_err(|error| db.fail(error))?;
        let tables = std::mem::take(&mut txn.logged_tables);
        let trees: HashMap<u32, (&Arc<Table>, usize)> = tables
            .iter()
            .flat_map(|table| {
                table
                    .clustered_trees()
                    .iter()
                    .enumerate()
                    .map(move |(partition, tree)| (tree.index_id(), (table, partition)))
            })
            .collect();
        let own_change = |record: &Record<'_>| match record {
            Record::Insert { txn, index_id, .. }
            | Record::InsertRun { txn, index_id, .. }
            | Record::Delete { txn, index_id, .. }
            | Record::Update { txn, index_id, .. } => (*txn == id).then_some(*index_id),
            _ => None,
        };
        // The compensations logged below are noted in fresh marks; these are read.
        let marks = std::mem::take(&mut txn.log_marks);
        let mut undone = 0u64;
        let result = wal.read_back_newest_first(
            &marks,
            spilled.end,
            |raw| Ok(own_change(&raw.decode()?).is_some()),
            |raw| {
                let lsn = raw.lsn;
                let payload = Arc::new(raw.payload);
                let record = RawRecord::decode_payload(lsn, raw.kind, &payload)?;
                let index_id = own_change(&record).expect("only the transaction's row changes");
                let &(table, partition) = trees.get(&index_id).ok_or_else(|| {
                    EngineError::Transaction(format!(
                        "the transaction's log record at {lsn} names index {index_id}, which no \
                         table it logged changes to has"
                    ))
                })?;
                for change in RowChange::from_record(partition, record, &payload)?
                    .into_iter()
                    .rev()
                {
                    self.compensate(txn, table, || Ok(change.into_inverse()))?;
                    undone += 1;
                }
                Ok(())
            },
        );
        db.undo_counters()
            .undone_from_log
            .fetch_add(undone, Ordering::Relaxed);
        result
    }

    fn finish_commit(&self, txn: Transaction) -> Result<()> {
        let result = self
            .check_can_commit()
            .and_then(|()| self.log_end(&txn, Record::Commit { txn: txn.id }));
        self.end_transaction(txn);
        result
    }

    /// Refuses a commit once the database failed: a statement of the transaction may be only
    /// half undone (see [`Database::fail_rollback`]), and a log failure refuses the commit
    /// record anyway. And once it was closed: a commit record after the close's clean image
    /// would make the next open take the close for a crash (and empty every table that is not
    /// logged); refused, the transaction is undone by the next open, like any left open.
    fn check_can_commit(&self) -> Result<()> {
        self.db().check_usable()
    }

    fn finish_rollback(&self, mut txn: Transaction) -> Result<()> {
        // Once the database failed, nothing reads the trees again before the next open, whose
        // recovery undoes the transaction; and after a failed undo, undoing older changes
        // would skip the one that failed.
        let id = txn.id;
        let undone = self
            .db()
            .check_not_failed()
            .and_then(|()| self.undo_to(&mut txn, 0, None))
            .and_then(|()| {
                self.undo_spilled(&mut txn)
                    .map_err(|error| self.db().fail_rollback(id, error))
            });
        self.db().note_ended_write();
        // The abort record is flushed like a commit (for FULL durability): the rolled-back
        // inserts' records then are on disk too, so recovery sees their identity values and
        // never hands them out again.
        let logged = match &undone {
            Ok(()) => self.log_end(&txn, Record::Abort { txn: txn.id }),
            Err(_) => Ok(()),
        };
        self.end_transaction(txn);
        undone.and(logged)
    }

    /// Appends a transaction's commit or abort record, if it logged anything, and waits for it
    /// to be durable if its durability is FULL.
    fn log_end(&self, txn: &Transaction, record: Record<'_>) -> Result<()> {
        let db = self.db();
        let is_commit = matches!(record, Record::Commit { .. });
        match (self.append_end(txn, record)?, db.wal(), txn.durability) {
            // Both waits are the same WRITELOG wait, but only a commit is counted as one in
            // the log writer's statistics: commits per fdatasync is "transactions committed"
            // in every figure built on it, and a rollback counted there made a workload that
            // rolls back look as if it committed more per fdatasync than it did.
            (Some(end), Some(wal), Durability::Full) if is_commit => {
                wal.wait_durable(end).map_err(|error| db.fail(error))
            }
            (Some(end), Some(wal), Durability::Full) => {
                wal.wait_until_durable(end).map_err(|error| db.fail(error))
            }
            _ => Ok(()),
        }
    }

    /// Appends a transaction's commit or abort record if it logged anything, and returns the
    /// record's end LSN.
    fn append_end(&self, txn: &Transaction, record: Record<'_>) -> Result<Option<Lsn>> {
        let db = self.db();
        let (Some(wal), Some(_)) = (db.wal(), txn.last_lsn) else {
            return Ok(None);
        };
        wal.append(&record)
            .map(Some)
            .map_err(|error| db.fail(error))
    }

    fn end_transaction(&self, txn: Transaction) {
        self.active_slot()
            .first_lsn
            .store(NO_ACTIVE_LSN, Ordering::Release);
        self.active_slot()
            .unlogged_changes
            .store(false, Ordering::Release);
        let mut txn = txn;
        // After a rollback's undo and before the locks go: a lookup that finds a deleted row
        // noted waits for its lock, and then reads the outcome.
        for table in txn.deleted_from.drain(..) {
            table.pending_deletes().clear(txn.id);
        }
        // After the last change and before the locks go, so that a reader that read one of
        // its rows while it was locked sees a change of the count (`Table::committed_value`).
        if txn.locks.holds_any() {
            self.db().note_ended_write();
        }
        txn.locks.release_all(self.db().locks());
        self.return_spare_undo(std::mem::take(&mut txn.undo));
    }

    /// Rolls back an explicit transaction left open when the session goes away. The rollback's
    /// waits (its undo latches pages, and a FULL rollback waits for its abort record: WRITELOG)
    /// are the session's, as those of [`Session::rollback`] are: without the attribution they
    /// reached only the process-wide statistics, or the accumulators of whatever statement of
    /// another session happened to drop this one.
    pub(crate) fn abandon(&self) {
        if let Some(txn) = self.txn_slot().take() {
            let _attribution = self.attribute();
            let _ = self.finish_rollback(txn);
        }
    }
}

fn txn_of<'a>(
    slot: &'a mut Option<Transaction>,
    autocommit: &'a mut Option<Transaction>,
) -> &'a mut Transaction {
    match slot.as_mut() {
        Some(txn) => txn,
        None => autocommit.as_mut().expect("one of the two is set"),
    }
}

impl Transaction {
    /// Lets the undo list's entries go, between statements, if the transaction's changes can
    /// be undone from the log instead (see [`Spilled`]).
    fn spill_undo(&mut self, db: &Database) {
        let (Some(end), Some(_)) = (self.last_lsn, db.wal()) else {
            return;
        };
        if self.unlogged_undo_from.is_some() || db.check_usable().is_err() {
            return;
        }
        self.spilled = Some(Spilled { end });
        let entries = self.undo.len() as u64;
        self.undo.clear();
        let counters = db.undo_counters();
        counters.spills.fetch_add(1, Ordering::Relaxed);
        counters
            .entries_spilled
            .fetch_add(entries, Ordering::Relaxed);
    }
}

impl Database {
    pub(crate) fn new_transaction(
        &self,
        explicit: bool,
        durability: Durability,
        undo: Vec<UndoEntry>,
    ) -> Result<Transaction> {
        let id = self.next_txn_id()?;
        Ok(Transaction {
            id,
            explicit,
            durability,
            last_lsn: None,
            undo,
            locks: TxnLocks::new(id),
            deleted_from: Vec::new(),
            unlogged_undo_from: None,
            log_marks: ReadBackMarks::default(),
            logged_tables: Vec::new(),
            spilled: None,
        })
    }
}

/// How long a lock request waits before failing, when the database sets no timeout.
pub const DEFAULT_LOCK_TIMEOUT: Option<Duration> = None;

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use lastpage_io::{FaultyConfig, FaultyFileSystem};

    use crate::{
        ColumnDef, DataType, Database, DatabaseOptions, IndexDef, InsertRow, TableDef, Uniqueness,
        Value, WaitSnapshot, WaitType,
    };

    /// An undo entry takes the room of an insert's key (and its partition and table), not of
    /// an update's three byte strings: a large transaction's list holds one per row.
    #[test]
    fn an_undo_entry_is_as_small_as_an_inserts() {
        assert_eq!(std::mem::size_of::<super::UndoEntry>(), 48);
    }

    /// A batch's undo entries keep its keys, moved into a buffer of their own, and not the
    /// buffer its keys and values share; keys that are all their buffer holds stay in it.
    #[test]
    fn a_batchs_undo_entries_let_its_values_buffer_go() {
        use super::{RowBytes, RowChange, UndoChange, pack_shared_insert_keys};

        let buffer = Arc::new(b"k1value1k22value2".to_vec());
        let mut changes = vec![
            RowChange::Insert {
                partition: 0,
                key: RowBytes::shared(&buffer, 0..2),
                value: RowBytes::shared(&buffer, 2..8),
            },
            RowChange::Update {
                partition: 0,
                key: RowBytes::from(b"k0".to_vec()),
                old_value: RowBytes::from(b"old".to_vec()),
                new_value: RowBytes::from(b"new".to_vec()),
            },
            RowChange::Insert {
                partition: 1,
                key: RowBytes::shared(&buffer, 8..11),
                value: RowBytes::shared(&buffer, 11..17),
            },
        ];
        pack_shared_insert_keys(&mut changes);
        let entries: Vec<UndoChange> = changes.into_iter().map(UndoChange::from).collect();
        assert_eq!(
            Arc::strong_count(&buffer),
            1,
            "the entries hold the batch's buffer"
        );
        let keys: Vec<&[u8]> = entries
            .iter()
            .filter_map(|entry| match entry {
                UndoChange::Insert { key, .. } => Some(&key[..]),
                UndoChange::Other(_) => None,
            })
            .collect();
        assert_eq!(keys, [&b"k1"[..], &b"k22"[..]]);

        let keys_only = Arc::new(b"k1k22".to_vec());
        let mut changes: Vec<RowChange> = [0..2, 2..5]
            .into_iter()
            .map(|range| RowChange::Insert {
                partition: 0,
                key: RowBytes::shared(&keys_only, range),
                value: RowBytes::from(b"value".to_vec()),
            })
            .collect();
        pack_shared_insert_keys(&mut changes);
        for change in &changes {
            assert!(matches!(
                change,
                RowChange::Insert { key: RowBytes::Shared { buffer, .. }, .. }
                    if Arc::ptr_eq(buffer, &keys_only)
            ));
        }
    }

    /// A session dropped with a FULL transaction open rolls it back, and the rollback waits
    /// for its abort record (WRITELOG) like an explicit rollback: that wait is the session's.
    /// It reached only the process-wide statistics before. (The session's statistics outlive
    /// it only through its accumulator, which the test keeps.)
    #[test]
    fn the_rollback_of_a_dropped_session_is_attributed_to_it() {
        let fs = FaultyFileSystem::new(FaultyConfig::new(11));
        let options = DatabaseOptions {
            file_system: Some(Arc::new(fs)),
            // No background flush in practice: the abort record waits for its own flush.
            delayed_flush_interval: std::time::Duration::from_secs(3600),
            ..DatabaseOptions::default()
        };
        let db = Database::open("/db", options).unwrap();
        let table = db
            .create_table(
                TableDef::new("T")
                    .column(ColumnDef::new("K", DataType::Int).not_null())
                    .clustered(IndexDef::new("PK", &["K"], Uniqueness::PrimaryKey)),
            )
            .unwrap();
        let session = db.session();
        session.begin().unwrap();
        table.insert(&session, InsertRow::new().set(0, 1)).unwrap();
        let waits = session.waits_accumulator();
        let writelog = |waits: &WaitSnapshot| waits.wait(WaitType::WriteLog).waiting_tasks_count;
        let before = writelog(&waits.snapshot());
        drop(session);
        assert_eq!(
            writelog(&waits.snapshot()) - before,
            1,
            "the dropped session's rollback waited for its abort record"
        );
        let reader = db.session();
        assert_eq!(table.get(&reader, &[Value::Int(1)]).unwrap(), None);
    }
}
