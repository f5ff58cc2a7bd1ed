//! Freeing the leaves that deletes empty.
//!
//! A workload that deletes what it inserted (a queue: rows appended at the end of the index
//! and deleted from its start) would otherwise grow the tree by a page for every page of rows
//! it ever held. When a delete empties a leaf that is not the last one, the leaf is unlinked
//! from its siblings and its parent and given back to the pool at once (SQL Server's ghost
//! cleanup does the same in the background). An inner page whose only child goes goes with
//! it, up to the first ancestor that keeps another child. The last leaf is never freed: it
//! is where appends go, and the tail hints name it. The root is never freed either.
//!
//! The protocol keeps the latch order of every other writer, top down and, at one level, left
//! to right:
//!
//! 1. The ancestors that change are latched exclusively, from the lowest one that keeps a child
//!    after the removal (normally the leaf's parent, reached with shared coupling above it)
//!    down to the leaf's parent. While the parent is held, the leaf cannot split or be freed by
//!    anyone else (both need the parent), so it stays the parent's child.
//! 2. The leaf is latched to read its `prev` link and let go: its left sibling must be latched
//!    before it.
//! 3. The left sibling is latched (it may have been freed meanwhile, by another thread freeing
//!    it: then the attempt starts again), then the leaf again, then the right sibling. The
//!    left sibling is only tried: a freed page handed out again may be held by a thread that
//!    waits for the parent held here (see `try_free_empty_leaf`); a busy one is waited for
//!    with nothing held, and the attempt starts again. The
//!    links are checked under the latches: the left sibling's `next` and the leaf's `prev` must
//!    name each other, and the leaf must still be empty and not the last leaf; otherwise the
//!    attempt starts again (a split of the left sibling, say, put a page between them).
//! 4. The siblings are linked to each other, the child is removed from the top held page (the
//!    next child becomes the low child if it was the low child), and the leaf and the emptied
//!    inner pages are freed while they are still latched.
//!
//! Why nothing can reach a freed page any more: a descent reaches a page only through its
//! parent's link, which is gone before the parent's latch is let go; a sibling walk (a split
//! latching the next leaf) goes through the left sibling's link, which is gone too; and every
//! hint (the tail's page and parent, each sequence lane's page) is checked under the latch of
//! the page it names, latched with [`BufferPool::latch_exclusive_unless_freed`] (or its `try_`
//! form) so that a freed page is a stale hint rather than corruption. A freed page may be
//! handed out again at once, as any page of any tree, and its new holder may wait for latches
//! or the tail gate while it holds it (an appender's private leaf, a split's new pages): so a
//! thread that holds a latch or the tail gate only *tries* a page it knows from a hint or from
//! a link read earlier (the tail's page and parent, the left sibling here), and only a thread
//! that holds nothing else waits for one (a sequence lane holds only its lane's mutex, which
//! no latch holder waits for). Each hint's check holds for a reused page as it does for any page
//! (see `append.rs`), except the sequence lanes' "the leaf has not split" test, which compares
//! page ids and so also requires that no leaf of the tree was freed since (`leaves_freed`).
//!
//! A freeing that gives up (the left sibling changed or was busy at every attempt) or fails
//! (a neighbour could not be read) leaves the leaf linked and empty. Nothing deletes from an
//! empty leaf, so no later delete would have a reason to try again: the tree lists a key of the
//! leaf's range instead ([`LeftoverEmptyLeaves`], at most [`LEFTOVER_EMPTY_LEAVES_MAX`] of
//! them), the next delete in the tree retries the oldest one once its own work is done, and
//! [`BTree::free_left_empty_leaves`] retries them all (the engine calls it at every
//! checkpoint). A retry is an ordinary freeing of whatever leaf covers the key then: if that
//! leaf holds rows again, is the last leaf, or was freed already, there is nothing to do and the
//! key is dropped; if the retry gives up again, the key is listed again. The list lives in
//! memory only: a leaf still listed when the process stops stays, empty, in the data file
//! (unless the log the next open replays holds the delete that emptied it, whose replay frees
//! it), until rows go into it and a delete empties it again, or its tree is freed. The list's
//! mutex is taken with no latch held and nothing is taken under it, so it adds no latch-order
//! edge.
//!
//! Removing a child widens the range of a neighbour: the left sibling's range, under the same
//! parent, now reaches up to the removed child's upper fence; a low child's removal lowers the
//! new low child's lower fence to the parent's. Ranges only widen and no separator is made, so
//! everything the default insert path and the sequence lanes conclude from a key a page holds
//! stays true.
//!
//! [`BufferPool::latch_exclusive_unless_freed`]: crate::buffer::BufferPool::latch_exclusive_unless_freed

