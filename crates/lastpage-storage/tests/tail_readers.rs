//! Readers against the default insert path, in the storage layer: lookups and range scans
//! both ways (from either end or from the middle, stopping anywhere) while sequence lanes fill
//! their leaves and start new ones, generated keys append page-sized rows through their own
//! pages, batches append at the tail, a classic writer inserts, updates and deletes in the same
//! tree, and the insert path switches at run time. Every acknowledged row must be found by a
//! read that starts after the acknowledgement, with its own bytes; scans return keys strictly
//! in order; the tree passes the integrity check at the end. Prints its seed; rerun with
//! `LASTPAGE_SEED=<seed>`.

mod common;

use std::ops::Bound;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, Instant};

use lastpage_storage::btree::{BTree, Direction, InsertPath, TreeOptions};
use lastpage_storage::buffer::BufferPool;
use lastpage_storage::latch::LatchPolicy;
use lastpage_storage::limits::{LEAF_RECORD_HEADER_BYTES, MAX_RECORD_BYTES};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Keys of the classic writer's rows (inserted, updated and deleted at random): below the
/// sequence, in the middle of the tree.
const RANDOM_PREFIX: u8 = 0x10;
/// Keys of the sequence (lanes, generated keys, batches): the prefix and a big-endian number.
const SEQUENCE_PREFIX: u8 = 0x80;

fn sequence_key(number: i64, key: &mut Vec<u8>) {
    key.push(SEQUENCE_PREFIX);
    key.extend_from_slice(&number.to_be_bytes());
}

/// The filler byte of `key`'s values.
fn filler(key: &[u8]) -> u8 {
    key.iter()
        .fold(0x5Au8, |hash, &byte| hash.rotate_left(3) ^ byte)
}

/// A value for `key` of about `len` bytes (at least the key's): the key, then its filler, so
/// a reader can tell a torn or misplaced value from the right one.
fn value_for(key: &[u8], len: usize) -> Vec<u8> {
    let mut value = key.to_vec();
    value.resize(len.max(key.len()), filler(key));
    value
}

/// Checks that `value` is `key`'s own, or the placeholder its writer inserted it with (zeros,
/// before the writer knew the key the tree made): a torn value or another row's is neither.
fn assert_value_of(key: &[u8], value: &[u8], seed: u64) {
    let own = value.len() >= key.len()
        && &value[..key.len()] == key
        && value[key.len()..].iter().all(|&byte| byte == filler(key));
    let placeholder = value.iter().all(|&byte| byte == 0);
    assert!(
        own || placeholder,
        "key {key:02x?}: a value of {} bytes that is not its own (seed {seed})",
        value.len()
    );
}

/// A row size the default path treats apart: tiny, ~100 B, ~4 KB (two to a page), and
/// page-sized (copied into a page of its own before the tail gate).
fn random_len(rng: &mut StdRng, key_len: usize) -> usize {
    match rng.random_range(0..20) {
        0 => MAX_RECORD_BYTES - LEAF_RECORD_HEADER_BYTES - key_len,
        1..=2 => rng.random_range(3000..4000),
        3..=6 => rng.random_range(1..12),
        _ => rng.random_range(80..120),
    }
}

/// The numbers of sequence keys acknowledged and never deleted, in the order their inserts
/// returned.
type Acknowledged = Mutex<Vec<i64>>;

fn key_of(number: i64) -> [u8; 9] {
    let mut key = [SEQUENCE_PREFIX; 9];
    key[1..].copy_from_slice(&number.to_be_bytes());
    key
}

struct Round<'a> {
    tree: &'a BTree,
    counter: &'a AtomicI64,
    acknowledged: &'a Acknowledged,
    deadline: Instant,
    seed: u64,
}

/// Gives a row inserted with a placeholder of `len` zeros its own bytes: an update in place,
/// or now and then of another size (the classic path's replace, which may split the leaf in
/// the middle, lanes' leaves included). Returns the value.
fn settle(round: &Round<'_>, rng: &mut StdRng, key: &[u8], len: usize) -> Vec<u8> {
    let len = if rng.random_bool(0.1) {
        random_len(rng, key.len())
    } else {
        len
    };
    let value = value_for(key, len);
    let old = round.tree.update(key, &value).unwrap();
    assert!(
        old.is_some_and(|old| old.iter().all(|&byte| byte == 0)),
        "the placeholder (seed {})",
        round.seed
    );
    value
}

