//! What a loader asks of the operating system about a weights file: whether a range of it is
//! in the page cache ([`resident`]), a second descriptor of it for direct I/O
//! ([`open_direct`]), and the aligned read that direct I/O takes ([`read_direct`]).
//!
//! A cached range is best read through the page cache (a copy from memory); a range that is
//! not is best read with `O_DIRECT` (straight from the disk into the caller's buffer, large
//! requests, no page-cache copy and no readahead guessing).

use std::fs::File;
use std::io;
use std::os::fd::AsFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};

use crate::backend::PAGE;
use crate::error::Result;

/// Whether all of `len` bytes of `file` at `offset` are in the page cache. Starts no I/O.
pub fn resident(file: &File, offset: u64, len: usize) -> Result<bool> {
    crate::sys::resident(file.as_fd(), offset, len)
}

/// A new descriptor of the same open file, for direct I/O (`O_DIRECT`, through
/// `/proc/self/fd`: the same inode, whatever its path has become). `Err` where the file
/// system refuses direct I/O (`EINVAL`, e.g. tmpfs before Linux 6.6) or `/proc` is missing.
pub fn open_direct(file: &File) -> io::Result<File> {
    use std::os::fd::AsRawFd;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(format!("/proc/self/fd/{}", file.as_raw_fd()))
}

/// Reads `len` bytes of `file` (opened by [`open_direct`]) at `offset` into `buf` (page-aligned
/// and a multiple of [`PAGE`] long, as a staged writer's buffers are), reading whole aligned
/// pages from the page boundary at or before `offset`: the wanted bytes start at the returned
/// `skip`. `InvalidInput` if `buf` is too short or misaligned; `UnexpectedEof` if the file
/// ends first.
pub fn read_direct(file: &File, buf: &mut [u8], offset: u64, len: usize) -> io::Result<usize> {
    let page = PAGE as u64;
    let start = offset - offset % page;
    let skip = (offset - start) as usize;
    let want = (skip + len).div_ceil(PAGE) * PAGE;
    if want > buf.len() || !(buf.as_ptr() as usize).is_multiple_of(PAGE) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "a direct read of {want} bytes needs a page-aligned buffer that long (have {} \
                 bytes at {:p})",
                buf.len(),
                buf.as_ptr()
            ),
        ));
    }
    let mut got = 0;
    while got < skip + len {
        match file.read_at(&mut buf[got..want], start + got as u64) {
            Ok(0) => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("the file ends at byte {}", start + got as u64),
                ));
            }
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(skip)
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;
    use crate::test_util::random_bytes;

    /// A page-aligned buffer of `pages` pages.
    fn aligned(pages: usize) -> (Vec<u8>, usize) {
        let v = vec![0u8; (pages + 1) * PAGE];
        let at = v.as_ptr().align_offset(PAGE);
        (v, at)
    }

    #[test]
    fn a_written_file_is_resident_and_dropping_it_makes_it_not() {
        let data = random_bytes(64 * PAGE + 123, 5);
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(&data).unwrap();
        f.as_file().sync_all().unwrap();
        let file = f.as_file();
        assert!(resident(file, 0, data.len()).unwrap());
        assert!(resident(file, 7, 100).unwrap());
        assert!(resident(file, 0, 0).unwrap());
        rustix::fs::fadvise(file, 0, None, rustix::fs::Advice::DontNeed).unwrap();
        // Some file systems (tmpfs, overlays of it) keep the pages: then nothing to check.
        if !resident(file, 0, data.len()).unwrap() {
            let mut back = vec![0u8; 10];
            file.read_exact_at(&mut back, 5 * PAGE as u64).unwrap();
            assert!(
                resident(file, 5 * PAGE as u64, 10).unwrap(),
                "a read caches its page"
            );
        }
    }

    #[test]
    fn direct_reads_return_the_bytes_at_any_offset() {
        let data = random_bytes(40 * PAGE + 77, 9);
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(&data).unwrap();
        f.as_file().sync_all().unwrap();
        let Ok(direct) = open_direct(f.as_file()) else {
            eprintln!("no O_DIRECT on this file system: skipped");
            return;
        };
        let (mut v, at) = aligned(9);
        let buf = &mut v[at..at + 9 * PAGE];
        for (offset, len) in [
            (0, PAGE),
            (1, 100),
            (PAGE - 1, 2 * PAGE),
            (13 * PAGE + 5, 8 * PAGE - 5),
        ] {
            let skip = read_direct(&direct, buf, offset as u64, len).unwrap();
            assert_eq!(skip, offset % PAGE);
            assert_eq!(
                &buf[skip..skip + len],
                &data[offset..offset + len],
                "at {offset}"
            );
        }
        // The last bytes of the file, its end unaligned.
        let tail = data.len() - 1000;
        let skip = read_direct(&direct, buf, tail as u64, 1000).unwrap();
        assert_eq!(&buf[skip..skip + 1000], &data[tail..]);
        let e = read_direct(&direct, buf, tail as u64, 1001).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
        let e = read_direct(&direct, buf, 1, 9 * PAGE).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        let e = read_direct(&direct, &mut v[at + 1..at + 1 + PAGE], 0, 10).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
    }
}
