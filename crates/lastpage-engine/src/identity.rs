//! A table's IDENTITY counter, and the reservations that keep a logged table from handing out
//! a value twice across a crash.
//!
//! Values are taken from an atomic counter. Recovery raises the counter above every value an
//! insert record holds, but an insert's record reaches the disk only when its transaction
//! commits (or another commit's flush carries it): a value handed to a transaction that was
//! still open at a crash (an explicit transaction shows it to the application at once; so does
//! a DELAYED commit) would otherwise be handed out again. So a logged table first writes an
//! `IdentityReserve` record covering the values ahead and hands a value out only once such a
//! record is durable, as SQL Server's identity cache persists its reservation. Recovery raises
//! the counter past every reservation it reads, and a checkpoint stores the counter at or past
//! every reservation logged, since recovery does not read the log before it.
//!
//! The reservation is kept ahead of the counter: when the values taken come within half a
//! reservation of the end of those logged, the next reservation is appended without waiting,
//! and a later flush (any commit's, or the background flusher's) makes it durable, usually long
//! before a value from it is needed. An insert waits (WRITELOG) only for a table's first
//! reservation after the database opens (a new table's goes to the disk with the table), or
//! when it catches up with one not yet on disk because values are taken faster than the log is
//! flushed; then the reservation doubles, up to a limit. A wait can happen under the last
//! leaf's latch (tables clustered on the identity take their values there), which is why
//! reservations are kept ahead. The common take checks one atomic on the counter's own cache
//! line.
//!
//! What it costs: one 40-byte record per reservation, and up to one and a half reservations of
//! values skipped after a restart, clean or not, of a table that had inserts (SQL Server skips
//! its cache after a crash).
//!
//! The log is reached through [`ReservationSink`], so that `tests/identity_loom.rs` can check
//! the protocol (the take's one-atomic check against reservations appended, waited for and
//! flushed by others) under every interleaving, over a stand-in log.

use std::collections::VecDeque;

use crossbeam_utils::CachePadded;
use lastpage_storage::limits::{
    IDENTITY_RESERVE_DOUBLINGS_MAX, IDENTITY_RESERVE_VALUES_BIGINT, IDENTITY_RESERVE_VALUES_INT,
    IDENTITY_RESERVE_VALUES_NARROW,
};
use lastpage_storage::sync::{self, AtomicI64, Mutex, Ordering};
use lastpage_storage::wal::{LogWriter, Lsn, Record};

use crate::database::Database;
use crate::error::{EngineError, Result};
use crate::types::DataType;

/// Where a table's identity reservations are written.
pub trait ReservationSink {
    /// Appends a reservation of every value up to and including `up_to`; returns the LSN the
    /// log must be durable to for it to count.
    fn append(&self, up_to: i64) -> Result<Lsn>;
    /// How far the log is durable.
    fn durable_lsn(&self) -> Lsn;
    /// Waits until the log is durable up to `lsn`.
    fn wait_until_durable(&self, lsn: Lsn) -> Result<()>;
}

/// A logged table's reservations: its database's log, under its table id.
#[derive(Clone, Copy)]
pub(crate) struct ReservationLog<'a> {
    pub(crate) db: &'a Database,
    pub(crate) wal: &'a LogWriter,
    pub(crate) table_id: u32,
}

impl ReservationSink for ReservationLog<'_> {
    fn append(&self, up_to: i64) -> Result<Lsn> {
        let record = Record::IdentityReserve {
            table_id: self.table_id,
            up_to,
        };
        self.wal
            .append(&record)
            .map_err(|error| self.db.fail(error))
    }

    fn durable_lsn(&self) -> Lsn {
        self.wal.durable_lsn()
    }

    fn wait_until_durable(&self, lsn: Lsn) -> Result<()> {
        self.wal
            .wait_until_durable(lsn)
            .map_err(|error| self.db.fail(error))
    }
}

