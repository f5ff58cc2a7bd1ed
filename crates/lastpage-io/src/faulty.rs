//! An in-memory file system that knows what a power loss would keep, and injects faults.
//!
//! Every file keeps two images and a list:
//! - the *volatile* bytes: what reads see, every write and size change applied (the page cache);
//! - the *durable* bytes: what the disk is known to hold, as of the last successful
//!   [`File::sync_data`] of that file;
//! - the *pending* operations: every write and size change since then, in order, each with a copy
//!   of its bytes.
//!
//! Names work the same way: the volatile namespace is what `open`, `list_dir` and `exists` see,
//! and the durable namespace is what [`FileSystem::sync_dir`] last made durable, per directory.
//!
//! [`FaultyFileSystem::crash`] builds the state a power loss could leave behind: each name whose
//! volatile and durable entries differ takes one of the two; each file starts from its durable
//! bytes and replays its pending operations in order, each one *lost*, *applied* or (writes only)
//! *torn* — a prefix of it applied, cut at a sector boundary or at any byte ([`Tear`]). The
//! choices come from a seeded generator, so a single-threaded sequence of operations crashes the
//! same way every time for the same seed; with several threads the operations themselves
//! interleave differently from run to run, so tests print the seed and the checks must hold for
//! every outcome. The crashed instance keeps refusing every operation (the process that used it
//! is gone), and the returned instance is the disk as the next process finds it.
//!
//! Replaying pending writes in order with independent choices also covers reordering: a later
//! write may survive while an earlier one is lost, as a disk's write cache allows.
//!
//! Faults are injected by [`FaultRule`]s: the Nth `sync_data` fails (and, as Linux has done
//! since "fsyncgate", each unsynced write of that file is then either written or silently
//! dropped, and a later `sync_data` succeeds without bringing the dropped ones back), writes past
//! a byte budget fail with `ENOSPC` (`ErrorKind::StorageFull`) after writing what fits (a space
//! reservation, `allocate`, fails whole), and the Nth call (or every call from the Nth on) of any
//! other [`Operation`] fails with an I/O error (`EIO`): a read, a write, a size query, a length
//! change, a reservation, a lock, an open, a removal, a rename, a lookup, a link count, a
//! directory's creation, listing or sync: every call of the two traits. Such a failure
//! changes nothing, with one exception: a write that fails with `EIO` may have written a prefix
//! of its bytes (none, or a torn part, as the seeded generator chooses; never all of them), as a
//! `pwrite` loop that fails halfway does. A failed directory sync makes none of the directory's
//! changes durable. A rule can apply to every file, to one path, or to every path under a
//! directory (such as the log's).
//!
//! Directories are simplified: they are only created (`create_dir_all`), never removed or
//! renamed. A new directory's entry is durable, as a file's name is, only once its parent
//! directory was synced ([`FileSystem::sync_dir`]); a crash before that keeps it or loses it,
//! and with it everything under it. `/` stands for the file system's mount point and is durable
//! at once; so does `.`, the directory relative paths start from, whose sync makes their first
//! components durable.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use crate::{File, FileSystem, OpenOptions};

/// Where a torn write may be cut.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tear {
    /// Only at multiples of this many bytes of the file offset (a disk sector: 512 or 4096).
    /// A write that crosses no such boundary is either lost or applied, never torn.
    Sectors(u32),
    /// At any byte.
    Bytes,
}

/// How a [`FaultyFileSystem`] behaves.
#[derive(Clone, Copy, Debug)]
pub struct FaultyConfig {
    /// Seed of every random choice (crash outcomes, what a failed sync drops).
    pub seed: u64,
    /// Where torn writes are cut.
    pub tear: Tear,
    /// How long every `sync_data` takes, to give concurrent committers time to pile up as they
    /// would behind a real `fdatasync`. The file system's lock is not held meanwhile.
    pub sync_delay: Duration,
}

impl FaultyConfig {
    /// Sector-granular tears (512 bytes) and instant syncs.
    pub fn new(seed: u64) -> FaultyConfig {
        FaultyConfig {
            seed,
            tear: Tear::Sectors(512),
            sync_delay: Duration::ZERO,
        }
    }

    /// The same configuration with torn writes cut as `tear` says.
    pub fn tear(self, tear: Tear) -> FaultyConfig {
        FaultyConfig { tear, ..self }
    }

    /// The same configuration with every `sync_data` taking `delay`.
    pub fn sync_delay(self, delay: Duration) -> FaultyConfig {
        FaultyConfig {
            sync_delay: delay,
            ..self
        }
    }
}

