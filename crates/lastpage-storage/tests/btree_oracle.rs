//! The B+tree against a `BTreeMap` oracle: random single-threaded operation sequences, and
//! many threads inserting, updating, deleting, reading and scanning at once. Every test prints
//! its seed; rerun one with `LASTPAGE_SEED=<seed>`.

mod common;

use common::{configurations, tree_with};

use std::collections::BTreeMap;
use std::ops::Bound;

use lastpage_storage::btree::{BTree, BTreeError, Direction, GeneratedKeyError, InsertPath};
use lastpage_storage::latch::LatchPolicy;
use lastpage_storage::limits::MAX_RECORD_BYTES;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

fn tree(policy: LatchPolicy) -> BTree {
    tree_with(policy, InsertPath::Classic)
}

fn random_value(rng: &mut StdRng, key_len: usize) -> Vec<u8> {
    let len = match rng.random_range(0..10) {
        0 => MAX_RECORD_BYTES - 4 - key_len,
        1 => rng.random_range(1000..4000),
        _ => rng.random_range(0..120),
    };
    vec![rng.random::<u8>(); len]
}

fn random_key(rng: &mut StdRng, space: u32) -> Vec<u8> {
    let number = rng.random_range(0..space);
    let mut key = number.to_be_bytes().to_vec();
    // Some keys get a variable-length suffix so separators differ in length.
    if number % 3 == 0 {
        key.extend(std::iter::repeat_n(b'x', (number % 40) as usize));
    }
    key
}

fn random_bound(rng: &mut StdRng, space: u32) -> Bound<Vec<u8>> {
    match rng.random_range(0..3) {
        0 => Bound::Unbounded,
        1 => Bound::Included(random_key(rng, space)),
        _ => Bound::Excluded(random_key(rng, space)),
    }
}

fn as_slice(bound: &Bound<Vec<u8>>) -> Bound<&[u8]> {
    bound.as_ref().map(Vec::as_slice)
}

#[test]
fn random_operations_match_a_btreemap() {
    let seed = common::seed();
    for (policy, path) in configurations() {
        let mut rng = StdRng::seed_from_u64(seed);
        let tree = tree_with(policy, path);
        let mut oracle: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
        let space = 3000;
        for step in 0..12_000 {
            let key = random_key(&mut rng, space);
            match rng.random_range(0..10) {
                0..=4 => {
                    let value = random_value(&mut rng, key.len());
                    let expected = if oracle.contains_key(&key) {
                        Err(BTreeError::DuplicateKey)
                    } else {
                        oracle.insert(key.clone(), value.clone());
                        Ok(())
                    };
                    assert_eq!(tree.insert(&key, &value), expected, "step {step}");
                }
                5 => {
                    let value = random_value(&mut rng, key.len());
                    let old = oracle.get(&key).cloned();
                    if old.is_some() {
                        oracle.insert(key.clone(), value.clone());
                    }
                    assert_eq!(tree.update(&key, &value).unwrap(), old, "step {step}");
                }
                6 => assert_eq!(
                    tree.delete(&key).unwrap(),
                    oracle.remove(&key),
                    "step {step}"
                ),
                7 => assert_eq!(
                    tree.get(&key).unwrap(),
                    oracle.get(&key).cloned(),
                    "step {step}"
                ),
                _ => {
                    let lower = random_bound(&mut rng, space);
                    let upper = random_bound(&mut rng, space);
                    // BTreeMap::range panics on an inverted range; skip those.
                    if let (
                        Bound::Included(l) | Bound::Excluded(l),
                        Bound::Included(u) | Bound::Excluded(u),
                    ) = (&lower, &upper)
                        && (l > u
                            || (l == u
                                && !(matches!(lower, Bound::Included(_))
                                    && matches!(upper, Bound::Included(_)))))
                    {
                        continue;
                    }
                    let expected: Vec<_> = oracle
                        .range((lower.clone(), upper.clone()))
                        .map(|(k, v)| (k.clone(), v.clone()))
                        .collect();
                    let forward: Vec<_> = tree
                        .range(as_slice(&lower), as_slice(&upper), Direction::Forward)
                        .collect();
                    assert_eq!(forward, expected, "forward scan at step {step}");
                    let mut backward: Vec<_> = tree
                        .range(as_slice(&lower), as_slice(&upper), Direction::Backward)
                        .collect();
                    backward.reverse();
                    assert_eq!(backward, expected, "backward scan at step {step}");
                }
            }
            if step % 2000 == 0 {
                tree.check_integrity()
                    .unwrap_or_else(|error| panic!("step {step}: {error}"));
            }
        }
        let check = tree.check_integrity().unwrap();
        assert_eq!(check.rows, oracle.len() as u64);
        assert!(
            check.levels >= 2,
            "the test should grow the tree: {check:?}"
        );
        let all: Vec<_> = tree
            .range(Bound::Unbounded, Bound::Unbounded, Direction::Forward)
            .collect();
        assert_eq!(all.len(), oracle.len());
    }
}