/// Single rows on the thread's sequence lane; a few are deleted again at once (as a rolled
/// back insert is), the others acknowledged.
fn lane_writer(round: &Round<'_>, rng: &mut StdRng) {
    let mut key = Vec::new();
    let mut last = i64::MIN;
    while Instant::now() < round.deadline {
        let len = random_len(rng, 9).max(9);
        let placeholder = vec![0u8; len];
        let number = round
            .tree
            .insert_with_sequence_key(
                &placeholder,
                1,
                |rows| Ok::<i64, ()>(round.counter.fetch_add(rows as i64, Ordering::Relaxed)),
                |number, key| {
                    sequence_key(number, key);
                    Ok(())
                },
                &mut key,
            )
            .unwrap();
        // A lane's numbers ascend, but the thread's need not: the generated keys and the
        // batches take numbers past the lane's block, and so does the classic path while
        // the insert path is switched.
        assert!(number != last, "a number twice (seed {})", round.seed);
        last = number;
        let value = settle(round, rng, &key, len);
        if rng.random_bool(0.03) {
            assert_eq!(round.tree.delete(&key).unwrap(), Some(value));
        } else {
            round.acknowledged.lock().unwrap().push(number);
        }
    }
}

/// Single rows whose keys the tree makes under the tail gate (page-sized rows go through a
/// page of their own), and batches whose keys it makes there too.
fn generated_writer(round: &Round<'_>, rng: &mut StdRng) {
    let mut keys = Vec::new();
    let mut ends = Vec::new();
    while Instant::now() < round.deadline {
        if rng.random_bool(0.6) {
            let len = random_len(rng, 9).max(9);
            let placeholder = vec![0u8; len];
            let key = round
                .tree
                .insert_with_generated_key(&placeholder, |key| {
                    sequence_key(round.counter.fetch_add(1, Ordering::Relaxed), key);
                    Ok::<(), ()>(())
                })
                .unwrap();
            settle(round, rng, &key, len);
            let number = i64::from_be_bytes(key[1..].try_into().unwrap());
            round.acknowledged.lock().unwrap().push(number);
        } else {
            let rows = rng.random_range(2..60);
            let len = random_len(rng, 9).clamp(9, 2000);
            let placeholder = vec![0u8; len];
            let values: Vec<&[u8]> = vec![&placeholder[..]; rows];
            round
                .tree
                .insert_batch_with_generated_keys(
                    &values,
                    |keys, ends| {
                        let first = round.counter.fetch_add(rows as i64, Ordering::Relaxed);
                        for number in first..first + rows as i64 {
                            sequence_key(number, keys);
                            ends.push(keys.len());
                        }
                        Ok::<(), ()>(())
                    },
                    &mut keys,
                    &mut ends,
                )
                .unwrap();
            let mut made = Vec::with_capacity(rows);
            let mut start = 0;
            for &end in &ends {
                let key = keys[start..end].to_vec();
                start = end;
                settle(round, rng, &key, len);
                made.push(i64::from_be_bytes(key[1..].try_into().unwrap()));
            }
            round.acknowledged.lock().unwrap().extend(made);
        }
    }
}

/// Classic inserts, updates and deletes of its own keys below the sequence, in the middle of
/// the tree; returns the keys it left in.
fn classic_writer(round: &Round<'_>, rng: &mut StdRng, thread: u8) -> Vec<Vec<u8>> {
    let mut mine = std::collections::BTreeSet::new();
    while Instant::now() < round.deadline {
        let mut key = vec![RANDOM_PREFIX, thread];
        key.extend_from_slice(&rng.random_range(0..4000u32).to_be_bytes());
        key.resize(key.len() + rng.random_range(0..20), b'k');
        let len = random_len(rng, key.len());
        match rng.random_range(0..4) {
            0..=1 => {
                let inserted = round.tree.insert(&key, &value_for(&key, len)).is_ok();
                assert_eq!(inserted, mine.insert(key), "(seed {})", round.seed);
            }
            2 => {
                let old = round.tree.update(&key, &value_for(&key, len)).unwrap();
                assert_eq!(old.is_some(), mine.contains(&key), "(seed {})", round.seed);
            }
            _ => {
                let old = round.tree.delete(&key).unwrap();
                assert_eq!(old.is_some(), mine.remove(&key), "(seed {})", round.seed);
            }
        }
    }
    mine.into_iter().collect()
}

