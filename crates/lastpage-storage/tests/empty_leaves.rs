//! Leaves that deletes empty are freed (`btree/reclaim.rs`): a queue (rows appended at the end
//! of the index and deleted from its start) runs in a bounded number of pages, deleting every
//! row leaves one leaf under the root, and freeing races neither inserts beside the leaf, nor
//! appends, nor sequence lanes, nor scans. A leaf whose freeing gives up is freed later, by
//! the next delete or the sweep (forced deterministically with the `test-hooks` feature's
//! `BTree::fail_next_empty_leaf_free_attempts`). Checked against oracles, with the integrity
//! checker, and by counting pages: every page in use must belong to the tree. Every
//! randomized test prints its seed; rerun one with `LASTPAGE_SEED=<seed>`.

mod common;

use common::{configurations, tree_with};

use std::collections::{BTreeMap, VecDeque};
use std::ops::Bound;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};

use lastpage_storage::btree::{BTree, Direction, InsertPath, TreeCheck};
use lastpage_storage::latch::LatchPolicy;
use lastpage_storage::limits::{EMPTY_LEAF_FREE_ATTEMPTS, LEFTOVER_EMPTY_LEAVES_MAX};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

fn key_of(number: u64) -> [u8; 8] {
    number.to_be_bytes()
}

/// Runs the integrity check and asserts that the pages the pool has in use are exactly the
/// tree's (its nodes and spare leaves): a page unlinked and not freed, or freed twice, breaks
/// the count. The tree must be the pool's only one.
fn assert_owns_every_page(tree: &BTree, context: &str) -> TreeCheck {
    let check = tree
        .check_integrity()
        .unwrap_or_else(|error| panic!("{context}: integrity: {error}"));
    let pool = tree.pool();
    let in_use = pool.page_count() - pool.free_page_count();
    let owned = check.leaf_pages + check.inner_pages + check.spare_leaves;
    assert_eq!(
        in_use as u64,
        owned,
        "{context}: {in_use} pages are in use ({} allocated, {} free) but the tree owns {owned} \
         ({check:?})",
        pool.page_count(),
        pool.free_page_count()
    );
    check
}

/// A queue: rows appended at the end, the oldest deleted, many times the window over. The
/// pages stop growing once the window is reached: without freeing, every page that ever held
/// a row stays (about 2,000 pages here, against the bound of 120).
#[test]
fn a_queue_runs_in_a_bounded_number_of_pages() {
    for (policy, path) in configurations() {
        for lanes in [false, true] {
            let context = format!("{policy:?}, {path:?}, lanes {lanes}");
            let tree = tree_with(policy, path);
            let counter = AtomicI64::new(0);
            let mut window: VecDeque<u64> = VecDeque::new();
            let mut key = Vec::new();
            let value = [7u8; 100];
            for round in 0..200 {
                for _ in 0..700 {
                    let number = if lanes {
                        insert_on_lane(&tree, &counter, &value, &mut key) as u64
                    } else {
                        let number = counter.fetch_add(1, Ordering::Relaxed) as u64;
                        tree.insert(&key_of(number), &value).unwrap();
                        number
                    };
                    window.push_back(number);
                }
                while window.len() > 3000 {
                    let oldest = window.pop_front().unwrap();
                    assert!(
                        tree.delete(&key_of(oldest)).unwrap().is_some(),
                        "{context}: row {oldest} went missing"
                    );
                }
                if round % 50 == 49 {
                    let check = assert_owns_every_page(&tree, &format!("{context}, round {round}"));
                    assert_eq!(check.rows, window.len() as u64, "{context}");
                }
            }
            let stats = tree.stats();
            let check = assert_owns_every_page(&tree, &context);
            assert!(stats.leaves_freed > 1000, "{context}: {stats:?}");
            assert!(
                tree.pool().page_count() <= 120,
                "{context}: a queue of 3,000 rows of 100 bytes (about 45 leaves) allocated {} \
                 pages ({check:?}, {stats:?})",
                tree.pool().page_count()
            );
            let rows: Vec<u64> = tree
                .range(Bound::Unbounded, Bound::Unbounded, Direction::Forward)
                .map(|(key, _)| u64::from_be_bytes(key.try_into().unwrap()))
                .collect();
            let mut expected: Vec<u64> = window.iter().copied().collect();
            expected.sort_unstable();
            assert!(rows == expected, "{context}: the queue's rows differ");
        }
    }
}

/// Inserts `value` on the calling thread's sequence lane, its key the next number of
/// `counter` (big-endian, left in `key`); returns the number.
fn insert_on_lane(tree: &BTree, counter: &AtomicI64, value: &[u8], key: &mut Vec<u8>) -> i64 {
    insert_on_lane_number(tree, None, counter, value, key, 1)
}

/// Inserts `value` on sequence lane `lane` (the calling thread's if `None`), its key the next
/// number of `counter` times `key_scale` (big-endian, left in `key`); returns the number.
fn insert_on_lane_number(
    tree: &BTree,
    lane: Option<usize>,
    counter: &AtomicI64,
    value: &[u8],
    key: &mut Vec<u8>,
    key_scale: u64,
) -> i64 {
    key.clear();
    let reserve = |rows: u64| Ok::<i64, ()>(counter.fetch_add(rows as i64, Ordering::Relaxed));
    let make_key = |number: i64, key: &mut Vec<u8>| {
        key.extend_from_slice(&key_of(key_scale * number as u64));
        Ok(())
    };
    match lane {
        None => tree.insert_with_sequence_key(value, 1, reserve, make_key, key),
        Some(lane) => tree.insert_with_sequence_key_on_lane(lane, value, 1, reserve, make_key, key),
    }
    .unwrap()
}

