//! The adaptive latch: unfair, spin-then-park, never hands ownership to a thread that is not
//! running, and therefore free of convoys.
//!
//! State word (one `AtomicU64`):
//!
//! | bits  | name             | meaning                                                       |
//! |-------|------------------|---------------------------------------------------------------|
//! | 0     | `EXCLUSIVE`      | held exclusively, or claimed by a writer that waits for the   |
//! |       |                  | shared holders to leave (shared count > 0): new readers wait  |
//! | 1     | `UPDATE`         | held in update mode (by at most one thread)                   |
//! | 2     | `PARKED`         | the park queue is not empty                                   |
//! | 3     | `WOKEN`          | a parked thread has been woken and has not yet acquired or    |
//! |       |                  | parked again: releasers need not wake another one             |
//! | 4     | `DRAINER_PARKED` | the writer holding `EXCLUSIVE` is parked until the last       |
//! |       |                  | reader leaves                                                 |
//! | 5..64 | shared           | number of shared holders                                      |
//!
//! An exclusive acquisition has two steps: claim the `EXCLUSIVE` bit (possible whenever no
//! exclusive or update bit is set), then wait for the shared count to drain to zero. The claimed
//! bit stops new readers, so readers can never starve a writer, and an upgrade is the same
//! second step after swapping the update bit for the exclusive one.
//!
//! A release only clears its bits. If `PARKED` is set and `WOKEN` is not, it wakes the head of
//! the queue (one writer, or a run of readers) and sets `WOKEN`; the woken threads then *compete
//! again* with every running thread, which may well take the latch first. Nobody ever owns the
//! latch without running, so a descheduled waiter cannot stall everybody behind it, and `WOKEN`
//! keeps releasers from waking a thundering herd (the idea is Go's `sync.Mutex`'s `mutexWoken`).
//!
//! Why no wake-up is lost: a thread parks only through a CAS, under the queue mutex, that both
//! sets `PARKED` and re-checks that the latch is still held incompatibly. So whenever `PARKED` is
//! set and `WOKEN` is clear, the latch is held, and the release that frees the latch sees
//! `PARKED` in the same atomic read-modify-write that frees it. If `WOKEN` is set instead, a
//! woken thread is on its way: it will either acquire (and release later, waking the next) or
//! park again through the same validating CAS, which clears `WOKEN`.

use super::{Core, LatchClass, LatchMode, Queued, WakeList, current_waiter, not_held};
use crate::limits::{
    BRIEF_SPIN_MAX_PAUSE_LOG2, BRIEF_SPIN_ROUNDS, LATCH_SPIN_LIMIT, LATCH_SPIN_MAX_PAUSE_LOG2,
};
use crate::stats;
use crate::sync::{self, Ordering};

const EXCLUSIVE: u64 = 1 << 0;
const UPDATE: u64 = 1 << 1;
const PARKED: u64 = 1 << 2;
const WOKEN: u64 = 1 << 3;
const DRAINER_PARKED: u64 = 1 << 4;
const ONE_SHARED: u64 = 1 << 5;
const SHARED_MASK: u64 = !(ONE_SHARED - 1);

fn shared_count(state: u64) -> u64 {
    state >> ONE_SHARED.trailing_zeros()
}

fn bits(mode: LatchMode) -> u64 {
    match mode {
        LatchMode::Shared => ONE_SHARED,
        LatchMode::Update => UPDATE,
        LatchMode::Exclusive => EXCLUSIVE,
    }
}

/// Whether `mode`'s bit can be taken on top of `state`. For an exclusive request that is the
/// claim: readers may still have to drain.
fn available(state: u64, mode: LatchMode) -> bool {
    match mode {
        LatchMode::Shared => state & EXCLUSIVE == 0,
        LatchMode::Update | LatchMode::Exclusive => state & (EXCLUSIVE | UPDATE) == 0,
    }
}

/// How long a blocked thread spins before it parks: `rounds` attempts, round `r` followed by
/// `2^min(r, max_pause_log2)` spin-loop hints (the holder may be running on the other core and
/// about to release). Under loom every budget is zero rounds: a spin is a yield there, and loom
/// runs other threads before a yielding one, which hides exactly the interleavings in which a
/// thread fails, parks and loses its wake-up. (A spin round is nothing but another attempt of
/// the same CAS, so the model loses nothing by skipping it.)
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SpinBudget {
    rounds: u32,
    max_pause_log2: u32,
}