#[test]
fn ascending_loads_leave_pages_full_and_random_loads_split_in_half() {
    for policy in [LatchPolicy::Fifo, LatchPolicy::Adaptive] {
        let ascending = tree(policy);
        for key in 0..100_000u32 {
            ascending.insert(&key.to_be_bytes(), &[7; 100]).unwrap();
        }
        let check = ascending.check_integrity().unwrap();
        assert!(check.leaf_fill > 0.98, "ascending fill {check:?}");
        assert_eq!(
            ascending.stats().leaf_splits,
            0,
            "no 50/50 splits: {:?}",
            ascending.stats()
        );

        let random = tree(policy);
        let mut rng = StdRng::seed_from_u64(7);
        let mut keys: Vec<u32> = (0..100_000).collect();
        for i in (1..keys.len()).rev() {
            keys.swap(i, rng.random_range(0..=i));
        }
        for key in keys {
            random.insert(&key.to_be_bytes(), &[7; 100]).unwrap();
        }
        let check = random.check_integrity().unwrap();
        assert!(
            check.leaf_fill > 0.6 && check.leaf_fill < 0.8,
            "random fill {check:?}"
        );
    }
}

#[test]
fn maximal_rows_take_a_page_each() {
    let tree = tree(LatchPolicy::Adaptive);
    let value = vec![1u8; MAX_RECORD_BYTES - 4 - 4];
    for key in 0..500u32 {
        tree.insert(&key.to_be_bytes(), &value).unwrap();
    }
    let check = tree.check_integrity().unwrap();
    assert_eq!(check.leaf_pages, 500);
    assert_eq!(
        tree.insert(&1000u32.to_be_bytes(), &[0; MAX_RECORD_BYTES]),
        Err(BTreeError::RecordTooLarge {
            len: MAX_RECORD_BYTES + 8,
            max: MAX_RECORD_BYTES
        })
    );
}