/// Deleting every row, in random order, frees every leaf but the last and every inner page
/// that lost its children: the root and one page per level down to that leaf stay. Then the
/// rows go in again, on the freed pages.
#[test]
fn deleting_every_row_leaves_one_page_per_level() {
    let seed = common::seed();
    for (policy, path) in configurations() {
        let context = format!("{policy:?}, {path:?}");
        let mut rng = StdRng::seed_from_u64(seed);
        let tree = tree_with(policy, path);
        let mut numbers: Vec<u64> = (0..30_000).collect();
        numbers.shuffle(&mut rng);
        for &number in &numbers {
            tree.insert(&key_of(number), &[number as u8; 300]).unwrap();
        }
        let full = assert_owns_every_page(&tree, &context);
        assert!(
            full.levels >= 3,
            "{context}: the tree should have grown: {full:?}"
        );
        let allocated = tree.pool().page_count();
        numbers.shuffle(&mut rng);
        for &number in &numbers {
            assert!(tree.delete(&key_of(number)).unwrap().is_some(), "{context}");
        }
        let empty = assert_owns_every_page(&tree, &context);
        assert_eq!(empty.rows, 0, "{context}");
        assert_eq!(
            (empty.leaf_pages, empty.inner_pages),
            (1, u64::from(empty.levels) - 1),
            "{context}: an empty tree keeps one leaf and the pages above it: {empty:?}"
        );
        assert!(tree.stats().inner_pages_freed > 0, "{context}");
        numbers.shuffle(&mut rng);
        for &number in &numbers {
            tree.insert(&key_of(number), &[number as u8; 300]).unwrap();
        }
        let mut oracle = BTreeMap::new();
        for &number in &numbers {
            oracle.insert(key_of(number).to_vec(), vec![number as u8; 300]);
        }
        common::assert_tree_holds(&tree, &oracle, &context);
        assert_owns_every_page(&tree, &context);
        assert!(
            tree.pool().page_count() <= allocated + allocated / 10,
            "{context}: refilling allocated {} pages on top of {allocated}",
            tree.pool().page_count() - allocated
        );
    }
}

/// Random inserts, deletes of whole key ranges (which empty leaves anywhere, first and middle
/// ones included, and whole subtrees), lookups and scans both ways, against a `BTreeMap`.
#[test]
fn random_range_deletes_match_a_btreemap() {
    let seed = common::seed();
    for (policy, path) in configurations() {
        let context = format!("{policy:?}, {path:?}");
        let mut rng = StdRng::seed_from_u64(seed);
        let tree = tree_with(policy, path);
        let mut oracle: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
        let space = 40_000u64;
        for step in 0..3000 {
            match rng.random_range(0..10) {
                0..=5 => {
                    // A run of keys, ascending, as loads and appends make them.
                    let start = rng.random_range(0..space);
                    for number in start..(start + rng.random_range(1..60)).min(space) {
                        let key = key_of(number).to_vec();
                        let len = if rng.random_range(0..20) == 0 {
                            3000
                        } else {
                            80
                        };
                        let value = vec![rng.random::<u8>(); len];
                        let expected = !oracle.contains_key(&key);
                        assert_eq!(tree.insert(&key, &value).is_ok(), expected, "{context}");
                        oracle.entry(key).or_insert(value);
                    }
                }
                6..=8 => {
                    let start = rng.random_range(0..space);
                    let end = (start + rng.random_range(1..2000)).min(space);
                    let doomed: Vec<Vec<u8>> = oracle
                        .range(key_of(start).to_vec()..key_of(end).to_vec())
                        .map(|(key, _)| key.clone())
                        .collect();
                    for key in doomed {
                        assert_eq!(tree.delete(&key).unwrap(), oracle.remove(&key), "{context}");
                    }
                }
                _ => {
                    let start = key_of(rng.random_range(0..space)).to_vec();
                    let expected: Vec<_> = oracle
                        .range(start.clone()..)
                        .take(300)
                        .map(|(k, v)| (k.clone(), v.clone()))
                        .collect();
                    let forward: Vec<_> = tree
                        .range(
                            Bound::Included(&start),
                            Bound::Unbounded,
                            Direction::Forward,
                        )
                        .take(300)
                        .collect();
                    assert!(
                        forward == expected,
                        "{context}: scan from {start:?} at step {step}"
                    );
                }
            }
            if step % 300 == 0 {
                assert_owns_every_page(&tree, &format!("{context}, step {step}"));
            }
        }
        common::assert_tree_holds(&tree, &oracle, &context);
        assert_owns_every_page(&tree, &context);
        assert!(
            tree.stats().leaves_freed > 50,
            "{context}: {:?}",
            tree.stats()
        );
    }
}

