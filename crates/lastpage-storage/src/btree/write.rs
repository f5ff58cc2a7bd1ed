//! Inserts, updates and splits.

use std::cmp::Ordering as KeyOrdering;

use crossbeam_utils::CachePadded;

use super::{BTree, BTreeError, InsertPath, TreeStats, check_record_size, corrupt, flow_control};
use crate::buffer::ExclusiveGuard;
use crate::limits::{MAX_KEY_BYTES, SLOT_BYTES};
use crate::page::{NO_PAGE, PageId, PageKind, inner_entry_bytes, leaf_entry_bytes};
use crate::sync::{AtomicI64, AtomicU64, Ordering};

std::thread_local! {
    /// Whether this thread's last write (into any index; an update's split counts too) split
    /// a page since the flow control last asked: its guess at who will not finish quickly.
    pub(super) static LAST_INSERT_SPLIT: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Number of stripes of a [`StripedCounter`].
const COUNTER_STRIPES: usize = 16;

/// A counter that many threads add to without sharing a cache line: each thread adds to one
/// of `COUNTER_STRIPES` padded stripes, and reading sums them. Row counts and split counts are
/// bumped on every insert, so a single shared counter would itself be a last-page hot spot.
pub struct StripedCounter {
    stripes: Box<[CachePadded<AtomicI64>]>,
}

impl Default for StripedCounter {
    fn default() -> Self {
        StripedCounter {
            stripes: (0..COUNTER_STRIPES)
                .map(|_| CachePadded::new(AtomicI64::new(0)))
                .collect(),
        }
    }
}

impl StripedCounter {
    /// Adds `amount` (which may be negative).
    pub fn add(&self, amount: i64) {
        self.stripes[stripe_of_this_thread()].fetch_add(amount, Ordering::Relaxed);
    }

    /// The sum of all stripes, clamped to the range of an i64. Exact when no add is in flight.
    /// Added up wide: a tree's row count starts from what its caller recorded (the engine's
    /// open refuses a catalog's above `limits::MAX_TREE_ROWS`, but `BTree::open` takes any u64),
    /// and one more row in another stripe overflowed a plain sum of a count near `i64::MAX`.
    pub fn sum(&self) -> i64 {
        let sum: i128 = self
            .stripes
            .iter()
            .map(|stripe| i128::from(stripe.load(Ordering::Relaxed)))
            .sum();
        i64::try_from(sum).unwrap_or(if sum < 0 { i64::MIN } else { i64::MAX })
    }
}

fn stripe_of_this_thread() -> usize {
    static NEXT_STRIPE: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    thread_local! {
        static STRIPE: usize =
            NEXT_STRIPE.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % COUNTER_STRIPES;
    }
    STRIPE.with(|stripe| *stripe)
}

/// The split counters of one tree.
#[derive(Default)]
pub(super) struct SplitCounters {
    pub(super) leaf_splits: StripedCounter,
    pub(super) leaf_appends: StripedCounter,
    inner_splits: StripedCounter,
    split_restarts: StripedCounter,
    pub(super) leaves_freed: StripedCounter,
    pub(super) inner_pages_freed: StripedCounter,
    /// The counters of leaves whose freeing gave up (see `reclaim.rs`). Rare events, so one
    /// atomic each: striping buys nothing for them, and reading a striped counter costs a load
    /// per stripe (which, under loom, is a branch per stripe in every model that reads stats).
    pub(super) empty_leaves_left: AtomicU64,
    pub(super) empty_leaves_retried_freed: AtomicU64,
    pub(super) empty_leaves_not_listed: AtomicU64,
}

impl SplitCounters {
    pub(super) fn snapshot(&self) -> TreeStats {
        let read = |counter: &StripedCounter| u64::try_from(counter.sum()).unwrap_or(0);
        TreeStats {
            leaf_splits: read(&self.leaf_splits),
            leaf_appends: read(&self.leaf_appends),
            inner_splits: read(&self.inner_splits),
            split_restarts: read(&self.split_restarts),
            leaves_freed: read(&self.leaves_freed),
            inner_pages_freed: read(&self.inner_pages_freed),
            empty_leaves_left: self.empty_leaves_left.load(Ordering::Relaxed),
            empty_leaves_retried_freed: self.empty_leaves_retried_freed.load(Ordering::Relaxed),
            empty_leaves_not_listed: self.empty_leaves_not_listed.load(Ordering::Relaxed),
        }
    }
}

/// Whether a write adds a new key or replaces the value of an existing one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum WriteMode<'e> {
    Insert,
    /// Replace the value; if `expected` is given, only if the current value equals it.
    Replace {
        expected: Option<&'e [u8]>,
    },
}