/// Each thread owns the keys `k` with `k % threads == thread` and keeps its own oracle; all of
/// them also append to a shared ascending range, as identity inserts do. Readers scan
/// concurrently and check that every scan is strictly ordered.
#[test]
fn concurrent_writers_and_scanners_match_their_oracles() {
    let seed = common::seed();
    for (policy, path) in configurations() {
        let tree = tree_with(policy, path);
        let threads = 16u32;
        let counter = std::sync::atomic::AtomicU32::new(0);
        let oracles: Vec<BTreeMap<Vec<u8>, Vec<u8>>> = std::thread::scope(|scope| {
            let scanners: Vec<_> = (0..2)
                .map(|_| {
                    scope.spawn(|| {
                        for round in 0..30 {
                            let direction = if round % 2 == 0 {
                                Direction::Forward
                            } else {
                                Direction::Backward
                            };
                            let keys: Vec<Vec<u8>> = tree
                                .range(Bound::Unbounded, Bound::Unbounded, direction)
                                .map(|(k, _)| k)
                                .collect();
                            for pair in keys.windows(2) {
                                match direction {
                                    Direction::Forward => assert!(pair[0] < pair[1]),
                                    Direction::Backward => assert!(pair[0] > pair[1]),
                                }
                            }
                        }
                    })
                })
                .collect();
            let writers: Vec<_> = (0..threads)
                .map(|thread| {
                    let tree = &tree;
                    let counter = &counter;
                    scope.spawn(move || {
                        let mut rng = StdRng::seed_from_u64(seed ^ u64::from(thread));
                        let mut oracle = BTreeMap::new();
                        for _ in 0..3000 {
                            let key = {
                                let k = rng.random_range(0..2000u32) * threads + thread;
                                let mut key = vec![0u8];
                                key.extend_from_slice(&k.to_be_bytes());
                                key
                            };
                            match rng.random_range(0..10) {
                                0..=3 => {
                                    let value = random_value(&mut rng, key.len());
                                    let result = tree.insert(&key, &value);
                                    match oracle.entry(key) {
                                        std::collections::btree_map::Entry::Occupied(_) => {
                                            assert_eq!(result, Err(BTreeError::DuplicateKey));
                                        }
                                        std::collections::btree_map::Entry::Vacant(entry) => {
                                            result.unwrap();
                                            entry.insert(value);
                                        }
                                    }
                                }
                                4 => {
                                    let value = random_value(&mut rng, key.len());
                                    let old = tree.update(&key, &value).unwrap();
                                    assert_eq!(old, oracle.get(&key).cloned());
                                    if old.is_some() {
                                        oracle.insert(key, value);
                                    }
                                }
                                5 => assert_eq!(tree.delete(&key).unwrap(), oracle.remove(&key)),
                                6 => assert_eq!(tree.get(&key).unwrap(), oracle.get(&key).cloned()),
                                _ => {
                                    let n =
                                        counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                                    let mut key = vec![1u8];
                                    key.extend_from_slice(&n.to_be_bytes());
                                    tree.insert(&key, &[thread as u8; 60]).unwrap();
                                    oracle.insert(key, vec![thread as u8; 60]);
                                }
                            }
                        }
                        oracle
                    })
                })
                .collect();
            scanners.into_iter().for_each(|s| s.join().unwrap());
            writers.into_iter().map(|w| w.join().unwrap()).collect()
        });
        let mut expected = BTreeMap::new();
        for oracle in oracles {
            expected.extend(oracle);
        }
        let check = tree
            .check_integrity()
            .unwrap_or_else(|error| panic!("{policy:?}: {error}"));
        assert_eq!(check.rows, expected.len() as u64);
        assert_scan_is(
            &tree,
            &expected,
            &format!("{policy:?}: the tree's contents differ from the oracles'"),
        );
    }
}

/// Scans `tree` forward again and again, asserting each time that its keys ascend, until
/// `stop` is set: a scanner running beside the writers.
fn scan_in_order_until(tree: &BTree, stop: &std::sync::atomic::AtomicBool) {
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        let keys: Vec<Vec<u8>> = tree
            .range(Bound::Unbounded, Bound::Unbounded, Direction::Forward)
            .map(|(key, _)| key)
            .collect();
        assert!(keys.windows(2).all(|pair| pair[0] < pair[1]));
    }
}

/// Asserts that a forward scan of `tree` returns exactly the rows of `expected`, failing with
/// `message` if it does not.
fn assert_scan_is(tree: &BTree, expected: &BTreeMap<Vec<u8>, Vec<u8>>, message: &str) {
    let actual: BTreeMap<_, _> = tree
        .range(Bound::Unbounded, Bound::Unbounded, Direction::Forward)
        .collect();
    assert!(actual == *expected, "{message}");
}

#[test]
fn batches_insert_like_single_rows_and_report_each_failure() {
    let seed = common::seed();
    let mut rng = StdRng::seed_from_u64(seed);
    for policy in [LatchPolicy::Fifo, LatchPolicy::Adaptive] {
        let tree = tree(policy);
        let mut oracle = BTreeMap::new();
        for _ in 0..200 {
            let size = rng.random_range(1..150);
            let batch: Vec<(Vec<u8>, Vec<u8>)> = (0..size)
                .map(|_| {
                    let key = random_key(&mut rng, 20_000);
                    let value = random_value(&mut rng, key.len());
                    (key, value)
                })
                .collect();
            let entries: Vec<(&[u8], &[u8])> = batch
                .iter()
                .map(|(k, v)| (k.as_slice(), v.as_slice()))
                .collect();
            let results = tree.insert_batch(&entries);
            for ((key, value), result) in batch.iter().zip(results) {
                match oracle.entry(key.clone()) {
                    std::collections::btree_map::Entry::Occupied(_) => {
                        assert_eq!(result, Err(BTreeError::DuplicateKey))
                    }
                    std::collections::btree_map::Entry::Vacant(entry) => {
                        result.unwrap();
                        entry.insert(value.clone());
                    }
                }
            }
        }
        tree.check_integrity().unwrap();
        assert_scan_is(
            &tree,
            &oracle,
            &format!("{policy:?}: batch inserts differ from the oracle"),
        );
    }
}

