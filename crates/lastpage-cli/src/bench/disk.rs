//! The disk's own limits, measured in the same run as the cells that depend on them (the way
//! the insert matrix measures an ideal append beside the B-tree): how long one small append
//! takes to become durable, and how many bytes per second the disk makes durable when every
//! `fdatasync` carries a large append. A durable insert cannot go faster than the bytes it
//! makes the disk write allow, whatever the engine does; `bench durable` divides the second
//! figure by the bytes its cells wrote per row to say where that ceiling is.
//!
//! The probe writes through the I/O layer (`lastpage_io`), like the engine, into a file of
//! its own in the run's directory, and removes it. Both kinds of append overwrite a file that
//! was written and synced first, so that no `fdatasync` also has to record a new file size:
//! that is the log writer's steady state too (it writes into preallocated or recycled
//! segments), so the small append's latency is comparable with a lone commit's.

use std::path::Path;
use std::time::{Duration, Instant};

use lastpage_io::{FileSystem, OpenOptions, StdFileSystem};
use serde::Serialize;

use super::insert::{BenchError, round3};

/// Bytes of each small append: one page of the page cache, what a lone single-row commit makes
/// the disk write.
const SMALL_APPEND_BYTES: usize = 4 << 10;

/// Small appends timed, each followed by `fdatasync`.
const SMALL_APPENDS: usize = 200;

/// Bytes of each large append: more than a 1,000-row batch's log (about 120 KiB), so that the
/// bandwidth measured is a generous ceiling for the batched cells.
const LARGE_APPEND_BYTES: usize = 1 << 20;

/// Size of the file both kinds of append cycle through (written and synced before timing).
const LARGE_FILE_BYTES: usize = 64 << 20;

/// Longest time the large appends are timed for.
const LARGE_APPEND_SECONDS: f64 = 1.0;

/// What the disk under the run's directory did.
#[derive(Clone, Debug, Serialize)]
pub struct DiskReference {
    /// Median time of a `fdatasync` after a 4 KiB append, microseconds.
    pub small_append_fsync_p50_us: f64,
    /// Bytes per second made durable by 1 MiB writes each followed by `fdatasync`, in MB/s
    /// (10^6 bytes).
    pub large_append_mb_per_sec: f64,
    /// Bytes the large appends wrote while timed.
    pub large_append_bytes: u64,
}

/// Measures the disk under `dir` for at most about `seconds` (plus the preparation of the
/// large appends' file); the probe's file is removed afterwards, also on failure.
pub fn measure(dir: &Path, seconds: f64) -> Result<DiskReference, BenchError> {
    let fs = StdFileSystem::new();
    let path = dir.join("disk-probe");
    let result = probe(&fs, &path, seconds);
    // A leftover probe file wastes disk, nothing worse; the run's directory is removed anyway.
    let _ = fs.remove(&path);
    result.map_err(|error| BenchError::Failed(format!("cannot measure the disk: {error}")))
}

fn probe(fs: &StdFileSystem, path: &Path, seconds: f64) -> std::io::Result<DiskReference> {
    let file = fs.open(path, OpenOptions::create())?;
    let large = vec![0xa5_u8; LARGE_APPEND_BYTES];
    let appends_per_file = LARGE_FILE_BYTES / LARGE_APPEND_BYTES;
    for append in 0..appends_per_file {
        file.write_all_at((append * LARGE_APPEND_BYTES) as u64, &large)?;
    }
    file.sync_data()?;

    let small = vec![0x5a_u8; SMALL_APPEND_BYTES];
    let mut small_us = Vec::with_capacity(SMALL_APPENDS);
    for append in 0..SMALL_APPENDS {
        file.write_all_at((append * SMALL_APPEND_BYTES) as u64, &small)?;
        let started = Instant::now();
        file.sync_data()?;
        small_us.push(started.elapsed().as_secs_f64() * 1e6);
    }
    small_us.sort_by(f64::total_cmp);

    let budget = Duration::from_secs_f64(seconds.clamp(0.05, LARGE_APPEND_SECONDS));
    let started = Instant::now();
    let mut written = 0_u64;
    let mut append = 0;
    while written == 0 || started.elapsed() < budget {
        file.write_all_at((append * LARGE_APPEND_BYTES) as u64, &large)?;
        file.sync_data()?;
        written += LARGE_APPEND_BYTES as u64;
        append = (append + 1) % appends_per_file;
    }
    let elapsed = started.elapsed().as_secs_f64().max(1e-9);
    Ok(DiskReference {
        small_append_fsync_p50_us: round3(small_us[small_us.len() / 2]),
        large_append_mb_per_sec: round3(written as f64 / elapsed / 1e6),
        large_append_bytes: written,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_probe_measures_something_and_leaves_no_file_behind() {
        let dir = std::env::temp_dir().join(format!("lastpage-disk-probe-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("create the directory");
        let disk = measure(&dir, 0.05).expect("measure");
        assert!(disk.small_append_fsync_p50_us > 0.0, "{disk:?}");
        assert!(disk.large_append_mb_per_sec > 0.0, "{disk:?}");
        assert!(
            disk.large_append_bytes >= LARGE_APPEND_BYTES as u64,
            "{disk:?}"
        );
        assert_eq!(
            std::fs::read_dir(&dir).expect("list").count(),
            0,
            "the probe's file is removed"
        );
        std::fs::remove_dir_all(&dir).expect("remove the directory");
    }
}
