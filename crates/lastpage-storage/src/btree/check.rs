//! The integrity checker: walks a whole tree and verifies every structural invariant.
//!
//! It checks, for every page reached from the root: the slot array and record area are
//! self-consistent and the keys strictly ascending ([`Page::check_layout`]); the page belongs to
//! this tree; every key lies within the fences its parent gives it; children sit exactly one
//! level below their parent; no page is reached twice; and the leaves, visited in key order,
//! form a doubly linked list with both ends open. It counts rows and pages on the way. Then it
//! checks the tree's spare leaves (pages allocated for its next splits, see `append.rs`): each
//! is a formatted, empty, unlinked leaf of this tree, named once, and not in the tree.
//!
//! The check latches pages in shared mode while it reads them, so it is safe to run at any
//! time, but its verdict is exact only when no writer runs, which is how tests use it.

use std::collections::HashSet;

use super::BTree;
use crate::buffer::PageError;
use crate::page::{NO_PAGE, Page, PageId};

/// What the checker found in a healthy tree.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct TreeCheck {
    /// Rows in the leaves.
    pub rows: u64,
    /// Leaf pages.
    pub leaf_pages: u64,
    /// Inner pages.
    pub inner_pages: u64,
    /// Levels, leaves included.
    pub levels: u8,
    /// Spare leaves: allocated for the tree's next splits, not yet linked into it. With
    /// `leaf_pages` and `inner_pages`, every page the tree owns.
    pub spare_leaves: u64,
    /// Average fraction of each leaf's body used by live records and slots.
    pub leaf_fill: f64,
}

/// A broken invariant, with the page it was found on.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("index {index_id}, page {page_id}: {message}")]
pub struct IntegrityError {
    /// The tree's index id.
    pub index_id: u32,
    /// The page where the problem is.
    pub page_id: PageId,
    /// What is wrong.
    pub message: String,
}

struct Walk {
    check: TreeCheck,
    seen: HashSet<PageId>,
    previous_leaf: PageId,
    /// The `next` link of the previous leaf, remembered so that the checker never latches a
    /// page to the left of one it holds (splits latch left to right).
    previous_leaf_next: PageId,
    used_leaf_bytes: u64,
}

impl BTree {
    /// Verifies the whole tree; see the module documentation for what is checked.
    pub fn check_integrity(&self) -> Result<TreeCheck, IntegrityError> {
        let mut walk = Walk {
            check: TreeCheck::default(),
            seen: HashSet::new(),
            previous_leaf: NO_PAGE,
            previous_leaf_next: NO_PAGE,
            used_leaf_bytes: 0,
        };
        let root_level = {
            let root = self
                .pool
                .latch_shared(self.root)
                .map_err(|error| self.unreadable(self.root, &error))?;
            root.page().level()
        };
        // The count of levels is a byte, like a page's level: a root at the highest level
        // (which only a damaged tree has; writes refuse to grow a root past it) has one level
        // more than the count holds, and overflowed it.
        walk.check.levels = root_level.checked_add(1).ok_or_else(|| {
            self.error(
                self.root,
                format!("the root is at level {root_level}, higher than a tree can grow"),
            )
        })?;
        self.check_page(self.root, root_level, None, None, &mut walk)?;
        if walk.previous_leaf_next != NO_PAGE {
            return Err(self.error(
                walk.previous_leaf,
                format!(
                    "the last leaf links to page {} as next",
                    walk.previous_leaf_next
                ),
            ));
        }
        let counted = self.row_count();
        if counted != walk.check.rows {
            return Err(self.error(
                self.root,
                format!(
                    "the tree's row counter says {counted} rows but the leaves hold {}",
                    walk.check.rows
                ),
            ));
        }
        self.check_spare_leaves(&mut walk)?;
        if walk.check.leaf_pages > 0 {
            let body = (crate::limits::PAGE_BODY_BYTES as u64) * walk.check.leaf_pages;
            walk.check.leaf_fill = walk.used_leaf_bytes as f64 / body as f64;
        }
        Ok(walk.check)
    }

    /// Checks the spare leaves (after the walk, which has collected the tree's pages).
    fn check_spare_leaves(&self, walk: &mut Walk) -> Result<(), IntegrityError> {
        for page_id in self.spare_leaves() {
            if !walk.seen.insert(page_id) {
                return Err(self.error(
                    page_id,
                    "a spare leaf is also in the tree, or is named twice".into(),
                ));
            }
            let guard = self
                .pool
                .latch_shared(page_id)
                .map_err(|error| self.unreadable(page_id, &error))?;
            if let Some(problem) = self.spare_leaf_problem(page_id, &guard.page()) {
                return Err(self.error(page_id, problem));
            }
            walk.check.spare_leaves += 1;
        }
        Ok(())
    }