/// The default path's generated keys: many threads take keys from one counter while the tail
/// is latched, so they arrive in order, every page but the last ends up full (no 50/50 split
/// at all), and nothing is lost or duplicated. Also with rows that fill a page each (copied into
/// their own page under a placeholder key before the key is made), and with keys whose length
/// changes now and then (so the placeholder is sometimes the wrong length). Every row keeps
/// the value its thread wrote.
#[test]
fn generated_keys_arrive_in_order_and_leave_every_page_full() {
    for (policy, value_len, varying_key_len) in [
        (LatchPolicy::Fifo, 100, false),
        (LatchPolicy::Adaptive, 100, false),
        (LatchPolicy::Fifo, 8000, false),
        (LatchPolicy::Adaptive, 8000, false),
        (LatchPolicy::Adaptive, 8000, true),
    ] {
        let tree = tree_with(policy, InsertPath::Default);
        let counter = std::sync::atomic::AtomicU64::new(0);
        let threads = 32u8;
        let rows_per_thread = if value_len > 1000 { 40 } else { 1500 };
        std::thread::scope(|scope| {
            for thread in 0..threads {
                let (tree, counter) = (&tree, &counter);
                scope.spawn(move || {
                    let value = vec![thread; value_len];
                    for _ in 0..rows_per_thread {
                        tree.insert_with_generated_key(&value, |key| {
                            let n = counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            key.extend_from_slice(&n.to_be_bytes());
                            if varying_key_len && n % 3 == 0 {
                                key.push(0xFF);
                            }
                            Ok::<(), ()>(())
                        })
                        .unwrap();
                    }
                });
            }
        });
        let case = format!("{policy:?} {value_len} varying key length {varying_key_len}");
        let check = tree.check_integrity().unwrap();
        let total = u64::from(threads) * rows_per_thread;
        assert_eq!(check.rows, total, "{case}");
        let mut rows_per_writer = vec![0u64; usize::from(threads)];
        let keys: Vec<u64> = tree
            .range(Bound::Unbounded, Bound::Unbounded, Direction::Forward)
            .map(|(key, value)| {
                assert_eq!(value.len(), value_len, "{case}");
                assert!(value.iter().all(|&b| b == value[0]), "{case}: a torn row");
                rows_per_writer[usize::from(value[0])] += 1;
                u64::from_be_bytes(key[..8].try_into().unwrap())
            })
            .collect();
        assert_eq!(keys, (0..total).collect::<Vec<_>>(), "{case}");
        assert!(
            rows_per_writer.iter().all(|&rows| rows == rows_per_thread),
            "{case}: {rows_per_writer:?}"
        );
        assert_eq!(tree.stats().leaf_splits, 0, "{case}: {:?}", tree.stats());
        assert!(check.leaf_fill > 0.97, "{case}: {check:?}");
    }
}

/// The default path with keys from the caller that arrive slightly out of order (as identity
/// values taken before the insert do under concurrency): every row lands, the tree stays valid,
/// duplicates are still refused on the fast path, and pages stay fuller than the classic path's
/// 50/50 splits leave them.
#[test]
fn default_path_handles_out_of_order_appends_and_duplicates() {
    let seed = common::seed();
    let mut rng = StdRng::seed_from_u64(seed);
    let mut keys: Vec<u32> = (0..20_000).collect();
    // Shuffle within small windows only: nearly ascending.
    for chunk in keys.chunks_mut(8) {
        for i in (1..chunk.len()).rev() {
            chunk.swap(i, rng.random_range(0..=i));
        }
    }
    for policy in LatchPolicy::ALL {
        let fill = |path| {
            let tree = tree_with(policy, path);
            for key in &keys {
                tree.insert(&key.to_be_bytes(), &[1; 90]).unwrap();
            }
            assert_eq!(
                tree.insert(&19_999u32.to_be_bytes(), &[1]),
                Err(BTreeError::DuplicateKey)
            );
            assert_eq!(
                tree.insert(&19_990u32.to_be_bytes(), &[1]),
                Err(BTreeError::DuplicateKey)
            );
            let check = tree.check_integrity().unwrap();
            assert_eq!(check.rows, 20_000);
            check.leaf_fill
        };
        let (classic, default) = (fill(InsertPath::Classic), fill(InsertPath::Default));
        println!("{policy:?}: leaf fill classic {classic:.3}, default {default:.3}");
        assert!(
            default > classic + 0.05,
            "{policy:?}: default {default:.3} vs classic {classic:.3}"
        );
    }
}

