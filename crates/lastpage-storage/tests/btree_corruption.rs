//! A corrupt page that still passes every check made when a page is read from the data file
//! (its checksum and [`Page::check_layout`]) must make tree operations fail with an error, and
//! never panic or hang: a data file is input, and a database must survive bad input.
//!
//! Each round builds a three-level tree, corrupts one header field, link, child pointer or key
//! byte of one page (keeping only corruptions the layout check accepts, since anything else is
//! rejected when the page is read), then runs lookups, scans in both directions, inserts (in
//! the middle and past the end, so splits and the append path run), updates, deletes and the
//! integrity checker, each under `catch_unwind`, on a thread the test abandons as hung after a
//! timeout. Prints its seed; rerun one with `LASTPAGE_SEED=<seed>`.

mod common;

use std::ops::Bound;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::mpsc;
use std::time::Duration;

use lastpage_storage::btree::{BTree, BTreeError, Direction, InsertPath, TreeOptions};
use lastpage_storage::buffer::BufferPool;
use lastpage_storage::buffer::PageError;
use lastpage_storage::limits::{INNER_RECORD_HEADER_BYTES, LEAF_RECORD_HEADER_BYTES, SLOT_BYTES};
use lastpage_storage::page::{
    OFFSET_INDEX_ID, OFFSET_KIND, OFFSET_LEVEL, OFFSET_NEXT, OFFSET_PREV, Page, PageBytes, PageId,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Rounds per insert path; each builds a tree of a few hundred pages.
const ROUNDS: u64 = 150;

/// A round that runs longer than this is taken to be hung (a healthy round takes milliseconds).
const ROUND_TIMEOUT: Duration = Duration::from_secs(60);

/// Rows of the corrupted tree: with 154-byte keys and 600-byte values, about ten rows fit on
/// a leaf and about fifty separators on an inner page, so 6,000 rows make three levels.
const ROWS: u32 = 6_000;

const KEY_SUFFIX_BYTES: usize = 150;
const VALUE_BYTES: usize = 600;

fn key(number: u32) -> Vec<u8> {
    let mut key = number.to_be_bytes().to_vec();
    key.resize(4 + KEY_SUFFIX_BYTES, b'k');
    key
}

/// A pool holding the tree under test (index 1) and a small second tree (index 2), so that a
/// corrupt pointer can lead into another index.
fn build(insert_path: InsertPath) -> (BTree, BTree) {
    let pool = Arc::new(BufferPool::new());
    let options = TreeOptions {
        insert_path,
        ..TreeOptions::default()
    };
    let tree = BTree::create(Arc::clone(&pool), 1, options).unwrap();
    let other = BTree::create(Arc::clone(&pool), 2, options).unwrap();
    for number in 0..ROWS {
        // Every fourth key is left out, so that inserts can land inside the tree too.
        if number % 4 != 3 {
            tree.insert(&key(number * 2), &[b'v'; VALUE_BYTES]).unwrap();
        }
        if number % 200 == 0 {
            other.insert(&key(number), &[b'o'; VALUE_BYTES]).unwrap();
        }
    }
    tree.check_integrity().unwrap();
    (tree, other)
}

fn read_u16(bytes: &PageBytes, offset: usize) -> usize {
    usize::from(u16::from_le_bytes([bytes[offset], bytes[offset + 1]]))
}

fn slot_offset(bytes: &PageBytes, index: usize) -> usize {
    read_u16(bytes, bytes.len() - SLOT_BYTES * (index + 1))
}

/// What a round did to the tree.
struct Corruption {
    what: String,
    /// The keys on the corrupted page before it was corrupted: lookups, inserts and scans
    /// around them reach the page.
    probes: Vec<Vec<u8>>,
}

/// Corrupts one page of `tree` in place (an inner page half of the time: there are few of
/// them, and they steer every descent); returns what was done, or `None` if the corruption
/// drawn would not pass the layout check (and so could not come out of a data file).
fn corrupt(tree: &BTree, other: &BTree, rng: &mut StdRng) -> Option<Corruption> {
    let pool = tree.pool();
    let page_count = pool.page_count() as u32;
    let want_inner = rng.random_bool(0.5);
    let page_id: PageId = (0..1000)
        .map(|_| rng.random_range(1..=page_count))
        .find(|&page| {
            let guard = pool.latch_shared(page).unwrap();
            guard.page().index_id() == tree.index_id() && guard.page().is_leaf() != want_inner
        })
        .unwrap();
    let mut guard = pool.latch_exclusive(page_id).unwrap();
    let probes: Vec<Vec<u8>> = (0..guard.page().slot_count())
        .map(|index| guard.page().key(index).to_vec())
        .collect();
    let mut bytes: PageBytes = *guard.page().bytes();
    let slot_count = guard.page().slot_count();
    let is_leaf = guard.page().is_leaf();
    let target: u32 = match rng.random_range(0..7) {
        0 => page_id,
        1 => tree.root(),
        2 => other.root(),
        3 => page_count + rng.random_range(1..1000),
        4 => 0,
        _ => rng.random_range(1..=page_count),
    };
    let what = match rng.random_range(0..7) {
        0 if !is_leaf => {
            // A child pointer: the low child or a separator's child.
            let offset = match rng.random_range(0..=slot_count) {
                0 => OFFSET_NEXT,
                index => slot_offset(&bytes, index - 1) + 2,
            };
            bytes[offset..offset + 4].copy_from_slice(&target.to_le_bytes());
            format!("child pointer at {offset} of page {page_id} set to {target}")
        }
        1 => {
            let level = rng.random_range(0..4);
            bytes[OFFSET_LEVEL] = level;
            format!("level of page {page_id} set to {level}")
        }
        2 => {
            let kind = rng.random_range(0..3);
            bytes[OFFSET_KIND] = kind;
            format!("kind of page {page_id} set to {kind}")
        }
        3 => {
            let index_id = other.index_id();
            bytes[OFFSET_INDEX_ID..OFFSET_INDEX_ID + 4].copy_from_slice(&index_id.to_le_bytes());
            format!("index id of page {page_id} set to {index_id}")
        }
        4 if is_leaf => {
            let offset = if rng.random_bool(0.5) {
                OFFSET_NEXT
            } else {
                OFFSET_PREV
            };
            bytes[offset..offset + 4].copy_from_slice(&target.to_le_bytes());
            format!("sibling link at {offset} of page {page_id} set to {target}")
        }
        _ if slot_count > 0 => {
            // One byte of a key (a separator on an inner page): the page may stay sorted and
            // disagree with its neighbours, or stop being sorted.
            let index = rng.random_range(0..slot_count);
            let offset = slot_offset(&bytes, index);
            let header = if is_leaf {
                LEAF_RECORD_HEADER_BYTES
            } else {
                INNER_RECORD_HEADER_BYTES
            };
            let key_len = read_u16(&bytes, offset);
            if key_len == 0 {
                return None;
            }
            let byte = offset + header + rng.random_range(0..key_len.min(4));
            let value = rng.random::<u8>();
            bytes[byte] = value;
            format!("key byte at {byte} of page {page_id} (slot {index}) set to {value}")
        }
        _ => return None,
    };
    // A page whose kind byte says free is not layout-checked when read (it holds nothing), so
    // it can come out of a data file with any contents.
    let readable = bytes[OFFSET_KIND] == 0 || Page::new(&bytes).check_layout().is_ok();
    if !readable {
        return None;
    }
    guard.page_mut().copy_contents_from(&Page::new(&bytes));
    Some(Corruption { what, probes })
}

/// Runs every kind of tree operation once or more; returns the first panic's message.
fn exercise(tree: &BTree, probes: &[Vec<u8>], rng: &mut StdRng) -> Result<(), String> {
    let step = |name: &str, operation: &mut dyn FnMut()| {
        catch_unwind(AssertUnwindSafe(operation)).map_err(|panic| {
            let message = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|text| (*text).to_owned()))
                .unwrap_or_default();
            format!("{name} panicked: {message}")
        })
    };
    let end = ROWS * 2;
    // Half the keys used come from the corrupted page (a separator, or a row's key), moved a
    // little either way; the rest are random.
    let some_key = |rng: &mut StdRng| -> Vec<u8> {
        if probes.is_empty() || rng.random_bool(0.5) {
            return key(rng.random_range(0..end));
        }
        let mut probe = probes[rng.random_range(0..probes.len())].clone();
        if let Some(last) = probe.get_mut(3) {
            *last = last.wrapping_add(rng.random_range(0..3)).wrapping_sub(1);
        }
        probe
    };
    for _ in 0..20 {
        let probe = some_key(rng);
        step("get", &mut || {
            let _ = tree.get(&probe);
        })?;
    }
    for direction in [Direction::Forward, Direction::Backward] {
        step("full scan", &mut || {
            let mut scan = tree.range(Bound::Unbounded, Bound::Unbounded, direction);
            let rows = scan.by_ref().count();
            assert!(rows <= ROWS as usize * 2, "the scan returned {rows} rows");
            let _ = scan.take_error();
        })?;
        let (first, second) = (some_key(rng), some_key(rng));
        step("range scan", &mut || {
            let (low, high) = (
                first.clone().min(second.clone()),
                first.clone().max(second.clone()),
            );
            let mut scan = tree.range(Bound::Included(&low), Bound::Excluded(&high), direction);
            let rows = scan.by_ref().count();
            assert!(rows <= ROWS as usize * 2, "the scan returned {rows} rows");
        })?;
    }
    for round in 0..60 {
        let new_key = match round % 3 {
            0 => some_key(rng),
            // A key left out of the build: lands inside the tree.
            1 => key(rng.random_range(0..ROWS) * 8 + 6),
            _ => key(end + round),
        };
        step("insert", &mut || {
            let _ = tree.insert(&new_key, &[b'n'; VALUE_BYTES]);
        })?;
    }
    for _ in 0..20 {
        let probe = some_key(rng);
        step("update", &mut || {
            let _ = tree.update(&probe, &[b'u'; VALUE_BYTES * 2]);
        })?;
        let probe = some_key(rng);
        step("delete", &mut || {
            let _ = tree.delete(&probe);
        })?;
    }
    step("integrity check", &mut || {
        let _ = tree.check_integrity();
    })
}