use std::collections::VecDeque;

use super::{BTree, BTreeError, corrupt};
use crate::buffer::ExclusiveGuard;
use crate::limits::{EMPTY_LEAF_FREE_ATTEMPTS, LEFTOVER_EMPTY_LEAVES_MAX};
use crate::page::{NO_PAGE, PageId};
use crate::sync::{self, AtomicUsize, Mutex, Ordering};

/// The emptied leaves a tree's freeing gave up on, each known by a key that lay in its range
/// when it was left, oldest first (see the module documentation).
pub(super) struct LeftoverEmptyLeaves {
    keys: Mutex<VecDeque<Vec<u8>>>,
    /// How many keys `keys` holds, stored under its lock and read without it, so that a delete
    /// takes the lock only when there is something to retry: deletes from many threads would
    /// otherwise all meet on it. A stale count only moves a retry to a later delete.
    listed: AtomicUsize,
    /// Test-only (`test-hooks` feature): how many more attempts that would free a leaf report
    /// that the links changed instead (see [`BTree::fail_next_empty_leaf_free_attempts`]). A
    /// std atomic rather than one of `sync`'s: it is a test's knob, not part of any protocol,
    /// and a loom atomic would add a step to every freeing in every loom model.
    #[cfg(feature = "test-hooks")]
    forced_failures: std::sync::atomic::AtomicUsize,
}

impl LeftoverEmptyLeaves {
    pub(super) fn new() -> LeftoverEmptyLeaves {
        LeftoverEmptyLeaves {
            keys: Mutex::new(VecDeque::new()),
            listed: AtomicUsize::new(0),
            #[cfg(feature = "test-hooks")]
            forced_failures: std::sync::atomic::AtomicUsize::new(0),
        }
    }
}

/// What freeing the leaf covering a key came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Freeing {
    /// The leaf was freed.
    Freed,
    /// There was nothing to free (see [`Attempt::Kept`]).
    NothingToFree,
    /// Every attempt found the links changed or the left sibling busy; the leaf stays.
    GaveUp,
}

/// What one attempt to free an emptied leaf came to.
enum Attempt {
    /// The leaf and this many inner pages above it were freed.
    Freed { inner_pages: u64 },
    /// There is nothing to free: the leaf covering the key holds rows again, is the last leaf
    /// or the tree's only leaf, or was freed by someone else.
    Kept,
    /// Links changed between the latches; try again.
    Again,
}

impl BTree {
    /// After a delete emptied the leaf covering `key` (and let go of every latch): frees the
    /// leaf, or lists `key` for a retry if the freeing gives up or fails. Returns whether the
    /// leaf was left. Either way the row is gone: a leaf left empty loses nothing, and a page
    /// that could not be read fails the next operation that needs it, with its own error.
    pub(super) fn free_emptied_leaf(&self, key: &[u8]) -> bool {
        match self.free_empty_leaf(key) {
            Ok(Freeing::Freed | Freeing::NothingToFree) => false,
            Ok(Freeing::GaveUp) | Err(_) => {
                self.stats.empty_leaves_left.fetch_add(1, Ordering::Relaxed);
                self.list_leftover_empty_leaf(key.to_vec());
                true
            }
        }
    }

    /// Retries freeing the oldest listed leftover empty leaf, if any: what a delete does once
    /// its own work is done, with no latch held. One per delete keeps a delete's cost bounded;
    /// a tree with leaves left sees deletes, or it would not have left them. Errors are
    /// swallowed for the reason [`BTree::free_emptied_leaf`] gives, and the key listed again.
    pub(super) fn retry_oldest_leftover_empty_leaf(&self) {
        if self.leftover_empty_leaves.listed.load(Ordering::Relaxed) == 0 {
            return;
        }
        let key = {
            let mut keys = sync::lock(&self.leftover_empty_leaves.keys);
            let key = keys.pop_front();
            self.leftover_empty_leaves
                .listed
                .store(keys.len(), Ordering::Relaxed);
            key
        };
        if let Some(key) = key {
            let _freed = self.retry_leftover_empty_leaf(key);
        }
    }

