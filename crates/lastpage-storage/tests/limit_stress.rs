//! Many threads writing into one B+tree whose pool sits at a low page limit
//! (`BufferPool::with_max_pages`): random, ascending and generated keys, single rows and
//! batches, sequence lanes, growing updates and deletes, on both insert paths (switched while
//! the writers run), with one thread doing an undo's work past the limit (`past_page_limit`).
//! Many inserts are refused with `PoolFull` while others, on pages with room or after deletes,
//! succeed. Each thread keeps an oracle of what it was told; afterwards every acknowledged row
//! is found exactly once (lookups, scans both ways, the integrity checker), no refused row is
//! there, and no thread panicked or hung (a watchdog aborts the process after a minute).
//!
//! The test prints its seed; rerun one with `LASTPAGE_SEED=<seed>`. It runs a few rounds, each
//! with its own seed derived from the printed one; `LASTPAGE_TEST_CASES=<n>` runs `n` times as
//! many, for longer hunts.

mod common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, mpsc};
use std::time::Duration;

use lastpage_storage::btree::{
    BTree, BTreeError, GeneratedKeyError, InsertPath, TreeOptions, batch_item_range,
};
use lastpage_storage::buffer::{BufferPool, past_page_limit};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Rounds per run at `LASTPAGE_TEST_CASES=1`: enough to meet both paths and several mixes of
/// roles, while the whole test stays within a few seconds in CI. A round reaches the page
/// limit once, and only a split that needs pages on both sides of it can go half done: with
/// the split's page reservation removed, the first failing round was the 47th of one run, so
/// 12 rounds (what this was first) rarely met it, and 60 (about 1.5 s) met it in 2 of 4 runs.
const ROUNDS: u64 = 60;

/// Operations each thread attempts per round.
const OPS_PER_THREAD: usize = 3000;

/// Key prefixes keep the writers' key spaces apart, so that a key is inserted by one thread
/// only and a refused key can be checked absent. Sequence keys sort last, as an IDENTITY
/// clustered key does, so that nothing but the sequence's own numbers lands among them (the
/// promise sequence lanes rely on).
const RANDOM_PREFIX: u8 = 0x10;
const ASCENDING_PREFIX: u8 = 0x80;
const BATCH_PREFIX: u8 = 0x40;
const UNDO_PREFIX: u8 = 0x60;
const SEQUENCE_PREFIX: u8 = 0xF0;

/// What one thread did: the rows it was told are in (and are still its own), and the keys it
/// was refused (and never inserted afterwards).
#[derive(Default)]
struct Outcome {
    present: BTreeMap<Vec<u8>, Vec<u8>>,
    refused: Vec<Vec<u8>>,
    refusals: u64,
    successes: u64,
}

impl Outcome {
    fn inserted(&mut self, key: Vec<u8>, value: Vec<u8>) {
        self.successes += 1;
        let old = self.present.insert(key.clone(), value);
        assert!(old.is_none(), "{key:?} was acknowledged twice");
    }

    fn refused(&mut self, key: Vec<u8>) {
        self.refusals += 1;
        self.refused.push(key);
    }
}

/// The shared state of a round.
struct Round {
    tree: BTree,
    /// The next number of the sequence that generated keys and lanes take from.
    sequence: AtomicU64,
    /// The next number of the ascending writers.
    ascending: AtomicU64,
    /// Writers still running; the path switcher stops when it reaches zero.
    running: AtomicUsize,
}

fn key_with(prefix: u8, number: u64, thread: u8, len: usize) -> Vec<u8> {
    let mut key = Vec::with_capacity(len.max(10));
    key.push(prefix);
    key.extend_from_slice(&number.to_be_bytes());
    key.push(thread);
    key.resize(len.max(10), b'k');
    key
}

fn sequence_key(number: i64, key: &mut Vec<u8>) {
    key.push(SEQUENCE_PREFIX);
    key.extend_from_slice(&(number as u64).to_be_bytes());
}