/// A bound of a scan: a sequence key near the tail or in the middle, a key among the classic
/// writer's, or none.
fn random_bound(rng: &mut StdRng, top: i64) -> Bound<Vec<u8>> {
    let mut key = Vec::new();
    match rng.random_range(0..8) {
        0 => return Bound::Unbounded,
        1..=3 => sequence_key((top - rng.random_range(0..2000)).max(0), &mut key),
        4..=5 => sequence_key(rng.random_range(0..=top.max(0)), &mut key),
        _ => {
            key.push(RANDOM_PREFIX);
            key.push(rng.random());
            key.extend_from_slice(&rng.random_range(0..4000u32).to_be_bytes());
        }
    }
    if rng.random_bool(0.5) {
        Bound::Included(key)
    } else {
        Bound::Excluded(key)
    }
}

fn within(key: &[u8], lower: &Bound<Vec<u8>>, upper: &Bound<Vec<u8>>) -> bool {
    let above = match lower {
        Bound::Unbounded => true,
        Bound::Included(low) => key >= low.as_slice(),
        Bound::Excluded(low) => key > low.as_slice(),
    };
    let below = match upper {
        Bound::Unbounded => true,
        Bound::Included(high) => key <= high.as_slice(),
        Bound::Excluded(high) => key < high.as_slice(),
    };
    above && below
}

/// Scans and lookups until the writers' deadline (and at least a few), each checked against
/// the keys acknowledged before it started. Returns how many it did.
fn reader(round: &Round<'_>, rng: &mut StdRng) -> u64 {
    let seed = round.seed;
    let mut reads = 0;
    while Instant::now() < round.deadline || reads < 5 {
        reads += 1;
        let must_see = round.acknowledged.lock().unwrap().clone();
        let top = round.counter.load(Ordering::Relaxed);
        if rng.random_bool(0.3) {
            for _ in 0..50.min(must_see.len()) {
                // The newest keys most of the time: those on leaves still being filled.
                let newest = if rng.random_bool(0.8) {
                    must_see.len().min(300)
                } else {
                    must_see.len()
                };
                let back = rng.random_range(0..newest);
                let key = &key_of(must_see[must_see.len() - 1 - back]);
                let value = round.tree.get(key).unwrap();
                let value = value.unwrap_or_else(|| {
                    panic!("acknowledged key {key:02x?} not found (seed {seed})")
                });
                assert_value_of(key, &value, seed);
            }
            continue;
        }
        let direction = if rng.random_bool(0.5) {
            Direction::Forward
        } else {
            Direction::Backward
        };
        let (mut lower, mut upper) = (random_bound(rng, top), random_bound(rng, top));
        if let (
            Bound::Included(low) | Bound::Excluded(low),
            Bound::Included(high) | Bound::Excluded(high),
        ) = (&lower, &upper)
            && low > high
        {
            std::mem::swap(&mut lower, &mut upper);
            // Swapped bounds keep their kinds; fine either way, the check uses the same ones.
        }
        let limit = rng.random_range(1..3000);
        let mut scan = round.tree.range(
            lower.as_ref().map(Vec::as_slice),
            upper.as_ref().map(Vec::as_slice),
            direction,
        );
        let mut got: Vec<Vec<u8>> = Vec::new();
        for (key, value) in scan.by_ref() {
            assert!(
                within(&key, &lower, &upper),
                "{direction:?}: key {key:02x?} outside {lower:02x?}..{upper:02x?} (seed {seed})"
            );
            assert_value_of(&key, &value, seed);
            if let Some(last) = got.last() {
                let ordered = match direction {
                    Direction::Forward => last < &key,
                    Direction::Backward => last > &key,
                };
                assert!(
                    ordered,
                    "{direction:?}: {key:02x?} after {last:02x?} (seed {seed})"
                );
            }
            got.push(key);
            if got.len() == limit {
                break;
            }
        }
        assert!(scan.error().is_none(), "{:?}", scan.error());
        // What the scan covered: its range, up to where it stopped.
        if got.len() == limit {
            let last = Bound::Included(got[limit - 1].clone());
            match direction {
                Direction::Forward => upper = last,
                Direction::Backward => lower = last,
            }
        }
        let got: std::collections::HashSet<Vec<u8>> = got.into_iter().collect();
        let missing: Vec<[u8; 9]> = must_see
            .iter()
            .map(|&number| key_of(number))
            .filter(|key| within(key, &lower, &upper) && !got.contains(&key[..]))
            .collect();
        assert!(
            missing.is_empty(),
            "a {direction:?} scan of {lower:02x?}..{upper:02x?} missed {} acknowledged keys, e.g. \
             {:02x?} (seed {seed})",
            missing.len(),
            missing[0]
        );
    }
    reads
}

