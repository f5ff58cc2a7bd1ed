//! Rows that transactions still open have deleted, or changed so that entries of them left a
//! nonclustered index: what a READ COMMITTED reader must wait for rather than miss.
//!
//! Why: a delete removes the row from its tree at once (there are no ghost records) and keeps
//! its exclusive lock until the transaction ends. A reader that finds a row waits for such a
//! lock, but a reader that does not find one has no row to ask about, and without this set it
//! skipped the row while the deleter could still roll back. SQL Server's reader waits for the
//! deleter (LCK_M_S) and then sees the committed outcome; so do lookups and scans here.
//!
//! The protocol (`docs/locking.md` says where each reader looks):
//! - A writer notes the row, with its value (the committed one wherever anything reads it; see
//!   [`PendingDeletes::note`]), *before* anything of it leaves a tree
//!   (see `WriteScope::note_pending_delete`), and the row stays noted until the transaction
//!   ends: its notes are cleared after a rollback has put the rows back and before its locks
//!   are released.
//! - Every note and every clear moves [`PendingDeletes::version`] on, holding the set's lock
//!   exclusively.
//! - A reader reads the version, reads the tree, and then accepts what it read without the
//!   lock only if the set was empty and the version did not move meanwhile: then no row of the
//!   table was deleted-but-uncommitted at any moment of its read. Otherwise it takes the lock
//!   shared, so that the set cannot change (other readers share it), and reads the tree again,
//!   unless the version is still the one read before the first read (then the set did not
//!   change during that read either); then it waits for the first noted row of another
//!   transaction that lies where its read found nothing. Tree reads take latches only, and
//!   nobody takes this lock while holding a latch or waits for a row lock while holding it, so
//!   holding it across a read cannot deadlock.

use std::collections::{BTreeMap, HashMap};
use std::ops::Bound;

use lastpage_storage::sync::{self, AtomicU64, AtomicUsize, Ordering, RwLock, RwLockReadGuard};
use lastpage_storage::wal::TxnId;

/// The noted rows.
#[derive(Default)]
struct Noted {
    /// Clustered record key and partition → the transaction that noted the row, and the row's
    /// clustered record value when that transaction first noted it: the committed value of a
    /// row that existed before the transaction, in every table an index lookup reads it for
    /// (see [`PendingDeletes::note`] for when it is the transaction's own).
    rows: BTreeMap<(Vec<u8>, usize), (TxnId, Vec<u8>)>,
    /// The keys of `rows` each transaction noted, so that a transaction's end removes its own
    /// notes without walking everybody's (one long delete would make every other end slow).
    by_txn: HashMap<TxnId, Vec<(Vec<u8>, usize)>>,
    /// Transactions that hold the whole table locked (escalated) and deleted rows from it,
    /// noted once for all their deletions there instead of row by row (see
    /// [`PendingDeletes::note_whole_table`]). At most one at a time, as only one transaction
    /// can hold a table's lock; a list so that nothing rests on that.
    whole_table: Vec<TxnId>,
}

impl Noted {
    /// Notes of rows and of whole tables: what readers must look through.
    fn count(&self) -> usize {
        self.rows.len() + self.whole_table.len()
    }
}

/// The rows of one table deleted by transactions that have not ended (see the module
/// documentation).
#[derive(Default)]
pub struct PendingDeletes {
    /// Readers hold it shared across their tree reads, so lookups of one table run side by side
    /// while a transaction that deleted rows from it is open; notes and clears take it
    /// exclusively.
    noted: RwLock<Noted>,
    /// `noted.rows.len()`, readable without the lock.
    count: AtomicUsize,
    /// Moves on with every note and clear.
    version: AtomicU64,
}

/// The set held still, for a read that must not race with a note or a clear.
pub struct HeldPendingDeletes<'a> {
    noted: RwLockReadGuard<'a, Noted>,
}

