//! The real file system: std's file APIs, with positional I/O from `std::os::unix::fs::FileExt`.

use std::fs;
use std::io;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};

use rustix::fs::FallocateFlags;
use rustix::io::Errno;

use crate::{File, FileSystem, OpenOptions};

/// The operating system's file system, through `std::fs`.
#[derive(Clone, Copy, Debug, Default)]
pub struct StdFileSystem;

impl StdFileSystem {
    /// The real file system.
    pub fn new() -> StdFileSystem {
        StdFileSystem
    }
}

/// The most slices one `pwritev` takes on Linux (`IOV_MAX`).
const IOV_MAX: usize = 1024;

/// An open file of [`StdFileSystem`].
#[derive(Debug)]
struct StdFile {
    file: fs::File,
}

impl File for StdFile {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
        // `pread` may return fewer bytes than asked even before the end of the file (a signal,
        // a pipe-like file), so keep reading until the buffer is full or a read returns zero,
        // which is the end of the file.
        let mut done = 0;
        while done < buf.len() {
            match self.file.read_at(&mut buf[done..], offset + done as u64) {
                Ok(0) => break,
                Ok(read) => done += read,
                Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
                Err(error) => return Err(error),
            }
        }
        Ok(done)
    }

    fn write_all_at(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        self.file.write_all_at(data, offset)
    }

    fn write_all_vectored_at(&self, offset: u64, pieces: &[&[u8]]) -> io::Result<()> {
        let mut slices: Vec<io::IoSlice<'_>> =
            pieces.iter().map(|piece| io::IoSlice::new(piece)).collect();
        let mut left = &mut slices[..];
        io::IoSlice::advance_slices(&mut left, 0);
        let mut at = offset;
        // At most IOV_MAX (1024 on Linux) slices a call; a call may also write less than asked
        // (a signal, a full disk part-way), and the rest is written by the next.
        while !left.is_empty() {
            let count = left.len().min(IOV_MAX);
            match rustix::io::pwritev(&self.file, &left[..count], at) {
                Ok(0) => {
                    return Err(io::Error::new(
                        io::ErrorKind::WriteZero,
                        "the file system accepted no bytes of a write",
                    ));
                }
                Ok(written) => {
                    at += written as u64;
                    io::IoSlice::advance_slices(&mut left, written);
                }
                Err(Errno::INTR) => {}
                Err(error) => return Err(error.into()),
            }
        }
        Ok(())
    }

    fn sync_data(&self) -> io::Result<()> {
        self.file.sync_data()
    }

    fn len(&self) -> io::Result<u64> {
        Ok(self.file.metadata()?.len())
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.file.set_len(len)
    }

    fn allocate(&self, len: u64) -> io::Result<()> {
        loop {
            match rustix::fs::fallocate(&self.file, FallocateFlags::empty(), 0, len) {
                Ok(()) => return Ok(()),
                Err(Errno::INTR) => {}
                Err(Errno::OPNOTSUPP) => {
                    return Err(io::Error::new(
                        io::ErrorKind::Unsupported,
                        "the file system cannot reserve space (fallocate)",
                    ));
                }
                Err(error) => return Err(error.into()),
            }
        }
    }

    fn try_lock(&self) -> io::Result<bool> {
        match self.file.try_lock() {
            Ok(()) => Ok(true),
            Err(fs::TryLockError::WouldBlock) => Ok(false),
            Err(fs::TryLockError::Error(error)) => Err(error),
        }
    }
}

impl FileSystem for StdFileSystem {
    fn open(&self, path: &Path, options: OpenOptions) -> io::Result<Box<dyn File>> {
        let file = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(options.create || options.create_new)
            .create_new(options.create_new)
            .truncate(options.truncate)
            .open(path)?;
        Ok(Box::new(StdFile { file }))
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        fs::remove_file(path)
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        fs::rename(from, to)
    }

    fn exists(&self, path: &Path) -> io::Result<bool> {
        path.try_exists()
    }

    fn link_count(&self, path: &Path) -> io::Result<u64> {
        // Of the name itself: a symbolic link is not the file it points to.
        Ok(fs::symlink_metadata(path)?.nlink())
    }

    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        fs::create_dir_all(path)
    }

    fn list_dir(&self, path: &Path) -> io::Result<Vec<PathBuf>> {
        let mut names = Vec::new();
        for entry in fs::read_dir(path)? {
            let entry = entry?;
            if entry.file_type()?.is_file() {
                names.push(PathBuf::from(entry.file_name()));
            }
        }
        names.sort();
        Ok(names)
    }

    fn sync_dir(&self, path: &Path) -> io::Result<()> {
        // On Linux a directory is opened read-only and `fsync`ed to make its entries durable.
        fs::File::open(path)?.sync_all()
    }
}
