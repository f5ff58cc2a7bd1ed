//! Row locks for transactions, as SQL Server takes them: shared (S) and exclusive (X) locks on
//! index keys (a row's clustered key, or a unique nonclustered key), held until the transaction
//! commits or rolls back (strict two-phase locking).
//!
//! Resources ([`LockKey`]: a table id and the bytes the engine names a key by, a 2-byte index
//! ordinal (0 for the clustered index) and the encoded key) are hashed into shards; each
//! shard is a mutex-protected hash map from a key to its lock entry: the holders and a FIFO
//! queue of waiters. An uncontended request takes one shard mutex, makes one lookup and
//! allocates nothing but the map's slot: a short key is stored inside the [`LockKey`].
//!
//! A request that conflicts queues, records an LCK_M_S or LCK_M_X wait (attributed to the
//! current session like every other wait), checks the waits-for graph for a cycle through
//! itself, and parks on its own condition variable until a release grants it the lock, its
//! timeout expires, or it is chosen as a deadlock victim. `docs/locking.md` describes the
//! protocol: modes, fairness, deadlock detection and the READ COMMITTED reader protocol.
//!
//! Every synchronization primitive comes from `lastpage_storage::sync`, so `--cfg loom` model
//! checks this module too (`tests/locks_loom.rs`).

use std::collections::hash_map::Entry;
use std::collections::{HashMap, HashSet, VecDeque};
use std::hash::BuildHasher;

use rustc_hash::FxBuildHasher;
use std::time::{Duration, Instant};

use crossbeam_utils::CachePadded;
use lastpage_storage::limits::{LOCK_KEY_INLINE_BYTES, LOCK_MANAGER_MAX_SHARDS};
use lastpage_storage::stats::{self, WaitType};
use lastpage_storage::sync::{
    self, Arc, AtomicU8, AtomicU64, AtomicUsize, Condvar, Mutex, Ordering,
};

pub use lastpage_storage::wal::TxnId;

/// A lockable resource: one key of one index of a table (a row, named by its clustered key,
/// or a unique nonclustered key), or a key range named by its low end.
///
/// The map of lock entries and the transaction's list of held locks both keep the key. A short
/// key (an identity or a GUID, with its index prefix) is stored inline, so that locking a row
/// allocates nothing for its key and a copy is a few words; a longer one is shared through an
/// `Arc`, so that the second copy is a count increment rather than another allocation.
#[derive(Clone)]
pub struct LockKey {
    table_id: u32,
    /// Whether this names a key range's lock (see [`LockManager::lock_range`]): then `bytes`
    /// is the range's low end, and the key is only ever locked through the range API.
    range: bool,
    bytes: KeyBytes,
}

#[derive(Clone)]
enum KeyBytes {
    Inline {
        len: u8,
        bytes: [u8; LOCK_KEY_INLINE_BYTES],
    },
    Shared(std::sync::Arc<[u8]>),
}

impl LockKey {
    /// The lock resource named by `key` (the engine's bytes for it: index ordinal and encoded
    /// key) in table `table_id`.
    pub fn new(table_id: u32, key: impl AsRef<[u8]>) -> LockKey {
        let key = key.as_ref();
        let bytes = match u8::try_from(key.len()) {
            Ok(len) if key.len() <= LOCK_KEY_INLINE_BYTES => {
                let mut bytes = [0; LOCK_KEY_INLINE_BYTES];
                bytes[..key.len()].copy_from_slice(key);
                KeyBytes::Inline { len, bytes }
            }
            _ => KeyBytes::Shared(key.into()),
        };
        LockKey {
            table_id,
            range: false,
            bytes,
        }
    }

    /// The lock of all of table `table_id` that a transaction escalates to (see
    /// [`LockManager::try_escalate`]). It is a range's lock with an empty low end, which no row
    /// key has (every one starts with its index's ordinal), so it names nothing else.
    pub fn whole_table(table_id: u32) -> LockKey {
        LockKey {
            table_id,
            range: true,
            bytes: KeyBytes::Inline {
                len: 0,
                bytes: [0; LOCK_KEY_INLINE_BYTES],
            },
        }
    }

    /// Whether this is the lock of a whole table ([`LockKey::whole_table`]).
    pub fn is_whole_table(&self) -> bool {
        self.range && self.key().is_empty()
    }

    /// The table the row belongs to.
    pub fn table_id(&self) -> u32 {
        self.table_id
    }

    /// Whether this is a key range's lock rather than a row's.
    pub fn is_range(&self) -> bool {
        self.range
    }

    /// The key's bytes: index ordinal and memcomparable encoding (a range's low end for a
    /// range's lock).
    pub fn key(&self) -> &[u8] {
        match &self.bytes {
            KeyBytes::Inline { len, bytes } => &bytes[..usize::from(*len)],
            KeyBytes::Shared(bytes) => bytes,
        }
    }
}

// Equality, hashing and order are the table's, the kind's and the key bytes', however they are
// stored.
impl PartialEq for LockKey {
    fn eq(&self, other: &Self) -> bool {
        self.table_id == other.table_id && self.range == other.range && self.key() == other.key()
    }
}

impl Eq for LockKey {}

impl std::hash::Hash for LockKey {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.table_id.hash(state);
        self.range.hash(state);
        self.key().hash(state);
    }
}

impl PartialOrd for LockKey {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for LockKey {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.table_id, self.range, self.key()).cmp(&(other.table_id, other.range, other.key()))
    }
}

impl std::fmt::Debug for LockKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockKey")
            .field("table_id", &self.table_id)
            .field("range", &self.range)
            .field("key", &self.key())
            .finish()
    }
}

/// Lock modes. S is compatible only with S; X is compatible with nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LockMode {
    /// Shared: for reading a row; any number of transactions may hold it together.
    Shared,
    /// Exclusive: for changing a row; one transaction holds it, and no one else holds anything.
    Exclusive,
}

impl LockMode {
    /// Whether a lock in this mode can be held while another transaction holds `other`.
    pub fn is_compatible_with(self, other: LockMode) -> bool {
        self == LockMode::Shared && other == LockMode::Shared
    }

    /// Whether holding this mode already grants a request for `requested`.
    pub fn covers(self, requested: LockMode) -> bool {
        self == LockMode::Exclusive || requested == LockMode::Shared
    }

    /// The wait type a request for this mode records when it has to wait.
    pub fn wait_type(self) -> WaitType {
        match self {
            LockMode::Shared => WaitType::LckMS,
            LockMode::Exclusive => WaitType::LckMX,
        }
    }
}