impl PendingDeletes {
    /// Notes that `txn` is about to delete the clustered record `key` of `partition`, whose
    /// value is `value`, or to change it so that entries of it leave a nonclustered index. A
    /// row noted twice by one transaction keeps the first value.
    ///
    /// What that value is: the row's value as the transaction's statement found it, under its
    /// lock. That is the committed value unless the transaction itself wrote the row earlier
    /// without noting it, which leaves its own value there in two cases:
    /// - a row the transaction inserted (or moved to this key) at a key it had not deleted a
    ///   row from before (such a delete noted the committed value, which the note keeps). The
    ///   row has no committed version at all, and the note only makes readers that do not find
    ///   it wait for the transaction's end (then they find nothing of it committed, as they
    ///   would have at once); a reader inside a transaction may even be chosen as a deadlock
    ///   victim over it;
    /// - a row it updated in place in a table without nonclustered indexes (only updates of a
    ///   table with such indexes note the row). Only index lookups read a note's value
    ///   ([`HeldPendingDeletes::of_others`]), and that table has no index to look up (a table's
    ///   indexes are fixed when it is made); the note's key, which all other
    ///   readers go by, is right.
    ///
    /// So the note is never wrong in a way that loses a committed row: every change of a table
    /// with nonclustered indexes that takes a row's entries out (delete, move, update in place)
    /// notes the row first, so there the first note of a row that existed before the
    /// transaction holds its committed value, which is what an index lookup needs to know that
    /// the row had an entry under its key. The cost is extra waits. Noting the committed value
    /// (and no note for a row without one) would need to know what the transaction did to the
    /// row before: a search of its undo list on every such note (quadratic for a transaction
    /// that inserts rows and then deletes them), or a record of every row it inserted, paid on
    /// the insert path, which is built to pay nothing per row it can avoid.
    ///
    /// A transaction that noted the whole table ([`PendingDeletes::note_whole_table`]) notes
    /// no row: its note of the table stands for every one.
    pub fn note(&self, txn: TxnId, partition: usize, key: &[u8], value: &[u8]) {
        let mut noted = sync::write(&self.noted);
        if noted.whole_table.contains(&txn) {
            return;
        }
        let row = (key.to_vec(), partition);
        if !noted.rows.contains_key(&row) {
            noted.rows.insert(row.clone(), (txn, value.to_vec()));
            noted.by_txn.entry(txn).or_default().push(row);
        }
        self.publish(noted.count());
    }

    /// Notes that `txn`, which holds the whole table locked in X (it escalated), deletes rows
    /// from it until it ends, and forgets the rows it noted one by one: this note stands for
    /// them all, and for every row it deletes later, which it no longer notes.
    ///
    /// Why: a note of a row holds its key and its value until the transaction ends, so a
    /// transaction that deletes a million rows held a million of them (about 270 bytes a row,
    /// the largest part of its memory once its locks escalate and its undo entries go to the
    /// log). A reader that finds this note (of another transaction) waits for that transaction
    /// to end, wherever it reads and whatever index it reads through: it waits on the table's
    /// lock, which the transaction holds to its end, as a READ COMMITTED reader of a table
    /// another transaction holds in X waits in SQL Server. A reader that finds a row of the
    /// table waits for that lock already; what the note adds is that a reader that finds
    /// nothing waits too, where the row it did not find may have been deleted. Readers that
    /// find nothing at all in a table whose escalated transaction deleted nothing there still
    /// read at once, as before.
    ///
    /// To be called only while `txn` holds the table's lock, which it holds to its end: the
    /// note is cleared with the others before that lock goes. Replacing the rows' notes under
    /// the set's lock moves the version on once, so that a reader that held the set still
    /// finds either the rows' notes or this one, and one that read without it reads again.
    pub fn note_whole_table(&self, txn: TxnId) {
        let mut noted = sync::write(&self.noted);
        if noted.whole_table.contains(&txn) {
            return;
        }
        noted.whole_table.push(txn);
        for row in noted.by_txn.remove(&txn).unwrap_or_default() {
            noted.rows.remove(&row);
        }
        self.publish(noted.count());
    }

    /// Forgets every row `txn` deleted: it is ending.
    pub fn clear(&self, txn: TxnId) {
        let mut noted = sync::write(&self.noted);
        for row in noted.by_txn.remove(&txn).unwrap_or_default() {
            noted.rows.remove(&row);
        }
        noted.whole_table.retain(|&whole| whole != txn);
        self.publish(noted.count());
    }

    /// How many rows are noted one by one (not counting whole tables' notes): what the notes
    /// hold in memory, for tests.
    pub fn noted_rows(&self) -> usize {
        sync::read(&self.noted).rows.len()
    }

    /// Moves the version on, then publishes the new count. In this order: a lookup that reads
    /// the count a clear left (zero) acquires the version that clear moved on with it, and so
    /// does not take the cleared set for one that never changed. (The other order let a lookup
    /// that read the version before a rolled-back delete, and the tree during it, report the
    /// row missing; `tests/pending_loom.rs` finds that interleaving.)
    fn publish(&self, count: usize) {
        self.version.fetch_add(1, Ordering::AcqRel);
        self.count.store(count, Ordering::Release);
    }

