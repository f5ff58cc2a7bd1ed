//! The memory the buffer pool keeps its pages in: page buffers carved from large slabs, and
//! reused once evicted.
//!
//! Why not one heap allocation per page: glibc gives each thread an arena whose heap grows a
//! little at a time, and every growth is an `mprotect` that takes the process's memory-map lock
//! for writing and interrupts every other CPU to flush its TLB. When a hundred sessions insert
//! CHAR(8000) rows (a new page per row) that is one `mprotect` per row (57,900 for 60,000
//! rows), and in `perf` `rwsem_spin_on_owner`, `smp_call_function_many_cond`,
//! `do_mprotect_pkey` and their kin took about a tenth of all samples. With slabs: 1,222
//! `mprotect` calls for the same run, and 195,000-218,000 rows/s instead of 152,000-195,000
//! (`lastpage bench insert --threads 100 --rows-per-thread 2000 --row-bytes 8000`).
//!
//! A slab is one allocation of many pages (above glibc's mmap threshold, so a mapping of its
//! own), and slabs grow geometrically up to [`PAGE_SLAB_MAX_PAGES`], so a pool that never grows
//! large never reserves much. Buffers are never handed back to the operating system while the
//! pool lives: a buffer pool's memory is bounded by its budget, and what eviction frees is what
//! the next read needs.
//!
//! Slabs use ordinary 4 KiB pages. Transparent huge pages (`madvise(MADV_HUGEPAGE)` on each
//! slab's 2 MiB-aligned part) were measured and left out: on this project's VM they doubled
//! CHAR(8000) inserts (`bench insert --threads 100 --rows-per-thread 600 --row-bytes 8000`,
//! 604k–643k rows/s against 270k–323k) only when the memory had just been freed by an earlier
//! run; after a few seconds' rest, when the guest had handed its free 2 MiB blocks back to the
//! host, the first touch of each huge page cost milliseconds and they halved them instead
//! (112k–128k against 254k–261k).

use std::alloc::{Layout, alloc_zeroed, dealloc, handle_alloc_error};
use std::ptr::NonNull;

use crate::limits::{PAGE_SLAB_MAX_PAGES, PAGE_SLAB_MIN_PAGES};
use crate::page::PageBytes;
use crate::sync::{self, AtomicPtr, AtomicUsize, Mutex, Ordering};

/// Slabs of page buffers and the buffers handed back. See the module documentation.
///
/// Taking a buffer is one `fetch_add` on the current slab's cursor while the slab lasts (a
/// mutex here measurably convoyed a hundred sessions that each allocate a page per insert);
/// the mutex is taken only to add a slab, and to reach the buffers handed back.
pub struct PageMemory {
    /// The slab buffers are carved from; null before the first.
    current: AtomicPtr<Slab>,
    /// Every slab (a leaked `Box`, so that `current` can point at one while the vector
    /// grows), kept until the memory is dropped.
    slabs: Mutex<Vec<NonNull<Slab>>>,
    /// Buffers handed back, to be handed out again.
    free: Mutex<Vec<NonNull<PageBytes>>>,
    /// `free.len()`, readable without the mutex, so that a pool that never evicts never takes
    /// it.
    free_count: AtomicUsize,
}

/// One allocation of `len` page buffers.
struct Slab {
    base: NonNull<PageBytes>,
    len: usize,
    /// The next buffer to carve; at or past `len` when the slab is used up (it may overshoot:
    /// every taker adds one before it checks).
    next: AtomicUsize,
}

// SAFETY: the raw pointers are into slabs this value owns; each buffer has one user at a time
// (whoever `take` handed it to, until it is given back), a slab's buffers are carved once each
// (the cursor is a `fetch_add`), and everything else is behind a mutex or atomic.
unsafe impl Send for PageMemory {}
// SAFETY: as above.
unsafe impl Sync for PageMemory {}

impl Default for PageMemory {
    fn default() -> Self {
        Self::new()
    }
}

