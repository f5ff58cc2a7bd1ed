//! The buffer pool: the page table and every page frame, with all access through latch guards.
//!
//! Today every page lives in memory for the life of the pool. The shape is the one a disk-backed
//! pool needs: pages are found by id through the page table, and code outside this module can
//! only touch a page's bytes through a [`SharedGuard`] or [`ExclusiveGuard`], which hold the
//! page's latch. The write-ahead-log work adds a data file, dirty-page flushing and eviction
//! behind [`BufferPool::latch_shared`] and friends without changing their callers.
//!
//! The page table is a two-level array: a fixed array of chunk slots, each filled once with a
//! chunk of `PAGE_TABLE_CHUNK_PAGES` frame slots, each filled once with a frame. Lookups are two
//! acquire loads and never take a lock; page allocation is one atomic increment plus one
//! initialisation of a `OnceLock`.

use std::cell::UnsafeCell;
use std::sync::OnceLock;

use crate::latch::{Latch, LatchClass, LatchMode, LatchPolicy};
use crate::limits::{MAX_PAGES, PAGE_SIZE_BYTES, PAGE_TABLE_CHUNK_PAGES};
use crate::page::{Page, PageBytes, PageId, PageKind, PageMut};
use crate::sync::{AtomicU32, Ordering};

/// One page in memory and its latch.
struct Frame {
    latch: Latch,
    bytes: UnsafeCell<PageBytes>,
}

// SAFETY: the page bytes are only reached through `SharedGuard` (which holds the frame's latch
// in shared or update mode, so nobody writes) and `ExclusiveGuard` (which holds it exclusively,
// so nobody else reads or writes). The latch itself is a thread-safe type.
unsafe impl Sync for Frame {}

type Chunk = Box<[OnceLock<Box<Frame>>]>;

/// The pool could not give out another page.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the buffer pool is full: all {max_pages} pages are in use")]
pub struct PoolFull {
    /// The pool's page limit.
    pub max_pages: usize,
}

/// The page table and frames of one database.
pub struct BufferPool {
    chunks: Box<[OnceLock<Chunk>]>,
    next_page_id: AtomicU32,
}

impl Default for BufferPool {
    fn default() -> Self {
        Self::new()
    }
}

impl BufferPool {
    /// An empty pool.
    pub fn new() -> Self {
        BufferPool {
            chunks: (0..MAX_PAGES / PAGE_TABLE_CHUNK_PAGES)
                .map(|_| OnceLock::new())
                .collect(),
            // Page 0 is `NO_PAGE`.
            next_page_id: AtomicU32::new(1),
        }
    }

    /// Pages allocated so far.
    pub fn page_count(&self) -> usize {
        self.next_page_id.load(Ordering::Relaxed).saturating_sub(1) as usize
    }

    fn frame(&self, page_id: PageId) -> &Frame {
        let index = page_id as usize;
        self.chunks
            .get(index / PAGE_TABLE_CHUNK_PAGES)
            .and_then(OnceLock::get)
            .and_then(|chunk| chunk[index % PAGE_TABLE_CHUNK_PAGES].get())
            .unwrap_or_else(|| panic!("page {page_id} is not allocated"))
    }

    /// Allocates a new page, formats it and returns it latched exclusively. Nobody else can
    /// reach the page until the caller links it into a tree.
    pub fn allocate(
        &self,
        policy: LatchPolicy,
        kind: PageKind,
        level: u8,
        index_id: u32,
    ) -> Result<ExclusiveGuard<'_>, PoolFull> {
        let page_id = self.next_page_id.fetch_add(1, Ordering::Relaxed);
        let index = page_id as usize;
        if index >= MAX_PAGES {
            self.next_page_id.fetch_sub(1, Ordering::Relaxed);
            return Err(PoolFull {
                max_pages: MAX_PAGES,
            });
        }
        let chunk = self.chunks[index / PAGE_TABLE_CHUNK_PAGES].get_or_init(|| {
            (0..PAGE_TABLE_CHUNK_PAGES)
                .map(|_| OnceLock::new())
                .collect()
        });
        let frame = Box::new(Frame {
            latch: Latch::new(policy, LatchClass::Buffer),
            bytes: UnsafeCell::new([0u8; PAGE_SIZE_BYTES]),
        });
        let installed = chunk[index % PAGE_TABLE_CHUNK_PAGES].set(frame).is_ok();
        assert!(installed, "page id {page_id} was handed out twice");
        let mut guard = self.latch_exclusive(page_id);
        guard.page_mut().format(page_id, kind, level, index_id);
        Ok(guard)
    }

    /// Latches a page in shared mode, waiting if a writer holds it.
    pub fn latch_shared(&self, page_id: PageId) -> SharedGuard<'_> {
        let frame = self.frame(page_id);
        frame.latch.acquire(LatchMode::Shared);
        SharedGuard { frame, page_id }
    }

    /// Latches a page exclusively, waiting for every other holder to leave.
    pub fn latch_exclusive(&self, page_id: PageId) -> ExclusiveGuard<'_> {
        let frame = self.frame(page_id);
        frame.latch.acquire(LatchMode::Exclusive);
        ExclusiveGuard { frame, page_id }
    }

    /// Latches a page exclusively if that is possible without waiting.
    pub fn try_latch_exclusive(&self, page_id: PageId) -> Option<ExclusiveGuard<'_>> {
        let frame = self.frame(page_id);
        // `then`, not `then_some`: a guard built eagerly would be dropped, releasing a latch
        // this thread does not hold, whenever the attempt fails.
        frame
            .latch
            .try_acquire(LatchMode::Exclusive)
            .then(|| ExclusiveGuard { frame, page_id })
    }

    /// The latch flavour of a page.
    pub fn latch_policy(&self, page_id: PageId) -> LatchPolicy {
        self.frame(page_id).latch.policy()
    }
}