/// Many threads at once: appenders at the end of the index (generated keys, or sequence
/// lanes), deleters taking the oldest rows from the start, writers inserting and deleting
/// keys of their own between the queue's rows (so leaves empty while inserts split their
/// neighbours), and scanners checking order and whole rows meanwhile. At the end the tree
/// holds exactly what the threads kept, passes the integrity check, and owns every page in
/// use; and the pages stayed bounded.
#[test]
fn a_concurrent_queue_with_writers_between_its_rows_matches_its_oracle() {
    let seed = common::seed();
    for (policy, path) in configurations() {
        for lanes in [false, true] {
            let context = format!("{policy:?}, {path:?}, lanes {lanes}");
            run_concurrent_queue(seed, policy, path, lanes, &context);
        }
    }
}

/// Keys of the queue are even numbers, the between-writers' odd ones.
fn run_concurrent_queue(
    seed: u64,
    policy: LatchPolicy,
    path: InsertPath,
    lanes: bool,
    context: &str,
) {
    const APPENDERS: usize = 3;
    const ROWS_PER_APPENDER: usize = 6000;
    const WINDOW: usize = 2000;
    let tree = tree_with(policy, path);
    let counter = AtomicI64::new(0);
    let queue: Mutex<VecDeque<u64>> = Mutex::new(VecDeque::new());
    let appending = AtomicBool::new(true);
    let deleted = AtomicU64::new(0);
    let kept_between: Vec<BTreeMap<u64, u8>> = std::thread::scope(|scope| {
        let appenders: Vec<_> = (0..APPENDERS)
            .map(|thread| {
                let (tree, counter, queue) = (&tree, &counter, &queue);
                scope.spawn(move || {
                    let mut key = Vec::new();
                    for _ in 0..ROWS_PER_APPENDER {
                        let value = [thread as u8 + 1; 90];
                        let number = if lanes {
                            let number = insert_on_lane_number(
                                tree,
                                Some(thread),
                                counter,
                                &value,
                                &mut key,
                                2,
                            );
                            2 * number as u64
                        } else {
                            let key = tree
                                .insert_with_generated_key(&value, |key| {
                                    let number = counter.fetch_add(1, Ordering::Relaxed) as u64;
                                    key.extend_from_slice(&key_of(2 * number));
                                    Ok::<(), ()>(())
                                })
                                .unwrap();
                            u64::from_be_bytes(key.try_into().unwrap())
                        };
                        queue.lock().unwrap().push_back(number);
                    }
                })
            })
            .collect();
        let deleters: Vec<_> = (0..2)
            .map(|_| {
                let (tree, queue, appending, deleted) = (&tree, &queue, &appending, &deleted);
                scope.spawn(move || {
                    loop {
                        let oldest = {
                            let mut queue = queue.lock().unwrap();
                            if queue.len() <= WINDOW {
                                None
                            } else {
                                queue.pop_front()
                            }
                        };
                        match oldest {
                            Some(number) => {
                                let old = tree.delete(&key_of(number)).unwrap();
                                let value = old.unwrap_or_else(|| {
                                    panic!("{context}: queued row {number} went missing")
                                });
                                assert!(value.len() == 90 && value.iter().all(|&b| b == value[0]));
                                deleted.fetch_add(1, Ordering::Relaxed);
                            }
                            None if !appending.load(Ordering::Relaxed) => break,
                            None => std::thread::yield_now(),
                        }
                    }
                })
            })
            .collect();
        let between: Vec<_> = (0..2u64)
            .map(|thread| {
                let (tree, counter, appending) = (&tree, &counter, &appending);
                scope.spawn(move || {
                    let mut rng = StdRng::seed_from_u64(seed ^ thread);
                    let mut kept: BTreeMap<u64, u8> = BTreeMap::new();
                    while appending.load(Ordering::Relaxed) {
                        // Odd keys among the queue's newest and oldest rows, two threads'
                        // keys apart by their last bit of the half.
                        let top = 2 * counter.load(Ordering::Relaxed).max(1) as u64;
                        let low = top.saturating_sub(2 * WINDOW as u64 + 400);
                        let number = (rng.random_range(low..top) / 4) * 4 + 1 + 2 * thread;
                        if rng.random_range(0..3) == 0 || kept.contains_key(&number) {
                            let removed = tree.delete(&key_of(number)).unwrap();
                            assert_eq!(
                                removed.map(|value| value[0]),
                                kept.remove(&number),
                                "{context}: between-row {number}"
                            );
                        } else {
                            let byte = rng.random::<u8>();
                            tree.insert(&key_of(number), &[byte; 40]).unwrap();
                            kept.insert(number, byte);
                        }
                        // Some go again at once, so their leaves empty often.
                        if rng.random_range(0..2) == 0
                            && let Some((&number, _)) = kept.iter().next()
                        {
                            assert!(tree.delete(&key_of(number)).unwrap().is_some());
                            kept.remove(&number);
                        }
                    }
                    kept
                })
            })
            .collect();
        let scanner = {
            let (tree, appending) = (&tree, &appending);
            scope.spawn(move || {
                let mut round = 0u32;
                while appending.load(Ordering::Relaxed) {
                    let direction = if round.is_multiple_of(2) {
                        Direction::Forward
                    } else {
                        Direction::Backward
                    };
                    round += 1;
                    let mut scan = tree.range(Bound::Unbounded, Bound::Unbounded, direction);
                    let rows: Vec<(Vec<u8>, Vec<u8>)> = scan.by_ref().collect();
                    assert!(scan.error().is_none(), "{context}: {:?}", scan.error());
                    for pair in rows.windows(2) {
                        let ordered = match direction {
                            Direction::Forward => pair[0].0 < pair[1].0,
                            Direction::Backward => pair[0].0 > pair[1].0,
                        };
                        assert!(ordered, "{context}: a scan saw keys out of order");
                    }
                    assert!(
                        rows.iter()
                            .all(|(_, value)| value.iter().all(|&b| b == value[0])),
                        "{context}: a scan saw a torn row"
                    );
                }
            })
        };
        appenders
            .into_iter()
            .for_each(|thread| thread.join().unwrap());
        appending.store(false, Ordering::Relaxed);
        deleters
            .into_iter()
            .for_each(|thread| thread.join().unwrap());
        scanner.join().unwrap();
        between
            .into_iter()
            .map(|thread| thread.join().unwrap())
            .collect()
    });
    let mut expected: Vec<u64> = queue.into_inner().unwrap().into_iter().collect();
    expected.extend(kept_between.iter().flat_map(|kept| kept.keys().copied()));
    expected.sort_unstable();
    let rows: Vec<u64> = tree
        .range(Bound::Unbounded, Bound::Unbounded, Direction::Forward)
        .map(|(key, _)| u64::from_be_bytes(key.try_into().unwrap()))
        .collect();
    assert!(
        rows == expected,
        "{context}: the tree holds {} rows, the threads kept {}",
        rows.len(),
        expected.len()
    );
    let check = assert_owns_every_page(&tree, context);
    assert!(
        deleted.load(Ordering::Relaxed) as usize >= APPENDERS * ROWS_PER_APPENDER - WINDOW,
        "{context}"
    );
    // How many pages the run allocated depends on how far the deleters fell behind the
    // appenders; `a_queue_runs_in_a_bounded_number_of_pages` bounds it where that is fixed.
    assert!(
        tree.stats().leaves_freed > 100,
        "{context}: {:?}, {check:?}",
        tree.stats()
    );
}

