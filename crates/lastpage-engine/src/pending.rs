//! Rows that transactions still open have deleted: what a READ COMMITTED lookup must wait for
//! rather than report missing.
//!
//! Why: a delete removes the row from its tree at once (there are no ghost records) and keeps
//! its exclusive lock until the transaction ends. A reader that finds a row waits for such a
//! lock, but a reader that does not find one has no row to ask about, and without this set it
//! reported the row missing while the deleter could still roll back. SQL Server's reader waits
//! for the deleter (LCK_M_S) and then sees the committed outcome; so does a lookup here.
//!
//! The protocol:
//! - A deleting transaction notes the row here *before* it removes the row from the tree (see
//!   `WriteScope::note_pending_delete`), and the row stays noted until the transaction ends:
//!   its entries are cleared after a rollback has put the rows back and before its locks are
//!   released.
//! - Every note and every clear moves [`PendingDeletes::version`] on, under the mutex.
//! - A lookup reads the version, reads the tree, and then accepts a miss (or its first match)
//!   without the mutex only if the set was empty and the version did not move meanwhile: then
//!   no row of the table was deleted-but-uncommitted at any moment of its read. Otherwise it
//!   reads the tree again holding the mutex, so that the set cannot change during that read,
//!   and waits for the first noted row of another transaction that lies where its read found
//!   nothing. Tree reads take latches only, and nobody takes this mutex while holding a latch or
//!   waits for a lock while holding it, so holding it across a read cannot deadlock.

use std::collections::BTreeMap;
use std::ops::Bound;

use lastpage_storage::sync::{self, AtomicU64, AtomicUsize, Mutex, MutexGuard, Ordering};
use lastpage_storage::wal::TxnId;

/// The rows of one table deleted by transactions that have not ended (see the module
/// documentation).
#[derive(Default)]
pub struct PendingDeletes {
    /// Clustered record key and partition → the transaction that deleted it.
    rows: Mutex<BTreeMap<(Vec<u8>, usize), TxnId>>,
    /// `rows.len()`, readable without the mutex.
    count: AtomicUsize,
    /// Moves on with every note and clear.
    version: AtomicU64,
}

/// The set held still, for a read that must not race with a note or a clear.
pub struct HeldPendingDeletes<'a> {
    rows: MutexGuard<'a, BTreeMap<(Vec<u8>, usize), TxnId>>,
}

impl PendingDeletes {
    /// Notes that `txn` is about to delete the clustered record `key` of `partition`.
    pub fn note(&self, txn: TxnId, partition: usize, key: &[u8]) {
        let mut rows = sync::lock(&self.rows);
        rows.insert((key.to_vec(), partition), txn);
        self.publish(rows.len());
    }

    /// Forgets every row `txn` deleted: it is ending.
    pub fn clear(&self, txn: TxnId) {
        let mut rows = sync::lock(&self.rows);
        rows.retain(|_, deleter| *deleter != txn);
        self.publish(rows.len());
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
            rows: sync::lock(&self.rows),
        }
    }
}

impl HeldPendingDeletes<'_> {
    /// The first (lowest) key between `lower` and `upper` that a transaction other than `me`
    /// deleted and has not ended, and that transaction.
    pub fn first_of_others(
        &self,
        me: Option<TxnId>,
        lower: Bound<&[u8]>,
        upper: Bound<&[u8]>,
    ) -> Option<(Vec<u8>, TxnId)> {
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
        self.rows
            .range((lower, upper))
            .find(|(_, deleter)| Some(**deleter) != me)
            .map(|((key, _), deleter)| (key.clone(), *deleter))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lookup_finds_only_other_transactions_rows_in_its_range() {
        let pending = PendingDeletes::default();
        let before = pending.version();
        assert!(pending.quiet_since(before));
        pending.note(TxnId(7), 0, b"b");
        pending.note(TxnId(8), 3, b"d");
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
        drop(held);
        pending.clear(TxnId(7));
        let version = pending.version();
        pending.clear(TxnId(8));
        assert!(
            !pending.quiet_since(version),
            "a clear moves the version on"
        );
        assert!(pending.quiet_since(pending.version()));
    }
}
