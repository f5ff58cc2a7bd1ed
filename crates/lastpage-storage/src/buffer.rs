//! The buffer pool: the page table and every page frame, with all access through latch guards.
//!
//! A pool is either memory-only ([`BufferPool::new`]: unbounded, every page resident for the
//! life of the pool, as fast as a plain array of pages) or backed by a data file
//! ([`BufferPool::open_file`]): then a memory budget bounds the resident pages, pages missing
//! from memory are read on demand, and checkpoints write shadow-paged images
//! (`docs/data-file.md`). Code outside this module only touches a page's bytes through a
//! [`SharedGuard`] or [`ExclusiveGuard`], which hold the page's latch.
//!
//! The page table is a two-level array: a fixed array of chunk slots, each filled once with a
//! chunk of `PAGE_TABLE_CHUNK_PAGES` frame slots, each filled once with a frame. Lookups are two
//! acquire loads and never take a lock; page allocation is one atomic increment plus one
//! initialisation of a `OnceLock`.
//!
//! A frame stays allocated for ever; its 8 KiB of bytes come and go. A freed page
//! ([`BufferPool::free_pages`]) keeps its frame, marked free, and its id, which a later
//! allocation hands out again. The bytes pointer is only
//! changed by a thread that holds the frame's latch exclusively (loading a page on a miss, or
//! evicting it), and only read by a thread that holds the latch in some mode, so the latch alone
//! orders every access to it: the latch doubles as the pin, and a latched page cannot be evicted.
//! The frame's other metadata (dirty, slot, CRC) follows the same rule; those fields are atomics
//! only so that a checkpoint (one at a time) may update them under a shared latch, which keeps
//! writers out of that page. The CLOCK `referenced` bit and the `resident` flag are hints read
//! without the latch and rechecked under it. A new page's frame is latched exclusively before
//! the page table shows it (`BufferPool::allocate`), so no frame is ever visible with bytes and
//! without a holder who put them there. Because this protocol adds no synchronization of its
//! own beyond the latch (which `tests/latch_loom.rs` model-checks), it has no loom model of its
//! own. (Allocation once broke the rule: it published the frame, with its bytes, and latched it
//! a moment later, and an eviction sweep that tried the latch in between took the new page.)

use std::cell::UnsafeCell;
use std::path::Path;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU32 as PlainU32, AtomicU64, AtomicUsize};
use std::sync::{Arc, Mutex, OnceLock};

use lastpage_io::{FileSystem, OpenOptions};

use crate::datafile::{DataFile, PageWrite, refused};
use crate::latch::{Latch, LatchClass, LatchMode, LatchPolicy};
use crate::limits::{
    CHECKPOINT_WRITE_BATCH_PAGES, DEFAULT_MEMORY_BUDGET_BYTES, EVICTION_BATCH_PAGES, MAX_PAGES,
    MAX_POOL_PAGES, PAGE_SIZE_BYTES, PAGE_TABLE_CHUNK_PAGES,
};
use crate::page::{Page, PageBytes, PageId, PageKind, PageMut};
use crate::page_memory::PageMemory;
use crate::sync::{AtomicU32, Ordering};

/// One page's frame: its latch, its bytes while resident, and what the pool knows about it.
struct Frame {
    latch: Latch,
    /// The page's bytes, or null while the page is not resident: a buffer of the pool's
    /// [`PageMemory`], which the frame holds from install to discard; changed only under the
    /// exclusive latch, read only under the latch.
    bytes: UnsafeCell<*mut PageBytes>,
    /// A hint for the eviction sweep, kept equal to `!bytes.is_null()` under the exclusive
    /// latch and rechecked under the latch before it is trusted.
    resident: AtomicBool,
    /// The bytes differ from what the page's slot holds (or it has no slot yet).
    dirty: AtomicBool,
    /// The CLOCK bit: set on every latch, cleared by the eviction sweep.
    referenced: AtomicBool,
    /// The data-file slot holding the page's last written image (0 = none).
    slot: PlainU32,
    /// CRC32C of the bytes in `slot`.
    crc: PlainU32,
    /// The page was freed ([`BufferPool::free_pages`]) and is on the pool's free list: it has
    /// no bytes and no slot, and a latch of it is refused until an allocation hands it out
    /// again. Changed only under the exclusive latch, read only under the latch.
    free: AtomicBool,
}

// SAFETY: the page bytes (and the pointer to them) are only reached through `SharedGuard`
// (which holds the frame's latch in shared mode, so nobody writes), `ExclusiveGuard` or the
// pool's load and eviction paths (which hold it exclusively, so nobody else reads or writes),
// and a checkpoint's `write_frames` (which holds it in shared mode, so nobody writes).
// Every other field is an atomic or a thread-safe latch.
unsafe impl Sync for Frame {}
// SAFETY: the frame holds its page buffer (taken from the pool's page memory) exclusively;
// moving the frame moves that hold.
unsafe impl Send for Frame {}

impl Frame {
    fn new(policy: LatchPolicy, bytes: Option<NonNull<PageBytes>>, slot: u32, crc: u32) -> Frame {
        let resident = bytes.is_some();
        Frame {
            latch: Latch::new(policy, LatchClass::Buffer),
            bytes: UnsafeCell::new(bytes.map_or(std::ptr::null_mut(), NonNull::as_ptr)),
            resident: AtomicBool::new(resident),
            dirty: AtomicBool::new(false),
            referenced: AtomicBool::new(true),
            slot: PlainU32::new(slot),
            crc: PlainU32::new(crc),
            free: AtomicBool::new(false),
        }
    }

    /// A frame for a page that is free in the data file's image (see
    /// [`BufferPool::free_pages`]).
    fn new_free(policy: LatchPolicy) -> Frame {
        let frame = Frame::new(policy, None, 0, 0);
        frame.free.store(true, Ordering::Relaxed);
        frame
    }

    /// The bytes pointer. The caller must hold the latch in some mode.
    #[inline]
    fn bytes_ptr(&self) -> *mut PageBytes {
        // SAFETY: the caller holds the latch, so no thread is changing the pointer (that needs
        // the latch exclusively, and an exclusive holder is this caller if anyone).
        unsafe { *self.bytes.get() }
    }

    /// Sets the CLOCK bit, writing only if it is clear so that readers of a hot page do not
    /// bounce its cache line.
    #[inline]
    fn touch(&self) {
        if !self.referenced.load(Ordering::Relaxed) {
            self.referenced.store(true, Ordering::Relaxed);
        }
    }

    /// Installs `bytes` as the page's contents. The caller holds the latch exclusively and the
    /// page is not resident.
    fn install(&self, bytes: NonNull<PageBytes>) {
        // SAFETY: the caller holds the latch exclusively, so nobody else reads or writes the
        // pointer; the old value is null, so no buffer is lost.
        unsafe { *self.bytes.get() = bytes.as_ptr() };
        self.resident.store(true, Ordering::Relaxed);
    }

    /// Takes the page's bytes away and returns the buffer, for the caller to give back to the
    /// page memory. The caller holds the latch exclusively and the page is resident.
    fn discard(&self) -> Option<NonNull<PageBytes>> {
        // SAFETY: the caller holds the latch exclusively, so nobody else reads or writes the
        // pointer, and it is replaced by null before anyone can see it again.
        let bytes = unsafe { std::mem::replace(&mut *self.bytes.get(), std::ptr::null_mut()) };
        self.resident.store(false, Ordering::Relaxed);
        NonNull::new(bytes)
    }
}