impl SpinBudget {
    /// The budget of every latch acquisition that does not ask for another one: see
    /// `LATCH_SPIN_LIMIT` and `LATCH_SPIN_MAX_PAUSE_LOG2`.
    pub const STANDARD: SpinBudget = SpinBudget::new(LATCH_SPIN_LIMIT, LATCH_SPIN_MAX_PAUSE_LOG2);

    /// A short spin for critical sections of a few hundred nanoseconds that everyone wants:
    /// see `BRIEF_SPIN_ROUNDS`.
    pub const BRIEF: SpinBudget = SpinBudget::new(BRIEF_SPIN_ROUNDS, BRIEF_SPIN_MAX_PAUSE_LOG2);

    const fn new(rounds: u32, max_pause_log2: u32) -> SpinBudget {
        SpinBudget {
            rounds: if cfg!(loom) { 0 } else { rounds },
            max_pause_log2,
        }
    }

    /// Waits a little before attempt `round + 1`. Every round is a busy spin: on two cores a
    /// yield gives a CPU-bound competitor a whole time slice (see `limits.rs`).
    fn backoff(self, round: u32) {
        for _ in 0..(1u32 << round.min(self.max_pause_log2)) {
            sync::spin_loop_hint();
        }
    }
}

/// How a trip to the park queue ended.
enum Parked {
    /// The latch became available while we queued ourselves; this is the state we left.
    Acquired(u64),
    /// We slept and were woken, at this [`stats::now_ns`] time; compete again.
    Woken(u64),
}

/// A latch's state word and queue, seen as this flavour.
pub(super) struct AdaptiveLatch<'a>(pub(super) &'a Core);

impl std::ops::Deref for AdaptiveLatch<'_> {
    type Target = Core;

    fn deref(&self) -> &Core {
        self.0
    }
}

