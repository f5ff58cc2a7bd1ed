//! Loom model checks of the default insert path: appenders racing on the tail gate, the last
//! leaf and its descent-free split, against a classic inserter and a reader. Rows of 8000 bytes
//! fill a page each, so every insert splits the last leaf and the split protocol (try the
//! cached parent, fall back to the classic path) is exercised in every interleaving. Then the
//! freeing of leaves that deletes empty (`reclaim.rs`) against a split of the left sibling, an
//! append beside it, a scan, and another freeing next to it under another parent; and the
//! retry of a leaf whose freeing gave up against a delete that empties it again.
//!
//! Run with:
//! `RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target-loom cargo test -p lastpage-storage --release --test btree_loom`
#![cfg(loom)]

use std::ops::Bound;

use lastpage_storage::btree::{BTree, Direction, InsertPath, TreeOptions};
use lastpage_storage::buffer::BufferPool;
use lastpage_storage::latch::LatchPolicy;
use loom::sync::Arc;
use loom::sync::atomic::{AtomicU64, Ordering};

const BIG: usize = 7000;

/// A row of which two fill a page.
const HALF: usize = 3000;

/// An empty tree on the default insert path.
fn empty_tree(policy: LatchPolicy) -> BTree {
    BTree::create(
        std::sync::Arc::new(BufferPool::new()),
        1,
        TreeOptions {
            latch_policy: policy,
            insert_path: InsertPath::Default,
            ..TreeOptions::default()
        },
    )
    .unwrap()
}

fn tree(policy: LatchPolicy) -> Arc<BTree> {
    let tree = empty_tree(policy);
    // Two rows first, so the root has already grown and the tail's parent is known: the
    // model then starts in the steady state where the descent-free split applies.
    tree.insert(&0u64.to_be_bytes(), &[0; BIG]).unwrap();
    tree.insert(&1u64.to_be_bytes(), &[0; BIG]).unwrap();
    Arc::new(tree)
}

/// Scans the tree (while writers may be running) and checks that keys come in order and every
/// row after the first `skip` is whole: `len` bytes, all equal (each writer fills its rows with
/// one byte).
fn scan_sees_whole_rows_in_order(tree: &BTree, skip: usize, len: usize) {
    let seen: Vec<(Vec<u8>, Vec<u8>)> = tree
        .range(Bound::Unbounded, Bound::Unbounded, Direction::Forward)
        .collect();
    assert!(seen.windows(2).all(|pair| pair[0].0 < pair[1].0));
    assert!(
        seen.iter()
            .skip(skip)
            .all(|(_, value)| value.len() == len && value.iter().all(|&b| b == value[0]))
    );
}

fn keys(tree: &BTree) -> Vec<u64> {
    tree.range(Bound::Unbounded, Bound::Unbounded, Direction::Forward)
        .map(|(key, _)| u64::from_be_bytes(key.try_into().unwrap()))
        .collect()
}

/// A model builder that explores every interleaving with up to `preemption_bound` preemptions.
fn builder(preemption_bound: usize) -> loom::model::Builder {
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = Some(preemption_bound);
    builder
}

/// [`builder`] with room for 100,000 branches, for the models that take more than loom allows
/// by default: those of two appenders or two lanes, those that start by building the tree of
/// eight rows of [`long_key`]s, and the freed-leaf races, one of which comes close to the
/// default (a change to the freeing's retries could push it over and fail the model for a
/// reason that says nothing about the code's correctness).
fn many_branches_builder(preemption_bound: usize) -> loom::model::Builder {
    let mut builder = builder(preemption_bound);
    builder.max_branches = 100_000;
    builder
}

#[test]
fn generated_keys_from_two_appenders_arrive_in_order() {
    for policy in LatchPolicy::ALL {
        many_branches_builder(2).check(move || {
            let tree = tree(policy);
            let counter = Arc::new(AtomicU64::new(2));
            let appenders: Vec<_> = (0..2)
                .map(|_| {
                    let (tree, counter) = (tree.clone(), counter.clone());
                    loom::thread::spawn(move || {
                        tree.insert_with_generated_key(&[1; BIG], |key| {
                            key.extend_from_slice(
                                &counter.fetch_add(1, Ordering::Relaxed).to_be_bytes(),
                            );
                            Ok::<(), ()>(())
                        })
                        .unwrap();
                    })
                })
                .collect();
            // A reader scanning meanwhile sees keys in order and never a torn row.
            scan_sees_whole_rows_in_order(&tree, 0, BIG);
            for appender in appenders {
                appender.join().unwrap();
            }
            assert_eq!(keys(&tree), vec![0, 1, 2, 3]);
            let check = tree.check_integrity().unwrap();
            assert_eq!(check.rows, 4);
            assert_eq!(tree.stats().leaf_splits, 0, "appends never split in half");
        });
    }
}

