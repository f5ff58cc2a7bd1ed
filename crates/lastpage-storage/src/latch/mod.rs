//! Page latches: short-term reader/writer locks on in-memory structures, with SQL Server's
//! three modes (shared, update, exclusive) and wait statistics.
//!
//! Two flavours exist, chosen per index when its pages are allocated ([`LatchPolicy`]):
//!
//! - [`LatchPolicy::Fifo`] (`fifo.rs`) is a fair hand-off latch like SQL Server's: waiters are
//!   granted strictly in arrival order, and a releaser hands ownership to the next waiter before
//!   that waiter has even been scheduled. With many more threads than cores, every hand-off costs
//!   a context switch while nobody holds the latch *and runs*: that is the PAGELATCH_EX convoy of
//!   last-page inserts.
//! - [`LatchPolicy::Adaptive`] (`adaptive.rs`) is unfair: a release only clears bits and wakes a
//!   waiter that must compete again, so a running thread can take the latch at once and the latch
//!   is never owned by a thread that is not running.
//!
//! `docs/latch-protocol.md` describes both state words, the algorithms, how waits are recorded
//! and how the latches are model-checked with loom.
//!
//! Both flavours park blocked threads on a per-latch queue protected by a mutex that is only
//! touched on the slow path. Every blocked thread is represented by a `Waiter`; outside loom,
//! each thread reuses one cached `Arc<Waiter>`, so waiting allocates nothing after the first time
//! (except the queue growing).

mod adaptive;
mod fifo;

use std::collections::VecDeque;

use crate::stats;
use crate::sync::{self, Arc, AtomicU32, AtomicU64, Mutex, Ordering, Thread};

pub use crate::stats::{LatchClass, LatchMode};

use adaptive::AdaptiveLatch;
pub use adaptive::SpinBudget;
use fifo::FifoLatch;

/// Which latch flavour an index's pages use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum LatchPolicy {
    /// Fair FIFO hand-off, like SQL Server's page latches: convoys under last-page inserts.
    Fifo,
    /// Ours: unfair, spin-then-park, no hand-off and therefore no convoys.
    #[default]
    Adaptive,
}

impl LatchPolicy {
    /// Every policy, in display order.
    pub const ALL: [LatchPolicy; 2] = [LatchPolicy::Fifo, LatchPolicy::Adaptive];

    /// The policy's name as configuration and reports spell it.
    pub fn name(self) -> &'static str {
        match self {
            LatchPolicy::Fifo => "fifo",
            LatchPolicy::Adaptive => "adaptive",
        }
    }

    /// Looks a policy up by its name (case-insensitive, surrounding blanks ignored).
    pub fn from_name(name: &str) -> Option<LatchPolicy> {
        let name = name.trim();
        Self::ALL
            .into_iter()
            .find(|policy| policy.name().eq_ignore_ascii_case(name))
    }
}

impl std::fmt::Display for LatchPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A latch of either flavour; the flavour is chosen when the page is allocated and never
/// changes. Every operation dispatches by a `match` on the flavour, which the branch predictor
/// learns at once (all the pages of an index share a flavour).
pub struct Latch {
    core: Core,
    class: LatchClass,
    policy: LatchPolicy,
}

/// What both flavours are made of: the state word, whose layout each flavour defines, and the
/// park queue of the slow path. The flavours ([`FifoLatch`], [`AdaptiveLatch`]) are views of a
/// `Core`; keeping the policy as a plain field next to the class (rather than an enum of two
/// structs, whose tag would need its own word) keeps the latch at one cache line.
struct Core {
    state: AtomicU64,
    queue: Mutex<ParkQueue>,
}

/// Dispatches a call to the latch's flavour.
macro_rules! dispatch {
    ($latch:expr, $flavour:ident => $call:expr) => {
        match $latch.policy {
            LatchPolicy::Fifo => {
                let $flavour = FifoLatch(&$latch.core);
                $call
            }
            LatchPolicy::Adaptive => {
                let $flavour = AdaptiveLatch(&$latch.core);
                $call
            }
        }
    };
}

impl Latch {
    /// A free latch of the given flavour. Latches of class [`LatchClass::Buffer`] record their
    /// waits as PAGELATCH_*, all others as LATCH_*.
    pub fn new(policy: LatchPolicy, class: LatchClass) -> Latch {
        Latch {
            core: Core {
                state: AtomicU64::new(0),
                queue: ParkQueue::new(),
            },
            class,
            policy,
        }
    }

    /// The latch's flavour.
    pub fn policy(&self) -> LatchPolicy {
        self.policy
    }

    /// The latch's class, which decides the wait types it records.
    pub fn class(&self) -> LatchClass {
        self.class
    }

