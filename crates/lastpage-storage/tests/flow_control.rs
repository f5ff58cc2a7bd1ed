//! OPTIMIZE_FOR_SEQUENTIAL_KEY flow control: never more workers inside than its capacity,
//! nobody left behind, switchable at run time, and waits recorded as BTREE_INSERT_FLOW_CONTROL.

use std::sync::atomic::{AtomicUsize, Ordering};

use std::sync::Arc;
use std::time::{Duration, Instant};

use lastpage_storage::btree::flow_control::FlowControl;
use lastpage_storage::btree::{BTree, InsertPath, TreeOptions};
use lastpage_storage::buffer::BufferPool;
use lastpage_storage::stats::{self, WaitType};

#[test]
fn admission_is_bounded_and_every_waiter_gets_in() {
    let flow = FlowControl::new(2, true);
    let inside = AtomicUsize::new(0);
    let most_inside = AtomicUsize::new(0);
    let before = stats::snapshot()
        .wait(WaitType::BtreeInsertFlowControl)
        .waiting_tasks_count;
    // All threads start together, and a worker gives up the processor while it is inside, so
    // that others arrive while both places are taken even on a 2-core machine (where only two
    // threads run at once, exactly the capacity) and however slowly threads are started.
    let start = std::sync::Barrier::new(64);
    std::thread::scope(|scope| {
        for thread in 0..64 {
            let (flow, inside, most_inside, start) = (&flow, &inside, &most_inside, &start);
            scope.spawn(move || {
                start.wait();
                for round in 0..200 {
                    let ticket = flow.enter((thread + round) % 3 != 0);
                    assert!(ticket.is_some());
                    let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                    most_inside.fetch_max(now, Ordering::SeqCst);
                    std::thread::yield_now();
                    inside.fetch_sub(1, Ordering::SeqCst);
                    drop(ticket);
                }
            });
        }
    });
    assert!(most_inside.load(Ordering::SeqCst) <= 2);
    assert_eq!(flow.admitted(), 0, "every worker left");
    let after = stats::snapshot()
        .wait(WaitType::BtreeInsertFlowControl)
        .waiting_tasks_count;
    assert!(after > before, "64 threads on 2 places must have waited");
}

#[test]
fn switched_off_it_admits_everyone_and_switched_on_again_it_bounds_again() {
    let flow = FlowControl::new(1, false);
    let first = flow.enter(true);
    let second = flow.enter(true);
    assert!(
        first.is_none() && second.is_none(),
        "off: no tickets, no waiting"
    );
    flow.set_enabled(true);
    let ticket = flow.enter(true).expect("on: a ticket");
    assert_eq!(flow.admitted(), 1);
    std::thread::scope(|scope| {
        let waiter = scope.spawn(|| flow.enter(false).map(|_| ()));
        while stats::snapshot()
            .wait(WaitType::BtreeInsertFlowControl)
            .waiting_tasks_count
            == 0
        {
            std::thread::yield_now();
        }
        drop(ticket);
        assert!(waiter.join().unwrap().is_some());
    });
    assert_eq!(flow.admitted(), 0);
}

/// The preference for likely-fast workers delays a slow one (whose last write split a page) by
/// at most `FLOW_CONTROL_FAST_HANDOFFS_MAX` hand-offs while fast ones keep coming; unbounded,
/// one place and four fast workers let the slow one in only once they stopped.
#[test]
fn a_slow_worker_gets_in_while_fast_ones_keep_coming() {
    use std::sync::atomic::{AtomicBool, AtomicU64};
    use std::time::{Duration, Instant};

    use lastpage_storage::limits::FLOW_CONTROL_FAST_HANDOFFS_MAX;

    let flow = FlowControl::new(1, true);
    let slow_inside = AtomicBool::new(false);
    let fast_entries = AtomicU64::new(0);
    let fast_entries_while_slow_waited = std::thread::scope(|scope| {
        for _ in 0..4 {
            scope.spawn(|| {
                let deadline = Instant::now() + Duration::from_secs(10);
                while !slow_inside.load(Ordering::SeqCst) && Instant::now() < deadline {
                    let ticket = flow.enter(true);
                    fast_entries.fetch_add(1, Ordering::SeqCst);
                    std::thread::sleep(Duration::from_micros(50));
                    drop(ticket);
                }
            });
        }
        // Let the fast workers fill the place and the queue first.
        while fast_entries.load(Ordering::SeqCst) < 100 {
            std::thread::yield_now();
        }
        // The slow worker queues on its own thread; entries are counted from the moment it is
        // seen queued, so however long any thread is descheduled, only hand-offs made while
        // it waited are counted.
        let slow = scope.spawn(|| {
            let ticket = flow.enter(false);
            let after = fast_entries.load(Ordering::SeqCst);
            slow_inside.store(true, Ordering::SeqCst);
            drop(ticket);
            after
        });
        while flow.slow_waiters() == 0 && !slow.is_finished() {
            std::thread::yield_now();
        }
        let before = fast_entries.load(Ordering::SeqCst);
        slow.join().unwrap().saturating_sub(before)
    });
    // The bounded run of hand-offs past the slow waiter, plus the one worker that may have
    // been inside, not yet counted, when the slow one was seen queued, and some slack (the
    // unbounded preference let tens of thousands in).
    let bound = (FLOW_CONTROL_FAST_HANDOFFS_MAX + 4) as u64;
    assert!(
        fast_entries_while_slow_waited <= bound,
        "{fast_entries_while_slow_waited} fast workers got in while the slow one waited"
    );
}

/// A batch passes flow control like a single insert: with every place taken it queues, and it
/// goes in once a place is free. Before, a batch whose rows fit on the leaf never asked.
#[test]
fn a_batch_waits_for_a_place_like_a_single_insert() {
    let tree = BTree::create(
        Arc::new(BufferPool::new()),
        1,
        TreeOptions {
            insert_path: InsertPath::Classic,
            optimize_for_sequential_key: true,
            ..TreeOptions::default()
        },
    )
    .unwrap();
    let flow = tree.flow_control();
    let places: Vec<_> = (0..flow.capacity())
        .map(|_| flow.enter(true).expect("flow control is on"))
        .collect();
    let keys: Vec<[u8; 8]> = (0..3u64).map(u64::to_be_bytes).collect();
    let entries: Vec<(&[u8], &[u8])> = keys.iter().map(|key| (&key[..], &b"v"[..])).collect();
    std::thread::scope(|scope| {
        let batch = scope.spawn(|| tree.insert_batch(&entries));
        // A bounded poll, not a timing assertion: the batch must queue, however long it takes.
        let deadline = Instant::now() + Duration::from_secs(20);
        while flow.waiters() == 0 && !batch.is_finished() {
            assert!(
                Instant::now() < deadline,
                "the batch neither queued nor finished"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(
            !batch.is_finished() && flow.waiters() == 1,
            "a batch went past flow control while every place was taken"
        );
        drop(places);
        let results = batch.join().unwrap();
        assert!(results.iter().all(Result::is_ok), "{results:?}");
    });
    for key in &keys {
        assert_eq!(tree.get(key).unwrap().as_deref(), Some(&b"v"[..]));
    }
    assert_eq!(flow.admitted(), 0);
}