/// A sequence lane remembers the leaf its last row went to and that leaf's `next` link, and
/// trusts the leaf to cover its next number while the link is unchanged. If the leaf is freed
/// and handed out again as the new last leaf (whose `next` link is none, as the lane's leaf's
/// was), the link matches by chance: the lane must notice that a leaf was freed, or its next
/// row lands on a page whose keys all lie above it. If the leaf is freed and still free, the
/// lane must take its next row elsewhere rather than fail on a freed page.
#[test]
fn a_lane_does_not_trust_its_leaf_once_it_was_freed_and_handed_out_again() {
    const ROW: usize = 2000; // four rows on a leaf, and four numbers in a lane's block
    for (policy, reused) in LatchPolicy::ALL
        .into_iter()
        .flat_map(|policy| [(policy, true), (policy, false)])
    {
        let tree = tree_with(policy, InsertPath::Default);
        let counter = AtomicI64::new(0);
        let mut key = Vec::new();
        let mut insert = |lane: usize| {
            insert_on_lane_number(
                &tree,
                Some(lane),
                &counter,
                &[lane as u8 + 1; ROW],
                &mut key,
                1,
            )
        };
        // Lane 0: numbers 0..4 fill the first leaf, 4 and 5 start the second, whose next link
        // is none when the lane records it.
        for _ in 0..6 {
            insert(0);
        }
        // Lane 1 starts a new last leaf after it with number 8 (its block is 8..12).
        assert_eq!(insert(1), 8);
        let free_before = tree.pool().free_page_count();
        // Lane 0's leaf empties and is freed.
        for number in [4u64, 5] {
            assert!(tree.delete(&key_of(number)).unwrap().is_some());
        }
        assert_eq!(tree.stats().leaves_freed, 1, "{policy:?}");
        assert_eq!(tree.pool().free_page_count(), free_before + 1, "{policy:?}");
        if reused {
            // Lane 1 fills its leaf and starts the next one on the freed page, a last leaf
            // again.
            for _ in 0..4 {
                insert(1);
            }
            assert_eq!(
                tree.pool().free_page_count(),
                free_before,
                "{policy:?}: the freed page should have been handed out again"
            );
        }
        // Lane 0's next number is 6, below every key of the page it remembers.
        insert(0);
        tree.check_integrity()
            .unwrap_or_else(|error| panic!("{policy:?}: {error}"));
        let rows: Vec<u64> = tree
            .range(Bound::Unbounded, Bound::Unbounded, Direction::Forward)
            .map(|(key, _)| u64::from_be_bytes(key.try_into().unwrap()))
            .collect();
        // 0..4 and 8 (and 9..13) as above, and lane 0's row, from a new block since its leaf
        // went.
        assert_eq!(
            rows.len(),
            if reused { 10 } else { 6 },
            "{policy:?}: {rows:?}"
        );
        for row in &rows {
            assert!(
                tree.get(&key_of(*row)).unwrap().is_some(),
                "{policy:?}: row {row}"
            );
        }
    }
}

