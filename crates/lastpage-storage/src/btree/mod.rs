//! The B+tree: byte-string keys compared with `memcmp`, byte-string values, on latched pages.
//!
//! The layout of a tree:
//! - The root page never moves. When it must split, its contents move to a new child first
//!   (`BTree::grow_root`), so the root's id can be kept in the index descriptor for ever and no
//!   separate root pointer needs a latch.
//! - Inner pages hold separators; a child to the right of separator `s` holds keys `>= s`.
//! - Leaves are linked both ways (`prev`, `next`); the integrity checker verifies the links.
//! - A delete that empties a leaf other than the last one frees it, with any inner page left
//!   without a child (`reclaim.rs`); the last leaf and the root stay, and a leaf whose freeing
//!   gave up is listed and retried by a later delete or `BTree::free_left_empty_leaves`. A
//!   whole tree's pages are freed with `BTree::free_all_pages`, for a dropped table.
//!
//! The latch protocol (see `docs/latch-protocol.md`):
//! - Latches are taken top-down, and at one level only left to right, so no two threads can
//!   wait for each other in a cycle.
//! - Reads couple shared latches down to the leaf.
//! - The classic insert couples shared latches down to the leaf's parent and takes the leaf
//!   exclusively. If the leaf is full it restarts, couples shared latches down to the parent of
//!   the leaf, and takes the parent and the leaf exclusively ("on a split, EX on the parent"). If
//!   the parent could not take another separator either, it restarts once more with exclusive
//!   latch coupling from the root, releasing every ancestor above a node that can absorb a split.
//! - Splits are SQL Server's: an insert past the last key of the last leaf starts a new, empty
//!   page instead of moving half the rows, so ascending loads leave every page full.

mod append;
mod check;
mod cursor;
pub mod flow_control;
mod free;
mod lanes;
mod reclaim;
mod write;

use std::sync::Arc;

pub use append::{GeneratedKeyError, batch_item_range};
pub use check::{IntegrityError, TreeCheck};
pub use cursor::{Direction, RangeIter};

use crossbeam_utils::CachePadded;

use crate::buffer::{BufferPool, ExclusiveGuard, PageError, PoolFull, SharedGuard};
use crate::latch::{Latch, LatchClass, LatchPolicy};
use crate::limits::{LEAF_RECORD_HEADER_BYTES, MAX_KEY_BYTES, MAX_RECORD_BYTES};
use crate::page::{NO_PAGE, Page, PageId, PageKind};
use crate::sync::{AtomicU8, AtomicU32, AtomicU64, Mutex, Ordering};

pub use write::{CompareAndUpdate, StripedCounter};

use flow_control::FlowControl;

/// How an index inserts rows. Every path keeps the same tree layout, so an index can change
/// path at run time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum InsertPath {
    /// Latch coupling from the root for every insert: SH on inner pages, EX on the leaf, EX on
    /// the parent for a split. Reproduces last-page contention.
    Classic,
    /// Ours: an insert past the last key goes straight to the cached last leaf, which it takes
    /// without queueing behind other appenders; everything else takes the classic path.
    #[default]
    Default,
}

impl InsertPath {
    /// Every path, in display order.
    pub const ALL: [InsertPath; 2] = [InsertPath::Classic, InsertPath::Default];

    /// The name used on command lines.
    pub fn name(self) -> &'static str {
        match self {
            InsertPath::Classic => "classic",
            InsertPath::Default => "default",
        }
    }

    /// Looks a path up by its command-line name (case-insensitive).
    pub fn from_name(name: &str) -> Option<InsertPath> {
        Self::ALL
            .into_iter()
            .find(|path| path.name().eq_ignore_ascii_case(name.trim()))
    }

    fn code(self) -> u8 {
        match self {
            InsertPath::Classic => 0,
            InsertPath::Default => 1,
        }
    }

    fn from_code(code: u8) -> InsertPath {
        if code == 0 {
            InsertPath::Classic
        } else {
            InsertPath::Default
        }
    }
}