/// Inserts `value` on the calling thread's sequence lane, its key the next number of
/// `counter` (big-endian, left in `key`); returns the number.
fn insert_on_lane(
    tree: &BTree,
    counter: &std::sync::atomic::AtomicI64,
    value: &[u8],
    key: &mut Vec<u8>,
) -> i64 {
    tree.insert_with_sequence_key(
        value,
        1,
        |rows| Ok::<i64, ()>(counter.fetch_add(rows as i64, std::sync::atomic::Ordering::Relaxed)),
        |number, key| {
            key.extend_from_slice(&number.to_be_bytes());
            Ok(())
        },
        key,
    )
    .unwrap()
}

/// Checks that `tree` (keyed by big-endian numbers) holds exactly the rows the threads kept,
/// each with its own bytes, and passes the integrity check; returns the check.
fn assert_holds_what_was_kept(
    tree: &BTree,
    kept: Vec<Vec<(i64, Vec<u8>)>>,
    case: &str,
) -> lastpage_storage::btree::TreeCheck {
    let mut expected: Vec<(i64, Vec<u8>)> = kept.into_iter().flatten().collect();
    expected.sort();
    let actual: Vec<(i64, Vec<u8>)> = tree
        .range(Bound::Unbounded, Bound::Unbounded, Direction::Forward)
        .map(|(key, value)| (i64::from_be_bytes(key.try_into().unwrap()), value))
        .collect();
    assert!(
        actual == expected,
        "{case}: the tree differs from what was kept"
    );
    let check = tree.check_integrity().unwrap();
    assert_eq!(check.rows, expected.len() as u64, "{case}");
    check
}

/// Sequence lanes under stress: many threads on several lanes, rows of random sizes (so leaves
/// fill before or after their lane's block runs out), some rows deleted again right after they
/// went in (as a rolled-back insert is), and scanners running meanwhile. Checked against what
/// the threads recorded: every surviving row is present once with its own bytes, keys ascend
/// within each thread, scans always see keys in order, the tree passes the integrity check, and
/// leaves stay mostly full.
#[test]
fn sequence_lanes_keep_every_row_in_order() {
    let seed = common::seed();
    for policy in LatchPolicy::ALL {
        let tree = tree_with(policy, InsertPath::Default);
        let counter = std::sync::atomic::AtomicI64::new(1);
        let threads = 24u8;
        let rows_per_thread = 1500;
        let stop = std::sync::atomic::AtomicBool::new(false);
        let kept: Vec<Vec<(i64, Vec<u8>)>> = std::thread::scope(|scope| {
            let scanners: Vec<_> = (0..2)
                .map(|_| scope.spawn(|| scan_in_order_until(&tree, &stop)))
                .collect();
            let writers: Vec<_> = (0..threads)
                .map(|thread| {
                    let (tree, counter) = (&tree, &counter);
                    scope.spawn(move || {
                        let mut rng = StdRng::seed_from_u64(seed ^ u64::from(thread));
                        let mut kept = Vec::new();
                        let mut last = 0;
                        for _ in 0..rows_per_thread {
                            let len = if rng.random_bool(0.9) {
                                100
                            } else {
                                rng.random_range(1..2000)
                            };
                            let value: Vec<u8> = vec![thread; len];
                            // A key buffer that already holds something: the tree must
                            // empty it first.
                            let mut key = vec![0xEE; 3];
                            let number = insert_on_lane(tree, counter, &value, &mut key);
                            assert_eq!(key, number.to_be_bytes(), "the key left in the buffer");
                            assert!(number > last, "a thread's numbers ascend");
                            last = number;
                            if rng.random_bool(0.02) {
                                assert_eq!(tree.delete(&key).unwrap(), Some(value));
                            } else {
                                kept.push((number, value));
                            }
                        }
                        kept
                    })
                })
                .collect();
            let kept = writers.into_iter().map(|w| w.join().unwrap()).collect();
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            for scanner in scanners {
                scanner.join().unwrap();
            }
            kept
        });
        let check = assert_holds_what_was_kept(&tree, kept, &format!("{policy:?}"));
        // Rows of random sizes and rolled-back rows leave some leaves partly filled (measured
        // 0.89 to 0.94 over a dozen seeds); a lane that started a new leaf for every block, or
        // split its leaves in half, would leave about 0.5.
        assert!(check.leaf_fill > 0.75, "{policy:?}: {check:?}");
    }
}