/// What a crash does with the operations that were not durable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CrashMode {
    /// Each one is lost, applied or torn, as the seeded generator chooses.
    Random,
    /// All are lost: only durable state survives.
    LoseUnsynced,
    /// All are applied, as if the disk had written everything just before the power went.
    KeepUnsynced,
}

/// A fault to inject, optionally only for one file or the files under one directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FaultRule {
    kind: FaultKind,
    scope: Scope,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum FaultKind {
    /// The `nth` matching call fails, and with `sticky` every later one too.
    Fails {
        operation: Operation,
        nth: u64,
        sticky: bool,
    },
    DiskFull {
        budget: u64,
    },
}

/// Which paths a [`FaultRule`] applies to.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Scope {
    Everywhere,
    /// Exactly this path.
    Path(PathBuf),
    /// This path and every path under it.
    Under(PathBuf),
}

/// The sorts of call a [`FaultRule`] can make fail with an I/O error (`EIO`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Operation {
    /// [`File::read_at`]: fails without reading.
    Read,
    /// [`File::write_all_at`]: fails after writing a prefix of its bytes, possibly empty, never
    /// all of them (see the module documentation).
    Write,
    /// [`File::sync_data`]: fails as [`FaultRule::sync_fails`] describes.
    Sync,
    /// [`File::len`]: fails without saying the size.
    Len,
    /// [`File::set_len`]: fails without changing the size.
    SetLen,
    /// [`File::allocate`]: fails without reserving anything.
    Allocate,
    /// [`File::try_lock`]: fails without taking the lock.
    Lock,
    /// [`FileSystem::open`], whatever its options: fails without creating or truncating.
    Open,
    /// [`FileSystem::remove`]: fails with the name still there.
    Remove,
    /// [`FileSystem::rename`]: fails with both names as they were. A rule's path matches
    /// either name.
    Rename,
    /// [`FileSystem::exists`]: fails without saying whether the path exists.
    Exists,
    /// [`FileSystem::link_count`]: fails without counting.
    LinkCount,
    /// [`FileSystem::create_dir_all`]: fails without creating any directory.
    CreateDir,
    /// [`FileSystem::list_dir`]: fails without listing.
    ListDir,
    /// [`FileSystem::sync_dir`]: fails without making any of the directory's changes durable.
    SyncDir,
}

impl Operation {
    /// How an error message names the call, before the file or directory it was on.
    fn name(self) -> &'static str {
        match self {
            Operation::Read => "read of",
            Operation::Write => "write of",
            Operation::Sync => "fdatasync of",
            Operation::Len => "size query of",
            Operation::SetLen => "length change of",
            Operation::Allocate => "space reservation of",
            Operation::Lock => "lock of",
            Operation::Open => "open of",
            Operation::Remove => "removal of",
            Operation::Rename => "rename of",
            Operation::Exists => "lookup of",
            Operation::LinkCount => "link count of",
            Operation::CreateDir => "creation of directory",
            Operation::ListDir => "listing of directory",
            Operation::SyncDir => "fsync of directory",
        }
    }
}

/// The error of a call an injected fault fails: `what` names the call and its file.
fn injected(operation: Operation, what: std::fmt::Arguments<'_>) -> io::Error {
    io::Error::other(format!(
        "injected fault: {} {what} failed (EIO)",
        operation.name()
    ))
}

impl FaultRule {
    /// The `nth` `sync_data` call from now (1 is the next one) fails; later ones succeed again,
    /// as they do on Linux, whether or not the writes the failed one dropped were written.
    pub fn sync_fails(nth: u64) -> FaultRule {
        FaultRule::fails(Operation::Sync, nth)
    }

    /// The `nth` `sync_data` call from now and every later one fail (a disk that is gone).
    pub fn syncs_fail_from(nth: u64) -> FaultRule {
        FaultRule::fails_from(Operation::Sync, nth)
    }

    /// The `nth` [`FileSystem::sync_dir`] call from now fails, making none of the directory's
    /// changes durable (a crash after it keeps each of them or not, as it would have before).
    pub fn dir_sync_fails(nth: u64) -> FaultRule {
        FaultRule::fails(Operation::SyncDir, nth)
    }

    /// The `nth` call of `operation` from now (1 is the next one) fails with an I/O error
    /// (`EIO`); later ones succeed again. See [`Operation`] for what each failed call did.
    pub fn fails(operation: Operation, nth: u64) -> FaultRule {
        FaultRule {
            kind: FaultKind::Fails {
                operation,
                nth: nth.max(1),
                sticky: false,
            },
            scope: Scope::Everywhere,
        }
    }

