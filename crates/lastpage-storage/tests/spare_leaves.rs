//! A tree's spare leaves handed back after a reopen (`BTree::restore_spare_leaves`): each must
//! be a page the tree may link once, so a page that is already one of its spare leaves is
//! refused like any other page it already owns.

use std::sync::Arc;

use lastpage_storage::btree::{BTree, InsertPath, TreeOptions};
use lastpage_storage::buffer::BufferPool;

/// Restoring a spare leaf the tree already holds (a second call with the same list) would
/// hand one page to two splits, which link it twice.
#[test]
fn a_page_that_is_already_a_spare_leaf_is_not_restored_again() {
    let tree = BTree::create(
        Arc::new(BufferPool::new()),
        1,
        TreeOptions {
            insert_path: InsertPath::Default,
            ..TreeOptions::default()
        },
    )
    .unwrap();
    // A batch prepares a spare leaf before the tail gate and keeps it if its rows fit.
    let values: Vec<&[u8]> = vec![&[1u8; 10][..]; 2];
    let (mut keys, mut ends) = (Vec::new(), Vec::new());
    tree.insert_batch_with_generated_keys(
        &values,
        |keys, ends| {
            for number in 1u64..=2 {
                keys.extend_from_slice(&number.to_be_bytes());
                ends.push(keys.len());
            }
            Ok::<(), ()>(())
        },
        &mut keys,
        &mut ends,
    )
    .unwrap();
    let spare_leaves = tree.spare_leaves();
    assert!(!spare_leaves.is_empty(), "the batch kept no spare leaf");
    let restored = tree.restore_spare_leaves(&spare_leaves);
    assert!(
        restored.is_err(),
        "pages {spare_leaves:?}, already spare leaves, were restored again"
    );
    assert_eq!(tree.spare_leaves(), spare_leaves, "the list changed");
    let check = tree.check_integrity().unwrap();
    assert_eq!(check.spare_leaves, spare_leaves.len() as u64);
}