/// Makes a batch's keys the way the engine does: one block of `rows` numbers from `counter`,
/// each encoded big-endian. Returns the block's first number.
/// Sequence lanes while another thread switches the tree's insert path back and forth
/// (`BTree::set_insert_path`, as ALTER INDEX may at run time). While it is Classic, rows go in
/// by the classic path, outside the tail gate, with numbers from the same counter, so a classic
/// append split can move the last leaf between a lane's insert and its next one. A lane used
/// to re-read the tail hint after its leaf's latch was gone and could take a classic writer's
/// new last leaf for its own: its next row then went on a page whose keys all lie above it,
/// where no search finds it (and later splits failed as corrupt). Every row must be found
/// where it belongs, and the tree must pass the integrity check. (By Rust's Release and
/// Acquire through the tree's latches the lane's record is exact: it is taken while the leaf
/// is latched.)
#[test]
fn sequence_lanes_keep_their_rows_while_the_insert_path_switches() {
    let seed = common::seed();
    let tree = tree_with(LatchPolicy::Adaptive, InsertPath::Default);
    let counter = std::sync::atomic::AtomicI64::new(1);
    let stop = std::sync::atomic::AtomicBool::new(false);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
    let kept: Vec<Vec<(i64, Vec<u8>)>> = std::thread::scope(|scope| {
        let (tree, counter, stop) = (&tree, &counter, &stop);
        let switcher = scope.spawn(move || {
            let mut rng = StdRng::seed_from_u64(seed);
            while std::time::Instant::now() < deadline {
                tree.set_insert_path(if rng.random_bool(0.5) {
                    InsertPath::Classic
                } else {
                    InsertPath::Default
                });
                std::thread::sleep(std::time::Duration::from_micros(rng.random_range(1..200)));
            }
            tree.set_insert_path(InsertPath::Default);
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
        });
        let writers: Vec<_> = (0..8u64)
            .map(|thread| {
                scope.spawn(move || {
                    let mut rng = StdRng::seed_from_u64(seed ^ (thread + 1));
                    let mut kept = Vec::new();
                    let mut key = Vec::new();
                    // Rows of a few hundred to 1,500 bytes split leaves often; the count is
                    // capped to keep the test's memory small.
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) && kept.len() < 15_000 {
                        let value = vec![thread as u8; rng.random_range(300..1500)];
                        key.clear();
                        let number = insert_on_lane(tree, counter, &value, &mut key);
                        kept.push((number, value));
                    }
                    kept
                })
            })
            .collect();
        let kept = writers.into_iter().map(|w| w.join().unwrap()).collect();
        switcher.join().unwrap();
        kept
    });
    let rows: usize = kept.iter().map(Vec::len).sum();
    println!("{rows} rows inserted while the insert path switched");
    for (number, value) in kept.iter().flatten() {
        assert_eq!(
            tree.get(&number.to_be_bytes()).unwrap().as_ref(),
            Some(value),
            "row {number} is not where a search finds it (seed {seed})"
        );
    }
    assert_holds_what_was_kept(&tree, kept, "switching paths");
}

fn make_block_keys(
    counter: &std::sync::atomic::AtomicI64,
    rows: usize,
    keys: &mut Vec<u8>,
    ends: &mut Vec<usize>,
) -> i64 {
    let first = counter.fetch_add(rows as i64, std::sync::atomic::Ordering::Relaxed);
    for number in first..first + rows as i64 {
        keys.extend_from_slice(&number.to_be_bytes());
        ends.push(keys.len());
    }
    first
}

