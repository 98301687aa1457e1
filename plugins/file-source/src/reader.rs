//! Line-aligned reading of one byte-range split.
//!
//! # Which split owns which line
//!
//! A *line start* is offset 0, and every offset `p < file_len` with `byte[p - 1] == b'\n'`.
//! A line runs from its start through the next `\n` (inclusive) or to the end of the file.
//! **A split `[start, end)` owns exactly the lines whose start lies in `[start, end)`.**
//! Because the ranges of a file's splits partition `[0, file_len)`, every line has exactly
//! one owning split, whatever the split count (Hadoop's `LineRecordReader` rule).
//!
//! A reader finds the first owned line without coordination: for `start == 0` it is the
//! line at 0; for `start > 0` it is the smallest line start `>= start`, i.e. the byte after
//! the first `\n` at an offset `>= start - 1` (or end of file if there is none). It then
//! reads whole lines — the last one may run past `end` — and stops at the first line start
//! `>= end`.
//!
//! # Records and cursors
//!
//! - A line's record is its bytes without the trailing `\n` and without one `\r` before it
//!   (CRLF files read like LF files).
//! - **Empty lines** (after stripping) are owned and consumed but produce no record.
//! - With `header`, the line at offset 0 is skipped; the split holding offset 0 owns it.
//! - A cursor is the exclusive next position (design §6.4): the start offset of the first
//!   owned line not yet returned. An absent cursor means the split's `start`, aligned as
//!   above; aligning a line start is a no-op, so any returned cursor resumes exactly.
//! - The split is finished when the cursor is `>= end`.

use std::io::{self, BufRead, BufReader, Read, Seek, SeekFrom};

use crate::split::SplitDescriptor;

/// Result of one [`LineReader::read`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadStep {
    /// Exclusive next cursor: start offset of the first owned line not returned.
    pub next: u64,
    /// No owned line remains at or after `next`.
    pub finished: bool,
    /// Number of records emitted.
    pub records: u32,
}

/// A buffered reader over one file that remembers its byte position, so consecutive reads
/// of a split never seek.
#[derive(Debug)]
pub struct LineReader<R> {
    inner: BufReader<R>,
    /// Byte offset of `inner`'s logical position.
    pos: u64,
    /// `pos` is known to be a line start (`pos > 0` and `byte[pos - 1] == b'\n'`, or end of
    /// file reached by reading).
    at_line_start: bool,
    line: Vec<u8>,
}

/// Buffer size of the reader: 64 KiB.
pub const BUFFER_BYTES: usize = 64 * 1024;

impl<R: Read + Seek> LineReader<R> {
    /// Wraps `inner`, which must be positioned at offset 0, with a [`BUFFER_BYTES`] buffer.
    pub fn new(inner: R) -> Self {
        Self::with_capacity(BUFFER_BYTES, inner)
    }

    /// [`LineReader::new`] with a buffer of `capacity` bytes (at least 1 is used). Lines
    /// longer than the buffer are read whole, through a second buffer.
    pub fn with_capacity(capacity: usize, inner: R) -> Self {
        Self {
            inner: BufReader::with_capacity(capacity.max(1), inner),
            pos: 0,
            at_line_start: false,
            line: Vec::new(),
        }
    }

    fn seek_to(&mut self, p: u64) -> io::Result<()> {
        if p != self.pos {
            let delta = i128::from(p) - i128::from(self.pos);
            match i64::try_from(delta) {
                // Keeps the buffer when the target lies inside it.
                Ok(d) => self.inner.seek_relative(d)?,
                Err(_) => {
                    self.inner.seek(SeekFrom::Start(p))?;
                }
            }
            self.pos = p;
            self.at_line_start = false;
        }
        Ok(())
    }

    /// Consumes through the next `\n` (or to end of file); returns the bytes consumed.
    fn skip_line(&mut self) -> io::Result<u64> {
        let n = self.inner.skip_until(b'\n')? as u64;
        self.pos += n;
        self.at_line_start = true;
        Ok(n)
    }