/// Why a lock request failed. Messages are SQL Server's.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LockError {
    /// The request waited for its whole timeout (SQL Server's error 1222).
    #[error("Lock request time out period exceeded.")]
    Timeout {
        /// The timeout that expired, in milliseconds.
        ms: u64,
    },
    /// The request would have closed a cycle of waiting transactions, and its transaction was
    /// chosen as the victim (SQL Server's error 1205). The caller must roll the transaction back,
    /// which releases its locks and lets the rest of the cycle go on.
    ///
    /// The manager knows transactions, not sessions, so its message names the transaction. The
    /// engine reports the error as [`crate::EngineError::Deadlock`], with SQL Server's message,
    /// whose "Process ID" is the victim's session id (SQL Server's SPID), not this id.
    #[error(
        "Transaction {} was deadlocked on lock resources with another transaction and has been chosen as the deadlock victim. Rerun the transaction.",
        victim.0
    )]
    Deadlock {
        /// The transaction chosen as the victim: always the one whose request found the cycle.
        victim: TxnId,
    },
}

impl LockError {
    /// SQL Server's error number: 1222 for a timeout, 1205 for a deadlock victim.
    pub fn number(&self) -> u32 {
        match self {
            LockError::Timeout { .. } => 1222,
            LockError::Deadlock { .. } => 1205,
        }
    }
}

/// Counters of one lock manager since it was created.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LockStats {
    /// Locks granted: new locks and S-to-X conversions, at once or after a wait. Requests for a
    /// lock the transaction already holds are free and not counted.
    pub acquired: u64,
    /// Requests that had to wait (lock requests and READ COMMITTED reads).
    pub waits: u64,
    /// Requests that failed with [`LockError::Timeout`].
    pub timeouts: u64,
    /// Requests that failed with [`LockError::Deadlock`].
    pub deadlocks: u64,
    /// Transactions' row locks on a table traded for one lock on the whole table
    /// ([`LockManager::try_escalate`]).
    pub escalations: u64,
    /// Escalations that did not happen because another transaction held or waited for a lock
    /// on the table.
    pub failed_escalations: u64,
}

impl LockStats {
    fn merge(&mut self, other: &LockStats) {
        self.acquired += other.acquired;
        self.waits += other.waits;
        self.timeouts += other.timeouts;
        self.deadlocks += other.deadlocks;
        self.escalations += other.escalations;
        self.failed_escalations += other.failed_escalations;
    }
}

/// What a granted request changed, so that [`TxnLocks`] records each key once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Granted {
    /// The transaction did not hold the key before.
    New,
    /// The transaction held it in a mode that covers the request; nothing changed.
    AlreadyHeld,
    /// The transaction's S lock became X.
    Upgraded,
}

/// One transaction's lock on a key.
#[derive(Clone, Copy, Debug)]
struct Holder {
    txn: TxnId,
    mode: LockMode,
}

/// The holders of a key. Most keys have one holder, so the first lives inline and locking an
/// unlocked key allocates nothing but the key; only several S holders spill into the vector.
#[derive(Debug, Default)]
struct Holders {
    first: Option<Holder>,
    rest: Vec<Holder>,
}

impl Holders {
    fn one(holder: Holder) -> Holders {
        Holders {
            first: Some(holder),
            rest: Vec::new(),
        }
    }

    fn iter(&self) -> impl Iterator<Item = &Holder> {
        self.first.iter().chain(self.rest.iter())
    }

    fn is_empty(&self) -> bool {
        self.first.is_none()
    }

    fn mode_of(&self, txn: TxnId) -> Option<LockMode> {
        self.iter()
            .find(|holder| holder.txn == txn)
            .map(|holder| holder.mode)
    }

    fn find_mut(&mut self, txn: TxnId) -> Option<&mut Holder> {
        self.first
            .iter_mut()
            .chain(self.rest.iter_mut())
            .find(|holder| holder.txn == txn)
    }

    fn push(&mut self, holder: Holder) {
        if self.first.is_none() {
            self.first = Some(holder);
        } else {
            self.rest.push(holder);
        }
    }

    /// Removes `txn`'s lock; returns whether it held one.
    fn remove(&mut self, txn: TxnId) -> bool {
        if self.first.is_some_and(|holder| holder.txn == txn) {
            self.first = self.rest.pop();
            return true;
        }
        if let Some(index) = self.rest.iter().position(|holder| holder.txn == txn) {
            self.rest.swap_remove(index);
            return true;
        }
        false
    }

    /// Whether a transaction that holds nothing here may take `mode` now.
    fn admit(&self, mode: LockMode) -> bool {
        self.iter()
            .all(|holder| holder.mode.is_compatible_with(mode))
    }

    /// Whether `txn` is the only holder (so its S lock may become X).
    fn held_only_by(&self, txn: TxnId) -> bool {
        self.iter().all(|holder| holder.txn == txn)
    }

    /// Whether a transaction other than `txn` holds X.
    fn exclusive_by_other(&self, txn: Option<TxnId>) -> bool {
        self.iter()
            .any(|holder| holder.mode == LockMode::Exclusive && Some(holder.txn) != txn)
    }
}

/// What a queued request waits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Request {
    /// A new lock in this mode.
    Lock(LockMode),
    /// The requester holds S and wants X: it waits for the other holders to leave. Conversions
    /// queue ahead of new requests, as SQL Server's convert queue does, because the converter
    /// already holds the key and everyone behind it would wait for it anyway.
    Upgrade,
    /// A READ COMMITTED reader that waits until no other transaction holds X and then leaves
    /// without taking a lock. It holds nothing, so it never blocks anyone and does not keep its
    /// place in the FIFO order: it goes as soon as the X lock it waits for is gone.
    ReadThrough,
}

impl Request {
    /// The mode whose compatibility decides the grant, and whose wait type is recorded.
    fn mode(self) -> LockMode {
        match self {
            Request::Lock(mode) => mode,
            Request::Upgrade => LockMode::Exclusive,
            Request::ReadThrough => LockMode::Shared,
        }
    }
}

const WAITING: u8 = 0;
const GRANTED: u8 = 1;

/// The private parking place of one waiting request. `state` and `signalled_ns` are written
/// only under the shard mutex (by the granter); the waiter reads `state` under it, and
/// `signalled_ns` after it has seen `GRANTED` under it, so the mutex orders both reads and
/// relaxed atomics suffice. They are atomics only because the slot is shared through an `Arc`.
struct WaitSlot {
    state: AtomicU8,
    /// When the grant was made, in [`stats::now_ns`] nanoseconds (the start of the signal wait).
    signalled_ns: AtomicU64,
    /// One condition variable per waiter, so a release wakes exactly the requests it grants
    /// instead of every waiter of the shard.
    condvar: Condvar,
}

impl WaitSlot {
    fn new() -> WaitSlot {
        WaitSlot {
            state: AtomicU8::new(WAITING),
            signalled_ns: AtomicU64::new(0),
            condvar: Condvar::new(),
        }
    }

    fn is_granted(&self) -> bool {
        self.state.load(Ordering::Relaxed) == GRANTED
    }