/// Batches whose keys the tree makes at its tail (`insert_batch_with_generated_keys`), from
/// many threads at once, beside single rows on the sequence lanes and scanners: every row is
/// present once with its own bytes, each batch's keys are consecutive, scans see keys in
/// order, the tree passes the integrity check, and a load of batches alone leaves every leaf
/// full (no page split in the middle: concurrent batches reach the tail in the order of their
/// keys).
#[test]
fn generated_key_batches_append_in_order_beside_lanes() {
    let seed = common::seed();
    for (policy, with_lanes) in [
        (LatchPolicy::Fifo, false),
        (LatchPolicy::Adaptive, false),
        (LatchPolicy::Fifo, true),
        (LatchPolicy::Adaptive, true),
    ] {
        let case = format!("{policy:?} with lanes {with_lanes}");
        let tree = tree_with(policy, InsertPath::Default);
        let counter = std::sync::atomic::AtomicI64::new(1);
        let threads = 16u8;
        let stop = std::sync::atomic::AtomicBool::new(false);
        let kept: Vec<Vec<(i64, Vec<u8>)>> = std::thread::scope(|scope| {
            let scanner = scope.spawn(|| scan_in_order_until(&tree, &stop));
            let writers: Vec<_> = (0..threads)
                .map(|thread| {
                    let (tree, counter, case) = (&tree, &counter, &case);
                    scope.spawn(move || {
                        let mut rng = StdRng::seed_from_u64(seed ^ u64::from(thread));
                        let mut kept = Vec::new();
                        let (mut keys, mut ends) = (vec![0xEE; 5], vec![7]);
                        for _ in 0..60 {
                            if with_lanes && rng.random_bool(0.3) {
                                let value = vec![thread; 100];
                                let number = insert_on_lane(tree, counter, &value, &mut Vec::new());
                                kept.push((number, value));
                                continue;
                            }
                            let rows = rng.random_range(1..=200);
                            // Mostly the seeds' 100-byte rows; with lanes also larger ones.
                            let values: Vec<Vec<u8>> = (0..rows)
                                .map(|_| {
                                    let len = if with_lanes && rng.random_bool(0.1) {
                                        rng.random_range(1..3000)
                                    } else {
                                        100
                                    };
                                    vec![thread; len]
                                })
                                .collect();
                            let slices: Vec<&[u8]> = values.iter().map(Vec::as_slice).collect();
                            let mut first = 0;
                            tree.insert_batch_with_generated_keys(
                                &slices,
                                |keys, ends| {
                                    first = make_block_keys(counter, rows, keys, ends);
                                    Ok::<(), ()>(())
                                },
                                &mut keys,
                                &mut ends,
                            )
                            .unwrap();
                            assert_eq!(ends.len(), rows, "{case}: the keys left in the buffer");
                            assert_eq!(keys[..8], first.to_be_bytes(), "{case}");
                            for (offset, value) in values.into_iter().enumerate() {
                                if rng.random_bool(0.02) {
                                    // As a rolled-back insert is.
                                    let key = (first + offset as i64).to_be_bytes();
                                    assert_eq!(tree.delete(&key).unwrap(), Some(value));
                                } else {
                                    kept.push((first + offset as i64, value));
                                }
                            }
                        }
                        kept
                    })
                })
                .collect();
            let kept = writers.into_iter().map(|w| w.join().unwrap()).collect();
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            scanner.join().unwrap();
            kept
        });
        let check = assert_holds_what_was_kept(&tree, kept, &case);
        if !with_lanes {
            // Deleted rows leave a little room behind; nothing else may.
            assert_eq!(tree.stats().leaf_splits, 0, "{case}: {:?}", tree.stats());
            assert!(check.leaf_fill > 0.95, "{case}: {check:?}");
        }
    }
}

/// A batch with generated keys fails whole, before anything goes in, if a row is too large,
/// if the key maker fails, or if it makes the wrong number of keys; off the default path the
/// rows still go in, in order.
#[test]
fn generated_key_batches_fail_whole_before_anything_goes_in() {
    let tree = tree_with(LatchPolicy::Adaptive, InsertPath::Default);
    let counter = std::sync::atomic::AtomicI64::new(1);
    let (mut keys, mut ends) = (Vec::new(), Vec::new());
    let small = vec![1u8; 100];
    let huge = vec![2u8; MAX_RECORD_BYTES + 1];
    let make = |keys: &mut Vec<u8>, ends: &mut Vec<usize>| {
        make_block_keys(&counter, 3, keys, ends);
        Ok::<(), &str>(())
    };
    let result =
        tree.insert_batch_with_generated_keys(&[&small, &huge, &small], make, &mut keys, &mut ends);
    assert!(
        matches!(
            result,
            Err((
                0,
                GeneratedKeyError::Tree(BTreeError::RecordTooLarge { .. })
            ))
        ),
        "{result:?}"
    );
    let result = tree.insert_batch_with_generated_keys(
        &[&small, &small],
        |_, _| Err::<(), &str>("overflow"),
        &mut keys,
        &mut ends,
    );
    assert_eq!(result, Err((0, GeneratedKeyError::Key("overflow"))));
    let result = tree.insert_batch_with_generated_keys(
        &[&small, &small],
        |keys: &mut Vec<u8>, ends: &mut Vec<usize>| {
            make_block_keys(&counter, 1, keys, ends);
            Ok::<(), &str>(())
        },
        &mut keys,
        &mut ends,
    );
    assert!(
        matches!(
            result,
            Err((0, GeneratedKeyError::Tree(BTreeError::InvalidBatch(_))))
        ),
        "{result:?}"
    );
    assert_eq!(tree.check_integrity().unwrap().rows, 0, "nothing went in");

    let classic = tree_with(LatchPolicy::Fifo, InsertPath::Classic);
    classic
        .insert_batch_with_generated_keys(
            &[&small, &small, &small],
            |keys: &mut Vec<u8>, ends: &mut Vec<usize>| {
                make_block_keys(&counter, 3, keys, ends);
                Ok::<(), ()>(())
            },
            &mut keys,
            &mut ends,
        )
        .unwrap();
    assert_eq!(classic.check_integrity().unwrap().rows, 3);
}