    /// The `nth` call of `operation` from now and every later one fail with an I/O error
    /// (`EIO`): a disk, or a part of the file system, that went bad.
    pub fn fails_from(operation: Operation, nth: u64) -> FaultRule {
        FaultRule {
            kind: FaultKind::Fails {
                operation,
                nth: nth.max(1),
                sticky: true,
            },
            scope: Scope::Everywhere,
        }
    }

    /// Writes fail with `ENOSPC` (`ErrorKind::StorageFull`) once `budget` more bytes have been
    /// written from now; the write that crosses the budget writes what fits, then fails.
    pub fn disk_full_after(budget: u64) -> FaultRule {
        FaultRule {
            kind: FaultKind::DiskFull { budget },
            scope: Scope::Everywhere,
        }
    }

    /// The `nth` `read_at` call from now fails with an I/O error.
    pub fn read_fails(nth: u64) -> FaultRule {
        FaultRule::fails(Operation::Read, nth)
    }

    /// The `nth` `read_at` call from now and every later one fail.
    pub fn reads_fail_from(nth: u64) -> FaultRule {
        FaultRule::fails_from(Operation::Read, nth)
    }

    /// The same rule, applied only to the file opened under `path`, or to the name or
    /// directory `path` for a call on names or directories (calls on other paths are neither
    /// counted nor failed).
    pub fn on_path(self, path: impl Into<PathBuf>) -> FaultRule {
        FaultRule {
            scope: Scope::Path(path.into()),
            ..self
        }
    }

    /// The same rule, applied only to `dir` and the paths under it (such as the log's
    /// directory and its segments), by the same measure as [`FaultRule::on_path`].
    pub fn under(self, dir: impl Into<PathBuf>) -> FaultRule {
        FaultRule {
            scope: Scope::Under(dir.into()),
            ..self
        }
    }
}

/// Counters of a [`FaultyFileSystem`] since it was created (or came out of a crash).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FaultyStats {
    /// `sync_data` calls that succeeded.
    pub syncs: u64,
    /// `sync_data` calls that failed (injected).
    pub failed_syncs: u64,
    /// `write_all_at` calls (including failed ones).
    pub writes: u64,
    /// Bytes written into files (a write cut short by `ENOSPC` counts what it wrote).
    pub bytes_written: u64,
    /// `read_at` calls.
    pub reads: u64,
    /// `sync_dir` calls.
    pub dir_syncs: u64,
    /// Calls of any [`Operation`] that a rule made fail (a failed `sync_data` counts here as
    /// well as in `failed_syncs`; a full disk counts in neither).
    pub injected_failures: u64,
}

/// The in-memory, crash-simulating, fault-injecting file system. Clones share the same state.
#[derive(Clone)]
pub struct FaultyFileSystem {
    inner: Arc<Inner>,
}

/// Shows the configuration (with the seed) and the counters, not the files' bytes.
impl std::fmt::Debug for FaultyFileSystem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = self.state();
        f.debug_struct("FaultyFileSystem")
            .field("config", &self.inner.config)
            .field("crashed", &state.crashed)
            .field("files", &state.names.len())
            .field("stats", &state.stats)
            .finish()
    }
}

struct Inner {
    config: FaultyConfig,
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    rng: SplitMix64,
    /// Set by `crash`: every later operation fails.
    crashed: bool,
    dirs: BTreeSet<PathBuf>,
    /// The directories whose entry is durable (see the module documentation); a subset of
    /// `dirs`.
    durable_dirs: BTreeSet<PathBuf>,
    names: BTreeMap<PathBuf, u64>,
    durable_names: BTreeMap<PathBuf, u64>,
    inodes: HashMap<u64, Inode>,
    next_inode: u64,
    rules: Vec<ActiveRule>,
    stats: FaultyStats,
    /// Inodes an open handle holds the advisory lock of (`File::try_lock`). A crash ends the
    /// process that held them: the file system it leaves has none.
    locked: HashSet<u64>,
}

#[derive(Debug, Default, Clone)]
struct Inode {
    volatile: Vec<u8>,
    durable: Vec<u8>,
    pending: Vec<Pending>,
}

#[derive(Debug, Clone)]
enum Pending {
    Write { offset: u64, data: Vec<u8> },
    SetLen(u64),
}

#[derive(Debug)]
struct ActiveRule {
    rule: FaultRule,
    /// Matching calls seen so far, or bytes written so far (disk full).
    seen: u64,
}

impl ActiveRule {
    /// Whether the rule applies to a call on `paths` (both names, for a rename).
    fn applies_to(&self, paths: &[&Path]) -> bool {
        paths.iter().any(|path| match &self.rule.scope {
            Scope::Everywhere => true,
            Scope::Path(only) => only == path,
            Scope::Under(dir) => path.starts_with(dir),
        })
    }
}

