//! Unit tests of the fault-injecting file system: what a crash keeps, and each injected fault.
//! Every test prints the seeds it used; a failure can be replayed with the same seed because
//! each test is single-threaded.

use std::io::ErrorKind;
use std::path::{Path, PathBuf};

use lastpage_io::{
    CrashMode, FaultRule, FaultyConfig, FaultyFileSystem, File, FileSystem, OpenOptions, Operation,
    Tear, create_dir_all_durable,
};

fn fs(seed: u64) -> FaultyFileSystem {
    println!("seed {seed}");
    let fs = FaultyFileSystem::new(FaultyConfig::new(seed));
    create_dir_all_durable(&fs, Path::new("/db")).unwrap();
    fs
}

fn path(name: &str) -> PathBuf {
    Path::new("/db").join(name)
}

/// Creates a file with a durable name and durable contents.
fn durable_file(fs: &FaultyFileSystem, name: &str, contents: &[u8]) -> Box<dyn File> {
    let file = fs.open(&path(name), OpenOptions::create()).unwrap();
    file.write_all_at(0, contents).unwrap();
    file.sync_data().unwrap();
    fs.sync_dir(Path::new("/db")).unwrap();
    file
}

fn read_all(fs: &FaultyFileSystem, name: &str) -> Option<Vec<u8>> {
    let file = match fs.open(&path(name), OpenOptions::existing()) {
        Ok(file) => file,
        Err(error) if error.kind() == ErrorKind::NotFound => return None,
        Err(error) => panic!("{error}"),
    };
    let mut bytes = vec![0; file.len().unwrap() as usize];
    file.read_exact_at(0, &mut bytes).unwrap();
    Some(bytes)
}

#[test]
fn reads_are_positional_and_short_at_the_end() {
    let fs = fs(1);
    let file = fs.open(&path("a"), OpenOptions::create()).unwrap();
    file.write_all_at(4, b"tail").unwrap();
    assert_eq!(file.len().unwrap(), 8);
    let mut buf = [9u8; 16];
    assert_eq!(file.read_at(0, &mut buf).unwrap(), 8);
    assert_eq!(&buf[..8], b"\0\0\0\0tail");
    assert_eq!(file.read_at(8, &mut buf).unwrap(), 0);
    assert_eq!(file.read_at(100, &mut buf).unwrap(), 0);
    assert!(file.read_exact_at(6, &mut buf[..4]).is_err());
    file.set_len(2).unwrap();
    assert_eq!(file.len().unwrap(), 2);
    assert_eq!(
        fs.list_dir(Path::new("/db")).unwrap(),
        vec![PathBuf::from("a")]
    );
    assert!(fs.open(&path("a"), OpenOptions::create_new()).is_err());
    assert!(fs.open(&path("b"), OpenOptions::existing()).is_err());
    assert!(
        fs.open(Path::new("/nodir/x"), OpenOptions::create())
            .is_err()
    );
}

#[test]
fn crash_keeps_synced_bytes_and_loses_or_keeps_unsynced_ones_by_mode() {
    let fs = fs(2);
    let file = durable_file(&fs, "log", b"durable!");
    file.write_all_at(8, b"volatile").unwrap();
    assert_eq!(fs.contents(&path("log")).unwrap(), b"durable!volatile");
    assert_eq!(fs.durable_contents(&path("log")).unwrap(), b"durable!");

    let lost = fs.crash_with(CrashMode::LoseUnsynced);
    assert_eq!(read_all(&lost, "log").unwrap(), b"durable!");
    let kept = fs.crash_with(CrashMode::KeepUnsynced);
    assert_eq!(read_all(&kept, "log").unwrap(), b"durable!volatile");

    // The crashed instance and its open files are gone.
    assert!(fs.is_crashed());
    assert!(file.write_all_at(0, b"x").is_err());
    assert!(file.sync_data().is_err());
    assert!(fs.open(&path("log"), OpenOptions::existing()).is_err());
}