/// A value that names its key, so that a row found under the wrong key or with another row's
/// bytes is caught, of a length that is small, medium or fills a page.
fn value_for(rng: &mut StdRng, key_len: usize, tag: u64) -> Vec<u8> {
    let room = lastpage_storage::limits::MAX_RECORD_BYTES - 4 - key_len;
    let len = match rng.random_range(0..10) {
        0..=5 => rng.random_range(8..120),
        6..=8 => rng.random_range(800..3000),
        _ => rng.random_range(4000..=room),
    }
    .min(room)
    .max(8);
    let mut value = tag.to_be_bytes().to_vec();
    value.resize(len, (tag % 251) as u8);
    value
}

fn key_len(rng: &mut StdRng) -> usize {
    match rng.random_range(0..8) {
        0 => rng.random_range(200..900),
        _ => rng.random_range(10..40),
    }
}

fn is_pool_full(error: &BTreeError) -> bool {
    matches!(error, BTreeError::PoolFull(_))
}

/// Random keys, one row at a time; some rows are updated to a random size (a growing update
/// splits, and at the limit fails leaving the old value) or deleted, which makes room for
/// later inserts.
fn random_writer(round: &Round, thread: u8, rng: &mut StdRng) -> Outcome {
    let mut outcome = Outcome::default();
    let mut own: Vec<Vec<u8>> = Vec::new();
    for op in 0..OPS_PER_THREAD {
        let choice = rng.random_range(0..10);
        if choice >= 8 && !own.is_empty() {
            let at = rng.random_range(0..own.len());
            let key = own[at].clone();
            if choice == 8 {
                let value = value_for(rng, key.len(), op as u64);
                match round.tree.update(&key, &value) {
                    Ok(Some(old)) => {
                        assert_eq!(outcome.present.get(&key), Some(&old), "update's old value");
                        outcome.present.insert(key, value);
                    }
                    Err(error) if is_pool_full(&error) => {}
                    other => panic!("update of {key:?}: {other:?}"),
                }
            } else {
                let old = round.tree.delete(&key).expect("delete");
                assert_eq!(old.as_ref(), outcome.present.get(&key), "deleted value");
                outcome.present.remove(&key);
                own.swap_remove(at);
            }
            continue;
        }
        let key = key_with(RANDOM_PREFIX, rng.random::<u64>(), thread, key_len(rng));
        let value = value_for(rng, key.len(), op as u64);
        insert_recorded(round, key, value, &mut own, &mut outcome);
    }
    outcome
}

/// Inserts one row into the round's tree: recorded in `own` (the writer's rows, which it may
/// delete later) and in `outcome` if it went in, as refused if the pool was full.
fn insert_recorded(
    round: &Round,
    key: Vec<u8>,
    value: Vec<u8>,
    own: &mut Vec<Vec<u8>>,
    outcome: &mut Outcome,
) {
    match round.tree.insert(&key, &value) {
        Ok(()) => {
            own.push(key.clone());
            outcome.inserted(key, value);
        }
        Err(error) if is_pool_full(&error) => outcome.refused(key),
        Err(other) => panic!("insert of {key:?}: {other}"),
    }
}

/// Ascending keys from one counter shared by the ascending writers: appends at the end of
/// their range, racing each other out of order. Deletes some of its rows now and then.
fn ascending_writer(round: &Round, thread: u8, rng: &mut StdRng) -> Outcome {
    let mut outcome = Outcome::default();
    let mut own: Vec<Vec<u8>> = Vec::new();
    let key_len = key_len(rng);
    for op in 0..OPS_PER_THREAD {
        if rng.random_range(0..8) == 0 && !own.is_empty() {
            let key = own.swap_remove(rng.random_range(0..own.len()));
            assert!(round.tree.delete(&key).expect("delete").is_some());
            outcome.present.remove(&key);
            continue;
        }
        let number = round.ascending.fetch_add(1, Ordering::Relaxed);
        let key = key_with(ASCENDING_PREFIX, number, thread, key_len);
        let value = value_for(rng, key.len(), op as u64);
        insert_recorded(round, key, value, &mut own, &mut outcome);
    }
    outcome
}

