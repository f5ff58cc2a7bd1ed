//! Loom model checks of the default insert path: appenders racing on the tail gate, the last
//! leaf and its descent-free split, against a classic inserter and a reader. Rows of 8000 bytes
//! fill a page each, so every insert splits the last leaf and the split protocol (try the
//! cached parent, fall back to the classic path) is exercised in every interleaving.
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
/// row is whole: `len` bytes, all equal (each writer fills its rows with one byte).
fn scan_sees_whole_rows_in_order(tree: &BTree, len: usize) {
    let seen: Vec<(Vec<u8>, Vec<u8>)> = tree
        .range(Bound::Unbounded, Bound::Unbounded, Direction::Forward)
        .collect();
    assert!(seen.windows(2).all(|pair| pair[0].0 < pair[1].0));
    assert!(
        seen.iter()
            .all(|(_, value)| value.len() == len && value.iter().all(|&b| b == value[0]))
    );
}

fn keys(tree: &BTree) -> Vec<u64> {
    tree.range(Bound::Unbounded, Bound::Unbounded, Direction::Forward)
        .map(|(key, _)| u64::from_be_bytes(key.try_into().unwrap()))
        .collect()
}

#[test]
fn generated_keys_from_two_appenders_arrive_in_order() {
    for policy in LatchPolicy::ALL {
        let mut builder = loom::model::Builder::new();
        builder.preemption_bound = Some(2);
        builder.max_branches = 100_000;
        builder.check(move || {
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
            scan_sees_whole_rows_in_order(&tree, BIG);
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
        let mut builder = loom::model::Builder::new();
        builder.preemption_bound = Some(2);
        builder.max_branches = 100_000;
        builder.check(move || {
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
            let seen: Vec<(Vec<u8>, Vec<u8>)> = tree
                .range(Bound::Unbounded, Bound::Unbounded, Direction::Forward)
                .collect();
            assert!(seen.windows(2).all(|pair| pair[0].0 < pair[1].0));
            assert!(
                seen.iter().skip(2).all(|(_, value)| {
                    value.len() == HALF && value.iter().all(|&b| b == value[0])
                })
            );
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
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = Some(2);
    builder.check(|| {
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
        let mut builder = loom::model::Builder::new();
        builder.preemption_bound = Some(2);
        builder.max_branches = 100_000;
        builder.check(move || {
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
            scan_sees_whole_rows_in_order(&tree, ROW);
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
