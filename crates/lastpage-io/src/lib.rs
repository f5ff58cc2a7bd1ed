//! The one layer of lastpage that touches files.
//!
//! Everything above this crate (the write-ahead log now; the data file, checkpoints and the
//! control file later) reaches the disk only through the [`FileSystem`] and [`File`] traits. That
//! is what makes durability testable: [`StdFileSystem`] is the real thing (std's file APIs,
//! `pwrite`/`pread`/`fdatasync`), and [`FaultyFileSystem`] is an in-memory file system that knows
//! which bytes a power loss would keep, can simulate that crash deterministically from a seed, and
//! can inject the failures real disks produce (a failed `fdatasync`, `ENOSPC`, and `EIO` from
//! any call of the two traits: reads, writes, opens, renames, removals, length changes,
//! directories).
//!
//! The interface is deliberately small and positional: every read and write names its offset
//! (`pread`/`pwrite`), and every method takes `&self`, so one open file can be written from many
//! threads without a cursor or a lock in this layer.
//!
//! Durability contract, which both implementations follow and the layers above rely on:
//! - A write is durable only after a later [`File::sync_data`] on the same file returned `Ok`.
//! - The size a [`File::set_len`], a [`File::allocate`] or an extending write gives a file is
//!   durable only after a later `sync_data` returned `Ok` (`fdatasync` flushes the metadata
//!   needed to read the data back).
//! - A newly created, renamed or removed name is durable only after [`FileSystem::sync_dir`] on
//!   its parent directory returned `Ok`; so is a directory [`FileSystem::create_dir_all`] made,
//!   and a crash that loses a directory's name loses everything under it.
//! - After `sync_data` failed, nothing about the unsynced writes of that file is known: some may
//!   be on disk, some may be lost forever, and (as Linux does since "fsyncgate") a *later*
//!   `sync_data` may return `Ok` without having written them. Callers must treat a failed sync as
//!   the loss of everything not yet durable, never retry it and carry on.

#![forbid(unsafe_code)]

mod faulty;
mod power_cut;
mod std_fs;

use std::fmt::Debug;
use std::io;
use std::path::{Path, PathBuf};

pub use faulty::{
    CrashMode, FaultRule, FaultyConfig, FaultyFileSystem, FaultyStats, Operation, Tear,
};
pub use power_cut::PowerCut;
pub use std_fs::StdFileSystem;

/// Creates the directory `path` and any missing parents, and makes their names durable: syncs
/// the parent of `path`, and of every directory it created, before it returns. Without the
/// syncs a crash could take the new directory, and every file made durable in it since, along
/// with its name. The parent of `path` is synced even when `path` existed already: a process
/// that created it may have stopped before its own sync. A relative path's first component
/// is synced into the current directory (`.`).
pub fn create_dir_all_durable(fs: &dyn FileSystem, path: &Path) -> io::Result<()> {
    let mut created = vec![path];
    for ancestor in path.ancestors().skip(1) {
        if ancestor.as_os_str().is_empty() || fs.exists(ancestor)? {
            break;
        }
        created.push(ancestor);
    }
    fs.create_dir_all(path)?;
    for dir in created {
        match dir.parent() {
            Some(parent) if parent.as_os_str().is_empty() => fs.sync_dir(Path::new("."))?,
            Some(parent) => fs.sync_dir(parent)?,
            // The root: nothing holds its name.
            None => {}
        }
    }
    Ok(())
}

/// How [`FileSystem::open`] opens a file. Files are always opened for reading and writing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OpenOptions {
    /// Create the file if it does not exist (otherwise opening a missing file fails with
    /// `NotFound`).
    pub create: bool,
    /// Fail with `AlreadyExists` if the file exists. Implies `create`.
    pub create_new: bool,
    /// Cut the file to length zero when it is opened.
    pub truncate: bool,
}

impl OpenOptions {
    /// Opens an existing file; fails with `NotFound` if it does not exist.
    pub fn existing() -> OpenOptions {
        OpenOptions::default()
    }

    /// Opens the file, creating it if it does not exist.
    pub fn create() -> OpenOptions {
        OpenOptions {
            create: true,
            ..OpenOptions::default()
        }
    }

    /// Creates a new file; fails with `AlreadyExists` if it exists.
    pub fn create_new() -> OpenOptions {
        OpenOptions {
            create: true,
            create_new: true,
            truncate: false,
        }
    }

    /// The same options, with the file cut to length zero when it is opened.
    pub fn truncate(self) -> OpenOptions {
        OpenOptions {
            truncate: true,
            ..self
        }
    }
}