/// Classic batches (`BTree::insert_batch`) of random keys: each entry goes in or fails alone.
fn batch_writer(round: &Round, thread: u8, rng: &mut StdRng) -> Outcome {
    let mut outcome = Outcome::default();
    let mut op = 0;
    while op < OPS_PER_THREAD {
        let count = rng.random_range(1..24);
        op += count;
        let entries: Vec<(Vec<u8>, Vec<u8>)> = (0..count)
            .map(|item| {
                let key = key_with(BATCH_PREFIX, rng.random::<u64>(), thread, key_len(rng));
                let value = value_for(rng, key.len(), (op + item) as u64);
                (key, value)
            })
            .collect();
        let refs: Vec<(&[u8], &[u8])> = entries.iter().map(|(k, v)| (&k[..], &v[..])).collect();
        for ((key, value), result) in entries.iter().zip(round.tree.insert_batch(&refs)) {
            match result {
                Ok(()) => outcome.inserted(key.clone(), value.clone()),
                Err(error) if is_pool_full(&error) => outcome.refused(key.clone()),
                Err(other) => panic!("batch insert of {key:?}: {other}"),
            }
        }
    }
    outcome
}

/// Keys the tree makes under its tail gate from the shared sequence: one row at a time, whole
/// batches (whose rows the caller takes back when the batch fails part way, as the engine
/// does), and sequence lanes.
fn sequence_writer(round: &Round, _thread: u8, rng: &mut StdRng) -> Outcome {
    let mut outcome = Outcome::default();
    let mut op = 0;
    while op < OPS_PER_THREAD {
        op += 1;
        let value = value_for(rng, 9, op as u64);
        match rng.random_range(0..3) {
            0 => {
                let mut made = Vec::new();
                let result = round.tree.insert_with_generated_key(&value, |key| {
                    let number = round.sequence.fetch_add(1, Ordering::Relaxed);
                    sequence_key(number as i64, key);
                    made = key.clone();
                    Ok::<(), ()>(())
                });
                match result {
                    Ok(key) => {
                        assert_eq!(key, made, "the key made is the key returned");
                        outcome.inserted(key, value);
                    }
                    Err(GeneratedKeyError::Tree(error)) if is_pool_full(&error) => {
                        // A refusal before the key was made leaves `made` empty.
                        if !made.is_empty() {
                            outcome.refused(made);
                        } else {
                            outcome.refusals += 1;
                        }
                    }
                    Err(other) => panic!("generated insert: {other:?}"),
                }
            }
            1 => {
                let count = rng.random_range(1..40);
                op += count;
                // Batches of small rows, so that one spans a few pages at most.
                let values: Vec<Vec<u8>> = (0..count)
                    .map(|item| {
                        let mut value = (op as u64 + item as u64).to_be_bytes().to_vec();
                        value.resize(rng.random_range(8..700), 3);
                        value
                    })
                    .collect();
                let refs: Vec<&[u8]> = values.iter().map(Vec::as_slice).collect();
                let (mut keys, mut ends) = (Vec::new(), Vec::new());
                let result = round.tree.insert_batch_with_generated_keys(
                    &refs,
                    |keys, ends| {
                        let first = round.sequence.fetch_add(count as u64, Ordering::Relaxed);
                        for number in first..first + count as u64 {
                            sequence_key(number as i64, keys);
                            ends.push(keys.len());
                        }
                        Ok::<(), ()>(())
                    },
                    &mut keys,
                    &mut ends,
                );
                match result {
                    Ok(()) => {
                        for (row, value) in values.into_iter().enumerate() {
                            outcome.inserted(keys[batch_item_range(&ends, row)].to_vec(), value);
                        }
                    }
                    Err((rows, GeneratedKeyError::Tree(error))) if is_pool_full(&error) => {
                        // The caller takes back the rows that went in, as a failed statement
                        // does; the rest were refused.
                        for row in 0..rows {
                            let key = &keys[batch_item_range(&ends, row)];
                            assert_eq!(
                                round.tree.delete(key).expect("take back").as_ref(),
                                Some(&values[row]),
                                "a batch row taken back"
                            );
                        }
                        for row in 0..ends.len() {
                            outcome.refused(keys[batch_item_range(&ends, row)].to_vec());
                        }
                        if ends.is_empty() {
                            outcome.refusals += 1;
                        }
                    }
                    Err((_, other)) => panic!("generated batch: {other:?}"),
                }
            }
            _ => {
                let mut key = Vec::new();
                let result =
                    round.tree.insert_with_sequence_key(
                        &value,
                        1,
                        |count| {
                            Ok::<i64, ()>(round.sequence.fetch_add(count, Ordering::Relaxed) as i64)
                        },
                        |number, key| {
                            sequence_key(number, key);
                            Ok(())
                        },
                        &mut key,
                    );
                match result {
                    Ok(_) => outcome.inserted(key, value),
                    Err(GeneratedKeyError::Tree(error)) if is_pool_full(&error) => {
                        if key.is_empty() {
                            outcome.refusals += 1;
                        } else {
                            outcome.refused(key);
                        }
                    }
                    Err(other) => panic!("lane insert: {other:?}"),
                }
            }
        }
    }
    outcome
}