type Chunk = Box<[OnceLock<Box<Frame>>]>;

/// The pool's free pages, one list per latch flavour: a frame's latch keeps the flavour it was
/// made with, so a page is reused by an index of that flavour (by one of the other flavour
/// only at the page limit, see `BufferPool::allocate`).
#[derive(Default)]
struct FreePages {
    fifo: Vec<PageId>,
    adaptive: Vec<PageId>,
}

impl FreePages {
    fn of(&mut self, policy: LatchPolicy) -> &mut Vec<PageId> {
        match policy {
            LatchPolicy::Fifo => &mut self.fifo,
            LatchPolicy::Adaptive => &mut self.adaptive,
        }
    }
}

std::thread_local! {
    /// Whether this thread's allocations may go past the pool's configured page limit, up to
    /// `MAX_POOL_PAGES` (see [`past_page_limit`]).
    static PAST_PAGE_LIMIT: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `work` with this thread's page allocations held only to `MAX_POOL_PAGES`, not to the pool's
/// configured limit: for work that must not fail for want of room, such as a rollback putting
/// back rows it deleted, whose room a later insert may have taken. (Without ghost records a
/// deleted row's room is free at once, so an undo can need a split.)
pub fn past_page_limit<R>(work: impl FnOnce() -> R) -> R {
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            PAST_PAGE_LIMIT.set(self.0);
        }
    }
    let _restore = Restore(PAST_PAGE_LIMIT.replace(true));
    work()
}

/// The pool could not give out another page.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the buffer pool is full: all {max_pages} pages are in use")]
pub struct PoolFull {
    /// The pool's page limit.
    pub max_pages: usize,
}

/// Why a page could not be latched or the data file could not be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PageError {
    /// The pool has no more page ids.
    #[error("the buffer pool is full: all {max_pages} pages are in use")]
    PoolFull {
        /// The pool's page limit.
        max_pages: usize,
    },
    /// Reading or writing the data file failed (page 0: the file itself).
    #[error("I/O error on page {page} of the data file: {message}")]
    Io {
        /// The page concerned, or 0 for the file as a whole.
        page: PageId,
        /// What failed.
        message: String,
    },
    /// The data file holds something other than what was written (a checksum mismatch, an
    /// impossible slot or page number).
    #[error("page {page} of the data file is corrupt: {reason}")]
    Corrupt {
        /// The page concerned, or 0 for the file as a whole.
        page: PageId,
        /// What is wrong.
        reason: String,
    },
}

impl From<PoolFull> for PageError {
    fn from(full: PoolFull) -> Self {
        PageError::PoolFull {
            max_pages: full.max_pages,
        }
    }
}

/// How a file-backed pool is sized.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolConfig {
    /// How many bytes of page buffers may be resident (rounded down to whole pages, at least
    /// `MIN_BUDGET_PAGES` pages). A soft limit: when every resident page is latched, a
    /// thread that needs a frame goes over it rather than wait.
    pub memory_budget_bytes: usize,
    /// The pool's page limit: the most pages it holds (page ids 1 to this), after which an
    /// allocation fails with [`PoolFull`] (SQL Server's MAXSIZE, in pages). At most
    /// [`MAX_POOL_PAGES`]; a larger value counts as that. A lower one lets a database be capped, and lets tests reach a full
    /// database without writing 128 GiB.
    pub max_pages: usize,
}

impl Default for PoolConfig {
    fn default() -> Self {
        PoolConfig {
            memory_budget_bytes: DEFAULT_MEMORY_BUDGET_BYTES,
            max_pages: MAX_POOL_PAGES,
        }
    }
}

/// Counters of a pool.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Pages whose bytes are in memory.
    pub resident: usize,
    /// Resident pages changed since they were last written.
    pub dirty: usize,
    /// The budget, in pages (`usize::MAX` for a memory-only pool).
    pub budget: usize,
    /// Pages read from the data file.
    pub reads: u64,
    /// Pages written to the data file (by eviction and by checkpoints).
    pub writes: u64,
    /// Pages evicted.
    pub evictions: u64,
    /// Eviction writes (or write hooks) that failed; the page stayed in memory.
    pub eviction_failures: u64,
}

/// What a finished checkpoint did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CheckpointStats {
    /// The generation of the new durable image.
    pub generation: u64,
    /// Pages in the image.
    pub pages: usize,
    /// Dirty pages the capture wrote.
    pub pages_written: usize,
    /// Slots of the previous image that became free.
    pub slots_freed: usize,
    /// The data file's size in slots.
    pub file_slots: u32,
}

/// The hook run before dirty pages are written: the engine flushes its write-ahead log there.
pub type BeforeWriteHook = Box<dyn Fn() -> Result<(), String> + Send + Sync>;

/// The installed hook, shared so that it can be called without holding the pool's mutex.
type SharedHook = Arc<dyn Fn() -> Result<(), String> + Send + Sync>;

/// The page table and frames of one database.
pub struct BufferPool {
    chunks: Box<[OnceLock<Chunk>]>,
    next_page_id: AtomicU32,
    /// Pages freed and not handed out again (see [`BufferPool::free_pages`]).
    free_pages: Mutex<FreePages>,
    /// How many pages `free_pages` holds: read without its lock, so that an allocation takes
    /// the lock only when there may be a page to reuse.
    free_page_count: AtomicUsize,
    /// The most pages (see [`PoolConfig::max_pages`]); at most [`MAX_POOL_PAGES`]. Not part of any
    /// protocol: an allocation racing a change of it may see either value.
    max_pages: AtomicUsize,
    /// Pages whose bytes are in memory (and frames reserved for pages being loaded).
    resident: AtomicUsize,
    /// The budget in pages; `usize::MAX` for a memory-only pool, so the check never fires.
    budget_pages: usize,
    file: Option<Arc<DataFile>>,
    /// The CLOCK hand; held while a thread picks victims, so one thread sweeps at a time (the
    /// victims are written and evicted after it is released).
    evictor: Mutex<usize>,
    before_write: Mutex<Option<SharedHook>>,
    reads: AtomicU64,
    writes: AtomicU64,
    evictions: AtomicU64,
    eviction_failures: AtomicU64,
    /// The buffers resident pages live in. Frames hold pointers into it and never dereference
    /// them once the pool is being dropped, so the order in which the two are dropped does not
    /// matter.
    memory: PageMemory,
}

impl Default for BufferPool {
    fn default() -> Self {
        Self::new()
    }
}

/// The error of a page write that did not happen because the before-write hook (the engine's
/// log flush) failed.
fn hook_failed(page_id: PageId) -> PageError {
    PageError::Io {
        page: page_id,
        message: "the before-write hook (the log flush) failed".into(),
    }
}

/// A page id that may be corrupt (it came from page contents) and names no allocated page.
fn unallocated(page_id: PageId) -> PageError {
    PageError::Corrupt {
        page: page_id,
        reason: "a link names a page that was never allocated".into(),
    }
}

impl BufferPool {
    /// An empty memory-only pool: unbounded, no data file.
    pub fn new() -> Self {
        Self::with_max_pages(MAX_POOL_PAGES)
    }

    /// An empty memory-only pool that holds at most `max_pages` pages, ids 1 to `max_pages`
    /// (see [`PoolConfig::max_pages`]).
    pub fn with_max_pages(max_pages: usize) -> Self {
        Self::with_parts(usize::MAX, None, max_pages)
    }