#[test]
fn random_crash_loses_applies_or_tears_each_unsynced_write_at_sector_boundaries() {
    let mut outcomes = [0usize; 3];
    for seed in 0..200 {
        let fs = FaultyFileSystem::new(FaultyConfig::new(seed).tear(Tear::Sectors(512)));
        create_dir_all_durable(&fs, Path::new("/db")).unwrap();
        let file = durable_file(&fs, "log", &[]);
        // One write of 2000 bytes at offset 100: sector boundaries inside it at 512, 1024, 1536 and 2048.
        file.write_all_at(100, &[0xAB; 2000]).unwrap();
        let crashed = fs.crash();
        let bytes = read_all(&crashed, "log").unwrap();
        let applied = bytes.iter().filter(|&&b| b == 0xAB).count();
        match applied {
            0 => outcomes[0] += 1,
            2000 => outcomes[1] += 1,
            cut => {
                assert!(
                    [512 - 100, 1024 - 100, 1536 - 100, 2048 - 100].contains(&cut),
                    "seed {seed}: torn at {cut}, not at a sector boundary"
                );
                // A torn write is a prefix.
                assert!(bytes[100..100 + cut].iter().all(|&b| b == 0xAB));
                outcomes[2] += 1;
            }
        }
    }
    println!("lost/applied/torn over 200 seeds: {outcomes:?}");
    assert!(outcomes.iter().all(|&n| n > 20), "{outcomes:?}");
}

#[test]
fn byte_granular_tears_cut_anywhere_and_small_writes_within_a_sector_are_not_torn() {
    let mut cuts = std::collections::BTreeSet::new();
    for seed in 0..300 {
        let fs = FaultyFileSystem::new(FaultyConfig::new(seed).tear(Tear::Bytes));
        create_dir_all_durable(&fs, Path::new("/db")).unwrap();
        let file = durable_file(&fs, "log", &[]);
        file.write_all_at(0, &[7; 10]).unwrap();
        let bytes = read_all(&fs.crash(), "log").unwrap();
        let applied = bytes.iter().filter(|&&b| b == 7).count();
        cuts.insert(applied);
    }
    assert_eq!(
        cuts.len(),
        11,
        "every prefix length 0..=10 occurs: {cuts:?}"
    );

    // With sector tears, a write inside one sector is all or nothing.
    for seed in 0..100 {
        let fs = FaultyFileSystem::new(FaultyConfig::new(seed));
        create_dir_all_durable(&fs, Path::new("/db")).unwrap();
        let file = durable_file(&fs, "log", &[]);
        file.write_all_at(10, &[7; 100]).unwrap();
        let bytes = read_all(&fs.crash(), "log").unwrap();
        let applied = bytes.iter().filter(|&&b| b == 7).count();
        assert!(applied == 0 || applied == 100, "seed {seed}: {applied}");
    }
}

#[test]
fn crashes_are_deterministic_for_a_seed() {
    let run = |seed: u64| {
        let fs = FaultyFileSystem::new(FaultyConfig::new(seed).tear(Tear::Bytes));
        create_dir_all_durable(&fs, Path::new("/db")).unwrap();
        let file = durable_file(&fs, "log", &[]);
        for i in 0..20u8 {
            file.write_all_at(u64::from(i) * 7, &[i + 1; 9]).unwrap();
        }
        read_all(&fs.crash(), "log").unwrap()
    };
    for seed in [3, 99, 12345] {
        println!("seed {seed}");
        assert_eq!(run(seed), run(seed));
    }
    assert_ne!(run(3), run(4));
}

#[test]
fn names_are_durable_only_after_sync_dir() {
    let mut seen = [false; 2];
    for seed in 0..50 {
        let fs = fs(seed);
        durable_file(&fs, "kept", b"k");
        let file = fs.open(&path("new"), OpenOptions::create()).unwrap();
        file.write_all_at(0, b"n").unwrap();
        file.sync_data().unwrap();
        fs.remove(&path("kept")).unwrap();
        let crashed = fs.crash();
        let new_exists = crashed.exists(&path("new")).unwrap();
        seen[usize::from(new_exists)] = true;
        if new_exists {
            assert_eq!(read_all(&crashed, "new").unwrap(), b"n");
        }
        // The removal was not synced either, so "kept" may come back (with its durable bytes).
        if let Some(bytes) = read_all(&crashed, "kept") {
            assert_eq!(bytes, b"k");
        }
        assert!(crashed.exists(Path::new("/db")).unwrap());
    }
    assert_eq!(seen, [true, true]);

    let fs = fs(7);
    let file = fs.open(&path("tmp"), OpenOptions::create()).unwrap();
    file.write_all_at(0, b"v2").unwrap();
    file.sync_data().unwrap();
    fs.rename(&path("tmp"), &path("final")).unwrap();
    fs.sync_dir(Path::new("/db")).unwrap();
    let crashed = fs.crash();
    assert_eq!(read_all(&crashed, "final").unwrap(), b"v2");
    assert!(!crashed.exists(&path("tmp")).unwrap());
    // One of `/`, which made `/db` durable (see `fs`), and one of `/db`.
    assert_eq!(fs.stats().dir_syncs, 2);
}

