//! Wait and latch statistics with SQL Server's semantics.
//!
//! A *wait* starts when a task cannot proceed (a latch it asked for is held, a log flush it
//! needs has not happened) and ends when the task runs again. Like `sys.dm_os_wait_stats`:
//! `waiting_tasks_count` is incremented when a wait starts, `wait_time` runs from the start of
//! the wait until the task runs again, `max_wait_time` is the longest single wait, and
//! `signal_wait_time` is the part of the wait between being signalled (the latch handed over,
//! the waiter woken) and actually running. Latch statistics per latch class follow
//! `sys.dm_os_latch_stats`.
//!
//! Recording must not itself become the hot spot it measures, so every thread writes only its
//! own shard (one cache-line-padded block of counters); a snapshot adds the shards up. Clearing
//! is an epoch bump: a writer that sees a newer epoch zeroes its own shard before recording, and
//! snapshots skip shards of an older epoch, so no thread ever writes another thread's counters.
//! Nothing here reads the clock: callers read it only once they know they must wait, so an
//! uncontended acquisition costs no clock read.
//!
//! Waits are also attributed to the current session and statement: a thread installs
//! [`WaitAccumulator`]s with [`attribute_waits_to`] (they nest: a session's, then a statement's),
//! and every wait it records is added to each installed accumulator too.

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use crossbeam_utils::CachePadded;

/// The wait types lastpage records. Names follow SQL Server's where SQL Server has the wait.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum WaitType {
    /// Waiting for a shared latch on a page (a reader).
    PageLatchSh,
    /// Waiting for an update latch on a page.
    PageLatchUp,
    /// Waiting for an exclusive latch on a page (a writer; the last-page insert wait).
    PageLatchEx,
    /// Waiting for a shared latch that does not protect a page.
    LatchSh,
    /// Waiting for an update latch that does not protect a page.
    LatchUp,
    /// Waiting for an exclusive latch that does not protect a page.
    LatchEx,
    /// Held back by OPTIMIZE_FOR_SEQUENTIAL_KEY flow control before entering an index.
    BtreeInsertFlowControl,
    /// Waiting for a log flush to make a commit durable.
    WriteLog,
    /// Waiting for space in the log buffer.
    LogBuffer,
    /// Waiting for a shared row lock.
    LckMS,
    /// Waiting for an exclusive row lock.
    LckMX,
}

impl WaitType {
    /// Every wait type, in display order.
    pub const ALL: [WaitType; 11] = [
        WaitType::PageLatchSh,
        WaitType::PageLatchUp,
        WaitType::PageLatchEx,
        WaitType::LatchSh,
        WaitType::LatchUp,
        WaitType::LatchEx,
        WaitType::BtreeInsertFlowControl,
        WaitType::WriteLog,
        WaitType::LogBuffer,
        WaitType::LckMS,
        WaitType::LckMX,
    ];

    /// Number of wait types.
    pub const COUNT: usize = Self::ALL.len();

    /// The SQL Server name of the wait type, as `sys.dm_os_wait_stats` prints it.
    pub fn name(self) -> &'static str {
        match self {
            WaitType::PageLatchSh => "PAGELATCH_SH",
            WaitType::PageLatchUp => "PAGELATCH_UP",
            WaitType::PageLatchEx => "PAGELATCH_EX",
            WaitType::LatchSh => "LATCH_SH",
            WaitType::LatchUp => "LATCH_UP",
            WaitType::LatchEx => "LATCH_EX",
            WaitType::BtreeInsertFlowControl => "BTREE_INSERT_FLOW_CONTROL",
            WaitType::WriteLog => "WRITELOG",
            WaitType::LogBuffer => "LOGBUFFER",
            WaitType::LckMS => "LCK_M_S",
            WaitType::LckMX => "LCK_M_X",
        }
    }

    /// Looks a wait type up by its SQL Server name (case-insensitive).
    pub fn from_name(name: &str) -> Option<WaitType> {
        Self::ALL
            .into_iter()
            .find(|wait_type| wait_type.name().eq_ignore_ascii_case(name))
    }
}