/// What a write did.
enum Applied {
    Inserted,
    Replaced(Vec<u8>),
    NotFound,
    /// A conditional replace found a value other than the expected one, and changed nothing.
    Changed,
}

/// The outcome of [`BTree::compare_and_update`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CompareAndUpdate {
    /// The value was the expected one and has been replaced.
    Updated,
    /// The key is not in the tree.
    NotFound,
    /// The key holds another value now; nothing was changed.
    Changed,
}

/// The result of trying a write on one latched leaf.
enum Attempt {
    Done(Applied),
    NeedsSplit,
}

/// How a full leaf will be split.
struct LeafSplitPlan {
    /// Records `split_at..` move to the new right page.
    split_at: usize,
    /// The separator: the first key of the right page (or the new key, for an append).
    separator: Vec<u8>,
    /// An insert past the last key of the last leaf: the new page starts empty and the old one
    /// stays full (SQL Server's end-of-index split).
    append: bool,
}

impl BTree {
    /// Inserts `key` with `value`; fails with [`BTreeError::DuplicateKey`] if it is present.
    pub fn insert(&self, key: &[u8], value: &[u8]) -> Result<(), BTreeError> {
        check_record_size(key, value)?;
        let _admission = self.enter_insert_path();
        self.insert_admitted(key, value)
    }

