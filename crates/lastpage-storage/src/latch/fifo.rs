//! The fair FIFO hand-off latch, the kind SQL Server's page latches are and the kind that
//! convoys.
//!
//! State word (one `AtomicU64`):
//!
//! | bits  | name        | meaning                                                        |
//! |-------|-------------|----------------------------------------------------------------|
//! | 0     | `EXCLUSIVE` | held exclusively                                               |
//! | 1     | `UPDATE`    | held in update mode (by at most one thread)                    |
//! | 2     | `QUEUED`    | the wait queue is not empty                                    |
//! | 3     | `UPGRADING` | the update holder waits in `upgrade` for the readers to leave  |
//! | 4..64 | shared      | number of shared holders                                       |
//!
//! Rules that make it fair:
//! - The fast paths are a CAS: acquire's requires `QUEUED` and `UPGRADING` to be clear,
//!   downgrade's `QUEUED`, and release's both too, except for a reader that is not the last
//!   one, which may always leave (no waiter waits for the shared count to drop to anything but
//!   zero). Once anyone waits, newcomers go to the slow path and queue behind, even if their
//!   mode is compatible with the holders: no barging.
//! - `QUEUED` is set only under the queue mutex, by a CAS that also re-checks that the latch is
//!   still incompatible. A releaser's fast-path CAS therefore either happens before it (and the
//!   queuer then finds the latch free and takes it) or fails (and the releaser takes the slow
//!   path): no lost wake-up.
//! - A slow release computes the new state *including the grants*: it adds the modes of the head
//!   of the queue (one exclusive waiter, or the run of consecutive shared and update waiters that
//!   are compatible with each other) to the state word in the same CAS that removes its own mode,
//!   and only then signals them. The latch is thereby owned by threads that have not run yet:
//!   with more threads than cores each hand-off waits for a context switch, and every thread that
//!   arrives meanwhile queues behind. That is the convoy.
//! - Invariant, whenever the queue mutex is free: the head of the queue is not compatible with
//!   the state (otherwise it would have been granted), or `UPGRADING` is set (the queue waits
//!   for the upgrader).
//!
//! There is no spinning before queueing. Once one thread is queued no newcomer can get the latch
//! without queueing, so spinning could only ever pay off for the first contender, and on two
//! cores with hundreds of threads it burns the cycles the holder needs. SQL Server's latch does
//! spin briefly, but what this flavour must reproduce is the hand-off, not the spin.

use std::collections::VecDeque;

use super::{Core, LatchClass, LatchMode, Queued, WakeList, current_waiter, not_held};
use crate::stats;
use crate::sync::{self, Ordering};

const EXCLUSIVE: u64 = 1 << 0;
const UPDATE: u64 = 1 << 1;
const QUEUED: u64 = 1 << 2;
const UPGRADING: u64 = 1 << 3;
const ONE_SHARED: u64 = 1 << 4;
const SHARED_MASK: u64 = !(ONE_SHARED - 1);
/// While any of these is set, every acquisition and every release that could let someone in
/// goes through the queue mutex.
const SLOW: u64 = QUEUED | UPGRADING;

fn shared_count(state: u64) -> u64 {
    state >> ONE_SHARED.trailing_zeros()
}

/// The bits a holder of `mode` adds to the state.
fn bits(mode: LatchMode) -> u64 {
    match mode {
        LatchMode::Shared => ONE_SHARED,
        LatchMode::Update => UPDATE,
        LatchMode::Exclusive => EXCLUSIVE,
    }
}

/// Whether `mode` can be granted on top of `state`, ignoring the queue. (A pending upgrade keeps
/// new readers out through `SLOW`: the fast paths refuse, the slow path queues them, and the
/// queue is not served while `UPGRADING` is set.)
fn grantable(state: u64, mode: LatchMode) -> bool {
    match mode {
        LatchMode::Shared => state & EXCLUSIVE == 0,
        LatchMode::Update => state & (EXCLUSIVE | UPDATE) == 0,
        LatchMode::Exclusive => state & (EXCLUSIVE | UPDATE | SHARED_MASK) == 0,
    }
}

/// Whether `state` shows `mode` held (by someone; a latch does not know its holders).
fn holds(state: u64, mode: LatchMode) -> bool {
    match mode {
        LatchMode::Shared => state & SHARED_MASK != 0,
        LatchMode::Update => state & UPDATE != 0,
        LatchMode::Exclusive => state & EXCLUSIVE != 0,
    }
}