/// Latch classes, as `sys.dm_os_latch_stats` groups latches. Every page latch is of class
/// `Buffer`; its waits are the PAGELATCH_* wait types. Other classes wait as LATCH_*.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum LatchClass {
    /// Latches on buffer pool pages.
    Buffer,
    /// Latches on in-memory metadata (catalog, index descriptors).
    Metadata,
    /// Latches that protect flow-control queues.
    FlowControl,
    /// Latches on the log.
    Log,
}

impl LatchClass {
    /// Every latch class, in display order.
    pub const ALL: [LatchClass; 4] = [
        LatchClass::Buffer,
        LatchClass::Metadata,
        LatchClass::FlowControl,
        LatchClass::Log,
    ];

    /// Number of latch classes.
    pub const COUNT: usize = Self::ALL.len();

    /// The name `sys.dm_os_latch_stats` would print.
    pub fn name(self) -> &'static str {
        match self {
            LatchClass::Buffer => "BUFFER",
            LatchClass::Metadata => "LASTPAGE_METADATA",
            LatchClass::FlowControl => "LASTPAGE_FLOW_CONTROL",
            LatchClass::Log => "LASTPAGE_LOG",
        }
    }
}

/// The latch modes, as SQL Server's page latches have them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LatchMode {
    /// Shared: any number of holders, for reading.
    Shared,
    /// Update: compatible with shared holders but not with another update or exclusive holder;
    /// it can be upgraded to exclusive once the readers leave.
    Update,
    /// Exclusive: one holder, for writing.
    Exclusive,
}

impl LatchMode {
    /// The wait type a wait for this mode records, given the latch's class.
    pub fn wait_type(self, class: LatchClass) -> WaitType {
        match (class, self) {
            (LatchClass::Buffer, LatchMode::Shared) => WaitType::PageLatchSh,
            (LatchClass::Buffer, LatchMode::Update) => WaitType::PageLatchUp,
            (LatchClass::Buffer, LatchMode::Exclusive) => WaitType::PageLatchEx,
            (_, LatchMode::Shared) => WaitType::LatchSh,
            (_, LatchMode::Update) => WaitType::LatchUp,
            (_, LatchMode::Exclusive) => WaitType::LatchEx,
        }
    }
}

/// Nanoseconds since this process first asked, from the monotonic clock.
pub fn now_ns() -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    let epoch = *EPOCH.get_or_init(Instant::now);
    u64::try_from(epoch.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

/// Counters of one wait type in one accumulator.
#[derive(Default)]
struct WaitCounters {
    waiting_tasks_count: AtomicU64,
    wait_time_ns: AtomicU64,
    max_wait_time_ns: AtomicU64,
    signal_wait_time_ns: AtomicU64,
}

impl WaitCounters {
    /// Counts a wait's start. With `one_writer` (a thread's own shard, which only it writes)
    /// a load and a store are enough, and cheaper than a read-modify-write; an accumulator
    /// that threads share needs the read-modify-write, or concurrent waits lose counts.
    fn add_start(&self, one_writer: bool) {
        add(&self.waiting_tasks_count, 1, one_writer);
    }

    /// Counts a wait's end, as [`WaitCounters::add_start`] does.
    fn add_end(&self, wait_ns: u64, signal_ns: u64, one_writer: bool) {
        add(&self.wait_time_ns, wait_ns, one_writer);
        add(&self.signal_wait_time_ns, signal_ns, one_writer);
        if !one_writer {
            self.max_wait_time_ns.fetch_max(wait_ns, Ordering::Relaxed);
        } else if wait_ns > self.max_wait_time_ns.load(Ordering::Relaxed) {
            self.max_wait_time_ns.store(wait_ns, Ordering::Relaxed);
        }
    }

    fn read(&self) -> WaitStat {
        WaitStat {
            waiting_tasks_count: self.waiting_tasks_count.load(Ordering::Relaxed),
            wait_time_ns: self.wait_time_ns.load(Ordering::Relaxed),
            max_wait_time_ns: self.max_wait_time_ns.load(Ordering::Relaxed),
            signal_wait_time_ns: self.signal_wait_time_ns.load(Ordering::Relaxed),
        }
    }

    fn zero(&self) {
        self.waiting_tasks_count.store(0, Ordering::Relaxed);
        self.wait_time_ns.store(0, Ordering::Relaxed);
        self.max_wait_time_ns.store(0, Ordering::Relaxed);
        self.signal_wait_time_ns.store(0, Ordering::Relaxed);
    }
}

/// Adds `amount` to `counter`: with a load and a store if only the calling thread writes it
/// (`one_writer`), with a read-modify-write otherwise.
fn add(counter: &AtomicU64, amount: u64, one_writer: bool) {
    if one_writer {
        counter.store(
            counter.load(Ordering::Relaxed).wrapping_add(amount),
            Ordering::Relaxed,
        );
    } else {
        counter.fetch_add(amount, Ordering::Relaxed);
    }
}

/// One wait type's totals, as a snapshot reports them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WaitStat {
    /// Waits started.
    pub waiting_tasks_count: u64,
    /// Total time spent waiting, in nanoseconds.
    pub wait_time_ns: u64,
    /// Longest single wait, in nanoseconds.
    pub max_wait_time_ns: u64,
    /// Total time between being signalled and running again, in nanoseconds.
    pub signal_wait_time_ns: u64,
}

