//! Model checks of both latch flavours with loom: every interleaving (up to a preemption bound)
//! of a few threads is explored, loom's `UnsafeCell` reports any access to the guarded data that
//! is not ordered by the latch, and a thread that parks and is never woken is reported as a
//! deadlock. Run with:
//!
//! ```text
//! RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target-loom \
//!     cargo test -p lastpage-storage --release --test latch_loom
//! ```
//!
//! `LOOM_MAX_PREEMPTIONS` overrides the default bound of this file (see [`check`]).
#![cfg(loom)]

use lastpage_storage::latch::{Latch, LatchClass, LatchMode, LatchPolicy};
use lastpage_storage::sync::model_check;
use loom::cell::UnsafeCell;
use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::sync::{Arc, Mutex};
use loom::thread;

use LatchMode::{Exclusive, Shared, Update};

/// Runs `body` under loom for one policy. The preemption bound keeps the whole file to a couple
/// of minutes; bugs in latch protocols need very few preemptions to show.
fn check(
    policy: LatchPolicy,
    preemptions: usize,
    body: impl Fn(LatchPolicy) + Sync + Send + 'static,
) {
    model_check(preemptions, move || body(policy));
}

fn both(preemptions: usize, body: impl Fn(LatchPolicy) + Sync + Send + Clone + 'static) {
    for policy in LatchPolicy::ALL {
        check(policy, preemptions, body.clone());
    }
}

/// A value protected by a latch, as a page's bytes are protected by its frame's latch.
struct Guarded {
    latch: Latch,
    value: UnsafeCell<u64>,
    /// How many threads are inside, by mode, to check compatibility directly.
    exclusive_inside: AtomicUsize,
    shared_inside: AtomicUsize,
}

// SAFETY: `value` is only accessed through `read` and `write`, whose callers hold the latch in a
// mode that permits the access; that claim is exactly what loom checks (a conflicting access
// that the latch does not order is reported as a causality violation).
unsafe impl Sync for Guarded {}

impl Guarded {
    fn new(policy: LatchPolicy) -> Arc<Guarded> {
        Arc::new(Guarded {
            latch: Latch::new(policy, LatchClass::Buffer),
            value: UnsafeCell::new(0),
            exclusive_inside: AtomicUsize::new(0),
            shared_inside: AtomicUsize::new(0),
        })
    }

    /// Caller holds the latch in any mode.
    fn read(&self) -> u64 {
        // SAFETY: the caller holds the latch, so no writer is inside; loom verifies it.
        self.value.with(|value| unsafe { *value })
    }

    /// Caller holds the latch exclusively.
    fn write(&self, new: u64) {
        // SAFETY: the caller holds the latch exclusively; loom verifies it.
        self.value.with_mut(|value| unsafe { *value = new });
    }

    fn enter(&self, mode: LatchMode) {
        self.latch.acquire(mode);
        self.entered(mode);
    }

    fn entered(&self, mode: LatchMode) {
        match mode {
            Exclusive => {
                assert_eq!(self.exclusive_inside.fetch_add(1, Ordering::SeqCst), 0);
                assert_eq!(self.shared_inside.load(Ordering::SeqCst), 0);
                assert!(self.latch.is_held_exclusive());
            }
            Shared | Update => {
                self.shared_inside.fetch_add(1, Ordering::SeqCst);
                assert_eq!(self.exclusive_inside.load(Ordering::SeqCst), 0);
            }
        }
    }

    fn leave(&self, mode: LatchMode) {
        match mode {
            Exclusive => self.exclusive_inside.fetch_sub(1, Ordering::SeqCst),
            Shared | Update => self.shared_inside.fetch_sub(1, Ordering::SeqCst),
        };
        self.latch.release(mode);
    }

    fn increment(&self) {
        self.enter(Exclusive);
        self.write(self.read() + 1);
        self.leave(Exclusive);
    }

    /// The value as read under the latch in `mode`, once the model's threads have finished.
    fn final_value(&self, mode: LatchMode) -> u64 {
        self.latch.acquire(mode);
        let value = self.read();
        self.latch.release(mode);
        value
    }
}