    /// Why `page` (page `page_id`) cannot be one of this tree's spare leaves, if it cannot: a
    /// spare is a formatted leaf of this tree with no rows and no links, and not the root (a
    /// tree of one leaf, its root, has no links either). A leaf in a tree of several leaves
    /// always has a link, since the leaf chain has only its two ends open.
    pub(super) fn spare_leaf_problem(&self, page_id: PageId, page: &Page<'_>) -> Option<String> {
        if page_id == self.root {
            return Some("the root is named as a spare leaf".into());
        }
        if page.page_id() != page_id {
            return Some(format!("header says page {}", page.page_id()));
        }
        if !self.is_node(page, Some(0)) {
            return Some(format!(
                "as a spare leaf: {}",
                self.not_a_node(page, Some(0))
            ));
        }
        if page.slot_count() != 0 || page.prev() != NO_PAGE || page.next() != NO_PAGE {
            return Some(format!(
                "a spare leaf must be empty and unlinked, but it holds {} rows, prev {}, next {}",
                page.slot_count(),
                page.prev(),
                page.next()
            ));
        }
        None
    }

    /// A page the checker could not read (an I/O error or a corrupt page in the data file).
    pub(super) fn unreadable(&self, page_id: PageId, error: &PageError) -> IntegrityError {
        self.error(page_id, format!("the page cannot be read: {error}"))
    }

    pub(super) fn error(&self, page_id: PageId, message: String) -> IntegrityError {
        IntegrityError {
            index_id: self.index_id,
            page_id,
            message,
        }
    }

    fn check_page(
        &self,
        page_id: PageId,
        expected_level: u8,
        low: Option<&[u8]>,
        high: Option<&[u8]>,
        walk: &mut Walk,
    ) -> Result<(), IntegrityError> {
        if !walk.seen.insert(page_id) {
            return Err(self.error(
                page_id,
                "page is reachable twice (a cycle or a shared child)".into(),
            ));
        }
        let guard = self
            .pool
            .latch_shared(page_id)
            .map_err(|error| self.unreadable(page_id, &error))?;
        let page = guard.page();
        page.check_layout()
            .map_err(|message| self.error(page_id, message))?;
        self.check_header(&page, page_id, expected_level)?;
        let count = page.slot_count();
        // The layout check has verified that the keys are strictly ascending.
        for index in 0..count {
            let key = page.key(index);
            if low.is_some_and(|low| key < low) || high.is_some_and(|high| key >= high) {
                return Err(self.error(
                    page_id,
                    format!(
                        "key at slot {index} lies outside the fences its parent gives this page"
                    ),
                ));
            }
        }
        if page.is_leaf() {
            walk.check.leaf_pages += 1;
            walk.check.rows += count as u64;
            walk.used_leaf_bytes +=
                (crate::limits::PAGE_BODY_BYTES - page.total_free_bytes()) as u64;
            if page.prev() != walk.previous_leaf {
                return Err(self.error(
                    page_id,
                    format!(
                        "prev link is {} but the previous leaf in key order is {}",
                        page.prev(),
                        walk.previous_leaf
                    ),
                ));
            }
            if walk.previous_leaf != NO_PAGE && walk.previous_leaf_next != page_id {
                return Err(self.error(
                    walk.previous_leaf,
                    format!(
                        "next link is {} but the next leaf in key order is {page_id}",
                        walk.previous_leaf_next
                    ),
                ));
            }
            walk.previous_leaf = page_id;
            walk.previous_leaf_next = page.next();
            return Ok(());
        }
        walk.check.inner_pages += 1;
        let child_level = expected_level - 1;
        let first_high = if count > 0 { Some(page.key(0)) } else { high };
        self.check_page(page.low_child(), child_level, low, first_high, walk)?;
        for index in 0..count {
            let child_high = if index + 1 < count {
                Some(page.key(index + 1))
            } else {
                high
            };
            self.check_page(
                page.child(index),
                child_level,
                Some(page.key(index)),
                child_high,
                walk,
            )?;
        }
        Ok(())
    }

    fn check_header(
        &self,
        page: &Page<'_>,
        page_id: PageId,
        expected_level: u8,
    ) -> Result<(), IntegrityError> {
        if page.page_id() != page_id {
            return Err(self.error(page_id, format!("header says page {}", page.page_id())));
        }
        // The same predicate every descent applies (index, kind, level, low child).
        if !self.is_node(page, Some(expected_level)) {
            return Err(self.error(page_id, self.not_a_node(page, Some(expected_level))));
        }
        Ok(())
    }
}
