//! Freed pages: a freed tree's pages go to later allocations, in memory and in the data file;
//! the image records them as free, so they stay free across a restart; a stale link to one is
//! refused; a wrong list frees nothing. Randomized tests print their seed; rerun one with
//! `LASTPAGE_SEED=<seed>`.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;

use lastpage_storage::btree::{BTree, BTreeError, InsertPath, TreeOptions};
use lastpage_storage::buffer::{BufferPool, PageError};
use lastpage_storage::latch::LatchPolicy;
use lastpage_storage::page::PageId;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use common::{faulty, open_pool as open};

type Oracle = BTreeMap<Vec<u8>, Vec<u8>>;

fn options(policy: LatchPolicy) -> TreeOptions {
    TreeOptions {
        latch_policy: policy,
        insert_path: InsertPath::Default,
        ..TreeOptions::default()
    }
}

/// Inserts `rows` rows of 200 bytes: mostly ascending keys (the default path's appends and
/// spare leaves) and some random ones (splits in the middle).
fn fill(tree: &BTree, oracle: &mut Oracle, rng: &mut StdRng, rows: u64) {
    let start = oracle.len() as u64;
    for i in start..start + rows {
        let key = if i % 5 == 0 {
            rng.random::<u64>().to_be_bytes().to_vec()
        } else {
            ((i << 24) | 0xAB).to_be_bytes().to_vec()
        };
        let value = vec![key[7] ^ key[3]; 200];
        match tree.insert(&key, &value) {
            Ok(()) => assert!(oracle.insert(key, value).is_none()),
            Err(BTreeError::DuplicateKey) => assert!(oracle.contains_key(&key)),
            Err(other) => panic!("insert failed: {other}"),
        }
    }
}

/// Every page the tree owns, as the integrity checker counts them.
fn owned_pages(tree: &BTree) -> usize {
    let check = tree.check_integrity().unwrap();
    (check.leaf_pages + check.inner_pages + check.spare_leaves) as usize
}

/// Pages allocated and not free.
fn pages_in_use(pool: &BufferPool) -> usize {
    pool.page_count() - pool.free_page_count()
}

/// The catalog a test keeps: each tree's index id, root and row count.
fn blob(trees: &[&BTree]) -> Vec<u8> {
    let mut blob = Vec::new();
    for tree in trees {
        blob.extend_from_slice(&tree.index_id().to_le_bytes());
        blob.extend_from_slice(&tree.root().to_le_bytes());
        blob.extend_from_slice(&tree.row_count().to_le_bytes());
    }
    blob
}

fn reattach(pool: &Arc<BufferPool>, blob: &[u8]) -> Vec<BTree> {
    blob.chunks_exact(16)
        .map(|entry| {
            let index_id = u32::from_le_bytes(entry[0..4].try_into().unwrap());
            let root = u32::from_le_bytes(entry[4..8].try_into().unwrap());
            let rows = u64::from_le_bytes(entry[8..16].try_into().unwrap());
            BTree::open(
                Arc::clone(pool),
                index_id,
                root,
                options(LatchPolicy::default()),
                rows,
            )
        })
        .collect()
}

fn checkpoint(pool: &BufferPool, trees: &[&BTree]) -> u32 {
    let pending = pool.checkpoint_capture().unwrap();
    pending.finish(pool, &blob(trees)).unwrap().file_slots
}

/// Inserts into `tree` until the pool has no free page left, checking after every insert that
/// no new page id was handed out while a freed one was waiting.
fn fill_until_no_page_is_free(tree: &BTree, oracle: &mut Oracle, rng: &mut StdRng, context: &str) {
    let ids = tree.pool().page_count();
    while tree.pool().free_page_count() > 0 {
        fill(tree, oracle, rng, 1);
        if tree.pool().page_count() != ids {
            panic!(
                "{context}: page id {} was handed out while {} freed pages waited",
                tree.pool().page_count(),
                tree.pool().free_page_count()
            );
        }
    }
}