    /// Grants the request. The caller holds the shard mutex, which the waiter re-acquires before
    /// it looks at `state`, so the notification cannot be lost; notifying under the mutex costs
    /// the woken thread a short wait for it, which only happens on the contended path.
    fn grant(&self, now_ns: u64) {
        self.signalled_ns.store(now_ns, Ordering::Relaxed);
        self.state.store(GRANTED, Ordering::Relaxed);
        self.condvar.notify_one();
    }
}

/// A parked request.
struct Waiter {
    /// The requesting transaction; `None` only for a reader outside any transaction.
    txn: Option<TxnId>,
    request: Request,
    slot: Arc<WaitSlot>,
}

/// The lock state of one key. It exists while anyone holds or waits for the key.
#[derive(Default)]
struct LockEntry {
    holders: Holders,
    /// Waiting requests: conversions first, then new requests in arrival order (with READ
    /// COMMITTED readers anywhere among them).
    queue: VecDeque<Waiter>,
}

impl LockEntry {
    /// The entry of a key `holder` has just locked, with nobody waiting.
    fn held_by(holder: Holder) -> LockEntry {
        LockEntry {
            holders: Holders::one(holder),
            queue: VecDeque::new(),
        }
    }

    fn is_unused(&self) -> bool {
        self.holders.is_empty() && self.queue.is_empty()
    }

    /// Whether a request that would queue behind the current waiters must wait for them: any
    /// waiting lock request (not a reader) is ahead of a new request in FIFO order.
    fn has_queued_lock_requests(&self) -> bool {
        self.queue
            .iter()
            .any(|waiter| waiter.request != Request::ReadThrough)
    }

    /// Grants every queued request that can go now, in queue order, and returns how many locks
    /// (not reads) were granted. A lock request that cannot go blocks every lock request behind
    /// it (FIFO), so a stream of S requests cannot starve a waiting X request; readers are
    /// granted wherever they are, since they take nothing, and before any lock: a reader waits
    /// only for the X lock it found, not for a writer queued ahead of it, which would
    /// otherwise take X first and hold the reader for its whole transaction (as deadlock
    /// detection assumes: a reader's only blockers are the holders).
    fn grant_waiters(&mut self) -> u64 {
        let mut now_ns = None;
        let mut index = 0;
        while index < self.queue.len() {
            let waiter = &self.queue[index];
            if waiter.request != Request::ReadThrough || self.holders.exclusive_by_other(waiter.txn)
            {
                index += 1;
                continue;
            }
            let Some(reader) = self.queue.remove(index) else {
                break;
            };
            let now = *now_ns.get_or_insert_with(stats::now_ns);
            reader.slot.grant(now);
        }
        let mut granted_locks = 0;
        let mut blocked = false;
        let mut index = 0;
        while index < self.queue.len() {
            let waiter = &self.queue[index];
            let grantable = match waiter.request {
                Request::ReadThrough => !self.holders.exclusive_by_other(waiter.txn),
                Request::Upgrade => {
                    !blocked && waiter.txn.is_some_and(|txn| self.holders.held_only_by(txn))
                }
                Request::Lock(mode) => !blocked && self.holders.admit(mode),
            };
            if !grantable {
                blocked |= waiter.request != Request::ReadThrough;
                index += 1;
                continue;
            }
            let Some(waiter) = self.queue.remove(index) else {
                break;
            };
            match (waiter.request, waiter.txn) {
                (Request::Lock(mode), Some(txn)) => {
                    self.holders.push(Holder { txn, mode });
                    granted_locks += 1;
                }
                (Request::Upgrade, Some(txn)) => {
                    if let Some(holder) = self.holders.find_mut(txn) {
                        holder.mode = LockMode::Exclusive;
                    }
                    granted_locks += 1;
                }
                // Readers take nothing; lock requests always carry a transaction.
                _ => {}
            }
            let now = *now_ns.get_or_insert_with(stats::now_ns);
            waiter.slot.grant(now);
        }
        granted_locks
    }

    /// Removes the request parked on `slot` (after its timeout or as a deadlock victim) and
    /// grants whatever its departure unblocks. Returns the locks granted.
    fn withdraw(&mut self, slot: &Arc<WaitSlot>) -> u64 {
        if let Some(index) = self
            .queue
            .iter()
            .position(|waiter| Arc::ptr_eq(&waiter.slot, slot))
        {
            self.queue.remove(index);
        }
        self.grant_waiters()
    }

    /// The transactions `txn`'s queued request waits for: holders whose mode conflicts with it,
    /// and every lock request queued ahead of it (FIFO: it cannot be granted before them).
    /// Empty if `txn` has no request queued here (it was granted, or gave up, meanwhile).
    fn blockers_of(&self, txn: TxnId, blockers: &mut Vec<TxnId>) {
        let Some(position) = self.queue.iter().position(|waiter| waiter.txn == Some(txn)) else {
            return;
        };
        let request = self.queue[position].request;
        let mode = request.mode();
        blockers.extend(
            self.holders
                .iter()
                .filter(|holder| holder.txn != txn && !holder.mode.is_compatible_with(mode))
                .map(|holder| holder.txn),
        );
        if request != Request::ReadThrough {
            blockers.extend(
                self.queue
                    .iter()
                    .take(position)
                    .filter(|waiter| waiter.request != Request::ReadThrough)
                    .filter_map(|waiter| waiter.txn),
            );
        }
    }
}

/// One shard: its keys' lock entries and its counters (kept under the shard mutex, which every
/// request takes anyway, so counting costs no shared cache line of its own).
#[derive(Default)]
struct Shard {
    entries: HashMap<LockKey, LockEntry, FxBuildHasher>,
    stats: LockStats,
}

/// The waits-for graph's vertices: which key each waiting transaction waits for. The edges are
/// not stored; they are read from the key's entry (its holders and queue) when a detection
/// follows them, so they can never be stale.
#[derive(Default)]
struct WaitingTxns {
    waiting_for: HashMap<TxnId, LockKey>,
}

/// A key range one transaction holds X on as a whole: a batch's fresh keys (see
/// [`LockManager::lock_range`]) or a whole table (see [`LockManager::try_escalate`]).
struct RangeLock {
    txn: TxnId,
    /// The range's own lock entry: its key is the low end, marked as a range (empty for a
    /// whole table).
    entry: LockKey,
    /// The high end (inclusive), a row key of the same table; `None` for a whole table.
    high: Option<LockKey>,
}

impl RangeLock {
    /// Whether row key `key` lies in the range.
    fn covers(&self, key: &LockKey) -> bool {
        key.table_id == self.entry.table_id
            && !key.range
            && self
                .high
                .as_ref()
                .is_none_or(|high| self.entry.key() <= key.key() && key.key() <= high.key())
    }

    fn is_whole_table(&self) -> bool {
        self.high.is_none()
    }
}