    /// Blocks until the latch is granted in `mode`.
    ///
    /// Records a wait (PAGELATCH_xx for class `Buffer`, LATCH_xx otherwise) only if the latch
    /// could not be taken at once. An uncontended acquisition is one load and one CAS: no clock
    /// read, no allocation, no system call.
    #[inline]
    pub fn acquire(&self, mode: LatchMode) {
        self.acquire_spinning(mode, SpinBudget::STANDARD);
    }

    /// As [`Latch::acquire`], but an unfair latch spins for `spin` instead of the standard
    /// budget before it parks the thread. A fair latch queues at once, whatever `spin` says.
    #[inline]
    pub fn acquire_spinning(&self, mode: LatchMode, spin: SpinBudget) {
        match self.policy {
            LatchPolicy::Fifo => FifoLatch(&self.core).acquire(mode, self.class),
            LatchPolicy::Adaptive => AdaptiveLatch(&self.core).acquire(mode, self.class, spin),
        }
    }

    /// Takes the latch in `mode` if that is possible at once. Never waits and never records a
    /// wait. A fair latch refuses when someone is queued, even if `mode` is compatible with the
    /// holders: granting would let the caller jump the queue.
    #[inline]
    pub fn try_acquire(&self, mode: LatchMode) -> bool {
        dispatch!(self, latch => latch.try_acquire(mode))
    }

    /// Releases the latch held in `mode`.
    ///
    /// The caller must hold it in `mode` (the buffer pool's guards guarantee that). Misuse cannot
    /// cause memory unsafety: releasing a mode that is not held panics.
    #[inline]
    pub fn release(&self, mode: LatchMode) {
        dispatch!(self, latch => latch.release(mode))
    }

    /// Converts the caller's update latch into an exclusive one, waiting until the shared holders
    /// have left. New shared requests wait behind the upgrader, so they cannot starve it. A wait
    /// is recorded under the exclusive wait type (PAGELATCH_EX or LATCH_EX).
    ///
    /// Panics if the latch is not held in update mode.
    pub fn upgrade(&self) {
        dispatch!(self, latch => latch.upgrade(self.class))
    }

    /// Converts the caller's exclusive latch into a shared one without letting a writer in
    /// between: what the caller wrote is what it then reads. Waiting readers may join at once.
    ///
    /// Panics if the latch is not held exclusively.
    pub fn downgrade(&self) {
        dispatch!(self, latch => latch.downgrade())
    }

    /// Whether some thread holds the latch exclusively (for debug assertions).
    pub fn is_held_exclusive(&self) -> bool {
        dispatch!(self, latch => latch.is_held_exclusive())
    }

    /// How many threads are parked on the latch right now (queued waiters plus an upgrader or a
    /// writer waiting for readers to leave). Takes the latch's queue mutex: for tests and
    /// diagnostics, not for hot paths.
    pub fn parked_waiters(&self) -> usize {
        let queue = sync::lock(&self.core.queue);
        queue.waiters.len() + usize::from(queue.slot.is_some())
    }
}

impl std::fmt::Debug for Latch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = self.core.state.load(Ordering::Relaxed);
        f.debug_struct("Latch")
            .field("policy", &self.policy())
            .field("class", &self.class)
            .field("state", &format_args!("{state:#x}"))
            .finish()
    }
}

/// A parked thread (used by the latches and by the log writer). The thread that wants to wait
/// prepares it and queues an `Arc` to it; the thread that lets it go removes it from the queue
/// (under the queue mutex), then signals it.
/// After [`Waiter::signal`] sets `state`, the signaller touches nothing but the immutable
/// `thread` handle, so the waiter may return, and reuse this `Waiter` for its next wait, while
/// the signaller is still calling `unpark` (which then only leaves a harmless spare token).
pub(crate) struct Waiter {
    thread: Thread,
    /// [`WAITING`] or [`SIGNALLED`].
    state: AtomicU32,
    /// When the signal was sent, in [`stats::now_ns`] nanoseconds. Written before `state` is
    /// set to `SIGNALLED` (release), read after it is seen (acquire).
    signalled_ns: AtomicU64,
}

const WAITING: u32 = 0;
const SIGNALLED: u32 = 1;

impl Waiter {
    pub(crate) fn new() -> Waiter {
        Waiter {
            thread: sync::thread::current(),
            state: AtomicU32::new(WAITING),
            signalled_ns: AtomicU64::new(0),
        }
    }

    /// Arms the waiter before it is queued. The store is ordered before any signal by the queue
    /// mutex, which the waiter holds while it queues itself and the signaller while it dequeues.
    pub(crate) fn prepare(&self) {
        self.state.store(WAITING, Ordering::Relaxed);
    }