/// An open file. All methods take `&self`: reads and writes are positional, so one handle can be
/// shared by many threads (wrap the `Box` in an `Arc`).
pub trait File: Send + Sync + Debug {
    /// Reads up to `buf.len()` bytes starting at `offset` and returns how many were read. It
    /// returns fewer only when the end of the file is reached (zero at or past the end).
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<usize>;

    /// Writes all of `data` at `offset`, extending the file (with zeros in any gap) if needed.
    /// On error an unknown prefix of `data` may have been written.
    fn write_all_at(&self, offset: u64, data: &[u8]) -> io::Result<()>;

    /// Writes `pieces` one after another from `offset`, as [`File::write_all_at`] would write
    /// their concatenation, with as few calls into the system as it can (`pwritev`): the data
    /// file writes a run of pages that go to consecutive slots this way, which costs about half
    /// the CPU of a `pwrite` per page. On error an unknown prefix may have been written. The
    /// default writes each piece in turn.
    fn write_all_vectored_at(&self, offset: u64, pieces: &[&[u8]]) -> io::Result<()> {
        let mut at = offset;
        for piece in pieces {
            self.write_all_at(at, piece)?;
            at += piece.len() as u64;
        }
        Ok(())
    }

    /// Makes every earlier write and size change of this file durable (`fdatasync`). See the
    /// crate documentation for what a failure means.
    fn sync_data(&self) -> io::Result<()>;

    /// The current size of the file in bytes.
    fn len(&self) -> io::Result<u64>;

    /// Whether the file is empty.
    fn is_empty(&self) -> io::Result<bool> {
        Ok(self.len()? == 0)
    }

    /// Cuts or extends (with zeros) the file to `len` bytes. Durable after the next `sync_data`.
    fn set_len(&self, len: u64) -> io::Result<()>;

    /// Reserves the file's disk space up to `len` bytes, extending it to that size if it is
    /// shorter, without writing anything: the new bytes read as zeros (`fallocate` with no
    /// flags). A full disk fails here (`ErrorKind::StorageFull`) rather than at a later write
    /// into the range; a file system that cannot reserve space fails with
    /// `ErrorKind::Unsupported`. Durable after the next `sync_data`.
    ///
    /// Unlike zeros written over the range, the reservation costs no writes, but the first
    /// write into each reserved block changes the file's metadata (the block is no longer
    /// "unwritten"), which the `sync_data` that follows must commit too.
    fn allocate(&self, len: u64) -> io::Result<()>;

    /// Takes an exclusive advisory lock on the file if nobody else holds one, returning whether
    /// it did. The lock lasts until this handle is dropped (or the process ends).
    fn try_lock(&self) -> io::Result<bool>;

    /// Reads exactly `buf.len()` bytes at `offset`, or fails with `UnexpectedEof`.
    fn read_exact_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let read = self.read_at(offset, buf)?;
        if read == buf.len() {
            Ok(())
        } else {
            Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!(
                    "read of {} bytes at offset {offset} found only {read} before the end of the file",
                    buf.len()
                ),
            ))
        }
    }
}

/// A file system: the operations on names and directories lastpage needs.
pub trait FileSystem: Send + Sync + Debug {
    /// Opens (and, as `options` say, creates or truncates) the file at `path` for reading and
    /// writing.
    fn open(&self, path: &Path, options: OpenOptions) -> io::Result<Box<dyn File>>;

    /// Removes the file at `path`. Durable after [`FileSystem::sync_dir`] on its directory.
    fn remove(&self, path: &Path) -> io::Result<()>;

    /// Renames `from` to `to`, replacing `to` if it exists (atomically, as `rename(2)` does).
    /// Durable after [`FileSystem::sync_dir`] on the directory (or both directories).
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;

    /// Whether a file or directory exists at `path`.
    fn exists(&self, path: &Path) -> io::Result<bool>;

    /// How many names the file at `path` has (its hard links, `st_nlink`), this one included;
    /// fails with `NotFound` if there is none. A rename replaces one name by another, but a
    /// crash before the directory's next sync may keep both (a journaling file system commits
    /// a rename whole, but a repair by `fsck` need not, nor does the fault-injecting file
    /// system, which keeps each name's old or new state independently): a writer about to
    /// reuse a file asks this first, since writing through one name would change what the
    /// other shows.
    fn link_count(&self, path: &Path) -> io::Result<u64>;

    /// Creates the directory `path` and any missing parents. Each new directory's name is
    /// durable only after [`FileSystem::sync_dir`] on its parent.
    fn create_dir_all(&self, path: &Path) -> io::Result<()>;

    /// The names (not full paths) of the files in directory `path`, sorted.
    fn list_dir(&self, path: &Path) -> io::Result<Vec<PathBuf>>;

    /// Makes the creations, removals and renames of names in directory `path` durable (an
    /// `fsync` of the directory).
    fn sync_dir(&self, path: &Path) -> io::Result<()>;
}
