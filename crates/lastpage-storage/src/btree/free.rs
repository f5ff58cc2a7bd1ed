//! Freeing a whole tree: the pages of a dropped table go back to the pool.

use std::collections::HashSet;

use super::BTree;
use crate::buffer::PageError;
use crate::page::{NO_PAGE, PageId};
use crate::sync::{self, Ordering};

impl BTree {
    /// Frees every page the tree owns, its nodes and its spare leaves, for the pool to hand
    /// out again ([`BufferPool::free_pages`](crate::buffer::BufferPool::free_pages)), and
    /// returns how many. This is how a dropped table's pages are reclaimed; `&mut self` shows
    /// that nobody shares this handle, and the caller guarantees that no other handle of the
    /// tree exists.
    ///
    /// Only inner pages are read: a leaf is known from its parent's link, as SQL Server
    /// deallocates a dropped table from its allocation pages without reading its data pages,
    /// so freeing a large tree reads about one page in two hundred. Each inner page must be a
    /// node of this tree at the level its parent implies, and no page may be reached twice; if
    /// one cannot be read or is not, nothing is freed and the error says which page. Once it
    /// succeeds the tree has no pages: its root is no page, so any later use of the handle fails
    /// instead of reaching a page another tree reuses, and a second call frees nothing.
    pub fn free_all_pages(&mut self) -> Result<usize, PageError> {
        if self.root == NO_PAGE {
            return Ok(0);
        }
        let mut pages: Vec<PageId> = Vec::new();
        let mut seen: HashSet<PageId> = HashSet::new();
        let mut claim = |page_id: PageId| -> Result<(), PageError> {
            if !seen.insert(page_id) {
                return Err(PageError::Corrupt {
                    page: page_id,
                    reason: format!(
                        "index {} reaches the page twice (a shared child, a cycle, or a spare \
                         leaf that is also linked), so its pages are not freed",
                        self.index_id
                    ),
                });
            }
            pages.push(page_id);
            Ok(())
        };
        // Inner pages still to read, each with the level its parent implies (`None` for the
        // root, whose level is its own).
        let mut inner: Vec<(PageId, Option<u8>)> = vec![(self.root, None)];
        while let Some((page_id, expected_level)) = inner.pop() {
            claim(page_id)?;
            let guard = self.pool.latch_shared(page_id)?;
            let page = guard.page();
            if !self.is_node(&page, expected_level) {
                return Err(PageError::Corrupt {
                    page: page_id,
                    reason: self.not_a_node(&page, expected_level),
                });
            }
            if page.is_leaf() {
                continue;
            }
            let children = std::iter::once(page.low_child())
                .chain((0..page.slot_count()).map(|index| page.child(index)));
            if page.level() == 1 {
                for leaf in children {
                    claim(leaf)?;
                }
            } else {
                inner.extend(children.map(|child| (child, Some(page.level() - 1))));
            }
        }
        for page_id in self.spare_leaves() {
            claim(page_id)?;
        }
        self.pool.free_pages(&pages)?;
        self.root = NO_PAGE;
        sync::lock(&self.spare_leaves).clear();
        // The hints go too. An append latches the hinted last leaf before it looks at the
        // root, and trusts it if it is a last leaf of this index id; a tree made later under
        // the same index id (the engine makes one for a table that is not logged, emptied
        // after a crash) may reuse that very page, and the freed handle's row would go into
        // it. With every hint at no page, any use of the handle fails on the missing page.
        self.tail_hint.store(NO_PAGE, Ordering::Relaxed);
        self.tail_parent_hint.store(NO_PAGE, Ordering::Relaxed);
        self.lanes = super::lanes::Lanes::default();
        // Their keys named leaves of the pages just freed.
        self.forget_leftover_empty_leaves();
        Ok(pages.len())
    }
}