#[test]
fn failed_sync_returns_an_error_and_may_drop_the_unsynced_writes_for_good() {
    let mut dropped_somewhere = false;
    for seed in 0..40 {
        let fs = fs(seed);
        let file = durable_file(&fs, "log", b"base");
        fs.inject(FaultRule::sync_fails(2).on_path(path("log")));
        file.write_all_at(4, b"AAAA").unwrap();
        file.sync_data().unwrap(); // The first sync after the rule succeeds.
        file.write_all_at(8, b"BBBB").unwrap();
        file.write_all_at(12, b"CCCC").unwrap();
        let error = file.sync_data().unwrap_err();
        assert!(error.to_string().contains("fdatasync"), "{error}");
        // Reads still see the writes (they are in the page cache)...
        assert_eq!(fs.contents(&path("log")).unwrap(), b"baseAAAABBBBCCCC");
        // ...and the next sync succeeds (fsyncgate), but whatever the failed sync dropped is
        // not on disk, even if nothing is lost at the crash.
        file.sync_data().unwrap();
        let durable = read_all(&fs.crash_with(CrashMode::KeepUnsynced), "log").unwrap();
        assert!(durable.starts_with(b"baseAAAA"), "seed {seed}");
        if durable.len() < 16 || durable[8..12] != *b"BBBB" || durable[12..16] != *b"CCCC" {
            dropped_somewhere = true;
        }
        assert_eq!(fs.stats().failed_syncs, 1);
        assert_eq!(fs.stats().syncs, 3);
    }
    assert!(dropped_somewhere);

    // A sticky rule fails every sync from the nth on, and only for its file.
    let fs = fs(1);
    let log = durable_file(&fs, "log", b"x");
    let other = durable_file(&fs, "other", b"y");
    fs.inject(FaultRule::syncs_fail_from(1).on_path(path("log")));
    assert!(log.sync_data().is_err());
    assert!(log.sync_data().is_err());
    other.sync_data().unwrap();
    fs.clear_faults();
    log.sync_data().unwrap();
}

#[test]
fn writes_past_the_budget_fail_with_storage_full_after_writing_what_fits() {
    let fs = fs(5);
    let file = durable_file(&fs, "log", &[]);
    fs.inject(FaultRule::disk_full_after(10));
    file.write_all_at(0, b"123456").unwrap();
    let error = file.write_all_at(6, b"789abc").unwrap_err();
    assert_eq!(error.kind(), ErrorKind::StorageFull);
    assert_eq!(fs.contents(&path("log")).unwrap(), b"123456789a");
    assert_eq!(
        file.write_all_at(0, b"z").unwrap_err().kind(),
        ErrorKind::StorageFull
    );
    let stats = fs.stats();
    assert_eq!(stats.bytes_written, 10);
    assert_eq!(stats.writes, 4, "the durable_file write counts too");
    fs.clear_faults();
    file.write_all_at(0, b"z").unwrap();
}