    fn with_parts(budget_pages: usize, file: Option<Arc<DataFile>>, max_pages: usize) -> Self {
        BufferPool {
            chunks: (0..MAX_PAGES / PAGE_TABLE_CHUNK_PAGES)
                .map(|_| OnceLock::new())
                .collect(),
            // Page 0 is `NO_PAGE`.
            next_page_id: AtomicU32::new(1),
            free_pages: Mutex::new(FreePages::default()),
            free_page_count: AtomicUsize::new(0),
            max_pages: AtomicUsize::new(max_pages.min(MAX_POOL_PAGES)),
            resident: AtomicUsize::new(0),
            budget_pages,
            file,
            evictor: Mutex::new(0),
            before_write: Mutex::new(None),
            reads: AtomicU64::new(0),
            writes: AtomicU64::new(0),
            evictions: AtomicU64::new(0),
            eviction_failures: AtomicU64::new(0),
            memory: PageMemory::new(),
        }
    }

    /// Opens (or creates) the data file at `path` and returns a pool over it with the user blob
    /// of its last durable image (`None` for a new file, or one that never finished a
    /// checkpoint). Pages are read lazily, on their first latch. Pages allocated after the last
    /// durable image are gone: the caller's log recovery rebuilds them.
    pub fn open_file(
        fs: Arc<dyn FileSystem>,
        path: &Path,
        config: PoolConfig,
    ) -> Result<(BufferPool, Option<Vec<u8>>), PageError> {
        let io = |what: &str, error: std::io::Error| PageError::Io {
            page: 0,
            message: format!("{what} {}: {error}", path.display()),
        };
        let budget_pages = (config.memory_budget_bytes / PAGE_SIZE_BYTES).max(MIN_BUDGET_PAGES);
        let exists = fs
            .exists(path)
            .map_err(|error| io("checking for the data file", error))?;
        if exists {
            let file = fs
                .open(path, OpenOptions::existing())
                .map_err(|error| io("opening the data file", error))?;
            if let Some((data_file, image)) = DataFile::open(file)? {
                let pool =
                    Self::with_parts(budget_pages, Some(Arc::new(data_file)), config.max_pages);
                let mut free = FreePages::default();
                for (index, (&(slot, crc), &policy)) in
                    image.map.iter().zip(&image.flavours).enumerate()
                {
                    let page_id = index as PageId + 1;
                    // Slot 0: the image holds no bytes for the page, which a capture records
                    // only for a free page (every other page was written by then). A page
                    // comes back with the latch flavour it had, so that an index keeps the
                    // flavour it asked for across a restart, and a free page goes back on its
                    // flavour's list.
                    let frame = if slot == 0 {
                        free.of(policy).push(page_id);
                        Frame::new_free(policy)
                    } else {
                        Frame::new(policy, None, slot, crc)
                    };
                    pool.install_frame(page_id, frame)?;
                }
                // Reversed, so that allocations take the lowest free ids first.
                let mut free_count = 0;
                for policy in LatchPolicy::ALL {
                    free.of(policy).reverse();
                    free_count += free.of(policy).len();
                }
                pool.free_page_count.store(free_count, Ordering::Relaxed);
                *lock(&pool.free_pages) = free;
                pool.next_page_id
                    .store(image.map.len() as PageId + 1, Ordering::Relaxed);
                return Ok((pool, image.blob));
            }
        }
        // A new file, or one whose creation a crash interrupted before its first meta slot was
        // durable: (re)initialise it and make its name durable.
        let file = fs
            .open(path, OpenOptions::create())
            .map_err(|error| io("creating the data file", error))?;
        let data_file = DataFile::create(file)?;
        let dir = match path.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => parent,
            _ => Path::new("."),
        };
        fs.sync_dir(dir)
            .map_err(|error| io("syncing the directory of the data file", error))?;
        Ok((
            Self::with_parts(budget_pages, Some(Arc::new(data_file)), config.max_pages),
            None,
        ))
    }

    /// The generation of the data file's last durable image (`None` for a memory-only pool).
    pub fn durable_generation(&self) -> Option<u64> {
        self.file.as_ref().map(|file| file.generation())
    }

    /// Whether the pool has a data file.
    pub fn is_file_backed(&self) -> bool {
        self.file.is_some()
    }

    /// Whether a checkpoint failed (a failed write or sync of the data file while it captured
    /// or finished an image), after which every later one is refused.
    pub fn checkpoints_failed(&self) -> bool {
        self.file.as_ref().is_some_and(|file| file.has_failed())
    }

    /// Installs the run-once-per-batch hook that eviction calls before it writes dirty pages
    /// (the WAL rule: the log must be durable up to a page's changes before the page is
    /// written). If the hook fails, dirty pages stay in memory.
    pub fn set_before_write_hook(&self, hook: BeforeWriteHook) {
        *lock(&self.before_write) = Some(Arc::from(hook));
    }

    /// The pool's page limit (see [`PoolConfig::max_pages`]).
    pub fn max_pages(&self) -> usize {
        self.max_pages.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Changes the pool's page limit (at most [`MAX_POOL_PAGES`]) for allocations from now on. Pages
    /// already beyond a lower limit stay; only new ones are refused. Recovery replays with the
    /// limit raised, since replayed rows may need more pages than they took before the crash.
    pub fn set_max_pages(&self, max_pages: usize) {
        self.max_pages.store(
            max_pages.min(MAX_POOL_PAGES),
            std::sync::atomic::Ordering::Relaxed,
        );
    }

    /// Page ids handed out so far, free pages included: every page id lies in `1..=` this.
    pub fn page_count(&self) -> usize {
        self.next_page_id.load(Ordering::Relaxed).saturating_sub(1) as usize
    }

    /// Pages freed and not handed out again (see [`BufferPool::free_pages`]). The pages in use
    /// are `page_count() - free_page_count()`.
    pub fn free_page_count(&self) -> usize {
        self.free_page_count.load(Ordering::Relaxed)
    }

    /// The pool's counters.
    pub fn stats(&self) -> PoolStats {
        let mut dirty = 0;
        for page_id in 1..=self.page_count() as PageId {
            if let Some(frame) = self.try_frame(page_id)
                && frame.resident.load(Ordering::Relaxed)
                && frame.dirty.load(Ordering::Relaxed)
            {
                dirty += 1;
            }
        }
        PoolStats {
            resident: self.resident.load(Ordering::Relaxed),
            dirty,
            budget: self.budget_pages,
            reads: self.reads.load(Ordering::Relaxed),
            writes: self.writes.load(Ordering::Relaxed),
            evictions: self.evictions.load(Ordering::Relaxed),
            eviction_failures: self.eviction_failures.load(Ordering::Relaxed),
        }
    }

    #[inline]
    fn try_frame(&self, page_id: PageId) -> Option<&Frame> {
        let index = page_id as usize;
        self.chunks
            .get(index / PAGE_TABLE_CHUNK_PAGES)
            .and_then(OnceLock::get)
            .and_then(|chunk| chunk[index % PAGE_TABLE_CHUNK_PAGES].get())
            .map(|frame| &**frame)
    }

    #[inline]
    fn frame(&self, page_id: PageId) -> Result<&Frame, PageError> {
        self.try_frame(page_id).ok_or_else(|| unallocated(page_id))
    }

    fn install_frame(&self, page_id: PageId, frame: Frame) -> Result<(), PageError> {
        let index = page_id as usize;
        let chunk = self.chunks[index / PAGE_TABLE_CHUNK_PAGES].get_or_init(|| {
            (0..PAGE_TABLE_CHUNK_PAGES)
                .map(|_| OnceLock::new())
                .collect()
        });
        chunk[index % PAGE_TABLE_CHUNK_PAGES]
            .set(Box::new(frame))
            .map_err(|_| PageError::Corrupt {
                page: page_id,
                reason: "the page id was handed out twice".into(),
            })
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
        if self.free_page_count.load(Ordering::Relaxed) > 0
            && let Some(guard) = self.reuse_free_page(policy, kind, level, index_id)
        {
            return Ok(guard);
        }
        let max_pages = if PAST_PAGE_LIMIT.get() {
            MAX_POOL_PAGES
        } else {
            self.max_pages()
        };
        // Taken only if below this allocation's limit, never taken and given back: allocators
        // have different limits (an undo's is `MAX_POOL_PAGES`), and a refused one that gave its id
        // back with a `fetch_sub` after a past-the-limit one had taken the next id moved the
        // counter back onto that id, which was then handed out twice (a panic) while the id
        // below it was never allocated.
        let taken =
            self.next_page_id
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |page_id| {
                    ((page_id as usize) <= max_pages).then_some(page_id + 1)
                });
        let Ok(page_id) = taken else {
            // At the page limit, a free page of the other latch flavour rather than none: a
            // full database whose free pages all have the other flavour (a dropped table of
            // that flavour, or a file of format version 1, whose pages all reopen with the
            // default flavour) would otherwise stay full with pages free. One page of the
            // other flavour changes nothing but the latch's fairness on that page.
            let other = match policy {
                LatchPolicy::Fifo => LatchPolicy::Adaptive,
                LatchPolicy::Adaptive => LatchPolicy::Fifo,
            };
            return self
                .reuse_free_page(other, kind, level, index_id)
                .ok_or(PoolFull { max_pages });
        };
        self.reserve_frame();
        let frame = Frame::new(policy, Some(self.memory.take()), 0, 0);
        frame.dirty.store(true, Ordering::Relaxed);
        // Latched before the page table shows it: a visible frame with bytes and no latch
        // held is one eviction may take (it only ever tries the latch), and it did, between
        // the two steps, freeing the new page's bytes under the caller, who then panicked
        // holding the latch, so every later latch of the page and every checkpoint waited for
        // ever.
        let latched = frame.latch.try_acquire(LatchMode::Exclusive);
        assert!(latched, "nobody else can reach a frame not yet installed");
        let installed = self.install_frame(page_id, frame).is_ok();
        assert!(installed, "page id {page_id} was handed out twice");
        let frame = self
            .try_frame(page_id)
            .expect("the frame was installed just above");
        Ok(Self::formatted(frame, page_id, kind, level, index_id))
    }

    /// The guard of a page just allocated (its frame latched exclusively and resident),
    /// formatted as an empty page of `kind`.
    fn formatted(
        frame: &Frame,
        page_id: PageId,
        kind: PageKind,
        level: u8,
        index_id: u32,
    ) -> ExclusiveGuard<'_> {
        let mut guard = ExclusiveGuard {
            frame,
            page_id,
            bytes: NonNull::new(frame.bytes_ptr()).expect("a new page is resident"),
        };
        guard.page_mut().format(page_id, kind, level, index_id);
        guard
    }

    /// Hands out a free page whose latch has the flavour `policy` (a frame's latch keeps its
    /// flavour for ever), formatted and latched exclusively, or `None` if there is none. (The
    /// caller's index normally has that flavour too; see `allocate` for when it has not.)
    /// Reusing a page needs no room under the page limit: it is counted already.
    #[cold]
    #[inline(never)]
    fn reuse_free_page(
        &self,
        policy: LatchPolicy,
        kind: PageKind,
        level: u8,
        index_id: u32,
    ) -> Option<ExclusiveGuard<'_>> {
        let page_id = {
            let mut free = lock(&self.free_pages);
            let page_id = free.of(policy).pop()?;
            self.free_page_count.fetch_sub(1, Ordering::Relaxed);
            page_id
        };
        let frame = self
            .try_frame(page_id)
            .expect("a page on the free list was allocated once, so it has a frame");
        // Nobody waits for anything while holding a free page's latch (a capture records it
        // under a shared latch, a stale link is refused in `load`, eviction only tries), so
        // this wait is short and cannot be part of a deadlock, whatever the caller holds.
        frame.latch.acquire(LatchMode::Exclusive);
        debug_assert!(frame.free.load(Ordering::Relaxed) && frame.bytes_ptr().is_null());
        self.reserve_frame();
        frame.install(self.memory.take());
        frame.free.store(false, Ordering::Relaxed);
        frame.dirty.store(true, Ordering::Relaxed);
        frame.touch();
        Some(Self::formatted(frame, page_id, kind, level, index_id))
    }

    /// Frees pages for later allocations to reuse: a dropped table's, say. The caller
    /// guarantees that nothing can reach them any more (no link from a page in use, no
    /// handle that will latch them); a latch that still reaches one (a stale link) is refused
    /// with [`PageError::Corrupt`]. A freed page's bytes go back to the page memory at once and
    /// its data-file slot as soon as no image names it; the next checkpoint's image records
    /// it as free, so it stays free across a restart.
    ///
    /// The list is checked before anything changes: a page id that was never allocated, one
    /// that is free already, or one named twice fails the call and frees nothing.
    pub fn free_pages(&self, page_ids: &[PageId]) -> Result<(), PageError> {
        let mut named = std::collections::HashSet::with_capacity(page_ids.len());
        for &page_id in page_ids {
            let frame = self.frame(page_id)?;
            let problem = if !named.insert(page_id) {
                "it is named twice in the pages to free"
            } else if frame.free.load(Ordering::Relaxed) {
                "it is free already"
            } else {
                continue;
            };
            return Err(PageError::Corrupt {
                page: page_id,
                reason: format!("the page cannot be freed: {problem}"),
            });
        }
        for &page_id in page_ids {
            let frame = self.frame(page_id)?;
            frame.latch.acquire(LatchMode::Exclusive);
            self.free_frame(frame, page_id);
        }
        Ok(())
    }

    /// Frees a page the caller holds exclusively, as [`BufferPool::free_pages`] frees one:
    /// for a tree that unlinks an emptied page while it holds it, so that no other thread can
    /// latch the page between its last use and its free. Threads that reach it afterwards
    /// through a stale hint find it freed (see [`BufferPool::latch_exclusive_unless_freed`]).
    /// The caller guarantees that no link from a page in use names it any more.
    pub fn free_latched(&self, guard: ExclusiveGuard<'_>) -> Result<(), PageError> {
        let page_id = guard.page_id;
        let frame = self.frame(page_id)?;
        if !std::ptr::eq(frame, guard.frame) {
            return Err(PageError::Corrupt {
                page: page_id,
                reason: "the page cannot be freed: its guard belongs to another pool".into(),
            });
        }
        // The latch passes from the guard to `free_frame`, which releases it.
        std::mem::forget(guard);
        self.free_frame(frame, page_id);
        Ok(())
    }

    /// Frees `frame` (page `page_id`), whose latch this thread holds exclusively and which is
    /// in use, and releases the latch.
    fn free_frame(&self, frame: &Frame, page_id: PageId) {
        if let Some(bytes) = frame.discard() {
            // SAFETY: the buffer came from this pool's page memory (every installed buffer
            // does), and the frame no longer points at it; the exclusive latch this thread
            // holds means no guard can still be reading it.
            unsafe { self.memory.give_back(bytes) };
            self.resident.fetch_sub(1, Ordering::Relaxed);
        }
        frame.dirty.store(false, Ordering::Relaxed);
        if let Some(file) = &self.file {
            file.release_slot(frame.slot.load(Ordering::Relaxed));
        }
        frame.slot.store(0, Ordering::Relaxed);
        frame.crc.store(0, Ordering::Relaxed);
        frame.free.store(true, Ordering::Relaxed);
        frame.latch.release(LatchMode::Exclusive);
        // Counted under the list's lock, as a reuse uncounts under it: counted after the
        // lock, a reuse could take the page and uncount it first, and the count (which
        // `page_count() - free_page_count()` reads) wrapped below zero for a moment.
        let mut free = lock(&self.free_pages);
        free.of(frame.latch.policy()).push(page_id);
        self.free_page_count.fetch_add(1, Ordering::Relaxed);
    }

    /// Latches a page in shared mode, waiting if a writer holds it; reads it from the data file
    /// first if it is not in memory.
    #[inline]
    pub fn latch_shared(&self, page_id: PageId) -> Result<SharedGuard<'_>, PageError> {
        let frame = self.frame(page_id)?;
        frame.latch.acquire(LatchMode::Shared);
        match NonNull::new(frame.bytes_ptr()) {
            Some(bytes) => {
                frame.touch();
                Ok(SharedGuard {
                    frame,
                    page_id,
                    bytes,
                })
            }
            None => {
                frame.latch.release(LatchMode::Shared);
                frame.latch.acquire(LatchMode::Exclusive);
                Ok(self.load(frame, page_id)?.downgrade())
            }
        }
    }

    /// Latches a page exclusively, waiting for every other holder to leave; reads it from the
    /// data file first if it is not in memory.
    #[inline]
    pub fn latch_exclusive(&self, page_id: PageId) -> Result<ExclusiveGuard<'_>, PageError> {
        let frame = self.frame(page_id)?;
        frame.latch.acquire(LatchMode::Exclusive);
        self.exclusive_guard(frame, page_id)
    }

    /// The guard of `frame` (page `page_id`), which this thread has just latched exclusively,
    /// reading the page from the data file first if it is not in memory.
    #[inline]
    fn exclusive_guard<'a>(
        &'a self,
        frame: &'a Frame,
        page_id: PageId,
    ) -> Result<ExclusiveGuard<'a>, PageError> {
        match NonNull::new(frame.bytes_ptr()) {
            Some(bytes) => {
                frame.touch();
                Ok(ExclusiveGuard {
                    frame,
                    page_id,
                    bytes,
                })
            }
            None => self.load(frame, page_id),
        }
    }

    /// Latches a page exclusively if that is possible without waiting for another holder
    /// (reading it from the data file if needed, which waits for I/O but never for a latch).
    pub fn try_latch_exclusive(
        &self,
        page_id: PageId,
    ) -> Result<Option<ExclusiveGuard<'_>>, PageError> {
        let frame = self.frame(page_id)?;
        if !frame.latch.try_acquire(LatchMode::Exclusive) {
            return Ok(None);
        }
        self.exclusive_guard(frame, page_id).map(Some)
    }

    /// Latches a page exclusively, as [`BufferPool::latch_exclusive`] does, unless it was
    /// freed: then `None`. For a tree's hints (the page its last row went to, say), which may
    /// name a page that an emptied leaf's unlinking freed since; through a link in a page in
    /// use, a freed page is corruption, and `latch_exclusive` reports it so.
    pub fn latch_exclusive_unless_freed(
        &self,
        page_id: PageId,
    ) -> Result<Option<ExclusiveGuard<'_>>, PageError> {
        let frame = self.frame(page_id)?;
        frame.latch.acquire(LatchMode::Exclusive);
        self.latched_unless_freed(frame, page_id)
    }

    /// [`BufferPool::try_latch_exclusive`] for a hint: `None` also if the page was freed.
    pub fn try_latch_exclusive_unless_freed(
        &self,
        page_id: PageId,
    ) -> Result<Option<ExclusiveGuard<'_>>, PageError> {
        let frame = self.frame(page_id)?;
        if !frame.latch.try_acquire(LatchMode::Exclusive) {
            return Ok(None);
        }
        self.latched_unless_freed(frame, page_id)
    }

    /// The guard of `frame`, latched exclusively by this thread, reading the page first if it
    /// is not resident; `None`, with the latch released, if the page is free.
    fn latched_unless_freed<'a>(
        &'a self,
        frame: &'a Frame,
        page_id: PageId,
    ) -> Result<Option<ExclusiveGuard<'a>>, PageError> {
        if frame.free.load(Ordering::Relaxed) {
            frame.latch.release(LatchMode::Exclusive);
            return Ok(None);
        }
        self.exclusive_guard(frame, page_id).map(Some)
    }

    /// The latch flavour of a page (the default flavour for a page id that was never
    /// allocated).
    pub fn latch_policy(&self, page_id: PageId) -> LatchPolicy {
        self.try_frame(page_id)
            .map_or_else(LatchPolicy::default, |frame| frame.latch.policy())
    }

    /// Reads a non-resident page into its frame. The caller holds the frame's latch
    /// exclusively; on failure the latch is released and the page stays non-resident.
    #[cold]
    #[inline(never)]
    fn load<'a>(
        &'a self,
        frame: &'a Frame,
        page_id: PageId,
    ) -> Result<ExclusiveGuard<'a>, PageError> {
        if let Some(bytes) = NonNull::new(frame.bytes_ptr()) {
            // Another thread loaded it while this one switched from a shared latch to an
            // exclusive one.
            frame.touch();
            return Ok(ExclusiveGuard {
                frame,
                page_id,
                bytes,
            });
        }
        if frame.free.load(Ordering::Relaxed) {
            frame.latch.release(LatchMode::Exclusive);
            return Err(PageError::Corrupt {
                page: page_id,
                reason: "a link names a page that was freed".into(),
            });
        }
        let result = self.read_page(frame, page_id);
        match result {
            Ok(bytes) => {
                frame.install(bytes);
                frame.touch();
                let bytes = NonNull::new(frame.bytes_ptr()).expect("the bytes were just installed");
                Ok(ExclusiveGuard {
                    frame,
                    page_id,
                    bytes,
                })
            }
            Err(error) => {
                frame.latch.release(LatchMode::Exclusive);
                Err(error)
            }
        }
    }

    /// Reserves a frame and reads the page's slot, verifying its checksum and header.
    fn read_page(&self, frame: &Frame, page_id: PageId) -> Result<NonNull<PageBytes>, PageError> {
        let Some(file) = &self.file else {
            // A memory-only pool never drops a page's bytes.
            return Err(PageError::Corrupt {
                page: page_id,
                reason: "the page has no bytes in a memory-only pool".into(),
            });
        };
        self.reserve_frame();
        let buffer = self.memory.take();
        // SAFETY: the buffer was just taken from the page memory, so this is its only user
        // until it is installed in the frame or given back below.
        let bytes = unsafe { &mut *buffer.as_ptr() };
        let slot = frame.slot.load(Ordering::Relaxed);
        if slot != 0 {
            let checked = file.read_slot(page_id, slot, bytes).and_then(|()| {
                let crc = crc32c::crc32c(bytes.as_slice());
                let expected = frame.crc.load(Ordering::Relaxed);
                if crc != expected {
                    return Err(PageError::Corrupt {
                        page: page_id,
                        reason: format!(
                            "slot {slot} has checksum {crc:#010x}, the page map says {expected:#010x}"
                        ),
                    });
                }
                let page = Page::new(bytes);
                if page.page_id() != page_id {
                    return Err(PageError::Corrupt {
                        page: page_id,
                        reason: format!("slot {slot} holds page {}", page.page_id()),
                    });
                }
                if page.kind() != Some(PageKind::Free) {
                    page.check_layout().map_err(|reason| PageError::Corrupt {
                        page: page_id,
                        reason,
                    })?;
                }
                Ok(())
            });
            if let Err(error) = checked {
                // SAFETY: taken above and not installed; `bytes` is not used again.
                unsafe { self.memory.give_back(buffer) };
                self.resident.fetch_sub(1, Ordering::Relaxed);
                return Err(error);
            }
        }
        self.reads.fetch_add(1, Ordering::Relaxed);
        Ok(buffer)
    }

    /// Counts a page about to become resident, and evicts a batch if that goes over budget.
    #[inline]
    fn reserve_frame(&self) {
        let resident = self.resident.fetch_add(1, Ordering::Relaxed) + 1;
        if resident > self.budget_pages {
            self.evict_batch();
        }
    }

    /// A CLOCK sweep over page ids that evicts up to a batch of pages: referenced pages get
    /// their bit cleared and a second chance; a page whose latch cannot be taken at once is
    /// skipped (the evicting thread may hold other latches, so it never waits for one); dirty
    /// victims are written after the before-write hook ran once for the batch. One thread
    /// sweeps at a time; others that go over budget meanwhile carry on (the budget is soft).
    #[cold]
    #[inline(never)]
    fn evict_batch(&self) {
        let Some(file) = &self.file else { return };
        let Ok(mut hand) = self.evictor.try_lock() else {
            return;
        };
        let page_count = self.page_count();
        if page_count == 0 {
            return;
        }
        let batch = EVICTION_BATCH_PAGES.min(self.budget_pages / 4).max(1);
        let mut victims: Vec<(&Frame, PageId)> = Vec::with_capacity(batch);
        // Two full turns: the first may only clear referenced bits.
        for _ in 0..2 * page_count {
            if victims.len() >= batch {
                break;
            }
            *hand = (*hand % page_count) + 1;
            let page_id = *hand as PageId;
            let Some(frame) = self.try_frame(page_id) else {
                continue;
            };
            if !frame.resident.load(Ordering::Relaxed) {
                continue;
            }
            if frame.referenced.swap(false, Ordering::Relaxed) {
                continue;
            }
            if !frame.latch.try_acquire(LatchMode::Exclusive) {
                continue;
            }
            if frame.bytes_ptr().is_null() {
                frame.latch.release(LatchMode::Exclusive);
                continue;
            }
            victims.push((frame, page_id));
        }
        drop(hand);
        let any_dirty = victims
            .iter()
            .any(|(frame, _)| frame.dirty.load(Ordering::Relaxed));
        if any_dirty && self.run_before_write_hook() {
            let dirty: Vec<(&Frame, PageId)> = victims
                .iter()
                .filter(|(frame, _)| frame.dirty.load(Ordering::Relaxed))
                .copied()
                .collect();
            // A victim not written stays dirty, and resident: counted below.
            let _ = self.write_frames(file, &dirty, &mut Vec::new());
        }
        for (frame, _) in victims {
            if frame.dirty.load(Ordering::Relaxed) {
                self.eviction_failures.fetch_add(1, Ordering::Relaxed);
                frame.latch.release(LatchMode::Exclusive);
                continue;
            }
            if let Some(bytes) = frame.discard() {
                // SAFETY: the buffer came from this pool's page memory (every installed buffer
                // does), and the frame no longer points at it; the exclusive latch this thread
                // holds means no guard can still be reading it.
                unsafe { self.memory.give_back(bytes) };
            }
            self.resident.fetch_sub(1, Ordering::Relaxed);
            self.evictions.fetch_add(1, Ordering::Relaxed);
            frame.latch.release(LatchMode::Exclusive);
        }
    }

    fn run_before_write_hook(&self) -> bool {
        let hook = lock(&self.before_write).clone();
        hook.is_none_or(|hook| hook().is_ok())
    }

    /// Whether the page at `index` of a capture's map (page id `index + 1`) is no longer in
    /// `slot`, the slot the capture named: it was changed and written elsewhere since. Called by
    /// [`DataFile::abandon`] under the slot state's lock, after the slot's protection was
    /// taken back, so the page cannot be moving out of it any more; one that is still moving
    /// (its new slot picked, not yet recorded) reads as not moved, and its old slot leaks.
    fn page_moved(&self, index: usize, slot: u32) -> bool {
        PageId::try_from(index + 1)
            .ok()
            .and_then(|page_id| self.try_frame(page_id))
            .is_some_and(|frame| frame.slot.load(Ordering::Relaxed) != slot)
    }

    /// Writes resident pages to slots no image protects, in runs of consecutive slots with one
    /// positional write each (see [`DataFile::write_pages`]); `written` is scratch space. The
    /// caller holds every frame's latch (exclusively, or shared while writers are quiesced or
    /// by the checkpoint, the one thread that changes a frame's slot, CRC and dirty flag under
    /// a shared latch). Each page written is recorded (slot, CRC, clean) whatever happens to
    /// the others; the first failure is returned, and the pages not written stay dirty in
    /// their slots.
    fn write_frames(
        &self,
        file: &DataFile,
        frames: &[(&Frame, PageId)],
        written: &mut Vec<Option<u32>>,
    ) -> Result<(), PageError> {
        let pages: Vec<PageWrite<'_>> = frames
            .iter()
            .map(|&(frame, page_id)| PageWrite {
                page: page_id,
                current: frame.slot.load(Ordering::Relaxed),
                // SAFETY: the caller holds the latch and the page is resident, so the pointer
                // is valid and no writer exists.
                bytes: unsafe { &*frame.bytes_ptr() },
            })
            .collect();
        let result = file.write_pages(&pages, written);
        for ((frame, _), (page, slot)) in frames.iter().zip(pages.iter().zip(written.iter())) {
            if let Some(slot) = *slot {
                frame.slot.store(slot, Ordering::Relaxed);
                frame
                    .crc
                    .store(crc32c::crc32c(page.bytes.as_slice()), Ordering::Relaxed);
                frame.dirty.store(false, Ordering::Relaxed);
                self.writes.fetch_add(1, Ordering::Relaxed);
            }
        }
        result
    }

    /// Writes the dirty resident pages while writers go on, keeping them resident: what
    /// eviction does to its victims, without freeing their memory. A checkpoint calls it before
    /// it quiesces the writers, so that [`BufferPool::checkpoint_capture`] (which runs with
    /// writers stopped) finds nearly every page clean and only writes the few dirtied since;
    /// without it, every page dirtied since the last checkpoint was written while the writers
    /// waited (hundreds of milliseconds for a few hundred MB).
    ///
    /// Pages are taken in batches of [`CHECKPOINT_WRITE_BATCH_PAGES`], each latched shared with
    /// a *try* (a page a writer holds is skipped: it is likely to be dirtied again, and the
    /// capture writes it); the before-write hook runs once per batch, before the batch is
    /// latched, and the batch's latches are released once it is written. A shared latch
    /// keeps writers out, and only a checkpoint (one at a time) changes a frame's slot, CRC and
    /// dirty flag under a shared latch. Each batch is synced before the next is written
    /// (spreading the data file's writeback over the pass, between the log's flushes; the
    /// capture's own sync then has little left to do). Returns how many pages it wrote.
    ///
    /// The hook runs before the latches are taken, not while they are held: it flushes the log,
    /// and writers of the batch's pages waited for that flush. So a page may be written with a
    /// change made after the hook, whose log record is not durable yet. That breaks no image:
    /// the page goes to a slot no durable image uses (a crash forgets it), and it enters an
    /// image only through a capture, whose caller makes the log durable up to the capture
    /// before [`PendingCheckpoint::finish`] writes the image (the engine's checkpoint does).
    pub fn write_dirty_pages(&self) -> Result<usize, PageError> {
        let Some(file) = &self.file else {
            return Ok(0);
        };
        if file.has_failed() {
            return Err(refused());
        }
        let page_count = self.page_count();
        let mut batch: Vec<(&Frame, PageId)> = Vec::with_capacity(CHECKPOINT_WRITE_BATCH_PAGES);
        let mut slots_written = Vec::with_capacity(CHECKPOINT_WRITE_BATCH_PAGES);
        let mut written = 0;
        let mut next = 1;
        while next <= page_count {
            if !self.run_before_write_hook() {
                return Err(hook_failed(next as PageId));
            }
            while next <= page_count && batch.len() < CHECKPOINT_WRITE_BATCH_PAGES {
                let page_id = next as PageId;
                next += 1;
                let Some(frame) = self.try_frame(page_id) else {
                    continue;
                };
                if !frame.dirty.load(Ordering::Relaxed)
                    || !frame.latch.try_acquire(LatchMode::Shared)
                {
                    continue;
                }
                if frame.bytes_ptr().is_null() || !frame.dirty.load(Ordering::Relaxed) {
                    frame.latch.release(LatchMode::Shared);
                    continue;
                }
                batch.push((frame, page_id));
            }
            if batch.is_empty() {
                continue;
            }
            let result = self.write_frames(file, &batch, &mut slots_written);
            written += slots_written.iter().flatten().count();
            for (frame, _) in batch.drain(..) {
                frame.latch.release(LatchMode::Shared);
            }
            result?;
            // Synced batch by batch, so that the kernel never holds hundreds of MB of them to
            // write back at once: a log flush queued behind that waited a third of a second.
            file.sync_pages()?;
        }
        Ok(written)
    }

    /// The first step of a checkpoint. The caller has quiesced every writer: no
    /// `ExclusiveGuard` is held or taken during the call (readers may hold and take shared
    /// latches). Writes every dirty resident page to a slot outside the durable image, records
    /// every page's slot and CRC as of now, and marks the pages clean. Writers may resume as
    /// soon as it returns; [`PendingCheckpoint::finish`] makes the image durable.
    pub fn checkpoint_capture(&self) -> Result<PendingCheckpoint, PageError> {
        let Some(file) = &self.file else {
            return Err(PageError::Io {
                page: 0,
                message: "a memory-only pool has no data file to checkpoint to".into(),
            });
        };
        let generation = file.begin_capture()?;
        let page_count = self.page_count();
        let mut map = Vec::with_capacity(page_count);
        let mut flavours = Vec::with_capacity(page_count);
        let mut pages_written = 0;
        let mut batch: Vec<(&Frame, PageId)> = Vec::with_capacity(CHECKPOINT_WRITE_BATCH_PAGES);
        let mut slots_written = Vec::with_capacity(CHECKPOINT_WRITE_BATCH_PAGES);
        let hook_ok = self.run_before_write_hook();
        for page_id in 1..=page_count as PageId {
            let Some(frame) = self.try_frame(page_id) else {
                // Only an allocation in flight, which quiesced writers cannot have. (Slot 0
                // reads as a free page at the next open: a page nothing links to yet.)
                map.push((0, 0));
                flavours.push(LatchPolicy::default());
                continue;
            };
            // Every page's flavour, free ones included: a frame keeps its latch's flavour for
            // ever, and the next open gives it back (a free page goes on its flavour's list).
            flavours.push(frame.latch.policy());
            frame.latch.acquire(LatchMode::Shared);
            if frame.free.load(Ordering::Relaxed) {
                // Slot 0, which the next open reads as a free page.
                frame.latch.release(LatchMode::Shared);
                map.push((0, 0));
                continue;
            }
            if !frame.bytes_ptr().is_null() && frame.dirty.load(Ordering::Relaxed) {
                if !hook_ok {
                    frame.latch.release(LatchMode::Shared);
                    file.abandon(&map, |index, slot| self.page_moved(index, slot));
                    return Err(hook_failed(page_id));
                }
                // Written with the batch, latched until then; its map entry is filled in once
                // it is written.
                map.push((0, 0));
                batch.push((frame, page_id));
                pages_written += 1;
                if batch.len() == CHECKPOINT_WRITE_BATCH_PAGES {
                    self.capture_batch(file, &mut batch, &mut map, &mut slots_written)?;
                }
                continue;
            }
            let slot = frame.slot.load(Ordering::Relaxed);
            let crc = frame.crc.load(Ordering::Relaxed);
            // Under the latch, so an eviction of this page (which needs the latch exclusively)
            // sees the protection before it picks a slot.
            file.protect_pending(slot);
            frame.latch.release(LatchMode::Shared);
            map.push((slot, crc));
        }
        self.capture_batch(file, &mut batch, &mut map, &mut slots_written)?;
        Ok(PendingCheckpoint {
            file: Arc::clone(file),
            generation,
            map,
            flavours,
            pages_written,
            done: false,
        })
    }

    /// Writes the dirty pages a capture latched (`batch`, in page order; emptied), in runs of
    /// consecutive slots, and enters each one written in `map` (which holds a placeholder for
    /// it) with its slot protected as pending, before its latch goes, as
    /// [`BufferPool::checkpoint_capture`] does for a clean page. On a failed write every latch
    /// is let go and the capture abandoned: the pages not written stay dirty (their slots and
    /// checksums unchanged, their fresh slots free), and those captured before are clean in
    /// slots no image names yet, which a later checkpoint sorts out.
    fn capture_batch<'pool>(
        &'pool self,
        file: &DataFile,
        batch: &mut Vec<(&'pool Frame, PageId)>,
        map: &mut [(u32, u32)],
        slots_written: &mut Vec<Option<u32>>,
    ) -> Result<(), PageError> {
        if batch.is_empty() {
            return Ok(());
        }
        let result = self.write_frames(file, batch, slots_written);
        for ((frame, page_id), written) in batch.drain(..).zip(slots_written.iter()) {
            if let Some(slot) = *written {
                file.protect_pending(slot);
                map[page_id as usize - 1] = (slot, frame.crc.load(Ordering::Relaxed));
            }
            frame.latch.release(LatchMode::Shared);
        }
        if result.is_err() {
            file.abandon(map, |index, slot| self.page_moved(index, slot));
        }
        result
    }
}