/// The default path's tail hint names the last leaf as the last append split left it. A
/// classic split in the middle of that leaf moves the end of the index to a new page without
/// moving the hint, and deletes may then empty and free the hinted page: the next append must
/// find the last leaf again rather than fail on the freed page. Then the same with the freed
/// page handed out again (to a split elsewhere in the tree).
#[test]
fn an_append_finds_the_last_leaf_after_its_hinted_page_was_freed() {
    const ROW: usize = 2000; // four rows on a leaf
    for (policy, reused) in LatchPolicy::ALL
        .into_iter()
        .flat_map(|policy| [(policy, false), (policy, true)])
    {
        let context = format!("{policy:?}, reused {reused}");
        let tree = tree_with(policy, InsertPath::Default);
        let mut oracle = BTreeMap::new();
        let insert = |tree: &BTree, oracle: &mut BTreeMap<Vec<u8>, Vec<u8>>, number: u64| {
            tree.insert(&key_of(number), &[number as u8; ROW]).unwrap();
            oracle.insert(key_of(number).to_vec(), vec![number as u8; ROW]);
        };
        // Leaves [0 10 20 30] [40 50 60 70], the second hinted as the last.
        for number in (0..80).step_by(10) {
            insert(&tree, &mut oracle, number);
        }
        // A classic split of the last leaf in its middle: [40 45 50] [60 70].
        tree.set_insert_path(InsertPath::Classic);
        insert(&tree, &mut oracle, 45);
        tree.set_insert_path(InsertPath::Default);
        for number in [40u64, 45, 50] {
            tree.delete(&key_of(number)).unwrap().unwrap();
            oracle.remove(key_of(number).as_slice());
        }
        assert_eq!(tree.stats().leaves_freed, 1, "{context}");
        if reused {
            // A split of the first leaf takes the freed page.
            insert(&tree, &mut oracle, 5);
            assert_eq!(tree.pool().free_page_count(), 0, "{context}");
        }
        insert(&tree, &mut oracle, 80);
        common::assert_tree_holds(&tree, &oracle, &context);
        assert_owns_every_page(&tree, &context);
    }
}

/// An appender of a row that fills a page of its own copies it into a private leaf before the
/// tail gate, and holds that leaf's latch while it waits at the gate. If the tail hint names a
/// freed page and the pool hands that very page out as the private leaf, the gate holder (here
/// the appender itself) must not wait for the hinted page's latch: the private leaf's holder
/// waits for the gate, so that wait never ended. Run on a thread, so that a hang fails the
/// test instead of stalling the suite.
#[test]
fn an_appender_never_waits_for_its_private_leaf_named_by_a_stale_tail_hint() {
    const ROW: usize = 2000; // four rows on a leaf
    const PAGE_ROW: usize = 6000; // a row that fills a page of its own
    for policy in LatchPolicy::ALL {
        let (done, finished) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let tree = tree_with(policy, InsertPath::Default);
            let mut oracle = BTreeMap::new();
            // A generated key first, so that the tree knows the generated keys' length and
            // copies a page-sized row into a private leaf before the gate.
            let key = tree
                .insert_with_generated_key(&[0; ROW], |key| {
                    key.extend_from_slice(&key_of(0));
                    Ok::<(), ()>(())
                })
                .unwrap();
            oracle.insert(key, vec![0; ROW]);
            // Leaves [0 10 20 30] [40 50 60 70], the second hinted as the last.
            for number in (10..80).step_by(10) {
                tree.insert(&key_of(number), &[number as u8; ROW]).unwrap();
                oracle.insert(key_of(number).to_vec(), vec![number as u8; ROW]);
            }
            // A classic split in the middle of the last leaf, [40 45 50] [60 70], leaves the
            // hint on the first half; deletes free it.
            tree.set_insert_path(InsertPath::Classic);
            tree.insert(&key_of(45), &[45; ROW]).unwrap();
            tree.set_insert_path(InsertPath::Default);
            for number in [40u64, 50] {
                oracle.remove(key_of(number).as_slice());
            }
            for number in [40u64, 45, 50] {
                tree.delete(&key_of(number)).unwrap().unwrap();
            }
            assert_eq!(tree.stats().leaves_freed, 1, "{policy:?}");
            assert_eq!(tree.pool().free_page_count(), 1, "{policy:?}");
            // The private leaf is the freed page, still named by the tail hint.
            let key = tree
                .insert_with_generated_key(&[80; PAGE_ROW], |key| {
                    key.extend_from_slice(&key_of(80));
                    Ok::<(), ()>(())
                })
                .unwrap();
            oracle.insert(key, vec![80; PAGE_ROW]);
            common::assert_tree_holds(&tree, &oracle, &format!("{policy:?}"));
            assert_owns_every_page(&tree, &format!("{policy:?}"));
            done.send(()).unwrap();
        });
        // Not a timing assertion: the insert takes milliseconds, and a deadlock never ends.
        finished
            .recv_timeout(std::time::Duration::from_secs(60))
            .unwrap_or_else(|_| {
                panic!("{policy:?}: the appender waits for its own private leaf (a deadlock)")
            });
    }
}