/// A small, fast, well-mixed generator (SplitMix64). Its own implementation rather than a
/// dependency so that a seed gives the same choices in every version of lastpage.
#[derive(Debug, Clone)]
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (`n > 0`).
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn crashed_error() -> io::Error {
    io::Error::other("simulated power loss: this file system instance is gone")
}

fn not_found(path: &Path) -> io::Error {
    io::Error::new(
        io::ErrorKind::NotFound,
        format!("no such file: {}", path.display()),
    )
}

/// Applies a write to an image, extending it with zeros as needed.
fn apply_write(image: &mut Vec<u8>, offset: u64, data: &[u8]) {
    let start = usize::try_from(offset).expect("offset fits in memory");
    let end = start + data.len();
    if image.len() < end {
        image.resize(end, 0);
    }
    image[start..end].copy_from_slice(data);
}

fn apply(image: &mut Vec<u8>, op: &Pending) {
    match op {
        Pending::Write { offset, data } => apply_write(image, *offset, data),
        Pending::SetLen(len) => {
            image.resize(usize::try_from(*len).expect("length fits in memory"), 0);
        }
    }
}

impl State {
    fn check_alive(&self) -> io::Result<()> {
        if self.crashed {
            Err(crashed_error())
        } else {
            Ok(())
        }
    }

    fn parent_exists(&self, path: &Path) -> bool {
        match path.parent() {
            None => true,
            Some(parent) if parent.as_os_str().is_empty() => true,
            Some(parent) => self.dirs.contains(parent),
        }
    }

    /// Counts a call on `paths` against every matching rule of its sort and says whether one
    /// fires.
    fn call_fails(&mut self, paths: &[&Path], call: Operation) -> bool {
        let mut fails = false;
        for active in &mut self.rules {
            let FaultKind::Fails {
                operation,
                nth,
                sticky,
            } = active.rule.kind
            else {
                continue;
            };
            if operation != call || !active.applies_to(paths) {
                continue;
            }
            active.seen += 1;
            if active.seen == nth || (sticky && active.seen > nth) {
                fails = true;
            }
        }
        if fails {
            self.stats.injected_failures += 1;
        }
        fails
    }

    /// [`State::call_fails`] as an error, for a call that fails whole.
    fn check_call(
        &mut self,
        paths: &[&Path],
        call: Operation,
        what: std::fmt::Arguments<'_>,
    ) -> io::Result<()> {
        if self.call_fails(paths, call) {
            Err(injected(call, what))
        } else {
            Ok(())
        }
    }

    /// How many bytes of a write of `len` bytes at `offset` that fails with `EIO` reach the
    /// file: none, or a torn prefix cut as `tear` allows (none if the write cannot be torn).
    fn failed_write_prefix(&mut self, offset: u64, len: usize, tear: Tear) -> usize {
        if self.rng.below(2) == 0 {
            return 0;
        }
        self.tear_point(offset, len, tear).unwrap_or(0)
    }

    /// How many of `len` bytes fit in every matching disk-full budget, charging them.
    fn charge_write(&mut self, path: &Path, len: u64) -> u64 {
        let allowed = len.min(self.disk_room(path));
        for active in &mut self.rules {
            if matches!(active.rule.kind, FaultKind::DiskFull { .. }) && active.applies_to(&[path])
            {
                active.seen += allowed;
            }
        }
        allowed
    }

    /// Bytes the disk-full rules that apply to `path` still let through (`u64::MAX` if none).
    fn disk_room(&self, path: &Path) -> u64 {
        let mut room = u64::MAX;
        for active in &self.rules {
            if let FaultKind::DiskFull { budget } = active.rule.kind
                && active.applies_to(&[path])
            {
                room = room.min(budget.saturating_sub(active.seen));
            }
        }
        room
    }

    /// One crash outcome of a pending operation, applied to `image`.
    fn replay(&mut self, image: &mut Vec<u8>, op: &Pending, mode: CrashMode, tear: Tear) {
        match mode {
            CrashMode::LoseUnsynced => {}
            CrashMode::KeepUnsynced => apply(image, op),
            CrashMode::Random => match op {
                Pending::SetLen(_) => {
                    if self.rng.below(2) == 1 {
                        apply(image, op);
                    }
                }
                Pending::Write { offset, data } => match self.rng.below(3) {
                    0 => {}
                    1 => apply(image, op),
                    _ => {
                        if let Some(cut) = self.tear_point(*offset, data.len(), tear) {
                            apply_write(image, *offset, &data[..cut]);
                        } else if self.rng.below(2) == 1 {
                            apply(image, op);
                        }
                    }
                },
            },
        }
    }