/// Which held ranges cover a row key a transaction asks for.
enum Coverage {
    /// None.
    None,
    /// Another transaction's range, whose lock entry this is: the request waits for it.
    Other(LockKey),
    /// A range of the requester's own fresh keys: nobody else can hold the key.
    OwnKeys,
    /// The requester's lock on the whole table: nobody else can take the key, but another
    /// transaction may hold it already (a fresh key it inserted after the escalation).
    OwnTable,
}

/// The row lock manager of one database. See the module documentation and `docs/locking.md`.
///
/// A transaction makes one request at a time (it is driven by one thread at a time), and must
/// not request locks after releasing them (strict two-phase locking); the deadlock detector
/// relies on both.
pub struct LockManager {
    shards: Box<[CachePadded<Mutex<Shard>>]>,
    /// Which key every waiting transaction waits for. Its mutex also serialises deadlock
    /// detections, so two transactions closing the same cycle at once cannot both be chosen.
    /// Lock order: this mutex before a shard mutex, never the other way round.
    waiting: Mutex<WaitingTxns>,
    /// A fixed (not per-process random) hasher, so a key's shard is the same in every run;
    /// FxHash, because SipHash costs more per lock than the whole rest of an uncontended
    /// acquire. A client that chose keys to collide would only slow its own shard's lookups.
    shard_hasher: FxBuildHasher,
    /// The key ranges held now. Every row request looks here, so the list is short (one entry
    /// per batch of fresh keys inserted by a transaction that has not ended, and one per
    /// escalated table) and is only read when `range_count` says it is not empty. Lock order:
    /// a shard mutex before this one, never the other way round.
    ranges: Mutex<Vec<RangeLock>>,
    /// How many entries `ranges` has. Written under its mutex; a request that reads 0 skips the
    /// mutex. A lock request reads it under its key's shard mutex. A batch's range is added
    /// before any row in it exists, and an escalation adds its table's before it looks through
    /// the shards for other transactions' locks on the table: either the escalation finds a
    /// request's lock in its shard, or the request took the shard mutex after the escalation
    /// let it go, and so reads the count after the range was added.
    range_count: AtomicUsize,
    /// Escalations that succeeded and that failed ([`LockStats::escalations`]); rare, so
    /// counted outside the shards.
    escalations: AtomicU64,
    failed_escalations: AtomicU64,
}

impl std::fmt::Debug for LockManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockManager")
            .field("shards", &self.shards.len())
            .field("stats", &self.stats())
            .finish()
    }
}

/// How long one lock request may still wait: its timeout (which its error names) and the
/// instant that runs out, fixed when the request starts. Every wait of the request shares it:
/// one for a range lock covering its row, then one for the row, and a READ COMMITTED read's
/// waits for one row, however many writers come and go while it waits
/// ([`LockManager::wait_for_shared_within`]). Each wait had the whole timeout before, so a
/// request could wait twice its timeout or more.
#[derive(Clone, Copy, Debug)]
pub struct LockPatience {
    timeout: Option<Duration>,
    /// `None`: no timeout, or one too large for the clock, which waits as long as it takes.
    deadline: Option<Instant>,
}

impl LockPatience {
    /// Waits of at most `timeout` in all, from now (`None`: as long as they take).
    pub fn from_now(timeout: Option<Duration>) -> LockPatience {
        LockPatience {
            timeout,
            deadline: timeout.and_then(|timeout| Instant::now().checked_add(timeout)),
        }
    }
}

impl LockManager {
    /// A lock manager with `shards` shards, clamped to between 1 and
    /// [`LOCK_MANAGER_MAX_SHARDS`] (`LOCK_MANAGER_DEFAULT_SHARDS` is a good default).
    pub fn new(shards: usize) -> LockManager {
        let shards = shards.clamp(1, LOCK_MANAGER_MAX_SHARDS);
        LockManager {
            shards: (0..shards)
                .map(|_| CachePadded::new(Mutex::new(Shard::default())))
                .collect(),
            waiting: Mutex::new(WaitingTxns::default()),
            shard_hasher: FxBuildHasher,
            ranges: Mutex::new(Vec::new()),
            range_count: AtomicUsize::new(0),
            escalations: AtomicU64::new(0),
            failed_escalations: AtomicU64::new(0),
        }
    }

    /// The first range covering row key `key` for which `pick` gives something. Reads only the
    /// count while no range is held, which is the usual case of every row request.
    fn find_range<T>(&self, key: &LockKey, pick: impl FnMut(&RangeLock) -> Option<T>) -> Option<T> {
        if self.range_count.load(Ordering::Acquire) == 0 || key.range {
            return None;
        }
        sync::lock(&self.ranges)
            .iter()
            .filter(|range| range.covers(key))
            .find_map(pick)
    }

    /// Whether a range held by `txn` covers row key `key`.
    fn in_own_range(&self, txn: TxnId, key: &LockKey) -> bool {
        self.find_range(key, |range| (range.txn == txn).then_some(()))
            .is_some()
    }

    /// Whether a range held by a transaction other than `txn` covers row key `key`; if so,
    /// that range's lock.
    fn range_of_other(&self, txn: Option<TxnId>, key: &LockKey) -> Option<LockKey> {
        self.find_range(key, |range| {
            (Some(range.txn) != txn).then(|| range.entry.clone())
        })
    }

    /// Which ranges cover row key `key` for a request by `txn` (see [`Coverage`]). Another
    /// transaction's range comes first: the request waits for it. Except, for a `fresh` key
    /// (one nobody could name before `txn` made it), another transaction's lock on the whole
    /// table: such a key is locked under a page latch and must never wait, and it is no row the
    /// other transaction could have read or changed.
    fn coverage(&self, txn: TxnId, key: &LockKey, fresh: bool) -> Coverage {
        if self.range_count.load(Ordering::Acquire) == 0 || key.range {
            return Coverage::None;
        }
        let ranges = sync::lock(&self.ranges);
        let mut coverage = Coverage::None;
        for range in ranges.iter().filter(|range| range.covers(key)) {
            if range.txn != txn {
                if !(fresh && range.is_whole_table()) {
                    return Coverage::Other(range.entry.clone());
                }
            } else if !range.is_whole_table() {
                coverage = Coverage::OwnKeys;
            } else if matches!(coverage, Coverage::None) {
                coverage = Coverage::OwnTable;
            }
        }
        coverage
    }

    /// Locks every row key from `low` to `high` (inclusive, one table's keys, `low ≤ high`)
    /// exclusively for `txn` with one request: what a statement takes for the fresh identity
    /// keys of a batch it inserts instead of one lock per row. Returns the range's own lock
    /// key, which the transaction releases with its other locks in [`LockManager::release_all`].
    ///
    /// Until then every request for a row in the range by another transaction waits for it
    /// (LCK_M_X for a lock, LCK_M_S for a READ COMMITTED read), and `is_locked_by_other` says
    /// so. The range does not look at the row locks inside it: it is meant for keys that did
    /// not exist before the statement made them, which nobody else can have locked (the engine
    /// never hands an identity value out twice). A row that did exist inside it would keep its
    /// own lock and also be waited for by others until `txn` ends: a false conflict, never a
    /// missed one. Two transactions' ranges with the same low end conflict like rows.
    pub fn lock_range(
        &self,
        txn: TxnId,
        low: &LockKey,
        high: &LockKey,
        timeout: Option<Duration>,
    ) -> Result<LockKey, LockError> {
        self.lock_range_granted(txn, low, high, timeout)
            .map(|(entry, _)| entry)
    }