/// A queue of rows that fill a page each (appended with generated keys, so each is copied into
/// a private leaf before the tail gate), deleted from its start, with a writer inserting and
/// deleting rows between the queue's (classic splits in the middle, which leave the tail hint
/// behind): freed leaves are handed out again at once, as private leaves, spares and split
/// pages, while hints and freeings still name them. Nothing may wait for ever, and the tree
/// must end with exactly the rows kept. Run under a watchdog, so that a hang fails the test.
#[test]
fn a_queue_of_page_sized_rows_with_writers_between_never_hangs() {
    let seed = common::seed();
    for policy in LatchPolicy::ALL {
        let (done, finished) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            run_page_sized_queue(seed, policy);
            done.send(()).unwrap();
        });
        // Not a timing assertion: the run takes seconds, and a deadlock never ends.
        finished
            .recv_timeout(std::time::Duration::from_secs(300))
            .unwrap_or_else(|_| panic!("{policy:?}, seed {seed}: the queue hangs (a deadlock)"));
    }
}

fn run_page_sized_queue(seed: u64, policy: LatchPolicy) {
    const APPENDERS: u64 = 3;
    const ROWS_PER_APPENDER: u64 = 1500;
    const WINDOW: usize = 24;
    const PAGE_ROW: usize = 6000;
    let tree = tree_with(policy, InsertPath::Default);
    let next_number = AtomicU64::new(0);
    let queue: Mutex<VecDeque<u64>> = Mutex::new(VecDeque::new());
    let appending = AtomicBool::new(true);
    // Queue keys are multiples of 4; the between-writer's are 4n + 1 and 4n + 3.
    let kept_between: BTreeMap<u64, u8> = std::thread::scope(|scope| {
        let appenders: Vec<_> = (0..APPENDERS)
            .map(|thread| {
                let (tree, next_number, queue) = (&tree, &next_number, &queue);
                scope.spawn(move || {
                    for _ in 0..ROWS_PER_APPENDER {
                        let mut number = 0;
                        tree.insert_with_generated_key(&[thread as u8 + 1; PAGE_ROW], |key| {
                            number = 4 * next_number.fetch_add(1, Ordering::Relaxed);
                            key.extend_from_slice(&key_of(number));
                            Ok::<(), ()>(())
                        })
                        .unwrap();
                        queue.lock().unwrap().push_back(number);
                    }
                })
            })
            .collect();
        let deleter = {
            let (tree, queue, appending) = (&tree, &queue, &appending);
            scope.spawn(move || {
                loop {
                    let oldest = {
                        let mut queue = queue.lock().unwrap();
                        if queue.len() > WINDOW {
                            queue.pop_front()
                        } else if !appending.load(Ordering::Relaxed) {
                            match queue.pop_front() {
                                Some(number) => Some(number),
                                None => break,
                            }
                        } else {
                            None
                        }
                    };
                    match oldest {
                        Some(number) => {
                            assert!(tree.delete(&key_of(number)).unwrap().is_some());
                        }
                        None => std::thread::yield_now(),
                    }
                }
            })
        };
        let between = {
            let (tree, next_number, appending) = (&tree, &next_number, &appending);
            scope.spawn(move || {
                let mut rng = StdRng::seed_from_u64(seed);
                let mut kept: BTreeMap<u64, u8> = BTreeMap::new();
                while appending.load(Ordering::Relaxed) {
                    let top = next_number.load(Ordering::Relaxed);
                    if top < 2 {
                        std::thread::yield_now();
                        continue;
                    }
                    // Near the end of the index, where the queue's rows still are.
                    let base = top.saturating_sub(rng.random_range(1..8));
                    let number = 4 * base + if rng.random_bool(0.5) { 1 } else { 3 };
                    if kept.remove(&number).is_some() {
                        assert!(tree.delete(&key_of(number)).unwrap().is_some());
                    } else if rng.random_bool(0.3) {
                        // A row of a quarter page: four fill a leaf.
                        tree.insert(&key_of(number), &[9; 1900]).unwrap();
                        kept.insert(number, 9);
                    }
                    if kept.len() > 64 {
                        let (&number, _) = kept.iter().next().unwrap();
                        kept.remove(&number);
                        assert!(tree.delete(&key_of(number)).unwrap().is_some());
                    }
                }
                kept
            })
        };
        for appender in appenders {
            appender.join().unwrap();
        }
        appending.store(false, Ordering::Relaxed);
        deleter.join().unwrap();
        between.join().unwrap()
    });
    let oracle: BTreeMap<Vec<u8>, Vec<u8>> = kept_between
        .into_iter()
        .map(|(number, byte)| (key_of(number).to_vec(), vec![byte; 1900]))
        .collect();
    let context = format!("{policy:?}, seed {seed}");
    common::assert_tree_holds(&tree, &oracle, &context);
    assert_owns_every_page(&tree, &context);
    let stats = tree.stats();
    println!("{context}: {stats:?}, {} pages", tree.pool().page_count());
    assert!(stats.leaves_freed > 1000, "{context}: {stats:?}");
}

/// A tree of `leaves` full leaves of four rows each, numbered from 0 in key order (leaf `l`
/// holds rows `4l..4l + 4`), and the oracle of its rows.
fn tree_of_full_leaves(
    policy: LatchPolicy,
    path: InsertPath,
    leaves: u64,
) -> (BTree, BTreeMap<Vec<u8>, Vec<u8>>) {
    const ROW: usize = 2000; // four rows on a leaf
    let tree = tree_with(policy, path);
    let mut oracle = BTreeMap::new();
    for number in 0..4 * leaves {
        tree.insert(&key_of(number), &[number as u8; ROW]).unwrap();
        oracle.insert(key_of(number).to_vec(), vec![number as u8; ROW]);
    }
    let check = assert_owns_every_page(&tree, "the full tree");
    assert_eq!(check.leaf_pages, leaves, "four rows fill a leaf: {check:?}");
    (tree, oracle)
}