/// How a tree is built.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct TreeOptions {
    /// The latch flavour of every page of the tree.
    pub latch_policy: LatchPolicy,
    /// How inserts reach the leaf.
    pub insert_path: InsertPath,
    /// OPTIMIZE_FOR_SEQUENTIAL_KEY: flow control at the entrance of the insert path.
    pub optimize_for_sequential_key: bool,
}

/// Errors of tree operations that callers can cause.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BTreeError {
    /// The key is already in the tree.
    #[error("duplicate key")]
    DuplicateKey,
    /// The key is longer than the tree accepts.
    #[error("the key is {len} bytes, but keys are limited to {max} bytes")]
    KeyTooLarge {
        /// Length of the key, in bytes.
        len: usize,
        /// The limit, in bytes.
        max: usize,
    },
    /// Key and value together exceed the record limit.
    #[error("the record is {len} bytes, which exceeds the maximum row size of {max} bytes")]
    RecordTooLarge {
        /// Length of key, value and record header, in bytes.
        len: usize,
        /// The limit, in bytes.
        max: usize,
    },
    /// The buffer pool has no more pages.
    #[error(transparent)]
    PoolFull(#[from] PoolFull),
    /// A page could not be read from (or written to) the data file, or is corrupt there.
    #[error(transparent)]
    Storage(PageError),
    /// A caller's key maker made keys that do not fit the batch it was asked for (a bug in the
    /// caller; nothing was inserted).
    #[error("invalid batch: {0}")]
    InvalidBatch(String),
}

impl From<PageError> for BTreeError {
    fn from(error: PageError) -> Self {
        match error {
            // Callers already handle a full pool as its own error; keep it that way.
            PageError::PoolFull { max_pages } => BTreeError::PoolFull(PoolFull { max_pages }),
            other => BTreeError::Storage(other),
        }
    }
}

/// The error for a page that is intact but not what the tree's structure says it is.
fn corrupt(page: PageId, reason: String) -> BTreeError {
    BTreeError::Storage(PageError::Corrupt { page, reason })
}

/// Checks a key and value against the size limits.
pub fn check_record_size(key: &[u8], value: &[u8]) -> Result<(), BTreeError> {
    if key.len() > MAX_KEY_BYTES {
        return Err(BTreeError::KeyTooLarge {
            len: key.len(),
            max: MAX_KEY_BYTES,
        });
    }
    let len = LEAF_RECORD_HEADER_BYTES + key.len() + value.len();
    if len > MAX_RECORD_BYTES {
        return Err(BTreeError::RecordTooLarge {
            len,
            max: MAX_RECORD_BYTES,
        });
    }
    Ok(())
}

/// Counters a tree keeps about itself.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TreeStats {
    /// Leaf splits that moved rows (a page split in SQL Server's sense).
    pub leaf_splits: u64,
    /// Leaf splits at the end of the index that started a new empty page.
    pub leaf_appends: u64,
    /// Inner page splits, root growth included.
    pub inner_splits: u64,
    /// Inserts that found the leaf full and restarted on the split path.
    pub split_restarts: u64,
    /// Leaves that deletes emptied and that were unlinked and freed.
    pub leaves_freed: u64,
    /// Inner pages freed with them, having lost their only child.
    pub inner_pages_freed: u64,
    /// Leaves that deletes emptied and whose freeing gave up (the left sibling changed or was
    /// busy at every attempt) or failed, leaving them linked and empty, to be retried.
    pub empty_leaves_left: u64,
    /// Leaves of those that a retry freed (they count in `leaves_freed` too).
    pub empty_leaves_retried_freed: u64,
    /// Leaves left while the list of leaves to retry was full, which stay, empty, until rows
    /// go into them and a delete empties them again (see `limits::LEFTOVER_EMPTY_LEAVES_MAX`).
    pub empty_leaves_not_listed: u64,
}

impl std::ops::AddAssign for TreeStats {
    fn add_assign(&mut self, other: TreeStats) {
        self.leaf_splits += other.leaf_splits;
        self.leaf_appends += other.leaf_appends;
        self.inner_splits += other.inner_splits;
        self.split_restarts += other.split_restarts;
        self.leaves_freed += other.leaves_freed;
        self.inner_pages_freed += other.inner_pages_freed;
        self.empty_leaves_left += other.empty_leaves_left;
        self.empty_leaves_retried_freed += other.empty_leaves_retried_freed;
        self.empty_leaves_not_listed += other.empty_leaves_not_listed;
    }
}