/// A captured, not yet durable checkpoint image (see [`BufferPool::checkpoint_capture`]).
/// Dropping it without [`PendingCheckpoint::finish`] abandons it; [`PendingCheckpoint::abandon`]
/// does so without leaking slots.
pub struct PendingCheckpoint {
    /// The data file, shared rather than borrowed from the pool so that an abandoned capture
    /// can release its slots when dropped.
    file: Arc<DataFile>,
    generation: u64,
    map: Vec<(u32, u32)>,
    /// The latch flavour of every page of `map`.
    flavours: Vec<LatchPolicy>,
    pages_written: usize,
    done: bool,
}

impl PendingCheckpoint {
    /// Pages in the captured image.
    pub fn page_count(&self) -> usize {
        self.map.len()
    }

    /// Makes the captured image durable with `user_blob` (the engine's catalog) attached. May
    /// run while writers continue and pages are evicted. On any I/O error the checkpoint fails,
    /// the previous image stays the durable one, and `pool` refuses further checkpoints.
    pub fn finish(
        mut self,
        pool: &BufferPool,
        user_blob: &[u8],
    ) -> Result<CheckpointStats, PageError> {
        if !pool
            .file
            .as_ref()
            .is_some_and(|file| Arc::ptr_eq(file, &self.file))
        {
            return Err(PageError::Io {
                page: 0,
                message: "the checkpoint was captured from another pool".into(),
            });
        }
        self.done = true;
        let file = &self.file;
        match file.finish(self.generation, &self.map, &self.flavours, user_blob) {
            Ok((slots_freed, file_slots)) => Ok(CheckpointStats {
                generation: self.generation,
                pages: self.map.len(),
                pages_written: self.pages_written,
                slots_freed,
                file_slots,
            }),
            Err(error) => {
                // A failure that leaves the file unknown has failed it (see `DataFile::finish`);
                // any other gives the capture up, for a later checkpoint to try again.
                if !file.has_failed() {
                    // Pages changed and evicted since the capture went to other slots: those
                    // the capture named go back to the free list (they leaked before, a slot
                    // per such page at every failed checkpoint).
                    file.abandon(&self.map, |index, slot| pool.page_moved(index, slot));
                }
                Err(error)
            }
        }
    }
}