/// Deletes row `number` from the tree and the oracle.
fn delete_row(tree: &BTree, oracle: &mut BTreeMap<Vec<u8>, Vec<u8>>, number: u64) {
    let key = key_of(number);
    assert_eq!(
        tree.delete(&key).unwrap(),
        oracle.remove(key.as_slice()),
        "row {number}"
    );
}

/// Empties leaf `leaf` of a [`tree_of_full_leaves`] with its freeing made to give up (every
/// attempt reports that the links changed, as a split of the left sibling or a busy left
/// sibling makes it report), plus `extra_failures` more failed attempts for what comes next.
/// Only the last delete empties the leaf; the three before it may retry listed leaves.
fn empty_leaf_giving_up(
    tree: &BTree,
    oracle: &mut BTreeMap<Vec<u8>, Vec<u8>>,
    leaf: u64,
    extra_failures: usize,
) {
    for number in 4 * leaf..4 * leaf + 3 {
        delete_row(tree, oracle, number);
    }
    give_up_on_the_next_freeing(tree, extra_failures);
    delete_row(tree, oracle, 4 * leaf + 3);
}

fn give_up_on_the_next_freeing(tree: &BTree, extra_failures: usize) {
    tree.fail_next_empty_leaf_free_attempts(EMPTY_LEAF_FREE_ATTEMPTS + extra_failures);
}

/// Asserts that one leaf was left empty and listed and none freed, and returns the integrity
/// check (whose pages in use are exactly the tree's).
fn assert_one_leaf_left_listed(tree: &BTree, context: &str) -> TreeCheck {
    let stats = tree.stats();
    assert_eq!(
        (stats.empty_leaves_left, stats.leaves_freed),
        (1, 0),
        "{context}: {stats:?}"
    );
    assert_eq!(tree.left_empty_leaves_listed(), 1, "{context}");
    assert_owns_every_page(tree, context)
}

/// Asserts that retries freed every leaf left empty: `freed` leaves freed in all, each by a
/// retry, none listed any more, `free_pages` free pages in the pool and `leaf_pages` leaves in
/// the tree (whose pages in use are exactly the tree's), and the tree holds `oracle`.
fn assert_retries_freed(
    tree: &BTree,
    oracle: &BTreeMap<Vec<u8>, Vec<u8>>,
    context: &str,
    freed: u64,
    free_pages: usize,
    leaf_pages: u64,
) {
    let stats = tree.stats();
    assert_eq!(
        (stats.leaves_freed, stats.empty_leaves_retried_freed),
        (freed, freed),
        "{context}: {stats:?}"
    );
    assert_eq!(tree.left_empty_leaves_listed(), 0, "{context}");
    assert_eq!(tree.pool().free_page_count(), free_pages, "{context}");
    let check = assert_owns_every_page(tree, context);
    assert_eq!(check.leaf_pages, leaf_pages, "{context}");
    common::assert_tree_holds(tree, oracle, context);
}

/// A delete that empties a leaf and whose freeing gives up leaves the leaf linked and empty,
/// and lists it: the next delete in the tree, which empties nothing, frees it. The checker
/// passes throughout, and the pages in use are exactly the tree's. Without the retry the
/// empty leaf stayed for ever (nothing deletes from it again).
#[test]
fn a_leaf_whose_freeing_gave_up_is_freed_by_the_next_delete() {
    for (policy, path) in configurations() {
        for next_delete_finds_its_row in [true, false] {
            let context = format!("{policy:?}, {path:?}, row found {next_delete_finds_its_row}");
            let (tree, mut oracle) = tree_of_full_leaves(policy, path, 6);
            empty_leaf_giving_up(&tree, &mut oracle, 2, 0);
            let left = assert_one_leaf_left_listed(&tree, &context);
            assert_eq!(left.leaf_pages, 6, "{context}: the empty leaf stays linked");
            let free_before = tree.pool().free_page_count();
            // Any delete retries, one that finds nothing to delete too.
            let next = if next_delete_finds_its_row { 0 } else { 1000 };
            delete_row(&tree, &mut oracle, next);
            let context =
                format!("{context}: the next delete should have freed the leaf left empty");
            assert_retries_freed(&tree, &oracle, &context, 1, free_before + 1, 5);
        }
    }
}

/// The sweep the engine runs at checkpoints frees every listed leaf: here the first leaf (no
/// left sibling) and one in the middle, both left by deletes that retried nothing since (a
/// delete that just left its own leaf does not retry).
#[test]
fn the_sweep_frees_every_leaf_whose_freeing_gave_up() {
    for (policy, path) in configurations() {
        let context = format!("{policy:?}, {path:?}");
        let (tree, mut oracle) = tree_of_full_leaves(policy, path, 6);
        for number in [0, 1, 2, 12, 13, 14] {
            delete_row(&tree, &mut oracle, number);
        }
        for number in [3, 15] {
            give_up_on_the_next_freeing(&tree, 0);
            delete_row(&tree, &mut oracle, number);
        }
        assert_eq!(tree.left_empty_leaves_listed(), 2, "{context}");
        assert_eq!(tree.stats().empty_leaves_left, 2, "{context}");
        assert_eq!(assert_owns_every_page(&tree, &context).leaf_pages, 6);
        let free_before = tree.pool().free_page_count();
        assert_eq!(tree.free_left_empty_leaves(), Ok(2), "{context}");
        assert_retries_freed(&tree, &oracle, &context, 2, free_before + 2, 4);
        // Nothing is listed any more: another sweep has nothing to do.
        assert_eq!(tree.free_left_empty_leaves(), Ok(0), "{context}");
    }
}

