//! Cutting a file into byte-range splits, and the split descriptor.
//!
//! A file of `file_len` bytes is cut into `n` half-open byte ranges
//! `[file_len * i / n, file_len * (i + 1) / n)`, `0 <= i < n`. The ranges partition
//! `[0, file_len)`; line alignment (which range owns which line) is the reader's job, see
//! [`crate::reader`].

use serde::{Deserialize, Serialize};

/// What a reader needs to read one split; serialised as compact JSON into the WIT
/// `split.descriptor`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SplitDescriptor {
    /// Path of the file, as the guest sees it (inside a preopened directory).
    pub path: String,
    /// First byte offset of the range (inclusive).
    pub start: u64,
    /// End byte offset of the range (exclusive).
    pub end: u64,
    /// Length of the file in bytes when the splits were discovered; reading refuses a file
    /// whose length changed.
    pub file_len: u64,
    /// Whether the line at offset 0 is a header and is skipped.
    pub header: bool,
}

impl SplitDescriptor {
    /// Encodes the descriptor as compact JSON.
    #[must_use]
    pub fn encode(&self) -> Vec<u8> {
        // Serialising a struct of strings and integers cannot fail.
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// Decodes a descriptor produced by [`SplitDescriptor::encode`].
    ///
    /// # Errors
    /// The bytes are not a descriptor, or `start > end` or `end > file_len`.
    pub fn decode(bytes: &[u8]) -> Result<Self, String> {
        let d: Self = serde_json::from_slice(bytes)
            .map_err(|e| format!("malformed split descriptor: {e}"))?;
        if d.start > d.end || d.end > d.file_len {
            return Err(format!(
                "malformed split descriptor: range [{}, {}) outside file of {} bytes",
                d.start, d.end, d.file_len
            ));
        }
        Ok(d)
    }
}

/// The split id of split `index` of `path`: `"{path}#{index}"`.
#[must_use]
pub fn split_id(path: &str, index: u32) -> String {
    format!("{path}#{index}")
}

/// Cuts `[0, file_len)` into `count` (at least 1) byte ranges of near-equal size, in order.
/// Ranges are empty when `count > file_len`.
#[must_use]
pub fn byte_ranges(file_len: u64, count: u32) -> Vec<(u64, u64)> {
    let n = u128::from(count.max(1));
    let len = u128::from(file_len);
    // `len * i / n <= len` fits in u64, so the narrowing casts below are lossless.
    let at = |i: u128| u64::try_from(len * i / n).unwrap_or(file_len);
    (0..n).map(|i| (at(i), at(i + 1))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_partition_the_file() {
        for len in [0_u64, 1, 2, 7, 100, 101, u64::MAX] {
            for n in 1..=9 {
                let r = byte_ranges(len, n);
                assert_eq!(r.len(), n as usize);
                assert_eq!(r[0].0, 0);
                assert_eq!(r[r.len() - 1].1, len);
                for w in r.windows(2) {
                    assert_eq!(w[0].1, w[1].0);
                }
                for (s, e) in &r {
                    assert!(s <= e);
                    assert!(e - s <= (len / u64::from(n)).saturating_add(1));
                }
            }
        }
        assert_eq!(byte_ranges(10, 0), vec![(0, 10)]);
    }

    #[test]
    fn descriptor_round_trips_and_is_checked() {
        let d = SplitDescriptor {
            path: "/input/a.csv".into(),
            start: 3,
            end: 9,
            file_len: 10,
            header: true,
        };
        assert_eq!(SplitDescriptor::decode(&d.encode()).unwrap(), d);
        let bad = SplitDescriptor { end: 11, ..d };
        assert!(SplitDescriptor::decode(&bad.encode()).is_err());
        assert!(SplitDescriptor::decode(b"nope").is_err());
        assert_eq!(split_id("/input/a.csv", 2), "/input/a.csv#2");
    }
}
