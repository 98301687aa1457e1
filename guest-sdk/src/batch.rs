//! [`Batch`]: records laid out as flat buffers with end offsets, the shape of the WIT
//! `batch` record (design §16, "batch at the boundary").

/// A batch of records, laid out exactly like the WIT `batch` record.
///
/// Record `i` is `data[start(i) .. ends[i]]` with `start(0) = 0` and
/// `start(i) = ends[i - 1]`; keys use the same layout in `keys` / `key_ends`.
/// `key_ends` and `timestamps` are either empty (unkeyed, or no event time) or hold
/// exactly one entry per record.
///
/// Appending never allocates per record: payloads, keys and offsets go into five
/// growable buffers. Crossing the host boundary moves those buffers, it does not copy
/// records.
///
/// # Consistency rule
/// All records of one batch either all have a key or none has, and either all have a
/// timestamp or none has. The `push*` methods check this with `debug_assert!`; a release
/// build does not check, and an inconsistent batch is rejected by the host as malformed.
///
/// # Limits
/// Offsets are `u32`, so `data` and `keys` hold at most 4 GiB − 1 bytes each (the host's
/// batch limits are far lower); exceeding that panics.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Batch {
    /// Concatenated record payloads, no separators.
    pub data: Vec<u8>,
    /// Exclusive end offset in `data` of each record; its length is the record count.
    pub ends: Vec<u32>,
    /// Concatenated record keys; empty if the batch is unkeyed.
    pub keys: Vec<u8>,
    /// Exclusive end offset in `keys` of each record's key; empty if unkeyed.
    pub key_ends: Vec<u32>,
    /// Event time of each record in milliseconds since the Unix epoch; empty if none.
    pub timestamps: Vec<i64>,
}

/// One record of a [`Batch`], borrowed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordRef<'a> {
    /// Record payload.
    pub data: &'a [u8],
    /// Record key, if the batch is keyed.
    pub key: Option<&'a [u8]>,
    /// Event time in ms since the Unix epoch, if the batch carries timestamps.
    pub timestamp: Option<i64>,
}

/// `buf.extend_from_slice(key)`, with 8-byte keys (the common `u64` id) copied as one
/// constant-size store: a copy of variable length is a `memory.copy` call out of the
/// compiled guest code.
#[inline(always)]
pub fn extend_key(buf: &mut Vec<u8>, key: &[u8]) {
    match <&[u8; 8]>::try_from(key) {
        Ok(k) => buf.extend_from_slice(k),
        Err(_) => buf.extend_from_slice(key),
    }
}

#[inline]
fn offset(len: usize) -> u32 {
    u32::try_from(len).expect("batch buffer exceeds u32::MAX bytes")
}

impl Batch {
    /// An empty batch; allocates nothing.
    pub const fn new() -> Self {
        Batch {
            data: Vec::new(),
            ends: Vec::new(),
            keys: Vec::new(),
            key_ends: Vec::new(),
            timestamps: Vec::new(),
        }
    }

    /// An empty batch with room for `records` records and `bytes` payload bytes
    /// (keys and timestamps are not reserved; they grow on first use).
    pub fn with_capacity(records: usize, bytes: usize) -> Self {
        Batch {
            data: Vec::with_capacity(bytes),
            ends: Vec::with_capacity(records),
            keys: Vec::new(),
            key_ends: Vec::new(),
            timestamps: Vec::new(),
        }
    }

    /// Number of records.
    #[inline]
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    /// Whether the batch holds no record.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// Whether records carry keys.
    #[inline]
    pub fn is_keyed(&self) -> bool {
        !self.key_ends.is_empty()
    }

    /// Whether records carry event-time timestamps.
    #[inline]
    pub fn has_timestamps(&self) -> bool {
        !self.timestamps.is_empty()
    }

    /// Removes every record, keeping the buffers' capacity.
    pub fn clear(&mut self) {
        self.data.clear();
        self.ends.clear();
        self.keys.clear();
        self.key_ends.clear();
        self.timestamps.clear();
    }

    /// Payload of record `i`.
    ///
    /// # Panics
    /// If `i >= self.len()` or the offsets are malformed.
    #[inline]
    pub fn record(&self, i: usize) -> &[u8] {
        let start = if i == 0 { 0 } else { self.ends[i - 1] as usize };
        &self.data[start..self.ends[i] as usize]
    }

    /// Key of record `i`, or `None` if the batch is unkeyed.
    ///
    /// # Panics
    /// If the batch is keyed and `i >= self.len()`.
    #[inline]
    pub fn key(&self, i: usize) -> Option<&[u8]> {
        if self.key_ends.is_empty() {
            return None;
        }
        let start = if i == 0 {
            0
        } else {
            self.key_ends[i - 1] as usize
        };
        Some(&self.keys[start..self.key_ends[i] as usize])
    }