    /// [`LockManager::lock_range`], and what the request changed.
    fn lock_range_granted(
        &self,
        txn: TxnId,
        low: &LockKey,
        high: &LockKey,
        timeout: Option<Duration>,
    ) -> Result<(LockKey, Granted), LockError> {
        debug_assert!(low.table_id == high.table_id && !low.range && !high.range);
        debug_assert!(low.key() <= high.key());
        let entry = LockKey {
            range: true,
            ..low.clone()
        };
        let granted = self.lock(txn, &entry, LockMode::Exclusive, timeout, true)?;
        let mut ranges = sync::lock(&self.ranges);
        match ranges
            .iter_mut()
            .find(|range| range.txn == txn && range.entry == entry)
        {
            // The transaction already holds a range from the same low end: it now reaches as
            // far as the higher of the two ends.
            Some(held) => {
                if let Some(held_high) = &mut held.high
                    && held_high.key() < high.key()
                {
                    *held_high = high.clone();
                }
            }
            None => {
                ranges.push(RangeLock {
                    txn,
                    entry: entry.clone(),
                    high: Some(high.clone()),
                });
                self.range_count.store(ranges.len(), Ordering::Release);
            }
        }
        Ok((entry, granted))
    }

    /// Takes `key`'s range out of the list of held ranges (before its lock is released).
    fn forget_range(&self, txn: TxnId, key: &LockKey) {
        let mut ranges = sync::lock(&self.ranges);
        if let Some(index) = ranges
            .iter()
            .position(|range| range.txn == txn && range.entry == *key)
        {
            ranges.swap_remove(index);
            self.range_count.store(ranges.len(), Ordering::Release);
        }
    }

    /// Waits until no transaction other than `txn` holds X on `key` (a row, or a range's own
    /// entry), recording a wait of `wait_type`, and takes nothing: how a READ COMMITTED reader
    /// waits for a row, and how any request waits for a range that covers its row.
    fn wait_out_exclusive(
        &self,
        txn: Option<TxnId>,
        key: &LockKey,
        wait_type: WaitType,
        patience: LockPatience,
    ) -> Result<(), LockError> {
        let shard_mutex = self.shard(key);
        let mut shard = sync::lock(shard_mutex);
        let Shard { entries, stats } = &mut *shard;
        let Some(entry) = entries
            .get_mut(key)
            .filter(|entry| entry.holders.exclusive_by_other(txn))
        else {
            return Ok(());
        };
        let slot = Self::enqueue(entry, stats, txn, Request::ReadThrough, patience.timeout)?;
        drop(shard);
        self.park(shard_mutex, txn, key, wait_type, patience, slot)
    }

    fn shard(&self, key: &LockKey) -> &Mutex<Shard> {
        let hash = self.shard_hasher.hash_one(key);
        // The remainder is below the shard count, which is a `usize`, so it fits.
        let index = (hash % self.shards.len() as u64) as usize;
        &self.shards[index]
    }

    /// Acquires `key` in `mode` for `txn`, waiting at most `timeout` (`None`: as long as it
    /// takes; `Some(Duration::ZERO)`: fail at once if the lock is not free, like
    /// `SET LOCK_TIMEOUT 0`). A lock the transaction holds in a covering mode is granted at once;
    /// a request for X on a key it holds in S converts the lock, waiting for the other S holders.
    /// The lock is held until [`LockManager::release_all`].
    pub fn acquire(
        &self,
        txn: TxnId,
        key: &LockKey,
        mode: LockMode,
        timeout: Option<Duration>,
    ) -> Result<(), LockError> {
        self.lock(txn, key, mode, timeout, false).map(|_| ())
    }

    /// [`LockManager::acquire`] of X on a key `txn` has just made (an identity key, under the
    /// latch of the leaf it goes on), which must never wait: another transaction's lock on the
    /// whole table does not cover it (see [`LockManager::try_escalate`]).
    pub fn acquire_fresh(&self, txn: TxnId, key: &LockKey) -> Result<(), LockError> {
        self.lock(txn, key, LockMode::Exclusive, None, true)
            .map(|_| ())
    }

    fn lock(
        &self,
        txn: TxnId,
        key: &LockKey,
        mode: LockMode,
        timeout: Option<Duration>,
        fresh: bool,
    ) -> Result<Granted, LockError> {
        let patience = LockPatience::from_now(timeout);
        let shard_mutex = self.shard(key);
        let mut shard = sync::lock(shard_mutex);
        // Ranges are looked at under the key's shard mutex, so that an escalation cannot miss
        // the lock this takes (see `range_count`). A lock the requester holds already is
        // granted first; a row in another transaction's range is waited for, and one in the
        // requester's own range of fresh keys is held already.
        let mut own_table = false;
        if !key.range && self.range_count.load(Ordering::Acquire) != 0 {
            loop {
                let held = shard
                    .entries
                    .get(key)
                    .and_then(|entry| entry.holders.mode_of(txn));
                if held.is_some_and(|held| held.covers(mode)) {
                    return Ok(Granted::AlreadyHeld);
                }
                match self.coverage(txn, key, fresh) {
                    Coverage::Other(range) => {
                        drop(shard);
                        self.wait_out_exclusive(Some(txn), &range, mode.wait_type(), patience)?;
                        shard = sync::lock(shard_mutex);
                    }
                    Coverage::OwnKeys => return Ok(Granted::AlreadyHeld),
                    Coverage::OwnTable => {
                        own_table = true;
                        break;
                    }
                    Coverage::None => break,
                }
            }
        }
        let Shard { entries, stats } = &mut *shard;
        // One lookup whether or not the key is locked (the usual case for a new row is that it
        // is not): cloning a key costs less than hashing and probing it a second time.
        let entry = match entries.entry(key.clone()) {
            // Under the requester's lock on the whole table, a key nobody else holds needs no
            // entry of its own: that is what makes escalating save memory.
            Entry::Vacant(_) if own_table => return Ok(Granted::AlreadyHeld),
            Entry::Vacant(vacant) => {
                vacant.insert(LockEntry::held_by(Holder { txn, mode }));
                stats.acquired += 1;
                return Ok(Granted::New);
            }
            Entry::Occupied(occupied) => occupied.into_mut(),
        };
        let request = match entry.holders.mode_of(txn) {
            Some(held) if held.covers(mode) => return Ok(Granted::AlreadyHeld),
            Some(_) => {
                let converting_ahead = entry
                    .queue
                    .iter()
                    .any(|waiter| waiter.request == Request::Upgrade);
                if entry.holders.held_only_by(txn) && !converting_ahead {
                    if let Some(holder) = entry.holders.find_mut(txn) {
                        holder.mode = LockMode::Exclusive;
                    }
                    stats.acquired += 1;
                    return Ok(Granted::Upgraded);
                }
                Request::Upgrade
            }
            None => {
                if !entry.has_queued_lock_requests() && entry.holders.admit(mode) {
                    if own_table {
                        return Ok(Granted::AlreadyHeld);
                    }
                    entry.holders.push(Holder { txn, mode });
                    stats.acquired += 1;
                    return Ok(Granted::New);
                }
                Request::Lock(mode)
            }
        };
        let slot = Self::enqueue(entry, stats, Some(txn), request, timeout)?;
        // The request is queued before the shard mutex is let go, so the release that grants
        // it cannot slip in unseen between the check above and the park below.
        drop(shard);
        self.park(
            shard_mutex,
            Some(txn),
            key,
            request.mode().wait_type(),
            patience,
            slot,
        )?;
        Ok(match request {
            Request::Upgrade => Granted::Upgraded,
            _ => Granted::New,
        })
    }

