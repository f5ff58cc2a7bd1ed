//! A file system that loses power at its n-th mutating operation: the crash tests' way of
//! stopping a database at every step of a commit, a flush, a checkpoint, a close or an open.
//!
//! [`PowerCut`] wraps a [`FaultyFileSystem`] and counts the operations that change what a
//! crash keeps: writes, syncs, length changes, opens that create or truncate a file, removes,
//! renames and directory syncs (reads, `exists` and listings do not count). When the armed
//! operation comes, just before it runs, it takes [`FaultyFileSystem::crash_with`] of the
//! wrapped one, once: the files as a power cut at that moment leaves them, in
//! [`PowerCut::after`]. That operation and every later one then fail (the wrapped instance is
//! gone), so the database stops where the power went; the test drops it and opens the files
//! that survived.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use crate::{CrashMode, FaultyFileSystem, File, FileSystem, OpenOptions};

/// See the module documentation. Clones share one counter and one cut.
#[derive(Debug, Clone)]
pub struct PowerCut(Arc<State>);

#[derive(Debug)]
struct State {
    inner: FaultyFileSystem,
    /// How the armed cut treats operations that were not durable.
    mode: Mutex<CrashMode>,
    /// Mutating operations so far.
    ops: AtomicU64,
    /// The operation the power goes at (0: never).
    at: AtomicU64,
    /// The files the cut left, once it came.
    after: Mutex<Option<FaultyFileSystem>>,
}

impl PowerCut {
    /// Wraps `inner`, unarmed.
    pub fn new(inner: FaultyFileSystem) -> PowerCut {
        PowerCut(Arc::new(State {
            inner,
            mode: Mutex::new(CrashMode::Random),
            ops: AtomicU64::new(0),
            at: AtomicU64::new(0),
            after: Mutex::new(None),
        }))
    }

    /// The wrapped file system: what the running process sees.
    pub fn inner(&self) -> &FaultyFileSystem {
        &self.0.inner
    }

    /// Cuts the power just before the `n`-th mutating operation from now (`n` at least 1), in
    /// `mode`.
    pub fn arm(&self, n: u64, mode: CrashMode) {
        *lock(&self.0.mode) = mode;
        let now = self.0.ops.load(Ordering::SeqCst);
        self.0.at.store(now + n.max(1), Ordering::SeqCst);
    }

    /// Takes back an armed cut that has not come.
    pub fn disarm(&self) {
        self.0.at.store(0, Ordering::SeqCst);
    }

    /// Cuts the power now, in `mode`, unless it was cut already.
    pub fn cut_now(&self, mode: CrashMode) {
        let mut after = lock(&self.0.after);
        if after.is_none() {
            *after = Some(self.0.inner.crash_with(mode));
        }
    }

    /// Whether the power was cut.
    pub fn fired(&self) -> bool {
        lock(&self.0.after).is_some()
    }

    /// The files the cut left, if it came.
    pub fn after(&self) -> Option<FaultyFileSystem> {
        lock(&self.0.after).clone()
    }

    /// Mutating operations so far.
    pub fn ops(&self) -> u64 {
        self.0.ops.load(Ordering::SeqCst)
    }

    /// Counts one mutating operation, cutting the power if it is the armed one.
    fn op(&self) {
        let n = self.0.ops.fetch_add(1, Ordering::SeqCst) + 1;
        if n == self.0.at.load(Ordering::SeqCst) {
            let mode = *lock(&self.0.mode);
            self.cut_now(mode);
        }
    }
}

/// A poisoned mutex here only means a test thread panicked; the data is still whole.
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

#[derive(Debug)]
struct PowerCutFile {
    cut: PowerCut,
    file: Box<dyn File>,
}

impl File for PowerCutFile {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
        self.file.read_at(offset, buf)
    }
    fn write_all_at(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        self.cut.op();
        self.file.write_all_at(offset, data)
    }
    fn sync_data(&self) -> io::Result<()> {
        self.cut.op();
        self.file.sync_data()
    }
    fn len(&self) -> io::Result<u64> {
        self.file.len()
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.cut.op();
        self.file.set_len(len)
    }
    fn allocate(&self, len: u64) -> io::Result<()> {
        self.cut.op();
        self.file.allocate(len)
    }
    fn try_lock(&self) -> io::Result<bool> {
        self.file.try_lock()
    }
}

impl FileSystem for PowerCut {
    fn open(&self, path: &Path, options: OpenOptions) -> io::Result<Box<dyn File>> {
        let inner = &self.0.inner;
        if options.truncate || ((options.create || options.create_new) && !inner.exists(path)?) {
            self.op();
        }
        let file = inner.open(path, options)?;
        Ok(Box::new(PowerCutFile {
            cut: self.clone(),
            file,
        }))
    }
    fn remove(&self, path: &Path) -> io::Result<()> {
        self.op();
        self.0.inner.remove(path)
    }
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.op();
        self.0.inner.rename(from, to)
    }
    fn exists(&self, path: &Path) -> io::Result<bool> {
        self.0.inner.exists(path)
    }
    fn link_count(&self, path: &Path) -> io::Result<u64> {
        self.0.inner.link_count(path)
    }
    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        self.0.inner.create_dir_all(path)
    }
    fn list_dir(&self, path: &Path) -> io::Result<Vec<PathBuf>> {
        self.0.inner.list_dir(path)
    }
    fn sync_dir(&self, path: &Path) -> io::Result<()> {
        self.op();
        self.0.inner.sync_dir(path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::FaultyConfig;

    #[test]
    fn the_power_goes_just_before_the_armed_operation_and_only_once() {
        let cut = PowerCut::new(FaultyFileSystem::new(FaultyConfig::new(1)));
        cut.create_dir_all(Path::new("/d")).unwrap();
        let path = Path::new("/d/f");
        let file = cut.open(path, OpenOptions::create()).unwrap(); // operation 1
        cut.sync_dir(Path::new("/d")).unwrap(); // 2
        file.write_all_at(0, b"durable").unwrap(); // 3
        file.sync_data().unwrap(); // 4
        cut.arm(2, CrashMode::KeepUnsynced);
        file.write_all_at(0, b"applied").unwrap(); // 5
        assert!(!cut.fired());
        // 6: the cut comes before it runs, and it fails, as does all that follows.
        assert!(file.write_all_at(0, b"too late").is_err());
        assert!(cut.fired());
        assert_eq!(cut.ops(), 6);
        assert!(file.sync_data().is_err());
        let after = cut.after().unwrap();
        assert_eq!(after.durable_contents(path).unwrap(), b"applied");
        // A later cut changes nothing.
        cut.cut_now(CrashMode::LoseUnsynced);
        assert_eq!(
            cut.after().unwrap().durable_contents(path).unwrap(),
            b"applied"
        );
    }

    #[test]
    fn reads_and_listings_do_not_count_and_a_disarmed_cut_never_comes() {
        let cut = PowerCut::new(FaultyFileSystem::new(FaultyConfig::new(2)));
        cut.create_dir_all(Path::new("/d")).unwrap();
        let file = cut.open(Path::new("/d/f"), OpenOptions::create()).unwrap();
        cut.arm(1, CrashMode::LoseUnsynced);
        cut.disarm();
        let mut buf = [0u8; 4];
        let _ = file.read_at(0, &mut buf).unwrap();
        assert!(cut.exists(Path::new("/d/f")).unwrap());
        let _ = cut.list_dir(Path::new("/d")).unwrap();
        assert_eq!(cut.ops(), 1);
        file.write_all_at(0, b"x").unwrap();
        assert!(!cut.fired());
    }
}