    /// The version, to be read before a lookup's tree read and passed to
    /// [`PendingDeletes::quiet_since`] after it.
    pub fn version(&self) -> u64 {
        self.version.load(Ordering::Acquire)
    }

    /// Whether no row is noted and nothing was noted or cleared since `version` was read: a
    /// read made in between saw only committed deletions. The count is read first (see
    /// [`PendingDeletes::publish`]).
    pub fn quiet_since(&self, version: u64) -> bool {
        self.count.load(Ordering::Acquire) == 0 && self.version.load(Ordering::Acquire) == version
    }

    /// Holds the set still until the returned guard is dropped.
    pub fn hold(&self) -> HeldPendingDeletes<'_> {
        HeldPendingDeletes {
            noted: sync::read(&self.noted),
        }
    }
}

impl HeldPendingDeletes<'_> {
    /// A transaction other than `me` that noted the whole table
    /// ([`PendingDeletes::note_whole_table`]): any row may be one it deleted. Returned as a
    /// deleted row's key and transaction are, with an empty key, which no row has: a wait for
    /// that key is a wait for the table's lock, which covers every key of the table.
    pub fn whole_table_of_others(&self, me: Option<TxnId>) -> Option<(Vec<u8>, TxnId)> {
        self.noted
            .whole_table
            .iter()
            .find(|&&deleter| Some(deleter) != me)
            .map(|&deleter| (Vec::new(), deleter))
    }

    /// The first (lowest) key between `lower` and `upper` that a transaction other than `me`
    /// deleted and has not ended, and that transaction; or, if another transaction noted the
    /// whole table, that transaction with an empty key
    /// ([`HeldPendingDeletes::whole_table_of_others`]).
    pub fn first_of_others(
        &self,
        me: Option<TxnId>,
        lower: Bound<&[u8]>,
        upper: Bound<&[u8]>,
    ) -> Option<(Vec<u8>, TxnId)> {
        if let Some(whole_table) = self.whole_table_of_others(me) {
            return Some(whole_table);
        }
        // Partitions order entries of one key: the lowest and highest stand for "any".
        let lower = match lower {
            Bound::Included(key) => Bound::Included((key.to_vec(), 0)),
            Bound::Excluded(key) => Bound::Excluded((key.to_vec(), usize::MAX)),
            Bound::Unbounded => Bound::Unbounded,
        };
        let upper = match upper {
            Bound::Included(key) => Bound::Included((key.to_vec(), usize::MAX)),
            Bound::Excluded(key) => Bound::Excluded((key.to_vec(), 0)),
            Bound::Unbounded => Bound::Unbounded,
        };
        // `BTreeMap::range` panics on a range whose start lies past its end.
        if let (
            Bound::Included(low) | Bound::Excluded(low),
            Bound::Included(high) | Bound::Excluded(high),
        ) = (&lower, &upper)
            && low > high
        {
            return None;
        }
        self.noted
            .rows
            .range((lower, upper))
            .find(|(_, (deleter, _))| Some(*deleter) != me)
            .map(|((key, _), (deleter, _))| (key.clone(), *deleter))
    }

    /// Every row noted by a transaction other than `me`: its clustered key, partition, that
    /// transaction and the value noted (the committed one wherever the table has an index to
    /// look up: see [`PendingDeletes::note`]). Notes of the whole table are not rows: see
    /// [`HeldPendingDeletes::whole_table_of_others`].
    pub fn of_others(
        &self,
        me: Option<TxnId>,
    ) -> impl Iterator<Item = (&[u8], usize, TxnId, &[u8])> + '_ {
        self.noted
            .rows
            .iter()
            .filter(move |(_, (deleter, _))| Some(*deleter) != me)
            .map(|((key, partition), (deleter, value))| {
                (key.as_slice(), *partition, *deleter, value.as_slice())
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::locks::LockError;
    use crate::{EngineError, InsertRow, Uniqueness, Value};

    /// What [`PendingDeletes::note`] records, end to end, with a zero lock timeout so that a
    /// wait shows as error 1222. A row changed twice and then deleted by one transaction, in a
    /// table with a nonclustered index, is noted with its committed value: a lookup through
    /// the index under that value waits for the transaction instead of missing the row, and
    /// one under the transaction's own later value does not wait (the entry went with the
    /// delete). A row the transaction inserted and deleted itself is noted with its own value,
    /// though it has no committed version: lookups of it wait too (the documented cost, which
    /// noting only committed values would remove).
    #[test]
    fn a_note_holds_the_committed_value_where_an_index_lookup_needs_it() {
        let (db, table) = crate::table::test_tables::k_u_table(
            Some(std::time::Duration::ZERO),
            Uniqueness::NonUnique,
        );
        let (writer, reader) = (db.session(), db.session());
        table
            .insert(&writer, InsertRow::new().set(0, 1).set(1, 10))
            .unwrap();
        let by_u = |u: i32| table.get_by_index(&reader, "IX_U", &[Value::Int(u)]);
        let waits = |result: crate::Result<Vec<crate::Row>>| {
            matches!(result, Err(EngineError::Lock(LockError::Timeout { .. })))
        };
        writer.begin().unwrap();
        for u in [11, 12] {
            let changes = [(1, Value::Int(u))];
            assert!(table.update(&writer, &[Value::Int(1)], &changes).unwrap());
        }
        assert!(table.delete(&writer, &[Value::Int(1)]).unwrap());
        assert!(waits(by_u(10)), "the committed value's entry is waited for");
        assert_eq!(by_u(12).unwrap(), Vec::<crate::Row>::new());

        table
            .insert(&writer, InsertRow::new().set(0, 2).set(1, 20))
            .unwrap();
        assert!(table.delete(&writer, &[Value::Int(2)]).unwrap());
        assert!(
            waits(by_u(20)),
            "a row the transaction inserted is noted too"
        );
        assert!(matches!(
            table.get(&reader, &[Value::Int(2)]),
            Err(EngineError::Lock(LockError::Timeout { .. }))
        ));
        writer.commit().unwrap();
        for u in [10, 12, 20] {
            assert_eq!(by_u(u).unwrap(), Vec::<crate::Row>::new());
        }
    }

    /// A transaction that deletes every row of a table one statement at a time escalates to a
    /// lock on the table (at 4 row locks here), and from then on its notes hold nothing per
    /// row: the rows it noted go, and the rows it deletes later are not noted. Readers of
    /// another session (whose lock waits time out at once, so a wait shows as error 1222), which
    /// find no row to wait for, still wait for it wherever a row it deleted may be: a lookup of
    /// a deleted key and of a key no row ever had, a lookup through the index under a deleted
    /// row's value, and scans both ways. After a rollback they find every row again; after a
    /// commit, none.
    #[test]
    fn a_transaction_that_holds_the_table_notes_its_deletions_once() {
        const ROWS: i32 = 20;
        for commit in [false, true] {
            let (db, table) = crate::table::test_tables::k_u_table_in(
                crate::DatabaseOptions {
                    lock_timeout: Some(std::time::Duration::ZERO),
                    lock_escalation_threshold: Some(4),
                    ..crate::DatabaseOptions::default()
                },
                Uniqueness::NonUnique,
            );
            let (writer, reader) = (db.session(), db.session());
            for key in 0..ROWS {
                table
                    .insert(&writer, InsertRow::new().set(0, key).set(1, 100 + key))
                    .unwrap();
            }
            let pending = table.pending_deletes();
            writer.begin().unwrap();
            for key in 0..ROWS {
                assert!(table.delete(&writer, &[Value::Int(key)]).unwrap());
                // Escalating (after a statement) lets the rows' notes go at once.
                let noted = if db.lock_stats().escalations == 0 {
                    key as usize + 1
                } else {
                    0
                };
                assert_eq!(pending.noted_rows(), noted, "after deleting row {key}");
            }
            assert_eq!(db.lock_stats().escalations, 1);
            assert_eq!(
                pending.noted_rows(),
                0,
                "the table's note stands for its rows"
            );

            let times_out = |result: crate::Result<()>| {
                matches!(result, Err(EngineError::Lock(LockError::Timeout { .. })))
            };
            let get = |key: i32| table.get(&reader, &[Value::Int(key)]).map(drop);
            let by_u = |u: i32| {
                table
                    .get_by_index(&reader, "IX_U", &[Value::Int(u)])
                    .map(drop)
            };
            let scan = |direction| {
                table
                    .scan(&reader, &crate::KeyRange::all(), direction)
                    .and_then(|rows| rows.collect::<crate::Result<Vec<_>>>())
                    .map(drop)
            };
            assert!(times_out(get(0)), "a deleted row is waited for");
            assert!(times_out(get(ROWS + 7)), "so is a key no row had");
            assert!(
                times_out(by_u(100 + 3)),
                "and an index entry of a deleted row"
            );
            assert!(times_out(scan(crate::Direction::Forward)));
            assert!(times_out(scan(crate::Direction::Backward)));
            // The writer itself reads past its own note.
            assert_eq!(table.get(&writer, &[Value::Int(0)]).unwrap(), None);

            let left = if commit {
                writer.commit().unwrap();
                0
            } else {
                writer.rollback().unwrap();
                ROWS as usize
            };
            assert_eq!(pending.noted_rows(), 0);
            let rows = table
                .scan(&reader, &crate::KeyRange::all(), crate::Direction::Forward)
                .unwrap()
                .count();
            assert_eq!(rows, left, "commit {commit}");
            let found = table.get(&reader, &[Value::Int(0)]).unwrap();
            assert_eq!(found.is_some(), !commit);
            let found = table
                .get_by_index(&reader, "IX_U", &[Value::Int(100 + 3)])
                .unwrap();
            assert_eq!(found.len(), usize::from(!commit));
        }
    }

    #[test]
    fn a_whole_table_note_stands_for_every_row_its_transaction_noted() {
        let pending = PendingDeletes::default();
        pending.note(TxnId(7), 0, b"b", b"");
        pending.note(TxnId(8), 0, b"d", b"");
        let before = pending.version();
        pending.note_whole_table(TxnId(7));
        assert!(
            !pending.quiet_since(before),
            "the switch moves the version on"
        );
        assert_eq!(pending.noted_rows(), 1, "7's row note went");
        pending.note(TxnId(7), 0, b"c", b"");
        assert_eq!(pending.noted_rows(), 1, "7 notes no more rows");
        let held = pending.hold();
        let nowhere = (Bound::Excluded(&b"x"[..]), Bound::Excluded(&b"y"[..]));
        assert_eq!(
            held.first_of_others(None, nowhere.0, nowhere.1),
            Some((Vec::new(), TxnId(7))),
            "any range of the table may hold a row 7 deleted"
        );
        assert_eq!(
            held.whole_table_of_others(Some(TxnId(8))),
            Some((Vec::new(), TxnId(7)))
        );
        assert_eq!(held.whole_table_of_others(Some(TxnId(7))), None);
        let all = (Bound::Unbounded, Bound::Unbounded);
        assert_eq!(
            held.first_of_others(Some(TxnId(7)), all.0, all.1),
            Some((b"d".to_vec(), TxnId(8))),
            "7 reads past its own note"
        );
        drop(held);
        let version = pending.version();
        pending.clear(TxnId(7));
        assert!(!pending.quiet_since(version));
        let held = pending.hold();
        assert_eq!(held.whole_table_of_others(None), None);
        assert_eq!(held.first_of_others(None, nowhere.0, nowhere.1), None);
        drop(held);
        pending.clear(TxnId(8));
        assert!(pending.quiet_since(pending.version()));
    }

    #[test]
    fn a_lookup_finds_only_other_transactions_rows_in_its_range() {
        let pending = PendingDeletes::default();
        let before = pending.version();
        assert!(pending.quiet_since(before));
        pending.note(TxnId(7), 0, b"b", b"old");
        pending.note(TxnId(7), 0, b"b", b"newer");
        pending.note(TxnId(8), 3, b"d", b"");
        assert!(!pending.quiet_since(before));
        let held = pending.hold();
        let all = (Bound::Unbounded, Bound::Unbounded);
        let b = Some((b"b".to_vec(), TxnId(7)));
        let d = Some((b"d".to_vec(), TxnId(8)));
        assert_eq!(held.first_of_others(None, all.0, all.1), b);
        assert_eq!(held.first_of_others(Some(TxnId(7)), all.0, all.1), d);
        let exact = |key: &'static [u8]| (Bound::Included(key), Bound::Included(key));
        assert_eq!(held.first_of_others(None, exact(b"d").0, exact(b"d").1), d);
        assert_eq!(
            held.first_of_others(None, exact(b"c").0, exact(b"c").1),
            None
        );
        assert_eq!(
            held.first_of_others(None, Bound::Excluded(b"b"), Bound::Excluded(b"d")),
            None
        );
        assert_eq!(
            held.first_of_others(None, Bound::Excluded(b"d"), Bound::Included(b"a")),
            None
        );
        let others: Vec<_> = held.of_others(Some(TxnId(8))).collect();
        assert_eq!(
            others,
            [(&b"b"[..], 0, TxnId(7), &b"old"[..])],
            "the first value noted is kept"
        );
        drop(held);
        pending.clear(TxnId(7));
        let held = pending.hold();
        assert_eq!(
            held.first_of_others(None, all.0, all.1),
            d,
            "clear removes its own only"
        );
        drop(held);
        let version = pending.version();
        pending.clear(TxnId(8));
        assert!(
            !pending.quiet_since(version),
            "a clear moves the version on"
        );
        assert!(pending.quiet_since(pending.version()));
    }
}
