//! The default insert path's fast path for appends.
//!
//! Ascending keys (IDENTITY, sequences, timestamps) all land past the last key of the last
//! leaf. The classic path finds that leaf by latch coupling from the root on every insert, so
//! every insert takes shared latches on the root and the inner pages above the hot leaf and then
//! queues for the leaf; every page split descends again and queues for the parent. The fast
//! path:
//!
//! 1. goes straight to the leaf the tree last saw at the end of the index (`tail_hint`, kept up
//!    to date by end-of-index splits), with no descent and therefore no latches above it;
//! 2. lines appenders up on the tree's *tail gate*, an unfair spin-then-park latch, before any of
//!    them touches the leaf: the leaf's own latch then sees one appender at a time and never
//!    builds a queue of them, so even a fair hand-off page latch cannot convoy. Keys that are
//!    certainly below the last leaf (by an 8-byte prefix compare) skip the gate altogether;
//! 3. checks, under the latch, that the hint is still right: the page is a leaf of this tree, it
//!    is the last leaf (`next` is none, so its key range is unbounded above), and the key sorts
//!    after its first key (a key past the last one is appended without a search; one inside
//!    the leaf is placed by a search of that leaf). Anything else (an empty leaf, a key at or
//!    below the first key) falls back to the classic path;
//! 4. if the last leaf is full, splits it SQL Server's way (a new, empty last page) without a
//!    descent either: it tries to latch the last leaf's parent (`tail_parent_hint`) — only
//!    *tries*, because it already holds the leaf and latches are otherwise taken top-down, so
//!    waiting here could deadlock with a descent — checks that the parent's last child is this
//!    leaf and that it has room for one more separator, and links the new page in. If any of
//!    that fails, it lets go and the classic path splits;
//! 5. for rows that fill a page each, with generated keys, copies the row into a private leaf
//!    before the gate (under a placeholder key) and only writes the key and links that page
//!    under it (`link_own_tail`), so the gate is not held for an 8 KB copy.
//!
//! Appenders of small rows spin only briefly at the gate before they park (`SpinBudget::BRIEF`;
//! the measurements are in `limits.rs` and `docs/insert-paths.md`).
//!
//! The checks make the hints safe to be stale: a hinted page that was freed is seen to be
//! freed under its latch (`try_latch_exclusive_unless_freed`: the gate holder only *tries* a
//! hinted page, which may have been handed out again to a thread that waits for the gate, see
//! `latch_tail`), and one handed out again is checked like any other; the last leaf is never
//! freed; a last leaf with key `k` at its end covers every key above `k`; and a level-1 page
//! whose last child is the last leaf is that leaf's parent and covers every key above its own
//! last separator. Freeing an emptied leaf only widens its neighbours' ranges (see
//! `reclaim.rs`), which keeps all of that true.

use super::{BTree, BTreeError, InsertPath, check_record_size};
use crate::buffer::ExclusiveGuard;
use crate::latch::{Latch, LatchMode, SpinBudget};
use crate::limits::{TAIL_LATCH_ROUNDS, TAIL_LATCH_SPIN_ROUNDS};
use crate::page::{NO_PAGE, PageId, PageKind, inner_entry_bytes, leaf_entry_bytes};
use crate::stats::{self, LatchClass, WaitType};
use crate::sync::{self, Ordering};

/// Rounds of retrying a busy parent. Under loom every spin is a yield to the model checker,
/// which would explore each of 64 rounds separately; two keep the same paths (success after a
/// retry, giving up) reachable at a fraction of the cost.
const TRY_ROUNDS: u32 = if cfg!(loom) { 2 } else { TAIL_LATCH_ROUNDS };

impl BTree {
    /// Inserts `key` on the last leaf if it belongs there (it sorts after the leaf's first
    /// key), splitting the last leaf without a descent if it is full. `None` means the row was
    /// not inserted here and goes down the classic path: nothing was changed, except after a
    /// split of the last leaf that left no room for a very large record (see
    /// [`BTree::split_tail`]). The caller has checked the record's size.
    pub(super) fn try_append_at_tail(
        &self,
        key: &[u8],
        value: &[u8],
    ) -> Option<Result<(), BTreeError>> {
        if key_prefix(key) < self.tail_first_key_prefix.load(Ordering::Relaxed) {
            // Certainly below the last leaf: not an append, and no reason to touch the gate.
            return None;
        }
        let own_page = needs_own_page(key.len() + value.len());
        if own_page {
            self.prepare_spare_leaf();
        }
        let _gate = self.enter_tail_gate(own_page);
        let mut leaf = match self.latch_tail() {
            Ok(leaf) => leaf,
            Err(error) => return Some(Err(error)),
        };
        if !self.is_tail(&leaf) || key <= leaf.page().key(0) {
            return None;
        }
        Some(
            self.insert_into_tail(&mut leaf, key, value)?
                .inspect(|()| self.rows.add(1)),
        )
    }

