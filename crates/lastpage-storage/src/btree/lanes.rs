//! Sequence lanes: ascending keys from a sequence (an IDENTITY column) inserted at several
//! places at the end of the index instead of one.
//!
//! With one insertion point, every append of a small row goes through one critical section
//! (the tail gate, the last leaf). On a machine with few cores that section is cheap in
//! instructions but dear in cache misses whenever it changes cores, so the best the single tail
//! can do is run at the speed of one core (see `append.rs`), while hash partitioning spreads
//! the same inserts over sixteen trees and uses every core. Lanes get the same spread inside
//! one tree, with the key still ascending and nothing in the schema changed:
//!
//! - The tree has `TAIL_LANES` lanes. Each thread always uses the same lane (its *home*), so
//!   one session's keys keep ascending. A thread that takes numbers of the sequence another way
//!   (a batch, a page-sized row, the classic path) raises its lane's *floor* past them
//!   ([`BTree::sequence_taken_outside_lane`]), and the lane gives up a block below its floor,
//!   so the thread's next row still gets a larger number than its last.
//! - A lane owns a *block* of the sequence: `rows` consecutive numbers, reserved at once from
//!   the shared counter, about as many as fill one leaf. Its rows go on the leaf where its
//!   previous row went, under that leaf's latch only: no tail gate, and different lanes write
//!   to different leaves.
//! - When the block runs out or the leaf is full, the lane goes to the tail. If the last leaf
//!   is its own (its last key is the lane's), the lane goes on there (with the block's next
//!   number, or a new block's first); otherwise, under the tail gate, it reserves the next
//!   block and starts a new last leaf with the block's first row (the descent-free append of
//!   `append.rs`, with a fresh page even if the last leaf has room, which belongs to another
//!   lane; when the parent has no room for it, or the database is at its page limit, the row
//!   goes on that last leaf after all, which is correct because later rows of either lane are
//!   placed by a search). Reserving under the gate keeps blocks arriving at the tail in the
//!   order they were reserved, so a new block's first key is always the largest key.
//!
//! Why a lane's row belongs on its leaf: when the lane last inserted there, the leaf covered
//! the lane's previous key `p`; the new key `k` is the next number of the same block, so
//! `p < k` and no key lies between them: nobody else holds numbers of this block, and every
//! separator in a B+tree is a key that was in the tree at some time. So no separator falls in
//! `(p, k]`, and a leaf that still covers `p` covers `k` too. The leaf still covers `p` if it
//! holds `p` (checked under the latch), or if it has not split since (its `next` link is what
//! it was, and no leaf of the tree was freed since: then the page is the same leaf, and only
//! a split changes its `next`), which also covers a `p` that a rollback removed. A freed leaf
//! may be handed out again as another leaf whose `next` happens to match, which is why a freed
//! leaf anywhere in the tree makes the lanes stop trusting `next` until their next insert
//! records it again (`reclaim.rs` counts the leaf under its latch before freeing it, so a lane
//! that latches the page later sees the count moved). Freeing a leaf only widens its
//! neighbours' ranges, so a leaf that holds `p` still covers `k`. Anything else sends the lane
//! to the tail for a new block, or the row down the classic path: correct in every case, only
//! slower.
//!
//! What it costs: numbers are ascending per session, not across sessions (two sessions hold
//! different blocks at once), and a block's unused numbers are skipped if its leaf fills up
//! early or the database restarts (SQL Server's IDENTITY cache skips numbers after a restart in
//! the same way). Every leaf but the few being filled ends up full.

use crate::buffer::ExclusiveGuard;
use crate::limits::{PAGE_BODY_BYTES, TAIL_LANES};
use crate::page::{NO_PAGE, PageId, leaf_entry_bytes};
use crate::stats::{self, LatchClass, WaitType};
use crate::sync::{self, AtomicI64, Mutex, Ordering};

use super::append::{GeneratedKeyError, needs_own_page};
use super::{BTree, BTreeError, InsertPath, check_record_size};