#[test]
fn a_freed_tree_gives_its_pages_to_later_allocations_in_memory_and_in_the_data_file() {
    let seed = common::seed();
    for file_backed in [false, true] {
        let context = if file_backed { "file" } else { "memory" };
        let fs = faulty(seed);
        let pool = if file_backed {
            open(&fs, 48).0
        } else {
            Arc::new(BufferPool::new())
        };
        let mut rng = StdRng::seed_from_u64(seed);
        let policy = LatchPolicy::default();
        let mut dropped = BTree::create(Arc::clone(&pool), 1, options(policy)).unwrap();
        let kept = BTree::create(Arc::clone(&pool), 2, options(policy)).unwrap();
        let (mut dropped_rows, mut kept_rows) = (Oracle::new(), Oracle::new());
        fill(&dropped, &mut dropped_rows, &mut rng, 6_000);
        fill(&kept, &mut kept_rows, &mut rng, 1_000);
        if file_backed {
            checkpoint(&pool, &[&dropped, &kept]);
            // Changes after the image, some of them evicted to slots no image names.
            fill(&dropped, &mut dropped_rows, &mut rng, 2_000);
            assert!(pool.stats().evictions > 0, "{context}: the budget evicts");
        }
        let owned = owned_pages(&dropped);
        let old_root = dropped.root();
        let ids = pool.page_count();
        assert_eq!(dropped.free_all_pages().unwrap(), owned, "{context}");
        assert_eq!(pool.free_page_count(), owned, "{context}");
        assert_eq!(pool.page_count(), ids, "{context}: ids stay handed out");
        assert_eq!(pages_in_use(&pool), owned_pages(&kept), "{context}");
        assert_eq!(
            dropped.free_all_pages().unwrap(),
            0,
            "{context}: a second call"
        );
        match pool.latch_shared(old_root) {
            Err(PageError::Corrupt { page, reason }) => {
                assert_eq!(page, old_root);
                assert!(reason.contains("freed"), "{context}: {reason}");
            }
            other => panic!(
                "{context}: a latch of a freed page: {:?}",
                other.map(|_| ())
            ),
        }
        assert!(
            dropped.get(b"anything").is_err(),
            "{context}: a freed tree's handle must fail, not read"
        );
        common::assert_tree_holds(&kept, &kept_rows, context);
        fill_until_no_page_is_free(&kept, &mut kept_rows, &mut rng, context);
        assert_eq!(pool.page_count(), ids, "{context}");
        common::assert_tree_holds(&kept, &kept_rows, context);
        assert_eq!(pages_in_use(&pool), owned_pages(&kept), "{context}");
    }
}

/// Asserts that the data file holds no more slots than the pages in use, the two meta slots
/// and a few stream slots (the image's and the previous image's page map).
fn assert_no_slot_leaked(pool: &BufferPool, file_slots: u32, context: &str) {
    let bound = pool.page_count() - pool.free_page_count() + 2 + 4;
    assert!(
        file_slots as usize <= bound,
        "{context}: the data file has {file_slots} slots for {} pages in use",
        bound - 6
    );
}

#[test]
fn freed_pages_stay_free_across_a_restart_and_their_slots_are_reused() {
    let seed = common::seed();
    let fs = faulty(seed);
    let (pool, _) = open(&fs, 32);
    let mut rng = StdRng::seed_from_u64(seed);
    let policy = LatchPolicy::default();
    let kept = BTree::create(Arc::clone(&pool), 1, options(policy)).unwrap();
    let mut kept_rows = Oracle::new();
    fill(&kept, &mut kept_rows, &mut rng, 500);
    checkpoint(&pool, &[&kept]);
    // Every page of this tree is written after the image, most of them evicted to slots that
    // only the page itself uses: freeing the page must free its slot at once.
    let mut dropped = BTree::create(Arc::clone(&pool), 2, options(policy)).unwrap();
    fill(&dropped, &mut Oracle::new(), &mut rng, 8_000);
    let freed = dropped.free_all_pages().unwrap();
    let mut again = BTree::create(Arc::clone(&pool), 3, options(policy)).unwrap();
    let mut again_rows = Oracle::new();
    fill_until_no_page_is_free(&again, &mut again_rows, &mut rng, "the first refill");
    let slots = checkpoint(&pool, &[&kept, &again]);
    println!("freed {freed} pages, used them again: {slots} file slots");
    assert_no_slot_leaked(&pool, slots, "the first refill");
    common::assert_tree_holds(&again, &again_rows, "the first refill");
    // Now pages that the durable image holds: their slots are free once an image that does not
    // name them is durable, and the image records the pages as free.
    let freed = again.free_all_pages().unwrap();
    checkpoint(&pool, &[&kept]);
    drop((kept, dropped, again, pool));
    let fs = fs.crash();
    let (pool, blob) = open(&fs, 32);
    assert_eq!(
        pool.free_page_count(),
        freed,
        "the image records the freed pages"
    );
    let trees = reattach(&pool, &blob.unwrap());
    let kept = &trees[0];
    common::assert_tree_holds(kept, &kept_rows, "after the restart");
    let third = BTree::create(Arc::clone(&pool), 4, options(policy)).unwrap();
    let mut third_rows = Oracle::new();
    fill_until_no_page_is_free(&third, &mut third_rows, &mut rng, "after the restart");
    let slots = checkpoint(&pool, &[kept, &third]);
    assert_no_slot_leaked(&pool, slots, "the refill after the restart");
    common::assert_tree_holds(kept, &kept_rows, "after the second refill");
    common::assert_tree_holds(&third, &third_rows, "the tree in the freed pages");
}