    /// Inserts a row whose key only the caller can make, and makes it under the tail gate and
    /// the last leaf's latch: `make_key` (which typically takes the next IDENTITY value and
    /// encodes it) runs while both are held, so keys from it reach the leaf in exactly the order
    /// they were made, every one lands past the last key, and no two appenders ever race to the
    /// end of the index out of order (which would split the last page in half). Returns the key.
    ///
    /// If the hinted page is no longer the last leaf, or the key that was made does not sort
    /// last, the row goes in by the classic path, still under the gate so the order holds. On
    /// the classic path the key is made first and inserted as any other.
    pub fn insert_with_generated_key<E>(
        &self,
        value: &[u8],
        mut make_key: impl FnMut(&mut Vec<u8>) -> Result<(), E>,
    ) -> Result<Vec<u8>, GeneratedKeyError<E>> {
        let mut key = Vec::with_capacity(16);
        let _admission = self.enter_insert_path();
        if self.insert_path() != InsertPath::Default {
            make_key(&mut key).map_err(GeneratedKeyError::Key)?;
            check_record_size(&key, value)?;
            self.insert_admitted(&key, value)?;
            return Ok(key);
        }
        // A row that fills a page of its own is copied into a private page before the gate,
        // under a placeholder key as long as the last generated one (keys from one generator
        // normally all have one length), so the gate holder writes only the key.
        let own_page = needs_own_page(value.len());
        let mut own = if own_page {
            let key_len = self.generated_key_len.load(Ordering::Relaxed) as usize;
            let own = self.prepare_own_leaf(key_len, value);
            if own.is_none() {
                self.prepare_spare_leaf();
            }
            own
        } else {
            None
        };
        let inserted = self.append_generated_key(value, &mut make_key, &mut own);
        if let Some(own) = own {
            // Not linked in (the row went in another way): keep the page for a later split.
            self.recycle_own_leaf(own);
        }
        inserted
    }