/// Two batches whose keys the tree makes at its tail (`insert_batch_with_generated_keys`), two
/// rows of half a page each, race a reader: each batch takes its block of keys under the gate,
/// so the blocks reach the tail in the order they were taken; each batch's first row splits
/// the last leaf at its end (never in half) and its second row joins it on the new leaf. The
/// reader sees keys in order and whole rows, and each batch's keys are consecutive.
#[test]
fn generated_key_batches_from_two_appenders_arrive_in_order() {
    for policy in LatchPolicy::ALL {
        many_branches_builder(2).check(move || {
            let tree = tree(policy);
            let counter = Arc::new(AtomicU64::new(2));
            let appenders: Vec<_> = (0..2u8)
                .map(|writer| {
                    let (tree, counter) = (tree.clone(), counter.clone());
                    loom::thread::spawn(move || {
                        let row = [writer + 1; HALF];
                        let (mut keys, mut ends) = (Vec::new(), Vec::new());
                        tree.insert_batch_with_generated_keys(
                            &[&row, &row],
                            |keys, ends| {
                                let first = counter.fetch_add(2, Ordering::Relaxed);
                                for number in first..first + 2 {
                                    keys.extend_from_slice(&number.to_be_bytes());
                                    ends.push(keys.len());
                                }
                                Ok::<(), ()>(())
                            },
                            &mut keys,
                            &mut ends,
                        )
                        .unwrap();
                        let first = u64::from_be_bytes(keys[..8].try_into().unwrap());
                        assert_eq!(keys[8..], (first + 1).to_be_bytes());
                    })
                })
                .collect();
            // The reader sees the two first rows (BIG bytes) and whole batch rows (HALF).
            scan_sees_whole_rows_in_order(&tree, 2, HALF);
            for appender in appenders {
                appender.join().unwrap();
            }
            assert_eq!(keys(&tree), vec![0, 1, 2, 3, 4, 5]);
            // Each batch's two rows are side by side, written by one writer.
            let values: Vec<u8> = tree
                .range(Bound::Unbounded, Bound::Unbounded, Direction::Forward)
                .map(|(_, value)| value[0])
                .collect();
            assert_eq!(values[2], values[3]);
            assert_eq!(values[4], values[5]);
            assert_eq!(tree.check_integrity().unwrap().rows, 6);
            assert_eq!(tree.stats().leaf_splits, 0, "appends never split in half");
        });
    }
}

#[test]
fn an_appender_and_a_classic_inserter_keep_the_tree_valid() {
    builder(2).check(|| {
        let tree = tree(LatchPolicy::Fifo);
        let appender = {
            let tree = tree.clone();
            loom::thread::spawn(move || tree.insert(&10u64.to_be_bytes(), &[2; BIG]).unwrap())
        };
        // A key below the tail takes the classic path and splits the first leaf.
        tree.insert(&[0, 0, 0, 0, 0, 0, 0, 0, 5], &[3; BIG])
            .unwrap();
        appender.join().unwrap();
        let check = tree.check_integrity().unwrap();
        assert_eq!(check.rows, 4);
    });
}