/// The counter and the bound takes are checked against, together on one cache line: every
/// take writes the counter and then reads the bound.
struct Counter {
    /// The next value to hand out.
    next: AtomicI64,
    /// A take whose values all come before this value needs no reservation work: they are
    /// covered by a durable reservation, and the next reservation is not yet due. Only a
    /// logged table's takes read it.
    covered: AtomicI64,
}

/// Reservations appended to the log. Bounds are the counter's kind of value: the first value
/// not covered.
struct Reservations {
    /// The end of the values covered by reservations appended.
    logged: i64,
    /// The end of the values covered by reservations known to be durable.
    durable: i64,
    /// Reservations appended and not yet known to be durable: each one's end of values and its
    /// record's end LSN, oldest first (rarely more than one).
    in_flight: VecDeque<(i64, Lsn)>,
    /// Values the next reservation adds past what is needed.
    size_values: u64,
    /// The largest `size_values` may grow to.
    size_values_max: u64,
}

/// A table's IDENTITY(seed, increment) column.
pub struct IdentityState {
    /// The column's position.
    pub(crate) column: usize,
    /// The column's type: its name goes into the overflow error, and it sizes reservations.
    pub(crate) data_type: DataType,
    pub(crate) increment: i64,
    /// On a cache line of its own: every insert writes it, and the table's read-mostly fields
    /// around it would otherwise miss after each write.
    counter: CachePadded<Counter>,
    reservations: Mutex<Reservations>,
}

impl IdentityState {
    /// The counter of the column at position `column`, of type `data_type`.
    pub fn new(column: usize, data_type: DataType, seed: i64, increment: i64) -> Self {
        let size_values = match data_type {
            DataType::BigInt => IDENTITY_RESERVE_VALUES_BIGINT,
            DataType::Int => IDENTITY_RESERVE_VALUES_INT,
            _ => IDENTITY_RESERVE_VALUES_NARROW,
        };
        IdentityState {
            column,
            data_type,
            increment,
            counter: CachePadded::new(Counter {
                next: AtomicI64::new(seed),
                covered: AtomicI64::new(seed),
            }),
            reservations: Mutex::new(Reservations {
                logged: seed,
                durable: seed,
                in_flight: VecDeque::new(),
                size_values,
                size_values_max: size_values << IDENTITY_RESERVE_DOUBLINGS_MAX,
            }),
        }
    }

    /// The value the next take would return.
    pub fn next(&self) -> i64 {
        self.counter.next.load(Ordering::Relaxed)
    }

    /// Where the counter must start after a restart: at or past every value handed out and
    /// every value a reservation in the log before now covers (a checkpoint stores it, and
    /// recovery does not read the log before the checkpoint).
    pub fn restart_value(&self) -> i64 {
        let logged = sync::lock(&self.reservations).logged;
        self.farther(self.next(), logged)
    }