impl WaitStat {
    fn merge(&mut self, other: WaitStat) {
        self.waiting_tasks_count += other.waiting_tasks_count;
        self.wait_time_ns += other.wait_time_ns;
        self.max_wait_time_ns = self.max_wait_time_ns.max(other.max_wait_time_ns);
        self.signal_wait_time_ns += other.signal_wait_time_ns;
    }

    /// Total wait time in milliseconds.
    pub fn wait_time_ms(&self) -> f64 {
        self.wait_time_ns as f64 / 1e6
    }

    /// Longest wait in milliseconds.
    pub fn max_wait_time_ms(&self) -> f64 {
        self.max_wait_time_ns as f64 / 1e6
    }

    /// Signal wait time in milliseconds.
    pub fn signal_wait_time_ms(&self) -> f64 {
        self.signal_wait_time_ns as f64 / 1e6
    }
}

/// A set of wait counters for every wait type and latch class: one thread's shard, or the
/// waits attributed to one session or statement.
pub struct WaitAccumulator {
    waits: [WaitCounters; WaitType::COUNT],
    latches: [WaitCounters; LatchClass::COUNT],
    /// Whether only one thread ever writes the counters (a thread's shard of the global
    /// statistics); an accumulator waits are attributed to may be shared by threads.
    one_writer: bool,
}

impl Default for WaitAccumulator {
    fn default() -> Self {
        WaitAccumulator {
            waits: std::array::from_fn(|_| WaitCounters::default()),
            latches: std::array::from_fn(|_| WaitCounters::default()),
            one_writer: false,
        }
    }
}

impl WaitAccumulator {
    /// A new, empty accumulator, which any number of threads may attribute their waits to
    /// at once ([`attribute_waits_to`]).
    pub fn new() -> Self {
        Self::default()
    }

    /// A thread's shard: only that thread records into it.
    fn for_one_thread() -> Self {
        WaitAccumulator {
            one_writer: true,
            ..Self::default()
        }
    }

    /// What has been recorded here so far.
    pub fn snapshot(&self) -> WaitSnapshot {
        let mut snapshot = WaitSnapshot::default();
        self.add_to(&mut snapshot);
        snapshot
    }

    fn add_to(&self, snapshot: &mut WaitSnapshot) {
        for (total, counters) in snapshot.waits.iter_mut().zip(&self.waits) {
            total.merge(counters.read());
        }
        for (total, counters) in snapshot.latches.iter_mut().zip(&self.latches) {
            total.merge(counters.read());
        }
    }

    fn zero(&self) {
        self.waits.iter().for_each(WaitCounters::zero);
        self.latches.iter().for_each(WaitCounters::zero);
    }

    fn start(&self, wait_type: WaitType, latch_class: Option<LatchClass>) {
        self.waits[wait_type as usize].add_start(self.one_writer);
        if let Some(class) = latch_class {
            self.latches[class as usize].add_start(self.one_writer);
        }
    }

    fn end(
        &self,
        wait_type: WaitType,
        latch_class: Option<LatchClass>,
        wait_ns: u64,
        signal_ns: u64,
    ) {
        self.waits[wait_type as usize].add_end(wait_ns, signal_ns, self.one_writer);
        if let Some(class) = latch_class {
            self.latches[class as usize].add_end(wait_ns, signal_ns, self.one_writer);
        }
    }
}

