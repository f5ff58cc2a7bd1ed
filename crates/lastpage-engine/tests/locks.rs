//! The row lock manager: compatibility, conversions, FIFO grants, timeouts, deadlock victims,
//! the READ COMMITTED reader protocol, wait statistics, and a randomized stress test with a
//! mutual-exclusion oracle (prints its seed; rerun with `LASTPAGE_SEED=<seed>`).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use lastpage_engine::locks::{LockError, LockKey, LockManager, LockMode, TxnId, TxnLocks};
use lastpage_engine::{Database, DatabaseOptions, EngineError, Value, WaitType};
use lastpage_storage::limits::LOCK_ESCALATION_THRESHOLD;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

use LockMode::{Exclusive, Shared};

mod common;

use common::{seed, wait_until};

const ZERO: Option<Duration> = Some(Duration::ZERO);

fn key(row: u8) -> LockKey {
    LockKey::new(1, vec![row])
}

/// Waits (politely, with a generous limit) until `count` transactions wait for a lock and have
/// looked for a deadlock, so a test can make the next request the one that closes a cycle.
fn wait_for_waiters(manager: &LockManager, count: usize) {
    wait_until(Duration::from_secs(10), "waiters never queued", || {
        manager.waiting_txns() >= count
    });
}

/// Requests `mode` on `key` for transaction `txn` on another thread and returns once that
/// request waits, as the `waiting`-th waiting transaction, so that the test goes on with it
/// queued; joining the handle gives the request's result.
fn queued(
    manager: &Arc<LockManager>,
    txn: u64,
    key: LockKey,
    mode: LockMode,
    waiting: usize,
) -> thread::JoinHandle<Result<(), LockError>> {
    let handle = {
        let manager = Arc::clone(manager);
        thread::spawn(move || manager.acquire(TxnId(txn), &key, mode, None))
    };
    wait_for_waiters(manager, waiting);
    handle
}

#[test]
fn compatibility_matrix_is_sql_servers() {
    for held in [Shared, Exclusive] {
        for requested in [Shared, Exclusive] {
            let manager = LockManager::new(4);
            manager.acquire(TxnId(1), &key(1), held, None).unwrap();
            let result = manager.acquire(TxnId(2), &key(1), requested, ZERO);
            let compatible = held == Shared && requested == Shared;
            assert_eq!(result.is_ok(), compatible, "{held:?} then {requested:?}");
            assert_eq!(held.is_compatible_with(requested), compatible);
            // A different row, or a different table with the same key bytes, never conflicts.
            manager.acquire(TxnId(2), &key(2), Exclusive, ZERO).unwrap();
            manager
                .acquire(TxnId(2), &LockKey::new(2, vec![1]), Exclusive, ZERO)
                .unwrap();
        }
    }
}

#[test]
fn keys_of_every_length_lock_by_their_bytes() {
    // Short keys are stored inside the lock and long ones allocated: around the boundary and far
    // past it, two keys are the same resource exactly when their table and bytes are.
    use std::collections::hash_map::DefaultHasher;
    use std::hash::{Hash, Hasher};
    let hash = |key: &LockKey| {
        let mut hasher = DefaultHasher::new();
        key.hash(&mut hasher);
        hasher.finish()
    };
    assert_eq!(
        std::mem::size_of::<LockKey>(),
        40,
        "the size LOCK_KEY_INLINE_BYTES promises"
    );
    let manager = LockManager::new(8);
    let lengths = [0, 1, 29, 30, 31, 32, 100, 1000];
    for &length in &lengths {
        let bytes: Vec<u8> = (0..length).map(|i| (i * 7 + length) as u8).collect();
        let (first, second) = (LockKey::new(3, &bytes), LockKey::new(3, bytes.clone()));
        assert_eq!(first, second, "length {length}");
        assert_eq!(hash(&first), hash(&second), "length {length}");
        assert_eq!(first.key(), &bytes[..]);
        assert_eq!(first.table_id(), 3);
        assert_ne!(first, LockKey::new(4, &bytes), "length {length}");
        manager.acquire(TxnId(1), &first, Exclusive, ZERO).unwrap();
        let conflict = manager.acquire(TxnId(2), &second.clone(), Shared, ZERO);
        assert!(
            matches!(conflict, Err(LockError::Timeout { .. })),
            "length {length}"
        );
        assert!(manager.is_locked_by_other(Some(TxnId(2)), &second));
    }
    // A key one byte longer or shorter is another row.
    for pair in lengths.windows(2) {
        let shorter = LockKey::new(9, vec![5; pair[0]]);
        let longer = LockKey::new(9, vec![5; pair[1]]);
        assert_ne!(shorter, longer);
        assert!(shorter < longer);
    }
    let all: Vec<LockKey> = lengths
        .iter()
        .map(|&length| {
            LockKey::new(
                3,
                (0..length)
                    .map(|i| (i * 7 + length) as u8)
                    .collect::<Vec<u8>>(),
            )
        })
        .collect();
    manager.release_all(TxnId(1), &all);
    for key in &all {
        assert!(!manager.is_locked_by_other(Some(TxnId(2)), key));
        manager.acquire(TxnId(2), key, Exclusive, ZERO).unwrap();
    }
}

#[test]
fn reacquiring_is_free_and_release_all_frees_everything() {
    let manager = LockManager::new(1);
    let mut locks = TxnLocks::new(TxnId(7));
    locks.acquire(&manager, key(1), Exclusive, None).unwrap();
    locks.acquire(&manager, key(1), Shared, None).unwrap();
    locks.acquire(&manager, key(1), Exclusive, None).unwrap();
    locks.acquire(&manager, key(2), Shared, None).unwrap();
    locks.acquire(&manager, key(2), Shared, None).unwrap();
    assert_eq!(locks.keys(), &[key(1), key(2)]);
    assert_eq!(manager.holds(TxnId(7), &key(1)), Some(Exclusive));
    assert_eq!(manager.holds(TxnId(7), &key(2)), Some(Shared));
    assert_eq!(manager.holds(TxnId(8), &key(1)), None);
    assert_eq!(manager.stats().acquired, 2);
    locks.release_all(&manager);
    assert!(locks.keys().is_empty());
    assert_eq!(manager.holds(TxnId(7), &key(1)), None);
    manager.acquire(TxnId(8), &key(1), Exclusive, ZERO).unwrap();
    manager.acquire(TxnId(8), &key(2), Exclusive, ZERO).unwrap();
    // Releasing keys that are not held, or twice, is harmless.
    manager.release_all(TxnId(7), &[key(1), key(3)]);
    manager.release_all(TxnId(8), &[key(1), key(1), key(2)]);
    assert!(!manager.is_locked_by_other(None, &key(1)));
}