#[test]
fn pages_freed_after_a_capture_stay_in_that_image_and_leave_the_next() {
    let seed = common::seed();
    let fs = faulty(seed);
    let (pool, _) = open(&fs, 64);
    let mut rng = StdRng::seed_from_u64(seed);
    let mut tree = BTree::create(Arc::clone(&pool), 1, options(LatchPolicy::default())).unwrap();
    let mut rows = Oracle::new();
    fill(&tree, &mut rows, &mut rng, 3_000);
    let owned = owned_pages(&tree);
    let pending = pool.checkpoint_capture().unwrap();
    let image = blob(&[&tree]);
    assert_eq!(tree.free_all_pages().unwrap(), owned);
    pending.finish(&pool, &image).unwrap();
    drop(pool);
    // The image was captured before the free: it holds the whole tree.
    let fs = fs.crash();
    let (pool, blob_read) = open(&fs, 64);
    assert_eq!(pool.free_page_count(), 0);
    let mut trees = reattach(&pool, &blob_read.unwrap());
    common::assert_tree_holds(&trees[0], &rows, "the image captured before the free");
    assert_eq!(trees[0].free_all_pages().unwrap(), owned);
    let pending = pool.checkpoint_capture().unwrap();
    pending.finish(&pool, &[]).unwrap();
    drop(trees);
    drop(pool);
    let (pool, _) = open(&fs.crash(), 64);
    assert_eq!(
        pool.free_page_count(),
        owned,
        "the next image records them free"
    );
}

#[test]
fn a_wrong_list_of_pages_to_free_frees_nothing() {
    let pool = Arc::new(BufferPool::new());
    let tree = BTree::create(Arc::clone(&pool), 1, options(LatchPolicy::default())).unwrap();
    let mut rows = Oracle::new();
    fill(&tree, &mut rows, &mut StdRng::seed_from_u64(7), 2_000);
    let root = tree.root();
    let never = pool.page_count() as PageId + 1;
    for (list, expected) in [
        (vec![root, never], "never allocated"),
        (vec![root, root], "named twice"),
    ] {
        let error = pool.free_pages(&list).unwrap_err();
        assert!(
            error.to_string().contains(expected),
            "{list:?}: {error} should say {expected}"
        );
        assert_eq!(pool.free_page_count(), 0, "{list:?} freed a page");
        common::assert_tree_holds(&tree, &rows, "after a refused free");
    }
    let mut other = BTree::create(Arc::clone(&pool), 2, options(LatchPolicy::default())).unwrap();
    let other_root = other.root();
    other.free_all_pages().unwrap();
    let error = pool.free_pages(&[root, other_root]).unwrap_err();
    assert!(error.to_string().contains("free already"), "{error}");
    assert_eq!(pool.free_page_count(), 1);
    common::assert_tree_holds(&tree, &rows, "after a refused free");
}