/// One lane: its block of the sequence and the leaf its last row went to.
#[derive(Debug)]
pub(super) struct LaneState {
    /// The leaf holding `last_key`, as last seen (a hint, checked under its latch).
    page: PageId,
    /// That leaf's `next` link when the lane last inserted there. While it is unchanged, and
    /// no leaf of the tree was freed since (`leaves_freed`), the leaf's key range is what it
    /// was (or wider), even if the lane's last key has since been deleted (a rollback).
    page_next: PageId,
    /// The tree's count of freed leaves when `page_next` was read.
    leaves_freed: u64,
    /// The lane's last inserted key (empty before its first).
    last_key: Vec<u8>,
    /// The next number of the block.
    next: i64,
    /// Numbers left in the block.
    remaining: u64,
    /// A running average of the bytes the lane's rows take on a leaf (slot included), 0
    /// before the first: sizes the next block, so that rows of varying sizes still fill the
    /// leaf about when the block runs out.
    average_entry_bytes: usize,
}

impl LaneState {
    fn new() -> Self {
        LaneState {
            page: NO_PAGE,
            page_next: NO_PAGE,
            leaves_freed: 0,
            last_key: Vec::new(),
            next: 0,
            remaining: 0,
            average_entry_bytes: 0,
        }
    }

    /// Moves past the block's current number. A block that would run past the largest number
    /// ends there (the caller's `make_key` reports the overflow for the number it cannot
    /// encode; this only keeps the arithmetic from wrapping).
    fn take_number(&mut self, step: i64) {
        match self.next.checked_add(step) {
            Some(next) => {
                self.next = next;
                self.remaining -= 1;
            }
            None => self.remaining = 0,
        }
    }

    /// Counts a row of `entry_bytes` into the running average (weight 1/8 for the new row).
    fn note_row(&mut self, entry_bytes: usize) {
        self.average_entry_bytes = if self.average_entry_bytes == 0 {
            entry_bytes
        } else {
            (7 * self.average_entry_bytes + entry_bytes).div_ceil(8)
        };
    }
}

/// One lane: its state, and its floor.
struct Lane {
    state: Mutex<LaneState>,
    /// The largest number a thread of this lane took outside the lane (see
    /// [`BTree::sequence_taken_outside_lane`]); the lane hands out no number at or below it.
    /// Only the thread that raised it must see it (its own later insert, in program order), so
    /// relaxed accesses do; other threads of the lane may see it late and then start a new
    /// block a little later, which costs nothing but the rest of a block.
    floor: AtomicI64,
}

/// The lanes of one tree.
pub(super) struct Lanes {
    lanes: Box<[crossbeam_utils::CachePadded<Lane>]>,
}

impl Default for Lanes {
    fn default() -> Self {
        Lanes {
            lanes: (0..TAIL_LANES)
                .map(|_| {
                    crossbeam_utils::CachePadded::new(Lane {
                        state: Mutex::new(LaneState::new()),
                        floor: AtomicI64::new(i64::MIN),
                    })
                })
                .collect(),
        }
    }
}

/// Hands each thread its home lane, round robin. A plain counter, not part of any protocol.
static NEXT_HOME_LANE: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

std::thread_local! {
    static HOME_LANE: usize = NEXT_HOME_LANE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
}

/// The calling thread's lane. Under loom every thread uses lane 0 (the model must not depend on
/// a counter that outlives its executions); tests that want two lanes name them.
fn home_lane() -> usize {
    if cfg!(loom) {
        0
    } else {
        HOME_LANE.with(|lane| *lane)
    }
}

/// Rows a lane reserves at once: as many rows of `entry_bytes` (slot included) as fill one
/// leaf, so that a lane's block and its leaf run out together.
fn rows_per_block(entry_bytes: usize) -> u64 {
    (PAGE_BODY_BYTES / entry_bytes.max(1)).max(1) as u64
}

