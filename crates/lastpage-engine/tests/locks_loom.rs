//! Model checks of the row lock manager with loom: every interleaving (up to a preemption
//! bound) of a few transactions is explored; a request that parks and is never granted (a lost
//! wake-up) is reported by loom as a deadlock, and counters checked inside the critical
//! sections catch a lock granted to two conflicting holders. Run with:
//!
//! ```text
//! RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target-loom \
//!     cargo test -p lastpage-engine --release --test locks_loom
//! ```
//!
//! Loom does not model time, so every request here waits without a timeout (see
//! `lastpage_storage::sync::wait_timeout`). `LOOM_MAX_PREEMPTIONS` overrides the default bound.
#![cfg(loom)]

use lastpage_engine::locks::{LockError, LockKey, LockManager, LockMode, TxnId, TxnLocks};
use lastpage_storage::sync::model_check;
use loom::sync::Arc;
use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::thread;

use LockMode::{Exclusive, Shared};

fn key(row: u8) -> LockKey {
    LockKey::new(1, vec![row])
}

/// How many transactions the model believes hold the key, by mode.
#[derive(Default)]
struct Inside {
    exclusive: AtomicUsize,
    shared: AtomicUsize,
}

impl Inside {
    fn enter(&self, mode: LockMode) {
        match mode {
            Exclusive => {
                assert_eq!(self.exclusive.fetch_add(1, Ordering::SeqCst), 0);
                assert_eq!(self.shared.load(Ordering::SeqCst), 0);
            }
            Shared => {
                self.shared.fetch_add(1, Ordering::SeqCst);
                assert_eq!(self.exclusive.load(Ordering::SeqCst), 0);
            }
        }
    }

    fn leave(&self, mode: LockMode) {
        match mode {
            Exclusive => self.exclusive.fetch_sub(1, Ordering::SeqCst),
            Shared => self.shared.fetch_sub(1, Ordering::SeqCst),
        };
    }
}

/// Runs one transaction that locks row 1 in `mode`, checks the oracle and commits.
fn transaction(manager: &LockManager, inside: &Inside, txn: u64, mode: LockMode) {
    manager.acquire(TxnId(txn), &key(1), mode, None).unwrap();
    inside.enter(mode);
    inside.leave(mode);
    manager.release_all(TxnId(txn), &[key(1)]);
}

#[test]
fn exclusive_requests_hand_off_without_a_lost_wake_up() {
    model_check(4, || {
        let manager = Arc::new(LockManager::new(1));
        let inside = Arc::new(Inside::default());
        let other = {
            let manager = Arc::clone(&manager);
            let inside = Arc::clone(&inside);
            thread::spawn(move || transaction(&manager, &inside, 2, Exclusive))
        };
        transaction(&manager, &inside, 1, Exclusive);
        other.join().unwrap();
        assert_eq!(manager.holds(TxnId(1), &key(1)), None);
        assert_eq!(manager.holds(TxnId(2), &key(1)), None);
        assert_eq!(manager.stats().acquired, 2);
    });
}

#[test]
fn shared_readers_and_an_exclusive_writer_exclude_each_other() {
    model_check(2, || {
        let manager = Arc::new(LockManager::new(1));
        let inside = Arc::new(Inside::default());
        let threads: Vec<_> = [(2, Shared), (3, Exclusive)]
            .into_iter()
            .map(|(txn, mode)| {
                let manager = Arc::clone(&manager);
                let inside = Arc::clone(&inside);
                thread::spawn(move || transaction(&manager, &inside, txn, mode))
            })
            .collect();
        transaction(&manager, &inside, 1, Shared);
        for thread in threads {
            thread.join().unwrap();
        }
        assert!(!manager.is_locked_by_other(None, &key(1)));
        assert_eq!(manager.stats().acquired, 3);
    });
}

#[test]
fn a_read_committed_reader_is_woken_when_the_writer_commits() {
    model_check(3, || {
        let manager = Arc::new(LockManager::new(1));
        manager.acquire(TxnId(1), &key(1), Exclusive, None).unwrap();
        let reader = {
            let manager = Arc::clone(&manager);
            thread::spawn(move || {
                manager.wait_for_shared(None, &key(1), None).unwrap();
                assert_eq!(manager.holds(TxnId(1), &key(1)), None);
            })
        };
        manager.release_all(TxnId(1), &[key(1)]);
        reader.join().unwrap();
    });
}

