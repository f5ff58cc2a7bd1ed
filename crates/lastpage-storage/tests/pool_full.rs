//! The B+tree when its pool runs out of pages (`BufferPool::with_max_pages` stands in for
//! `MAX_PAGES`, which is 128 GiB): every insert, batch, update and split that needs a page it
//! cannot get must fail with `PoolFull` and change nothing else, so that every row acknowledged
//! before is still found by a lookup, a scan in both directions and the integrity checker, and
//! writes that need no new page still work. Randomized tests print their seed; rerun one with
//! `LASTPAGE_SEED=<seed>`.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;

use lastpage_storage::btree::{BTree, BTreeError, GeneratedKeyError, InsertPath, TreeOptions};
use lastpage_storage::buffer::BufferPool;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

fn tree(max_pages: usize, insert_path: InsertPath) -> BTree {
    BTree::create(
        Arc::new(BufferPool::with_max_pages(max_pages)),
        1,
        TreeOptions {
            insert_path,
            ..TreeOptions::default()
        },
    )
    .unwrap()
}

/// Checks that the tree holds exactly `oracle` (see `common::assert_tree_holds`).
fn verify(tree: &BTree, oracle: &BTreeMap<Vec<u8>, Vec<u8>>, context: &str) {
    common::assert_tree_holds(tree, oracle, context);
}

/// A key of `len` bytes (at least 8) that sorts as `number` does. Long keys make inner pages
/// hold few separators, so that inner and root splits come after a few leaves.
fn key_of(number: u64, len: usize) -> Vec<u8> {
    let mut key = number.to_be_bytes().to_vec();
    key.resize(len.max(8), b'k');
    key
}

/// Inserts keys made by `next_key` until the pool is full, then some more, checking every
/// failure is `PoolFull` and the tree stays whole; returns the oracle.
fn fill(
    tree: &BTree,
    value_len: usize,
    mut next_key: impl FnMut() -> Vec<u8>,
    context: &str,
) -> BTreeMap<Vec<u8>, Vec<u8>> {
    let mut oracle = BTreeMap::new();
    let mut failures = 0;
    let mut attempts = 0;
    while failures < 50 && attempts < 1_000_000 {
        attempts += 1;
        let key = next_key();
        if oracle.contains_key(&key) {
            continue;
        }
        let value = vec![(attempts % 251) as u8; value_len.min(8000 - key.len())];
        match tree.insert(&key, &value) {
            Ok(()) => {
                oracle.insert(key, value);
            }
            Err(BTreeError::PoolFull(_)) => {
                failures += 1;
                // A failed insert must not have left the key behind.
                assert_eq!(
                    tree.get(&key).unwrap(),
                    None,
                    "{context}: failed key is there"
                );
            }
            Err(other) => panic!("{context}: unexpected error {other}"),
        }
    }
    assert!(failures > 0, "{context}: the pool never filled");
    verify(tree, &oracle, context);
    oracle
}

#[test]
fn inserts_at_the_page_limit_fail_cleanly() {
    let seed = common::seed();
    for path in InsertPath::ALL {
        for (key_len, value_len) in [(8, 100), (8, 4000), (8, 8000), (1200, 100), (1600, 6000)] {
            for max_pages in [2, 3, 5, 9, 40, 200] {
                for pattern in ["ascending", "descending", "random"] {
                    let context = format!(
                        "{path:?} {key_len}-byte keys {value_len}-byte {pattern} max_pages {max_pages}"
                    );
                    let tree = tree(max_pages, path);
                    let mut rng = StdRng::seed_from_u64(seed);
                    let mut counter = 1u64 << 40;
                    let mut oracle = fill(
                        &tree,
                        value_len,
                        || match pattern {
                            "ascending" => {
                                counter += 1;
                                key_of(counter, key_len)
                            }
                            "descending" => {
                                counter -= 1;
                                key_of(counter, key_len)
                            }
                            _ => key_of(rng.random_range(0..1u64 << 41), key_len),
                        },
                        &context,
                    );
                    // Deletes free room on their pages: inserts that fit there work again.
                    let keys: Vec<Vec<u8>> = oracle.keys().cloned().collect();
                    for key in keys.iter().step_by(2) {
                        assert!(tree.delete(key).unwrap().is_some(), "{context}: delete");
                        oracle.remove(key);
                    }
                    verify(&tree, &oracle, &format!("{context}, after deletes"));
                    for key in keys.iter().step_by(2) {
                        let value = vec![7u8; value_len.min(8000 - key_len)];
                        match tree.insert(key, &value) {
                            Ok(()) => {
                                oracle.insert(key.clone(), value);
                            }
                            Err(BTreeError::PoolFull(_)) => {}
                            Err(other) => panic!("{context}: reinsert: {other}"),
                        }
                    }
                    verify(&tree, &oracle, &format!("{context}, after reinserts"));
                }
            }
        }
    }
}