impl BTree {
    /// Inserts a row keyed by the next number of a sequence, on the calling thread's lane (see
    /// the module documentation). `reserve(n)` reserves `n` consecutive numbers of the sequence
    /// (`first`, `first + step`, ...) and returns the first; `make_key(number, key)` encodes a
    /// number as the key (and may take the row's lock: it runs while the row's leaf is
    /// latched). The key is left in `key` (emptied first: a buffer the caller reuses, so that
    /// an insert allocates no key), and its number is returned.
    ///
    /// The caller promises what makes lanes correct: `step` is positive, keys ascend with the
    /// numbers, and no other writer inserts keys between numbers of this sequence (the keys of
    /// a table clustered on its IDENTITY column alone). Not on the default path, or with a
    /// non-positive step, or for rows that fill a page each (which gain nothing from lanes and
    /// take the single tail's copy-before-the-gate path instead), the row goes in through
    /// [`BTree::insert_with_generated_key`], one number at a time.
    pub fn insert_with_sequence_key<E>(
        &self,
        value: &[u8],
        step: i64,
        reserve: impl FnMut(u64) -> Result<i64, E>,
        make_key: impl FnMut(i64, &mut Vec<u8>) -> Result<(), E>,
        key: &mut Vec<u8>,
    ) -> Result<i64, GeneratedKeyError<E>> {
        self.insert_with_sequence_key_on_lane(home_lane(), value, step, reserve, make_key, key)
    }

    /// Tells the calling thread's lane that the thread took numbers of the sequence up to
    /// `last` outside it (a batch at the tail, say): the lane's next number for this thread is
    /// then above `last` (it gives up the rest of a block that lies below), so the keys one
    /// session inserts keep ascending however it inserts them. Without it a session's batch
    /// took numbers past its lane's block, and its next single row went back into the block.
    pub fn sequence_taken_outside_lane(&self, last: i64) {
        self.sequence_taken_outside_lane_of(home_lane(), last);
    }

    fn sequence_taken_outside_lane_of(&self, lane: usize, last: i64) {
        let lane = &self.lanes.lanes[lane % self.lanes.lanes.len()];
        if lane.floor.load(Ordering::Relaxed) < last {
            lane.floor.fetch_max(last, Ordering::Relaxed);
        }
    }

    /// [`BTree::insert_with_sequence_key`] on lane `lane` (modulo the number of lanes). For
    /// tests that need two threads on two lanes.
    #[doc(hidden)]
    pub fn insert_with_sequence_key_on_lane<E>(
        &self,
        lane: usize,
        value: &[u8],
        step: i64,
        mut reserve: impl FnMut(u64) -> Result<i64, E>,
        mut make_key: impl FnMut(i64, &mut Vec<u8>) -> Result<(), E>,
        key: &mut Vec<u8>,
    ) -> Result<i64, GeneratedKeyError<E>> {
        key.clear();
        if self.insert_path() != InsertPath::Default || step <= 0 || needs_own_page(value.len()) {
            let mut number = None;
            let inserted = self.insert_with_generated_key(value, |key| {
                let first = reserve(1)?;
                number = Some(first);
                make_key(first, key)
            });
            if let Some(number) = number
                && step > 0
            {
                self.sequence_taken_outside_lane_of(lane, number);
            }
            *key = inserted?;
            return Ok(number.expect("the key maker ran"));
        }
        let _admission = self.enter_insert_path();
        let lane = &self.lanes.lanes[lane % self.lanes.lanes.len()];
        let floor = lane.floor.load(Ordering::Relaxed);
        let lane = &lane.state;
        let mut state = match lane.try_lock() {
            Ok(state) => state,
            Err(_) => {
                // Waiting for the lane is waiting for its leaf.
                let wait = stats::begin_wait(WaitType::PageLatchEx, Some(LatchClass::Buffer));
                let state = sync::lock(lane);
                wait.end(None);
                state
            }
        };
        if state.remaining > 0 && state.next <= floor {
            // The thread took larger numbers outside the lane: the rest of this block would
            // take its keys backwards.
            state.remaining = 0;
        }
        if state.remaining > 0
            && state.page != NO_PAGE
            && let Some(number) =
                self.append_in_lane(&mut state, value, step, &mut make_key, key)?
        {
            return Ok(number);
        }
        key.clear();
        self.start_lane_block(&mut state, value, step, &mut reserve, &mut make_key, key)
    }