    /// Event time of record `i` in ms since the Unix epoch, or `None` if the batch has no
    /// timestamps.
    #[inline]
    pub fn timestamp(&self, i: usize) -> Option<i64> {
        if self.timestamps.is_empty() {
            None
        } else {
            Some(self.timestamps[i])
        }
    }

    /// Iterates over the records in order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = RecordRef<'_>> + '_ {
        let keyed = self.is_keyed();
        let timed = self.has_timestamps();
        let mut start = 0usize;
        let mut key_start = 0usize;
        (0..self.ends.len()).map(move |i| {
            let end = self.ends[i] as usize;
            let data = &self.data[start..end];
            start = end;
            let key = if keyed {
                let kend = self.key_ends[i] as usize;
                let k = &self.keys[key_start..kend];
                key_start = kend;
                Some(k)
            } else {
                None
            };
            RecordRef {
                data,
                key,
                timestamp: if timed {
                    Some(self.timestamps[i])
                } else {
                    None
                },
            }
        })
    }

    #[inline]
    fn check_shape(&self, keyed: bool, timed: bool) {
        debug_assert!(
            self.ends.is_empty() || keyed == (self.key_ends.len() == self.ends.len()),
            "batch records must all have a key or all have none"
        );
        debug_assert!(
            self.ends.is_empty() || timed == (self.timestamps.len() == self.ends.len()),
            "batch records must all have a timestamp or all have none"
        );
    }

    /// Appends an unkeyed record without timestamp.
    ///
    /// The batch must hold only unkeyed, untimed records (checked in debug builds).
    #[inline]
    pub fn push(&mut self, data: &[u8]) {
        self.push_record(None, None, data);
    }

    /// Appends a keyed record without timestamp.
    ///
    /// The batch must hold only keyed, untimed records (checked in debug builds).
    #[inline]
    pub fn push_keyed(&mut self, key: &[u8], data: &[u8]) {
        self.push_record(Some(key), None, data);
    }

    /// Appends a record with optional key and event time (ms since the Unix epoch).
    ///
    /// Every record of the batch must agree on whether `key` and `timestamp` are present
    /// (checked in debug builds, see [`Batch`]).
    #[inline]
    pub fn push_record(&mut self, key: Option<&[u8]>, timestamp: Option<i64>, data: &[u8]) {
        self.push_with(key, timestamp, |buf| buf.extend_from_slice(data));
    }

    /// Appends a record whose payload `write` appends directly to [`Batch::data`], so a
    /// serializer can write in place without a temporary buffer. Returns what `write`
    /// returns.
    ///
    /// `write` must only append to the buffer it is given (truncating below its initial
    /// length is a bug, checked in debug builds). If `write` reports a failure through
    /// its return value, the record has still been appended with whatever it wrote; call
    /// [`Batch::truncate`] to drop it. Keys and timestamps follow the same consistency
    /// rule as [`Batch::push_record`].
    #[inline]
    pub fn push_with<R>(
        &mut self,
        key: Option<&[u8]>,
        timestamp: Option<i64>,
        write: impl FnOnce(&mut Vec<u8>) -> R,
    ) -> R {
        self.check_shape(key.is_some(), timestamp.is_some());
        let start = self.data.len();
        let r = write(&mut self.data);
        debug_assert!(self.data.len() >= start, "push_with truncated the batch");
        self.ends.push(offset(self.data.len()));
        if let Some(k) = key {
            extend_key(&mut self.keys, k);
            self.key_ends.push(offset(self.keys.len()));
        }
        if let Some(ts) = timestamp {
            self.timestamps.push(ts);
        }
        r
    }

    /// Keeps the first `len` records and drops the rest (no-op if `len >= self.len()`).
    pub fn truncate(&mut self, len: usize) {
        if len >= self.len() {
            return;
        }
        let data_end = if len == 0 {
            0
        } else {
            self.ends[len - 1] as usize
        };
        self.data.truncate(data_end);
        self.ends.truncate(len);
        if self.is_keyed() {
            let key_end = if len == 0 {
                0
            } else {
                self.key_ends[len - 1] as usize
            };
            self.keys.truncate(key_end);
            self.key_ends.truncate(len);
        }
        self.timestamps.truncate(len);
    }

    /// Checks the layout invariants of the WIT `batch` record: non-decreasing ends that
    /// close at the buffer length, and keys / timestamps empty or one per record.
    ///
    /// # Errors
    /// A message naming the first violated invariant.
    pub fn validate(&self) -> Result<(), String> {
        fn check(name: &str, ends: &[u32], len: usize) -> Result<(), String> {
            let mut prev = 0u32;
            for (i, &e) in ends.iter().enumerate() {
                if e < prev {
                    return Err(format!(
                        "{name}[{i}] = {e} is below the previous end {prev}"
                    ));
                }
                prev = e;
            }
            if prev as usize != len {
                return Err(format!(
                    "last {name} is {prev} but the buffer holds {len} bytes"
                ));
            }
            Ok(())
        }
        check("ends", &self.ends, self.data.len())?;
        if !self.key_ends.is_empty() && self.key_ends.len() != self.ends.len() {
            return Err(format!(
                "{} key ends for {} records",
                self.key_ends.len(),
                self.ends.len()
            ));
        }
        check("key_ends", &self.key_ends, self.keys.len())?;
        if !self.timestamps.is_empty() && self.timestamps.len() != self.ends.len() {
            return Err(format!(
                "{} timestamps for {} records",
                self.timestamps.len(),
                self.ends.len()
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn push_and_read_back() {
        let mut b = Batch::new();
        assert!(b.is_empty());
        b.push(b"a");
        b.push(b"");
        b.push(b"ccc");
        assert_eq!(b.len(), 3);
        assert_eq!(b.record(0), b"a");
        assert_eq!(b.record(1), b"");
        assert_eq!(b.record(2), b"ccc");
        assert_eq!(b.key(0), None);
        assert_eq!(b.timestamp(2), None);
        assert_eq!(b.ends, vec![1, 1, 4]);
        b.validate().unwrap();
        let all: Vec<&[u8]> = b.iter().map(|r| r.data).collect();
        assert_eq!(all, vec![&b"a"[..], b"", b"ccc"]);
    }

    #[test]
    fn keyed_and_timed_records() {
        let mut b = Batch::with_capacity(4, 64);
        b.push_record(Some(b"k1"), Some(10), b"x");
        b.push_record(Some(b""), Some(-5), b"yy");
        assert_eq!(b.key(0), Some(&b"k1"[..]));
        assert_eq!(b.key(1), Some(&b""[..]));
        assert_eq!(b.timestamp(1), Some(-5));
        let recs: Vec<_> = b.iter().collect();
        assert_eq!(
            recs[1],
            RecordRef {
                data: b"yy",
                key: Some(b""),
                timestamp: Some(-5)
            }
        );
        b.validate().unwrap();
    }

    #[test]
    fn extend_key_appends_every_length() {
        let mut buf = b"ab".to_vec();
        let mut want = buf.clone();
        for len in [0, 1, 7, 8, 9, 16] {
            let key: Vec<u8> = (0..len as u8).collect();
            extend_key(&mut buf, &key);
            want.extend_from_slice(&key);
        }
        assert_eq!(buf, want);
    }

    #[test]
    fn push_keyed_and_push_with() {
        let mut b = Batch::new();
        b.push_keyed(b"a", b"1");
        let n = b.push_with(Some(b"bb"), None, |buf| {
            buf.extend_from_slice(b"22");
            buf.len()
        });
        assert_eq!(n, 3);
        assert_eq!(b.record(1), b"22");
        assert_eq!(b.key(1), Some(&b"bb"[..]));
        assert_eq!(b.keys, b"abb");
        assert_eq!(b.key_ends, vec![1, 3]);
    }

    #[test]
    fn clear_keeps_capacity_and_truncate_drops_tail() {
        let mut b = Batch::new();
        for i in 0..10u8 {
            b.push_record(Some(&[i]), Some(i64::from(i)), &[i, i]);
        }
        b.truncate(3);
        assert_eq!(b.len(), 3);
        assert_eq!(b.data.len(), 6);
        assert_eq!(b.keys.len(), 3);
        assert_eq!(b.timestamps, vec![0, 1, 2]);
        b.validate().unwrap();
        let cap = b.data.capacity();
        b.clear();
        assert!(b.is_empty());
        assert_eq!(b.data.capacity(), cap);
    }

    #[test]
    #[should_panic(expected = "all have a key")]
    #[cfg(debug_assertions)]
    fn mixing_keyed_and_unkeyed_is_caught_in_debug() {
        let mut b = Batch::new();
        b.push_keyed(b"k", b"v");
        b.push(b"v");
    }

    #[test]
    fn validate_rejects_bad_layouts() {
        let b = Batch {
            data: b"abc".to_vec(),
            ends: vec![2, 1, 3],
            ..Batch::default()
        };
        assert!(b.validate().unwrap_err().contains("ends[1]"));
        let b = Batch {
            data: b"abc".to_vec(),
            ends: vec![2],
            ..Batch::default()
        };
        assert!(b.validate().is_err());
        let b = Batch {
            data: b"ab".to_vec(),
            ends: vec![1, 2],
            timestamps: vec![1],
            ..Batch::default()
        };
        assert!(b.validate().unwrap_err().contains("timestamps"));
    }
}