/// A page latched in shared mode: readable by this and other readers, writable by nobody.
pub struct SharedGuard<'a> {
    frame: &'a Frame,
    page_id: PageId,
}

impl SharedGuard<'_> {
    /// The page's id.
    pub fn page_id(&self) -> PageId {
        self.page_id
    }

    /// The page's contents.
    pub fn page(&self) -> Page<'_> {
        // SAFETY: this guard holds the frame's latch in shared mode, so no exclusive guard (the
        // only writer) exists until it is dropped; shared references may coexist.
        Page::new(unsafe { &*self.frame.bytes.get() })
    }
}

impl Drop for SharedGuard<'_> {
    fn drop(&mut self) {
        self.frame.latch.release(LatchMode::Shared);
    }
}

/// A page latched exclusively: only this guard reads or writes it.
pub struct ExclusiveGuard<'a> {
    frame: &'a Frame,
    page_id: PageId,
}

impl<'a> ExclusiveGuard<'a> {
    /// The page's id.
    pub fn page_id(&self) -> PageId {
        self.page_id
    }

    /// The page's contents.
    pub fn page(&self) -> Page<'_> {
        // SAFETY: this guard holds the frame's latch exclusively, so no other guard exists;
        // the shared borrow of `self` stops `page_mut` from being called meanwhile.
        Page::new(unsafe { &*self.frame.bytes.get() })
    }

    /// The page's contents, writable.
    pub fn page_mut(&mut self) -> PageMut<'_> {
        // SAFETY: this guard holds the frame's latch exclusively, so no other guard exists;
        // the mutable borrow of `self` makes this the only reference through this guard.
        PageMut::new(unsafe { &mut *self.frame.bytes.get() })
    }

    /// Turns the exclusive latch into a shared one without letting any writer in between.
    pub fn downgrade(self) -> SharedGuard<'a> {
        let frame = self.frame;
        let page_id = self.page_id;
        std::mem::forget(self);
        frame.latch.downgrade();
        SharedGuard { frame, page_id }
    }
}

impl Drop for ExclusiveGuard<'_> {
    fn drop(&mut self) {
        self.frame.latch.release(LatchMode::Exclusive);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::page::PageKind;

    #[test]
    fn pages_are_reachable_by_id_and_writes_are_seen_by_later_readers() {
        let pool = BufferPool::new();
        let ids: Vec<PageId> = (0..3000)
            .map(|i| {
                let mut guard = pool
                    .allocate(LatchPolicy::Fifo, PageKind::Leaf, 0, 9)
                    .unwrap();
                guard
                    .page_mut()
                    .insert_leaf(0, &u32::to_be_bytes(i), b"v")
                    .unwrap();
                guard.page_id()
            })
            .collect();
        assert_eq!(pool.page_count(), 3000);
        std::thread::scope(|scope| {
            for _ in 0..4 {
                scope.spawn(|| {
                    for (i, id) in ids.iter().enumerate() {
                        let guard = pool.latch_shared(*id);
                        assert_eq!(guard.page().key(0), u32::to_be_bytes(i as u32));
                        assert_eq!(guard.page().index_id(), 9);
                    }
                });
            }
        });
        let exclusive = pool.latch_exclusive(ids[0]);
        assert!(pool.try_latch_exclusive(ids[0]).is_none());
        let shared = exclusive.downgrade();
        assert!(pool.try_latch_exclusive(ids[0]).is_none());
        drop(shared);
        assert!(pool.try_latch_exclusive(ids[0]).is_some());
    }
}