fn corruption_never_panics_or_hangs(insert_path: InsertPath) {
    let seed = common::seed();
    let mut rng = StdRng::seed_from_u64(seed);
    let (mut tried, mut detected) = (0, 0);
    for round in 0..ROUNDS {
        let round_seed: u64 = rng.random();
        let (sender, receiver) = mpsc::channel();
        let worker = std::thread::spawn(move || {
            let mut rng = StdRng::seed_from_u64(round_seed);
            let (tree, other) = build(insert_path);
            let Some(Corruption { what, probes }) = corrupt(&tree, &other, &mut rng) else {
                let _ = sender.send((String::new(), Ok(()), true));
                return;
            };
            let _ = sender.send((what.clone(), Err("still running".to_owned()), false));
            let detected = tree.check_integrity().is_err();
            let outcome = exercise(&tree, &probes, &mut rng);
            let _ = sender.send((what, outcome, detected));
        });
        // The first message names the corruption, the second says how the round ended.
        let mut last = None;
        loop {
            match receiver.recv_timeout(ROUND_TIMEOUT) {
                Ok(message) => {
                    let finished = message.1 != Err("still running".to_owned());
                    last = Some(message);
                    if finished {
                        break;
                    }
                }
                Err(_) => panic!(
                    "seed {seed}, round {round}: hung after {:?} ({})",
                    ROUND_TIMEOUT,
                    last.map_or(String::new(), |message| message.0)
                ),
            }
        }
        worker.join().unwrap();
        let (what, outcome, caught) = last.unwrap();
        if what.is_empty() {
            continue;
        }
        tried += 1;
        detected += u32::from(caught);
        if let Err(message) = outcome {
            panic!("seed {seed}, round {round}: {what}: {message}");
        }
    }
    println!("{tried} corruptions survived, {detected} of them reported by the integrity check");
    assert!(
        tried > ROUNDS / 3,
        "too few corruptions passed the layout check"
    );
}