    /// The default path of [`BTree::insert_with_generated_key`]: under the tail gate and the
    /// last leaf's latch, makes the key and appends the row (linking `own`, if given and if the
    /// key fits its placeholder, as the new last leaf, and taking it out of the option), or hands
    /// the row to the classic path.
    fn append_generated_key<'a, E>(
        &'a self,
        value: &[u8],
        make_key: &mut impl FnMut(&mut Vec<u8>) -> Result<(), E>,
        own: &mut Option<ExclusiveGuard<'a>>,
    ) -> Result<Vec<u8>, GeneratedKeyError<E>> {
        let mut key = Vec::with_capacity(16);
        // The gate is held until the row is in, whichever way it goes in, so generated keys
        // reach the tree in the order they were made.
        let _gate = self.enter_tail_gate(needs_own_page(value.len()));
        let mut leaf = self.latch_tail()?;
        make_key(&mut key).map_err(GeneratedKeyError::Key)?;
        check_record_size(&key, value)?;
        self.note_generated_key_len(key.len());
        if self.is_last_leaf(&leaf) {
            let page = leaf.page();
            let count = page.slot_count();
            if count == 0 || key.as_slice() > page.key(count - 1) {
                if let Some(own_leaf) = own.as_mut()
                    && count > 0
                    && own_leaf.page().key(0).len() == key.len()
                    && page.total_free_bytes() < leaf_entry_bytes(key.len(), value.len())
                    && self.link_own_tail(&mut leaf, own_leaf, &key)?
                {
                    self.rows.add(1);
                    // Released before the gate: the next appender's first latch is this page.
                    drop(own.take());
                    return Ok(key);
                }
                self.append_on_last_leaf(leaf, &key, value)?;
                return Ok(key);
            }
        }
        drop(leaf);
        self.insert_classic(&key, value)?;
        Ok(key)
    }

    /// Inserts a batch of rows whose keys only the caller can make, all of them under one hold
    /// of the tail gate: `make_keys(keys, ends)` runs once, under the gate and the last leaf's
    /// latch, and appends the batch's keys to `keys` one after another, `ends[i]` being where
    /// row `i`'s key ends (it typically reserves the batch's IDENTITY values as one block and
    /// locks their range). The rows then go on the last leaf in order, page after page, with
    /// one latch per page and no descent: the batch's keys reach the tree in the order they
    /// were made, after every key already there, so concurrent batches append one after
    /// another instead of landing out of order at the end of the index (which splits pages in
    /// the middle and leaves them about three quarters full). `keys` and `ends` are cleared
    /// first and hold the keys afterwards.
    ///
    /// The keys must ascend. A key that does not sort last, or a split that cannot be done at
    /// the tail, sends that row down the classic path, still under the gate so the order
    /// holds. Not on the default path, the keys are made first and the rows go in one by one
    /// by the classic path (callers that want the batching remedy there use
    /// [`BTree::insert_batch`] with keys of their own).
    ///
    /// Every row's size is checked before the first goes in, so a row that is too large fails
    /// the batch with nothing inserted. On any other failure returns how many rows went in
    /// (the first ones, in order) with the error; the caller removes them.
    pub fn insert_batch_with_generated_keys<E>(
        &self,
        values: &[&[u8]],
        make_keys: impl FnOnce(&mut Vec<u8>, &mut Vec<usize>) -> Result<(), E>,
        keys: &mut Vec<u8>,
        ends: &mut Vec<usize>,
    ) -> Result<(), (usize, GeneratedKeyError<E>)> {
        keys.clear();
        ends.clear();
        let _admission = self.enter_insert_path();
        if self.insert_path() != InsertPath::Default {
            make_keys(keys, ends).map_err(|error| (0, GeneratedKeyError::Key(error)))?;
            check_batch_keys(values, keys, ends).map_err(|error| (0, error.into()))?;
            for (row, value) in values.iter().enumerate() {
                self.insert_classic(&keys[batch_item_range(ends, row)], value)
                    .map_err(|error| (row, error.into()))?;
            }
            return Ok(());
        }
        // A new leaf for the first split, allocated before the gate (later ones, for a batch
        // that spans several pages, are allocated under it).
        self.prepare_spare_leaf();
        let _gate = self.enter_tail_gate(false);
        let mut leaf = self.latch_tail().map_err(|error| (0, error.into()))?;
        make_keys(keys, ends).map_err(|error| (0, GeneratedKeyError::Key(error)))?;
        check_batch_keys(values, keys, ends).map_err(|error| (0, error.into()))?;
        if let Some(&first_key_len) = ends.first() {
            self.note_generated_key_len(first_key_len);
        }
        for (row, value) in values.iter().enumerate() {
            let key = &keys[batch_item_range(ends, row)];
            let page = leaf.page();
            let count = page.slot_count();
            if self.is_last_leaf(&leaf)
                && (count == 0 || key > page.key(count - 1))
                && let Some(result) = self.try_append_on_last_leaf(&mut leaf, key, value)
            {
                result.map_err(|error| (row, error.into()))?;
                self.rows.add(1);
                if !self.is_last_leaf(&leaf) {
                    // The leaf split: the rows that follow go on the new last leaf.
                    drop(leaf);
                    leaf = self.latch_tail().map_err(|error| (row + 1, error.into()))?;
                }
                continue;
            }
            drop(leaf);
            self.insert_classic(key, value)
                .map_err(|error| (row, error.into()))?;
            leaf = self.latch_tail().map_err(|error| (row + 1, error.into()))?;
        }
        Ok(())
    }

    /// Inserts `key`, which sorts after every key of the latched last leaf `leaf` (or `leaf`
    /// is empty), on the last leaf, splitting it without a descent if it is full; if that
    /// cannot be done here, by the classic path. Returns whether the row went on the last leaf.
    pub(super) fn append_on_last_leaf<'a>(
        &'a self,
        mut leaf: ExclusiveGuard<'a>,
        key: &[u8],
        value: &[u8],
    ) -> Result<bool, BTreeError> {
        if let Some(result) = self.try_append_on_last_leaf(&mut leaf, key, value) {
            result?;
            self.rows.add(1);
            return Ok(true);
        }
        drop(leaf);
        self.insert_classic(key, value)?;
        Ok(false)
    }

    /// The part of [`BTree::append_on_last_leaf`] done on the latched leaf: `key` goes on the
    /// empty root leaf, or past the last key of the last leaf, splitting it at its end if it
    /// is full. `None` if that cannot be done here (nothing was changed, except as
    /// [`BTree::split_tail`] says); the caller counts the row.
    pub(super) fn try_append_on_last_leaf<'a>(
        &'a self,
        leaf: &mut ExclusiveGuard<'a>,
        key: &[u8],
        value: &[u8],
    ) -> Option<Result<(), BTreeError>> {
        if leaf.page().slot_count() == 0 {
            // Only the root leaf covers every key. A last leaf that deletes emptied still
            // covers only keys from its parent's separator on, and a key made below that (a
            // caller's generated key need not ascend) would be stored where no descent finds
            // it: the classic path puts it where it belongs, or finds its duplicate.
            if leaf.page_id() != self.root {
                return None;
            }
            leaf.page_mut().insert_leaf(0, key, value).ok().map(Ok)
        } else {
            self.insert_into_tail(leaf, key, value)
        }
    }

    /// Remembers the length of a generated key. Written only when it changes: every appender
    /// reads it before the tail gate, and a store on every append would pull its cache line
    /// away from all of them each time.
    pub(super) fn note_generated_key_len(&self, len: usize) {
        let len = u32::try_from(len).unwrap_or(0);
        if self.generated_key_len.load(Ordering::Relaxed) != len {
            self.generated_key_len.store(len, Ordering::Relaxed);
        }
    }

    /// Serialises the default path's appenders on the tree's tail gate (an unfair,
    /// spin-then-park latch) before any of them touches the last leaf, so the leaf's own latch
    /// sees at most one appender and never builds a queue of them: even when the pages use the
    /// fair hand-off latch, appenders do not convoy. Waits on the gate are PAGELATCH_EX waits
    /// (the gate guards the last page).
    ///
    /// `own_page_rows` says whether the caller's row fills a page of its own. Appenders of
    /// smaller rows hold the gate for a few hundred nanoseconds and spin only briefly before
    /// they park; appenders of page-sized rows, which hold it longer, spin the standard time
    /// (see `BRIEF_SPIN_ROUNDS` for the measurements).
    pub(super) fn enter_tail_gate(&self, own_page_rows: bool) -> TailGateGuard<'_> {
        let spin = if own_page_rows {
            SpinBudget::STANDARD
        } else {
            SpinBudget::BRIEF
        };
        self.tail_gate.acquire_spinning(LatchMode::Exclusive, spin);
        TailGateGuard {
            gate: &self.tail_gate,
        }
    }

    /// Remembers `page` as the last leaf, whose first key is `first_key`.
    pub(super) fn set_tail(&self, page: PageId, first_key: &[u8]) {
        self.tail_hint.store(page, Ordering::Relaxed);
        self.tail_first_key_prefix
            .store(key_prefix(first_key), Ordering::Relaxed);
    }

    /// Whether a latched page is still this tree's non-empty last leaf.
    fn is_tail(&self, leaf: &ExclusiveGuard<'_>) -> bool {
        self.is_last_leaf(leaf) && leaf.page().slot_count() > 0
    }

    /// Whether a latched page is still this tree's last leaf (possibly empty).
    pub(super) fn is_last_leaf(&self, leaf: &ExclusiveGuard<'_>) -> bool {
        let page = leaf.page();
        page.is_leaf() && page.index_id() == self.index_id && page.next() == NO_PAGE
    }

    /// Inserts into the latched last leaf a key that sorts after its first key, splitting the
    /// leaf without a descent if it is full. `None` means the row was not inserted here: the
    /// split could not be done (nothing changed), or, as [`BTree::split_tail`] says, it was
    /// done and the row still did not fit.
    pub(super) fn insert_into_tail<'a>(
        &'a self,
        leaf: &mut ExclusiveGuard<'a>,
        key: &[u8],
        value: &[u8],
    ) -> Option<Result<(), BTreeError>> {
        let page = leaf.page();
        let count = page.slot_count();
        // An append (the common case) needs no search: the key is past the last one.
        let position = if count > 0 && key > page.key(count - 1) {
            count
        } else {
            match page.search(key) {
                Ok(_) => return Some(Err(BTreeError::DuplicateKey)),
                Err(position) => position,
            }
        };
        if leaf.page_mut().insert_leaf(position, key, value).is_ok() {
            return Some(Ok(()));
        }
        self.split_tail(leaf, position, key, value)
    }

    /// Splits the full last leaf at `position` (where `key` goes): the records from there on
    /// move to a new last leaf, and `key` goes on whichever side keeps order. For an append
    /// (`position` at the end) nothing moves and the new page starts with `key` alone: SQL
    /// Server's end-of-index split, which leaves the old page full. The last leaf's parent is
    /// only *tried*; `None` means it could not be latched at once or had no room (nothing was
    /// changed), or that after the split a very large record fits on neither side (the split
    /// stays, a valid split on its own, and only the row is left to the classic path).
    fn split_tail<'a>(
        &'a self,
        leaf: &mut ExclusiveGuard<'a>,
        insert_position: usize,
        key: &[u8],
        value: &[u8],
    ) -> Option<Result<(), BTreeError>> {
        if insert_position == 0 {
            return None;
        }
        let leaf_count = leaf.page().slot_count();
        // An append moves nothing; an insert that lands just before the end leaves the left
        // page some room for stragglers (see `ascending_split_point`).
        let position = if insert_position == leaf_count {
            leaf_count
        } else {
            super::write::ascending_split_point(leaf_count, insert_position)
        };
        // The separator is the first key of the new page.
        let separator = if position < leaf_count {
            leaf.page().key(position).to_vec()
        } else {
            key.to_vec()
        };
        let mut parent = match self.try_latch_tail_parent(leaf, &separator)? {
            Ok(parent) => parent,
            Err(error) => return Some(Err(error)),
        };
        let mut right = match self.take_spare_leaf() {
            Ok(right) => right,
            Err(error) => return Some(Err(error)),
        };
        {
            let leaf_page = leaf.page();
            let mut right_page = right.page_mut();
            for (target, moved) in (position..leaf_count).enumerate() {
                right_page
                    .insert_leaf(target, leaf_page.key(moved), leaf_page.value(moved))
                    .expect("records from one page fit on an empty page");
            }
        }
        leaf.page_mut().truncate(position);
        self.link_new_tail(leaf, &mut parent, &mut right, &separator);
        if position == leaf_count {
            self.stats.leaf_appends.add(1);
        } else {
            self.stats.leaf_splits.add(1);
        }
        // The new key goes left if it sorts before the separator, else at the start of the
        // new page. Either side may still be too full for a very large record; then the whole
        // insert is handed to the classic path, which splits again (the split already done
        // stays: it is a valid split on its own).
        let target = if key < separator.as_slice() {
            leaf
        } else {
            &mut right
        };
        let target_position = target.page().search(key).unwrap_or_else(|p| p);
        match target.page_mut().insert_leaf(target_position, key, value) {
            Ok(()) => Some(Ok(())),
            Err(_) => None,
        }
    }

    /// Tries (never waits: the caller holds the last leaf, below it) to latch the last leaf's
    /// parent for linking a new last leaf whose separator is `separator`. `None` if the cached
    /// parent is busy, is no longer the last leaf's parent, or has no room for the separator.
    pub(super) fn try_latch_tail_parent<'a>(
        &'a self,
        leaf: &ExclusiveGuard<'a>,
        separator: &[u8],
    ) -> Option<Result<ExclusiveGuard<'a>, BTreeError>> {
        let parent_id = self.tail_parent_hint.load(Ordering::Relaxed);
        if parent_id == NO_PAGE {
            return None;
        }
        let parent = match self.try_latch_eagerly(parent_id) {
            Ok(parent) => parent?,
            Err(error) => return Some(Err(error)),
        };
        let page = parent.page();
        // The hint is checked as a node first: its records are read only once it is known to
        // be an inner page of this tree.
        if !self.is_node(&page, Some(1)) {
            return None;
        }
        let count = page.slot_count();
        let last_child = if count == 0 {
            page.low_child()
        } else {
            page.child(count - 1)
        };
        if last_child != leaf.page_id()
            || page.total_free_bytes() < inner_entry_bytes(separator.len())
        {
            return None;
        }
        Some(Ok(parent))
    }

    /// Links `right` (latched, unreachable until now) in after the last leaf `leaf` as the new
    /// last leaf, under `parent` (from [`BTree::try_latch_tail_parent`]) with `separator`.
    pub(super) fn link_new_tail(
        &self,
        leaf: &mut ExclusiveGuard<'_>,
        parent: &mut ExclusiveGuard<'_>,
        right: &mut ExclusiveGuard<'_>,
        separator: &[u8],
    ) {
        let right_id = right.page_id();
        right.page_mut().set_prev(leaf.page_id());
        leaf.page_mut().set_next(right_id);
        let count = parent.page().slot_count();
        parent
            .page_mut()
            .insert_inner(count, separator, right_id)
            .expect("the free space was checked when the parent was latched");
        self.set_tail(right_id, separator);
        super::write::LAST_INSERT_SPLIT.set(true);
    }

    /// Appends a row that fills a page of its own by linking `own`, a private page the caller
    /// already copied the row into under a placeholder key as long as `key`, as the new last
    /// leaf: the copy of the row's bytes happened before the tail gate, and only the key (a
    /// few bytes) is written under it. `leaf` is the latched last leaf, and `key` sorts after
    /// its last key. `false` means the parent could not take the new page and nothing changed.
    fn link_own_tail<'a>(
        &'a self,
        leaf: &mut ExclusiveGuard<'a>,
        own: &mut ExclusiveGuard<'a>,
        key: &[u8],
    ) -> Result<bool, BTreeError> {
        let mut parent = match self.try_latch_tail_parent(leaf, key) {
            None => return Ok(false),
            Some(parent) => parent?,
        };
        own.page_mut().overwrite_key(0, key);
        self.link_new_tail(leaf, &mut parent, own, key);
        self.stats.leaf_appends.add(1);
        Ok(true)
    }

    /// A private leaf holding one record, `value` under a placeholder key `key_len` bytes long,
    /// for [`BTree::link_own_tail`]; `None` if no key length is known yet, the record does not
    /// fit, or the pool is at its page limit. Like a spare leaf, only a preparation: a full
    /// pool must not refuse a row that fits on the last leaf (the row then goes in the
    /// ordinary way, and a split that needs a page fails under the gate with nothing changed).
    fn prepare_own_leaf(&self, key_len: usize, value: &[u8]) -> Option<ExclusiveGuard<'_>> {
        const PLACEHOLDER: [u8; crate::limits::MAX_KEY_BYTES] = [0; crate::limits::MAX_KEY_BYTES];
        if key_len == 0 || key_len > PLACEHOLDER.len() {
            return None;
        }
        // A spare leaf first (a formatted, empty leaf; one that cannot be read stays a spare
        // and the row goes the ordinary way): an own leaf that is not needed (the row fits on
        // the last leaf, as every row does once deletes have emptied it) goes back to the spare
        // leaves, and allocating afresh every time grew them by a page per such row, for ever
        // (a queue of page-sized rows that drains filled a database to its page limit with
        // spares).
        let mut own = self.take_spare_leaf().ok()?;
        if own
            .page_mut()
            .insert_leaf(0, &PLACEHOLDER[..key_len], value)
            .is_err()
        {
            self.recycle_own_leaf(own);
            return None;
        }
        Some(own)
    }

    /// Returns an unused private leaf from [`BTree::prepare_own_leaf`], emptied, to the spare
    /// leaves: it was allocated, so it must end up in the tree.
    fn recycle_own_leaf(&self, mut own: ExclusiveGuard<'_>) {
        let page_id = own.page_id();
        own.page_mut()
            .format(page_id, PageKind::Leaf, 0, self.index_id);
        drop(own);
        sync::lock(&self.spare_leaves).push(page_id);
    }

    /// Makes sure a formatted, unlinked leaf is waiting for the next split of the last leaf,
    /// so that the gate holder does not allocate (zero 8 KiB and take the page faults of fresh
    /// memory) while everyone else waits at the gate. Called before the gate by appenders that
    /// may split the last leaf under it: rows large enough that each starts a new page,
    /// batches, and sequence lanes starting a block.
    ///
    /// Only a preparation: at the page limit it prepares nothing, and the split that needs a
    /// page, if one does, fails under the gate with nothing changed. Refusing the statement
    /// here refused rows that fit on the last leaf, so a full database turned away the last
    /// rows its last leaf had room for.
    pub(super) fn prepare_spare_leaf(&self) {
        if !sync::lock(&self.spare_leaves).is_empty() {
            return;
        }
        if let Ok(page) = self
            .pool
            .allocate(self.latch_policy, PageKind::Leaf, 0, self.index_id)
        {
            let page = page.page_id();
            sync::lock(&self.spare_leaves).push(page);
        }
    }

    /// The tree's spare leaves as of now: a checkpoint stores them with the tree's root, so
    /// that a reopened tree uses them (see [`BTree::restore_spare_leaves`]). Exact only while
    /// no writer runs, which is when a checkpoint reads it.
    pub fn spare_leaves(&self) -> Vec<PageId> {
        sync::lock(&self.spare_leaves).clone()
    }

    /// Gives a reopened tree back the spare leaves it had when its checkpoint image was
    /// captured. A spare is neither linked nor free, so one not handed back stayed allocated,
    /// and unreachable, for ever: a page lost to every tree at every close and every crash.
    /// Each page is read and checked first (it must be a formatted, empty, unlinked leaf of
    /// this tree, and not its root): a page named by mistake could be one the tree already
    /// links, and a split that took it would link it twice. A page that is already one of the
    /// tree's spare leaves is refused for the same reason. Call it before the tree is shared.
    pub fn restore_spare_leaves(&self, pages: &[PageId]) -> Result<(), super::IntegrityError> {
        let mut named: std::collections::HashSet<PageId> =
            sync::lock(&self.spare_leaves).iter().copied().collect();
        for &page_id in pages {
            let problem = if page_id == NO_PAGE || page_id as usize > self.pool.page_count() {
                Some(format!(
                    "a spare leaf must be one of the {} pages of the data file",
                    self.pool.page_count()
                ))
            } else if !named.insert(page_id) {
                Some("the page is named twice as a spare leaf, or is one already".into())
            } else {
                let guard = self.pool.latch_shared(page_id).map_err(|error| {
                    self.error(
                        page_id,
                        format!("a spare leaf cannot be read (or was freed): {error}"),
                    )
                })?;
                self.spare_leaf_problem(page_id, &guard.page())
            };
            if let Some(problem) = problem {
                return Err(self.error(page_id, problem));
            }
        }
        sync::lock(&self.spare_leaves).extend_from_slice(pages);
        Ok(())
    }

    /// A new leaf for a split of the last leaf, or for a page-sized row's private leaf: a
    /// prepared spare if there is one, else a fresh allocation. The page is unreachable until
    /// linked, so its latch is free.
    pub(super) fn take_spare_leaf(&self) -> Result<ExclusiveGuard<'_>, BTreeError> {
        let spare = sync::lock(&self.spare_leaves).pop();
        match spare {
            // A spare may have been evicted while it waited; latching reads it back. If that
            // read fails, the page stays a spare: dropped here, it would belong to no tree.
            Some(page) => self.pool.latch_exclusive(page).map_err(|error| {
                sync::lock(&self.spare_leaves).push(page);
                error.into()
            }),
            None => Ok(self
                .pool
                .allocate(self.latch_policy, PageKind::Leaf, 0, self.index_id)?),
        }
    }

    /// Latches the last leaf for the gate holder: the page the tail hint names, normally. Other
    /// appenders are held at the gate, so the latch is normally free; a reader or a classic
    /// writer may hold it briefly.
    ///
    /// If the hint names a page that is not the last leaf (a reopened tree's hint is its root,
    /// and a split in the middle of the last leaf moves the tail without an append), the hint
    /// is found again by a descent along the right edge, and that leaf is latched: otherwise
    /// every append would go down the classic path until an append split fixed the hint, and
    /// a sequence lane would start a new block (skipping the rest of its last one) for every
    /// row meanwhile. The caller still checks what it got (a classic split may move the tail
    /// again at any time).
    ///
    /// The hinted page is only *tried* (for a few rounds), never waited for: the hint may name
    /// a page that was freed (deletes emptied it once a split made it a middle leaf) and handed
    /// out again, perhaps as a private leaf that an appender of a page-sized row filled before
    /// the gate (`prepare_own_leaf`) and holds while it waits for the gate this thread holds;
    /// or it is this thread's own private leaf. Waiting for that latch would never end. The
    /// descent waits only for pages reached through a link of a page it holds, which no
    /// private leaf is.
    pub(super) fn latch_tail(&self) -> Result<ExclusiveGuard<'_>, BTreeError> {
        let hint = self.tail_hint.load(Ordering::Relaxed);
        if let Some(leaf) = self.try_latch_eagerly(hint)? {
            if self.is_last_leaf(&leaf) {
                return Ok(leaf);
            }
            // Latches are taken top down: the stale page goes before the descent.
            drop(leaf);
        }
        let leaf = self.last_leaf_exclusive()?;
        {
            let page = leaf.page();
            let first_key = if page.slot_count() > 0 {
                page.key(0)
            } else {
                &[]
            };
            self.set_tail(leaf.page_id(), first_key);
        }
        Ok(leaf)
    }

    /// Latches the last leaf exclusively by a descent along the right edge: shared latches
    /// down to its parent, then the leaf (the root exclusively while it is a leaf), as
    /// [`BTree::leaf_exclusive`] does. Under the parent's latch the leaf cannot split, so the
    /// page latched is the last leaf, and stays it while it is held.
    fn last_leaf_exclusive(&self) -> Result<ExclusiveGuard<'_>, BTreeError> {
        self.leaf_exclusive_choosing(|page| match page.slot_count() {
            0 => page.low_child(),
            count => page.child(count - 1),
        })
    }

    /// Tries to latch `page` exclusively for `TAIL_LATCH_ROUNDS` rounds of spinning and then
    /// yielding, never queueing (the caller holds a page below it, so it must not wait). The
    /// retries count as one PAGELATCH_EX wait. `page` is a hint, so a page that was freed is
    /// `None` too, as a busy one is (after the rounds: a freed parent is rare, see
    /// `reclaim.rs`).
    fn try_latch_eagerly(&self, page: PageId) -> Result<Option<ExclusiveGuard<'_>>, BTreeError> {
        if let Some(guard) = self.pool.try_latch_exclusive_unless_freed(page)? {
            return Ok(Some(guard));
        }
        let wait = stats::begin_wait(WaitType::PageLatchEx, Some(LatchClass::Buffer));
        for round in 0..TRY_ROUNDS {
            if round < TAIL_LATCH_SPIN_ROUNDS {
                for _ in 0..(1u32 << round.min(6)) {
                    sync::spin_loop_hint();
                }
            } else {
                sync::yield_now();
            }
            match self.pool.try_latch_exclusive_unless_freed(page) {
                Ok(None) => {}
                found => {
                    wait.end(None);
                    return Ok(found?);
                }
            }
        }
        wait.end(None);
        Ok(None)
    }
}