/// A retry that gives up again lists the leaf again, and a later delete frees it; a listed
/// leaf that holds rows again is dropped from the list, and freed as any leaf is when a delete
/// empties it.
#[test]
fn a_retry_lists_a_leaf_again_or_drops_it_if_it_holds_rows() {
    for (policy, path) in configurations() {
        let context = format!("{policy:?}, {path:?}");
        let (tree, mut oracle) = tree_of_full_leaves(policy, path, 6);
        // The first delete after the give-up retries and gives up again.
        empty_leaf_giving_up(&tree, &mut oracle, 2, EMPTY_LEAF_FREE_ATTEMPTS);
        delete_row(&tree, &mut oracle, 0);
        assert_one_leaf_left_listed(&tree, &context);
        delete_row(&tree, &mut oracle, 1);
        assert_eq!(tree.stats().empty_leaves_retried_freed, 1, "{context}");
        assert_eq!(tree.left_empty_leaves_listed(), 0, "{context}");
        assert_owns_every_page(&tree, &context);

        // Leaf 4 (rows 16..20) is left, then row 17 goes back into it before the sweep.
        empty_leaf_giving_up(&tree, &mut oracle, 4, 0);
        assert_eq!(tree.left_empty_leaves_listed(), 1, "{context}");
        tree.insert(&key_of(17), &[17; 100]).unwrap();
        oracle.insert(key_of(17).to_vec(), vec![17; 100]);
        let leaves = assert_owns_every_page(&tree, &context).leaf_pages;
        assert_eq!(tree.free_left_empty_leaves(), Ok(0), "{context}");
        assert_eq!(tree.left_empty_leaves_listed(), 0, "{context}");
        assert_eq!(assert_owns_every_page(&tree, &context).leaf_pages, leaves);
        // Its next emptying frees it at once.
        delete_row(&tree, &mut oracle, 17);
        assert_eq!(tree.stats().leaves_freed, 2, "{context}");
        assert_eq!(
            assert_owns_every_page(&tree, &context).leaf_pages,
            leaves - 1
        );
        common::assert_tree_holds(&tree, &oracle, &context);
    }
}

/// The list holds at most `LEFTOVER_EMPTY_LEAVES_MAX` leaves; more are counted as not listed
/// and stay, empty and linked (the checker accepts them and the pages stay the tree's), until
/// rows go into them and a delete empties them again.
#[test]
fn leaves_left_beyond_the_list_are_counted_and_stay() {
    const BEYOND: u64 = 2;
    let listed = LEFTOVER_EMPTY_LEAVES_MAX as u64;
    for (policy, path) in configurations() {
        let context = format!("{policy:?}, {path:?}");
        // Every other leaf is emptied, from leaf 1 on, and the last leaf stays.
        let emptied: Vec<u64> = (0..listed + BEYOND).map(|index| 2 * index + 1).collect();
        let leaves = 2 * (listed + BEYOND) + 2;
        let (tree, mut oracle) = tree_of_full_leaves(policy, path, leaves);
        // Three rows of each first, so that the deletes that leave the leaves (which do not
        // retry) come last, one after another.
        for &leaf in &emptied {
            for number in 4 * leaf..4 * leaf + 3 {
                delete_row(&tree, &mut oracle, number);
            }
        }
        for &leaf in &emptied {
            give_up_on_the_next_freeing(&tree, 0);
            delete_row(&tree, &mut oracle, 4 * leaf + 3);
        }
        let stats = tree.stats();
        assert_eq!(
            (stats.empty_leaves_left, stats.empty_leaves_not_listed),
            (listed + BEYOND, BEYOND),
            "{context}: {stats:?}"
        );
        assert_eq!(tree.left_empty_leaves_listed() as u64, listed, "{context}");
        assert_eq!(assert_owns_every_page(&tree, &context).leaf_pages, leaves);
        assert_eq!(
            tree.free_left_empty_leaves(),
            Ok(listed as usize),
            "{context}"
        );
        assert_eq!(
            assert_owns_every_page(&tree, &context).leaf_pages,
            leaves - listed,
            "{context}: the leaves not listed stay"
        );
        // The newest ones were not listed; a row in and out again frees each.
        for &leaf in &emptied[emptied.len() - BEYOND as usize..] {
            tree.insert(&key_of(4 * leaf), &[1; 100]).unwrap();
            assert!(
                tree.delete(&key_of(4 * leaf)).unwrap().is_some(),
                "{context}"
            );
        }
        assert_eq!(
            assert_owns_every_page(&tree, &context).leaf_pages,
            leaves - listed - BEYOND
        );
        common::assert_tree_holds(&tree, &oracle, &context);
    }
}