/// Keys the tree makes from a counter under its tail gate (IDENTITY), one row at a time, in a
/// batch, and on sequence lanes, until the pool is full.
#[test]
fn generated_keys_at_the_page_limit_fail_cleanly() {
    for path in InsertPath::ALL {
        for value_len in [100, 3000, 8000] {
            for max_pages in [2, 3, 5, 9, 40] {
                for way in ["single", "batch", "lanes"] {
                    let context = format!("{path:?} {value_len}-byte {way} max_pages {max_pages}");
                    let tree = tree(max_pages, path);
                    let mut oracle = BTreeMap::new();
                    let mut next = 0u64;
                    let mut failures = 0;
                    while failures < 20 && next < 100_000 {
                        let value = vec![(next % 251) as u8; value_len];
                        match way {
                            "single" => {
                                let made = tree.insert_with_generated_key(&value, |key| {
                                    next += 1;
                                    key.extend_from_slice(&next.to_be_bytes());
                                    Ok::<(), ()>(())
                                });
                                match made {
                                    Ok(key) => {
                                        oracle.insert(key, value);
                                    }
                                    Err(lastpage_storage::btree::GeneratedKeyError::Tree(
                                        BTreeError::PoolFull(_),
                                    )) => failures += 1,
                                    Err(other) => panic!("{context}: {other:?}"),
                                }
                            }
                            "batch" => {
                                let values: Vec<&[u8]> = vec![&value[..]; 7];
                                let (mut keys, mut ends) = (Vec::new(), Vec::new());
                                let result = tree.insert_batch_with_generated_keys(
                                    &values,
                                    |keys, ends| {
                                        for _ in 0..7 {
                                            next += 1;
                                            keys.extend_from_slice(&next.to_be_bytes());
                                            ends.push(keys.len());
                                        }
                                        Ok::<(), ()>(())
                                    },
                                    &mut keys,
                                    &mut ends,
                                );
                                let inserted = match result {
                                    Ok(()) => 7,
                                    Err((
                                        rows,
                                        lastpage_storage::btree::GeneratedKeyError::Tree(
                                            BTreeError::PoolFull(_),
                                        ),
                                    )) => {
                                        failures += 1;
                                        rows
                                    }
                                    Err((_, other)) => panic!("{context}: {other:?}"),
                                };
                                for row in 0..inserted {
                                    let key = keys
                                        [lastpage_storage::btree::batch_item_range(&ends, row)]
                                    .to_vec();
                                    oracle.insert(key, value.clone());
                                }
                                // The caller takes back the rows of a failed batch.
                                if inserted < 7 {
                                    for row in 0..inserted {
                                        let key = &keys
                                            [lastpage_storage::btree::batch_item_range(&ends, row)];
                                        assert!(tree.delete(key).unwrap().is_some());
                                        oracle.remove(key);
                                    }
                                }
                            }
                            _ => {
                                let mut key = Vec::new();
                                let made = tree.insert_with_sequence_key(
                                    &value,
                                    1,
                                    |count| {
                                        let first = next as i64 + 1;
                                        next += count;
                                        Ok::<i64, ()>(first)
                                    },
                                    |number, key| {
                                        key.extend_from_slice(&(number as u64).to_be_bytes());
                                        Ok(())
                                    },
                                    &mut key,
                                );
                                match made {
                                    Ok(_) => {
                                        oracle.insert(key, value);
                                    }
                                    Err(lastpage_storage::btree::GeneratedKeyError::Tree(
                                        BTreeError::PoolFull(_),
                                    )) => failures += 1,
                                    Err(other) => panic!("{context}: {other:?}"),
                                }
                            }
                        }
                    }
                    assert!(failures > 0, "{context}: never full");
                    verify(&tree, &oracle, &context);
                }
            }
        }
    }
}