#[test]
fn a_two_transaction_cycle_has_exactly_one_victim() {
    model_check(3, || {
        let manager = Arc::new(LockManager::new(2));
        manager.acquire(TxnId(1), &key(1), Exclusive, None).unwrap();
        manager.acquire(TxnId(2), &key(2), Exclusive, None).unwrap();
        let threads: Vec<_> = [(1, 2), (2, 1)]
            .into_iter()
            .map(|(txn, wanted)| {
                let manager = Arc::clone(&manager);
                thread::spawn(move || {
                    let result = manager.acquire(TxnId(txn), &key(wanted), Exclusive, None);
                    // Commit or roll back: either way every lock goes.
                    manager.release_all(TxnId(txn), &[key(1), key(2)]);
                    (txn, result)
                })
            })
            .collect();
        let results: Vec<_> = threads
            .into_iter()
            .map(|thread| thread.join().unwrap())
            .collect();
        let victims: Vec<_> = results
            .iter()
            .filter_map(|(txn, result)| match result {
                Ok(()) => None,
                Err(LockError::Deadlock { victim }) => {
                    assert_eq!(*victim, TxnId(*txn));
                    Some(*txn)
                }
                Err(error) => panic!("unexpected {error}"),
            })
            .collect();
        assert_eq!(victims.len(), 1, "{results:?}");
        assert_eq!(manager.stats().deadlocks, 1);
        assert_eq!(manager.waiting_txns(), 0);
    });
}

/// A batch's range lock against a reader and a writer of one of its rows: the inserter locks
/// the range, publishes the row (behind a mutex, as a leaf latch publishes it), commits and
/// releases; whoever finds the row must not get past it before the commit, and nobody may park
/// for ever (a release that misses a waiter on the range).
#[test]
fn a_range_lock_holds_back_a_reader_and_a_writer_until_its_commit() {
    model_check(2, || {
        let manager = Arc::new(LockManager::new(2));
        let published = Arc::new(loom::sync::Mutex::new(false));
        let committed = Arc::new(AtomicUsize::new(0));
        let others: Vec<_> = [(2u64, false), (3, true)]
            .into_iter()
            .map(|(txn, writer)| {
                let (manager, published, committed) = (
                    Arc::clone(&manager),
                    Arc::clone(&published),
                    Arc::clone(&committed),
                );
                thread::spawn(move || {
                    if !*published.lock().unwrap() {
                        return;
                    }
                    if writer {
                        manager
                            .acquire(TxnId(txn), &key(5), Exclusive, None)
                            .unwrap();
                    } else {
                        manager
                            .wait_for_shared(Some(TxnId(txn)), &key(5), None)
                            .unwrap();
                    }
                    assert_eq!(committed.load(Ordering::SeqCst), 1, "got past the range");
                    manager.release_all(TxnId(txn), &[key(5)]);
                })
            })
            .collect();
        let range = manager
            .lock_range(TxnId(1), &key(4), &key(6), None)
            .unwrap();
        *published.lock().unwrap() = true;
        committed.store(1, Ordering::SeqCst);
        manager.release_all(TxnId(1), &[range]);
        for other in others {
            other.join().unwrap();
        }
        assert!(!manager.is_locked_by_other(None, &key(5)));
    });
}