#[test]
fn a_freed_page_is_reused_only_by_an_index_of_its_latch_flavour() {
    let pool = Arc::new(BufferPool::new());
    let mut fifo = BTree::create(Arc::clone(&pool), 1, options(LatchPolicy::Fifo)).unwrap();
    let mut rows = Oracle::new();
    let mut rng = StdRng::seed_from_u64(11);
    fill(&fifo, &mut rows, &mut rng, 1_000);
    let freed = fifo.free_all_pages().unwrap();
    let ids = pool.page_count();
    let adaptive = BTree::create(Arc::clone(&pool), 2, options(LatchPolicy::Adaptive)).unwrap();
    assert_eq!(
        pool.page_count(),
        ids + 1,
        "an adaptive tree took a FIFO page"
    );
    assert_eq!(pool.free_page_count(), freed);
    let again = BTree::create(Arc::clone(&pool), 3, options(LatchPolicy::Fifo)).unwrap();
    assert_eq!(pool.page_count(), ids + 1, "a FIFO tree reuses a FIFO page");
    assert_eq!(pool.latch_policy(again.root()), LatchPolicy::Fifo);
    assert_eq!(pool.latch_policy(adaptive.root()), LatchPolicy::Adaptive);
}

#[test]
fn trees_freed_while_others_grow_on_other_threads_lose_no_row_and_no_page() {
    let seed = common::seed();
    let fs = faulty(seed);
    let (pool, _) = open(&fs, 40);
    let growers: Vec<(BTree, Oracle)> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..3u32)
            .map(|thread| {
                let pool = Arc::clone(&pool);
                scope.spawn(move || {
                    let mut rng = StdRng::seed_from_u64(seed ^ u64::from(thread));
                    let tree =
                        BTree::create(pool, 10 + thread, options(LatchPolicy::default())).unwrap();
                    let mut rows = Oracle::new();
                    for _ in 0..30 {
                        fill(&tree, &mut rows, &mut rng, 100);
                    }
                    (tree, rows)
                })
            })
            .collect();
        let pool = Arc::clone(&pool);
        scope.spawn(move || {
            let mut rng = StdRng::seed_from_u64(seed);
            for round in 0..12u32 {
                let mut tree = BTree::create(
                    Arc::clone(&pool),
                    100 + round,
                    options(LatchPolicy::default()),
                )
                .unwrap();
                let mut rows = Oracle::new();
                fill(&tree, &mut rows, &mut rng, 400 + 100 * u64::from(round % 4));
                common::assert_tree_holds(&tree, &rows, &format!("round {round}"));
                tree.free_all_pages().unwrap();
            }
        });
        handles
            .into_iter()
            .map(|handle| handle.join().unwrap())
            .collect()
    });
    let mut owned = 0;
    for (tree, rows) in &growers {
        common::assert_tree_holds(tree, rows, &format!("tree {}", tree.index_id()));
        owned += owned_pages(tree);
    }
    assert_eq!(
        pages_in_use(&pool),
        owned,
        "every page in use belongs to a tree"
    );
}

/// `free_all_pages` promises that a later use of the freed handle fails instead of reaching a
/// page another tree reuses. It set the root to no page, but the tail hint (and the lanes' and
/// the tail parent's hints) still named the freed pages, and an append goes to the hinted last
/// leaf first, checking only that it is a last leaf of the same index id. A new tree under the
/// same index id (the engine makes one for a table that is not logged, emptied after a crash)
/// that reused the page then took the stale handle's row.
#[test]
fn a_freed_handle_cannot_reach_its_old_last_leaf_through_its_hints() {
    let pool = Arc::new(BufferPool::new());
    let mut freed = BTree::create(Arc::clone(&pool), 7, options(LatchPolicy::Fifo)).unwrap();
    freed.insert(b"a", b"old").unwrap();
    assert_eq!(freed.free_all_pages().unwrap(), 1);
    // The one free page becomes the new tree's root, a last leaf of index 7.
    let reused = BTree::create(Arc::clone(&pool), 7, options(LatchPolicy::Fifo)).unwrap();
    assert_eq!(pool.free_page_count(), 0);
    reused.insert(b"b", b"new").unwrap();
    let stale = freed.insert(b"c", b"stale");
    assert!(
        stale.is_err(),
        "an insert through the freed handle went into the tree that reused its page"
    );
    assert_eq!(reused.get(b"c").unwrap(), None);
    assert_eq!(reused.get(b"b").unwrap(), Some(b"new".to_vec()));
}