    /// Where to cut a torn write of `len` bytes at `offset`: a prefix length in `1..len`, or
    /// `None` if the write cannot be torn (it crosses no sector boundary, or is one byte).
    fn tear_point(&mut self, offset: u64, len: usize, tear: Tear) -> Option<usize> {
        let len = len as u64;
        match tear {
            Tear::Bytes => (len > 1).then(|| 1 + self.rng.below(len - 1) as usize),
            Tear::Sectors(sector) => {
                let sector = u64::from(sector.max(1));
                // Sector boundaries strictly inside (offset, offset + len).
                let first = (offset / sector + 1) * sector;
                if first >= offset + len {
                    return None;
                }
                let count = (offset + len - 1 - first) / sector + 1;
                let boundary = first + self.rng.below(count) * sector;
                Some((boundary - offset) as usize)
            }
        }
    }
}

impl FaultyFileSystem {
    /// An empty file system.
    pub fn new(config: FaultyConfig) -> FaultyFileSystem {
        FaultyFileSystem::from_state(
            config,
            State {
                rng: SplitMix64(config.seed),
                crashed: false,
                dirs: BTreeSet::new(),
                durable_dirs: BTreeSet::new(),
                names: BTreeMap::new(),
                durable_names: BTreeMap::new(),
                inodes: HashMap::new(),
                next_inode: 1,
                rules: Vec::new(),
                stats: FaultyStats::default(),
                locked: HashSet::new(),
            },
        )
    }

    fn from_state(config: FaultyConfig, state: State) -> FaultyFileSystem {
        FaultyFileSystem {
            inner: Arc::new(Inner {
                config,
                state: Mutex::new(state),
            }),
        }
    }