    /// For a READ COMMITTED reader: returns once no transaction other than `reader` holds X on
    /// `key`, waiting (as LCK_M_S) at most `timeout`, and leaves holding no lock, as SQL Server
    /// releases a read-committed S lock as soon as the row is read. A transaction may take X
    /// right after this returns, so the reader must re-check with
    /// [`LockManager::is_locked_by_other`] while it holds the row's page latch (see
    /// `docs/locking.md`). A reader inside a transaction passes its id, so that a reader that
    /// waits for a transaction waiting for it is found as a deadlock.
    pub fn wait_for_shared(
        &self,
        reader: Option<TxnId>,
        key: &LockKey,
        timeout: Option<Duration>,
    ) -> Result<(), LockError> {
        self.wait_for_shared_within(reader, key, LockPatience::from_now(timeout))
    }

    /// [`LockManager::wait_for_shared`] within what is left of `patience`: for a reader that
    /// waits for one row again and again (a new writer locked it before the reader looked
    /// again), so that its waits add up to one timeout.
    pub fn wait_for_shared_within(
        &self,
        reader: Option<TxnId>,
        key: &LockKey,
        patience: LockPatience,
    ) -> Result<(), LockError> {
        loop {
            while let Some(range) = self.range_of_other(reader, key) {
                self.wait_out_exclusive(reader, &range, WaitType::LckMS, patience)?;
            }
            self.wait_out_exclusive(reader, key, WaitType::LckMS, patience)?;
            // A transaction that escalated while this waited for its row lock let go of the
            // row only after its lock on the table was published (see
            // `LockManager::try_escalate`), so a look at the ranges now finds that lock.
            if self.range_of_other(reader, key).is_none() {
                return Ok(());
            }
        }
    }

    /// Whether a transaction other than `txn` holds X on `key`: what a READ COMMITTED reader
    /// must not read past. S locks of others do not count (readers do not block readers). One
    /// shard mutex, no allocation.
    pub fn is_locked_by_other(&self, txn: Option<TxnId>, key: &LockKey) -> bool {
        // The row first, then the ranges: a transaction that escalates publishes its lock on
        // the table before it lets go of its row locks, so a row found unlocked here either
        // was never its, or is covered by a range the look below finds.
        let locked = {
            let shard = sync::lock(self.shard(key));
            shard
                .entries
                .get(key)
                .is_some_and(|entry| entry.holders.exclusive_by_other(txn))
        };
        locked || self.range_of_other(txn, key).is_some()
    }

    /// The mode in which `txn` holds `key`, if it does. A key of a table `txn` escalated to
    /// counts as held in X, even one another transaction has made since (which `txn` would
    /// still wait for: see [`LockManager::try_escalate`]).
    pub fn holds(&self, txn: TxnId, key: &LockKey) -> Option<LockMode> {
        if self.in_own_range(txn, key) {
            return Some(LockMode::Exclusive);
        }
        let shard = sync::lock(self.shard(key));
        shard
            .entries
            .get(key)
            .and_then(|entry| entry.holders.mode_of(txn))
    }

    /// Releases `txn`'s locks on `keys` (at commit or rollback) and grants what that unblocks.
    /// Keys `txn` does not hold, and repeated keys, are ignored. One shard mutex per key, so a
    /// commit costs O(locks held) when `keys` are the transaction's locks.
    pub fn release_all(&self, txn: TxnId, keys: &[LockKey]) {
        for key in keys {
            if key.range {
                // Out of the list first: a request that no longer finds the range goes straight
                // to the row, and one that found it waits on the lock released below.
                self.forget_range(txn, key);
            }
            let mut shard = sync::lock(self.shard(key));
            let Shard { entries, stats } = &mut *shard;
            let Entry::Occupied(mut occupied) = entries.entry(key.clone()) else {
                continue;
            };
            let entry = occupied.get_mut();
            if entry.holders.remove(txn) {
                stats.acquired += entry.grant_waiters();
            }
            if entry.is_unused() {
                occupied.remove();
            }
        }
    }