    /// Inserts the lane's next number on the lane's leaf, if that leaf still covers it (holds
    /// the lane's last key, or has not split since the lane's last insert) and has room, with
    /// its key in the empty `key`. `None` means it did not, and nothing was changed.
    fn append_in_lane<E>(
        &self,
        state: &mut LaneState,
        value: &[u8],
        step: i64,
        make_key: &mut impl FnMut(i64, &mut Vec<u8>) -> Result<(), E>,
        key: &mut Vec<u8>,
    ) -> Result<Option<i64>, GeneratedKeyError<E>> {
        // Only the lane's mutex is held, never a latch, so waiting for the leaf cannot close a
        // cycle: nobody waits for a lane while holding a latch. A leaf that was freed since
        // (deletes emptied it) sends the lane to the tail.
        let Some(mut leaf) = self
            .pool
            .latch_exclusive_unless_freed(state.page)
            .map_err(BTreeError::Storage)?
        else {
            return Ok(None);
        };
        let page = leaf.page();
        let count = page.slot_count();
        if !page.is_leaf() || page.index_id() != self.index_id {
            return Ok(None);
        }
        // The leaf still covers the lane's next key if it holds the lane's last key (the
        // common case: as the leaf's last key), or if it has not split since the lane last
        // inserted there (see the module documentation).
        let last_is_lanes = count > 0 && page.key(count - 1) == state.last_key.as_slice();
        let covers_next_key = last_is_lanes
            || (count > 0 && page.search(&state.last_key).is_ok())
            || (page.next() == state.page_next
                && self.leaves_freed.load(Ordering::Relaxed) == state.leaves_freed);
        if !covers_next_key
            || page.total_free_bytes() < leaf_entry_bytes(state.last_key.len(), value.len())
        {
            return Ok(None);
        }
        let number = state.next;
        make_key(number, key).map_err(GeneratedKeyError::Key)?;
        // The number is used up whatever happens to the row.
        state.take_number(step);
        check_record_size(key, value)?;
        if key.as_slice() <= state.last_key.as_slice() {
            // Keys that do not ascend break the promise lanes rely on: put the row in the
            // classic way and start a new block next time.
            drop(leaf);
            state.remaining = 0;
            self.insert_classic(key, value)?;
            return Ok(Some(number));
        }
        // The new key is past the lane's last key (checked above), so when that is the leaf's
        // last key the row goes at the end without comparing again.
        let position = if last_is_lanes || count == 0 || key.as_slice() > page.key(count - 1) {
            count
        } else {
            match page.search(key) {
                Ok(_) => return Err(BTreeError::DuplicateKey.into()),
                Err(position) => position,
            }
        };
        if leaf.page_mut().insert_leaf(position, key, value).is_err() {
            // A key longer than the lane's last one did not fit after all.
            drop(leaf);
            state.remaining = 0;
            self.insert_classic(key, value)?;
            return Ok(Some(number));
        }
        self.rows.add(1);
        state.note_row(leaf_entry_bytes(key.len(), value.len()));
        self.note_lane_page(state, leaf.page_id(), leaf.page().next());
        state.last_key.clone_from(key);
        Ok(Some(number))
    }

