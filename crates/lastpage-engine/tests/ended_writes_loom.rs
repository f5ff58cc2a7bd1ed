//! Model checks with loom of the reads that trust the count of ended writes (`ended_writes.rs`)
//! instead of reading a row a second time: an update or delete that finds its row and then
//! locks it (`Table::find_locked_with`), and a READ COMMITTED lookup that finds the row
//! unlocked (`Table::committed_value`). Writers change the row under its exclusive lock from
//! the real lock manager, count themselves in the real striped count (in different stripes)
//! and let their locks go, as `Session::end_transaction` and a statement's rollback do; the
//! row stands for its leaf, read and written under the leaf's latch. In every interleaving (up
//! to a preemption bound) the update must act on the row's current version and the lookup must
//! return a committed one. Run with:
//!
//! ```text
//! RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target-loom \
//!     cargo test -p lastpage-engine --release --test ended_writes_loom
//! ```
#![cfg(loom)]

use lastpage_engine::ended_writes::EndedWrites;
use lastpage_engine::locks::{LockKey, LockManager, LockMode, TxnId};
use lastpage_storage::sync::model_check;
use loom::sync::{Arc, Mutex};
use loom::thread;

/// The row's value before any writer ran.
const FIRST_VALUE: u64 = 0;
/// What the committing writer writes first and then overwrites: never committed.
const UNCOMMITTED_STEP: u64 = 1;
/// What the committing writer commits.
const COMMITTED_VALUE: u64 = 2;
/// What the rolled-back writer writes and then undoes: never committed.
const ROLLED_BACK_VALUE: u64 = 3;

/// The row (its leaf), its lock, and the database's count of ended writes.
struct World {
    locks: LockManager,
    row: Mutex<u64>,
    ended: EndedWrites,
}

impl World {
    fn new() -> World {
        World {
            locks: LockManager::new(1),
            row: Mutex::new(FIRST_VALUE),
            ended: EndedWrites::default(),
        }
    }

    fn read(&self) -> u64 {
        *self.row.lock().unwrap()
    }

    fn write(&self, value: u64) {
        *self.row.lock().unwrap() = value;
    }

    fn lock(&self, txn: u64) {
        self.locks
            .acquire(TxnId(txn), &row_key(), LockMode::Exclusive, None)
            .unwrap();
    }

    /// A writer's end: counted after its last change and before its lock goes.
    fn end(&self, txn: u64, stripe: usize) {
        self.ended.note_in_stripe(stripe);
        self.locks.release_all(TxnId(txn), &[row_key()]);
    }
}

fn row_key() -> LockKey {
    LockKey::new(1, b"r")
}

/// A transaction that changes the row twice and commits the second value: a reader that
/// returned the first would return a value never committed.
fn committing_writer(world: &World, txn: u64, stripe: usize) {
    world.lock(txn);
    world.write(UNCOMMITTED_STEP);
    world.write(COMMITTED_VALUE);
    world.end(txn, stripe);
}

/// A transaction that changes the row and rolls back: its undo puts the value back.
fn rolled_back_writer(world: &World, txn: u64, stripe: usize) {
    world.lock(txn);
    let before = world.read();
    world.write(ROLLED_BACK_VALUE);
    world.write(before);
    world.end(txn, stripe);
}

#[test]
fn an_update_that_trusts_an_unmoved_count_locks_the_current_version() {
    model_check(3, || {
        let world = Arc::new(World::new());
        let writers = spawn_writers(&world);
        // As `Table::find_locked_with`: read the count, find the row, lock it; the version read
        // stands if the count did not move, else the row is read again and, changed, looked up
        // once more with the lock let go.
        let updater = 9;
        let acted_on = loop {
            let read_at = world.ended.count();
            let read = world.read();
            world.lock(updater);
            if world.ended.count() == read_at {
                break read;
            }
            let current = world.read();
            if current == read {
                break current;
            }
            world.locks.release_all(TxnId(updater), &[row_key()]);
        };
        // The update holds the lock: the version it acts on must be the row's.
        assert_eq!(
            acted_on,
            world.read(),
            "the update acted on a version left behind"
        );
        world.write(acted_on + 100);
        world.end(updater, 0);
        for writer in writers {
            writer.join().unwrap();
        }
    });
}

#[test]
fn a_lookup_that_trusts_an_unmoved_count_returns_a_committed_value() {
    model_check(3, || {
        let world = Arc::new(World::new());
        let writers = spawn_writers(&world);
        // As `Table::committed_value`'s quick check: the count, the row, then the lock free and
        // the count unmoved. (Otherwise it reads again under the leaf's latch, which this model
        // does not check.)
        let read_at = world.ended.count();
        let read = world.read();
        if !world.locks.is_locked_by_other(None, &row_key()) && world.ended.count() == read_at {
            assert!(
                [FIRST_VALUE, COMMITTED_VALUE].contains(&read),
                "the lookup returned {read}, never committed"
            );
        }
        for writer in writers {
            writer.join().unwrap();
        }
    });
}

/// The committing writer (stripe 0) and the rolled-back one (stripe 1), on threads of their own.
fn spawn_writers(world: &Arc<World>) -> Vec<thread::JoinHandle<()>> {
    let committing = {
        let world = Arc::clone(world);
        thread::spawn(move || committing_writer(&world, 1, 0))
    };
    let rolled_back = {
        let world = Arc::clone(world);
        thread::spawn(move || rolled_back_writer(&world, 2, 1))
    };
    vec![committing, rolled_back]
}