/// Which waiters at the head of the queue can be granted on top of `state`, in order: returns
/// the state with their modes added (and `QUEUED` cleared if that empties the queue) and how
/// many they are. Stops at the first waiter that is not compatible, even if a later one would be:
/// strict arrival order.
fn plan_grants(state: u64, waiters: &VecDeque<Queued>) -> (u64, usize) {
    debug_assert_eq!(state & UPGRADING, 0);
    let mut new = state;
    let mut granted = 0;
    for queued in waiters {
        if !grantable(new, queued.mode) {
            break;
        }
        new += bits(queued.mode);
        granted += 1;
    }
    if granted == waiters.len() {
        new &= !QUEUED;
    }
    (new, granted)
}

/// A latch's state word and queue, seen as this flavour.
pub(super) struct FifoLatch<'a>(pub(super) &'a Core);

impl std::ops::Deref for FifoLatch<'_> {
    type Target = Core;

    fn deref(&self) -> &Core {
        self.0
    }
}

impl FifoLatch<'_> {
    pub(super) fn is_held_exclusive(&self) -> bool {
        self.state.load(Ordering::Relaxed) & EXCLUSIVE != 0
    }

    #[inline]
    pub(super) fn try_acquire(&self, mode: LatchMode) -> bool {
        let mut state = self.state.load(Ordering::Relaxed);
        // Loops only while the latch stays available and the CAS loses to another compatible
        // change (a reader coming or going), never while it is held incompatibly.
        while state & SLOW == 0 && grantable(state, mode) {
            match self.state.compare_exchange_weak(
                state,
                state + bits(mode),
                Ordering::Acquire,
                Ordering::Relaxed,
            ) {
                Ok(_) => return true,
                Err(actual) => state = actual,
            }
        }
        false
    }

    #[inline]
    pub(super) fn acquire(&self, mode: LatchMode, class: LatchClass) {
        if !self.try_acquire(mode) {
            self.acquire_slow(mode, class);
        }
    }

    #[cold]
    fn acquire_slow(&self, mode: LatchMode, class: LatchClass) {
        // The wait starts at the failed attempt, before the queue mutex (which may itself be
        // contended) is taken.
        let wait = stats::begin_wait(mode.wait_type(class), Some(class));
        let waiter = current_waiter();
        {
            let mut queue = sync::lock(&self.queue);
            let mut state = self.state.load(Ordering::Relaxed);
            loop {
                if state & SLOW == 0 && grantable(state, mode) {
                    // Released between the failed attempt and now, with nobody queued.
                    match self.state.compare_exchange(
                        state,
                        state + bits(mode),
                        Ordering::Acquire,
                        Ordering::Relaxed,
                    ) {
                        Ok(_) => {
                            drop(queue);
                            wait.end(None);
                            return;
                        }
                        Err(actual) => state = actual,
                    }
                } else {
                    // Re-checked and set in one CAS: a releaser either saw no QUEUED and left
                    // before this (then the CAS fails and we look again), or sees it and comes to
                    // the mutex we hold.
                    match self.state.compare_exchange(
                        state,
                        state | QUEUED,
                        Ordering::Relaxed,
                        Ordering::Relaxed,
                    ) {
                        Ok(_) => break,
                        Err(actual) => state = actual,
                    }
                }
            }
            waiter.prepare();
            queue.waiters.push_back(Queued {
                waiter: waiter.clone(),
                mode,
            });
        }
        let signalled = waiter.wait();
        // The grant was made by the releaser's CAS; this acquire load also synchronizes with the
        // release sequence of every earlier holder (readers that left by a fast-path decrement).
        let state = self.state.load(Ordering::Acquire);
        debug_assert!(holds(state, mode));
        wait.end(Some(signalled));
    }

    #[inline]
    pub(super) fn release(&self, mode: LatchMode) {
        let mut state = self.state.load(Ordering::Relaxed);
        loop {
            if !holds(state, mode) {
                not_held("release", mode, state);
            }
            // A reader that is not the last may leave even with waiters: no waiter can be
            // waiting for the shared count to drop to anything but zero.
            let fast = state & SLOW == 0 || (mode == LatchMode::Shared && shared_count(state) > 1);
            if !fast {
                break;
            }
            match self.state.compare_exchange_weak(
                state,
                state - bits(mode),
                Ordering::Release,
                Ordering::Relaxed,
            ) {
                Ok(_) => return,
                Err(actual) => state = actual,
            }
        }
        self.release_slow(mode);
    }

    /// Releases `mode` and hands the latch to whoever is next: the upgrader if the last reader
    /// leaves, else the head of the queue.
    #[cold]
    fn release_slow(&self, mode: LatchMode) {
        let mut wake = WakeList::new();
        let mut queue = sync::lock(&self.queue);
        let mut state = self.state.load(Ordering::Relaxed);
        loop {
            if !holds(state, mode) {
                drop(queue);
                not_held("release", mode, state);
            }
            let mut new = state - bits(mode);
            let mut to_upgrader = false;
            let mut granted = 0;
            if new & UPGRADING != 0 {
                // The update holder waits for the readers; nobody in the queue can be granted
                // before it, since it holds the update bit and then the exclusive bit.
                if shared_count(new) == 0 {
                    new = new - UPDATE - UPGRADING + EXCLUSIVE;
                    to_upgrader = true;
                }
            } else {
                (new, granted) = plan_grants(new, &queue.waiters);
            }
            // AcqRel: the new holders may be signalled by us only, so our acquire makes the
            // earlier holders' releases (fast-path reader decrements) part of what we pass on.
            match self
                .state
                .compare_exchange(state, new, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => {
                    if to_upgrader {
                        wake.push(queue.slot.take().expect("UPGRADING without an upgrader"));
                    }
                    for queued in queue.waiters.drain(..granted) {
                        wake.push(queued.waiter);
                    }
                    break;
                }
                Err(actual) => state = actual,
            }
        }
        drop(queue);
        wake.signal_all();
    }

    pub(super) fn upgrade(&self, class: LatchClass) {
        let mut state = self.state.load(Ordering::Relaxed);
        loop {
            if state & UPDATE == 0 || state & (EXCLUSIVE | UPGRADING) != 0 {
                not_held("upgrade", LatchMode::Update, state);
            }
            if shared_count(state) != 0 {
                break;
            }
            match self.state.compare_exchange_weak(
                state,
                state - UPDATE + EXCLUSIVE,
                Ordering::Acquire,
                Ordering::Relaxed,
            ) {
                Ok(_) => return,
                Err(actual) => state = actual,
            }
        }
        self.upgrade_slow(class);
    }

    #[cold]
    fn upgrade_slow(&self, class: LatchClass) {
        let wait = stats::begin_wait(LatchMode::Exclusive.wait_type(class), Some(class));
        let waiter = current_waiter();
        {
            let mut queue = sync::lock(&self.queue);
            let mut state = self.state.load(Ordering::Relaxed);
            loop {
                if shared_count(state) == 0 {
                    match self.state.compare_exchange(
                        state,
                        state - UPDATE + EXCLUSIVE,
                        Ordering::Acquire,
                        Ordering::Relaxed,
                    ) {
                        Ok(_) => {
                            drop(queue);
                            wait.end(None);
                            return;
                        }
                        Err(actual) => state = actual,
                    }
                } else {
                    // From now on new readers queue, and the last reader to leave comes to the
                    // mutex and hands us the exclusive bit.
                    match self.state.compare_exchange(
                        state,
                        state | UPGRADING,
                        Ordering::Relaxed,
                        Ordering::Relaxed,
                    ) {
                        Ok(_) => break,
                        Err(actual) => state = actual,
                    }
                }
            }
            waiter.prepare();
            debug_assert!(queue.slot.is_none());
            queue.slot = Some(waiter.clone());
        }
        let signalled = waiter.wait();
        let state = self.state.load(Ordering::Acquire);
        debug_assert!(state & EXCLUSIVE != 0 && shared_count(state) == 0);
        wait.end(Some(signalled));
    }

    pub(super) fn downgrade(&self) {
        let mut state = self.state.load(Ordering::Relaxed);
        loop {
            if state & EXCLUSIVE == 0 {
                not_held("downgrade", LatchMode::Exclusive, state);
            }
            if state & QUEUED != 0 {
                break;
            }
            match self.state.compare_exchange_weak(
                state,
                state - EXCLUSIVE + ONE_SHARED,
                Ordering::Release,
                Ordering::Relaxed,
            ) {
                Ok(_) => return,
                Err(actual) => state = actual,
            }
        }
        // Waiters: the shared and update ones at the head of the queue may now join us.
        let mut wake = WakeList::new();
        let mut queue = sync::lock(&self.queue);
        let mut state = self.state.load(Ordering::Relaxed);
        loop {
            let (new, granted) = plan_grants(state - EXCLUSIVE + ONE_SHARED, &queue.waiters);
            match self
                .state
                .compare_exchange(state, new, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => {
                    for queued in queue.waiters.drain(..granted) {
                        wake.push(queued.waiter);
                    }
                    break;
                }
                Err(actual) => state = actual,
            }
        }
        drop(queue);
        wake.signal_all();
    }
}
