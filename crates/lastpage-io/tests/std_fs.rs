//! The real file system through the same interface, in a scratch directory under the target
//! directory (a real disk, unlike a tmpfs `/tmp`).

use std::path::PathBuf;

use lastpage_io::{FileSystem, OpenOptions, StdFileSystem, create_dir_all_durable};

fn scratch_dir(name: &str) -> PathBuf {
    let dir =
        PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

#[test]
fn std_file_system_round_trip() {
    let fs = StdFileSystem::new();
    let dir = scratch_dir("std-fs");
    fs.create_dir_all(&dir).unwrap();
    let path = dir.join("a.bin");
    assert!(!fs.exists(&path).unwrap());
    let file = fs.open(&path, OpenOptions::create_new()).unwrap();
    assert!(fs.open(&path, OpenOptions::create_new()).is_err());
    file.write_all_at(3, b"xyz").unwrap();
    file.sync_data().unwrap();
    fs.sync_dir(&dir).unwrap();
    assert_eq!(file.len().unwrap(), 6);
    let mut buf = [1u8; 10];
    assert_eq!(file.read_at(0, &mut buf).unwrap(), 6);
    assert_eq!(&buf[..6], b"\0\0\0xyz");
    file.set_len(4).unwrap();
    assert_eq!(file.len().unwrap(), 4);
    assert_eq!(fs.link_count(&path).unwrap(), 1);
    std::fs::hard_link(&path, dir.join("c.bin")).unwrap();
    assert_eq!(fs.link_count(&path).unwrap(), 2);
    fs.remove(&dir.join("c.bin")).unwrap();
    fs.rename(&path, &dir.join("b.bin")).unwrap();
    assert_eq!(fs.link_count(&dir.join("b.bin")).unwrap(), 1);
    assert!(fs.link_count(&path).is_err());
    assert_eq!(fs.list_dir(&dir).unwrap(), vec![PathBuf::from("b.bin")]);
    let reopened = fs
        .open(&dir.join("b.bin"), OpenOptions::existing().truncate())
        .unwrap();
    assert!(reopened.is_empty().unwrap());
    fs.remove(&dir.join("b.bin")).unwrap();
    assert!(fs.list_dir(&dir).unwrap().is_empty());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn allocate_reserves_zeros_without_shrinking() {
    let fs = StdFileSystem::new();
    let dir = scratch_dir("std-fs-allocate");
    fs.create_dir_all(&dir).unwrap();
    let file = fs
        .open(&dir.join("a.bin"), OpenOptions::create_new())
        .unwrap();
    file.write_all_at(0, b"keep").unwrap();
    match file.allocate(1 << 20) {
        Ok(()) => {
            assert_eq!(file.len().unwrap(), 1 << 20);
            let mut buf = vec![1u8; 1 << 20];
            file.read_exact_at(0, &mut buf).unwrap();
            assert_eq!(&buf[..4], b"keep", "the written bytes stay");
            assert!(
                buf[4..].iter().all(|&byte| byte == 0),
                "reserved bytes read as zeros"
            );
            // Reserving less than the file holds changes nothing.
            file.allocate(8).unwrap();
            assert_eq!(file.len().unwrap(), 1 << 20);
            file.write_all_at(4096, b"into the reservation").unwrap();
            file.sync_data().unwrap();
            file.read_exact_at(4096, &mut buf[..20]).unwrap();
            assert_eq!(&buf[..20], b"into the reservation");
        }
        // A file system without fallocate says so, and the file is unchanged.
        Err(error) => {
            assert_eq!(error.kind(), std::io::ErrorKind::Unsupported, "{error}");
            assert_eq!(file.len().unwrap(), 4);
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `create_dir_all_durable` makes missing parents too, and syncs real directories (which the
/// operating system must let it open and fsync); a directory that exists already is synced
/// into its parent again.
#[test]
fn directories_are_created_and_synced_into_their_parents() {
    let fs = StdFileSystem::new();
    let top = scratch_dir("std-fs-dirs");
    let dir = top.join("a").join("b");
    create_dir_all_durable(&fs, &dir).unwrap();
    assert!(fs.exists(&dir).unwrap());
    create_dir_all_durable(&fs, &dir).unwrap();
    std::fs::remove_dir_all(&top).unwrap();
}

/// A vectored write lands exactly where the pieces' concatenation would, whatever their sizes
/// (empty ones too, and more than one `pwritev` takes at once), and matches the trait's default
/// (a write per piece) byte for byte.
#[test]
fn a_vectored_write_writes_its_pieces_back_to_back() {
    let fs = StdFileSystem::new();
    let dir = scratch_dir("std-fs-vectored");
    fs.create_dir_all(&dir).unwrap();
    let file = fs
        .open(&dir.join("a.bin"), OpenOptions::create_new())
        .unwrap();
    let pages: Vec<Vec<u8>> = (0..1500u32)
        .map(|index| vec![(index % 251) as u8; [8192, 0, 3, 1][index as usize % 4]])
        .collect();
    let pieces: Vec<&[u8]> = pages.iter().map(Vec::as_slice).collect();
    let expected: Vec<u8> = pieces.concat();
    file.write_all_vectored_at(5, &pieces).unwrap();
    let mut read = vec![0u8; expected.len() + 5];
    assert_eq!(file.read_at(0, &mut read).unwrap(), read.len());
    assert_eq!(&read[..5], &[0u8; 5]);
    assert!(
        read[5..] == expected[..],
        "the vectored write's bytes differ"
    );
    // Only empty pieces, or none: nothing is written.
    file.write_all_vectored_at(1 << 30, &[&[], &[]]).unwrap();
    file.write_all_vectored_at(1 << 30, &[]).unwrap();
    assert_eq!(file.len().unwrap(), read.len() as u64);
    std::fs::remove_dir_all(&dir).unwrap();
}