    /// Tries to give `txn` an X lock on all of table `table_id` (SQL Server's lock escalation),
    /// so that it can let go of its row locks there ([`TxnLocks::escalate_if_large`] does both)
    /// and take no more of them: every row it locks in the table afterwards is covered by the
    /// one lock and needs no memory of its own. Returns whether `txn` holds the table's lock
    /// now. Never waits: if another transaction holds or waits for any lock on the table (a
    /// row, a range, or the table), the escalation fails, as SQL Server's does, and `txn` goes
    /// on with row locks.
    ///
    /// Once it holds the table, every other request for a row of it, and every READ COMMITTED
    /// read of one, waits for `txn` to end, like a row lock's do; except a key another
    /// transaction has just made (an identity key: see [`LockManager::acquire_fresh`]), which
    /// was never a row `txn` could have read or changed. `txn` then has to wait for such a row
    /// like any other transaction's, and does.
    ///
    /// Costs one pass over every lock held in the manager, under one shard mutex at a time.
    pub fn try_escalate(&self, txn: TxnId, table_id: u32) -> bool {
        let table = LockKey::whole_table(table_id);
        {
            let mut shard = sync::lock(self.shard(&table));
            let Shard { entries, stats } = &mut *shard;
            match entries.entry(table.clone()) {
                Entry::Vacant(vacant) => {
                    vacant.insert(LockEntry::held_by(Holder {
                        txn,
                        mode: LockMode::Exclusive,
                    }));
                    stats.acquired += 1;
                }
                Entry::Occupied(occupied) => {
                    let held = occupied.get().holders.mode_of(txn) == Some(LockMode::Exclusive);
                    if !held {
                        self.failed_escalations.fetch_add(1, Ordering::Relaxed);
                    }
                    return held;
                }
            }
        }
        // Published before the shards are looked through (see `range_count`): a request that
        // comes after this waits for the table instead of taking a lock the pass below misses.
        {
            let mut ranges = sync::lock(&self.ranges);
            ranges.push(RangeLock {
                txn,
                entry: table.clone(),
                high: None,
            });
            self.range_count.store(ranges.len(), Ordering::Release);
        }
        let conflict = self.shards.iter().any(|shard| {
            sync::lock(shard).entries.iter().any(|(key, entry)| {
                key.table_id == table_id
                    && *key != table
                    && (entry.holders.iter().any(|holder| holder.txn != txn)
                        || entry.has_queued_lock_requests())
            })
        });
        if conflict {
            // Whoever waited for the table meanwhile goes on to its row.
            self.release_all(txn, &[table]);
            self.failed_escalations.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        self.escalations.fetch_add(1, Ordering::Relaxed);
        true
    }

    /// How many transactions are waiting for a lock right now and have already looked for a
    /// deadlock. Takes the waiting-transactions mutex: for tests and diagnostics, not for hot
    /// paths.
    pub fn waiting_txns(&self) -> usize {
        sync::lock(&self.waiting).waiting_for.len()
    }

    /// Totals over every shard.
    pub fn stats(&self) -> LockStats {
        let mut total = LockStats::default();
        for shard in self.shards.iter() {
            total.merge(&sync::lock(shard).stats);
        }
        total.escalations = self.escalations.load(Ordering::Relaxed);
        total.failed_escalations = self.failed_escalations.load(Ordering::Relaxed);
        total
    }

    fn timeout_error(timeout: Option<Duration>) -> LockError {
        LockError::Timeout {
            ms: timeout.map_or(u64::MAX, |timeout| {
                u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX)
            }),
        }
    }

    /// Queues a request that cannot be granted now, under the shard mutex, and counts the
    /// wait. A zero timeout fails at once instead, without queueing or recording a wait.
    fn enqueue(
        entry: &mut LockEntry,
        stats: &mut LockStats,
        txn: Option<TxnId>,
        request: Request,
        timeout: Option<Duration>,
    ) -> Result<Arc<WaitSlot>, LockError> {
        if timeout == Some(Duration::ZERO) {
            stats.timeouts += 1;
            return Err(Self::timeout_error(timeout));
        }
        let slot = Arc::new(WaitSlot::new());
        let waiter = Waiter {
            txn,
            request,
            slot: Arc::clone(&slot),
        };
        if request == Request::Upgrade {
            let position = entry
                .queue
                .iter()
                .take_while(|waiter| waiter.request == Request::Upgrade)
                .count();
            entry.queue.insert(position, waiter);
        } else {
            entry.queue.push_back(waiter);
        }
        stats.waits += 1;
        Ok(slot)
    }

    /// The slow path after [`LockManager::enqueue`]: record the wait, look for a deadlock
    /// through `txn`, and park until the request is granted or gives up.
    fn park(
        &self,
        shard_mutex: &Mutex<Shard>,
        txn: Option<TxnId>,
        key: &LockKey,
        wait_type: WaitType,
        patience: LockPatience,
        slot: Arc<WaitSlot>,
    ) -> Result<(), LockError> {
        let wait = stats::begin_wait(wait_type, None);
        let LockPatience { timeout, deadline } = patience;

        if let Some(txn) = txn {
            let mut waiting = sync::lock(&self.waiting);
            waiting.waiting_for.insert(txn, key.clone());
            if self.closes_cycle(txn, &waiting) {
                // The requester that finds the cycle is the victim, unless a release granted its
                // request meanwhile (then the cycle it saw was already broken).
                let mut shard = sync::lock(shard_mutex);
                if !slot.is_granted() {
                    Self::withdraw(&mut shard, key, &slot);
                    shard.stats.deadlocks += 1;
                    drop(shard);
                    waiting.waiting_for.remove(&txn);
                    drop(waiting);
                    wait.end(None);
                    return Err(LockError::Deadlock { victim: txn });
                }
            }
        }

        let mut shard = sync::lock(shard_mutex);
        let outcome = loop {
            if slot.is_granted() {
                break Ok(());
            }
            match deadline {
                None => shard = sync::wait(&slot.condvar, shard),
                Some(deadline) => {
                    let now = Instant::now();
                    if now >= deadline {
                        Self::withdraw(&mut shard, key, &slot);
                        shard.stats.timeouts += 1;
                        break Err(Self::timeout_error(timeout));
                    }
                    shard = sync::wait_timeout(&slot.condvar, shard, deadline - now);
                }
            }
        };
        drop(shard);
        if let Some(txn) = txn {
            sync::lock(&self.waiting).waiting_for.remove(&txn);
        }
        let signalled_ns = slot.signalled_ns.load(Ordering::Relaxed);
        wait.end(outcome.is_ok().then_some(signalled_ns));
        outcome
    }

    /// Takes the request parked on `slot` out of `key`'s queue, grants what its departure
    /// unblocks, and drops the entry if nobody holds or waits for the key any more.
    fn withdraw(shard: &mut Shard, key: &LockKey, slot: &Arc<WaitSlot>) {
        let Shard { entries, stats } = shard;
        if let Some(entry) = entries.get_mut(key) {
            stats.acquired += entry.withdraw(slot);
            if entry.is_unused() {
                entries.remove(key);
            }
        }
    }

    /// Whether `start`, which has just queued a request, now waits (through any chain of
    /// waiting transactions) for itself. Runs with the waiting-transactions mutex held, which
    /// fixes every vertex of the graph; the edges are read from one shard at a time.
    ///
    /// Every vertex of a cycle is a transaction that waits, so it holds its locks and keeps its
    /// place in its queue until the cycle is broken: a real cycle stays visible however the
    /// shards are read. A cycle forms when its last request queues, and that request looks for
    /// it after queueing, so no deadlock goes undetected; detections are serialised and the
    /// victim leaves its queue before the next one runs, so one cycle has one victim.
    fn closes_cycle(&self, start: TxnId, waiting: &WaitingTxns) -> bool {
        let mut visited = HashSet::from([start]);
        let mut to_visit = vec![start];
        let mut blockers = Vec::new();
        while let Some(txn) = to_visit.pop() {
            let Some(key) = waiting.waiting_for.get(&txn) else {
                continue;
            };
            blockers.clear();
            {
                let shard = sync::lock(self.shard(key));
                if let Some(entry) = shard.entries.get(key) {
                    entry.blockers_of(txn, &mut blockers);
                }
            }
            for &blocker in &blockers {
                if blocker == start {
                    return true;
                }
                if visited.insert(blocker) {
                    to_visit.push(blocker);
                }
            }
        }
        false
    }
}

