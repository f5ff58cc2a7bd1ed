//! Model check of the READ COMMITTED lookup protocol over rows deleted by open transactions
//! (`pending.rs`) with loom: a deleter notes a row, removes it, puts it back and clears its
//! note (a rolled-back delete), while a lookup reads the row the way `Table::find_record_waiting`
//! does. In every interleaving (up to a preemption bound) the lookup must find the row, which
//! stayed committed throughout. Run with:
//!
//! ```text
//! RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target-loom \
//!     cargo test -p lastpage-engine --release --test pending_loom
//! ```
#![cfg(loom)]

use std::ops::Bound;

use lastpage_engine::locks::TxnId;
use lastpage_engine::pending::PendingDeletes;
use loom::sync::atomic::{AtomicBool, Ordering};
use loom::sync::{Arc, Mutex};
use loom::thread;

const KEY: &[u8] = b"k";

/// The row's tree (present or not) and the deleter's exclusive lock on it.
struct World {
    pending: PendingDeletes,
    row_present: Mutex<bool>,
    locked: AtomicBool,
}

/// A lookup of `KEY`: the optimistic read, then the read with the set held still, waiting for
/// the deleter's lock whenever a note of another transaction covers the key.
fn lookup(world: &World) -> bool {
    loop {
        let version = world.pending.version();
        let present = *world.row_present.lock().unwrap();
        if world.pending.quiet_since(version) {
            return present;
        }
        let held = world.pending.hold();
        let present = *world.row_present.lock().unwrap();
        let upper = if present {
            Bound::Excluded(KEY)
        } else {
            Bound::Included(KEY)
        };
        if held
            .first_of_others(None, Bound::Included(KEY), upper)
            .is_none()
        {
            return present;
        }
        drop(held);
        while world.locked.load(Ordering::Acquire) {
            thread::yield_now();
        }
    }
}

#[test]
fn a_lookup_never_misses_a_row_whose_delete_rolls_back() {
    let mut builder = loom::model::Builder::new();
    if builder.preemption_bound.is_none() {
        builder.preemption_bound = Some(3);
    }
    builder.check(|| {
        let world = Arc::new(World {
            pending: PendingDeletes::default(),
            row_present: Mutex::new(true),
            locked: AtomicBool::new(false),
        });
        let deleter = {
            let world = Arc::clone(&world);
            thread::spawn(move || {
                world.locked.store(true, Ordering::Release);
                world.pending.note(TxnId(1), 0, KEY, b"");
                *world.row_present.lock().unwrap() = false;
                // Rolled back: the row goes back, then the note, then the lock.
                *world.row_present.lock().unwrap() = true;
                world.pending.clear(TxnId(1));
                world.locked.store(false, Ordering::Release);
            })
        };
        assert!(
            lookup(&world),
            "the lookup reported a committed row missing"
        );
        deleter.join().unwrap();
    });
}