    /// Lets the waiter go: `signalled_ns` first, then the flag that publishes it, then the
    /// wake-up. Only a thread that has removed the waiter from its queue may call this.
    pub(crate) fn signal(&self, now_ns: u64) {
        self.signalled_ns.store(now_ns, Ordering::Relaxed);
        self.state.store(SIGNALLED, Ordering::Release);
        self.thread.unpark();
    }

    /// Parks the calling thread (which must be the waiter's thread) until it is signalled and
    /// returns when the signal was sent. `park` may return spuriously, or because of a token left
    /// by an earlier wait's late `unpark`, so the flag is re-checked every time.
    pub(crate) fn wait(&self) -> u64 {
        while self.state.load(Ordering::Acquire) != SIGNALLED {
            sync::thread::park();
        }
        self.signalled_ns.load(Ordering::Relaxed)
    }
}

#[cfg(not(loom))]
std::thread_local! {
    /// The calling thread's reusable waiter, so that a wait allocates nothing.
    static CURRENT_WAITER: Arc<Waiter> = Arc::new(Waiter::new());
}

/// The calling thread's waiter. A thread waits for at most one latch at a time, and a waiter
/// is out of every queue by the time its wait returns, so one per thread is enough. Under loom
/// (whose `Arc` belongs to one model execution) and while the thread-local is being destroyed, a
/// fresh one is allocated instead.
pub(crate) fn current_waiter() -> Arc<Waiter> {
    #[cfg(not(loom))]
    if let Ok(waiter) = CURRENT_WAITER.try_with(Arc::clone) {
        return waiter;
    }
    Arc::new(Waiter::new())
}

/// A queued waiter and the mode it asks for.
struct Queued {
    waiter: Arc<Waiter>,
    mode: LatchMode,
}

/// The slow-path part of a latch, behind its mutex.
struct ParkQueue {
    /// Parked waiters, oldest first (the adaptive latch puts a waiter that was woken and lost
    /// the race back at the front).
    waiters: VecDeque<Queued>,
    /// The one thread that waits for the shared holders to leave: the upgrader of the fifo
    /// latch, the draining writer of the adaptive latch. There can be at most one, because it
    /// already holds the update or exclusive bit.
    slot: Option<Arc<Waiter>>,
}

impl ParkQueue {
    fn new() -> Mutex<ParkQueue> {
        Mutex::new(ParkQueue {
            waiters: VecDeque::new(),
            slot: None,
        })
    }
}

/// Waiters taken off a queue, to be signalled once the queue mutex is released (so the mutex is
/// never held across an `unpark` system call). The common case is a single waiter and needs no
/// allocation; only a batch of readers spills into the vector.
struct WakeList {
    first: Option<Arc<Waiter>>,
    rest: Vec<Arc<Waiter>>,
}

impl WakeList {
    fn new() -> WakeList {
        WakeList {
            first: None,
            rest: Vec::new(),
        }
    }

    fn push(&mut self, waiter: Arc<Waiter>) {
        if self.first.is_none() {
            self.first = Some(waiter);
        } else {
            self.rest.push(waiter);
        }
    }

    /// Signals every waiter, with one clock read for all of them (and none if there are none).
    fn signal_all(self) {
        let Some(first) = self.first else {
            return;
        };
        let now = stats::now_ns();
        first.signal(now);
        for waiter in self.rest {
            waiter.signal(now);
        }
    }
}

/// Panics on a release, upgrade or downgrade of a mode the caller does not hold. Kept out of
/// line so that the checks cost the hot paths only a predictable branch.
#[cold]
#[inline(never)]
#[track_caller]
fn not_held(operation: &str, mode: LatchMode, state: u64) -> ! {
    panic!("latch {operation}: the latch is not held in {mode:?} mode (state {state:#x})");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policy_names_round_trip_and_unknown_names_are_refused() {
        for policy in LatchPolicy::ALL {
            assert_eq!(LatchPolicy::from_name(policy.name()), Some(policy));
            assert_eq!(policy.to_string(), policy.name());
        }
        assert_eq!(LatchPolicy::from_name("FIFO"), Some(LatchPolicy::Fifo));
        assert_eq!(
            LatchPolicy::from_name(" Adaptive "),
            Some(LatchPolicy::Adaptive)
        );
        assert_eq!(LatchPolicy::from_name("fair"), None);
        assert_eq!(LatchPolicy::from_name(""), None);
        assert_eq!(LatchPolicy::default(), LatchPolicy::Adaptive);
    }

    #[test]
    fn new_latches_report_their_policy_and_class() {
        for policy in LatchPolicy::ALL {
            let latch = Latch::new(policy, LatchClass::Metadata);
            assert_eq!(latch.policy(), policy);
            assert_eq!(latch.class(), LatchClass::Metadata);
            assert!(!latch.is_held_exclusive());
            assert_eq!(latch.parked_waiters(), 0);
        }
    }
}