#[test]
fn allocate_extends_with_zeros_durably_only_after_sync_and_counts_against_the_disk() {
    let fs = fs(9);
    let file = durable_file(&fs, "log", b"0123");
    file.allocate(10).unwrap();
    assert_eq!(file.len().unwrap(), 10);
    assert_eq!(fs.contents(&path("log")).unwrap(), b"0123\0\0\0\0\0\0");
    assert_eq!(
        read_all(&fs.crash_with(CrashMode::LoseUnsynced), "log").unwrap(),
        b"0123",
        "an unsynced reservation may be lost"
    );
    let fs = self::fs(9);
    let file = durable_file(&fs, "log", b"0123");
    file.allocate(10).unwrap();
    // Never shrinks.
    file.allocate(2).unwrap();
    file.sync_data().unwrap();
    assert_eq!(
        read_all(&fs.crash_with(CrashMode::LoseUnsynced), "log").unwrap(),
        b"0123\0\0\0\0\0\0"
    );
    // All or nothing against a disk-full budget: the growth beyond the file's size counts.
    let fs = self::fs(9);
    let file = durable_file(&fs, "log", b"0123");
    fs.inject(FaultRule::disk_full_after(5));
    let error = file.allocate(10).unwrap_err();
    assert_eq!(error.kind(), ErrorKind::StorageFull);
    assert_eq!(
        file.len().unwrap(),
        4,
        "a failed reservation changes nothing"
    );
    file.allocate(9).unwrap();
    assert_eq!(file.len().unwrap(), 9);
}

/// A directory `create_dir_all` made is durable only once its parent is synced: a crash before
/// that keeps it or loses it, and a lost directory takes its files along, synced names and
/// contents included (on a real file system, the files of a directory whose name is lost are
/// unreachable). `create_dir_all_durable` syncs the parents of every directory it made.
#[test]
fn a_new_directory_and_its_files_are_durable_only_once_its_parent_is_synced() {
    let make = |seed: u64, durably: bool| {
        println!("seed {seed}");
        let fs = FaultyFileSystem::new(FaultyConfig::new(seed));
        let dir = Path::new("/srv/db");
        if durably {
            create_dir_all_durable(&fs, dir).unwrap();
        } else {
            fs.create_dir_all(dir).unwrap();
        }
        let file = fs.open(&dir.join("f"), OpenOptions::create()).unwrap();
        file.write_all_at(0, b"durable").unwrap();
        file.sync_data().unwrap();
        fs.sync_dir(dir).unwrap();
        fs
    };
    let kept = |fs: &FaultyFileSystem| {
        let db = fs.exists(Path::new("/srv/db")).unwrap();
        let file = fs.exists(Path::new("/srv/db/f")).unwrap();
        assert_eq!(db, file, "a file outlived its directory, or the reverse");
        assert!(fs.exists(Path::new("/")).unwrap(), "the mount point went");
        db
    };
    assert!(!kept(&make(1, false).crash_with(CrashMode::LoseUnsynced)));
    assert!(kept(&make(1, false).crash_with(CrashMode::KeepUnsynced)));
    let mut seen = [false; 2];
    for seed in 0..32 {
        seen[usize::from(kept(&make(seed, false).crash()))] = true;
        assert!(kept(&make(seed, true).crash()), "seed {seed}");
    }
    assert_eq!(seen, [true, true]);
    // Syncing the directory's parent later makes it durable too, and a second crash keeps it.
    let fs = make(2, false);
    fs.sync_dir(Path::new("/srv")).unwrap();
    fs.sync_dir(Path::new("/")).unwrap();
    let crashed = fs.crash_with(CrashMode::LoseUnsynced);
    assert!(kept(&crashed));
    assert!(kept(&crashed.crash_with(CrashMode::LoseUnsynced)));
    // A relative path's first component is held by the current directory, `.`.
    let fs = FaultyFileSystem::new(FaultyConfig::new(3));
    fs.create_dir_all(Path::new("rel/db")).unwrap();
    fs.sync_dir(Path::new("rel")).unwrap();
    assert!(
        !fs.crash_with(CrashMode::LoseUnsynced)
            .exists(Path::new("rel"))
            .unwrap()
    );
    let fs = FaultyFileSystem::new(FaultyConfig::new(3));
    create_dir_all_durable(&fs, Path::new("rel/db")).unwrap();
    let crashed = fs.crash_with(CrashMode::LoseUnsynced);
    assert!(crashed.exists(Path::new("rel/db")).unwrap());
}