    /// Takes `count` consecutive values and returns the first. Fails, taking none, if the
    /// values would run past the end of BIGINT's range (SQL Server's error 8115): the counter
    /// stays where it is, so every later insert fails the same way rather than wrapping around
    /// to negative values. (The counter holds the next value to hand out, so the range's very
    /// last value is never handed out.) Narrower types are checked where a value is converted
    /// to the column's type.
    ///
    /// With `log` (a logged table of a durable database), returns only once a durable
    /// reservation covers the values; fails if the log fails.
    pub fn take<L: ReservationSink>(&self, count: u64, log: Option<L>) -> Result<i64> {
        let overflow = || EngineError::IdentityOverflow {
            data_type: self.data_type.name(),
        };
        let span = i64::try_from(count)
            .ok()
            .and_then(|count| count.checked_mul(self.increment))
            .ok_or_else(overflow)?;
        let first = self
            .counter
            .next
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |next| {
                next.checked_add(span)
            })
            .map_err(|_| overflow())?;
        if let Some(log) = log {
            // `fetch_update` succeeded, so this does not overflow.
            let end = first + span;
            if self.beyond(end, self.counter.covered.load(Ordering::Acquire)) {
                self.cover(end, log, true)?;
            }
        }
        Ok(first)
    }

    /// Appends a reservation for the values the next takes will need, without waiting for it
    /// to reach the disk: what a new table does before the flush that makes it durable, so
    /// that its first insert need not wait for a flush of its own.
    pub fn reserve_ahead(&self, log: impl ReservationSink) -> Result<()> {
        self.cover(self.advance(self.next(), 1), log, false)
    }

    /// Appends the next reservation if it is due (the values before `end` are within half a
    /// reservation of the end of those logged), and with `wait` makes sure a durable
    /// reservation covers the values before `end`.
    #[cold]
    fn cover(&self, end: i64, log: impl ReservationSink, wait: bool) -> Result<()> {
        let mut reservations = sync::lock(&self.reservations);
        let state = &mut *reservations;
        self.note_durable(state, log.durable_lsn());
        let half = i64::try_from(state.size_values / 2).unwrap_or(i64::MAX);
        // Whether the values needed now were already reserved before this call: if so and
        // they are not yet durable, the reservation was appended too late, so it grows.
        let reserved_ahead = !self.beyond(end, state.logged);
        if self.beyond(self.advance(end, half), state.logged) {
            let size = i64::try_from(state.size_values).unwrap_or(i64::MAX);
            let logged = self.advance(self.farther(end, state.logged), size);
            let lsn = log.append(self.advance(logged, -1))?;
            state.in_flight.push_back((logged, lsn));
            state.logged = logged;
        }
        if wait && self.beyond(end, state.durable) {
            // The first reservation in flight that covers `end`; there is one, since the
            // last one appended covers it (`logged` is past `end`), but should that ever not
            // hold, the take fails below rather than hand out values nothing covers.
            let covering = state
                .in_flight
                .iter()
                .find(|&&(logged, _)| !self.beyond(end, logged))
                .map(|&(_, lsn)| lsn);
            if let Some(lsn) = covering {
                log.wait_until_durable(lsn)?;
                self.note_durable(state, log.durable_lsn());
            }
            if self.beyond(end, state.durable) {
                return Err(EngineError::Storage(format!(
                    "no identity reservation covers the values before {end}"
                )));
            }
            if reserved_ahead {
                state.size_values = (state.size_values * 2).min(state.size_values_max);
            }
        }
        let due = self.advance(state.logged, -half);
        self.counter
            .covered
            .store(self.nearer(state.durable, due), Ordering::Release);
        Ok(())
    }

    /// Raises the counter to at least `next` (recovery, or a checkpoint's counter). Values
    /// before it are never handed out, so they count as covered; the next take still logs a
    /// reservation of its own.
    pub(crate) fn raise(&self, next: i64) {
        if self.increment > 0 {
            self.counter.next.fetch_max(next, Ordering::Relaxed);
        } else {
            self.counter.next.fetch_min(next, Ordering::Relaxed);
        }
        let mut state = sync::lock(&self.reservations);
        state.logged = self.farther(state.logged, next);
        state.durable = self.farther(state.durable, next);
    }

    /// Takes in the reservations the log has made durable up to `durable_lsn`.
    fn note_durable(&self, state: &mut Reservations, durable_lsn: Lsn) {
        while let Some(&(logged, lsn)) = state.in_flight.front()
            && lsn <= durable_lsn
        {
            state.durable = self.farther(state.durable, logged);
            state.in_flight.pop_front();
        }
    }

    /// Whether `a` comes after `b` in the order values are handed out.
    fn beyond(&self, a: i64, b: i64) -> bool {
        if self.increment > 0 { a > b } else { a < b }
    }

    /// The later of `a` and `b` in the order values are handed out.
    pub(crate) fn farther(&self, a: i64, b: i64) -> i64 {
        if self.beyond(a, b) { a } else { b }
    }

    /// The earlier of `a` and `b` in the order values are handed out.
    fn nearer(&self, a: i64, b: i64) -> i64 {
        if self.beyond(a, b) { b } else { a }
    }

    /// `value` moved `steps` increments on (back, if negative), stopping at the ends of
    /// BIGINT's range.
    fn advance(&self, value: i64, steps: i64) -> i64 {
        value.saturating_add(steps.saturating_mul(self.increment))
    }
}