    /// Smallest line start `>= p`, honouring the header; leaves the reader positioned there.
    fn align(&mut self, p: u64, header: bool) -> io::Result<u64> {
        if p == 0 {
            self.seek_to(0)?;
            if header {
                self.skip_line()?;
            }
        } else if !(self.pos == p && self.at_line_start) {
            self.seek_to(p - 1)?;
            self.skip_line()?;
        }
        Ok(self.pos)
    }

    /// Reads up to `max` records of the split `d` from `cursor` (`None`: the split's
    /// start), handing each to `emit`.
    ///
    /// # Errors
    /// I/O errors; a cursor before the split's start or past the file; the file ended
    /// before `d.end` (it shrank since discovery).
    pub fn read(
        &mut self,
        d: &SplitDescriptor,
        cursor: Option<u64>,
        max: u32,
        mut emit: impl FnMut(&[u8]),
    ) -> io::Result<ReadStep> {
        self.read_records(d, cursor, max, |_, line| {
            emit(line);
            true
        })
    }

    /// [`LineReader::read`], handing `emit` each record with the byte offset of its line
    /// start. If `emit` returns `false` the record is not counted as returned and reading
    /// stops there: the step's `next` is that line's start (so a retry reads it again) and
    /// `finished` is `false`. Line ownership and cursors are otherwise exactly as in
    /// [`LineReader::read`].
    ///
    /// # Errors
    /// As [`LineReader::read`].
    pub fn read_records(
        &mut self,
        d: &SplitDescriptor,
        cursor: Option<u64>,
        max: u32,
        mut emit: impl FnMut(u64, &[u8]) -> bool,
    ) -> io::Result<ReadStep> {
        let from = cursor.unwrap_or(d.start);
        if from < d.start || from > d.file_len {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "cursor {from} outside split [{}, {}) of {} ({} bytes)",
                    d.start, d.end, d.path, d.file_len
                ),
            ));
        }
        let mut p = self.align(from, d.header)?;
        let mut records = 0;
        while records < max && p < d.end {
            let line_start = p;
            // A line inside the buffer is handed over in place; one that runs past the
            // buffer's end (or a last line without `\n`) is gathered in `self.line`.
            let buf = self.inner.fill_buf()?;
            let (n, handed) = match memchr::memchr(b'\n', buf) {
                Some(i) => {
                    let handed = hand_over(&buf[..i], line_start, &mut emit);
                    self.inner.consume(i + 1);
                    (i + 1, handed)
                }
                None => {
                    self.line.clear();
                    let n = self.inner.read_until(b'\n', &mut self.line)?;
                    if n == 0 {
                        return Err(io::Error::new(
                            io::ErrorKind::UnexpectedEof,
                            format!(
                                "{} ended at byte {p}, before the split end {}; was it truncated?",
                                d.path, d.end
                            ),
                        ));
                    }
                    let line = self.line.strip_suffix(b"\n").unwrap_or(&self.line);
                    (n, hand_over(line, line_start, &mut emit))
                }
            };
            p += n as u64;
            self.pos = p;
            self.at_line_start = true;
            match handed {
                Handed::Taken => records += 1,
                Handed::Refused => {
                    return Ok(ReadStep {
                        next: line_start,
                        finished: false,
                        records,
                    });
                }
                Handed::Empty => {}
            }
        }
        Ok(ReadStep {
            next: p,
            finished: p >= d.end,
            records,
        })
    }
}

/// What became of one line handed to a reader's `emit`.
enum Handed {
    /// Empty after stripping: consumed, no record.
    Empty,
    /// `emit` took the record.
    Taken,
    /// `emit` refused it: reading stops before the line.
    Refused,
}