/// Updates that grow rows split their leaves; at the page limit they fail and leave the old
/// value.
#[test]
fn growing_updates_at_the_page_limit_fail_cleanly() {
    let seed = common::seed();
    for path in InsertPath::ALL {
        for max_pages in [3, 5, 9, 40] {
            let context = format!("{path:?} max_pages {max_pages}");
            let tree = tree(max_pages, path);
            let mut rng = StdRng::seed_from_u64(seed);
            let mut oracle = BTreeMap::new();
            for number in 0..400u64 {
                let key = key_of(number * 7, 600);
                let value = vec![1u8; 20];
                match tree.insert(&key, &value) {
                    Ok(()) => {
                        oracle.insert(key, value);
                    }
                    Err(BTreeError::PoolFull(_)) => break,
                    Err(other) => panic!("{context}: {other}"),
                }
            }
            let keys: Vec<Vec<u8>> = oracle.keys().cloned().collect();
            let mut failures = 0;
            for _ in 0..2000 {
                let key = &keys[rng.random_range(0..keys.len())];
                let value = vec![2u8; rng.random_range(20..7000)];
                match tree.update(key, &value) {
                    Ok(Some(_)) => {
                        oracle.insert(key.clone(), value);
                    }
                    Err(BTreeError::PoolFull(_)) => failures += 1,
                    other => panic!("{context}: {other:?}"),
                }
            }
            assert!(failures > 0, "{context}: never full");
            verify(&tree, &oracle, &context);
            // Batches of the classic kind: each entry fails or goes in alone.
            let entries: Vec<(Vec<u8>, Vec<u8>)> = (0..300u64)
                .map(|number| (key_of(number * 7 + 3, 600), vec![3u8; 500]))
                .collect();
            let refs: Vec<(&[u8], &[u8])> = entries.iter().map(|(k, v)| (&k[..], &v[..])).collect();
            for ((key, value), result) in entries.iter().zip(tree.insert_batch(&refs)) {
                match result {
                    Ok(()) => {
                        oracle.insert(key.clone(), value.clone());
                    }
                    Err(BTreeError::PoolFull(_)) => {}
                    Err(other) => panic!("{context}: batch {other}"),
                }
            }
            verify(&tree, &oracle, &format!("{context}, after a batch"));
        }
    }
}

/// An allocation held only to `MAX_PAGES` (`past_page_limit`, an undo's) racing allocations
/// held to the configured limit, at that limit: the page ids handed out must stay distinct and
/// leave no hole. The refused allocations gave their page id back with a `fetch_sub` after the
/// `fetch_add`, which is only right when every allocator has the same limit: a refused one
/// (id `L`) and a past-the-limit one (id `L + 1`) interleaved, the refusal moved the counter
/// back to `L + 1`, the next past-the-limit allocation got `L + 1` again and panicked ('page
/// id was handed out twice'), and page `L` was never allocated.
#[test]
fn allocations_past_the_limit_racing_refused_ones_get_distinct_ids() {
    use lastpage_storage::buffer::past_page_limit;
    use lastpage_storage::latch::LatchPolicy;
    use lastpage_storage::page::PageKind;
    use std::sync::atomic::{AtomicBool, Ordering};

    const LIMIT: usize = 16;
    const PAST: usize = 5_000;
    let pool = BufferPool::with_max_pages(LIMIT);
    let allocate = |pool: &BufferPool| {
        pool.allocate(LatchPolicy::default(), PageKind::Leaf, 0, 1)
            .map(|guard| guard.page_id())
    };
    for expected in 1..=LIMIT {
        assert_eq!(allocate(&pool).unwrap() as usize, expected);
    }
    let stop = AtomicBool::new(false);
    let ids = std::thread::scope(|scope| {
        let refused = scope.spawn(|| {
            let mut refusals = 0u64;
            while !stop.load(Ordering::Relaxed) {
                if allocate(&pool).is_err() {
                    refusals += 1;
                }
            }
            refusals
        });
        let past = scope.spawn(|| {
            let mut ids = Vec::with_capacity(PAST);
            for _ in 0..PAST {
                ids.push(past_page_limit(|| allocate(&pool)).unwrap());
                std::hint::spin_loop();
            }
            ids
        });
        let ids = past.join();
        stop.store(true, Ordering::Relaxed);
        assert!(refused.join().unwrap() > 0);
        ids.unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    });
    let expected: Vec<u32> = (LIMIT as u32 + 1..=(LIMIT + PAST) as u32).collect();
    let mut sorted = ids.clone();
    sorted.sort_unstable();
    assert!(
        sorted == expected,
        "the past-the-limit page ids: {} of them, from {:?} to {:?}, distinct: {}",
        sorted.len(),
        sorted.first(),
        sorted.last(),
        sorted.windows(2).all(|pair| pair[0] < pair[1])
    );
    assert_eq!(pool.page_count(), LIMIT + PAST);
}

