//! Model check of the buffer pool's page memory with loom: threads carve buffers with one
//! `fetch_add` while one of them runs the slab's end and others race to add the next slab, and
//! a buffer handed back is handed out again. Every interleaving up to the preemption bound is
//! explored; a buffer handed to two takers shows as a repeated address. Run with:
//!
//! ```text
//! RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target-loom \
//!     cargo test -p lastpage-storage --release --test page_memory_loom
//! ```
#![cfg(loom)]

use std::collections::HashSet;

use lastpage_storage::limits::PAGE_SLAB_MIN_PAGES;
use lastpage_storage::page_memory::PageMemory;
use lastpage_storage::sync::model_check;
use loom::sync::Arc;
use loom::thread;

#[test]
fn takers_racing_across_a_slab_boundary_never_share_a_buffer() {
    model_check(3, || {
        let memory = Arc::new(PageMemory::new());
        // One buffer is left in the first slab: the takers below race for it and for adding the
        // second slab.
        let taken: Vec<usize> = (0..PAGE_SLAB_MIN_PAGES - 1)
            .map(|_| memory.take().as_ptr() as usize)
            .collect();
        let takers: Vec<_> = (0..2)
            .map(|_| {
                let memory = Arc::clone(&memory);
                thread::spawn(move || {
                    [memory.take(), memory.take()].map(|buffer| buffer.as_ptr() as usize)
                })
            })
            .collect();
        // Meanwhile a buffer is handed back and taken again (by this thread or by a taker).
        let returned = memory.take();
        // SAFETY: taken from this memory just above and not used again.
        unsafe { memory.give_back(returned) };
        let mut held: Vec<usize> = vec![memory.take().as_ptr() as usize];
        for taker in takers {
            held.extend(taker.join().unwrap());
        }
        // The five buffers held now are distinct from each other and from the first ones.
        let mut seen: HashSet<usize> = taken.into_iter().collect();
        for address in held {
            assert!(
                seen.insert(address),
                "buffer {address:#x} was handed out twice"
            );
        }
        assert_eq!(seen.len(), PAGE_SLAB_MIN_PAGES - 1 + 5);
    });
}