    /// Retries freeing every empty leaf a delete had to leave (see the module documentation)
    /// and returns how many were freed. A listed leaf that holds rows again, or is gone, is
    /// simply dropped from the list; one whose freeing gives up or fails again is listed
    /// again. Must be called with no latch held, as a delete is. The engine calls it for every
    /// tree at each checkpoint. An error is the first one met, after every listed leaf was
    /// tried.
    pub fn free_left_empty_leaves(&self) -> Result<usize, BTreeError> {
        if self.leftover_empty_leaves.listed.load(Ordering::Relaxed) == 0 {
            return Ok(0);
        }
        let keys = {
            let mut keys = sync::lock(&self.leftover_empty_leaves.keys);
            self.leftover_empty_leaves
                .listed
                .store(0, Ordering::Relaxed);
            std::mem::take(&mut *keys)
        };
        let mut freed = 0;
        let mut first_error = None;
        for key in keys {
            match self.retry_leftover_empty_leaf(key) {
                Ok(true) => freed += 1,
                Ok(false) => {}
                Err(error) => {
                    first_error.get_or_insert(error);
                }
            }
        }
        first_error.map_or(Ok(freed), Err)
    }

    /// How many empty leaves are listed for a retry now (see
    /// [`BTree::free_left_empty_leaves`]).
    pub fn left_empty_leaves_listed(&self) -> usize {
        sync::lock(&self.leftover_empty_leaves.keys).len()
    }

    /// Test-only (`test-hooks` feature): makes the next `attempts` attempts to free an emptied
    /// leaf that would succeed report that the links changed under them instead, as a split or
    /// a busy left sibling makes a real attempt report. Setting it to
    /// [`EMPTY_LEAF_FREE_ATTEMPTS`] makes the next freeing give up, deterministically, which
    /// real contention cannot be made to do. Behind a feature rather than `cfg(test)` because
    /// the integration tests are another crate; hidden and off by default so that no user of
    /// the crate can reach it.
    #[cfg(feature = "test-hooks")]
    #[doc(hidden)]
    pub fn fail_next_empty_leaf_free_attempts(&self, attempts: usize) {
        self.leftover_empty_leaves
            .forced_failures
            .store(attempts, std::sync::atomic::Ordering::Relaxed);
    }

    /// Whether the test hook asks this attempt to fail (see
    /// [`BTree::fail_next_empty_leaf_free_attempts`]); always `false` without the feature.
    #[inline]
    fn attempt_forced_to_fail(&self) -> bool {
        #[cfg(feature = "test-hooks")]
        {
            self.leftover_empty_leaves
                .forced_failures
                .fetch_update(
                    std::sync::atomic::Ordering::Relaxed,
                    std::sync::atomic::Ordering::Relaxed,
                    |left| left.checked_sub(1),
                )
                .is_ok()
        }
        #[cfg(not(feature = "test-hooks"))]
        {
            false
        }
    }

    /// One retry of a listed key: frees the leaf covering it if it is empty, drops the key if
    /// there is nothing to free, and lists it again if the freeing gives up or fails. Returns
    /// whether a leaf was freed.
    fn retry_leftover_empty_leaf(&self, key: Vec<u8>) -> Result<bool, BTreeError> {
        match self.free_empty_leaf(&key) {
            Ok(Freeing::Freed) => {
                self.stats
                    .empty_leaves_retried_freed
                    .fetch_add(1, Ordering::Relaxed);
                Ok(true)
            }
            Ok(Freeing::NothingToFree) => Ok(false),
            Ok(Freeing::GaveUp) => {
                self.list_leftover_empty_leaf(key);
                Ok(false)
            }
            Err(error) => {
                self.list_leftover_empty_leaf(key);
                Err(error)
            }
        }
    }