impl PendingCheckpoint {
    /// Gives the capture up without finishing it (the log could not be made durable up to it,
    /// say): its slots stop being protected, and those of pages that moved since (changed and
    /// written elsewhere) go back to the free list, as after a failed [`PendingCheckpoint::finish`].
    /// Nothing on disk names them: only a finish writes the meta slot that would name the
    /// captured map, and the durable image's slots are never freed here (see
    /// `DataFile::abandon`). Dropping the capture instead leaks those slots until the file is
    /// reopened, since without `pool` nothing can tell which pages moved.
    pub fn abandon(mut self, pool: &BufferPool) {
        if pool
            .file
            .as_ref()
            .is_some_and(|file| Arc::ptr_eq(file, &self.file))
        {
            self.done = true;
            self.file
                .abandon(&self.map, |index, slot| pool.page_moved(index, slot));
        }
        // Otherwise (a capture of another pool) the drop below abandons it the cautious way.
    }
}

impl Drop for PendingCheckpoint {
    fn drop(&mut self) {
        if !self.done {
            // An abandoned capture: its slots stop being protected. Those still current for
            // their pages are reused in place by later writes; the others leak until the file
            // is reopened (every slot outside the durable image is free then), which
            // `PendingCheckpoint::abandon`, given the pool, avoids.
            self.file.abandon(&self.map, |_, _| false);
        }
    }
}