#[test]
fn a_sole_shared_holder_converts_at_once_and_others_wait_for_the_readers() {
    let manager = Arc::new(LockManager::new(2));
    manager.acquire(TxnId(1), &key(1), Shared, None).unwrap();
    manager.acquire(TxnId(1), &key(1), Exclusive, ZERO).unwrap();
    assert_eq!(manager.holds(TxnId(1), &key(1)), Some(Exclusive));
    manager.release_all(TxnId(1), &[key(1)]);

    manager.acquire(TxnId(1), &key(1), Shared, None).unwrap();
    manager.acquire(TxnId(2), &key(1), Shared, None).unwrap();
    assert_eq!(
        manager.acquire(TxnId(1), &key(1), Exclusive, ZERO),
        Err(LockError::Timeout { ms: 0 })
    );
    let upgrader = queued(&manager, 1, key(1), Exclusive, 1);
    // While it waits, the converter still holds its S lock.
    assert_eq!(manager.holds(TxnId(1), &key(1)), Some(Shared));
    manager.release_all(TxnId(2), &[key(1)]);
    upgrader.join().unwrap().unwrap();
    assert_eq!(manager.holds(TxnId(1), &key(1)), Some(Exclusive));
    assert!(manager.is_locked_by_other(Some(TxnId(2)), &key(1)));
    assert!(!manager.is_locked_by_other(Some(TxnId(1)), &key(1)));
}

#[test]
fn two_converters_deadlock_and_the_second_is_the_victim() {
    let manager = Arc::new(LockManager::new(2));
    manager.acquire(TxnId(1), &key(1), Shared, None).unwrap();
    manager.acquire(TxnId(2), &key(1), Shared, None).unwrap();
    let first = queued(&manager, 1, key(1), Exclusive, 1);
    assert_eq!(
        manager.acquire(TxnId(2), &key(1), Exclusive, None),
        Err(LockError::Deadlock { victim: TxnId(2) })
    );
    manager.release_all(TxnId(2), &[key(1)]);
    first.join().unwrap().unwrap();
    assert_eq!(manager.holds(TxnId(1), &key(1)), Some(Exclusive));
    assert_eq!(manager.stats().deadlocks, 1);
}

#[test]
fn grants_are_fifo_so_readers_cannot_starve_a_writer() {
    let manager = Arc::new(LockManager::new(1));
    manager.acquire(TxnId(1), &key(1), Shared, None).unwrap();
    let writer = queued(&manager, 2, key(1), Exclusive, 1);
    // S is compatible with the holder, but a writer is queued ahead.
    assert!(manager.acquire(TxnId(3), &key(1), Shared, ZERO).is_err());
    let reader = queued(&manager, 3, key(1), Shared, 2);
    manager.release_all(TxnId(1), &[key(1)]);
    writer.join().unwrap().unwrap();
    assert_eq!(manager.holds(TxnId(2), &key(1)), Some(Exclusive));
    assert_eq!(manager.holds(TxnId(3), &key(1)), None);
    manager.release_all(TxnId(2), &[key(1)]);
    reader.join().unwrap().unwrap();
    assert_eq!(manager.holds(TxnId(3), &key(1)), Some(Shared));
}

#[test]
fn a_timeout_fails_with_sql_servers_error_1222_and_is_recorded() {
    let db = Database::create(DatabaseOptions::default()).unwrap();
    let session = db.session();
    let manager = LockManager::new(8);
    manager.acquire(TxnId(1), &key(1), Exclusive, None).unwrap();
    let started = Instant::now();
    let (result, waits) = session.run_statement(|| {
        manager.acquire(TxnId(2), &key(1), Shared, Some(Duration::from_millis(50)))
    });
    let error = result.unwrap_err();
    assert!(started.elapsed() >= Duration::from_millis(50));
    assert_eq!(error, LockError::Timeout { ms: 50 });
    assert_eq!(error.to_string(), "Lock request time out period exceeded.");
    assert_eq!(error.number(), 1222);
    let lck_m_s = waits.wait(WaitType::LckMS);
    assert_eq!(lck_m_s.waiting_tasks_count, 1);
    assert!(lck_m_s.wait_time_ns >= 50_000_000, "{lck_m_s:?}");
    assert_eq!(lck_m_s.signal_wait_time_ns, 0);
    // A zero timeout fails at once and records no wait, like SET LOCK_TIMEOUT 0.
    let (result, waits) =
        session.run_statement(|| manager.acquire(TxnId(2), &key(1), Exclusive, ZERO));
    assert_eq!(result, Err(LockError::Timeout { ms: 0 }));
    assert_eq!(waits.wait(WaitType::LckMX).waiting_tasks_count, 0);
    let stats = manager.stats();
    assert_eq!((stats.timeouts, stats.waits, stats.deadlocks), (2, 1, 0));
    // The timed-out request left the queue: the key is free once the holder leaves.
    manager.release_all(TxnId(1), &[key(1)]);
    manager.acquire(TxnId(3), &key(1), Exclusive, ZERO).unwrap();
}

#[test]
fn lock_waits_are_recorded_as_lck_m_x_and_lck_m_s_for_the_waiting_session() {
    let db = Database::create(DatabaseOptions::default()).unwrap();
    let manager = Arc::new(LockManager::new(8));
    let before = db.wait_stats();
    for (mode, wait_type) in [(Exclusive, WaitType::LckMX), (Shared, WaitType::LckMS)] {
        manager.acquire(TxnId(1), &key(1), Exclusive, None).unwrap();
        let waiter = {
            let manager = Arc::clone(&manager);
            let session = db.session();
            thread::spawn(move || {
                let (result, waits) =
                    session.run_statement(|| manager.acquire(TxnId(2), &key(1), mode, None));
                result.unwrap();
                (waits, session.waits())
            })
        };
        wait_for_waiters(&manager, 1);
        thread::sleep(Duration::from_millis(5));
        manager.release_all(TxnId(1), &[key(1)]);
        let (statement_waits, session_waits) = waiter.join().unwrap();
        for waits in [statement_waits, session_waits] {
            let stat = waits.wait(wait_type);
            assert_eq!(stat.waiting_tasks_count, 1, "{wait_type:?}");
            assert!(stat.wait_time_ns >= 5_000_000, "{stat:?}");
            assert!(stat.signal_wait_time_ns <= stat.wait_time_ns);
        }
        manager.release_all(TxnId(2), &[key(1)]);
    }
    let during = db.wait_stats().since(&before);
    assert!(during.wait(WaitType::LckMX).waiting_tasks_count >= 1);
    assert!(during.wait(WaitType::LckMS).waiting_tasks_count >= 1);
    // Uncontended requests record nothing.
    let session = db.session();
    let (_, waits) = session.run_statement(|| {
        manager.acquire(TxnId(3), &key(9), Exclusive, None).unwrap();
        manager.acquire(TxnId(4), &key(8), Shared, None).unwrap();
    });
    assert_eq!(waits.wait(WaitType::LckMX).waiting_tasks_count, 0);
    assert_eq!(waits.wait(WaitType::LckMS).waiting_tasks_count, 0);
}