/// Runs `body` on a thread of its own, with its own handle on `guarded`. (A free function: loom's
/// `Arc` cannot be a method's receiver.)
fn spawn_with(
    guarded: &Arc<Guarded>,
    body: impl FnOnce(&Guarded) + Send + 'static,
) -> thread::JoinHandle<()> {
    let guarded = guarded.clone();
    thread::spawn(move || body(&guarded))
}

/// A latch that threads queue on, and the order in which they got it, for the tests of who is
/// served first.
struct Queue {
    latch: Arc<Latch>,
    order: Arc<Mutex<Vec<char>>>,
}

impl Queue {
    fn new(policy: LatchPolicy) -> Queue {
        Queue {
            latch: Arc::new(Latch::new(policy, LatchClass::Buffer)),
            order: Arc::new(Mutex::new(Vec::new())),
        }
    }

    /// A thread that takes the latch in `mode`, records `name` while it holds it, and leaves.
    fn spawn(&self, name: char, mode: LatchMode) -> thread::JoinHandle<()> {
        let latch = self.latch.clone();
        let order = self.order.clone();
        thread::spawn(move || {
            latch.acquire(mode);
            order.lock().unwrap().push(name);
            latch.release(mode);
        })
    }

    fn order(&self) -> Vec<char> {
        self.order.lock().unwrap().clone()
    }
}

fn wait_until_parked(latch: &Latch, count: usize) {
    while latch.parked_waiters() < count {
        thread::yield_now();
    }
}

#[test]
fn exclusive_holders_exclude_each_other() {
    both(2, |policy| {
        let guarded = Guarded::new(policy);
        let threads: Vec<_> = (0..2)
            .map(|_| spawn_with(&guarded, Guarded::increment))
            .collect();
        guarded.increment();
        threads.into_iter().for_each(|t| t.join().unwrap());
        assert_eq!(guarded.final_value(Shared), 3);
    });
}

#[test]
fn readers_and_an_updater_exclude_a_writer() {
    both(2, |policy| {
        let guarded = Guarded::new(policy);
        let writer = spawn_with(&guarded, Guarded::increment);
        let updater = spawn_with(&guarded, |guarded| {
            guarded.enter(Update);
            let seen = guarded.read();
            assert!(seen <= 1);
            guarded.leave(Update);
        });
        guarded.enter(Shared);
        let seen = guarded.read();
        guarded.leave(Shared);
        writer.join().unwrap();
        updater.join().unwrap();
        assert!(seen <= 1);
    });
}

/// If a compatible mode were refused, the main thread would wait for its child while holding
/// the latch the child needs, and loom would report the deadlock.
#[test]
fn compatible_modes_are_held_together() {
    for (held, asked) in [(Shared, Shared), (Shared, Update), (Update, Shared)] {
        both(3, move |policy| {
            let latch = Arc::new(Latch::new(policy, LatchClass::Buffer));
            latch.acquire(held);
            let child = {
                let latch = latch.clone();
                thread::spawn(move || {
                    latch.acquire(asked);
                    latch.release(asked);
                })
            };
            child.join().unwrap();
            latch.release(held);
        });
    }
}

/// Three threads in three modes, with an upgrade and a downgrade: all must finish (no lost
/// wake-up) and the upgrade and downgrade must let no writer in between.
#[test]
fn upgrade_and_downgrade_admit_no_writer_in_between() {
    both(2, |policy| {
        let guarded = Guarded::new(policy);
        let writer = spawn_with(&guarded, Guarded::increment);
        let reader = spawn_with(&guarded, |guarded| {
            guarded.enter(Shared);
            let seen = guarded.read();
            assert!(matches!(seen, 0 | 1 | 10 | 11), "{seen}");
            guarded.leave(Shared);
        });
        guarded.enter(Update);
        let before = guarded.read();
        guarded.shared_inside.fetch_sub(1, Ordering::SeqCst);
        guarded.latch.upgrade();
        guarded.entered(Exclusive);
        // A writer between the update latch and the upgrade would make `before` stale and lose
        // its increment: the final value would be 10, not 11.
        guarded.write(before + 10);
        guarded.exclusive_inside.fetch_sub(1, Ordering::SeqCst);
        guarded.latch.downgrade();
        guarded.entered(Shared);
        assert_eq!(
            guarded.read(),
            before + 10,
            "a writer got in during the downgrade"
        );
        guarded.leave(Shared);
        writer.join().unwrap();
        reader.join().unwrap();
        assert_eq!(guarded.final_value(Shared), 11);
    });
}