/// Locks a mutex, ignoring poisoning: the data behind the pool's mutexes (the CLOCK hand, the
/// hook) stays consistent whatever a panicking holder did.
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The smallest budget a file-backed pool accepts, in pages: enough for the latches one
/// operation holds at once (a descent path plus a split's new pages).
const MIN_BUDGET_PAGES: usize = 4;

/// A page latched in shared mode: readable by this and other readers, writable by nobody.
pub struct SharedGuard<'a> {
    frame: &'a Frame,
    page_id: PageId,
    bytes: NonNull<PageBytes>,
}

// SAFETY: the guard is a held shared latch plus a pointer to bytes that stay valid and unwritten
// while that latch is held; both may move to and be used from another thread, as `&Frame` could
// before the pointer was cached.
unsafe impl Send for SharedGuard<'_> {}
// SAFETY: as above; shared access only reads.
unsafe impl Sync for SharedGuard<'_> {}

impl SharedGuard<'_> {
    /// The page's id.
    pub fn page_id(&self) -> PageId {
        self.page_id
    }

    /// The page's contents.
    pub fn page(&self) -> Page<'_> {
        // SAFETY: this guard holds the frame's latch in shared mode, so the page stays resident
        // (eviction needs the latch exclusively) and no exclusive guard (the only writer)
        // exists until it is dropped; shared references may coexist.
        Page::new(unsafe { self.bytes.as_ref() })
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
    bytes: NonNull<PageBytes>,
}