    /// The configuration, including the seed, to print in a test.
    pub fn config(&self) -> FaultyConfig {
        self.inner.config
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.inner
            .state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Adds a fault rule. Rules count calls from the moment they are added.
    pub fn inject(&self, rule: FaultRule) {
        self.state().rules.push(ActiveRule { rule, seen: 0 });
    }

    /// Removes every fault rule.
    pub fn clear_faults(&self) {
        self.state().rules.clear();
    }

    /// The counters so far.
    pub fn stats(&self) -> FaultyStats {
        self.state().stats
    }

    /// Whether [`FaultyFileSystem::crash`] was called on this instance.
    pub fn is_crashed(&self) -> bool {
        self.state().crashed
    }

    /// What a read of the whole file would return now (the volatile bytes), if it exists.
    pub fn contents(&self, path: &Path) -> Option<Vec<u8>> {
        let state = self.state();
        let inode = state.names.get(path)?;
        Some(state.inodes[inode].volatile.clone())
    }

    /// The bytes of the file known to be durable, if its name is durable.
    pub fn durable_contents(&self, path: &Path) -> Option<Vec<u8>> {
        let state = self.state();
        let inode = state.durable_names.get(path)?;
        Some(state.inodes[inode].durable.clone())
    }

    /// Simulates a power loss with seeded choices ([`CrashMode::Random`]).
    pub fn crash(&self) -> FaultyFileSystem {
        self.crash_with(CrashMode::Random)
    }

    /// Simulates a power loss: this instance (and every file opened from it) refuses all further
    /// operations, and the returned file system holds what the disk would hold afterwards, as
    /// `mode` decides for the operations that were not durable. The returned instance has the
    /// same configuration except for a seed drawn from this one's generator, no fault rules and
    /// zeroed counters.
    pub fn crash_with(&self, mode: CrashMode) -> FaultyFileSystem {
        let mut state = self.state();
        state.crashed = true;
        let tear = self.inner.config.tear;

        // Directories first: one whose entry is not durable is kept or lost, and a lost one
        // takes everything under it along. A parent sorts before its children, so each
        // directory's parent is decided before it. (No choice is drawn when every directory is
        // durable, so that seeds keep their outcomes.)
        let mut dirs = BTreeSet::new();
        for dir in state.dirs.clone() {
            let parent_kept = match dir.parent() {
                Some(parent) if !parent.as_os_str().is_empty() => dirs.contains(parent),
                _ => true,
            };
            let kept = parent_kept
                && (state.durable_dirs.contains(&dir)
                    || match mode {
                        CrashMode::LoseUnsynced => false,
                        CrashMode::KeepUnsynced => true,
                        CrashMode::Random => state.rng.below(2) == 1,
                    });
            if kept {
                dirs.insert(dir);
            }
        }
        let in_kept_dir = |name: &PathBuf| {
            name.parent()
                .is_none_or(|parent| parent.as_os_str().is_empty() || dirs.contains(parent))
        };

        // The namespace: where the volatile and durable entries of a name differ, the crash
        // keeps one of them.
        let all_names: BTreeSet<PathBuf> = state
            .names
            .keys()
            .chain(state.durable_names.keys())
            .filter(|name| in_kept_dir(name))
            .cloned()
            .collect();
        let mut names = BTreeMap::new();
        for name in all_names {
            let volatile = state.names.get(&name).copied();
            let durable = state.durable_names.get(&name).copied();
            let chosen = if volatile == durable {
                volatile
            } else {
                match mode {
                    CrashMode::LoseUnsynced => durable,
                    CrashMode::KeepUnsynced => volatile,
                    CrashMode::Random => {
                        if state.rng.below(2) == 0 {
                            durable
                        } else {
                            volatile
                        }
                    }
                }
            };
            if let Some(inode) = chosen {
                names.insert(name, inode);
            }
        }

        // The contents of every surviving file: durable bytes plus each pending operation, lost,
        // applied or torn. Inodes keep their numbers, so two names of one inode stay one file.
        let mut inodes = HashMap::new();
        let surviving: BTreeSet<u64> = names.values().copied().collect();
        for id in surviving {
            let inode = state.inodes[&id].clone();
            let mut image = inode.durable;
            for op in &inode.pending {
                state.replay(&mut image, op, mode, tear);
            }
            inodes.insert(
                id,
                Inode {
                    volatile: image.clone(),
                    durable: image,
                    pending: Vec::new(),
                },
            );
        }

        let config = FaultyConfig {
            seed: state.rng.next(),
            ..self.inner.config
        };
        FaultyFileSystem::from_state(
            config,
            State {
                rng: SplitMix64(config.seed),
                crashed: false,
                durable_dirs: dirs.clone(),
                dirs,
                durable_names: names.clone(),
                names,
                inodes,
                next_inode: state.next_inode,
                rules: Vec::new(),
                stats: FaultyStats::default(),
                locked: HashSet::new(),
            },
        )
    }
}

/// An open file of a [`FaultyFileSystem`].
#[derive(Debug)]
struct FaultyFile {
    fs: FaultyFileSystem,
    inode: u64,
    /// The name the file was opened under, which fault rules match.
    path: PathBuf,
    /// Whether this handle holds the inode's lock, which its drop releases.
    holds_lock: std::sync::atomic::AtomicBool,
}

impl Drop for FaultyFile {
    fn drop(&mut self) {
        if *self.holds_lock.get_mut() {
            self.fs.state().locked.remove(&self.inode);
        }
    }
}

impl File for FaultyFile {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
        let mut state = self.fs.state();
        state.check_alive()?;
        state.stats.reads += 1;
        state.check_call(
            &[self.path.as_path()],
            Operation::Read,
            format_args!("{}", self.path.display()),
        )?;
        let image = &state.inodes[&self.inode].volatile;
        let start = usize::try_from(offset)
            .unwrap_or(usize::MAX)
            .min(image.len());
        let read = buf.len().min(image.len() - start);
        buf[..read].copy_from_slice(&image[start..start + read]);
        Ok(read)
    }

    fn write_all_at(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        let mut state = self.fs.state();
        state.check_alive()?;
        state.stats.writes += 1;
        // A write that fails with EIO writes a prefix, or nothing, and reports the failure; one
        // that finds the disk full writes what fits. Either way what was written is pending like
        // any write: reads see it, and a crash keeps, loses or tears it.
        let eio = state.call_fails(&[self.path.as_path()], Operation::Write);
        let wanted = if eio {
            state.failed_write_prefix(offset, data.len(), self.fs.inner.config.tear)
        } else {
            data.len()
        };
        let allowed = state.charge_write(&self.path, wanted as u64) as usize;
        if allowed > 0 {
            let data = &data[..allowed];
            let inode = state
                .inodes
                .get_mut(&self.inode)
                .expect("open inode exists");
            apply_write(&mut inode.volatile, offset, data);
            inode.pending.push(Pending::Write {
                offset,
                data: data.to_vec(),
            });
            state.stats.bytes_written += allowed as u64;
        }
        if eio {
            return Err(injected(
                Operation::Write,
                format_args!(
                    "{} bytes at offset {offset} of {} ({allowed} written)",
                    data.len(),
                    self.path.display()
                ),
            ));
        }
        if allowed < data.len() {
            return Err(io::Error::new(
                io::ErrorKind::StorageFull,
                format!(
                    "injected fault: no space left on device writing {} bytes at offset {offset} of {} \
                     ({allowed} written)",
                    data.len(),
                    self.path.display()
                ),
            ));
        }
        Ok(())
    }

