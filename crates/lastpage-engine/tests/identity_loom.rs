//! Model check of identity reservations (`identity.rs`) with loom: two sessions take identity
//! values from one counter while a background flush makes the log durable at any moment. Over
//! a stand-in log, in every interleaving (up to a preemption bound), every value a take returns
//! must be covered by a reservation already durable, and a restart must start past every value
//! handed out. The reservation size is TINYINT's (10 values), so that the takes below cross
//! several reservations: the first one waited for, ones appended ahead and found durable, and
//! ones appended ahead and caught up with before a flush. Run with:
//!
//! ```text
//! RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target-loom \
//!     cargo test -p lastpage-engine --release --test identity_loom
//! ```
#![cfg(loom)]

use lastpage_engine::Result;
use lastpage_engine::identity::{IdentityState, ReservationSink};
use lastpage_engine::types::DataType;
use lastpage_storage::sync::model_check;
use lastpage_storage::wal::Lsn;
use loom::sync::atomic::{AtomicU64, Ordering};
use loom::sync::{Arc, Mutex};
use loom::thread;

/// Values each take asks for, and takes per session: enough to pass the end of the first two
/// reservations.
const VALUES_PER_TAKE: u64 = 4;
const TAKES_PER_SESSION: usize = 2;

/// A log holding only reservations: record `i` (from 0) ends at LSN `i + 1`.
#[derive(Default)]
struct ModelLog {
    /// Each appended reservation's last value, in log order.
    up_to: Mutex<Vec<i64>>,
    /// How many records are durable.
    durable: AtomicU64,
}

impl ModelLog {
    /// A flush of everything appended so far (another commit's, or the background flusher's).
    fn flush(&self) {
        let end = self.up_to.lock().unwrap().len() as u64;
        self.durable.fetch_max(end, Ordering::AcqRel);
    }

    /// The last value a durable reservation covers, if any is durable.
    fn durable_up_to(&self) -> Option<i64> {
        let durable = self.durable.load(Ordering::Acquire) as usize;
        self.up_to.lock().unwrap()[..durable].iter().max().copied()
    }
}

impl ReservationSink for &ModelLog {
    fn append(&self, up_to: i64) -> Result<Lsn> {
        let mut records = self.up_to.lock().unwrap();
        records.push(up_to);
        Ok(Lsn(records.len() as u64))
    }

    fn durable_lsn(&self) -> Lsn {
        Lsn(self.durable.load(Ordering::Acquire))
    }

    fn wait_until_durable(&self, lsn: Lsn) -> Result<()> {
        // The waiter leads a flush up to `lsn` (records before it are appended already).
        self.durable.fetch_max(lsn.0, Ordering::AcqRel);
        Ok(())
    }
}

/// One session's takes; returns the last value handed out.
fn session(identity: &IdentityState, log: &ModelLog) -> i64 {
    let mut last = 0;
    for _ in 0..TAKES_PER_SESSION {
        let first = identity.take(VALUES_PER_TAKE, Some(log)).unwrap();
        last = first + VALUES_PER_TAKE as i64 - 1;
        let covered = log.durable_up_to();
        assert!(
            covered.is_some_and(|up_to| up_to >= last),
            "values up to {last} were handed out while durable reservations covered {covered:?}"
        );
    }
    last
}

#[test]
fn every_value_handed_out_is_covered_by_a_durable_reservation() {
    model_check(3, || {
        let identity = Arc::new(IdentityState::new(0, DataType::TinyInt, 1, 1));
        let log = Arc::new(ModelLog::default());
        let other = {
            let (identity, log) = (Arc::clone(&identity), Arc::clone(&log));
            thread::spawn(move || session(&identity, &log))
        };
        let flusher = {
            let log = Arc::clone(&log);
            thread::spawn(move || log.flush())
        };
        let mine = session(&identity, &log);
        let theirs = other.join().unwrap();
        flusher.join().unwrap();
        let restart = identity.restart_value();
        assert!(
            restart > mine.max(theirs),
            "a restart would start at {restart}, and {} was handed out",
            mine.max(theirs)
        );
    });
}