/// Sequence lanes: one lane goes on filling its own leaf (no tail gate) while a second lane
/// reserves a block under the tail gate and links a new last leaf after it, and a reader scans
/// meanwhile. Rows of 2000 bytes put four on a leaf (and in a block): after six rows the first
/// lane is on the last leaf with two rows of room and two numbers of its block left, so its next
/// row takes the lane path while the second lane's first row must start a new leaf after it.
/// Every row lands once, in key order, with its own bytes, and the tree stays valid.
#[test]
fn two_sequence_lanes_fill_their_own_leaves() {
    const ROW: usize = 2000;
    for policy in LatchPolicy::ALL {
        many_branches_builder(2).check(move || {
            let tree = Arc::new(empty_tree(policy));
            let counter = Arc::new(AtomicU64::new(0));
            let insert = |tree: &BTree, counter: &AtomicU64, lane: usize, byte: u8| {
                let mut key = Vec::new();
                let number = tree
                    .insert_with_sequence_key_on_lane(
                        lane,
                        &[byte; ROW],
                        1,
                        |rows| Ok::<i64, ()>(counter.fetch_add(rows, Ordering::Relaxed) as i64),
                        |number, key| {
                            key.extend_from_slice(&(number as u64).to_be_bytes());
                            Ok(())
                        },
                        &mut key,
                    )
                    .unwrap();
                (key, number)
            };
            // Lane 0 fills the root leaf and splits it, then goes on with its second block on
            // the new last leaf.
            for _ in 0..6 {
                insert(&tree, &counter, 0, 1);
            }
            let lanes: Vec<_> = [(0, 1u8), (1, 2u8)]
                .into_iter()
                .map(|(lane, byte)| {
                    let (tree, counter) = (tree.clone(), counter.clone());
                    loom::thread::spawn(move || insert(&tree, &counter, lane, byte))
                })
                .collect();
            scan_sees_whole_rows_in_order(&tree, 0, ROW);
            let mut numbers: Vec<u64> = lanes
                .into_iter()
                .map(|lane| lane.join().unwrap().1 as u64)
                .collect();
            numbers.sort_unstable();
            let rows: Vec<(u64, u8)> = tree
                .range(Bound::Unbounded, Bound::Unbounded, Direction::Forward)
                .map(|(key, value)| (u64::from_be_bytes(key.try_into().unwrap()), value[0]))
                .collect();
            assert_eq!(rows.len(), 8);
            assert!(rows.windows(2).all(|pair| pair[0].0 < pair[1].0));
            assert!(numbers.iter().all(|n| rows.iter().any(|(key, _)| key == n)));
            assert_eq!(rows.iter().filter(|(_, byte)| *byte == 2).count(), 1);
            let check = tree.check_integrity().unwrap();
            assert_eq!(check.rows, 8);
        });
    }
}

/// A tree of one row per leaf, keyed by `keys`, on the default insert path.
fn tree_of(policy: LatchPolicy, keys: &[u64]) -> Arc<BTree> {
    let tree = empty_tree(policy);
    for key in keys {
        tree.insert(&key.to_be_bytes(), &[1; BIG]).unwrap();
    }
    Arc::new(tree)
}

/// Asserts that the tree holds exactly `expected` keys, passes the integrity check, and owns
/// every page its pool has in use (a freed leaf neither lost nor freed twice).
fn assert_holds_and_owns(tree: &BTree, expected: &[u64]) {
    assert_eq!(keys(tree), expected);
    assert_owns_every_page(tree);
}

/// Runs the integrity check and asserts that the tree owns every page its pool has in use;
/// returns the check.
fn assert_owns_every_page(tree: &BTree) -> lastpage_storage::btree::TreeCheck {
    let check = tree.check_integrity().unwrap();
    let pool = tree.pool();
    assert_eq!(
        (pool.page_count() - pool.free_page_count()) as u64,
        check.leaf_pages + check.inner_pages + check.spare_leaves
    );
    check
}

/// Runs a delete of `deleted`, which empties its leaf and frees it (`reclaim.rs`), in a thread
/// of its own while the model's thread inserts `inserted`, on a tree of one row per leaf keyed
/// 0, 10, 20 and 30. Every row lands once, the links and the parents agree, and the freed page
/// is free or reused, never lost.
fn race_a_freed_leaf(policy: LatchPolicy, deleted: u64, inserted: u64, expected: &[u64]) {
    let expected = expected.to_vec();
    many_branches_builder(2).check(move || {
        let tree = tree_of(policy, &[0, 10, 20, 30]);
        let deleter = {
            let tree = tree.clone();
            loom::thread::spawn(move || tree.delete(&deleted.to_be_bytes()).unwrap().unwrap())
        };
        tree.insert(&inserted.to_be_bytes(), &[2; BIG]).unwrap();
        deleter.join().unwrap();
        assert_holds_and_owns(&tree, &expected);
        assert_eq!(tree.stats().leaves_freed, 1);
    });
}

/// The freed middle leaf [10] races a classic insert that splits its left sibling [0]: the
/// new page goes between [0] and whatever follows it at that moment.
#[test]
fn a_freed_leaf_races_a_split_of_its_left_sibling() {
    race_a_freed_leaf(LatchPolicy::Fifo, 10, 5, &[0, 5, 20, 30]);
}