    fn sync_data(&self) -> io::Result<()> {
        // The delay comes first and outside the lock: a sync takes effect when it returns, and
        // other threads keep writing (and piling up behind it) meanwhile.
        let delay = self.fs.inner.config.sync_delay;
        if !delay.is_zero() {
            std::thread::sleep(delay);
        }
        let mut state = self.fs.state();
        state.check_alive()?;
        let fails = state.call_fails(&[self.path.as_path()], Operation::Sync);
        let state = &mut *state;
        let inode = state
            .inodes
            .get_mut(&self.inode)
            .expect("open inode exists");
        let pending = std::mem::take(&mut inode.pending);
        if fails {
            // fsyncgate: the kernel may have written some of the dirty pages before the error,
            // and marks the rest clean, so they are never written; reads still see them.
            for op in &pending {
                if state.rng.below(2) == 1 {
                    apply(&mut inode.durable, op);
                }
            }
            state.stats.failed_syncs += 1;
            return Err(injected(
                Operation::Sync,
                format_args!("{}", self.path.display()),
            ));
        }
        for op in &pending {
            apply(&mut inode.durable, op);
        }
        state.stats.syncs += 1;
        Ok(())
    }

    fn len(&self) -> io::Result<u64> {
        let mut state = self.fs.state();
        state.check_alive()?;
        state.check_call(
            &[self.path.as_path()],
            Operation::Len,
            format_args!("{}", self.path.display()),
        )?;
        Ok(state.inodes[&self.inode].volatile.len() as u64)
    }

    /// Like `flock`: one handle at a time holds a file's lock, until it is dropped (asking
    /// again through the holding handle succeeds). Fails once the file system has crashed.
    fn try_lock(&self) -> io::Result<bool> {
        let mut state = self.fs.state();
        state.check_alive()?;
        state.check_call(
            &[self.path.as_path()],
            Operation::Lock,
            format_args!("{}", self.path.display()),
        )?;
        if self.holds_lock.load(std::sync::atomic::Ordering::Relaxed) {
            return Ok(true);
        }
        if !state.locked.insert(self.inode) {
            return Ok(false);
        }
        self.holds_lock
            .store(true, std::sync::atomic::Ordering::Relaxed);
        Ok(true)
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        let mut state = self.fs.state();
        state.check_alive()?;
        state.check_call(
            &[self.path.as_path()],
            Operation::SetLen,
            format_args!("{} to {len} bytes", self.path.display()),
        )?;
        self.change_size(&mut state, len);
        Ok(())
    }

    /// A reservation is a size change that counts against a disk-full budget: all of it, or,
    /// if the budget cannot take the growth, nothing (`ENOSPC`). Until synced, a crash may lose
    /// it like any size change.
    fn allocate(&self, len: u64) -> io::Result<()> {
        let mut state = self.fs.state();
        state.check_alive()?;
        state.check_call(
            &[self.path.as_path()],
            Operation::Allocate,
            format_args!("{len} bytes of {}", self.path.display()),
        )?;
        let current = state.inodes[&self.inode].volatile.len() as u64;
        let growth = len.saturating_sub(current);
        if growth == 0 {
            return Ok(());
        }
        if state.disk_room(&self.path) < growth {
            return Err(io::Error::new(
                io::ErrorKind::StorageFull,
                format!(
                    "injected fault: no space left on device reserving {len} bytes of {}",
                    self.path.display()
                ),
            ));
        }
        state.charge_write(&self.path, growth);
        self.change_size(&mut state, len);
        Ok(())
    }
}

impl FaultyFile {
    /// Cuts or extends the file to `len` bytes now, durably at the next sync.
    fn change_size(&self, state: &mut State, len: u64) {
        let inode = state
            .inodes
            .get_mut(&self.inode)
            .expect("open inode exists");
        let op = Pending::SetLen(len);
        apply(&mut inode.volatile, &op);
        inode.pending.push(op);
    }
}