#[test]
fn a_failed_directory_sync_makes_no_name_durable() {
    let fs = fs(12);
    durable_file(&fs, "old", b"x");
    fs.rename(&path("old"), &path("new")).unwrap();
    fs.inject(FaultRule::dir_sync_fails(1).on_path("/db"));
    assert!(fs.sync_dir(Path::new("/db")).is_err());
    let crashed = fs.crash_with(CrashMode::LoseUnsynced);
    assert_eq!(read_all(&crashed, "old").unwrap(), b"x");
    assert!(read_all(&crashed, "new").is_none());
    // Only the nth call fails: the next one makes the rename durable.
    let fs = self::fs(12);
    durable_file(&fs, "old", b"x");
    fs.rename(&path("old"), &path("new")).unwrap();
    fs.inject(FaultRule::dir_sync_fails(1).on_path("/db"));
    assert!(fs.sync_dir(Path::new("/db")).is_err());
    fs.sync_dir(Path::new("/db")).unwrap();
    let crashed = fs.crash_with(CrashMode::LoseUnsynced);
    assert!(read_all(&crashed, "old").is_none());
    assert_eq!(read_all(&crashed, "new").unwrap(), b"x");
}

#[test]
fn reads_fail_when_told_to() {
    let fs = fs(6);
    let file = durable_file(&fs, "data", b"hello");
    fs.inject(FaultRule::read_fails(2));
    let mut buf = [0; 5];
    file.read_exact_at(0, &mut buf).unwrap();
    assert!(file.read_at(0, &mut buf).is_err());
    file.read_exact_at(0, &mut buf).unwrap();
    fs.inject(FaultRule::reads_fail_from(1));
    assert!(file.read_at(0, &mut buf).is_err());
    assert!(file.read_at(0, &mut buf).is_err());
    assert_eq!(fs.stats().reads, 5);
}

#[test]
fn set_len_and_truncate_are_durable_only_after_sync() {
    let fs = fs(8);
    let file = durable_file(&fs, "log", b"0123456789");
    file.set_len(4).unwrap();
    assert_eq!(
        read_all(&fs.crash_with(CrashMode::LoseUnsynced), "log").unwrap(),
        b"0123456789"
    );
    let fs = self::fs(8);
    let file = durable_file(&fs, "log", b"0123456789");
    file.set_len(4).unwrap();
    file.sync_data().unwrap();
    let reopened = fs
        .open(&path("log"), OpenOptions::create().truncate())
        .unwrap();
    assert_eq!(reopened.len().unwrap(), 0);
    assert_eq!(
        read_all(&fs.crash_with(CrashMode::LoseUnsynced), "log").unwrap(),
        b"0123"
    );
}

#[test]
fn a_lock_is_held_by_one_handle_until_it_is_dropped_and_a_crash_releases_it() {
    let fs = fs(40);
    let first = durable_file(&fs, "lock", b"");
    let second = fs.open(&path("lock"), OpenOptions::existing()).unwrap();
    assert!(first.try_lock().unwrap());
    // Asking again through the holder is not a conflict; through another handle it is.
    assert!(first.try_lock().unwrap());
    assert!(!second.try_lock().unwrap());
    drop(first);
    assert!(second.try_lock().unwrap());
    // The process that held the lock is gone after a crash: its file system has no locks.
    let crashed = fs.crash();
    let after = crashed
        .open(&path("lock"), OpenOptions::existing())
        .unwrap();
    assert!(after.try_lock().unwrap());
    drop(second);
}