/// The freed leaf [20], just before the last leaf [30], races an append that splits the last
/// leaf without a descent: the append only tries the parent the freeing holds, and the
/// freeing waits for the last leaf (its right sibling) that the append holds.
#[test]
fn a_freed_leaf_races_an_append_beside_it() {
    race_a_freed_leaf(LatchPolicy::Adaptive, 20, 40, &[0, 10, 30, 40]);
}

/// A reader scans backwards (a descent per leaf, by the fences) while a delete frees the leaf
/// it is about to read or has just read: it sees whole rows in order, and never a freed page.
#[test]
fn a_scan_races_a_freed_leaf() {
    builder(2).check(|| {
        let tree = tree_of(LatchPolicy::Fifo, &[0, 10, 20, 30]);
        let deleter = {
            let tree = tree.clone();
            loom::thread::spawn(move || tree.delete(&10u64.to_be_bytes()).unwrap().unwrap())
        };
        let mut scan = tree.range(Bound::Unbounded, Bound::Unbounded, Direction::Backward);
        let seen: Vec<u64> = scan
            .by_ref()
            .map(|(key, value)| {
                assert_eq!(value.len(), BIG);
                u64::from_be_bytes(key.try_into().unwrap())
            })
            .collect();
        assert!(scan.error().is_none(), "{:?}", scan.error());
        assert!(seen == [30, 20, 10, 0] || seen == [30, 20, 0], "{seen:?}");
        deleter.join().unwrap();
        assert_holds_and_owns(&tree, &[0, 20, 30]);
    });
}

/// A leaf whose freeing gave up (forced with the `test-hooks` feature) is listed; the sweep
/// retries it in one thread while the model's thread inserts a row into its range and deletes
/// it again (that delete frees the leaf itself if the row went into it, and retries the listed
/// leaf once its own work is done). Whichever comes first, no empty leaf stays, nothing stays
/// listed, and the tree owns every page in use.
#[test]
fn a_listed_leaf_is_retried_while_a_delete_empties_it_again() {
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = Some(2);
    // The setup's give-up runs four attempts, each a descent and three latches.
    builder.max_branches = 100_000;
    builder.check(|| {
        let tree = tree_of(LatchPolicy::Fifo, &[0, 10, 20, 30]);
        tree.fail_next_empty_leaf_free_attempts(lastpage_storage::limits::EMPTY_LEAF_FREE_ATTEMPTS);
        tree.delete(&10u64.to_be_bytes()).unwrap().unwrap();
        assert_eq!(tree.left_empty_leaves_listed(), 1);
        let sweeper = {
            let tree = tree.clone();
            loom::thread::spawn(move || tree.free_left_empty_leaves().unwrap())
        };
        tree.insert(&15u64.to_be_bytes(), &[2; BIG]).unwrap();
        tree.delete(&15u64.to_be_bytes()).unwrap().unwrap();
        let swept = sweeper.join().unwrap();
        assert_eq!(keys(&tree), [0, 20, 30]);
        // No empty leaf stays: the one left, and the one a split makes for 15 if the sweep
        // freed the empty leaf first (15 then goes to the full leaf of 0), are both gone.
        let check = assert_owns_every_page(&tree);
        assert_eq!(
            check.leaf_pages,
            3,
            "{check:?}, {:?}, the sweep freed {swept}",
            tree.stats()
        );
        assert_eq!(tree.left_empty_leaves_listed(), 0);
    });
}

/// A key as long as keys may be, so that an inner page holds only four separators and a few
/// leaves of one row each make a tree of three levels: leaves of different parents side by
/// side.
fn long_key(number: u64) -> Vec<u8> {
    let mut key = number.to_be_bytes().to_vec();
    key.resize(lastpage_storage::limits::MAX_KEY_BYTES, 0);
    key
}

/// Rows of [`long_key`]s: one fills a leaf.
const LONG_KEY_ROW: usize = 6000;

/// A tree of three levels: eight rows of [`long_key`]s 0 to 7, a leaf each, the first
/// level-1 page holding leaves 0 to 4 and the next one 5 to 7.
fn tree_of_long_keys(policy: LatchPolicy) -> BTree {
    let tree = empty_tree(policy);
    for number in 0..8u64 {
        tree.insert(&long_key(number), &[1; LONG_KEY_ROW]).unwrap();
    }
    tree
}

