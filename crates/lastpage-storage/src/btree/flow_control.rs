//! OPTIMIZE_FOR_SEQUENTIAL_KEY: flow control at the entrance of an index's insert path.
//!
//! SQL Server 2019's answer to last-page convoys does not change the B-tree. It limits how many
//! workers may be inside an index's insert path at once (one per scheduler) and, among those
//! waiting to get in, unfairly prefers the ones likely to finish quickly: a convoy forms when a
//! latch is handed to a worker that then cannot run, so fewer workers near the latch means
//! fewer such hand-offs. Workers held back wait as BTREE_INSERT_FLOW_CONTROL. Like SQL Server's,
//! it helps when workers far outnumber cores and costs a little when they do not (seed 002
//! measured 16% slower at 100 sessions).
//!
//! Here: `capacity` workers (the number of CPUs) may be inside at once. A worker that finds the
//! index full queues in one of two queues: *fast* (the thread's last write, into any index, did
//! not split a page) or *slow*. A worker leaving hands its place directly to the oldest fast
//! waiter, or else the oldest slow one, so admission is strictly bounded. The preference is
//! bounded too: after `FLOW_CONTROL_FAST_HANDOFFS_MAX` places in a row went to fast waiters while
//! a slow one waited, the oldest slow waiter gets the next. (Unbounded, a slow waiter never got
//! in while more fast workers kept arriving than there were places: a test with one place and
//! four fast workers admitted 12,000 of them in 1.5 s and the slow one not once.)
//!
//! Every way into an index's insert path passes it: a single insert, a sequence lane's row, a
//! default-path batch (once per batch) and a classic batch (once per run of rows on one leaf).
//!
//! It can be switched on and off at run time (`ALTER INDEX … SET (OPTIMIZE_FOR_SEQUENTIAL_KEY =
//! ON)`); workers already queued when it is switched off are still let in by the workers inside
//! as they leave.

use std::collections::VecDeque;

use crate::latch::{Waiter, current_waiter};
use crate::limits::FLOW_CONTROL_FAST_HANDOFFS_MAX;
use crate::stats::{self, WaitType};
use crate::sync::{self, Arc, AtomicBool, AtomicUsize, Mutex, Ordering};

/// The flow control of one index.
pub struct FlowControl {
    enabled: AtomicBool,
    /// Workers inside the insert path.
    admitted: AtomicUsize,
    /// How many may be inside at once.
    capacity: usize,
    queues: Mutex<Queues>,
}

#[derive(Default)]
struct Queues {
    fast: VecDeque<Arc<Waiter>>,
    slow: VecDeque<Arc<Waiter>>,
    /// Places handed to fast waiters in a row while a slow waiter waited.
    fast_handoffs_past_slow: usize,
}

impl Queues {
    /// The waiter the next free place goes to: the oldest fast one, unless a slow one has
    /// waited through `FLOW_CONTROL_FAST_HANDOFFS_MAX` fast hand-offs (or no fast one waits).
    fn next(&mut self) -> Option<Arc<Waiter>> {
        if self.slow.is_empty() {
            return self.fast.pop_front();
        }
        if self.fast.is_empty() || self.fast_handoffs_past_slow >= FLOW_CONTROL_FAST_HANDOFFS_MAX {
            self.fast_handoffs_past_slow = 0;
            return self.slow.pop_front();
        }
        self.fast_handoffs_past_slow += 1;
        self.fast.pop_front()
    }
}

/// A worker's place inside the insert path; leaving it (drop) lets the next worker in.
#[must_use = "dropping the ticket leaves the insert path at once"]
pub struct FlowTicket<'a> {
    flow: &'a FlowControl,
}

impl Drop for FlowTicket<'_> {
    fn drop(&mut self) {
        self.flow.leave();
    }
}

impl FlowControl {
    /// Flow control admitting `capacity` workers at once (at least one), initially `enabled`.
    pub fn new(capacity: usize, enabled: bool) -> FlowControl {
        FlowControl {
            enabled: AtomicBool::new(enabled),
            admitted: AtomicUsize::new(0),
            capacity: capacity.max(1),
            queues: Mutex::new(Queues::default()),
        }
    }

    /// Whether flow control is on.
    pub fn is_enabled(&self) -> bool {
        self.enabled.load(Ordering::Relaxed)
    }

    /// Switches flow control on or off; takes effect for the next worker to arrive.
    pub fn set_enabled(&self, enabled: bool) {
        self.enabled.store(enabled, Ordering::Relaxed);
    }

    /// Enters the insert path, waiting if it is full. `likely_fast` puts a waiting worker in
    /// the preferred queue. `None` when flow control is off (nothing to leave).
    pub fn enter(&self, likely_fast: bool) -> Option<FlowTicket<'_>> {
        if !self.is_enabled() {
            return None;
        }
        if self.try_admit() {
            return Some(FlowTicket { flow: self });
        }
        // The wait starts at the first refusal, as a latch's does: the queue mutex below is part
        // of it (under contention, a large part), and a worker admitted on the re-check still
        // waited for the mutex.
        let wait = stats::begin_wait(WaitType::BtreeInsertFlowControl, None);
        let waiter = current_waiter();
        {
            let mut queues = sync::lock(&self.queues);
            // Re-checked under the mutex: a leaving worker that finds no waiter gives its place
            // back under the same mutex, so either the place is visible here or this waiter is
            // queued before the leaving worker looks.
            if self.try_admit() {
                drop(queues);
                wait.end(None);
                return Some(FlowTicket { flow: self });
            }
            waiter.prepare();
            if likely_fast {
                queues.fast.push_back(Arc::clone(&waiter));
            } else {
                queues.slow.push_back(Arc::clone(&waiter));
            }
        }
        let signalled = waiter.wait();
        wait.end(Some(signalled));
        // The leaving worker handed its place over: `admitted` already counts this worker.
        Some(FlowTicket { flow: self })
    }

    fn try_admit(&self) -> bool {
        let mut admitted = self.admitted.load(Ordering::Relaxed);
        while admitted < self.capacity {
            match self.admitted.compare_exchange_weak(
                admitted,
                admitted + 1,
                Ordering::Acquire,
                Ordering::Relaxed,
            ) {
                Ok(_) => return true,
                Err(actual) => admitted = actual,
            }
        }
        false
    }

    fn leave(&self) {
        let next = {
            let mut queues = sync::lock(&self.queues);
            let next = queues.next();
            if next.is_none() {
                self.admitted.fetch_sub(1, Ordering::Release);
            }
            next
        };
        if let Some(waiter) = next {
            waiter.signal(stats::now_ns());
        }
    }

    /// How many workers may be inside at once.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Workers inside the insert path now (for tests and diagnostics).
    pub fn admitted(&self) -> usize {
        self.admitted.load(Ordering::Relaxed)
    }

    /// Workers queued now, in either queue (for tests and diagnostics).
    pub fn waiters(&self) -> usize {
        let queues = sync::lock(&self.queues);
        queues.fast.len() + queues.slow.len()
    }

    /// Workers queued in the slow queue now (for tests and diagnostics).
    pub fn slow_waiters(&self) -> usize {
        sync::lock(&self.queues).slow.len()
    }
}