/// An upgrader waiting for a reader is not starved by new readers: once it waits, a new shared
/// request is refused (and would queue) although the latch is only shared-held.
#[test]
fn a_waiting_upgrader_keeps_new_readers_out() {
    both(3, |policy| {
        let guarded = Guarded::new(policy);
        guarded.latch.acquire(Shared);
        let upgrader = spawn_with(&guarded, |guarded| {
            guarded.latch.acquire(Update);
            let before = guarded.read();
            guarded.latch.upgrade();
            guarded.write(before + 1);
            guarded.latch.release(Exclusive);
        });
        // Wait until the upgrader holds the update latch and waits for us.
        wait_until_parked(&guarded.latch, 1);
        assert!(
            !guarded.latch.try_acquire(Shared),
            "a new reader overtook the upgrader"
        );
        assert_eq!(guarded.read(), 0);
        guarded.latch.release(Shared);
        upgrader.join().unwrap();
        assert!(guarded.latch.try_acquire(Shared));
        assert_eq!(guarded.read(), 1);
        guarded.latch.release(Shared);
    });
}

/// Main holds the latch in `held`; A then B queue for `a` and `b`; main releases. Everyone must
/// finish, and with the fifo latch A must be served before B.
fn queue_of_two(policy: LatchPolicy, held: LatchMode, a: LatchMode, b: LatchMode) {
    let queue = Queue::new(policy);
    queue.latch.acquire(held);
    let first = queue.spawn('A', a);
    wait_until_parked(&queue.latch, 1);
    let second = queue.spawn('B', b);
    wait_until_parked(&queue.latch, 2);
    queue.latch.release(held);
    first.join().unwrap();
    second.join().unwrap();
    let order = queue.order();
    assert_eq!(order.len(), 2);
    if policy == LatchPolicy::Fifo && !(a == Shared && b == Shared) {
        assert_eq!(
            order,
            ['A', 'B'],
            "the fifo latch served its queue out of order"
        );
    }
}

#[test]
fn queued_waiters_are_all_woken_and_fifo_serves_them_in_order() {
    for (held, a, b) in [
        (Exclusive, Exclusive, Exclusive),
        (Exclusive, Shared, Exclusive),
        (Exclusive, Exclusive, Shared),
        (Exclusive, Shared, Shared),
        (Update, Update, Exclusive),
    ] {
        both(3, move |policy| queue_of_two(policy, held, a, b));
    }
}

/// With a writer queued behind a reader, a newcomer reader must not barge past the writer, even
/// though its mode is compatible with the holder's. (The fifo latch queues it because someone is
/// queued; the adaptive one because the writer has claimed the latch.)
#[test]
fn a_reader_does_not_overtake_a_queued_writer() {
    both(3, |policy| {
        let queue = Queue::new(policy);
        queue.latch.acquire(Shared);
        let writer = queue.spawn('W', Exclusive);
        wait_until_parked(&queue.latch, 1);
        assert!(
            !queue.latch.try_acquire(Shared),
            "a newcomer barged past the queued writer"
        );
        let reader = queue.spawn('R', Shared);
        wait_until_parked(&queue.latch, 2);
        queue.latch.release(Shared);
        writer.join().unwrap();
        reader.join().unwrap();
        assert_eq!(queue.order(), ['W', 'R']);
    });
}

