//! A small measurement of group commit on the real file system: many sessions each appending
//! an insert and a commit record and waiting for durability, as the seeds' single-row durable
//! autocommit inserts do. Ignored by default (it measures the disk, not the code); run with:
//!
//! ```text
//! CARGO_TARGET_DIR=target-wal cargo test -p lastpage-storage --release --test wal_bench \
//!     -- --ignored --nocapture
//! ```
//!
//! `LASTPAGE_BENCH_SECONDS` sets the duration of each run (default 3).

use std::borrow::Cow;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use lastpage_io::StdFileSystem;
use lastpage_storage::stats::{self, WaitType};
use lastpage_storage::wal::{LogWriter, Record, TxnId, WalConfig};

fn run(threads: u64, seconds: f64) {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("wal-bench-{}-{threads}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let writer = Arc::new(
        LogWriter::open(Arc::new(StdFileSystem::new()), &dir, WalConfig::default()).unwrap(),
    );
    let stop = Arc::new(AtomicBool::new(false));
    let waits_before = stats::snapshot();
    let started = Instant::now();
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let writer = Arc::clone(&writer);
            let stop = Arc::clone(&stop);
            thread::spawn(move || {
                let value = [7u8; 100];
                let mut commits = 0u64;
                let mut latencies = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let txn = t << 32 | commits;
                    let begin = Instant::now();
                    writer
                        .append(&Record::Insert {
                            txn: TxnId(txn),
                            index_id: 1,
                            key: Cow::Borrowed(&txn.to_be_bytes()),
                            value: Cow::Borrowed(&value),
                        })
                        .unwrap();
                    let end = writer.append(&Record::Commit { txn: TxnId(txn) }).unwrap();
                    writer.wait_durable(end).unwrap();
                    latencies.push(begin.elapsed());
                    commits += 1;
                }
                latencies
            })
        })
        .collect();
    thread::sleep(Duration::from_secs_f64(seconds));
    stop.store(true, Ordering::Relaxed);
    let mut latencies: Vec<Duration> = handles
        .into_iter()
        .flat_map(|handle| handle.join().unwrap())
        .collect();
    let elapsed = started.elapsed().as_secs_f64();
    let stats = writer.stats();
    let waits = stats::snapshot().since(&waits_before);
    latencies.sort_unstable();
    let percentile = |p: f64| latencies[((latencies.len() - 1) as f64 * p) as usize];
    println!(
        "{threads:>4} threads: {:>8.0} commits/s, {:>6.0} fsyncs/s, {:>6.1} commits/fsync, \
         {:>5.1} records/flush, commit latency p50 {:?} p99 {:?}, WRITELOG waits {} ({:.0} ms), \
         LOGBUFFER waits {}",
        stats.commits as f64 / elapsed,
        stats.fsyncs as f64 / elapsed,
        stats.commits_per_fsync(),
        stats.records_per_flush(),
        percentile(0.5),
        percentile(0.99),
        waits.wait(WaitType::WriteLog).waiting_tasks_count,
        waits.wait(WaitType::WriteLog).wait_time_ms(),
        waits.wait(WaitType::LogBuffer).waiting_tasks_count,
    );
    drop(writer);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
#[ignore = "measures the disk; run explicitly with --ignored --nocapture"]
fn group_commit_on_the_real_file_system() {
    let seconds = std::env::var("LASTPAGE_BENCH_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3.0);
    for threads in [1, 10, 100] {
        run(threads, seconds);
    }
}
