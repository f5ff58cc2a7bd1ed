//! OPTIMIZE_FOR_SEQUENTIAL_KEY flow control: never more workers inside than its capacity,
//! nobody left behind, switchable at run time, and waits recorded as BTREE_INSERT_FLOW_CONTROL.

use std::sync::atomic::{AtomicUsize, Ordering};

use lastpage_storage::btree::flow_control::FlowControl;
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