/// A rename that no directory sync made durable: a crash keeps the old name, the new one,
/// neither or both (each name's state is chosen on its own), and then both are one file, whose
/// `link_count` says so; removing one name leaves the other with the file.
#[test]
fn a_crash_that_keeps_both_names_of_a_rename_leaves_one_file_with_two_names() {
    let mut both = false;
    for seed in 0..40 {
        let fs = fs(seed);
        durable_file(&fs, "old", b"contents");
        assert_eq!(fs.link_count(&path("old")).unwrap(), 1);
        fs.rename(&path("old"), &path("new")).unwrap();
        assert_eq!(fs.link_count(&path("new")).unwrap(), 1);
        assert_eq!(
            fs.link_count(&path("old")).unwrap_err().kind(),
            ErrorKind::NotFound
        );
        let crashed = fs.crash();
        let names: Vec<bool> = ["old", "new"]
            .iter()
            .map(|name| crashed.exists(&path(name)).unwrap())
            .collect();
        if names != [true, true] {
            for name in ["old", "new"] {
                if crashed.exists(&path(name)).unwrap() {
                    assert_eq!(crashed.link_count(&path(name)).unwrap(), 1, "seed {seed}");
                }
            }
            continue;
        }
        both = true;
        assert_eq!(crashed.link_count(&path("old")).unwrap(), 2);
        assert_eq!(crashed.link_count(&path("new")).unwrap(), 2);
        // One file: a write through one name shows through the other.
        let file = crashed.open(&path("new"), OpenOptions::existing()).unwrap();
        file.write_all_at(0, b"C").unwrap();
        assert_eq!(read_all(&crashed, "old").unwrap(), b"Contents");
        crashed.remove(&path("new")).unwrap();
        assert_eq!(crashed.link_count(&path("old")).unwrap(), 1);
    }
    assert!(both, "no seed kept both names");
}

/// Whether `result` failed as an injected `EIO` does: an `Other` error naming the fault, not a
/// full disk (whose handling differs: it may pass, a failed write need not).
fn is_injected_eio<T>(result: std::io::Result<T>) -> bool {
    result.err().is_some_and(|error| {
        let message = error.to_string();
        error.kind() == ErrorKind::Other
            && message.contains("injected fault")
            && message.contains("EIO")
    })
}

/// A write that fails with `EIO` reports an I/O error, not a full disk, and may have written a
/// prefix of its bytes, never all of them: nothing, or a part cut as the configured tears
/// allow (here at any byte), as the seed chooses. What it wrote is unsynced like any write:
/// reads see it, and a crash may lose it. Only the nth write fails, and only on its file.
#[test]
fn a_write_that_fails_with_eio_writes_a_prefix_or_nothing() {
    let mut outcomes = [0usize; 2];
    for seed in 0..60 {
        println!("seed {seed}");
        let fs = FaultyFileSystem::new(FaultyConfig::new(seed).tear(Tear::Bytes));
        create_dir_all_durable(&fs, Path::new("/db")).unwrap();
        let file = durable_file(&fs, "log", b"base");
        let other = durable_file(&fs, "other", b"");
        fs.inject(FaultRule::fails(Operation::Write, 2).on_path(path("log")));
        file.write_all_at(4, b"first").unwrap();
        other.write_all_at(0, b"not counted").unwrap();
        assert!(
            is_injected_eio(file.write_all_at(9, b"second")),
            "seed {seed}"
        );
        let contents = fs.contents(&path("log")).unwrap();
        let written = contents.len() - 9;
        assert!(
            written < 6,
            "seed {seed}: the whole failed write was applied"
        );
        assert_eq!(contents, b"basefirstsecond"[..9 + written], "seed {seed}");
        outcomes[usize::from(written > 0)] += 1;
        // The next write succeeds again.
        file.write_all_at(0, b"B").unwrap();
        assert_eq!(fs.stats().injected_failures, 1);
        assert_eq!(
            read_all(&fs.crash_with(CrashMode::LoseUnsynced), "log").unwrap(),
            b"base"
        );
    }
    println!("nothing/prefix written over 60 seeds: {outcomes:?}");
    assert!(outcomes.iter().all(|&n| n > 5), "{outcomes:?}");

    // With sector tears a failed write inside one sector writes nothing; a sticky rule fails
    // every write from the nth on.
    let fs = fs(3);
    let file = durable_file(&fs, "log", b"");
    fs.inject(FaultRule::fails_from(Operation::Write, 1));
    for _ in 0..10 {
        assert!(is_injected_eio(file.write_all_at(10, &[1; 100])));
    }
    assert_eq!(fs.contents(&path("log")).unwrap(), b"");
}