/// An undo's work: takes a row out and puts it back under `past_page_limit`, after the other
/// writers had the chance to take its room (without ghost records they may), and inserts a few
/// rows of its own the same way. None of it may be refused.
fn undo_writer(round: &Round, thread: u8, rng: &mut StdRng) -> Outcome {
    let mut outcome = Outcome::default();
    let mut own: Vec<Vec<u8>> = Vec::new();
    for op in 0..OPS_PER_THREAD / 4 {
        if own.is_empty() || rng.random_range(0..3) == 0 {
            let key = key_with(UNDO_PREFIX, rng.random::<u64>(), thread, key_len(rng));
            let mut value = value_for(rng, key.len(), op as u64);
            if rng.random_bool(0.5) {
                // A row that fills a page: its insert allocates past the limit while the
                // other writers' allocations are refused at it, the interleaving in which a
                // refusal once gave back a page id that was no longer the last one taken.
                value.resize(
                    lastpage_storage::limits::MAX_RECORD_BYTES - 4 - key.len(),
                    7,
                );
            }
            past_page_limit(|| round.tree.insert(&key, &value))
                .unwrap_or_else(|error| panic!("an insert past the limit failed: {error}"));
            own.push(key.clone());
            outcome.inserted(key, value);
            continue;
        }
        let key = own[rng.random_range(0..own.len())].clone();
        let value = round.tree.delete(&key).expect("delete").expect("own row");
        std::thread::yield_now();
        past_page_limit(|| round.tree.insert(&key, &value))
            .unwrap_or_else(|error| panic!("putting back {key:?} past the limit failed: {error}"));
        // A growing update past the limit, as an undo of a shrinking update does.
        let grown = value_for(rng, key.len(), op as u64);
        let old = past_page_limit(|| round.tree.update(&key, &grown))
            .unwrap_or_else(|error| panic!("an update past the limit failed: {error}"));
        assert_eq!(old.as_ref(), Some(&value));
        outcome.present.insert(key, grown);
    }
    outcome
}

/// Switches the tree's insert path now and then while the writers run: every path keeps the
/// same layout, and an index's path can change at run time.
fn path_switcher(round: &Round, rng: &mut StdRng) {
    while round.running.load(Ordering::Relaxed) > 0 {
        let path = InsertPath::ALL[rng.random_range(0..InsertPath::ALL.len())];
        round.tree.set_insert_path(path);
        for _ in 0..rng.random_range(100..5000) {
            std::hint::spin_loop();
        }
        std::thread::yield_now();
    }
}

fn verify(tree: &BTree, outcomes: &[Outcome], context: &str) {
    let mut oracle = BTreeMap::new();
    for outcome in outcomes {
        for (key, value) in &outcome.present {
            assert!(
                oracle.insert(key.clone(), value.clone()).is_none(),
                "{context}: {key:?} is in two threads' oracles"
            );
        }
    }
    common::assert_tree_holds(tree, &oracle, context);
    for outcome in outcomes {
        for key in &outcome.refused {
            if !oracle.contains_key(key) {
                assert_eq!(
                    tree.get(key).unwrap(),
                    None,
                    "{context}: refused {key:?} is there"
                );
            }
        }
    }
}

type Writer = fn(&Round, u8, &mut StdRng) -> Outcome;