/// A last leaf that deletes emptied covers only the keys from its parent's separator on. The
/// default path's generated keys need not ascend (the caller makes them), so one below that
/// separator must go where a descent finds it, and one that already exists must be refused, by
/// each of the three ways to insert with a made key.
#[test]
fn made_keys_below_an_emptied_last_leaf_go_where_they_belong() {
    let key = |i: u64| i.to_be_bytes();
    let emptied = || {
        let tree = tree_with(LatchPolicy::Adaptive, InsertPath::Default);
        for i in 0..400 {
            tree.insert(&key(i), &[7; 100]).unwrap();
        }
        // About 73 rows a leaf: this empties the last leaves, which deletes never free.
        for i in 200..400 {
            tree.delete(&key(i)).unwrap();
        }
        tree.delete(&key(5)).unwrap();
        let stats = tree.stats();
        assert!(stats.leaf_splits + stats.leaf_appends > 2, "{stats:?}");
        tree
    };
    type Insert = fn(&BTree, u64) -> Result<(), BTreeError>;
    let single: Insert = |tree, n| {
        tree.insert_with_generated_key(&[2; 100], |key| {
            key.extend_from_slice(&n.to_be_bytes());
            Ok::<(), ()>(())
        })
        .map(drop)
        .map_err(|error| match error {
            GeneratedKeyError::Tree(error) => error,
            GeneratedKeyError::Key(()) => unreachable!("the key maker never fails"),
        })
    };
    let batch: Insert = |tree, n| {
        let (mut keys, mut ends) = (Vec::new(), Vec::new());
        tree.insert_batch_with_generated_keys(
            &[&[2; 100]],
            |keys, ends| {
                keys.extend_from_slice(&n.to_be_bytes());
                ends.push(keys.len());
                Ok::<(), ()>(())
            },
            &mut keys,
            &mut ends,
        )
        .map_err(|(_, error)| match error {
            GeneratedKeyError::Tree(error) => error,
            GeneratedKeyError::Key(()) => unreachable!("the key maker never fails"),
        })
    };
    let lane: Insert = |tree, n| {
        let mut key = Vec::new();
        tree.insert_with_sequence_key(
            &[2; 100],
            1,
            |_| Ok::<i64, ()>(n as i64),
            |number, key| {
                key.extend_from_slice(&(number as u64).to_be_bytes());
                Ok(())
            },
            &mut key,
        )
        .map(drop)
        .map_err(|error| match error {
            GeneratedKeyError::Tree(error) => error,
            GeneratedKeyError::Key(()) => unreachable!("the key maker never fails"),
        })
    };
    for (name, insert) in [("single", single), ("batch", batch), ("lane", lane)] {
        let tree = emptied();
        insert(&tree, 5).unwrap();
        assert_eq!(
            tree.get(&key(5)).unwrap(),
            Some(vec![2; 100]),
            "{name}: the made key 5"
        );
        tree.check_integrity()
            .unwrap_or_else(|error| panic!("{name}: {error:?}"));
        let tree = emptied();
        assert_eq!(insert(&tree, 10), Err(BTreeError::DuplicateKey), "{name}");
        let check = tree
            .check_integrity()
            .unwrap_or_else(|error| panic!("{name}: {error:?}"));
        assert_eq!(check.rows, 199, "{name}");
    }
}
