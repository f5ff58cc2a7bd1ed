//! What transactions count in the statistics: the log writer's commits (the numerator of
//! commits per fdatasync), and the WRITELOG waits of the session that waits for the log.

use lastpage_engine::{Database, Durability, InsertRow, WaitType};
use lastpage_io::{FaultyConfig, FaultyFileSystem};

mod common;

use common::{DIR, accounts, options, options_without_background_flush};

/// `WalStats::commits` is "transactions committed" in every figure built on it (commits per
/// fdatasync): a rolled-back transaction waits for its abort record like a commit (WRITELOG),
/// but is no commit. Before, each FULL rollback counted as one.
#[test]
fn rollbacks_are_not_counted_as_commits_but_still_wait_for_the_log() {
    let fs = FaultyFileSystem::new(FaultyConfig::new(7));
    // No background flush in practice: every wait below flushes for itself.
    let db = Database::open(DIR, options_without_background_flush(&fs)).unwrap();
    let table = db.create_table(accounts()).unwrap();
    let session = db.session();
    let commits_before = db.wal_stats().unwrap().commits;
    let writelog_before = session.waits().wait(WaitType::WriteLog).waiting_tasks_count;
    for id in 0..6 {
        session.begin().unwrap();
        table
            .insert(&session, InsertRow::new().set(0, id).set(1, 0))
            .unwrap();
        if id % 2 == 0 {
            session.commit().unwrap();
        } else {
            session.rollback().unwrap();
        }
    }
    // A DELAYED rollback waits for nothing, and counts for nothing.
    session.begin_with(Durability::Delayed).unwrap();
    table
        .insert(&session, InsertRow::new().set(0, 100).set(1, 0))
        .unwrap();
    session.rollback().unwrap();
    let commits = db.wal_stats().unwrap().commits - commits_before;
    let writelog = session.waits().wait(WaitType::WriteLog).waiting_tasks_count - writelog_before;
    assert_eq!(commits, 3, "three transactions committed, four rolled back");
    assert_eq!(
        writelog, 6,
        "every FULL commit and FULL rollback waits for its record (WRITELOG)"
    );
    assert_eq!(common::rows(&table, &session).len(), 3);
}

/// Schema changes wait for their record too, but are no commits: dropping a table and
/// changing an index's options leave `WalStats::commits` alone (before, each counted one).
#[test]
fn schema_changes_are_not_counted_as_commits() {
    let fs = FaultyFileSystem::new(FaultyConfig::new(9));
    let db = Database::open(DIR, options(&fs)).unwrap();
    let table = db.create_table(accounts()).unwrap();
    let session = db.session();
    let commits_before = db.wal_stats().unwrap().commits;
    table
        .set_optimize_for_sequential_key(&session, "PK_Accounts", true)
        .unwrap();
    drop(table);
    db.drop_table("Accounts").unwrap();
    assert_eq!(db.wal_stats().unwrap().commits, commits_before);
}