impl AdaptiveLatch<'_> {
    pub(super) fn is_held_exclusive(&self) -> bool {
        let state = self.state.load(Ordering::Relaxed);
        state & EXCLUSIVE != 0 && shared_count(state) == 0
    }

    #[inline]
    pub(super) fn try_acquire(&self, mode: LatchMode) -> bool {
        let mut state = self.state.load(Ordering::Relaxed);
        loop {
            let free = match mode {
                LatchMode::Exclusive => state & (EXCLUSIVE | UPDATE | SHARED_MASK) == 0,
                _ => available(state, mode),
            };
            if !free {
                return false;
            }
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
    }

    #[inline]
    pub(super) fn acquire(&self, mode: LatchMode, class: LatchClass, spin: SpinBudget) {
        if !self.try_acquire(mode) {
            self.acquire_slow(mode, class, spin);
        }
    }

    #[cold]
    fn acquire_slow(&self, mode: LatchMode, class: LatchClass, spin: SpinBudget) {
        // The wait starts at the first failed attempt and ends when the latch is ours.
        let wait = stats::begin_wait(mode.wait_type(class), Some(class));
        let mut signalled = None;
        // Whether we were woken from the park queue, and so own (a share of) WOKEN, which we
        // must clear when we acquire or park again.
        let mut woken = false;
        let state = 'acquired: loop {
            let mut round = 0;
            loop {
                if let Some(state) = self.try_take(mode, woken) {
                    break 'acquired state;
                }
                if round == spin.rounds {
                    break;
                }
                spin.backoff(round);
                round += 1;
            }
            match self.park(mode, woken) {
                Parked::Acquired(state) => break 'acquired state,
                Parked::Woken(at) => {
                    signalled = Some(at);
                    woken = true;
                }
            }
        };
        if mode == LatchMode::Exclusive && shared_count(state) != 0 {
            // We claimed the exclusive bit; readers still have to leave.
            if let Some(at) = self.drain() {
                signalled = Some(at);
            }
        }
        wait.end(signalled);
    }

    /// One attempt to take `mode`'s bit (the claim, for an exclusive request). Returns the new
    /// state on success. A woken thread clears `WOKEN` in the same CAS.
    fn try_take(&self, mode: LatchMode, woken: bool) -> Option<u64> {
        let clear = if woken { WOKEN } else { 0 };
        let mut state = self.state.load(Ordering::Relaxed);
        while available(state, mode) {
            let new = (state + bits(mode)) & !clear;
            match self
                .state
                .compare_exchange_weak(state, new, Ordering::Acquire, Ordering::Relaxed)
            {
                Ok(_) => return Some(new),
                Err(actual) => state = actual,
            }
        }
        None
    }

    /// Queues the calling thread and sleeps until woken, unless the latch turns out to be
    /// available once the queue mutex is held.
    #[cold]
    fn park(&self, mode: LatchMode, woken: bool) -> Parked {
        let clear = if woken { WOKEN } else { 0 };
        let waiter = current_waiter();
        {
            let mut queue = sync::lock(&self.queue);
            let mut state = self.state.load(Ordering::Relaxed);
            loop {
                if available(state, mode) {
                    let new = (state + bits(mode)) & !clear;
                    match self.state.compare_exchange(
                        state,
                        new,
                        Ordering::Acquire,
                        Ordering::Relaxed,
                    ) {
                        Ok(_) => return Parked::Acquired(new),
                        Err(actual) => state = actual,
                    }
                } else {
                    // The CAS is the re-check: it succeeds only if the latch is still held in a
                    // way that blocks us, so its holder's release will see PARKED.
                    let new = (state | PARKED) & !clear;
                    match self.state.compare_exchange(
                        state,
                        new,
                        Ordering::Relaxed,
                        Ordering::Relaxed,
                    ) {
                        Ok(_) => break,
                        Err(actual) => state = actual,
                    }
                }
            }
            waiter.prepare();
            let queued = Queued {
                waiter: waiter.clone(),
                mode,
            };
            // A thread that was woken and lost the race keeps its place at the head, which
            // bounds how far barging running threads can push it back.
            if woken {
                queue.waiters.push_front(queued);
            } else {
                queue.waiters.push_back(queued);
            }
        }
        Parked::Woken(waiter.wait())
    }

    /// Waits, holding the claimed exclusive bit, until the shared count is zero. Returns when
    /// the last reader signalled us, if we had to park.
    fn drain(&self) -> Option<u64> {
        let mut round = 0;
        loop {
            // Acquire: synchronizes with the release sequence of the readers' decrements.
            if shared_count(self.state.load(Ordering::Acquire)) == 0 {
                return None;
            }
            if round == SpinBudget::STANDARD.rounds {
                break;
            }
            SpinBudget::STANDARD.backoff(round);
            round += 1;
        }
        let waiter = current_waiter();
        {
            let mut queue = sync::lock(&self.queue);
            let mut state = self.state.load(Ordering::Acquire);
            loop {
                if shared_count(state) == 0 {
                    return None;
                }
                // Re-check and announce in one CAS: the last reader's decrement either comes
                // first (and we see zero) or sees DRAINER_PARKED.
                match self.state.compare_exchange(
                    state,
                    state | DRAINER_PARKED,
                    Ordering::Relaxed,
                    Ordering::Acquire,
                ) {
                    Ok(_) => break,
                    Err(actual) => state = actual,
                }
            }
            waiter.prepare();
            debug_assert!(queue.slot.is_none(), "two drainers");
            queue.slot = Some(waiter.clone());
        }
        let signalled = waiter.wait();
        let state = self.state.load(Ordering::Acquire);
        debug_assert!(state & EXCLUSIVE != 0 && shared_count(state) == 0);
        Some(signalled)
    }

    #[inline]
    pub(super) fn release(&self, mode: LatchMode) {
        match mode {
            LatchMode::Shared => {
                let old = self.state.fetch_sub(ONE_SHARED, Ordering::Release);
                if old & SHARED_MASK == 0 {
                    // Undo the wrap-around before reporting the misuse.
                    self.state.fetch_add(ONE_SHARED, Ordering::Relaxed);
                    not_held("release", mode, old);
                }
                if shared_count(old) == 1 {
                    self.last_reader_left(old);
                }
            }
            LatchMode::Update => {
                let old = self.state.fetch_and(!UPDATE, Ordering::Release);
                if old & UPDATE == 0 {
                    not_held("release", mode, old);
                }
                self.wake_if_parked(old);
            }
            LatchMode::Exclusive => {
                let old = self.state.fetch_and(!EXCLUSIVE, Ordering::Release);
                if old & EXCLUSIVE == 0 || shared_count(old) != 0 {
                    not_held("release", mode, old);
                }
                self.wake_if_parked(old);
            }
        }
    }

    /// The shared count just went from one to zero (`old` is the state before).
    #[inline]
    fn last_reader_left(&self, old: u64) {
        if old & EXCLUSIVE != 0 {
            // A writer claimed the latch and waits for us; if it parked, it is ours to wake. No
            // one else can see this transition: new readers are kept out by its claim.
            if old & DRAINER_PARKED != 0 {
                self.wake_drainer();
            }
        } else if old & UPDATE == 0 {
            // The latch is free now. Parked writers may have been left behind by a woken run of
            // readers ahead of them; this is the release that must wake them.
            self.wake_if_parked(old);
        }
    }

    #[inline]
    fn wake_if_parked(&self, old: u64) {
        if old & (PARKED | WOKEN) == PARKED {
            self.wake_queue();
        }
    }

    #[cold]
    fn wake_drainer(&self) {
        let drainer = {
            let mut queue = sync::lock(&self.queue);
            self.state.fetch_and(!DRAINER_PARKED, Ordering::Relaxed);
            queue.slot.take().expect("DRAINER_PARKED without a drainer")
        };
        drainer.signal(stats::now_ns());
    }

    /// Wakes the head of the park queue: one writer, or the run of readers (with at most one
    /// update requester) at the head. They are not granted anything; they compete again.
    #[cold]
    fn wake_queue(&self) {
        let mut wake = WakeList::new();
        {
            let mut queue = sync::lock(&self.queue);
            let mut state = self.state.load(Ordering::Relaxed);
            loop {
                if state & (PARKED | WOKEN) != PARKED {
                    // Someone else woke a thread since our release, or the queue emptied.
                    return;
                }
                let Some(head) = queue.waiters.front() else {
                    debug_assert!(false, "PARKED with an empty queue");
                    return;
                };
                if !available(state, head.mode) {
                    // A running thread took the latch since our release; waking the head would
                    // only make it park again. That holder's release wakes it instead.
                    return;
                }
                let mut run = 0;
                let mut update = false;
                for queued in &queue.waiters {
                    let fits = match queued.mode {
                        LatchMode::Shared => true,
                        LatchMode::Update => !update,
                        LatchMode::Exclusive => run == 0,
                    };
                    if !fits {
                        break;
                    }
                    run += 1;
                    match queued.mode {
                        LatchMode::Exclusive => break,
                        LatchMode::Update => update = true,
                        LatchMode::Shared => {}
                    }
                }
                let mut new = state | WOKEN;
                if run == queue.waiters.len() {
                    new &= !PARKED;
                }
                match self
                    .state
                    .compare_exchange(state, new, Ordering::Relaxed, Ordering::Relaxed)
                {
                    Ok(_) => {
                        for queued in queue.waiters.drain(..run) {
                            wake.push(queued.waiter);
                        }
                        break;
                    }
                    Err(actual) => state = actual,
                }
            }
        }
        wake.signal_all();
    }

    pub(super) fn upgrade(&self, class: LatchClass) {
        let mut state = self.state.load(Ordering::Relaxed);
        loop {
            if state & UPDATE == 0 || state & EXCLUSIVE != 0 {
                not_held("upgrade", LatchMode::Update, state);
            }
            // Swapping the update bit for the exclusive one is a claim: from here on new readers
            // wait, and we wait for the present ones to leave.
            match self.state.compare_exchange_weak(
                state,
                state - UPDATE + EXCLUSIVE,
                Ordering::Acquire,
                Ordering::Relaxed,
            ) {
                Ok(_) => break,
                Err(actual) => state = actual,
            }
        }
        if shared_count(state) != 0 {
            let wait = stats::begin_wait(LatchMode::Exclusive.wait_type(class), Some(class));
            let signalled = self.drain();
            wait.end(signalled);
        }
    }

    pub(super) fn downgrade(&self) {
        let mut state = self.state.load(Ordering::Relaxed);
        loop {
            if state & EXCLUSIVE == 0 || shared_count(state) != 0 {
                not_held("downgrade", LatchMode::Exclusive, state);
            }
            match self.state.compare_exchange_weak(
                state,
                state - EXCLUSIVE + ONE_SHARED,
                Ordering::Release,
                Ordering::Relaxed,
            ) {
                Ok(_) => break,
                Err(actual) => state = actual,
            }
        }
        // Readers (and an update requester, or a writer that will claim and wait for us) may
        // proceed now.
        self.wake_if_parked(state);
    }
}