#[test]
fn a_two_transaction_deadlock_has_one_victim_the_requester_that_closed_it() {
    let manager = Arc::new(LockManager::new(16));
    manager.acquire(TxnId(1), &key(1), Exclusive, None).unwrap();
    manager.acquire(TxnId(2), &key(2), Exclusive, None).unwrap();
    let first = {
        let manager = Arc::clone(&manager);
        thread::spawn(move || {
            let result = manager.acquire(TxnId(1), &key(2), Exclusive, None);
            manager.release_all(TxnId(1), &[key(1), key(2)]);
            result
        })
    };
    wait_for_waiters(&manager, 1);
    let error = manager
        .acquire(TxnId(2), &key(1), Shared, None)
        .unwrap_err();
    assert_eq!(error, LockError::Deadlock { victim: TxnId(2) });
    // The manager knows transactions only; the engine's error names the victim's session
    // (durability.rs::a_deadlock_picks_one_victim_and_names_it).
    assert_eq!(
        error.to_string(),
        "Transaction 2 was deadlocked on lock resources with another transaction and has been \
         chosen as the deadlock victim. Rerun the transaction."
    );
    assert_eq!(error.number(), 1205);
    // The victim rolls back; the survivor gets its lock.
    manager.release_all(TxnId(2), &[key(2)]);
    first.join().unwrap().unwrap();
    let stats = manager.stats();
    assert_eq!((stats.deadlocks, stats.waits, stats.timeouts), (1, 2, 0));
}

#[test]
fn a_three_transaction_cycle_has_exactly_one_victim() {
    let manager = Arc::new(LockManager::new(16));
    for txn in 1..=3 {
        manager
            .acquire(TxnId(txn), &key(txn as u8), Exclusive, None)
            .unwrap();
    }
    // 1 waits for 2, 2 waits for 3; 3 asking for 1's row closes the cycle.
    let waiters: Vec<_> = [(1u64, 2u8), (2, 3)]
        .into_iter()
        .map(|(txn, row)| {
            let waiter_manager = Arc::clone(&manager);
            let handle = thread::spawn(move || {
                let result = waiter_manager.acquire(TxnId(txn), &key(row), Exclusive, None);
                (txn, result)
            });
            wait_for_waiters(&manager, txn as usize);
            handle
        })
        .collect();
    let closing = manager.acquire(TxnId(3), &key(1), Exclusive, None);
    assert_eq!(closing, Err(LockError::Deadlock { victim: TxnId(3) }));
    manager.release_all(TxnId(3), &[key(3)]);
    // Now 2 gets row 3, commits, and 1 gets row 2.
    let mut waiters = waiters.into_iter();
    let first = waiters.next().unwrap();
    let (txn, result) = waiters.next().unwrap().join().unwrap();
    assert_eq!((txn, result), (2, Ok(())));
    manager.release_all(TxnId(2), &[key(2), key(3)]);
    let (txn, result) = first.join().unwrap();
    assert_eq!((txn, result), (1, Ok(())));
    assert_eq!(manager.stats().deadlocks, 1);
}

#[test]
fn read_committed_readers_wait_for_x_and_leave_holding_nothing() {
    let db = Database::create(DatabaseOptions::default()).unwrap();
    let manager = Arc::new(LockManager::new(4));
    // No X lock: no wait. Another transaction's S lock does not stop a reader either.
    manager.wait_for_shared(None, &key(1), ZERO).unwrap();
    manager.acquire(TxnId(1), &key(1), Shared, None).unwrap();
    manager.wait_for_shared(None, &key(1), ZERO).unwrap();
    assert!(!manager.is_locked_by_other(None, &key(1)));
    manager.release_all(TxnId(1), &[key(1)]);

    manager.acquire(TxnId(1), &key(1), Exclusive, None).unwrap();
    assert!(manager.is_locked_by_other(None, &key(1)));
    assert!(manager.is_locked_by_other(Some(TxnId(2)), &key(1)));
    // A transaction reads its own writes.
    assert!(!manager.is_locked_by_other(Some(TxnId(1)), &key(1)));
    manager
        .wait_for_shared(Some(TxnId(1)), &key(1), ZERO)
        .unwrap();
    assert_eq!(
        manager.wait_for_shared(None, &key(1), Some(Duration::from_millis(10))),
        Err(LockError::Timeout { ms: 10 })
    );
    let reader = {
        let manager = Arc::clone(&manager);
        let session = db.session();
        thread::spawn(move || {
            let (result, waits) =
                session.run_statement(|| manager.wait_for_shared(Some(TxnId(5)), &key(1), None));
            (result, waits)
        })
    };
    wait_for_waiters(&manager, 1);
    manager.release_all(TxnId(1), &[key(1)]);
    let (result, waits) = reader.join().unwrap();
    result.unwrap();
    assert_eq!(waits.wait(WaitType::LckMS).waiting_tasks_count, 1);
    assert_eq!(manager.holds(TxnId(5), &key(1)), None);
    manager.acquire(TxnId(6), &key(1), Exclusive, ZERO).unwrap();
}

#[test]
fn a_reader_in_a_transaction_can_be_a_deadlock_victim() {
    let manager = Arc::new(LockManager::new(4));
    manager.acquire(TxnId(1), &key(1), Exclusive, None).unwrap();
    manager.acquire(TxnId(2), &key(2), Exclusive, None).unwrap();
    let writer = queued(&manager, 1, key(2), Exclusive, 1);
    assert_eq!(
        manager.wait_for_shared(Some(TxnId(2)), &key(1), None),
        Err(LockError::Deadlock { victim: TxnId(2) })
    );
    manager.release_all(TxnId(2), &[key(2)]);
    writer.join().unwrap().unwrap();
}

/// Per key, how many transactions the oracle believes hold it in each mode.
#[derive(Default)]
struct Oracle {
    exclusive: AtomicUsize,
    shared: AtomicUsize,
}