/// The difference between the flavours: after a release to a queued waiter, the fifo latch is
/// already owned by that (possibly not yet running) waiter in every interleaving, while the
/// adaptive latch is free for whoever runs first: in some interleaving the releasing thread takes
/// it straight back, and the woken waiter still gets it afterwards.
#[test]
fn fifo_hands_off_and_adaptive_lets_a_running_thread_barge() {
    // Outside the model: set by any execution in which the releaser barged.
    static BARGED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    for policy in LatchPolicy::ALL {
        BARGED.store(false, std::sync::atomic::Ordering::SeqCst);
        check(policy, 3, |policy| {
            let guarded = Guarded::new(policy);
            // The waiter keeps the latch, once it has it, until the main thread has tried.
            let tried = Arc::new(AtomicUsize::new(0));
            guarded.latch.acquire(Exclusive);
            let waiter = {
                let guarded = guarded.clone();
                let tried = tried.clone();
                thread::spawn(move || {
                    guarded.enter(Exclusive);
                    guarded.write(guarded.read() + 1);
                    while tried.load(Ordering::SeqCst) == 0 {
                        thread::yield_now();
                    }
                    guarded.leave(Exclusive);
                })
            };
            wait_until_parked(&guarded.latch, 1);
            guarded.latch.release(Exclusive);
            let barged = guarded.latch.try_acquire(Exclusive);
            if barged {
                BARGED.store(true, std::sync::atomic::Ordering::SeqCst);
                guarded.write(guarded.read() + 1);
                guarded.latch.release(Exclusive);
            }
            tried.store(1, Ordering::SeqCst);
            waiter.join().unwrap();
            assert_eq!(guarded.final_value(Shared), 1 + u64::from(barged));
        });
        let barged = BARGED.load(std::sync::atomic::Ordering::SeqCst);
        match policy {
            LatchPolicy::Fifo => assert!(!barged, "the fifo latch was not handed off"),
            LatchPolicy::Adaptive => assert!(barged, "the adaptive latch was always handed off"),
        }
    }
}

/// Two writers and a reader contend with nothing forcing an order: whatever the interleaving,
/// everyone finishes and the counter is exact.
#[test]
fn contended_mixed_modes_never_lose_a_wake_up() {
    both(2, |policy| {
        let guarded = Guarded::new(policy);
        let writers: Vec<_> = (0..2)
            .map(|_| spawn_with(&guarded, Guarded::increment))
            .collect();
        guarded.enter(Shared);
        assert!(guarded.read() <= 2);
        guarded.leave(Shared);
        writers.into_iter().for_each(|t| t.join().unwrap());
        assert_eq!(guarded.final_value(Exclusive), 2);
    });
}

/// Flow control (OPTIMIZE_FOR_SEQUENTIAL_KEY) with one place and three workers: never two
/// inside at once, and no worker is left parked (loom reports a deadlock if one is).
#[test]
fn flow_control_admits_one_at_a_time_and_loses_no_wake_up() {
    use lastpage_storage::btree::flow_control::FlowControl;
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = Some(2);
    builder.check(|| {
        let flow = loom::sync::Arc::new(FlowControl::new(1, true));
        let inside = loom::sync::Arc::new(loom::sync::atomic::AtomicUsize::new(0));
        let workers: Vec<_> = (0..2)
            .map(|worker| {
                let flow = flow.clone();
                let inside = inside.clone();
                loom::thread::spawn(move || {
                    let ticket = flow.enter(worker == 0);
                    assert_eq!(inside.fetch_add(1, loom::sync::atomic::Ordering::SeqCst), 0);
                    inside.fetch_sub(1, loom::sync::atomic::Ordering::SeqCst);
                    drop(ticket);
                })
            })
            .collect();
        let ticket = flow.enter(true);
        assert_eq!(inside.fetch_add(1, loom::sync::atomic::Ordering::SeqCst), 0);
        inside.fetch_sub(1, loom::sync::atomic::Ordering::SeqCst);
        drop(ticket);
        for worker in workers {
            worker.join().unwrap();
        }
        assert_eq!(flow.admitted(), 0);
    });
}