impl FileSystem for FaultyFileSystem {
    fn open(&self, path: &Path, options: OpenOptions) -> io::Result<Box<dyn File>> {
        let mut state = self.state();
        state.check_alive()?;
        state.check_call(&[path], Operation::Open, format_args!("{}", path.display()))?;
        let inode = match state.names.get(path).copied() {
            Some(_) if options.create_new => {
                return Err(io::Error::new(
                    io::ErrorKind::AlreadyExists,
                    format!("file exists: {}", path.display()),
                ));
            }
            Some(inode) => {
                if options.truncate {
                    let file = state.inodes.get_mut(&inode).expect("named inode exists");
                    let op = Pending::SetLen(0);
                    apply(&mut file.volatile, &op);
                    file.pending.push(op);
                }
                inode
            }
            None if options.create || options.create_new => {
                if !state.parent_exists(path) {
                    return Err(io::Error::new(
                        io::ErrorKind::NotFound,
                        format!("no such directory for {}", path.display()),
                    ));
                }
                let inode = state.next_inode;
                state.next_inode += 1;
                state.inodes.insert(inode, Inode::default());
                state.names.insert(path.to_path_buf(), inode);
                inode
            }
            None => return Err(not_found(path)),
        };
        Ok(Box::new(FaultyFile {
            fs: self.clone(),
            inode,
            path: path.to_path_buf(),
            holds_lock: std::sync::atomic::AtomicBool::new(false),
        }))
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        let mut state = self.state();
        state.check_alive()?;
        state.check_call(
            &[path],
            Operation::Remove,
            format_args!("{}", path.display()),
        )?;
        state
            .names
            .remove(path)
            .map(|_| ())
            .ok_or_else(|| not_found(path))
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let mut state = self.state();
        state.check_alive()?;
        state.check_call(
            &[from, to],
            Operation::Rename,
            format_args!("{} to {}", from.display(), to.display()),
        )?;
        if !state.parent_exists(to) {
            return Err(not_found(to));
        }
        let inode = state.names.remove(from).ok_or_else(|| not_found(from))?;
        state.names.insert(to.to_path_buf(), inode);
        Ok(())
    }

    fn exists(&self, path: &Path) -> io::Result<bool> {
        let mut state = self.state();
        state.check_alive()?;
        state.check_call(
            &[path],
            Operation::Exists,
            format_args!("{}", path.display()),
        )?;
        Ok(state.names.contains_key(path) || state.dirs.contains(path))
    }

    /// The names the file has in the volatile namespace: more than one only after a crash
    /// kept both the old and the new name of a rename (see [`FaultyFileSystem::crash_with`]).
    fn link_count(&self, path: &Path) -> io::Result<u64> {
        let mut state = self.state();
        state.check_alive()?;
        state.check_call(
            &[path],
            Operation::LinkCount,
            format_args!("{}", path.display()),
        )?;
        let inode = *state.names.get(path).ok_or_else(|| not_found(path))?;
        Ok(state
            .names
            .values()
            .filter(|other| **other == inode)
            .count() as u64)
    }

    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        let mut state = self.state();
        state.check_alive()?;
        state.check_call(
            &[path],
            Operation::CreateDir,
            format_args!("{}", path.display()),
        )?;
        for ancestor in path.ancestors() {
            if !ancestor.as_os_str().is_empty() && state.dirs.insert(ancestor.to_path_buf()) {
                // The root stands for the mount point: durable at once. Any other directory is
                // durable once its parent (`.` for a relative path's first component) is synced.
                if ancestor.parent().is_none() {
                    state.durable_dirs.insert(ancestor.to_path_buf());
                }
            }
        }
        Ok(())
    }

    fn list_dir(&self, path: &Path) -> io::Result<Vec<PathBuf>> {
        let mut state = self.state();
        state.check_alive()?;
        state.check_call(
            &[path],
            Operation::ListDir,
            format_args!("{}", path.display()),
        )?;
        if !state.dirs.contains(path) {
            return Err(not_found(path));
        }
        // BTreeMap order is path order, so the names come out sorted.
        Ok(state
            .names
            .keys()
            .filter(|name| name.parent() == Some(path))
            .filter_map(|name| name.file_name().map(PathBuf::from))
            .collect())
    }

    fn sync_dir(&self, path: &Path) -> io::Result<()> {
        let mut state = self.state();
        state.check_alive()?;
        // `.` is the directory relative paths start from: it holds their first components.
        let current = path == Path::new(".");
        if !current && !state.dirs.contains(path) {
            return Err(not_found(path));
        }
        state.stats.dir_syncs += 1;
        state.check_call(
            &[path],
            Operation::SyncDir,
            format_args!("{}", path.display()),
        )?;
        let state = &mut *state;
        // What `parent()` says of the names this directory holds.
        let holder = if current { Path::new("") } else { path };
        state
            .durable_names
            .retain(|name, _| name.parent() != Some(holder));
        for (name, inode) in &state.names {
            if name.parent() == Some(holder) {
                state.durable_names.insert(name.clone(), *inode);
            }
        }
        for dir in &state.dirs {
            if dir.parent() == Some(holder) {
                state.durable_dirs.insert(dir.clone());
            }
        }
        Ok(())
    }
}