impl PageMemory {
    /// No slabs yet: the first [`PageMemory::take`] allocates one.
    pub fn new() -> PageMemory {
        PageMemory {
            current: AtomicPtr::new(std::ptr::null_mut()),
            slabs: Mutex::new(Vec::new()),
            free: Mutex::new(Vec::new()),
            free_count: AtomicUsize::new(0),
        }
    }

    /// A zeroed page buffer, owned by the caller until it hands it back with
    /// [`PageMemory::give_back`] (or until this memory is dropped, which frees it).
    pub fn take(&self) -> NonNull<PageBytes> {
        if self.free_count.load(Ordering::Relaxed) > 0 {
            let reused = {
                let mut free = sync::lock(&self.free);
                let reused = free.pop();
                self.free_count.store(free.len(), Ordering::Relaxed);
                reused
            };
            if let Some(reused) = reused {
                // SAFETY: a buffer on the free list lies in a live slab and nobody else uses it
                // (its last owner gave it back); writing zeros over all of it is in bounds.
                unsafe { reused.as_ptr().write_bytes(0, 1) };
                return reused;
            }
        }
        loop {
            let slab = self.current.load(Ordering::Acquire);
            // SAFETY: a non-null `current` points at a slab in `slabs`, which are freed only
            // when `self` is dropped.
            if let Some(slab) = unsafe { slab.as_ref() } {
                let index = slab.next.fetch_add(1, Ordering::Relaxed);
                if index < slab.len {
                    // SAFETY: `index < len`, so the offset stays inside the slab's allocation;
                    // the `fetch_add` hands each index to one taker only.
                    return unsafe { slab.base.add(index) };
                }
            }
            self.add_slab(slab);
        }
    }

    /// Hands a buffer back for reuse.
    ///
    /// # Safety
    ///
    /// `buffer` came from [`PageMemory::take`] on this memory, and the caller neither uses it
    /// nor lets anyone else use it afterwards.
    pub unsafe fn give_back(&self, buffer: NonNull<PageBytes>) {
        let mut free = sync::lock(&self.free);
        free.push(buffer);
        self.free_count.store(free.len(), Ordering::Relaxed);
    }

    /// Makes a new slab current, unless another thread replaced `used_up` already.
    #[cold]
    #[inline(never)]
    fn add_slab(&self, used_up: *mut Slab) {
        let mut slabs = sync::lock(&self.slabs);
        if self.current.load(Ordering::Acquire) != used_up {
            return;
        }
        let pages = (PAGE_SLAB_MIN_PAGES << slabs.len().min(16)).min(PAGE_SLAB_MAX_PAGES);
        let layout = slab_layout(pages);
        // SAFETY: the layout's size is not zero (at least one 8 KiB page).
        let base = unsafe { alloc_zeroed(layout) };
        let Some(base) = NonNull::new(base.cast::<PageBytes>()) else {
            handle_alloc_error(layout)
        };
        let slab = NonNull::from(Box::leak(Box::new(Slab {
            base,
            len: pages,
            next: AtomicUsize::new(0),
        })));
        slabs.push(slab);
        self.current.store(slab.as_ptr(), Ordering::Release);
    }

    /// Slabs allocated so far, and buffers in them.
    #[cfg(all(test, not(loom)))]
    fn slab_count(&self) -> (usize, usize) {
        let slabs = sync::lock(&self.slabs);
        // SAFETY: the slabs live as long as `self`.
        let buffers = slabs.iter().map(|slab| unsafe { slab.as_ref() }.len).sum();
        (slabs.len(), buffers)
    }
}

impl Drop for PageMemory {
    fn drop(&mut self) {
        for &slab in sync::lock(&self.slabs).iter() {
            // SAFETY: each slab was leaked from a `Box` by `add_slab`, and its buffers were
            // allocated there with exactly this layout; both are freed once, here. `&mut self`
            // means no `take` or `give_back` runs, and the pool that owns this memory drops
            // its frames' pointers without dereferencing them.
            unsafe {
                let slab = Box::from_raw(slab.as_ptr());
                dealloc(slab.base.as_ptr().cast(), slab_layout(slab.len));
            }
        }
    }
}