/// Two deletes empty neighbouring leaves under different parents, so neither freeing holds
/// the other's parent: the one on the right may find its left sibling freed under it (and
/// start again), or the one on the left may find its right sibling's links changed. Both
/// leaves go, and every other row stays.
#[test]
fn neighbouring_leaves_of_different_parents_freed_at_once() {
    many_branches_builder(2).check(|| {
        let tree = Arc::new(tree_of_long_keys(LatchPolicy::Fifo));
        assert_eq!(tree.check_integrity().unwrap().levels, 3);
        // The first level-1 page holds leaves 0 to 4, the next one 5 to 7.
        let deleters: Vec<_> = [4u64, 5]
            .into_iter()
            .map(|number| {
                let tree = tree.clone();
                loom::thread::spawn(move || tree.delete(&long_key(number)).unwrap().unwrap())
            })
            .collect();
        for deleter in deleters {
            deleter.join().unwrap();
        }
        let left: Vec<u64> = tree
            .range(Bound::Unbounded, Bound::Unbounded, Direction::Forward)
            .map(|(key, _)| u64::from_be_bytes(key[..8].try_into().unwrap()))
            .collect();
        assert_eq!(left, [0, 1, 2, 3, 6, 7]);
        assert_owns_every_page(&tree);
        assert_eq!(tree.stats().leaves_freed, 2);
    });
}

/// A delete frees the first leaf of the second level-1 page while an insert splits its left
/// sibling, the last leaf of the first level-1 page: the split holds the other parent, so the
/// freeing may read its leaf's `prev` link before the split puts a new page between the two,
/// and must see, under the latches, that the link changed and start again.
#[test]
fn a_freed_leaf_races_a_split_of_its_left_sibling_under_another_parent() {
    many_branches_builder(2).check(|| {
        let tree = Arc::new(tree_of_long_keys(LatchPolicy::Adaptive));
        let deleter = {
            let tree = tree.clone();
            loom::thread::spawn(move || tree.delete(&long_key(5)).unwrap().unwrap())
        };
        // Sorts between the keys of 4 and 5.
        let mut between = long_key(4);
        *between.last_mut().unwrap() = 1;
        tree.insert(&between, &[2; LONG_KEY_ROW]).unwrap();
        deleter.join().unwrap();
        assert_eq!(assert_owns_every_page(&tree).rows, 8);
    });
}

/// A freeing waits for its leaf's left sibling while it holds the leaf's parent. If that
/// sibling was freed meanwhile (another delete emptied it) and handed out again as the private
/// leaf of an appender of a page-sized row, whose row then goes down the classic path through
/// that very parent, each waited for the other for ever: the freeing must not wait for a page
/// its link check has not vouched for while it holds the parent.
#[test]
fn a_freeing_never_waits_for_a_freed_left_sibling_reused_as_a_private_leaf() {
    many_branches_builder(1).check(|| {
        let tree = tree_of_long_keys(LatchPolicy::Fifo);
        // A generated key, so that the tree knows their length and copies a page-sized row
        // into a private leaf before the gate.
        tree.insert_with_generated_key(&[1; LONG_KEY_ROW], |key| {
            key.extend_from_slice(&long_key(8));
            Ok::<(), ()>(())
        })
        .unwrap();
        let tree = Arc::new(tree);
        // The first level-1 page holds leaves 0 to 4, the next one 5 to 8: 4 is the left
        // sibling of 5, under another parent. The other thread frees 4, then appends a row
        // that sorts between the keys of 5 and 6 (not an append: it goes the classic way,
        // through the parent of 5, while its private leaf, likely the page 4 was, is held).
        let other = {
            let tree = tree.clone();
            loom::thread::spawn(move || {
                tree.delete(&long_key(4)).unwrap().unwrap();
                let mut between = long_key(5);
                *between.last_mut().unwrap() = 1;
                tree.insert_with_generated_key(&[2; LONG_KEY_ROW], |key| {
                    key.extend_from_slice(&between);
                    Ok::<(), ()>(())
                })
                .unwrap();
            })
        };
        tree.delete(&long_key(5)).unwrap().unwrap();
        other.join().unwrap();
        assert_eq!(assert_owns_every_page(&tree).rows, 8);
    });
}