#[test]
fn random_transactions_keep_mutual_exclusion_and_all_finish() {
    const THREADS: usize = 16;
    const TXNS_PER_THREAD: usize = 150;
    const KEYS: u8 = 8;
    let seed = seed();

    let manager = Arc::new(LockManager::new(4));
    let oracle: Arc<Vec<Oracle>> = Arc::new((0..KEYS).map(|_| Oracle::default()).collect());
    let next_txn = Arc::new(AtomicU64::new(1));
    let failures = Arc::new(AtomicU64::new(0));
    let threads: Vec<_> = (0..THREADS)
        .map(|thread_index| {
            let manager = Arc::clone(&manager);
            let oracle = Arc::clone(&oracle);
            let next_txn = Arc::clone(&next_txn);
            let failures = Arc::clone(&failures);
            let mut rng = StdRng::seed_from_u64(seed ^ (thread_index as u64).wrapping_mul(0x9e37));
            thread::spawn(move || {
                for _ in 0..TXNS_PER_THREAD {
                    // A transaction: a few rows in random order and modes, some read again for
                    // update (S then X: a conversion).
                    let mut rows: Vec<u8> = (0..KEYS).collect();
                    rows.shuffle(&mut rng);
                    rows.truncate(rng.random_range(1..=4));
                    let mut plan: Vec<(u8, LockMode)> = rows
                        .iter()
                        .map(|&row| {
                            (
                                row,
                                if rng.random_bool(0.5) {
                                    Shared
                                } else {
                                    Exclusive
                                },
                            )
                        })
                        .collect();
                    if rng.random_bool(0.3) {
                        let (row, _) = plan[0];
                        plan.push((row, Exclusive));
                    }
                    // Short timeouts resolve what they can; the others rely on the detector, so
                    // a timeout of theirs would mean a missed deadlock.
                    let relies_on_detector = rng.random_bool(0.5);
                    let timeout = if relies_on_detector {
                        Some(Duration::from_secs(20))
                    } else {
                        Some(Duration::from_millis(rng.random_range(1..20)))
                    };
                    let started = Instant::now();
                    let mut attempts: u64 = 0;
                    loop {
                        attempts += 1;
                        assert!(
                            started.elapsed() < Duration::from_secs(60),
                            "a transaction never finished after {attempts} attempts: {plan:?} \
                             {timeout:?}, {:?}",
                            manager.stats()
                        );
                        let txn = TxnId(next_txn.fetch_add(1, Ordering::Relaxed));
                        let mut locks = TxnLocks::new(txn);
                        let mut held: Vec<(u8, LockMode)> = Vec::new();
                        let mut outcome = Ok(());
                        for &(row, mode) in &plan {
                            if let Err(error) = locks.acquire(&manager, key(row), mode, timeout) {
                                outcome = Err(error);
                                break;
                            }
                            let counts = &oracle[usize::from(row)];
                            let previous = held.iter().position(|&(held_row, _)| held_row == row);
                            match (previous.map(|index| held[index].1), mode) {
                                (Some(Exclusive), _) | (Some(Shared), Shared) => continue,
                                (Some(Shared), Exclusive) => {
                                    counts.shared.fetch_sub(1, Ordering::SeqCst);
                                    held.retain(|&(held_row, _)| held_row != row);
                                }
                                (None, _) => {}
                            }
                            match mode {
                                Exclusive => {
                                    assert_eq!(counts.exclusive.fetch_add(1, Ordering::SeqCst), 0);
                                    assert_eq!(counts.shared.load(Ordering::SeqCst), 0);
                                }
                                Shared => {
                                    counts.shared.fetch_add(1, Ordering::SeqCst);
                                    assert_eq!(counts.exclusive.load(Ordering::SeqCst), 0);
                                }
                            }
                            held.push((row, mode));
                            if rng.random_bool(0.2) {
                                thread::yield_now();
                            }
                        }
                        for &(row, mode) in &held {
                            let counts = &oracle[usize::from(row)];
                            match mode {
                                Exclusive => counts.exclusive.fetch_sub(1, Ordering::SeqCst),
                                Shared => counts.shared.fetch_sub(1, Ordering::SeqCst),
                            };
                        }
                        locks.release_all(&manager);
                        match outcome {
                            Ok(()) => break,
                            Err(LockError::Deadlock { victim }) => assert_eq!(victim, txn),
                            Err(LockError::Timeout { .. }) => {
                                assert!(!relies_on_detector, "a deadlock went undetected");
                            }
                        }
                        failures.fetch_add(1, Ordering::Relaxed);
                        // Rerun after a short random pause, as an application would, so that a
                        // transaction that keeps closing cycles with the same partners (the
                        // victim is always the one that closes the cycle) gets out of step.
                        let pause_us = rng.random_range(0..50 * attempts.min(20));
                        thread::sleep(Duration::from_micros(pause_us));
                    }
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    let stats = manager.stats();
    println!("{stats:?}");
    assert_eq!(
        stats.deadlocks + stats.timeouts,
        failures.load(Ordering::Relaxed)
    );
    assert_eq!(manager.waiting_txns(), 0);
    for row in 0..KEYS {
        assert!(!manager.is_locked_by_other(None, &key(row)));
        manager
            .acquire(TxnId(0), &key(row), Exclusive, ZERO)
            .unwrap();
    }
}

/// A row key of table 1 from a number, in memcomparable (big-endian) order.
fn row(number: u16) -> LockKey {
    LockKey::new(1, number.to_be_bytes())
}

#[test]
fn a_range_lock_covers_every_row_in_it_until_its_transaction_ends() {
    let db = Database::create(DatabaseOptions::default()).unwrap();
    let manager = Arc::new(LockManager::new(8));
    let mut owner = TxnLocks::new(TxnId(1));
    owner
        .acquire_range(&manager, &row(10), &row(20), None)
        .unwrap();
    assert_eq!(owner.keys().len(), 1);
    assert!(owner.keys()[0].is_range());
    for (number, covered) in [(9, false), (10, true), (15, true), (20, true), (21, false)] {
        assert_eq!(
            manager.is_locked_by_other(None, &row(number)),
            covered,
            "row {number}"
        );
        assert_eq!(
            manager.holds(TxnId(1), &row(number)),
            covered.then_some(Exclusive)
        );
        assert!(!manager.is_locked_by_other(Some(TxnId(1)), &row(number)));
    }
    // The same bytes in another table are another row.
    assert!(!manager.is_locked_by_other(None, &LockKey::new(2, 15u16.to_be_bytes())));
    // The owner's own requests inside the range are held already and add no lock.
    owner.acquire(&manager, row(15), Exclusive, ZERO).unwrap();
    assert_eq!(owner.keys().len(), 1);
    // Others wait: with no time to wait, they fail at once.
    for mode in [Shared, Exclusive] {
        assert_eq!(
            manager.acquire(TxnId(2), &row(12), mode, ZERO),
            Err(LockError::Timeout { ms: 0 })
        );
    }
    assert_eq!(
        manager.wait_for_shared(None, &row(12), ZERO),
        Err(LockError::Timeout { ms: 0 })
    );
    // Rows outside it are free.
    manager
        .acquire(TxnId(2), &row(21), Exclusive, ZERO)
        .unwrap();

    // A writer and a reader that wait are let through by the release, as LCK_M_X and LCK_M_S.
    let spawn = |reader: bool| {
        let manager = Arc::clone(&manager);
        let session = db.session();
        thread::spawn(move || {
            let (result, waits) = session.run_statement(|| {
                if reader {
                    manager.wait_for_shared(Some(TxnId(4)), &row(18), None)
                } else {
                    manager.acquire(TxnId(3), &row(12), Exclusive, None)
                }
            });
            (result, waits)
        })
    };
    let writer = spawn(false);
    wait_for_waiters(&manager, 1);
    let reader = spawn(true);
    wait_for_waiters(&manager, 2);
    owner.release_all(&manager);
    let (result, waits) = writer.join().unwrap();
    result.unwrap();
    assert_eq!(waits.wait(WaitType::LckMX).waiting_tasks_count, 1);
    let (result, waits) = reader.join().unwrap();
    result.unwrap();
    assert_eq!(waits.wait(WaitType::LckMS).waiting_tasks_count, 1);
    // Released: only the writer's own row lock is left.
    assert_eq!(manager.holds(TxnId(3), &row(12)), Some(Exclusive));
    assert!(!manager.is_locked_by_other(None, &row(15)));
    manager
        .acquire(TxnId(5), &row(15), Exclusive, ZERO)
        .unwrap();
}

#[test]
fn ranges_from_the_same_low_end_conflict_and_one_transactions_range_can_grow() {
    let manager = LockManager::new(4);
    let mut first = TxnLocks::new(TxnId(1));
    first
        .acquire_range(&manager, &row(5), &row(6), None)
        .unwrap();
    first
        .acquire_range(&manager, &row(5), &row(9), None)
        .unwrap();
    assert_eq!(first.keys().len(), 1);
    assert!(manager.is_locked_by_other(None, &row(9)));
    assert_eq!(
        manager.lock_range(TxnId(2), &row(5), &row(7), ZERO),
        Err(LockError::Timeout { ms: 0 })
    );
    first.release_all(&manager);
    assert!(!manager.is_locked_by_other(None, &row(9)));
    manager
        .lock_range(TxnId(2), &row(5), &row(7), ZERO)
        .unwrap();
}

#[test]
fn a_deadlock_through_a_range_has_one_victim() {
    let manager = Arc::new(LockManager::new(4));
    manager
        .lock_range(TxnId(1), &row(10), &row(20), None)
        .unwrap();
    manager.acquire(TxnId(2), &row(1), Exclusive, None).unwrap();
    let first = queued(&manager, 1, row(1), Exclusive, 1);
    assert_eq!(
        manager.acquire(TxnId(2), &row(15), Shared, None),
        Err(LockError::Deadlock { victim: TxnId(2) })
    );
    manager.release_all(TxnId(2), &[row(1)]);
    first.join().unwrap().unwrap();
}

/// Inserters lock a fresh block of rows with one range each, "insert" them (publish the block),
/// then commit (set the block's flag) and release; readers and writers pick published rows and
/// must never get past a row whose block has not committed. The oracle is the flag: it is set
/// before the release, so a request that returns before it is set went past the range.
#[test]
fn nobody_gets_past_an_uncommitted_range() {
    const INSERTERS: usize = 4;
    const OTHERS: usize = 8;
    const BLOCKS_PER_INSERTER: u16 = 200;
    const BLOCK_ROWS: u16 = 4;
    let seed = seed();

    let manager = Arc::new(LockManager::new(4));
    let next_block = Arc::new(AtomicU64::new(0));
    let next_txn = Arc::new(AtomicU64::new(1));
    let total_blocks = INSERTERS * usize::from(BLOCKS_PER_INSERTER);
    let committed: Arc<Vec<std::sync::atomic::AtomicBool>> = Arc::new(
        (0..total_blocks)
            .map(|_| std::sync::atomic::AtomicBool::new(false))
            .collect(),
    );
    let published = Arc::new(std::sync::Mutex::new(Vec::<u16>::new()));
    let inserting = Arc::new(AtomicUsize::new(INSERTERS));
    let passes = Arc::new(AtomicU64::new(0));
    let mut handles = Vec::new();
    for thread_index in 0..INSERTERS + OTHERS {
        let (manager, next_block, next_txn, committed, published, inserting, passes) = (
            Arc::clone(&manager),
            Arc::clone(&next_block),
            Arc::clone(&next_txn),
            Arc::clone(&committed),
            Arc::clone(&published),
            Arc::clone(&inserting),
            Arc::clone(&passes),
        );
        let mut rng = StdRng::seed_from_u64(seed ^ (thread_index as u64).wrapping_mul(0x9e37));
        handles.push(thread::spawn(move || {
            if thread_index < INSERTERS {
                for _ in 0..BLOCKS_PER_INSERTER {
                    let block = next_block.fetch_add(1, Ordering::Relaxed) as u16;
                    let txn = TxnId(next_txn.fetch_add(1, Ordering::Relaxed));
                    let low = block * BLOCK_ROWS;
                    let mut locks = TxnLocks::new(txn);
                    locks
                        .acquire_range(&manager, &row(low), &row(low + BLOCK_ROWS - 1), None)
                        .unwrap();
                    published.lock().unwrap().push(block);
                    for _ in 0..rng.random_range(0..3) {
                        thread::yield_now();
                    }
                    committed[usize::from(block)].store(true, Ordering::SeqCst);
                    locks.release_all(&manager);
                }
                inserting.fetch_sub(1, Ordering::SeqCst);
            } else {
                while inserting.load(Ordering::SeqCst) > 0 {
                    let block = {
                        let published = published.lock().unwrap();
                        if published.is_empty() {
                            drop(published);
                            thread::yield_now();
                            continue;
                        }
                        // Mostly the newest blocks, which are the ones still being inserted.
                        let newest = published.len().saturating_sub(INSERTERS * 2);
                        published[rng.random_range(newest..published.len())]
                    };
                    let key = row(block * BLOCK_ROWS + rng.random_range(0..BLOCK_ROWS));
                    let txn = TxnId(next_txn.fetch_add(1, Ordering::Relaxed));
                    let writer = rng.random_bool(0.5);
                    if writer {
                        manager
                            .acquire(txn, &key, Exclusive, Some(Duration::from_secs(20)))
                            .unwrap();
                    } else {
                        manager
                            .wait_for_shared(Some(txn), &key, Some(Duration::from_secs(20)))
                            .unwrap();
                    }
                    assert!(
                        committed[usize::from(block)].load(Ordering::SeqCst),
                        "{} got past block {block}'s range before it committed (seed {seed})",
                        if writer { "a writer" } else { "a reader" }
                    );
                    if writer {
                        manager.release_all(txn, &[key]);
                    }
                    passes.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    for handle in handles {
        handle.join().unwrap();
    }
    assert!(passes.load(Ordering::Relaxed) > 0);
    let stats = manager.stats();
    assert!(
        stats.waits > 0,
        "no request ever waited for a range: {stats:?}"
    );
    assert_eq!((stats.timeouts, stats.deadlocks), (0, 0));
}

/// A READ COMMITTED reader waits only for the X lock it found: when that lock goes, the reader
/// goes too, even if a writer queued ahead of it takes X next. Granted in queue order, the
/// reader waited for the writer's whole transaction (here it timed out instead).
#[test]
fn a_reader_goes_when_the_x_lock_it_waits_for_goes_even_with_a_writer_queued_ahead() {
    let manager = LockManager::new(4);
    let key = LockKey::new(1, [1]);
    manager.acquire(TxnId(1), &key, Exclusive, None).unwrap();
    let reader_done = std::sync::atomic::AtomicBool::new(false);
    let read = thread::scope(|scope| {
        scope.spawn(|| {
            manager.acquire(TxnId(2), &key, Exclusive, None).unwrap();
            // Holds X until the reader is back, or for 5 s.
            let deadline = Instant::now() + Duration::from_secs(5);
            while !reader_done.load(Ordering::SeqCst) && Instant::now() < deadline {
                thread::sleep(Duration::from_millis(1));
            }
            manager.release_all(TxnId(2), std::slice::from_ref(&key));
        });
        while manager.stats().waits < 1 {
            thread::yield_now();
        }
        let reader =
            scope.spawn(|| manager.wait_for_shared(None, &key, Some(Duration::from_secs(2))));
        while manager.stats().waits < 2 {
            thread::yield_now();
        }
        manager.release_all(TxnId(1), std::slice::from_ref(&key));
        let read = reader.join().unwrap();
        reader_done.store(true, Ordering::SeqCst);
        read
    });
    // Only a reader let through at T1's release returns while the writer holds X.
    assert!(read.is_ok(), "{read:?}");
}

/// A request's timeout covers all of its waits: one for a range lock over its row, then one
/// for the row. Each wait had the whole timeout before, so a request could wait about twice
/// its timeout (it got the row when it was released 1.5 s after it queued, with a 1 s timeout).
///
/// The sleeps only make the request's waits long. The clock starts once the request is seen
/// queued, so a late start of its thread cannot move its deadline (1 s) past the row's release
/// (1.5 s), and only a test thread that overslept by more than 0.5 s could hand it the row in
/// time. A fresh timeout for the row, started at the range's release (0.7 s), would run to
/// 1.7 s, past the row's release: that is the bug the test catches (it would miss it only if
/// the test thread overslept by more than 0.2 s).
#[test]
fn a_timeout_covers_the_wait_for_a_range_and_then_for_the_row() {
    let manager = Arc::new(LockManager::new(4));
    // Transaction 2 holds the row, then transaction 1 a range over it (a range does not wait
    // for the rows inside it).
    manager.acquire(TxnId(2), &key(5), Exclusive, None).unwrap();
    let range = manager
        .lock_range(TxnId(1), &key(1), &key(9), None)
        .unwrap();
    let requester = {
        let manager = Arc::clone(&manager);
        thread::spawn(move || {
            manager.acquire(
                TxnId(3),
                &key(5),
                Exclusive,
                Some(Duration::from_millis(1000)),
            )
        })
    };
    wait_until(Duration::from_secs(10), "the request to queue", || {
        manager.stats().waits > 0
    });
    let queued = Instant::now();
    thread::sleep(Duration::from_millis(700).saturating_sub(queued.elapsed()));
    manager.release_all(TxnId(1), &[range]);
    thread::sleep(Duration::from_millis(1500).saturating_sub(queued.elapsed()));
    manager.release_all(TxnId(2), &[key(5)]);
    assert_eq!(
        requester.join().unwrap(),
        Err(LockError::Timeout { ms: 1000 }),
        "the request outwaited its timeout"
    );
}

/// A READ COMMITTED read waits for a row within one timeout, however many writers lock the row
/// in turn. Here the reader queues behind one writer, a second writer queues behind the reader,
/// and the first commits 0.7 s after the reader queued: the release wakes the reader and hands
/// the row to the second writer, so the reader finds it locked again and waits again. With a
/// fresh timeout for that wait it read the row when the second writer committed, at 1.5 s, with
/// a 1 s timeout.
///
/// The sleeps only make the waits long. The clock starts once the reader is seen queued, so a
/// late start of its thread cannot move its deadline; the second commit comes 0.5 s after the
/// deadline, so only a test thread that overslept by more than that could let the reader read.
#[test]
fn a_read_committed_reader_waits_for_a_row_within_one_timeout() {
    use lastpage_engine::{EngineError, InsertRow, Value};
    let db = common::in_memory_with_lock_timeout(Duration::from_millis(1000));
    let table = db.create_table(common::accounts()).unwrap();
    let setup = db.session();
    table
        .insert(&setup, InsertRow::new().set(0, 1).set(1, 100))
        .unwrap();
    let row = [Value::Int(1)];
    let first = db.session();
    first.begin().unwrap();
    assert!(table.update(&first, &row, &[(1, Value::Int(101))]).unwrap());
    let waits_before = db.lock_stats().waits;
    thread::scope(|scope| {
        let reader = scope.spawn(|| table.get(&db.session(), &row).map(|_| ()));
        wait_until(Duration::from_secs(10), "the reader to queue", || {
            db.lock_stats().waits > waits_before
        });
        let queued = Instant::now();
        let (db, table, row) = (&db, &table, &row);
        let second = scope.spawn(move || {
            let session = db.session();
            session.begin().unwrap();
            // A generous timeout of its own would not do: the database's is 1 s, and this
            // writer waits about 0.7 s for the first.
            table.update(&session, row, &[(1, Value::Int(102))])?;
            thread::sleep(Duration::from_millis(1500).saturating_sub(queued.elapsed()));
            session.commit()
        });
        wait_until(
            Duration::from_secs(10),
            "the second writer to queue",
            || db.lock_stats().waits > waits_before + 1,
        );
        thread::sleep(Duration::from_millis(700).saturating_sub(queued.elapsed()));
        first.commit().unwrap();
        let read = reader.join().unwrap();
        assert!(
            matches!(
                read,
                Err(EngineError::Lock(LockError::Timeout { ms: 1000 }))
            ),
            "the reader outwaited its timeout: {read:?}"
        );
        second.join().unwrap().unwrap();
    });
}

/// A row key of table `table` from a number.
fn row_of(table: u32, number: u32) -> LockKey {
    LockKey::new(table, number.to_be_bytes())
}

#[test]
fn an_escalated_transaction_holds_its_table_with_one_lock() {
    let manager = Arc::new(LockManager::new(8));
    let mut big = TxnLocks::new(TxnId(1));
    for number in 0..20 {
        big.acquire(&manager, row_of(1, number), Exclusive, ZERO)
            .unwrap();
    }
    big.acquire(&manager, row_of(2, 7), Exclusive, ZERO)
        .unwrap();
    assert_eq!(big.escalate_if_large(&manager, 10), 1);
    // Its 20 row locks on table 1 became one; the one on table 2 stays.
    assert_eq!(big.keys(), &[row_of(2, 7), LockKey::whole_table(1)]);
    let stats = manager.stats();
    assert_eq!((stats.escalations, stats.failed_escalations), (1, 0));
    // Every row of table 1 is the escalated transaction's now, those it never locked too...
    for number in [3, 500] {
        assert!(manager.is_locked_by_other(None, &row_of(1, number)));
        assert!(!manager.is_locked_by_other(Some(TxnId(1)), &row_of(1, number)));
        assert_eq!(
            manager.acquire(TxnId(2), &row_of(1, number), Exclusive, ZERO),
            Err(LockError::Timeout { ms: 0 })
        );
        assert_eq!(
            manager.wait_for_shared(Some(TxnId(2)), &row_of(1, number), ZERO),
            Err(LockError::Timeout { ms: 0 })
        );
    }
    // ...and its own requests there take no memory.
    big.acquire(&manager, row_of(1, 600), Exclusive, ZERO)
        .unwrap();
    big.acquire_fresh(&manager, row_of(1, 601)).unwrap();
    assert_eq!(big.keys().len(), 2);
    assert_eq!(manager.holds(TxnId(1), &row_of(1, 600)), Some(Exclusive));
    // Other tables are not covered.
    manager
        .acquire(TxnId(2), &row_of(2, 8), Exclusive, ZERO)
        .unwrap();

    // A key another transaction has just made is its own (it was never a row the escalated
    // transaction could have seen) and must not wait, since it is locked under a page latch;
    // the escalated transaction then waits for that row like for any other's.
    let mut other = TxnLocks::new(TxnId(3));
    other.acquire_fresh(&manager, row_of(1, 1000)).unwrap();
    assert_eq!(
        manager.acquire(TxnId(1), &row_of(1, 1000), Exclusive, ZERO),
        Err(LockError::Timeout { ms: 0 })
    );
    let waiter = {
        let manager = Arc::clone(&manager);
        thread::spawn(move || {
            let mut big = big;
            big.acquire(&manager, row_of(1, 1000), Exclusive, None)
                .map(|()| big)
        })
    };
    wait_for_waiters(&manager, 1);
    other.release_all(&manager);
    let mut big = waiter.join().unwrap().unwrap();
    assert_eq!(big.keys().len(), 3);
    assert!(manager.is_locked_by_other(None, &row_of(1, 1000)));

    // A request that waits for the table goes when the transaction ends.
    let writer = {
        let manager = Arc::clone(&manager);
        thread::spawn(move || manager.acquire(TxnId(4), &row_of(1, 3), Exclusive, None))
    };
    wait_for_waiters(&manager, 1);
    big.release_all(&manager);
    writer.join().unwrap().unwrap();
    assert!(!manager.is_locked_by_other(None, &row_of(1, 500)));
    manager
        .acquire(TxnId(5), &row_of(1, 500), Exclusive, ZERO)
        .unwrap();
}

#[test]
fn an_escalation_fails_while_another_transaction_locks_the_table_and_is_tried_again_later() {
    let manager = Arc::new(LockManager::new(8));
    let mut other = TxnLocks::new(TxnId(2));
    other
        .acquire(&manager, row_of(1, 999), Exclusive, ZERO)
        .unwrap();
    let mut big = TxnLocks::new(TxnId(1));
    for number in 0..10 {
        big.acquire(&manager, row_of(1, number), Exclusive, ZERO)
            .unwrap();
    }
    assert_eq!(big.escalate_if_large(&manager, 10), 0);
    assert_eq!(manager.stats().failed_escalations, 1);
    assert_eq!(big.keys().len(), 10);
    // The failed attempt left nothing behind: rows it never locked are free.
    other
        .acquire(&manager, row_of(1, 998), Exclusive, ZERO)
        .unwrap();
    assert!(!manager.is_locked_by_other(Some(TxnId(2)), &row_of(1, 500)));
    // The next attempt comes only at twice the locks: 19 do not look again.
    for number in 10..19 {
        big.acquire(&manager, row_of(1, number), Exclusive, ZERO)
            .unwrap();
    }
    assert_eq!(big.escalate_if_large(&manager, 10), 0);
    assert_eq!(manager.stats().failed_escalations, 1);
    other.release_all(&manager);

    // A transaction queued for one of its rows also stops it: granting the row later would
    // put that transaction inside the escalated table.
    let queued_writer = queued(&manager, 3, row_of(1, 0), Exclusive, 1);
    big.acquire(&manager, row_of(1, 19), Exclusive, ZERO)
        .unwrap();
    assert_eq!(big.escalate_if_large(&manager, 10), 0);
    assert_eq!(manager.stats().failed_escalations, 2);
    assert_eq!(big.keys().len(), 20);
    // Once nobody else holds or waits for a lock on the table, it escalates.
    for number in 20..40 {
        big.acquire(&manager, row_of(1, number), Exclusive, ZERO)
            .unwrap();
    }
    let (big, queued_writer) = {
        let handle = thread::spawn(move || {
            // The queued writer still waits: the escalation fails again until it is gone.
            assert_eq!(big.escalate_if_large(&manager, 10), 0);
            (big, manager)
        });
        let (mut big, manager) = handle.join().unwrap();
        big.release_all(&manager);
        queued_writer.join().unwrap().unwrap();
        manager.release_all(TxnId(3), &[row_of(1, 0)]);
        let mut big = TxnLocks::new(TxnId(4));
        for number in 0..10 {
            big.acquire(&manager, row_of(1, number), Exclusive, ZERO)
                .unwrap();
        }
        assert_eq!(big.escalate_if_large(&manager, 10), 1);
        (big, manager)
    };
    assert_eq!(big.keys(), &[LockKey::whole_table(1)]);
    assert_eq!(queued_writer.stats().escalations, 1);
    assert_eq!(queued_writer.stats().failed_escalations, 3);
}

/// Who holds what, as the test sees it: the owner of each row and of each table (0: nobody).
struct Owners {
    rows: Vec<AtomicU64>,
    table: AtomicU64,
}

impl Owners {
    fn take_row(&self, row: usize, txn: u64) {
        let table = self.table.load(Ordering::SeqCst);
        assert!(
            table == 0 || table == txn,
            "transaction {txn} locked row {row} inside transaction {table}'s table"
        );
        if let Err(owner) =
            self.rows[row].compare_exchange(0, txn, Ordering::SeqCst, Ordering::SeqCst)
        {
            assert_eq!(owner, txn, "row {row} locked by {owner} and {txn}");
        }
    }
}

#[test]
fn escalations_keep_mutual_exclusion_with_row_locks_fresh_keys_and_readers() {
    const THREADS: usize = 6;
    const TXNS_PER_THREAD: usize = 1000;
    const ROWS: usize = 12;
    // Fresh keys are numbered from here on; each transaction makes at most one.
    const FRESH_BASE: usize = ROWS;
    const FRESH_KEYS: usize = THREADS * TXNS_PER_THREAD * 4;
    let seed = seed();

    let manager = Arc::new(LockManager::new(4));
    let owners = Arc::new(Owners {
        rows: (0..FRESH_BASE + FRESH_KEYS)
            .map(|_| AtomicU64::new(0))
            .collect(),
        table: AtomicU64::new(0),
    });
    let next_txn = Arc::new(AtomicU64::new(1));
    let next_fresh = Arc::new(AtomicUsize::new(FRESH_BASE));
    let escalated = Arc::new(AtomicU64::new(0));
    let key_of = |row: usize| LockKey::new(1, (row as u32).to_be_bytes());
    let threads: Vec<_> = (0..THREADS)
        .map(|thread_index| {
            let (manager, owners, next_txn, next_fresh, escalated) = (
                Arc::clone(&manager),
                Arc::clone(&owners),
                Arc::clone(&next_txn),
                Arc::clone(&next_fresh),
                Arc::clone(&escalated),
            );
            let mut rng = StdRng::seed_from_u64(seed ^ (thread_index as u64).wrapping_mul(0x9e37));
            thread::spawn(move || {
                for _ in 0..TXNS_PER_THREAD {
                    let started = Instant::now();
                    loop {
                        assert!(
                            started.elapsed() < Duration::from_secs(60),
                            "a transaction never finished: {:?}",
                            manager.stats()
                        );
                        let txn = next_txn.fetch_add(1, Ordering::Relaxed);
                        let mut locks = TxnLocks::new(TxnId(txn));
                        let mut rows: Vec<usize> = Vec::new();
                        let mut table = false;
                        let timeout = Some(Duration::from_millis(rng.random_range(1..20)));
                        let mut outcome = Ok(());
                        for _ in 0..rng.random_range(1..=5) {
                            let step = rng.random_range(0..10);
                            if step < 2 {
                                // Make a fresh key: it never waits, whoever holds the table.
                                let row = next_fresh.fetch_add(1, Ordering::Relaxed);
                                locks.acquire_fresh(&manager, key_of(row)).unwrap();
                                let owner = owners.rows[row].swap(txn, Ordering::SeqCst);
                                assert_eq!(owner, 0, "fresh row {row} was {owner}'s");
                                rows.push(row);
                            } else if step < 3 {
                                // A READ COMMITTED read: it must not get past an X lock.
                                let row = rng.random_range(0..ROWS);
                                match manager.wait_for_shared(
                                    Some(TxnId(txn)),
                                    &key_of(row),
                                    timeout,
                                ) {
                                    Ok(()) => {}
                                    Err(error) => {
                                        outcome = Err(error);
                                        break;
                                    }
                                }
                            } else if step < 4 && rows.len() >= 2 {
                                // Escalate, with a threshold this transaction reaches.
                                if locks.escalate_if_large(&manager, 2) == 1 {
                                    let previous = owners.table.swap(txn, Ordering::SeqCst);
                                    assert_eq!(previous, 0, "two escalated transactions");
                                    for (row, owner) in owners.rows.iter().enumerate() {
                                        let owner = owner.load(Ordering::SeqCst);
                                        assert!(
                                            owner == 0 || owner == txn || row >= FRESH_BASE,
                                            "row {row} was {owner}'s when {txn} escalated"
                                        );
                                    }
                                    table = true;
                                    escalated.fetch_add(1, Ordering::Relaxed);
                                }
                            } else {
                                // Lock an existing row, or a recent fresh one someone made.
                                let made = next_fresh.load(Ordering::Relaxed);
                                let row = if rng.random_bool(0.8) || made == FRESH_BASE {
                                    rng.random_range(0..ROWS)
                                } else {
                                    rng.random_range(made.saturating_sub(8).max(FRESH_BASE)..made)
                                };
                                if let Err(error) =
                                    locks.acquire(&manager, key_of(row), Exclusive, timeout)
                                {
                                    outcome = Err(error);
                                    break;
                                }
                                if row < FRESH_BASE {
                                    owners.take_row(row, txn);
                                } else if let Err(owner) = owners.rows[row].compare_exchange(
                                    0,
                                    txn,
                                    Ordering::SeqCst,
                                    Ordering::SeqCst,
                                ) {
                                    assert_eq!(owner, txn, "row {row} locked by {owner} and {txn}");
                                }
                                if !rows.contains(&row) {
                                    rows.push(row);
                                }
                            }
                            if rng.random_bool(0.3) {
                                thread::yield_now();
                            }
                        }
                        // What the test believes goes first, then the locks.
                        for &row in &rows {
                            owners.rows[row].store(0, Ordering::SeqCst);
                        }
                        if table {
                            owners.table.store(0, Ordering::SeqCst);
                        }
                        locks.release_all(&manager);
                        // A pause between transactions, so that escalations sometimes find
                        // the table free of other transactions' locks.
                        thread::sleep(Duration::from_micros(rng.random_range(0..200)));
                        match outcome {
                            Ok(()) => break,
                            Err(LockError::Deadlock { victim }) => assert_eq!(victim.0, txn),
                            Err(LockError::Timeout { .. }) => {}
                        }
                    }
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    let stats = manager.stats();
    println!("{stats:?}");
    assert!(
        stats.escalations > 0 && stats.failed_escalations > 0,
        "the run never escalated, or never failed to: {stats:?}"
    );
    assert_eq!(stats.escalations, escalated.load(Ordering::Relaxed));
    assert_eq!(manager.waiting_txns(), 0);
    for row in 0..ROWS {
        assert!(!manager.is_locked_by_other(None, &key_of(row)));
    }
}

/// Inserts `Accounts` rows `ids` in `session`, one statement each.
fn insert_accounts(
    table: &Arc<lastpage_engine::Table>,
    session: &lastpage_engine::Session,
    ids: std::ops::Range<i32>,
) {
    for id in ids {
        table
            .insert(
                session,
                lastpage_engine::InsertRow::new()
                    .set(0, Value::Int(id))
                    .set(1, Value::Int(id % 7)),
            )
            .unwrap();
    }
}

fn is_lock_timeout(result: Result<impl std::fmt::Debug, EngineError>) -> bool {
    matches!(result, Err(EngineError::Lock(LockError::Timeout { .. })))
}

#[test]
fn a_large_transaction_escalates_to_one_table_lock_and_locks_no_more_rows() {
    for threshold in [Some(LOCK_ESCALATION_THRESHOLD), None] {
        let db = Database::create(DatabaseOptions {
            lock_timeout: Some(Duration::from_millis(20)),
            lock_escalation_threshold: threshold,
            ..DatabaseOptions::default()
        })
        .unwrap();
        let accounts = db.create_table(common::accounts_by_balance()).unwrap();
        let orders = db.create_table(common::orders()).unwrap();
        let (big, other) = (db.session(), db.session());
        insert_accounts(&accounts, &other, 0..3);

        let rows = LOCK_ESCALATION_THRESHOLD as i32 + 1_000;
        let acquired_before = db.lock_stats().acquired;
        big.begin().unwrap();
        insert_accounts(&accounts, &big, 100..100 + rows);
        let stats = db.lock_stats();
        let acquired = stats.acquired - acquired_before;
        let context = format!("threshold {threshold:?}: {stats:?}");
        if threshold.is_some() {
            // One row lock a statement up to the threshold, then one for the table, then none.
            assert_eq!(acquired, LOCK_ESCALATION_THRESHOLD as u64 + 1, "{context}");
            assert_eq!(stats.escalations, 1, "{context}");
        } else {
            assert_eq!(acquired, rows as u64, "{context}");
            assert_eq!(stats.escalations + stats.failed_escalations, 0, "{context}");
        }
        // Rows the transaction never touched are its own too once it holds the table: another
        // session waits to change, read or insert one by name. Other tables, and an identity
        // key it makes itself (a row nobody else could have seen), are not held back.
        let escalated = threshold.is_some();
        let update = accounts.update(&other, &[Value::Int(1)], &[(1, Value::Int(10))]);
        assert_eq!(is_lock_timeout(update), escalated, "{context}");
        assert_eq!(
            is_lock_timeout(accounts.get(&other, &[Value::Int(2)])),
            escalated,
            "{context}"
        );
        let insert = accounts.insert(
            &other,
            lastpage_engine::InsertRow::new()
                .set(0, Value::Int(50))
                .set(1, Value::Int(5)),
        );
        assert_eq!(is_lock_timeout(insert), escalated, "{context}");
        orders
            .insert(
                &other,
                lastpage_engine::InsertRow::new().set(1, "elsewhere"),
            )
            .unwrap();
        // The transaction's own rows are its own to change.
        accounts
            .update(&big, &[Value::Int(1)], &[(1, Value::Int(11))])
            .unwrap();
        accounts
            .update(&big, &[Value::Int(100)], &[(1, Value::Int(12))])
            .unwrap();
        big.commit().unwrap();
        // Committed, the table is free again.
        accounts
            .update(&other, &[Value::Int(1)], &[(1, Value::Int(10))])
            .unwrap();
        assert_eq!(
            accounts.row_count(),
            3 + rows as u64 + u64::from(!escalated)
        );
        accounts.check_integrity().unwrap();

        // A rolled-back escalated transaction leaves nothing, and frees the table.
        big.begin().unwrap();
        insert_accounts(&accounts, &big, 100_000..100_000 + rows);
        big.rollback().unwrap();
        assert_eq!(
            accounts.row_count(),
            3 + rows as u64 + u64::from(!escalated)
        );
        accounts
            .update(&other, &[Value::Int(2)], &[(1, Value::Int(20))])
            .unwrap();
        accounts.check_integrity().unwrap();
        let stats = db.lock_stats();
        assert_eq!(
            stats.escalations,
            if escalated { 2 } else { 0 },
            "{stats:?}"
        );
    }
}