/// Strips one `\r` from `line` (its `\n` already gone) and hands a non-empty record to
/// `emit`.
#[inline]
fn hand_over(line: &[u8], at: u64, emit: &mut impl FnMut(u64, &[u8]) -> bool) -> Handed {
    let record = line.strip_suffix(b"\r").unwrap_or(line);
    if record.is_empty() {
        Handed::Empty
    } else if emit(at, record) {
        Handed::Taken
    } else {
        Handed::Refused
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Cursor, Write};

    use super::*;
    use crate::split::byte_ranges;

    /// The records a whole-file read must produce.
    fn expected(content: &[u8], header: bool) -> Vec<Vec<u8>> {
        let mut lines: Vec<&[u8]> = content.split(|b| *b == b'\n').collect();
        // The segment after the last '\n' is a line only if non-empty.
        if lines.last().is_some_and(|l| l.is_empty()) {
            lines.pop();
        }
        if header && !lines.is_empty() {
            lines.remove(0);
        }
        lines
            .into_iter()
            .map(|l| l.strip_suffix(b"\r").unwrap_or(l).to_vec())
            .filter(|l| !l.is_empty())
            .collect()
    }

    fn descriptors(len: u64, n: u32, header: bool) -> Vec<SplitDescriptor> {
        byte_ranges(len, n)
            .into_iter()
            .map(|(start, end)| SplitDescriptor {
                path: "t".into(),
                start,
                end,
                file_len: len,
                header,
            })
            .collect()
    }

    /// Reads every split to the end in chunks of `max`, restarting from each returned
    /// cursor; with `fresh` a new reader is used for every call (an instance dropped
    /// between calls).
    fn read_all(
        content: &[u8],
        n: u32,
        max: u32,
        header: bool,
        fresh: bool,
        capacity: usize,
    ) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        let new = || LineReader::with_capacity(capacity, Cursor::new(content.to_vec()));
        let mut reader = new();
        for d in descriptors(content.len() as u64, n, header) {
            let mut cursor = None;
            let mut calls = 0;
            loop {
                if fresh {
                    reader = new();
                }
                let step = reader
                    .read(&d, cursor, max, |l| out.push(l.to_vec()))
                    .unwrap();
                assert!(step.records <= max);
                if let Some(c) = cursor {
                    assert!(step.next >= c, "cursor moved backwards");
                }
                cursor = Some(step.next);
                calls += 1;
                assert!(calls < 100_000);
                if step.finished {
                    break;
                }
            }
        }
        out
    }

    fn check(content: &[u8]) {
        for header in [false, true] {
            let want = expected(content, header);
            for n in 1..=7 {
                for max in [1, 3, 1000] {
                    for fresh in [false, true] {
                        // Small buffers put lines and `\r\n` pairs across buffer ends.
                        for capacity in [1, 2, 3, 5, BUFFER_BYTES] {
                            let got = read_all(content, n, max, header, fresh, capacity);
                            assert_eq!(
                                got,
                                want,
                                "content {:?}, splits {n}, max {max}, header {header}, \
                                 buffer {capacity}",
                                String::from_utf8_lossy(content)
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn every_line_is_read_exactly_once_for_fixed_shapes() {
        for content in [
            &b""[..],
            b"\n",
            b"\n\n\n",
            b"a",
            b"a\n",
            b"h\nx\ny\nz",
            b"h\nx\ny\nz\n",
            b"h\r\nx1\r\ny22\r\n\r\nz333\r\n",
            b"header,line\n1,2\n\n3,4\n5,6\n\n\n7,8",
            b"a\nbb\nccc\ndddd\neeeee\nffffff\nggggggg\nhhhhhhhh\n",
            b"\r\n\r\nonly after blanks\r",
        ] {
            check(content);
        }
    }

    #[test]
    fn every_line_is_read_exactly_once_for_random_files() {
        // Deterministic LCG; files of up to 40 bytes over an alphabet dense in separators.
        let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = move || {
            seed = seed
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            (seed >> 33) as usize
        };
        for _ in 0..300 {
            let len = next() % 41;
            let content: Vec<u8> = (0..len).map(|_| b"ab\n\r\nx"[next() % 6]).collect();
            check(&content);
        }
    }

    #[test]
    fn header_is_skipped_only_at_offset_zero() {
        let content = b"year,month\n2013,1\n2013,2\n";
        let d = descriptors(content.len() as u64, 1, true).remove(0);
        let mut r = LineReader::new(Cursor::new(content.to_vec()));
        let mut got = Vec::new();
        let step = r.read(&d, None, 10, |l| got.push(l.to_vec())).unwrap();
        assert_eq!(got, vec![b"2013,1".to_vec(), b"2013,2".to_vec()]);
        assert_eq!(step.next, content.len() as u64);
        assert!(step.finished);
        // An explicit cursor 0 is the split start too: the header is still skipped.
        got.clear();
        r.read(&d, Some(0), 1, |l| got.push(l.to_vec())).unwrap();
        assert_eq!(got, vec![b"2013,1".to_vec()]);
    }

    #[test]
    fn cursor_is_the_start_of_the_first_line_not_returned() {
        let content = b"aa\nbb\ncc\n";
        let d = descriptors(content.len() as u64, 1, false).remove(0);
        let mut r = LineReader::new(Cursor::new(content.to_vec()));
        let step = r.read(&d, None, 2, |_| {}).unwrap();
        assert_eq!(
            step,
            ReadStep {
                next: 6,
                finished: false,
                records: 2
            }
        );
        let mut got = Vec::new();
        let step = r.read(&d, Some(6), 2, |l| got.push(l.to_vec())).unwrap();
        assert_eq!(got, vec![b"cc".to_vec()]);
        assert_eq!(step.next, 9);
        assert!(step.finished);
        // max = 0 returns nothing and keeps the cursor.
        let step = r.read(&d, Some(3), 0, |_| panic!("no records")).unwrap();
        assert_eq!(step.next, 3);
    }

    #[test]
    fn bad_cursors_and_truncated_files_are_errors() {
        let content = b"aa\nbb\ncc\n";
        let d = descriptors(content.len() as u64, 2, false).remove(1);
        let mut r = LineReader::new(Cursor::new(content.to_vec()));
        assert!(r.read(&d, Some(d.start - 1), 1, |_| {}).is_err());
        assert!(r.read(&d, Some(100), 1, |_| {}).is_err());
        let mut shrunk = LineReader::new(Cursor::new(b"aa\nb".to_vec()));
        let d = SplitDescriptor {
            file_len: 9,
            ..descriptors(9, 1, false).remove(0)
        };
        let err = shrunk.read(&d, None, 10, |_| {}).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof);
    }

    #[test]
    fn read_records_reports_line_starts_and_stops_on_request() {
        let content = b"h\r\naa\r\n\nbb\ncc\n";
        let d = descriptors(content.len() as u64, 1, true).remove(0);
        let mut r = LineReader::new(Cursor::new(content.to_vec()));
        let mut seen = Vec::new();
        let step = r
            .read_records(&d, None, 10, |at, l| {
                seen.push((at, l.to_vec()));
                l != b"cc"
            })
            .unwrap();
        assert_eq!(
            seen,
            vec![
                (3, b"aa".to_vec()),
                (8, b"bb".to_vec()),
                (11, b"cc".to_vec())
            ]
        );
        assert_eq!(
            step,
            ReadStep {
                next: 11,
                finished: false,
                records: 2
            }
        );
        // Resuming from the returned cursor reads the refused line again.
        let mut got = Vec::new();
        let step = r
            .read(&d, Some(step.next), 10, |l| got.push(l.to_vec()))
            .unwrap();
        assert_eq!(got, vec![b"cc".to_vec()]);
        assert!(step.finished);
    }

    #[test]
    fn reads_a_real_file() {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        let mut content = String::from("year,carrier\n");
        for i in 0..5000 {
            content.push_str(&format!("{i},C{}\r\n", i % 7));
            if i % 97 == 0 {
                content.push('\n');
            }
        }
        f.write_all(content.as_bytes()).unwrap();
        f.flush().unwrap();
        let want = expected(content.as_bytes(), true);
        assert_eq!(want.len(), 5000);
        for n in [1, 4, 7] {
            let mut got = Vec::new();
            for d in descriptors(content.len() as u64, n, true) {
                let mut r = LineReader::new(std::fs::File::open(f.path()).unwrap());
                let mut cursor = None;
                loop {
                    let step = r.read(&d, cursor, 333, |l| got.push(l.to_vec())).unwrap();
                    cursor = Some(step.next);
                    if step.finished {
                        break;
                    }
                }
            }
            assert_eq!(got, want);
        }
    }
}