/// Totals of every wait type and latch class at one moment.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WaitSnapshot {
    waits: [WaitStat; WaitType::COUNT],
    latches: [WaitStat; LatchClass::COUNT],
}

impl WaitSnapshot {
    /// Totals of one wait type.
    pub fn wait(&self, wait_type: WaitType) -> WaitStat {
        self.waits[wait_type as usize]
    }

    /// Totals of one latch class (`waiting_requests_count`, `wait_time`, `max_wait_time`).
    pub fn latch(&self, class: LatchClass) -> WaitStat {
        self.latches[class as usize]
    }

    /// Every wait type with its totals, in display order.
    pub fn waits(&self) -> impl Iterator<Item = (WaitType, WaitStat)> + '_ {
        WaitType::ALL
            .into_iter()
            .map(|wait_type| (wait_type, self.wait(wait_type)))
    }

    /// Every latch class with its totals, in display order.
    pub fn latches(&self) -> impl Iterator<Item = (LatchClass, WaitStat)> + '_ {
        LatchClass::ALL
            .into_iter()
            .map(|class| (class, self.latch(class)))
    }

    /// What happened between `earlier` and this snapshot. Maximums cannot be subtracted, so
    /// the later snapshot's maximum is kept.
    pub fn since(&self, earlier: &WaitSnapshot) -> WaitSnapshot {
        fn minus(later: WaitStat, earlier: WaitStat) -> WaitStat {
            WaitStat {
                waiting_tasks_count: later
                    .waiting_tasks_count
                    .saturating_sub(earlier.waiting_tasks_count),
                wait_time_ns: later.wait_time_ns.saturating_sub(earlier.wait_time_ns),
                max_wait_time_ns: later.max_wait_time_ns,
                signal_wait_time_ns: later
                    .signal_wait_time_ns
                    .saturating_sub(earlier.signal_wait_time_ns),
            }
        }
        WaitSnapshot {
            waits: std::array::from_fn(|i| minus(self.waits[i], earlier.waits[i])),
            latches: std::array::from_fn(|i| minus(self.latches[i], earlier.latches[i])),
        }
    }
}

/// One thread's shard of the global statistics.
struct Shard {
    /// The clear epoch the counters belong to.
    epoch: AtomicU64,
    counters: WaitAccumulator,
}

/// All live shards, plus the totals of threads that have exited.
struct Registry {
    shards: Vec<Arc<CachePadded<Shard>>>,
    retired: WaitSnapshot,
}

static REGISTRY: Mutex<Registry> = Mutex::new(Registry {
    shards: Vec::new(),
    retired: WaitSnapshot {
        waits: [WaitStat {
            waiting_tasks_count: 0,
            wait_time_ns: 0,
            max_wait_time_ns: 0,
            signal_wait_time_ns: 0,
        }; WaitType::COUNT],
        latches: [WaitStat {
            waiting_tasks_count: 0,
            wait_time_ns: 0,
            max_wait_time_ns: 0,
            signal_wait_time_ns: 0,
        }; LatchClass::COUNT],
    },
});

/// Bumped by [`clear`]; shards of an older epoch count as zero.
static CLEAR_EPOCH: AtomicU64 = AtomicU64::new(0);

fn registry() -> std::sync::MutexGuard<'static, Registry> {
    REGISTRY
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The thread's handle on its shard; on thread exit it folds the shard into the retired totals.
struct ShardHandle(Arc<CachePadded<Shard>>);

impl ShardHandle {
    fn register() -> ShardHandle {
        let shard = Arc::new(CachePadded::new(Shard {
            epoch: AtomicU64::new(CLEAR_EPOCH.load(Ordering::Acquire)),
            counters: WaitAccumulator::for_one_thread(),
        }));
        registry().shards.push(Arc::clone(&shard));
        ShardHandle(shard)
    }

    /// The shard's counters, zeroed first if a clear happened since this thread last wrote.
    fn current(&self) -> &WaitAccumulator {
        let epoch = CLEAR_EPOCH.load(Ordering::Acquire);
        if self.0.epoch.load(Ordering::Relaxed) != epoch {
            self.0.counters.zero();
            self.0.epoch.store(epoch, Ordering::Release);
        }
        &self.0.counters
    }
}