/// One B+tree.
pub struct BTree {
    pool: Arc<BufferPool>,
    root: PageId,
    index_id: u32,
    latch_policy: LatchPolicy,
    /// The current [`InsertPath`], switchable at run time.
    insert_path: AtomicU8,
    /// The last leaf as last seen by the default insert path (see `append.rs`). A hint only:
    /// it is checked under the leaf's latch before it is trusted.
    tail_hint: AtomicU32,
    /// The parent of the last leaf as last seen, so that an append that fills the last leaf
    /// can split it without a descent. Also only a hint.
    tail_parent_hint: AtomicU32,
    /// [`append::key_prefix`] of the last leaf's first key as last seen: keys below it cannot
    /// be appends.
    tail_first_key_prefix: AtomicU64,
    /// Serialises the default path's appenders (see `append.rs`). On a cache line of its own:
    /// appenders write it twice each, and every insert reads the fields around it (the insert
    /// path, the hints, flow control), which would otherwise miss after each of those writes.
    tail_gate: CachePadded<Latch>,
    /// The length of the last key `insert_with_generated_key` made, 0 before the first: the
    /// placeholder length for rows copied into their own page before their key is known (see
    /// `append.rs`).
    generated_key_len: AtomicU32,
    /// The sequence lanes of `insert_with_sequence_key` (see `lanes.rs`).
    lanes: lanes::Lanes,
    /// OPTIMIZE_FOR_SEQUENTIAL_KEY (see `flow_control.rs`).
    flow_control: FlowControl,
    /// Formatted, unlinked leaves allocated ahead of a split of the last leaf, so the default
    /// path does not allocate while holding the tail gate (see `append.rs`). At most a few.
    spare_leaves: Mutex<Vec<PageId>>,
    /// How many leaves deletes emptied and `reclaim.rs` freed. Sequence lanes compare it to
    /// trust a page id they remember (see `lanes.rs`).
    leaves_freed: AtomicU64,
    /// Emptied leaves whose freeing gave up, to be retried (see `reclaim.rs`).
    leftover_empty_leaves: reclaim::LeftoverEmptyLeaves,
    /// The root's level as last seen. Levels only grow, so a stale value is only ever too low;
    /// it saves a shared-then-exclusive double latch while the root is still a leaf.
    root_level_hint: AtomicU8,
    rows: StripedCounter,
    stats: write::SplitCounters,
}

impl BTree {
    /// Creates an empty tree whose root is a fresh leaf.
    pub fn create(
        pool: Arc<BufferPool>,
        index_id: u32,
        options: TreeOptions,
    ) -> Result<BTree, PoolFull> {
        let root = pool
            .allocate(options.latch_policy, PageKind::Leaf, 0, index_id)?
            .page_id();
        Ok(Self::open(pool, index_id, root, options, 0))
    }

    /// Reattaches a tree that already exists in `pool` (after the pool was reopened from its
    /// data file) from its root page. Nothing is read here: the hints start at the root, and
    /// every hint is checked under a latch before it is trusted; the first append finds the
    /// stale tail hint and looks for the real last leaf (see `BTree::latch_tail`).
    /// `row_count` is what the caller recorded with the checkpoint.
    pub fn open(
        pool: Arc<BufferPool>,
        index_id: u32,
        root: PageId,
        options: TreeOptions,
        row_count: u64,
    ) -> BTree {
        let rows = StripedCounter::default();
        rows.add(i64::try_from(row_count).unwrap_or(i64::MAX));
        BTree {
            pool,
            root,
            index_id,
            latch_policy: options.latch_policy,
            insert_path: AtomicU8::new(options.insert_path.code()),
            tail_hint: AtomicU32::new(root),
            tail_parent_hint: AtomicU32::new(NO_PAGE),
            tail_first_key_prefix: AtomicU64::new(0),
            tail_gate: CachePadded::new(Latch::new(LatchPolicy::Adaptive, LatchClass::Buffer)),
            spare_leaves: Mutex::new(Vec::new()),
            generated_key_len: AtomicU32::new(0),
            lanes: lanes::Lanes::default(),
            flow_control: FlowControl::new(
                std::thread::available_parallelism().map_or(1, usize::from),
                options.optimize_for_sequential_key,
            ),
            leaves_freed: AtomicU64::new(0),
            leftover_empty_leaves: reclaim::LeftoverEmptyLeaves::new(),
            root_level_hint: AtomicU8::new(0),
            rows,
            stats: write::SplitCounters::default(),
        }
    }