// SAFETY: the guard is a held exclusive latch plus a pointer to bytes only it may touch while
// that latch is held; it may move to another thread like the `&Frame` it wraps.
unsafe impl Send for ExclusiveGuard<'_> {}
// SAFETY: `&ExclusiveGuard` only reads (`page`); writing needs `&mut`.
unsafe impl Sync for ExclusiveGuard<'_> {}

impl<'a> ExclusiveGuard<'a> {
    /// The page's id.
    pub fn page_id(&self) -> PageId {
        self.page_id
    }

    /// The page's contents.
    pub fn page(&self) -> Page<'_> {
        // SAFETY: this guard holds the frame's latch exclusively, so the page stays resident
        // and no other guard exists; the shared borrow of `self` stops `page_mut` meanwhile.
        Page::new(unsafe { self.bytes.as_ref() })
    }

    /// The page's contents, writable. Marks the page dirty.
    #[inline]
    pub fn page_mut(&mut self) -> PageMut<'_> {
        self.frame.dirty.store(true, Ordering::Relaxed);
        // SAFETY: this guard holds the frame's latch exclusively, so the page stays resident
        // and no other guard exists; the mutable borrow of `self` makes this the only reference
        // through this guard.
        PageMut::new(unsafe { self.bytes.as_mut() })
    }

    /// Turns the exclusive latch into a shared one without letting any writer in between.
    pub fn downgrade(self) -> SharedGuard<'a> {
        let frame = self.frame;
        let page_id = self.page_id;
        let bytes = self.bytes;
        std::mem::forget(self);
        frame.latch.downgrade();
        SharedGuard {
            frame,
            page_id,
            bytes,
        }
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
                        let guard = pool.latch_shared(*id).unwrap();
                        assert_eq!(guard.page().key(0), u32::to_be_bytes(i as u32));
                        assert_eq!(guard.page().index_id(), 9);
                    }
                });
            }
        });
        let exclusive = pool.latch_exclusive(ids[0]).unwrap();
        assert!(pool.try_latch_exclusive(ids[0]).unwrap().is_none());
        let shared = exclusive.downgrade();
        assert!(pool.try_latch_exclusive(ids[0]).unwrap().is_none());
        drop(shared);
        assert!(pool.try_latch_exclusive(ids[0]).unwrap().is_some());
        assert!(matches!(
            pool.latch_shared(1 << 20),
            Err(PageError::Corrupt { .. })
        ));
    }
}