/// A slab's layout. Byte-aligned on purpose: for the default alignment Rust's `alloc_zeroed`
/// is glibc's `calloc`, which knows that a fresh mapping is zero and leaves it untouched, so
/// each page is faulted in by the thread that first writes it. With a larger alignment it
/// would `memset` the whole slab instead, faulting in megabytes at once while every other
/// thread that needs a buffer waits for the slab (measured: a fifth of all samples in
/// `clear_page_erms` under `add_slab`, and half the CPUs idle).
fn slab_layout(pages: usize) -> Layout {
    Layout::array::<PageBytes>(pages)
        .expect("a slab of at most PAGE_SLAB_MAX_PAGES pages has a valid layout")
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn buffers_are_zeroed_distinct_and_reused_after_they_are_given_back() {
        let memory = PageMemory::new();
        let buffers: Vec<NonNull<PageBytes>> = (0..PAGE_SLAB_MIN_PAGES * 5)
            .map(|_| memory.take())
            .collect();
        let addresses: HashSet<usize> = buffers.iter().map(|b| b.as_ptr() as usize).collect();
        assert_eq!(
            addresses.len(),
            buffers.len(),
            "a buffer was handed out twice"
        );
        for (index, buffer) in buffers.iter().enumerate() {
            // SAFETY: each buffer is this test's alone until it is given back.
            let bytes = unsafe { &mut *buffer.as_ptr() };
            assert!(bytes.iter().all(|&byte| byte == 0));
            bytes.fill(index as u8 + 1);
        }
        // Each buffer still holds its own pattern: none overlaps another.
        for (index, buffer) in buffers.iter().enumerate() {
            // SAFETY: as above.
            let bytes = unsafe { &*buffer.as_ptr() };
            assert!(bytes.iter().all(|&byte| byte == index as u8 + 1));
        }
        // Slabs double: 16 + 32 + 64 pages hold the 80 taken.
        assert_eq!(memory.slab_count(), (3, PAGE_SLAB_MIN_PAGES * 7));
        for &buffer in &buffers[..10] {
            // SAFETY: taken from this memory above; not used again.
            unsafe { memory.give_back(buffer) };
        }
        let again: Vec<NonNull<PageBytes>> = (0..10).map(|_| memory.take()).collect();
        let given_back: HashSet<usize> =
            buffers[..10].iter().map(|b| b.as_ptr() as usize).collect();
        for buffer in &again {
            assert!(
                given_back.contains(&(buffer.as_ptr() as usize)),
                "not a reused buffer"
            );
            // SAFETY: handed out again to this test alone.
            assert!(unsafe { &*buffer.as_ptr() }.iter().all(|&byte| byte == 0));
        }
        assert_eq!(memory.slab_count().0, 3, "reuse allocated a slab");
    }

    #[test]
    fn threads_never_share_a_buffer() {
        let memory = PageMemory::new();
        std::thread::scope(|scope| {
            for thread in 0..4u8 {
                let memory = &memory;
                scope.spawn(move || {
                    let mut mine = Vec::new();
                    for round in 0..2_000usize {
                        let buffer = memory.take();
                        // SAFETY: this thread's alone until given back below.
                        unsafe { &mut *buffer.as_ptr() }.fill(thread + 1);
                        mine.push(buffer);
                        if round % 3 == 0 {
                            let buffer = mine.swap_remove(round % mine.len());
                            // SAFETY: still this thread's alone (the check is that nobody else
                            // wrote it meanwhile).
                            let bytes = unsafe { &*buffer.as_ptr() };
                            assert!(bytes.iter().all(|&b| b == thread + 1));
                            // SAFETY: taken from this memory; not used again.
                            unsafe { memory.give_back(buffer) };
                        }
                    }
                    for buffer in mine {
                        // SAFETY: as above.
                        let bytes = unsafe { &*buffer.as_ptr() };
                        assert!(bytes.iter().all(|&b| b == thread + 1));
                    }
                });
            }
        });
    }
}