fn run(seed: u64, policy: LatchPolicy, switch_paths: bool) {
    let tree = BTree::create(
        Arc::new(BufferPool::new()),
        1,
        TreeOptions {
            latch_policy: policy,
            insert_path: InsertPath::Default,
            ..TreeOptions::default()
        },
    )
    .unwrap();
    let counter = AtomicI64::new(1);
    let acknowledged = Acknowledged::default();
    let round = Round {
        tree: &tree,
        counter: &counter,
        acknowledged: &acknowledged,
        deadline: Instant::now() + Duration::from_millis(600),
        seed,
    };
    let classic_keys = std::thread::scope(|scope| {
        let round = &round;
        let switcher = switch_paths.then(|| {
            scope.spawn(move || {
                let mut rng = StdRng::seed_from_u64(seed ^ 0x5157);
                while Instant::now() < round.deadline {
                    round.tree.set_insert_path(if rng.random_bool(0.7) {
                        InsertPath::Default
                    } else {
                        InsertPath::Classic
                    });
                    std::thread::sleep(Duration::from_micros(rng.random_range(1..3000)));
                }
                round.tree.set_insert_path(InsertPath::Default);
            })
        });
        let mut writers = Vec::new();
        for thread in 0..2u64 {
            writers.push(scope.spawn(move || {
                let mut rng = StdRng::seed_from_u64(seed ^ (thread + 1).wrapping_mul(0x9E37_79B9));
                lane_writer(round, &mut rng);
                Vec::new()
            }));
        }
        writers.push(scope.spawn(move || {
            let mut rng = StdRng::seed_from_u64(seed ^ 0x6E6);
            generated_writer(round, &mut rng);
            Vec::new()
        }));
        for thread in 0..1u8 {
            writers.push(scope.spawn(move || {
                let mut rng = StdRng::seed_from_u64(seed ^ (0xC1A5 + u64::from(thread)));
                classic_writer(round, &mut rng, thread)
            }));
        }
        let readers: Vec<_> = (0..2u64)
            .map(|reader_id| {
                scope.spawn(move || {
                    let mut rng = StdRng::seed_from_u64(seed ^ (0x8EAD + reader_id));
                    reader(round, &mut rng)
                })
            })
            .collect();
        let mut classic_keys = Vec::new();
        for writer in writers {
            classic_keys.extend(writer.join().unwrap());
        }
        if let Some(switcher) = switcher {
            switcher.join().unwrap();
        }
        let reads: Vec<u64> = readers.into_iter().map(|r| r.join().unwrap()).collect();
        println!("{policy:?}, switching {switch_paths}: reads {reads:?}");
        classic_keys
    });
    let mut expected: Vec<Vec<u8>> = acknowledged
        .into_inner()
        .unwrap()
        .into_iter()
        .map(|number| key_of(number).to_vec())
        .collect();
    expected.extend(classic_keys);
    expected.sort();
    let actual: Vec<Vec<u8>> = tree
        .range(Bound::Unbounded, Bound::Unbounded, Direction::Forward)
        .map(|(key, value)| {
            assert_value_of(&key, &value, seed);
            key
        })
        .collect();
    assert!(
        actual == expected,
        "{policy:?}: the tree differs from what was acknowledged (seed {seed})"
    );
    let check = tree
        .check_integrity()
        .unwrap_or_else(|error| panic!("{policy:?}: {error} (seed {seed})"));
    assert_eq!(check.rows, expected.len() as u64);
    println!(
        "{policy:?}, switching {switch_paths}: {} rows, {check:?}",
        expected.len()
    );
}

#[test]
fn readers_find_every_acknowledged_row_beside_lanes_batches_and_classic_writers() {
    let seed = common::seed();
    for policy in LatchPolicy::ALL {
        for switch_paths in [false, true] {
            run(seed, policy, switch_paths);
        }
    }
}