    /// The tree's OPTIMIZE_FOR_SEQUENTIAL_KEY flow control (for tests and diagnostics).
    pub fn flow_control(&self) -> &FlowControl {
        &self.flow_control
    }

    /// The root page's id.
    pub fn root(&self) -> PageId {
        self.root
    }

    /// The index id stamped on every page of the tree.
    pub fn index_id(&self) -> u32 {
        self.index_id
    }

    /// The tree's latch flavour, current insert path and flow control setting.
    pub fn options(&self) -> TreeOptions {
        TreeOptions {
            latch_policy: self.latch_policy,
            insert_path: self.insert_path(),
            optimize_for_sequential_key: self.flow_control.is_enabled(),
        }
    }

    /// Switches OPTIMIZE_FOR_SEQUENTIAL_KEY on or off, without a rebuild.
    pub fn set_optimize_for_sequential_key(&self, enabled: bool) {
        self.flow_control.set_enabled(enabled);
    }

    /// The current insert path.
    pub fn insert_path(&self) -> InsertPath {
        InsertPath::from_code(self.insert_path.load(Ordering::Relaxed))
    }

    /// Switches the insert path. Both paths keep the same layout, so this takes effect for the
    /// next insert without any rebuild.
    pub fn set_insert_path(&self, path: InsertPath) {
        self.insert_path.store(path.code(), Ordering::Relaxed);
    }

    /// The buffer pool the tree lives in.
    pub fn pool(&self) -> &Arc<BufferPool> {
        &self.pool
    }

    /// Rows in the tree. Exact when no write is in flight.
    pub fn row_count(&self) -> u64 {
        u64::try_from(self.rows.sum()).unwrap_or(0)
    }

    /// Split counters.
    pub fn stats(&self) -> TreeStats {
        self.stats.snapshot()
    }

    /// Whether `page` is what every descent relies on before it reads a page as a node of this
    /// tree: it belongs to this index, its kind agrees with its level (a leaf at level 0, an
    /// inner page above, with a low child), and its level is `expected_level` when the caller
    /// knows it (a child's is one below its parent's). Pages read from the data file have
    /// passed their checksum and [`Page::check_layout`], but a page that is intact and still not
    /// what its parent names (a stale or misdirected write, a bad link) must stop the operation:
    /// read as a node it would send a descent round a cycle, into another index, or into a page
    /// of the wrong kind. Because a child must sit exactly one level below its parent, every
    /// descent that checks its children ends within the root's level + 1 steps. The integrity
    /// checker applies the same predicate to every page it visits.
    #[inline]
    fn is_node(&self, page: &Page<'_>, expected_level: Option<u8>) -> bool {
        let level = page.level();
        let kind_fits = match page.kind() {
            Some(PageKind::Leaf) => level == 0,
            Some(PageKind::Inner) => level > 0 && page.low_child() != NO_PAGE,
            _ => false,
        };
        page.index_id() == self.index_id
            && kind_fits
            && expected_level.is_none_or(|expected| level == expected)
    }

    /// [`BTree::is_node`] as a `Corrupt` error.
    #[inline]
    fn check_node(&self, page: &Page<'_>, expected_level: Option<u8>) -> Result<(), BTreeError> {
        if self.is_node(page, expected_level) {
            return Ok(());
        }
        Err(corrupt(
            page.page_id(),
            self.not_a_node(page, expected_level),
        ))
    }

