//! What the randomized integration tests share.

/// The seed of a randomized test: `LASTPAGE_SEED` if set, else a fresh one. Printed, so that a
/// failing run can be repeated.
pub fn seed() -> u64 {
    let seed = std::env::var("LASTPAGE_SEED")
        .ok()
        .and_then(|text| text.parse().ok())
        .unwrap_or_else(rand::random);
    println!("seed = {seed} (rerun with LASTPAGE_SEED={seed})");
    seed
}

/// Asserts that `tree` holds exactly `oracle`: the integrity check passes and counts its rows,
/// the tree's row counter agrees, every key is found by a lookup with its own value, and scans
/// both ways return exactly the oracle's rows in order. Not every test binary that includes
/// this module uses it, hence the `allow`.
#[allow(dead_code)]
pub fn assert_tree_holds(
    tree: &lastpage_storage::btree::BTree,
    oracle: &std::collections::BTreeMap<Vec<u8>, Vec<u8>>,
    context: &str,
) {
    use lastpage_storage::btree::Direction;
    use std::ops::Bound;
    let check = tree
        .check_integrity()
        .unwrap_or_else(|error| panic!("{context}: integrity: {error}"));
    assert_eq!(
        check.rows,
        oracle.len() as u64,
        "{context}: rows the checker counted"
    );
    assert_eq!(
        tree.row_count(),
        oracle.len() as u64,
        "{context}: the tree's row count"
    );
    for (key, value) in oracle {
        assert_eq!(
            tree.get(key).unwrap().as_ref(),
            Some(value),
            "{context}: lookup of {key:?}"
        );
    }
    for direction in [Direction::Forward, Direction::Backward] {
        let mut scan = tree.range(Bound::Unbounded, Bound::Unbounded, direction);
        let rows: Vec<(Vec<u8>, Vec<u8>)> = scan.by_ref().collect();
        assert!(
            scan.error().is_none(),
            "{context}: scan failed: {:?}",
            scan.error()
        );
        let mut expected: Vec<(Vec<u8>, Vec<u8>)> = oracle.clone().into_iter().collect();
        if direction == Direction::Backward {
            expected.reverse();
        }
        if rows != expected {
            let keys: Vec<&Vec<u8>> = rows.iter().map(|(key, _)| key).collect();
            let missing: Vec<&Vec<u8>> = oracle
                .keys()
                .filter(|key| !keys.contains(key))
                .take(5)
                .collect();
            panic!(
                "{context}: {direction:?} scan has {} rows, the oracle {}; missing e.g. {missing:?}",
                rows.len(),
                oracle.len()
            );
        }
    }
}

/// Where the file-backed pool tests keep their data file, on a fault-injecting file system.
#[allow(dead_code)]
pub const DATA_FILE: &str = "db/data.lp";

/// A fault-injecting file system seeded with `seed`, with the data file's directory made.
#[allow(dead_code)]
pub fn faulty(seed: u64) -> lastpage_io::FaultyFileSystem {
    let fs = lastpage_io::FaultyFileSystem::new(lastpage_io::FaultyConfig::new(seed));
    lastpage_io::create_dir_all_durable(&fs, std::path::Path::new("db")).unwrap();
    fs
}

/// Opens (or creates) the pool over [`DATA_FILE`] on `fs` with a budget of `budget_pages`
/// pages, and the user blob of its last image.
#[allow(dead_code)]
pub fn open_pool(
    fs: &lastpage_io::FaultyFileSystem,
    budget_pages: usize,
) -> (
    std::sync::Arc<lastpage_storage::buffer::BufferPool>,
    Option<Vec<u8>>,
) {
    let (pool, blob) = lastpage_storage::buffer::BufferPool::open_file(
        std::sync::Arc::new(fs.clone()),
        std::path::Path::new(DATA_FILE),
        lastpage_storage::buffer::PoolConfig {
            memory_budget_bytes: budget_pages * lastpage_storage::limits::PAGE_SIZE_BYTES,
            ..lastpage_storage::buffer::PoolConfig::default()
        },
    )
    .unwrap();
    (std::sync::Arc::new(pool), blob)
}

/// An empty tree with `policy` latches on `insert_path`, in a memory-only pool of its own.
#[allow(dead_code)]
pub fn tree_with(
    policy: lastpage_storage::latch::LatchPolicy,
    insert_path: lastpage_storage::btree::InsertPath,
) -> lastpage_storage::btree::BTree {
    lastpage_storage::btree::BTree::create(
        std::sync::Arc::new(lastpage_storage::buffer::BufferPool::new()),
        1,
        lastpage_storage::btree::TreeOptions {
            latch_policy: policy,
            insert_path,
            ..lastpage_storage::btree::TreeOptions::default()
        },
    )
    .unwrap()
}

/// Every latch flavour with every insert path.
#[allow(dead_code)]
pub fn configurations() -> Vec<(
    lastpage_storage::latch::LatchPolicy,
    lastpage_storage::btree::InsertPath,
)> {
    use lastpage_storage::btree::InsertPath;
    lastpage_storage::latch::LatchPolicy::ALL
        .into_iter()
        .flat_map(|policy| InsertPath::ALL.into_iter().map(move |path| (policy, path)))
        .collect()
}