/// At the page limit, rows that fit on the last leaf still go in, whatever way they come:
/// a batch and a sequence lane used to ask for a spare leaf before they looked at the last
/// leaf, and refused with `PoolFull` the rows it had room for.
#[test]
fn rows_that_fit_on_the_last_leaf_go_in_at_the_page_limit() {
    const VALUE_LEN: usize = 100;
    let mut cases_without_spares = 0;
    for path in InsertPath::ALL {
        for way in ["batch", "lane", "other lane"] {
            for max_pages in [3, 5, 9, 40] {
                let context = format!("{path:?} {way} max_pages {max_pages}");
                let tree = tree(max_pages, path);
                let value = vec![7u8; VALUE_LEN];
                // Fill with ascending keys until a split is refused.
                let mut next = 0u64;
                loop {
                    next += 1;
                    match tree.insert(&key_of(next, 8), &value) {
                        Ok(()) => {}
                        Err(BTreeError::PoolFull(_)) => {
                            next -= 1;
                            break;
                        }
                        Err(other) => panic!("{context}: {other:?}"),
                    }
                    assert!(next < 100_000, "{context}: never full");
                }
                // A refused split keeps the pages it did get as spare leaves; only without
                // them does the case show what it is about (checked over all cases below).
                if tree.check_integrity().unwrap().spare_leaves == 0 {
                    cases_without_spares += 1;
                }
                // Room on the last leaf for three rows.
                for number in next - 2..=next {
                    assert!(tree.delete(&key_of(number, 8)).unwrap().is_some());
                }
                next -= 3;
                let mut oracle: BTreeMap<Vec<u8>, Vec<u8>> =
                    (1..=next).map(|n| (key_of(n, 8), value.clone())).collect();
                let mut key = Vec::new();
                let inserted: Result<Vec<Vec<u8>>, String> = match way {
                    "batch" => {
                        let values: Vec<&[u8]> = vec![&value[..]; 2];
                        let (mut keys, mut ends) = (Vec::new(), Vec::new());
                        tree.insert_batch_with_generated_keys(
                            &values,
                            |keys, ends| {
                                for _ in 0..2 {
                                    next += 1;
                                    keys.extend_from_slice(&key_of(next, 8));
                                    ends.push(keys.len());
                                }
                                Ok::<(), ()>(())
                            },
                            &mut keys,
                            &mut ends,
                        )
                        .map(|()| keys.chunks(8).map(<[u8]>::to_vec).collect())
                        .map_err(|error| format!("{error:?}"))
                    }
                    _ => {
                        // A lane that has not inserted yet starts a block; "other lane" first
                        // lets lane 0 take the last leaf, as another session would.
                        let lanes: &[usize] = if way == "lane" { &[0, 0] } else { &[0, 1] };
                        lanes
                            .iter()
                            .map(|&lane| {
                                key.clear();
                                tree.insert_with_sequence_key_on_lane(
                                    lane,
                                    &value,
                                    1,
                                    |count| {
                                        let first = next + 1;
                                        next += count;
                                        Ok::<i64, ()>(first as i64)
                                    },
                                    |number, key| {
                                        key.extend_from_slice(&key_of(number as u64, 8));
                                        Ok(())
                                    },
                                    &mut key,
                                )
                                .map(|_| key.clone())
                                .map_err(|error| format!("{error:?}"))
                            })
                            .collect()
                    }
                };
                let inserted = inserted.unwrap_or_else(|error| {
                    panic!("{context}: rows that fit on the last leaf were refused: {error}")
                });
                for key in inserted {
                    oracle.insert(key, value.clone());
                }
                verify(&tree, &oracle, &context);
            }
        }
    }
    println!("{cases_without_spares} of 48 cases reached the limit with no spare leaf");
    assert!(
        cases_without_spares >= 12,
        "only {cases_without_spares} cases reached the limit with no spare leaf"
    );
}