#[test]
fn corruption_never_panics_or_hangs_on_the_classic_path() {
    corruption_never_panics_or_hangs(InsertPath::Classic);
}

#[test]
fn corruption_never_panics_or_hangs_on_the_default_path() {
    corruption_never_panics_or_hangs(InsertPath::Default);
}

#[test]
fn a_child_link_back_to_the_root_is_reported_as_corruption() {
    for insert_path in InsertPath::ALL {
        let (tree, _other) = build(insert_path);
        let pool = tree.pool();
        {
            let mut root = pool.latch_exclusive(tree.root()).unwrap();
            assert!(
                root.page().level() >= 2,
                "the test needs an inner page below the root"
            );
            let mut bytes: PageBytes = *root.page().bytes();
            bytes[OFFSET_NEXT..OFFSET_NEXT + 4].copy_from_slice(&tree.root().to_le_bytes());
            assert_eq!(Page::new(&bytes).check_layout(), Ok(()));
            root.page_mut().copy_contents_from(&Page::new(&bytes));
        }
        let is_corrupt = |error: &BTreeError| {
            matches!(error, BTreeError::Storage(PageError::Corrupt { page, reason })
                if *page == tree.root() && reason.contains("level"))
        };
        // Key 0 lies below every separator, so every descent for it takes the low child.
        let low = key(0);
        assert!(is_corrupt(&tree.get(&low).unwrap_err()));
        assert!(is_corrupt(&tree.insert(&key(1), b"new").unwrap_err()));
        assert!(is_corrupt(&tree.delete(&low).unwrap_err()));
        let mut scan = tree.range(Bound::Unbounded, Bound::Unbounded, Direction::Forward);
        assert_eq!(scan.by_ref().count(), 0);
        assert!(is_corrupt(&scan.take_error().unwrap()));
        let integrity = tree.check_integrity().unwrap_err();
        assert_eq!(integrity.page_id, tree.root(), "{integrity}");
        // Keys above the first separator do not pass the bad link.
        assert!(tree.get(&key(ROWS)).unwrap().is_some());
    }
}