    /// Lists `key` (of a leaf left empty) for a retry, unless the list is full: then the leaf
    /// is counted as not listed and stays (see [`LEFTOVER_EMPTY_LEAVES_MAX`]). Called with no
    /// latch held.
    fn list_leftover_empty_leaf(&self, key: Vec<u8>) {
        let mut keys = sync::lock(&self.leftover_empty_leaves.keys);
        if keys.len() >= LEFTOVER_EMPTY_LEAVES_MAX {
            self.stats
                .empty_leaves_not_listed
                .fetch_add(1, Ordering::Relaxed);
            return;
        }
        keys.push_back(key);
        self.leftover_empty_leaves
            .listed
            .store(keys.len(), Ordering::Relaxed);
    }

    /// Forgets every listed key, for a tree whose pages were all freed.
    pub(super) fn forget_leftover_empty_leaves(&mut self) {
        sync::lock(&self.leftover_empty_leaves.keys).clear();
        self.leftover_empty_leaves
            .listed
            .store(0, Ordering::Relaxed);
    }

    /// Frees the leaf covering `key` if it is empty (see the module documentation), in at most
    /// [`EMPTY_LEAF_FREE_ATTEMPTS`] attempts. Giving up, or an error, loses nothing: the empty
    /// leaf stays linked, and the caller lists it for a retry.
    fn free_empty_leaf(&self, key: &[u8]) -> Result<Freeing, BTreeError> {
        for _ in 0..EMPTY_LEAF_FREE_ATTEMPTS {
            match self.try_free_empty_leaf(key)? {
                Attempt::Freed { inner_pages } => {
                    self.stats.leaves_freed.add(1);
                    self.stats
                        .inner_pages_freed
                        .add(i64::try_from(inner_pages).unwrap_or(i64::MAX));
                    return Ok(Freeing::Freed);
                }
                Attempt::Kept => return Ok(Freeing::NothingToFree),
                Attempt::Again => {}
            }
        }
        Ok(Freeing::GaveUp)
    }

    fn try_free_empty_leaf(&self, key: &[u8]) -> Result<Attempt, BTreeError> {
        let Some(mut path) = self.latch_removal_path(key)? else {
            return Ok(Attempt::Kept);
        };
        let held: Vec<PageId> = path.iter().map(ExclusiveGuard::page_id).collect();
        let parent = path
            .last()
            .expect("the removal path ends at the leaf's parent");
        let (leaf_id, _) = parent.page().child_for(key);
        let left_id = {
            let leaf = self.child_exclusive(&parent.page(), leaf_id, held.iter().copied())?;
            if !is_freeable(&leaf) {
                return Ok(Attempt::Kept);
            }
            leaf.page().prev()
        };
        let mut left = if left_id == NO_PAGE {
            None
        } else {
            if held.contains(&left_id) || left_id == leaf_id {
                return Err(corrupt(
                    leaf_id,
                    format!("its prev link names page {left_id}, which is not a leaf beside it"),
                ));
            }
            // Freed or reused since the leaf was read (another thread freed it, and perhaps
            // the pool handed it out again): then the link checks below fail, or it is gone.
            // Only tried while the parent is held: a page handed out again may be a private
            // leaf whose holder (an appender of a page-sized row) goes on down the classic
            // path through this very parent, or waits at the tail gate while the gate's holder
            // does, so waiting for it here could wait for ever. A busy page is waited for
            // with nothing held, and the attempt starts again.
            match self.pool.try_latch_exclusive_unless_freed(left_id)? {
                Some(left) if self.is_node(&left.page(), Some(0)) => Some(left),
                Some(_) => return Ok(Attempt::Again),
                None => {
                    drop(path);
                    drop(self.pool.latch_exclusive_unless_freed(left_id)?);
                    return Ok(Attempt::Again);
                }
            }
        };
        let parent = path
            .last()
            .expect("the removal path ends at the leaf's parent");
        let leaf = self.child_exclusive(&parent.page(), leaf_id, held.iter().copied())?;
        let linked = leaf.page().prev() == left_id
            && left
                .as_ref()
                .is_none_or(|left| left.page().next() == leaf_id);
        if !linked || !is_freeable(&leaf) || self.attempt_forced_to_fail() {
            return Ok(Attempt::Again);
        }
        let right_id = leaf.page().next();
        let held_leaves = [left_id, leaf_id].into_iter().filter(|&id| id != NO_PAGE);
        let mut right = self.node_exclusive(
            right_id,
            0,
            leaf_id,
            held.iter().copied().chain(held_leaves),
        )?;
        if right.page().prev() != leaf_id {
            return Err(corrupt(
                right_id,
                format!(
                    "reached by the next link of leaf {leaf_id}, its prev link names page {}",
                    right.page().prev()
                ),
            ));
        }
        // Everything is checked; from here on nothing can fail half way.
        if let Some(left) = left.as_mut() {
            left.page_mut().set_next(right_id);
        }
        right.page_mut().set_prev(left_id);
        remove_child(&mut path[0], key);
        // Counted before the pages go, under the leaf's latch: a lane that latches the page
        // after it is handed out again sees the count moved (see `lanes.rs`).
        self.leaves_freed.fetch_add(1, Ordering::Relaxed);
        // The pages the top held page no longer names: the single-child inner pages below
        // it, then the leaf. The top page stays.
        let inner_pages = (path.len() - 1) as u64;
        let mut freed = path.split_off(1);
        freed.push(leaf);
        drop(right);
        drop(left);
        drop(path);
        for page in freed {
            self.pool.free_latched(page)?;
        }
        Ok(Attempt::Freed { inner_pages })
    }