    /// Passes OPTIMIZE_FOR_SEQUENTIAL_KEY flow control, if it is on. A worker whose previous
    /// insert split a page is not likely to finish quickly, so it waits in the slow queue.
    pub(super) fn enter_insert_path(&self) -> Option<flow_control::FlowTicket<'_>> {
        self.flow_control.enter(!LAST_INSERT_SPLIT.replace(false))
    }

    /// [`BTree::insert`] once past flow control.
    pub(super) fn insert_admitted(&self, key: &[u8], value: &[u8]) -> Result<(), BTreeError> {
        if self.insert_path() == InsertPath::Default
            && let Some(result) = self.try_append_at_tail(key, value)
        {
            return result;
        }
        self.insert_classic(key, value)
    }

    /// The classic insert: latch coupling from the root.
    pub(super) fn insert_classic(&self, key: &[u8], value: &[u8]) -> Result<(), BTreeError> {
        match self.write(key, value, WriteMode::Insert)? {
            Applied::Inserted => Ok(()),
            Applied::Replaced(_) | Applied::NotFound | Applied::Changed => {
                unreachable!("an insert either inserts or reports a duplicate")
            }
        }
    }

    /// Inserts many entries, latching each leaf once for the whole run of entries that belong
    /// on it instead of once per entry (the batching remedy: the seeds' best results come from
    /// multi-row inserts). Returns one result per entry, in the order given; a duplicate or an
    /// oversized entry fails alone and the others still go in. Each run passes flow control
    /// (OPTIMIZE_FOR_SEQUENTIAL_KEY) as one insert does: a batch whose rows fit on the leaf
    /// went past it before, so batches and single rows mixed on one index were not bounded.
    pub fn insert_batch(&self, entries: &[(&[u8], &[u8])]) -> Vec<Result<(), BTreeError>> {
        let mut results: Vec<Result<(), BTreeError>> = vec![Ok(()); entries.len()];
        let mut order: Vec<usize> = (0..entries.len()).collect();
        order.sort_by(|&a, &b| entries[a].0.cmp(entries[b].0));
        let mut next = 0;
        while next < order.len() {
            let admission = self.enter_insert_path();
            let (first_key, _) = entries[order[next]];
            let (mut leaf, high_fence) = match self.leaf_exclusive_with_high_fence(first_key) {
                Ok(found) => found,
                Err(error) => {
                    // The leaf could not be read: this entry fails, the rest try again.
                    results[order[next]] = Err(error);
                    next += 1;
                    continue;
                }
            };
            let mut leaf_full = false;
            while let Some(&position) = order.get(next) {
                let (key, value) = entries[position];
                if high_fence.as_deref().is_some_and(|fence| key >= fence) {
                    break;
                }
                if let Err(error) = check_record_size(key, value) {
                    results[position] = Err(error);
                    next += 1;
                    continue;
                }
                match self.try_apply(&mut leaf, key, value, WriteMode::Insert) {
                    Ok(Attempt::Done(_)) => {}
                    Ok(Attempt::NeedsSplit) => {
                        leaf_full = true;
                        break;
                    }
                    Err(error) => results[position] = Err(error),
                }
                next += 1;
            }
            drop(leaf);
            // Left before the split path enters again: a worker waiting for a place while it
            // holds one could wait for ever once every place is held that way.
            drop(admission);
            if leaf_full {
                // The split path takes this one entry; the run continues on the new leaves.
                let (key, value) = entries[order[next]];
                results[order[next]] = self.insert(key, value);
                next += 1;
            }
        }
        results
    }

    /// Replaces the value of `key` with `value` only if it is still `expected`: the building
    /// block of a read-modify-write that needs no lock held between the read and the write.
    pub fn compare_and_update(
        &self,
        key: &[u8],
        expected: &[u8],
        value: &[u8],
    ) -> Result<CompareAndUpdate, BTreeError> {
        check_record_size(key, value)?;
        let mode = WriteMode::Replace {
            expected: Some(expected),
        };
        Ok(match self.write(key, value, mode)? {
            Applied::Replaced(_) => CompareAndUpdate::Updated,
            Applied::NotFound => CompareAndUpdate::NotFound,
            Applied::Changed => CompareAndUpdate::Changed,
            Applied::Inserted => unreachable!("a replace never inserts a new key"),
        })
    }

    /// Replaces the value of `key`; returns the old value, or `None` if the key is absent (and
    /// then changes nothing).
    pub fn update(&self, key: &[u8], value: &[u8]) -> Result<Option<Vec<u8>>, BTreeError> {
        check_record_size(key, value)?;
        match self.write(key, value, WriteMode::Replace { expected: None })? {
            Applied::Replaced(old) => Ok(Some(old)),
            Applied::NotFound => Ok(None),
            Applied::Inserted | Applied::Changed => {
                unreachable!("an unconditional replace never inserts or compares")
            }
        }
    }

    fn write(&self, key: &[u8], value: &[u8], mode: WriteMode<'_>) -> Result<Applied, BTreeError> {
        {
            let mut leaf = self.leaf_exclusive(key)?;
            if let Attempt::Done(applied) = self.try_apply(&mut leaf, key, value, mode)? {
                return Ok(applied);
            }
        }
        self.stats.split_restarts.add(1);
        // First restart: shared latches down to the leaf's parent, which is taken exclusively.
        // If the split could not be absorbed there, restart with exclusive coupling from the
        // root.
        let mut exclusive_from_level = 1u8;
        loop {
            let mut path = self.descend_exclusive(key, exclusive_from_level)?;
            let leaf_index = path.len() - 1;
            if let Attempt::Done(applied) =
                self.try_apply(&mut path[leaf_index], key, value, mode)?
            {
                return Ok(applied);
            }
            let plan = plan_leaf_split(&path[leaf_index], key, mode, self.insert_path());
            if !self.cascade_fits(&path, plan.separator.len()) {
                exclusive_from_level = u8::MAX;
                continue;
            }
            // Every page the split needs is allocated before anything changes: a split that
            // ran out of pages half way (the pool at its page limit) left the new leaf in the
            // leaf chain but not in its parent, so descents missed its rows, an insert of one
            // of their keys made a duplicate, and the integrity check failed.
            let needed = split_pages_needed(&path, plan.separator.len());
            // One page more than the path: the split reaches the root and grows the tree a
            // level. A root at the highest level a page's level byte records cannot grow (the
            // new root's level overflowed); only a damaged tree has one, since a tree of 255
            // levels holds more rows than any pool. Refused before anything changes.
            if needed > path.len() && path[0].page().level() == u8::MAX {
                return Err(corrupt(
                    path[0].page_id(),
                    "the root is at level 255 and cannot grow another level for a split".into(),
                ));
            }
            let mut pages = self.reserve_split_pages(needed)?;
            let split = self.split_on_path(&mut path, &plan, &mut pages);
            self.recycle_split_pages(pages);
            let mut right = split?;
            let leaf_index = path.len() - 1;
            let target = if key < plan.separator.as_slice() {
                &mut path[leaf_index]
            } else {
                &mut right
            };
            if let Attempt::Done(applied) = self.try_apply(target, key, value, mode)? {
                return Ok(applied);
            }
            // Very large records: the record still does not fit on its half. Nothing has been
            // changed for it yet, so release everything and split again.
        }
    }

    /// Splits the full leaf at the end of `path` as `plan` says and links the new right page
    /// into the parent, splitting inner pages up the path and growing the root as needed, all
    /// with pages from `pages`. Returns the new right leaf, still latched.
    fn split_on_path<'a>(
        &'a self,
        path: &mut Vec<ExclusiveGuard<'a>>,
        plan: &LeafSplitPlan,
        pages: &mut SplitPages<'a>,
    ) -> Result<ExclusiveGuard<'a>, BTreeError> {
        if path.len() == 1 {
            // The leaf is the root: move it down first, so that the leaves' sibling links
            // name the page the rows will live on rather than the root.
            self.grow_root(path, pages)?;
        }
        let leaf_index = path.len() - 1;
        let (above, leaf) = path.split_at_mut(leaf_index);
        let right = self.split_leaf(&mut leaf[0], above, plan, pages)?;
        let parent = self.push_separator(
            path,
            plan.separator.clone(),
            right.page_id(),
            plan.append,
            pages,
        )?;
        if plan.append {
            self.tail_parent_hint.store(parent, Ordering::Relaxed);
        }
        Ok(right)
    }

    /// Latches `count` unlinked pages for a split: the tree's spare leaves first, then new
    /// pages from the pool. If the pool runs out, the pages already taken go back to the spare
    /// leaves and the split fails before it changes anything.
    fn reserve_split_pages(&self, count: usize) -> Result<SplitPages<'_>, BTreeError> {
        let mut pages = SplitPages {
            pages: Vec::with_capacity(count),
        };
        while pages.pages.len() < count {
            match self.take_spare_leaf() {
                Ok(page) => pages.pages.push(page),
                Err(error) => {
                    self.recycle_split_pages(pages);
                    return Err(error);
                }
            }
        }
        Ok(pages)
    }

    /// Gives the pages a split did not use back to the spare leaves, formatted as empty leaves,
    /// for the next split: they were allocated for this tree, which keeps them until a split
    /// links them (or the whole tree is freed).
    fn recycle_split_pages(&self, pages: SplitPages<'_>) {
        let mut ids = Vec::with_capacity(pages.pages.len());
        for mut page in pages.pages {
            let page_id = page.page_id();
            page.page_mut()
                .format(page_id, PageKind::Leaf, 0, self.index_id);
            ids.push(page_id);
        }
        if !ids.is_empty() {
            crate::sync::lock(&self.spare_leaves).extend(ids);
        }
    }

    /// A page from `pages` (or, if the count fell short, from the pool), formatted as `kind`
    /// at `level`.
    fn new_split_page<'a>(
        &'a self,
        pages: &mut SplitPages<'a>,
        kind: PageKind,
        level: u8,
    ) -> Result<ExclusiveGuard<'a>, BTreeError> {
        match pages.pages.pop() {
            Some(mut page) => {
                let page_id = page.page_id();
                page.page_mut().format(page_id, kind, level, self.index_id);
                Ok(page)
            }
            None => Ok(self
                .pool
                .allocate(self.latch_policy, kind, level, self.index_id)?),
        }
    }

    /// Applies a write to a latched leaf if it fits.
    fn try_apply(
        &self,
        leaf: &mut ExclusiveGuard<'_>,
        key: &[u8],
        value: &[u8],
        mode: WriteMode<'_>,
    ) -> Result<Attempt, BTreeError> {
        let page = leaf.page();
        let found = match mode {
            WriteMode::Insert => page.search_for_insert(key),
            WriteMode::Replace { .. } => page.search(key),
        };
        match (found, mode) {
            (Ok(_), WriteMode::Insert) => Err(BTreeError::DuplicateKey),
            (Err(_), WriteMode::Replace { .. }) => Ok(Attempt::Done(Applied::NotFound)),
            (Err(index), WriteMode::Insert) => match leaf.page_mut().insert_leaf(index, key, value)
            {
                Ok(()) => {
                    self.rows.add(1);
                    Ok(Attempt::Done(Applied::Inserted))
                }
                Err(_) => Ok(Attempt::NeedsSplit),
            },
            (Ok(index), WriteMode::Replace { expected }) => {
                if expected.is_some_and(|expected| expected != page.value(index)) {
                    return Ok(Attempt::Done(Applied::Changed));
                }
                let old_record_bytes = page.record_bytes(index);
                // Removing the old record frees its bytes and its slot; the new one needs the
                // same slot back. Check before removing, so a failure changes nothing.
                if page.total_free_bytes() + old_record_bytes + SLOT_BYTES
                    < leaf_entry_bytes(key.len(), value.len())
                {
                    return Ok(Attempt::NeedsSplit);
                }
                let old = page.value(index).to_vec();
                let mut page = leaf.page_mut();
                page.remove(index);
                page.insert_leaf(index, key, value)
                    .expect("the space check above guarantees the record fits");
                Ok(Attempt::Done(Applied::Replaced(old)))
            }
        }
    }

    /// Latches the path to the leaf for `key` exclusively from `exclusive_from_level` down
    /// (shared coupling above it), releasing exclusive ancestors above any inner page that can
    /// absorb a split. Returns the held path, top first, leaf last.
    fn descend_exclusive(
        &self,
        key: &[u8],
        exclusive_from_level: u8,
    ) -> Result<Vec<ExclusiveGuard<'_>>, BTreeError> {
        let mut path: Vec<ExclusiveGuard<'_>> = Vec::with_capacity(4);
        loop {
            let root = self.root_shared()?;
            if root.page().level() > exclusive_from_level {
                let mut node = root;
                loop {
                    let page = node.page();
                    let (child, _) = page.child_for(key);
                    if page.level() - 1 > exclusive_from_level {
                        node = self.child_shared(&page, child)?;
                    } else {
                        path.push(self.child_exclusive(&page, child, [node.page_id()])?);
                        break;
                    }
                }
                break;
            }
            drop(root);
            let root = self.root_exclusive()?;
            if root.page().level() > exclusive_from_level {
                // The root grew while it was unlatched; start again.
                continue;
            }
            path.push(root);
            break;
        }
        loop {
            let top = path.last().expect("the path holds at least one page");
            if top.page().is_leaf() {
                return Ok(path);
            }
            let (child, _) = top.page().child_for(key);
            let held = path.iter().map(ExclusiveGuard::page_id);
            let child = self.child_exclusive(&top.page(), child, held)?;
            if !child.page().is_leaf()
                && child.page().total_free_bytes() >= inner_entry_bytes(MAX_KEY_BYTES)
            {
                // This child absorbs any split from below: the ancestors cannot change.
                path.clear();
            }
            path.push(child);
        }
    }

    /// Whether a leaf split whose separator is `separator_len` bytes can be absorbed by the
    /// held path: some held inner page has room, or the top of the path is the root (which
    /// grows).
    fn cascade_fits(&self, path: &[ExclusiveGuard<'_>], separator_len: usize) -> bool {
        let mut needed = inner_entry_bytes(separator_len);
        for node in path[..path.len() - 1].iter().rev() {
            if node.page().total_free_bytes() >= needed {
                return true;
            }
            // The page will split and push one of its own separators up.
            needed = inner_entry_bytes(MAX_KEY_BYTES);
        }
        path[0].page_id() == self.root
    }

    /// Splits a full leaf according to `plan`; returns the new right page, still latched.
    /// `above` are the leaf's ancestors this thread holds.
    fn split_leaf<'a>(
        &'a self,
        leaf: &mut ExclusiveGuard<'a>,
        above: &[ExclusiveGuard<'a>],
        plan: &LeafSplitPlan,
        pages: &mut SplitPages<'a>,
    ) -> Result<ExclusiveGuard<'a>, BTreeError> {
        let mut right = self.new_split_page(pages, PageKind::Leaf, 0)?;
        let page = leaf.page();
        let count = page.slot_count();
        {
            let mut right_page = right.page_mut();
            for (target, index) in (plan.split_at..count).enumerate() {
                right_page
                    .insert_leaf(target, page.key(index), page.value(index))
                    .expect("half of a page fits on an empty page");
            }
        }
        let old_next = page.next();
        let left_id = leaf.page_id();
        let right_id = right.page_id();
        {
            let mut right_page = right.page_mut();
            right_page.set_prev(left_id);
            right_page.set_next(old_next);
        }
        if old_next != NO_PAGE {
            // Left to right at the same level, as the latch order requires.
            // Before the left page changes, so a failure here leaves the tree as it was (the
            // new right page stays unlinked, as a page that is never used). The link may be
            // corrupt: `node_exclusive` refuses a page this thread holds and checks for a leaf.
            let held = [left_id, right_id]
                .into_iter()
                .chain(above.iter().map(ExclusiveGuard::page_id));
            let mut next = self.node_exclusive(old_next, 0, left_id, held)?;
            let next_page = next.page();
            if next_page.prev() != left_id {
                return Err(corrupt(
                    old_next,
                    format!(
                        "reached by the next link of leaf {left_id}, its prev link names page {}",
                        next_page.prev()
                    ),
                ));
            }
            next.page_mut().set_prev(right_id);
        }
        let mut left_page = leaf.page_mut();
        left_page.truncate(plan.split_at);
        left_page.set_next(right_id);
        LAST_INSERT_SPLIT.set(true);
        if plan.append {
            self.set_tail(right_id, &plan.separator);
            self.stats.leaf_appends.add(1);
        } else {
            self.stats.leaf_splits.add(1);
        }
        Ok(right)
    }

    /// Inserts `separator` → `new_child` into the parent of the last page of `path`, splitting
    /// inner pages up the path as needed and growing the root if the split reaches it. Returns
    /// the page that became `new_child`'s parent.
    fn push_separator<'a>(
        &'a self,
        path: &mut Vec<ExclusiveGuard<'a>>,
        mut separator: Vec<u8>,
        mut new_child: PageId,
        append: bool,
        pages: &mut SplitPages<'a>,
    ) -> Result<PageId, BTreeError> {
        let mut child_index = path.len() - 1;
        let mut first_parent = None;
        loop {
            if child_index == 0 {
                debug_assert_eq!(path[0].page_id(), self.root, "cascade_fits guarantees this");
                self.grow_root(path, pages)?;
                child_index = 1;
            }
            let parent = &mut path[child_index - 1];
            // A separator lies strictly inside its child's key range, so its parent cannot
            // hold it already unless the pages disagree about their keys.
            let index = match parent.page().search(&separator) {
                Err(index) => index,
                Ok(_) => {
                    return Err(corrupt(
                        parent.page_id(),
                        "already holds the separator a split of its child produced".into(),
                    ));
                }
            };
            if parent
                .page_mut()
                .insert_inner(index, &separator, new_child)
                .is_ok()
            {
                return Ok(first_parent.unwrap_or(parent.page_id()));
            }
            let (up_separator, right) =
                self.split_inner(parent, index, &separator, new_child, append, pages)?;
            if first_parent.is_none() {
                first_parent = Some(if separator.as_slice() < up_separator.as_slice() {
                    parent.page_id()
                } else {
                    right.page_id()
                });
            }
            separator = up_separator;
            new_child = right.page_id();
            // Nobody can reach the new page until its separator is in the grandparent, which
            // this thread holds exclusively, so its latch can go now.
            drop(right);
            child_index -= 1;
        }
    }

    /// Splits a full inner page while inserting `separator` → `child` at `index`; returns the
    /// separator to push up and the new right page.
    fn split_inner<'a>(
        &'a self,
        node: &mut ExclusiveGuard<'a>,
        index: usize,
        separator: &[u8],
        child: PageId,
        append: bool,
        pages: &mut SplitPages<'a>,
    ) -> Result<(Vec<u8>, ExclusiveGuard<'a>), BTreeError> {
        let page = node.page();
        let level = page.level();
        let count = page.slot_count();
        let mut right = self.new_split_page(pages, PageKind::Inner, level)?;
        self.stats.inner_splits.add(1);
        if append && index == count {
            // The rightmost page of its level, filled by an ascending load: keep it full and
            // start the new page with just the new child.
            right.page_mut().set_low_child(child);
            return Ok((separator.to_vec(), right));
        }
        let middle = balanced_split_point(count, |i| page.record_bytes(i)).clamp(1, count - 1);
        let up_separator = page.key(middle).to_vec();
        {
            let mut right_page = right.page_mut();
            right_page.set_low_child(page.child(middle));
            for (target, moved) in (middle + 1..count).enumerate() {
                right_page
                    .insert_inner(target, page.key(moved), page.child(moved))
                    .expect("half of a page fits on an empty page");
            }
        }
        node.page_mut().truncate(middle);
        let target = match separator.cmp(&up_separator) {
            KeyOrdering::Less => node,
            KeyOrdering::Greater => &mut right,
            KeyOrdering::Equal => unreachable!("separators in one page are distinct"),
        };
        let position = target.page().search(separator).unwrap_err();
        target
            .page_mut()
            .insert_inner(position, separator, child)
            .expect("half of an inner page has room for one more separator");
        Ok((up_separator, right))
    }

    /// Moves the root's contents to a new child and makes the root an inner page one level up
    /// whose only child is that page. `path[0]` must be the root; the child is inserted at
    /// `path[1]`.
    fn grow_root<'a>(
        &'a self,
        path: &mut Vec<ExclusiveGuard<'a>>,
        pages: &mut SplitPages<'a>,
    ) -> Result<(), BTreeError> {
        let root = &mut path[0];
        let level = root.page().level();
        let kind = if root.page().is_leaf() {
            PageKind::Leaf
        } else {
            PageKind::Inner
        };
        let mut child = self.new_split_page(pages, kind, level)?;
        let child_id = child.page_id();
        child.page_mut().copy_contents_from(&root.page());
        let root_id = root.page_id();
        let mut root_page = root.page_mut();
        root_page.format(root_id, PageKind::Inner, level + 1, self.index_id);
        root_page.set_low_child(child_id);
        self.root_level_hint.store(level + 1, Ordering::Relaxed);
        self.stats.inner_splits.add(1);
        path.insert(1, child);
        Ok(())
    }
}