/// A transaction that lets go of a lock it took and no longer needs, before it ends (a write
/// that moved past a row version: `TxnLocks::release_taken_since`), hands it to its waiter at
/// once and keeps the rest to its commit: the waiter is granted the row, no wake-up is lost, the
/// two never hold it together, and the lock kept stays the releaser's. The waiter finishes
/// before the releaser commits, which would be a deadlock (reported by loom) if the released
/// lock were still held.
#[test]
fn a_lock_released_before_the_end_goes_to_its_waiter_and_the_rest_stay() {
    model_check(3, || {
        let manager = Arc::new(LockManager::new(2));
        let inside = Arc::new(Inside::default());
        // Row 1 is the lock kept; row 2, taken after it, the one let go early (or, in some
        // interleavings, only after the waiter had it first).
        let mut locks = TxnLocks::new(TxnId(1));
        locks.acquire(&manager, key(1), Exclusive, None).unwrap();
        let waiter = {
            let manager = Arc::clone(&manager);
            let inside = Arc::clone(&inside);
            thread::spawn(move || {
                manager.acquire(TxnId(2), &key(2), Exclusive, None).unwrap();
                inside.enter(Exclusive);
                assert!(manager.is_locked_by_other(Some(TxnId(2)), &key(1)));
                inside.leave(Exclusive);
                manager.release_all(TxnId(2), &[key(2)]);
            })
        };
        let held = locks.keys().len();
        locks.acquire(&manager, key(2), Exclusive, None).unwrap();
        inside.enter(Exclusive);
        inside.leave(Exclusive);
        locks.release_taken_since(&manager, held, |_| false);
        assert_eq!(locks.keys(), [key(1)]);
        assert_eq!(manager.holds(TxnId(1), &key(1)), Some(Exclusive));
        waiter.join().unwrap();
        assert_eq!(manager.holds(TxnId(1), &key(1)), Some(Exclusive));
        locks.release_all(&manager);
        assert!(!manager.is_locked_by_other(None, &key(1)));
        assert!(!manager.is_locked_by_other(None, &key(2)));
        assert_eq!(manager.stats().acquired, 3);
    });
}

/// An escalation races another transaction's request for a row of the same table: either the
/// escalation sees the row's lock and fails, or the request sees the table's lock and waits for
/// it to go. Never both win, which the row's counters would catch: the escalated transaction
/// counts itself into every row of the table it holds. A request that checked for the table's
/// lock before taking its shard mutex could take the row after the escalation looked at its
/// shard and before the table's lock was published to it.
#[test]
fn an_escalation_and_a_row_request_never_both_win() {
    model_check(3, || {
        let manager = Arc::new(LockManager::new(2));
        let inside = Arc::new(Inside::default());
        let other = {
            let (manager, inside) = (Arc::clone(&manager), Arc::clone(&inside));
            thread::spawn(move || transaction(&manager, &inside, 2, Exclusive))
        };
        let mut locks = TxnLocks::new(TxnId(1));
        locks.acquire(&manager, key(2), Exclusive, None).unwrap();
        if locks.escalate_if_large(&manager, 1) == 1 {
            inside.enter(Exclusive);
            inside.leave(Exclusive);
        }
        locks.release_all(&manager);
        other.join().unwrap();
        assert!(!manager.is_locked_by_other(None, &key(1)));
    });
}

/// A READ COMMITTED reader waits for a row whose transaction escalates meanwhile, letting go
/// of the row's own lock: the reader must go on waiting, for the table's lock, until the
/// transaction ends. A reader that took the row's release for the end would read the row's
/// uncommitted value (the engine's lookups found such a row still noted as deleted).
#[test]
fn a_reader_of_a_row_goes_on_waiting_when_its_writer_escalates() {
    model_check(3, || {
        let manager = Arc::new(LockManager::new(2));
        let committed = Arc::new(AtomicUsize::new(0));
        let mut locks = TxnLocks::new(TxnId(1));
        locks.acquire(&manager, key(1), Exclusive, None).unwrap();
        let reader = {
            let (manager, committed) = (Arc::clone(&manager), Arc::clone(&committed));
            thread::spawn(move || {
                // A look at any moment, the escalation's included, finds the row locked until
                // the commit.
                if !manager.is_locked_by_other(Some(TxnId(2)), &key(1)) {
                    assert_eq!(
                        committed.load(Ordering::SeqCst),
                        1,
                        "unlocked before the commit"
                    );
                }
                manager
                    .wait_for_shared(Some(TxnId(2)), &key(1), None)
                    .unwrap();
                assert_eq!(
                    committed.load(Ordering::SeqCst),
                    1,
                    "read before the commit"
                );
                assert!(!manager.is_locked_by_other(Some(TxnId(2)), &key(1)));
            })
        };
        let escalated = locks.escalate_if_large(&manager, 1);
        // While the writer has not ended, its row reads as locked, by the row's lock or the
        // table's, whenever the look comes.
        assert!(manager.is_locked_by_other(Some(TxnId(2)), &key(1)));
        committed.store(1, Ordering::SeqCst);
        locks.release_all(&manager);
        reader.join().unwrap();
        assert!(escalated <= 1);
    });
}
