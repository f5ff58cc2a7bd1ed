//! Model check of the READ COMMITTED lookup protocol over rows deleted by open transactions
//! (`pending.rs`) with loom: a deleter notes a row, removes it, puts it back and clears its
//! note (a rolled-back delete), while a lookup reads the row the way `Table::find_record_waiting`
//! does. In every interleaving (up to a preemption bound) the lookup must find the row, which
//! stayed committed throughout. The second model has the deleter escalate half way: its note of
//! the whole table replaces its row's note and stands for a second row it deletes afterwards,
//! unnoted. Run with:
//!
//! ```text
//! RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target-loom \
//!     cargo test -p lastpage-engine --release --test pending_loom
//! ```
#![cfg(loom)]

use std::ops::Bound;

use lastpage_engine::locks::TxnId;
use lastpage_engine::pending::PendingDeletes;
use lastpage_storage::sync::model_check;
use loom::sync::atomic::{AtomicBool, Ordering};
use loom::sync::{Arc, Mutex};
use loom::thread;

const KEYS: [&[u8]; 2] = [b"j", b"k"];

/// The rows' tree (each present or not) and the deleter's exclusive lock on them (on its rows,
/// and then on the whole table).
struct World {
    pending: PendingDeletes,
    rows_present: Mutex<[bool; 2]>,
    locked: AtomicBool,
}

impl World {
    fn new() -> World {
        World {
            pending: PendingDeletes::default(),
            rows_present: Mutex::new([true; 2]),
            locked: AtomicBool::new(false),
        }
    }

    fn set_present(&self, row: usize, present: bool) {
        self.rows_present.lock().unwrap()[row] = present;
    }
}

/// A lookup of row `row` (`KEYS[row]`): the optimistic read, then the read with the set held
/// still, waiting for the deleter's lock whenever a note of another transaction covers the key.
fn lookup_row(world: &World, row: usize) -> bool {
    let key = KEYS[row];
    loop {
        let version = world.pending.version();
        let present = world.rows_present.lock().unwrap()[row];
        if world.pending.quiet_since(version) {
            return present;
        }
        let held = world.pending.hold();
        // As `Table::read_waiting_for_deleters`: the read stands if nothing was noted or cleared
        // since it began.
        let present = if world.pending.version() == version {
            present
        } else {
            world.rows_present.lock().unwrap()[row]
        };
        let upper = if present {
            Bound::Excluded(key)
        } else {
            Bound::Included(key)
        };
        if held
            .first_of_others(None, Bound::Included(key), upper)
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

/// Explores (up to a preemption bound) every interleaving of `deleter`, which runs on a thread
/// of its own holding the deleter's lock from its start to its end, with `lookups` on the main
/// thread.
fn check(deleter: fn(&World), lookups: fn(&World)) {
    model_check(3, move || {
        let world = Arc::new(World::new());
        let deleter = {
            let world = Arc::clone(&world);
            thread::spawn(move || {
                world.locked.store(true, Ordering::Release);
                deleter(&world);
                world.locked.store(false, Ordering::Release);
            })
        };
        lookups(&world);
        deleter.join().unwrap();
    });
}

#[test]
fn a_lookup_never_misses_a_row_whose_delete_rolls_back() {
    check(
        |world| {
            world.pending.note(TxnId(1), 0, KEYS[1], b"");
            world.set_present(1, false);
            // Rolled back: the row goes back, then the note, then the lock.
            world.set_present(1, true);
            world.pending.clear(TxnId(1));
        },
        |world| {
            assert!(
                lookup_row(world, 1),
                "the lookup reported a committed row missing"
            )
        },
    );
}

/// The deleter deletes `KEYS[1]` (noted), escalates (its note of the whole table replaces the
/// row's; the lock it holds stays held), deletes `KEYS[0]` without noting it, and rolls back.
/// A lookup of either row must find it.
#[test]
fn a_lookup_never_misses_a_row_deleted_under_a_whole_table_note() {
    check(
        |world| {
            world.pending.note(TxnId(1), 0, KEYS[1], b"");
            world.set_present(1, false);
            world.pending.note_whole_table(TxnId(1));
            world.set_present(0, false);
            world.set_present(0, true);
            world.set_present(1, true);
            world.pending.clear(TxnId(1));
        },
        |world| {
            assert!(
                lookup_row(world, 0),
                "the lookup reported the row deleted after the escalation missing"
            );
            assert!(
                lookup_row(world, 1),
                "the lookup reported the row deleted before the escalation missing"
            );
        },
    );
}