/// Unlinked pages latched for one split before it starts (see [`BTree::reserve_split_pages`]).
struct SplitPages<'a> {
    pages: Vec<ExclusiveGuard<'a>>,
}

/// How many new pages splitting the leaf at the end of `path` takes, when the separator it
/// pushes up is `separator_len` bytes: the new leaf, one for each held inner page that cannot
/// take the separator coming from below (counted as a longest key above the first, as
/// [`BTree::cascade_fits`] does, so the count is never short), and one more if the split
/// reaches the root, whose contents move to a new child. A root leaf moves down first and
/// its separator goes into the emptied root.
fn split_pages_needed(path: &[ExclusiveGuard<'_>], separator_len: usize) -> usize {
    if path.len() == 1 {
        return 2;
    }
    let mut pages = 1;
    let mut needed = inner_entry_bytes(separator_len);
    for node in path[..path.len() - 1].iter().rev() {
        if node.page().total_free_bytes() >= needed {
            return pages;
        }
        pages += 1;
        needed = inner_entry_bytes(MAX_KEY_BYTES);
    }
    pages + 1
}

/// Decides where a full leaf splits for a write of `key`.
///
/// The classic path splits SQL Server's way: a new empty page for an insert past the end of
/// the index, half the bytes otherwise. The default path also recognises a *nearly* ascending
/// insert (one that lands within the last eighth of a page's records, as identity values taken
/// before the insert do when sessions race) and splits at the insert point, so the left page
/// stays nearly full instead of half empty.
fn plan_leaf_split(
    leaf: &ExclusiveGuard<'_>,
    key: &[u8],
    mode: WriteMode<'_>,
    path: InsertPath,
) -> LeafSplitPlan {
    let page = leaf.page();
    let count = page.slot_count();
    let position = match page.search(key) {
        Ok(index) | Err(index) => index,
    };
    let append = mode == WriteMode::Insert && position == count && page.next() == NO_PAGE;
    let nearly_ascending = path == InsertPath::Default
        && mode == WriteMode::Insert
        && position >= 1
        && position < count
        && position >= count - (count / 8).max(1);
    let split_at = if append {
        count
    } else if nearly_ascending {
        ascending_split_point(count, position)
    } else if count == 1 {
        // One huge record: the new one goes on a page of its own, on the side its key
        // belongs to.
        position.min(1)
    } else {
        balanced_split_point(count, |i| page.record_bytes(i)).clamp(1, count - 1)
    };
    let separator = if split_at < count {
        page.key(split_at).to_vec()
    } else {
        key.to_vec()
    };
    LeafSplitPlan {
        split_at,
        separator,
        append,
    }
}

/// Where a page split by a nearly ascending insert at `position` divides: a little before the
/// insert point, so the left page keeps room for the stragglers (keys taken earlier but
/// arriving later) that still belong there, instead of splitting again for each of them.
pub(super) fn ascending_split_point(count: usize, position: usize) -> usize {
    position.saturating_sub(count / 16).max(1)
}

/// The first index at which the records before it hold at least half of the bytes.
fn balanced_split_point(count: usize, record_bytes: impl Fn(usize) -> usize) -> usize {
    let total: usize = (0..count).map(&record_bytes).sum();
    let mut before = 0;
    for index in 0..count {
        if 2 * before >= total {
            return index;
        }
        before += record_bytes(index);
    }
    count
}