/// A page limit of `n` lets the pool hold exactly `n` pages, and the error says so. It held one
/// fewer (page ids stopped below the limit) while reporting "all n pages are in use".
#[test]
fn a_page_limit_counts_pages() {
    use lastpage_storage::latch::LatchPolicy;
    use lastpage_storage::page::PageKind;
    for max_pages in [1, 2, 5, 64] {
        let pool = BufferPool::with_max_pages(max_pages);
        for _ in 0..max_pages {
            pool.allocate(LatchPolicy::default(), PageKind::Leaf, 0, 1)
                .unwrap_or_else(|full| panic!("limit {max_pages}: {full}"));
        }
        assert_eq!(pool.page_count(), max_pages);
        let full = pool
            .allocate(LatchPolicy::default(), PageKind::Leaf, 0, 1)
            .map(|_| ())
            .unwrap_err();
        assert_eq!(full.max_pages, max_pages);
        assert_eq!(
            full.to_string(),
            format!("the buffer pool is full: all {max_pages} pages are in use")
        );
        // Past the limit (a rollback's undo), pages still come, up to the pool's most.
        lastpage_storage::buffer::past_page_limit(|| {
            pool.allocate(LatchPolicy::default(), PageKind::Leaf, 0, 1)
                .map(|_| ())
                .unwrap();
        });
        assert_eq!(pool.page_count(), max_pages + 1);
    }
    let most = lastpage_storage::limits::MAX_POOL_PAGES;
    assert_eq!(BufferPool::with_max_pages(usize::MAX).max_pages(), most);
}

/// At the page limit, a row large enough to need a page of its own on the default path (it is
/// copied into a private page before the tail gate) still goes in when the last leaf has room
/// for it: the private page is only a preparation, as a spare leaf is.
#[test]
fn page_sized_rows_that_fit_on_the_last_leaf_go_in_at_the_page_limit() {
    const VALUE_LEN: usize = 5_000;
    for max_pages in [3, 5, 9, 40] {
        let context = format!("max_pages {max_pages}");
        let tree = tree(max_pages, InsertPath::Default);
        let value = vec![9u8; VALUE_LEN];
        let mut next = 0u64;
        let insert = |next: &mut u64| {
            tree.insert_with_generated_key(&value, |key| {
                *next += 1;
                key.extend_from_slice(&key_of(*next, 8));
                Ok::<(), ()>(())
            })
        };
        // Fill until a row needs a page the pool cannot give.
        loop {
            match insert(&mut next) {
                Ok(_) => {}
                Err(GeneratedKeyError::Tree(BTreeError::PoolFull(_))) => break,
                Err(other) => panic!("{context}: {other:?}"),
            }
            assert!(next < 100_000, "{context}: never full");
        }
        // The refused row made no key, or made one that is not in the tree.
        let last = (1..=next)
            .rev()
            .find(|&n| tree.get(&key_of(n, 8)).unwrap().is_some())
            .unwrap();
        // Room on the last leaf for one such row again.
        assert!(tree.delete(&key_of(last, 8)).unwrap().is_some());
        let mut oracle: BTreeMap<Vec<u8>, Vec<u8>> = (1..last)
            .filter(|&n| tree.get(&key_of(n, 8)).unwrap().is_some())
            .map(|n| (key_of(n, 8), value.clone()))
            .collect();
        let key = insert(&mut next).unwrap_or_else(|error| {
            panic!("{context}: a row that fits on the last leaf was refused: {error:?}")
        });
        oracle.insert(key, value.clone());
        verify(&tree, &oracle, &context);
    }
}