impl Drop for ShardHandle {
    fn drop(&mut self) {
        let mut registry = registry();
        if self.0.epoch.load(Ordering::Acquire) == CLEAR_EPOCH.load(Ordering::Acquire) {
            let retired = &mut registry.retired;
            self.0.counters.add_to(retired);
        }
        registry.shards.retain(|shard| !Arc::ptr_eq(shard, &self.0));
    }
}

thread_local! {
    static SHARD: ShardHandle = ShardHandle::register();
    static ATTRIBUTION: RefCell<Vec<Arc<WaitAccumulator>>> = const { RefCell::new(Vec::new()) };
}

/// A wait in progress. Created by [`begin_wait`] when a task finds it must wait; ended by
/// [`Wait::end`] when it runs again.
#[must_use = "a wait must be ended, or its time is never recorded"]
pub struct Wait {
    wait_type: WaitType,
    latch_class: Option<LatchClass>,
    started_ns: u64,
}

/// Records the start of a wait (incrementing `waiting_tasks_count` now, as SQL Server does)
/// and reads the clock once.
pub fn begin_wait(wait_type: WaitType, latch_class: Option<LatchClass>) -> Wait {
    let _ = SHARD.try_with(|shard| shard.current().start(wait_type, latch_class));
    let _ = ATTRIBUTION.try_with(|attribution| {
        for accumulator in attribution.borrow().iter() {
            accumulator.start(wait_type, latch_class);
        }
    });
    Wait {
        wait_type,
        latch_class,
        started_ns: now_ns(),
    }
}

impl Wait {
    /// When the wait started, in [`now_ns`] nanoseconds.
    pub fn started_ns(&self) -> u64 {
        self.started_ns
    }

    /// Ends the wait now. `signalled_ns` is when the task was signalled (the latch handed over,
    /// the wake-up sent), in [`now_ns`] nanoseconds, or `None` if it was never signalled (it
    /// found the resource free by itself); the signal wait then counts as zero.
    pub fn end(self, signalled_ns: Option<u64>) {
        let now = now_ns();
        let wait_ns = now.saturating_sub(self.started_ns);
        let signal_ns = signalled_ns.map_or(0, |signalled| {
            now.saturating_sub(signalled.max(self.started_ns))
        });
        let _ = SHARD.try_with(|shard| {
            shard
                .current()
                .end(self.wait_type, self.latch_class, wait_ns, signal_ns)
        });
        let _ = ATTRIBUTION.try_with(|attribution| {
            for accumulator in attribution.borrow().iter() {
                accumulator.end(self.wait_type, self.latch_class, wait_ns, signal_ns);
            }
        });
    }
}

/// Totals of every wait and latch class since the last [`clear`], over all threads.
pub fn snapshot() -> WaitSnapshot {
    let registry = registry();
    let epoch = CLEAR_EPOCH.load(Ordering::Acquire);
    let mut total = registry.retired.clone();
    for shard in &registry.shards {
        if shard.epoch.load(Ordering::Acquire) == epoch {
            shard.counters.add_to(&mut total);
        }
    }
    total
}

/// Zeroes the global statistics, like `DBCC SQLPERF('sys.dm_os_wait_stats', CLEAR)`.
pub fn clear() {
    let mut registry = registry();
    CLEAR_EPOCH.fetch_add(1, Ordering::AcqRel);
    registry.retired = WaitSnapshot::default();
}

/// While the returned guard lives, every wait this thread records is also added to
/// `accumulator` (a session's or a statement's). Guards nest: a wait is added to every
/// accumulator installed on the thread, each once (an accumulator installed already, as a
/// session's is by a statement run inside its `run_statement`, is not installed again: a wait
/// was counted twice); dropping a guard removes what it installed.
pub fn attribute_waits_to(accumulator: Arc<WaitAccumulator>) -> AttributionGuard {
    // `try_with`, as where waits are recorded: a session dropped while its thread's locals are
    // being destroyed (one kept in a thread local) attributes its rollback here, and once the
    // list is gone there is nothing left to attribute to, which must not panic inside a drop.
    let pushed = ATTRIBUTION
        .try_with(|attribution| {
            let mut attribution = attribution.borrow_mut();
            let installed = attribution
                .iter()
                .any(|other| Arc::ptr_eq(other, &accumulator));
            if !installed {
                attribution.push(accumulator);
            }
            !installed
        })
        .unwrap_or(false);
    AttributionGuard {
        pushed,
        _not_send: std::marker::PhantomData,
    }
}