    /// Latches, exclusively, the inner pages that freeing the leaf covering `key` changes:
    /// from the lowest ancestor that keeps another child (it has a separator) down to the
    /// leaf's parent. Normally that is the parent alone, reached with shared coupling above it
    /// as a read would; if the parent has no separator (the leaf is its only child), the
    /// descent starts again with exclusive coupling from the root, letting go of the ancestors
    /// above every page that has a separator. `None` if the tree is a single leaf or the leaf
    /// is its only leaf (no ancestor has a separator).
    fn latch_removal_path(
        &self,
        key: &[u8],
    ) -> Result<Option<Vec<ExclusiveGuard<'_>>>, BTreeError> {
        let root = self.root_shared()?;
        if root.page().is_leaf() {
            return Ok(None);
        }
        if root.page().level() > 1 {
            let mut node = root;
            while node.page().level() > 2 {
                let (child, _) = node.page().child_for(key);
                node = self.child_shared(&node.page(), child)?;
            }
            let (child, _) = node.page().child_for(key);
            let parent = self.child_exclusive(&node.page(), child, [node.page_id()])?;
            if parent.page().slot_count() > 0 {
                return Ok(Some(vec![parent]));
            }
        } else {
            drop(root);
        }
        let mut path = vec![self.root_exclusive()?];
        loop {
            let top = path.last().expect("the path holds the root at least");
            if top.page().level() <= 1 {
                break;
            }
            let (child, _) = top.page().child_for(key);
            let held = path.iter().map(ExclusiveGuard::page_id);
            let child = self.child_exclusive(&top.page(), child, held)?;
            if child.page().slot_count() > 0 {
                // This page keeps another child: nothing above it changes.
                path.clear();
            }
            path.push(child);
        }
        // A root that was a leaf a moment ago may have grown since; it is a level-1 page at
        // least now, or it would not be an inner page: `root_exclusive` checks it is a node,
        // and the loop stops at level 1.
        if path[0].page().is_leaf() || path[0].page().slot_count() == 0 {
            return Ok(None);
        }
        Ok(Some(path))
    }
}

/// Whether a latched leaf can be freed: it holds no row and is not the last leaf.
fn is_freeable(leaf: &ExclusiveGuard<'_>) -> bool {
    let page = leaf.page();
    page.slot_count() == 0 && page.next() != NO_PAGE
}

/// Removes from the inner page `page`, which has a separator, the child that covers `key`. A
/// low child's removal makes the child after it the low child, and drops the separator between
/// them: that child then covers the keys from the page's own lower fence on.
fn remove_child(page: &mut ExclusiveGuard<'_>, key: &[u8]) {
    let (_, chosen) = page.page().child_for(key);
    match chosen {
        Some(index) => page.page_mut().remove(index),
        None => {
            let next_child = page.page().child(0);
            let mut page = page.page_mut();
            page.set_low_child(next_child);
            page.remove(0);
        }
    }
}