/// A transaction's locks: acquires through a [`LockManager`] and remembers each key it newly
/// locked, so that commit or rollback releases exactly those, in O(locks held).
#[derive(Debug)]
pub struct TxnLocks {
    txn: TxnId,
    keys: Vec<LockKey>,
    /// How many keys the transaction must hold before [`TxnLocks::escalate_if_large`] looks
    /// again (besides the threshold it is given): twice as many as when it last looked, so
    /// that the looking costs a constant per lock taken.
    next_escalation_check: usize,
    /// The tables the transaction holds whole: those it escalated to.
    escalated: Vec<u32>,
}

impl TxnLocks {
    /// No locks yet for `txn`.
    pub fn new(txn: TxnId) -> TxnLocks {
        TxnLocks {
            txn,
            keys: Vec::new(),
            next_escalation_check: 0,
            escalated: Vec::new(),
        }
    }

    /// The transaction.
    pub fn txn(&self) -> TxnId {
        self.txn
    }

    /// Takes over the keys another handle of the same transaction locked.
    pub fn absorb(&mut self, other: TxnLocks) {
        debug_assert_eq!(self.txn, other.txn);
        self.keys.extend(other.keys);
        for table_id in other.escalated {
            if !self.escalated.contains(&table_id) {
                self.escalated.push(table_id);
            }
        }
    }

    /// Whether the transaction holds all of table `table_id` (it escalated to the table's lock,
    /// and holds it until it releases everything).
    pub fn has_escalated(&self, table_id: u32) -> bool {
        self.escalated.contains(&table_id)
    }

    /// The keys the transaction holds locks on, in the order it first locked them.
    pub fn keys(&self) -> &[LockKey] {
        &self.keys
    }

    /// [`LockManager::lock_range`] for this transaction; the range is remembered.
    pub fn acquire_range(
        &mut self,
        manager: &LockManager,
        low: &LockKey,
        high: &LockKey,
        timeout: Option<Duration>,
    ) -> Result<(), LockError> {
        let (entry, granted) = manager.lock_range_granted(self.txn, low, high, timeout)?;
        if granted == Granted::New {
            self.keys.push(entry);
        }
        Ok(())
    }

    /// [`LockManager::acquire`] for this transaction; a newly locked key is remembered (moved
    /// in, so the caller's allocation is reused).
    pub fn acquire(
        &mut self,
        manager: &LockManager,
        key: LockKey,
        mode: LockMode,
        timeout: Option<Duration>,
    ) -> Result<(), LockError> {
        self.lock(manager, key, mode, timeout, false)
    }

    /// [`LockManager::acquire_fresh`] for this transaction; a newly locked key is remembered.
    pub fn acquire_fresh(&mut self, manager: &LockManager, key: LockKey) -> Result<(), LockError> {
        self.lock(manager, key, LockMode::Exclusive, None, true)
    }

    fn lock(
        &mut self,
        manager: &LockManager,
        key: LockKey,
        mode: LockMode,
        timeout: Option<Duration>,
        fresh: bool,
    ) -> Result<(), LockError> {
        if manager.lock(self.txn, &key, mode, timeout, fresh)? == Granted::New {
            self.keys.push(key);
        }
        Ok(())
    }

    /// Trades the transaction's row locks on each table it holds at least `threshold` of
    /// (ranges not counted) for one lock on the whole table ([`LockManager::try_escalate`]),
    /// and returns how many tables it escalated. To be called between statements, never
    /// between [`TxnLocks::keys`]`().len()` and a [`TxnLocks::release_taken_since`] that
    /// depends on it: the row locks it lets go leave the list.
    ///
    /// Looks only once the transaction holds `threshold` locks in all, and then again only
    /// once it holds twice as many as when it last looked: an escalation that fails (another
    /// transaction holds a lock on the table) is tried again later, and the passes over the
    /// lock manager it costs add up to a constant per lock.
    pub fn escalate_if_large(&mut self, manager: &LockManager, threshold: usize) -> usize {
        let threshold = threshold.max(1);
        if self.keys.len() < threshold.max(self.next_escalation_check) {
            return 0;
        }
        let mut row_locks: Vec<(u32, usize)> = Vec::new();
        for key in self.keys.iter().filter(|key| !key.range) {
            match row_locks
                .iter_mut()
                .find(|(table, _)| *table == key.table_id)
            {
                Some((_, count)) => *count += 1,
                None => row_locks.push((key.table_id, 1)),
            }
        }
        let mut escalated = 0;
        for (table_id, count) in row_locks {
            if count < threshold || !manager.try_escalate(self.txn, table_id) {
                continue;
            }
            let table = LockKey::whole_table(table_id);
            let (released, mut kept): (Vec<LockKey>, Vec<LockKey>) = std::mem::take(&mut self.keys)
                .into_iter()
                .partition(|key| key.table_id == table_id && *key != table);
            // Nobody else holds or waits for these (the escalation made sure), so letting
            // them go grants nothing; a READ COMMITTED reader waiting for one of them wakes
            // and waits for the table instead.
            manager.release_all(self.txn, &released);
            if !kept.contains(&table) {
                kept.push(table);
            }
            self.keys = kept;
            if !self.escalated.contains(&table_id) {
                self.escalated.push(table_id);
            }
            escalated += 1;
        }
        self.next_escalation_check = self.keys.len().saturating_mul(2);
        escalated
    }

    /// Whether the transaction holds any lock.
    pub fn holds_any(&self) -> bool {
        !self.keys.is_empty()
    }

    /// Releases the locks the transaction took after it held its first `held` (`keys()[held..]`,
    /// taken since `keys().len()` was `held`), except those `keep` says to keep; the rest keep
    /// their order. For a write that locked a row version which changed under its request and
    /// then moved on to the row's next version: nothing was read or changed under the locks of
    /// the version it left, and the transaction did not hold them before, so strict two-phase
    /// locking does not ask for them to be held (see `docs/locking.md`). Kept to commit, they
    /// made other sessions wait for keys the transaction no longer needed. Never for a range,
    /// nor a lock the transaction held before `held` (a conversion leaves a key where it was):
    /// the transaction may have changed rows under those.
    pub fn release_taken_since(
        &mut self,
        manager: &LockManager,
        held: usize,
        keep: impl Fn(&LockKey) -> bool,
    ) {
        let taken = self.keys.split_off(held.min(self.keys.len()));
        let (kept, released): (Vec<LockKey>, Vec<LockKey>) =
            taken.into_iter().partition(|key| keep(key));
        debug_assert!(released.iter().all(|key| !key.is_range()));
        manager.release_all(self.txn, &released);
        self.keys.extend(kept);
    }

    /// Releases every lock the transaction holds (at commit or rollback). The handle is empty
    /// afterwards.
    pub fn release_all(&mut self, manager: &LockManager) {
        manager.release_all(self.txn, &self.keys);
        self.keys.clear();
        self.escalated.clear();
    }
}