fn run_round(seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    let max_pages = rng.random_range(6..80);
    let path = InsertPath::ALL[rng.random_range(0..2)];
    let switch_paths = rng.random_bool(0.3);
    let round = Round {
        tree: BTree::create(
            Arc::new(BufferPool::with_max_pages(max_pages)),
            1,
            TreeOptions {
                insert_path: path,
                ..TreeOptions::default()
            },
        )
        .unwrap(),
        sequence: AtomicU64::new(1),
        ascending: AtomicU64::new(0),
        running: AtomicUsize::new(0),
    };
    round
        .tree
        .set_optimize_for_sequential_key(rng.random_bool(0.25));
    let writers: [Writer; 5] = [
        random_writer,
        ascending_writer,
        batch_writer,
        sequence_writer,
        undo_writer,
    ];
    // Every kind of writer once, then a few more of random kinds.
    let mut roles: Vec<Writer> = writers.to_vec();
    for _ in 0..rng.random_range(0..4) {
        roles.push(writers[rng.random_range(0..writers.len() - 1)]);
    }
    let context = format!(
        "round seed {seed}: max_pages {max_pages}, {path:?} path, {} writers{}",
        roles.len(),
        if switch_paths { ", paths switched" } else { "" }
    );
    round.running.store(roles.len(), Ordering::Relaxed);
    let start = Barrier::new(roles.len());
    let outcomes: Vec<Outcome> = std::thread::scope(|scope| {
        let handles: Vec<_> = roles
            .iter()
            .enumerate()
            .map(|(thread, writer)| {
                let thread_seed = rng.random::<u64>();
                let (round, start) = (&round, &start);
                scope.spawn(move || {
                    let mut rng = StdRng::seed_from_u64(thread_seed);
                    start.wait();
                    let outcome = writer(round, thread as u8, &mut rng);
                    round.running.fetch_sub(1, Ordering::Relaxed);
                    outcome
                })
            })
            .collect();
        if switch_paths {
            let switch_seed = rng.random::<u64>();
            let round = &round;
            scope.spawn(move || path_switcher(round, &mut StdRng::seed_from_u64(switch_seed)));
        }
        handles
            .into_iter()
            .map(|handle| {
                handle
                    .join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
            })
            .collect()
    });
    let refusals: u64 = outcomes.iter().map(|outcome| outcome.refusals).sum();
    let successes: u64 = outcomes.iter().map(|outcome| outcome.successes).sum();
    println!(
        "{context}: {successes} rows acknowledged, {refusals} refused, {} pages",
        round.tree.pool().page_count()
    );
    assert!(refusals > 0, "{context}: the pool never filled");
    verify(&round.tree, &outcomes, &context);
    // Room freed by deletes is found again: once every row is gone, inserts of small rows
    // that fit on existing pages go in.
    for outcome in &outcomes {
        for key in outcome.present.keys() {
            assert!(
                round.tree.delete(key).unwrap().is_some(),
                "{context}: delete {key:?}"
            );
        }
    }
    verify(&round.tree, &[], &format!("{context}, emptied"));
}

/// Aborts the process if `work` does not finish within `limit`: a hang (a latch, gate or lane
/// never released) would otherwise stall CI with no message.
fn with_watchdog(limit: Duration, what: &str, work: impl FnOnce()) {
    let (done, finished) = mpsc::channel::<()>();
    let what = what.to_string();
    let watchdog = std::thread::spawn(move || {
        if finished.recv_timeout(limit) == Err(mpsc::RecvTimeoutError::Timeout) {
            eprintln!("{what}: no progress for {limit:?}; aborting (a hang)");
            std::process::abort();
        }
    });
    work();
    let _ = done.send(());
    watchdog.join().unwrap();
}

#[test]
fn concurrent_writers_at_the_page_limit_lose_nothing_and_keep_no_refused_row() {
    let seed = common::seed();
    let scale: u64 = std::env::var("LASTPAGE_TEST_CASES")
        .ok()
        .and_then(|text| text.parse().ok())
        .unwrap_or(1);
    let failed = AtomicBool::new(false);
    for round in 0..ROUNDS * scale {
        let round_seed = seed.wrapping_add(round.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        with_watchdog(
            Duration::from_secs(60),
            &format!("round seed {round_seed}"),
            || {
                let result = std::panic::catch_unwind(|| run_round(round_seed));
                if let Err(panic) = result {
                    failed.store(true, Ordering::Relaxed);
                    eprintln!("failed: seed {seed}, round {round} (round seed {round_seed})");
                    std::panic::resume_unwind(panic);
                }
            },
        );
    }
    assert!(!failed.load(Ordering::Relaxed));
}
