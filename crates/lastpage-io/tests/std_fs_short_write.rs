//! A `pwritev` that the kernel cuts short part-way through a piece: the real file system's
//! vectored write must go on from the exact byte where the kernel stopped, and report the
//! failure that stops it for good. The file-size limit (`RLIMIT_FSIZE`) makes the kernel cut the
//! write; it applies to the whole process, so this test has a binary of its own, and it puts
//! the limit back before anything is printed (the harness's output may go to a file larger than
//! the limit).

use std::path::PathBuf;

use lastpage_io::{FileSystem, OpenOptions, StdFileSystem};

const PAGE_BYTES: usize = 8192;
/// Three pages and part of the fourth fit under the limit.
const LIMIT_BYTES: u64 = 3 * PAGE_BYTES as u64 + 1000;

#[test]
fn a_short_vectored_write_goes_on_mid_piece_and_reports_the_limit() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("std-fs-short-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let fs = StdFileSystem::new();
    fs.create_dir_all(&dir).unwrap();
    let file = fs
        .open(&dir.join("a.bin"), OpenOptions::create_new())
        .unwrap();
    let pages: Vec<Vec<u8>> = (1..=5u8).map(|byte| vec![byte; PAGE_BYTES]).collect();
    let pieces: Vec<&[u8]> = pages.iter().map(Vec::as_slice).collect();

    let mut old = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `getrlimit` and `setrlimit` only read and write the `rlimit` passed, which lives
    // on this stack frame; `signal` installs the "ignore" disposition, which runs no code of
    // ours. Ignoring SIGXFSZ makes a write past the limit fail with EFBIG instead of killing
    // the process (the test binary runs only this test, so nothing else depends on it).
    let result = unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_FSIZE, &mut old), 0);
        libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
        let limited = libc::rlimit {
            rlim_cur: LIMIT_BYTES,
            rlim_max: old.rlim_max,
        };
        assert_eq!(libc::setrlimit(libc::RLIMIT_FSIZE, &limited), 0);
        let result = file.write_all_vectored_at(0, &pieces);
        assert_eq!(libc::setrlimit(libc::RLIMIT_FSIZE, &old), 0);
        result
    };

    // The first call wrote up to the limit, 1,000 bytes into the fourth piece; the next one,
    // from there, failed.
    let error = result.expect_err("a write past the file-size limit succeeded");
    assert_eq!(error.raw_os_error(), Some(libc::EFBIG), "{error}");
    assert_eq!(file.len().unwrap(), LIMIT_BYTES);
    let mut read = vec![0u8; LIMIT_BYTES as usize];
    assert_eq!(file.read_at(0, &mut read).unwrap(), read.len());
    let expected = pieces.concat();
    assert!(
        read[..] == expected[..LIMIT_BYTES as usize],
        "the bytes written before the limit differ"
    );
    // With the limit gone, the same write completes.
    file.write_all_vectored_at(0, &pieces).unwrap();
    assert_eq!(file.len().unwrap(), expected.len() as u64);
    std::fs::remove_dir_all(&dir).unwrap();
}