/// Each call on names, lengths, locks and directories fails when a rule says so, with an `EIO`
/// that names the fault, and changes nothing: the file system is as it was before the call, and
/// the same call succeeds next time.
#[test]
fn name_length_and_directory_calls_fail_when_told_to_and_change_nothing() {
    let fs = fs(21);
    let file = durable_file(&fs, "a", b"0123456789");
    let calls: [(Operation, &dyn Fn() -> std::io::Result<()>); 12] = [
        (Operation::Open, &|| {
            fs.open(&path("a"), OpenOptions::create().truncate())
                .map(drop)
        }),
        (Operation::Remove, &|| fs.remove(&path("a"))),
        (Operation::Rename, &|| fs.rename(&path("a"), &path("b"))),
        (Operation::SetLen, &|| file.set_len(3)),
        (Operation::Allocate, &|| file.allocate(100)),
        (Operation::CreateDir, &|| {
            fs.create_dir_all(Path::new("/db/sub/dir"))
        }),
        (Operation::SyncDir, &|| fs.sync_dir(Path::new("/db"))),
        (Operation::Len, &|| file.len().map(drop)),
        (Operation::Lock, &|| file.try_lock().map(drop)),
        (Operation::Exists, &|| fs.exists(&path("a")).map(drop)),
        (Operation::LinkCount, &|| {
            fs.link_count(&path("a")).map(drop)
        }),
        (Operation::ListDir, &|| {
            fs.list_dir(Path::new("/db")).map(drop)
        }),
    ];
    for (operation, call) in calls {
        fs.inject(FaultRule::fails(operation, 1));
        assert!(is_injected_eio(call()), "{operation:?}");
        assert_eq!(
            fs.contents(&path("a")).unwrap(),
            b"0123456789",
            "{operation:?}"
        );
        assert!(!fs.exists(&path("b")).unwrap(), "{operation:?}");
        assert!(!fs.exists(Path::new("/db/sub")).unwrap(), "{operation:?}");
        fs.clear_faults();
    }
    assert_eq!(fs.stats().injected_failures, 12);
    // The failed lock was not taken: another handle takes it.
    let other = fs.open(&path("a"), OpenOptions::existing()).unwrap();
    assert!(other.try_lock().unwrap());
    drop(other);
    // The failed directory sync made nothing durable; the calls succeed without the rules.
    fs.create_dir_all(Path::new("/db/sub/dir")).unwrap();
    fs.rename(&path("a"), &path("b")).unwrap();
    fs.inject(FaultRule::fails(Operation::SyncDir, 1).on_path("/db"));
    assert!(is_injected_eio(fs.sync_dir(Path::new("/db"))));
    let crashed = fs.crash_with(CrashMode::LoseUnsynced);
    assert!(crashed.exists(&path("a")).unwrap());
    assert!(!crashed.exists(&path("b")).unwrap());
    assert!(!crashed.exists(Path::new("/db/sub")).unwrap());
}

/// A rule can be kept to a directory and everything under it (by path components: `/db/wal`
/// holds `/db/wal/x`, not `/db/walrus`), matches either name of a rename, and counts only the
/// calls it applies to.
#[test]
fn rules_under_a_directory_fail_only_the_calls_on_paths_under_it() {
    let fs = fs(22);
    fs.create_dir_all(Path::new("/db/wal")).unwrap();
    fs.inject(FaultRule::fails_from(Operation::Open, 2).under("/db/wal"));
    fs.open(&path("walrus"), OpenOptions::create()).unwrap();
    fs.open(&path("data"), OpenOptions::create()).unwrap();
    fs.open(Path::new("/db/wal/1.wal"), OpenOptions::create())
        .unwrap();
    for name in ["/db/wal/2.wal", "/db/wal/1.wal"] {
        assert!(is_injected_eio(
            fs.open(Path::new(name), OpenOptions::create())
        ));
    }
    assert!(!fs.exists(Path::new("/db/wal/2.wal")).unwrap());
    fs.open(&path("data"), OpenOptions::existing()).unwrap();

    fs.inject(FaultRule::fails(Operation::Rename, 1).under("/db/wal"));
    // Into the directory: the new name is under it.
    assert!(is_injected_eio(
        fs.rename(&path("walrus"), Path::new("/db/wal/3.wal"))
    ));
    assert!(fs.exists(&path("walrus")).unwrap());
    fs.rename(&path("walrus"), Path::new("/db/wal/3.wal"))
        .unwrap();
    assert_eq!(fs.stats().injected_failures, 3);
}