/// Why [`BTree::insert_with_generated_key`] failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GeneratedKeyError<E> {
    /// The key maker failed (an identity overflow, say).
    Key(E),
    /// The tree refused the row.
    Tree(BTreeError),
}

impl<E> From<BTreeError> for GeneratedKeyError<E> {
    fn from(error: BTreeError) -> Self {
        GeneratedKeyError::Tree(error)
    }
}

/// Where item `item` lies in a buffer of items laid end to end, item `i` ending at `ends[i]`:
/// a batch's keys (see [`BTree::insert_batch_with_generated_keys`]), or its encoded rows.
pub fn batch_item_range(ends: &[usize], item: usize) -> std::ops::Range<usize> {
    (if item == 0 { 0 } else { ends[item - 1] })..ends[item]
}

/// Checks the keys a batch's key maker made: one end per row, the ends in order and within
/// `keys`, each row small enough for a page.
fn check_batch_keys(values: &[&[u8]], keys: &[u8], ends: &[usize]) -> Result<(), BTreeError> {
    let misshapen = ends.len() != values.len()
        || ends.windows(2).any(|pair| pair[0] > pair[1])
        || ends.last().is_some_and(|&end| end > keys.len());
    if misshapen {
        return Err(BTreeError::InvalidBatch(format!(
            "the key maker made {} key ends over {} bytes for a batch of {} rows",
            ends.len(),
            keys.len(),
            values.len()
        )));
    }
    for (row, value) in values.iter().enumerate() {
        check_record_size(&keys[batch_item_range(ends, row)], value)?;
    }
    Ok(())
}

/// Whether a record of about `len` bytes leaves no room for another one on its page, so that
/// every append of such records starts a new page.
pub(super) fn needs_own_page(len: usize) -> bool {
    2 * (len + crate::limits::LEAF_RECORD_HEADER_BYTES + crate::limits::SLOT_BYTES)
        > crate::limits::PAGE_BODY_BYTES
}

/// Holds the tail gate; releases it when dropped.
pub(super) struct TailGateGuard<'a> {
    gate: &'a Latch,
}

impl Drop for TailGateGuard<'_> {
    fn drop(&mut self) {
        self.gate.release(LatchMode::Exclusive);
    }
}

/// The first eight bytes of `key` as a big-endian number, zero-padded. If
/// `key_prefix(a) < key_prefix(b)` then `a < b`, so comparing prefixes can rule keys out
/// without reading the keys themselves.
pub(super) fn key_prefix(key: &[u8]) -> u64 {
    let mut bytes = [0u8; 8];
    let len = key.len().min(8);
    bytes[..len].copy_from_slice(&key[..len]);
    u64::from_be_bytes(bytes)
}
