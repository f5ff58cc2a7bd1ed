//! Model check of a table's uniquifiers (`uniquifier.rs`) with loom: threads take values from
//! one stripe within a block and across block ends (a block here holds three values, so the
//! first and the fourth take install a block, racing the other thread's takes), and a raise past the rows' highest value
//! races the takes. In every interleaving no value is handed out twice, no block's last value
//! is handed out, and every take that follows the raise lies past the raised block. Run with:
//!
//! ```text
//! RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target-loom \
//!     cargo test -p lastpage-engine --release --test uniquifier_loom
//! ```
#![cfg(loom)]

use std::collections::HashSet;

use lastpage_engine::uniquifier::Uniquifiers;
use lastpage_storage::sync::model_check;
use loom::sync::Arc;
use loom::thread;

/// Bits below the block number: blocks of four values, whose last (the end mark) is never
/// handed out, so that four takes from one stripe both step within a block and cross its end.
const BLOCK_BITS: u32 = 2;

/// A block's end mark.
const END_MARK: u64 = (1 << BLOCK_BITS) - 1;

/// Asserts that `values` are distinct and none is a block's end mark.
fn assert_distinct(values: &[u64]) {
    let distinct: HashSet<_> = values.iter().collect();
    assert_eq!(
        distinct.len(),
        values.len(),
        "a value was handed out twice: {values:?}"
    );
    assert!(
        values.iter().all(|value| value & END_MARK != END_MARK),
        "a block's end mark was handed out: {values:?}"
    );
}

/// Runs `check` under loom with at most 3 preemptions (unless `LOOM_MAX_PREEMPTIONS` says
/// otherwise): unbounded, the first model takes minutes, and the races here need only a
/// preemption inside a take and one inside the other thread's.
fn model(check: impl Fn() + Sync + Send + 'static) {
    model_check(3, check);
}

#[test]
fn two_threads_of_one_stripe_take_distinct_values_across_block_ends() {
    model(|| {
        // Enough blocks for both threads' takes and a block lost to each install race.
        let uniquifiers = Arc::new(Uniquifiers::with_geometry(BLOCK_BITS, 16, 1));
        let other = {
            let uniquifiers = Arc::clone(&uniquifiers);
            thread::spawn(move || [uniquifiers.take_from(0), uniquifiers.take_from(0)])
        };
        let mine = [uniquifiers.take_from(0), uniquifiers.take_from(0)];
        let theirs = other.join().unwrap();
        let values: Vec<u64> = mine
            .into_iter()
            .chain(theirs)
            .map(|value| value.expect("blocks ran out"))
            .collect();
        assert_distinct(&values);
    });
}

#[test]
fn a_raise_racing_takes_leaves_later_takes_past_the_raised_block() {
    model(|| {
        let uniquifiers = Arc::new(Uniquifiers::with_geometry(BLOCK_BITS, 16, 2));
        // Stripe 1 holds block 0 before the race; rows hold a value of block 2.
        let first = uniquifiers.take_from(1).unwrap();
        let raised_block = 2;
        let taker = {
            let uniquifiers = Arc::clone(&uniquifiers);
            thread::spawn(move || [uniquifiers.take_from(0), uniquifiers.take_from(1)])
        };
        uniquifiers.raise_past(raised_block << BLOCK_BITS);
        let after = [uniquifiers.take_from(0), uniquifiers.take_from(1)];
        let during = taker.join().unwrap();
        for value in after {
            let value = value.expect("blocks ran out");
            assert!(
                value >> BLOCK_BITS > raised_block,
                "{value} was taken after the raise past block {raised_block}"
            );
        }
        let values: Vec<u64> = std::iter::once(Some(first))
            .chain(during)
            .chain(after)
            .map(|value| value.expect("blocks ran out"))
            .collect();
        assert_distinct(&values);
    });
}

/// Two raises race (recovery's per-row raise returns at once when the floor is already high
/// enough, which only a raise that finished can have made it): whichever returns early, every
/// take after a raise lies past the block it raised to, and values stay distinct.
#[test]
fn a_raise_that_finds_the_floor_already_raised_still_leaves_later_takes_past_it() {
    model(|| {
        let uniquifiers = Arc::new(Uniquifiers::with_geometry(BLOCK_BITS, 16, 2));
        let (high, low) = (3u64, 1u64);
        let other = {
            let uniquifiers = Arc::clone(&uniquifiers);
            thread::spawn(move || {
                uniquifiers.raise_past(high << BLOCK_BITS);
                uniquifiers.take_from(0)
            })
        };
        uniquifiers.raise_past(low << BLOCK_BITS);
        let mine = uniquifiers.take_from(1).expect("blocks ran out");
        let theirs = other.join().unwrap().expect("blocks ran out");
        assert!(
            mine >> BLOCK_BITS > low,
            "{mine} was taken after the raise past block {low}"
        );
        assert!(
            theirs >> BLOCK_BITS > high,
            "{theirs} was taken after the raise past block {high}"
        );
        let after = uniquifiers.take_from(1).expect("blocks ran out");
        assert!(
            after >> BLOCK_BITS > high,
            "{after} was taken after both raises"
        );
        assert_distinct(&[mine, theirs, after]);
    });
}