/// A tree whose root is at level 255, the highest a page's level byte holds, with every page
/// on the way down full (pages that pass every check made when a page is read: each inner
/// page's separators ascend and all name one child one level below it). An insert that splits
/// every page up to the root cannot grow the tree another level, and fails with an error: the
/// new root's level was `255 + 1`, which overflowed.
#[test]
fn a_root_at_the_highest_level_that_must_split_fails_the_insert_without_panicking() {
    use lastpage_storage::latch::LatchPolicy;
    use lastpage_storage::page::PageKind;
    let pool = Arc::new(BufferPool::new());
    let index_id = 1;
    // Each level's separators of their own (a split pushes one up to the level above, which
    // must not hold it already), all above the leaf's keys.
    let separator = |level: u8, number: u32| {
        let mut key = vec![b's', level];
        key.extend_from_slice(&number.to_be_bytes());
        key
    };
    let mut below = {
        let mut leaf = pool
            .allocate(LatchPolicy::default(), PageKind::Leaf, 0, index_id)
            .unwrap();
        let mut number = 0;
        while leaf
            .page_mut()
            .insert_leaf(number, &separator(0, number as u32), &[b'v'; 100])
            .is_ok()
        {
            number += 1;
        }
        leaf.page_id()
    };
    for level in 1..=u8::MAX {
        let mut inner = pool
            .allocate(LatchPolicy::default(), PageKind::Inner, level, index_id)
            .unwrap();
        inner.page_mut().set_low_child(below);
        let mut number = 0;
        while inner
            .page_mut()
            .insert_inner(number, &separator(level, number as u32), below)
            .is_ok()
        {
            number += 1;
        }
        assert_eq!(inner.page().check_layout(), Ok(()));
        below = inner.page_id();
    }
    let tree = BTree::open(
        Arc::clone(&pool),
        index_id,
        below,
        TreeOptions {
            insert_path: InsertPath::Classic,
            ..TreeOptions::default()
        },
        0,
    );
    // Below every key: every descent takes the low child, down to the full leaf. Refused
    // before anything changed, so a second attempt fails the same way.
    for attempt in 0..2 {
        let inserted = catch_unwind(AssertUnwindSafe(|| tree.insert(b"a", &[b'n'; 100])));
        match inserted {
            Err(_) => panic!("the insert panicked (attempt {attempt})"),
            Ok(Ok(())) => panic!("a tree grew past level 255"),
            Ok(Err(error)) => assert!(error.to_string().contains("level 255"), "{error}"),
        }
    }
    assert_eq!(tree.get(b"a").unwrap(), None);
    // The integrity checker counted the levels in a byte too.
    let checked = catch_unwind(AssertUnwindSafe(|| tree.check_integrity()));
    let error = checked
        .expect("the integrity check panicked")
        .expect_err("the integrity check passed");
    assert!(error.to_string().contains("level 255"), "{error}");
}