/// Removes the accumulator its [`attribute_waits_to`] call installed, if it installed one,
/// when dropped. It must be dropped on the thread that created it, so it is not `Send`.
pub struct AttributionGuard {
    pushed: bool,
    _not_send: std::marker::PhantomData<*const ()>,
}

impl Drop for AttributionGuard {
    fn drop(&mut self) {
        if self.pushed {
            let _ = ATTRIBUTION.try_with(|attribution| attribution.borrow_mut().pop());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // The global registry is shared by every test in this binary, so these tests look only at
    // a wait type no other storage test records.
    #[test]
    fn waits_from_many_threads_add_up_and_clear_resets_them() {
        let before = snapshot().wait(WaitType::LckMS);
        let threads: Vec<_> = (0..8)
            .map(|_| {
                std::thread::spawn(|| {
                    for _ in 0..100 {
                        let wait = begin_wait(WaitType::LckMS, None);
                        wait.end(None);
                    }
                })
            })
            .collect();
        threads.into_iter().for_each(|t| t.join().unwrap());
        let after = snapshot().wait(WaitType::LckMS);
        assert_eq!(after.waiting_tasks_count - before.waiting_tasks_count, 800);
        clear();
        assert_eq!(snapshot().wait(WaitType::LckMS).waiting_tasks_count, 0);
    }

    /// An accumulator several threads attribute their waits to at once counts every wait:
    /// with a load and a store per count (right only for a thread's own shard), concurrent
    /// waits overwrote each other's counts.
    #[test]
    fn an_accumulator_shared_by_threads_counts_every_wait() {
        let shared = Arc::new(WaitAccumulator::new());
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let shared = Arc::clone(&shared);
                std::thread::spawn(move || {
                    let _attribution = attribute_waits_to(shared);
                    for _ in 0..50_000 {
                        begin_wait(WaitType::LckMX, Some(LatchClass::Metadata)).end(None);
                    }
                })
            })
            .collect();
        threads.into_iter().for_each(|t| t.join().unwrap());
        let snapshot = shared.snapshot();
        assert_eq!(snapshot.wait(WaitType::LckMX).waiting_tasks_count, 200_000);
        assert_eq!(
            snapshot.latch(LatchClass::Metadata).waiting_tasks_count,
            200_000
        );
        let stat = snapshot.wait(WaitType::LckMX);
        assert!(stat.max_wait_time_ns <= stat.wait_time_ns, "{stat:?}");
    }

    #[test]
    fn attribution_sees_only_its_own_waits_and_signal_time_is_part_of_wait_time() {
        let accumulator = Arc::new(WaitAccumulator::new());
        let session = Arc::new(WaitAccumulator::new());
        let _session_guard = attribute_waits_to(Arc::clone(&session));
        {
            let _guard = attribute_waits_to(Arc::clone(&accumulator));
            let wait = begin_wait(WaitType::LckMX, Some(LatchClass::Metadata));
            std::thread::sleep(std::time::Duration::from_millis(2));
            let signalled = now_ns();
            std::thread::sleep(std::time::Duration::from_millis(1));
            wait.end(Some(signalled));
        }
        begin_wait(WaitType::LckMX, None).end(None);
        assert_eq!(
            session.snapshot().wait(WaitType::LckMX).waiting_tasks_count,
            2
        );
        let mine = accumulator.snapshot();
        let stat = mine.wait(WaitType::LckMX);
        assert_eq!(stat.waiting_tasks_count, 1);
        assert!(stat.wait_time_ns >= 3_000_000, "{stat:?}");
        assert!(
            stat.signal_wait_time_ns >= 1_000_000 && stat.signal_wait_time_ns < stat.wait_time_ns
        );
        assert_eq!(stat.max_wait_time_ns, stat.wait_time_ns);
        assert_eq!(mine.latch(LatchClass::Metadata).waiting_tasks_count, 1);
        assert_eq!(
            WaitType::from_name("pagelatch_ex"),
            Some(WaitType::PageLatchEx)
        );
    }
}