    /// Inserts the lane's next row under the tail gate. If the last leaf is the lane's own
    /// (its last key is the lane's last key), the row goes there: the block's next number if it
    /// has one left, else the first of a new block (so a single session never skips a number,
    /// and a leaf that fills before its block runs out, or after, simply splits as an append).
    /// Otherwise the lane reserves a new block and starts a new last leaf with its first number.
    /// Either way the lane then continues on the last leaf.
    fn start_lane_block<E>(
        &self,
        state: &mut LaneState,
        value: &[u8],
        step: i64,
        reserve: &mut impl FnMut(u64) -> Result<i64, E>,
        make_key: &mut impl FnMut(i64, &mut Vec<u8>) -> Result<(), E>,
        key: &mut Vec<u8>,
    ) -> Result<i64, GeneratedKeyError<E>> {
        state.page = NO_PAGE;
        // A new leaf, if one is needed, is allocated here, outside the gate.
        self.prepare_spare_leaf();
        let key_len = match state.last_key.len() {
            0 => self.generated_key_len.load(Ordering::Relaxed).max(8) as usize,
            len => len,
        };
        let _gate = self.enter_tail_gate(false);
        let mut leaf = self.latch_tail()?;
        let is_last = self.is_last_leaf(&leaf);
        let count = leaf.page().slot_count();
        let own_tail = is_last
            && count > 0
            && !state.last_key.is_empty()
            && leaf.page().key(count - 1) == state.last_key.as_slice();
        if !own_tail || state.remaining == 0 {
            // Reserved under the gate, so that blocks reach the tail in the order they were
            // reserved: this block's first key is larger than every key in the tree.
            let this_row = leaf_entry_bytes(key_len, value.len());
            let rows = rows_per_block(match state.average_entry_bytes {
                0 => this_row,
                average => average,
            });
            state.remaining = 0;
            state.next = reserve(rows).map_err(GeneratedKeyError::Key)?;
            state.remaining = rows;
        }
        let number = state.next;
        key.reserve(key_len);
        make_key(number, key).map_err(GeneratedKeyError::Key)?;
        state.take_number(step);
        state.last_key.clone_from(key);
        check_record_size(key, value)?;
        state.note_row(leaf_entry_bytes(key.len(), value.len()));
        self.note_generated_key_len(key.len());
        if is_last && (count == 0 || key.as_slice() > leaf.page().key(count - 1)) {
            if !own_tail
                && count > 0
                && let Some(inserted) = self.append_on_new_tail(&mut leaf, key, value)
            {
                let page = inserted?;
                self.rows.add(1);
                // Read under the latch of the leaf before the new one: the new leaf cannot be
                // emptied and freed before that latch goes.
                self.note_lane_page(state, page, NO_PAGE);
                return Ok(number);
            }
            if let Some(result) = self.try_append_on_last_leaf(&mut leaf, key, value) {
                result?;
                self.rows.add(1);
                // Still under the leaf's latch: its next link names the page a split of it
                // just made, which holds the key; no next link means the key is on it.
                let next = leaf.page().next();
                let page = if next == NO_PAGE {
                    leaf.page_id()
                } else {
                    next
                };
                self.note_lane_page(state, page, NO_PAGE);
                return Ok(number);
            }
            drop(leaf);
            self.insert_classic(key, value)?;
            return Ok(number);
        }
        drop(leaf);
        self.insert_classic(key, value)?;
        Ok(number)
    }

    /// Remembers `page` as the leaf the lane's last row went to, and `next` as its `next` link
    /// then, with the count of freed leaves that makes `next` worth comparing later. Called
    /// while a latch keeps the page from being freed: the page's own, or, for the new leaf
    /// a split just linked after it, the latch of the leaf before it.
    fn note_lane_page(&self, state: &mut LaneState, page: PageId, next: PageId) {
        state.page = page;
        state.page_next = next;
        state.leaves_freed = self.leaves_freed.load(Ordering::Relaxed);
    }

    /// Starts a new last leaf holding only `key` (which sorts after every key of the latched
    /// last leaf `leaf`), even though `leaf` may have room: that room belongs to the lane
    /// filling it. Returns the new leaf's page, which the lane records while it holds the latch
    /// of the leaf before it (re-reading the tail hint after letting that latch go took, when a
    /// classic writer's split moved the tail in between, a page whose keys all lie above the
    /// lane's next ones). `None` if the parent could not take the new leaf, or the pool is at
    /// its page limit, and nothing was changed: the caller then uses the last leaf's room,
    /// which is better than refusing a row at a full database while that room is left.
    fn append_on_new_tail<'a>(
        &'a self,
        leaf: &mut ExclusiveGuard<'a>,
        key: &[u8],
        value: &[u8],
    ) -> Option<Result<PageId, BTreeError>> {
        let mut parent = match self.try_latch_tail_parent(leaf, key)? {
            Ok(parent) => parent,
            Err(error) => return Some(Err(error)),
        };
        let mut right = match self.take_spare_leaf() {
            Ok(right) => right,
            Err(BTreeError::PoolFull(_)) => return None,
            Err(error) => return Some(Err(error)),
        };
        right
            .page_mut()
            .insert_leaf(0, key, value)
            .expect("a checked record fits on an empty page");
        self.link_new_tail(leaf, &mut parent, &mut right, key);
        self.stats.leaf_appends.add(1);
        Some(Ok(right.page_id()))
    }
}