    /// Why [`BTree::is_node`] refused `page`: out of line, so that formatting it does not weigh
    /// on every descent (inlined, it cost the classic insert about 90 instructions per row).
    #[cold]
    #[inline(never)]
    fn not_a_node(&self, page: &Page<'_>, expected_level: Option<u8>) -> String {
        let kind = match page.kind() {
            Some(PageKind::Leaf) => "leaf",
            Some(PageKind::Inner) if page.low_child() == NO_PAGE => {
                "inner page without a low child"
            }
            Some(PageKind::Inner) => "inner page",
            Some(PageKind::Free) => "free page",
            None => "page of no valid kind",
        };
        format!(
            "reached as a node of index {} at level {}, it is a {kind} of index {} at level {}",
            self.index_id,
            expected_level.map_or_else(|| "any".to_owned(), |level| level.to_string()),
            page.index_id(),
            page.level()
        )
    }

    /// Latches the root in shared mode and checks it.
    fn root_shared(&self) -> Result<SharedGuard<'_>, BTreeError> {
        let root = self.pool.latch_shared(self.root)?;
        self.check_node(&root.page(), None)?;
        Ok(root)
    }

    /// Latches the root exclusively and checks it. Nothing is held above the root, so this
    /// cannot wait for a latch its own thread holds.
    fn root_exclusive(&self) -> Result<ExclusiveGuard<'_>, BTreeError> {
        let root = self.pool.latch_exclusive(self.root)?;
        self.check_node(&root.page(), None)?;
        Ok(root)
    }

    /// Latches `child`, named by the inner page `parent`, in shared mode and checks that it
    /// sits one level below it.
    fn child_shared(
        &self,
        parent: &Page<'_>,
        child: PageId,
    ) -> Result<SharedGuard<'_>, BTreeError> {
        let guard = self.pool.latch_shared(child)?;
        self.check_node(&guard.page(), Some(parent.level() - 1))?;
        Ok(guard)
    }

    /// Latches `child`, named by the inner page `parent`, exclusively and checks that it sits
    /// one level below it; see [`BTree::node_exclusive`] for `held`.
    fn child_exclusive(
        &self,
        parent: &Page<'_>,
        child: PageId,
        held: impl IntoIterator<Item = PageId>,
    ) -> Result<ExclusiveGuard<'_>, BTreeError> {
        self.node_exclusive(child, parent.level() - 1, parent.page_id(), held)
    }

    /// Latches `page`, which the page `named_by` links to, exclusively and checks that it is a
    /// node of this tree at `level`. `held` are the pages this thread has latched: a corrupt
    /// link to one of them is refused before the latch is requested, since waiting for a latch
    /// this thread holds would never end.
    fn node_exclusive(
        &self,
        page: PageId,
        level: u8,
        named_by: PageId,
        held: impl IntoIterator<Item = PageId>,
    ) -> Result<ExclusiveGuard<'_>, BTreeError> {
        if held.into_iter().any(|held| held == page) {
            return Err(corrupt(
                named_by,
                format!("links to page {page}, which this thread already holds"),
            ));
        }
        let guard = self.pool.latch_exclusive(page)?;
        self.check_node(&guard.page(), Some(level))?;
        Ok(guard)
    }

    /// Latches the leaf that covers `key` in shared mode, coupling shared latches down.
    fn leaf_shared(&self, key: &[u8]) -> Result<SharedGuard<'_>, BTreeError> {
        let mut node = self.root_shared()?;
        while !node.page().is_leaf() {
            let (child, _) = node.page().child_for(key);
            node = self.child_shared(&node.page(), child)?;
        }
        Ok(node)
    }

    /// Latches the leaf that covers `key` exclusively: shared latches down to its parent, then
    /// the leaf exclusively.
    fn leaf_exclusive(&self, key: &[u8]) -> Result<ExclusiveGuard<'_>, BTreeError> {
        self.leaf_exclusive_observing(key, |_, _| {})
    }

    /// Like [`BTree::leaf_exclusive`], and also returns the leaf's high fence: the separator
    /// above which keys belong to the next leaf (`None` for the last leaf).
    fn leaf_exclusive_with_high_fence(
        &self,
        key: &[u8],
    ) -> Result<(ExclusiveGuard<'_>, Option<Vec<u8>>), BTreeError> {
        let mut high: Option<Vec<u8>> = None;
        let leaf = self.leaf_exclusive_observing(key, |page, chosen| {
            let next_separator = chosen.map_or(0, |index| index + 1);
            if next_separator < page.slot_count() {
                high = Some(page.key(next_separator).to_vec());
            }
        })?;
        Ok((leaf, high))
    }

    /// The descent of [`BTree::leaf_exclusive`]; `observe` sees every inner page on the way and
    /// the separator index taken there (`None` for the low child). It may be called for pages
    /// of an abandoned attempt, so it must overwrite rather than accumulate.
    fn leaf_exclusive_observing(
        &self,
        key: &[u8],
        mut observe: impl FnMut(&Page<'_>, Option<usize>),
    ) -> Result<ExclusiveGuard<'_>, BTreeError> {
        self.leaf_exclusive_choosing(|page| {
            let (child, chosen) = page.child_for(key);
            observe(page, chosen);
            child
        })
    }

    /// Latches a leaf exclusively: shared latch coupling from the root down to the leaf's
    /// parent, taking at each inner page the child `choose` picks, then the leaf exclusively
    /// (the root itself, exclusively, while it is a leaf). `choose` may be called for pages of
    /// an abandoned attempt.
    pub(super) fn leaf_exclusive_choosing(
        &self,
        mut choose: impl FnMut(&Page<'_>) -> PageId,
    ) -> Result<ExclusiveGuard<'_>, BTreeError> {
        loop {
            if self.root_level_hint.load(Ordering::Relaxed) == 0 {
                let root = self.root_exclusive()?;
                if root.page().is_leaf() {
                    return Ok(root);
                }
                self.root_level_hint
                    .store(root.page().level(), Ordering::Relaxed);
                continue;
            }
            let mut node = self.root_shared()?;
            if node.page().is_leaf() {
                // Only possible if the hint was wrong, which it cannot be (levels only grow,
                // and the root is never freed), but restarting costs nothing and keeps the loop
                // obviously correct.
                self.root_level_hint.store(0, Ordering::Relaxed);
                continue;
            }
            loop {
                let page = node.page();
                let child = choose(&page);
                if page.level() == 1 {
                    return self.child_exclusive(&page, child, [node.page_id()]);
                }
                node = self.child_shared(&page, child)?;
            }
        }
    }

    /// Looks `key` up and passes its value to `read` while the leaf is latched.
    pub fn get_with<R>(
        &self,
        key: &[u8],
        read: impl FnOnce(&[u8]) -> R,
    ) -> Result<Option<R>, BTreeError> {
        let leaf = self.leaf_shared(key)?;
        let page = leaf.page();
        Ok(page.search(key).ok().map(|index| read(page.value(index))))
    }

    /// Looks `key` up and returns a copy of its value.
    pub fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, BTreeError> {
        self.get_with(key, <[u8]>::to_vec)
    }

    /// Removes `key` and returns its value, or `None` if it was not there. A leaf the delete
    /// empties is freed (see `reclaim.rs`), unless it is the last leaf; if that freeing gives
    /// up, the leaf is listed and a later delete frees it. Then, with no latch held, the delete
    /// retries the oldest leaf an earlier delete had to leave, if any.
    pub fn delete(&self, key: &[u8]) -> Result<Option<Vec<u8>>, BTreeError> {
        let (old, emptied) = {
            let mut leaf = self.leaf_exclusive(key)?;
            match leaf.page().search(key) {
                Err(_) => (None, false),
                Ok(index) => {
                    let old = leaf.page().value(index).to_vec();
                    leaf.page_mut().remove(index);
                    let emptied = leaf.page().slot_count() == 0 && leaf.page().next() != NO_PAGE;
                    (Some(old), emptied)
                }
            }
        };
        if old.is_some() {
            self.rows.add(-1);
        }
        // The row is gone whatever the freeing comes to (see `BTree::free_emptied_leaf`). A
        // delete that just had to leave its own leaf does not retry older ones: whatever kept
        // changing under its attempts is likely still at work.
        let left_its_leaf = emptied && self.free_emptied_leaf(key);
        if !left_its_leaf {
            self.retry_oldest_leftover_empty_leaf();
        }
        Ok(old)
    }
}
