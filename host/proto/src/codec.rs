//! Size-capped codecs. A value is encoded with postcard; on a byte stream every encoded
//! value travels as one frame, a 4-byte big-endian length followed by that many bytes.
//!
//! Caps are checked before anything is allocated for a frame: a length prefix over the
//! cap is refused with [`CodecError::TooLarge`] without reading or reserving the claimed
//! size, so a corrupt or hostile peer cannot make the receiver allocate. Decoding never
//! panics on any input (property-tested in `tests/codec_props.rs`).

use serde::Serialize;
use serde::de::DeserializeOwned;

/// Cap on a control-plane frame (deployments, commands, events), in bytes: 16 MiB. A task
/// snapshot is descriptors only, so this bounds a manifest's share of one task.
pub const MAX_CONTROL_FRAME: usize = 16 << 20;

/// Cap on a data-plane frame (one [`crate::Message`]), in bytes: 80 MiB, above the
/// runtime's default `max_output_bytes` (64 MiB) plus its offsets and timestamps.
pub const MAX_DATA_FRAME: usize = 80 << 20;

/// Bytes of a frame's length prefix.
pub const LENGTH_PREFIX: usize = 4;

/// Why a value could not be encoded or decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CodecError {
    /// The frame is larger than the cap in force.
    #[error("frame of {size} bytes exceeds the cap of {cap} bytes")]
    TooLarge {
        /// Size of the frame (claimed by its prefix, or encoded).
        size: usize,
        /// The cap.
        cap: usize,
    },
    /// The bytes are not a valid encoding of the expected type.
    #[error("malformed {what}: {message}")]
    Malformed {
        /// The type expected.
        what: &'static str,
        /// What the decoder found.
        message: String,
    },
    /// The value was decoded but bytes remain after it.
    #[error("{extra} trailing bytes after a {what}")]
    Trailing {
        /// The type decoded.
        what: &'static str,
        /// Bytes left over.
        extra: usize,
    },
    /// The type cannot be encoded.
    #[error("cannot encode: {0}")]
    Encode(String),
}

fn short_type_name<T>() -> &'static str {
    let full = std::any::type_name::<T>();
    let base = full.split('<').next().unwrap_or(full);
    base.rsplit("::").next().unwrap_or(base)
}

/// Encodes `value`, refusing an encoding over `cap` bytes.
///
/// # Errors
/// [`CodecError::TooLarge`] over the cap; [`CodecError::Encode`] if serde refuses the value.
pub fn encode<T: Serialize>(value: &T, cap: usize) -> Result<Vec<u8>, CodecError> {
    let bytes = postcard::to_allocvec(value).map_err(|e| CodecError::Encode(e.to_string()))?;
    if bytes.len() > cap {
        return Err(CodecError::TooLarge {
            size: bytes.len(),
            cap,
        });
    }
    Ok(bytes)
}

/// Decodes one whole value from `bytes` (no trailing bytes allowed), refusing input over
/// `cap` bytes.
///
/// # Errors
/// [`CodecError::TooLarge`], [`CodecError::Malformed`] or [`CodecError::Trailing`].
pub fn decode<T: DeserializeOwned>(bytes: &[u8], cap: usize) -> Result<T, CodecError> {
    if bytes.len() > cap {
        return Err(CodecError::TooLarge {
            size: bytes.len(),
            cap,
        });
    }
    let (value, rest) =
        postcard::take_from_bytes::<T>(bytes).map_err(|e| CodecError::Malformed {
            what: short_type_name::<T>(),
            message: e.to_string(),
        })?;
    if !rest.is_empty() {
        return Err(CodecError::Trailing {
            what: short_type_name::<T>(),
            extra: rest.len(),
        });
    }
    Ok(value)
}

/// Appends `value` to `out` as one frame: length prefix, then its encoding, serialized in
/// place behind the prefix (no intermediate buffer). On error `out` is left as it was.
///
/// # Errors
/// As [`encode`].
pub fn write_frame<T: Serialize>(
    out: &mut Vec<u8>,
    value: &T,
    cap: usize,
) -> Result<(), CodecError> {
    let start = out.len();
    out.extend_from_slice(&[0; LENGTH_PREFIX]);
    if let Err(e) = postcard::serialize_with_flavor(value, AppendTo(out)) {
        out.truncate(start);
        return Err(CodecError::Encode(e.to_string()));
    }
    let size = out.len() - start - LENGTH_PREFIX;
    let len = match u32::try_from(size) {
        Ok(len) if size <= cap => len,
        _ => {
            out.truncate(start);
            return Err(CodecError::TooLarge { size, cap });
        }
    };
    out[start..start + LENGTH_PREFIX].copy_from_slice(&len.to_be_bytes());
    Ok(())
}

/// A postcard output that appends to a borrowed vector, byte slices with one copy.
struct AppendTo<'a>(&'a mut Vec<u8>);

impl postcard::ser_flavors::Flavor for AppendTo<'_> {
    type Output = ();

    fn try_extend(&mut self, data: &[u8]) -> postcard::Result<()> {
        self.0.extend_from_slice(data);
        Ok(())
    }

    fn try_push(&mut self, data: u8) -> postcard::Result<()> {
        self.0.push(data);
        Ok(())
    }

    fn finalize(self) -> postcard::Result<()> {
        Ok(())
    }
}

/// `value` as one frame (length prefix and encoding) in a buffer of its own, ready to
/// hand to a stream as one chunk.
///
/// # Errors
/// As [`encode`].
pub fn frame<T: Serialize>(value: &T, cap: usize) -> Result<Vec<u8>, CodecError> {
    let mut out = Vec::new();
    write_frame(&mut out, value, cap)?;
    Ok(out)
}

/// Splits a byte stream into frames as bytes arrive, in any chunking.
#[derive(Debug)]
pub struct FrameReader {
    buf: Vec<u8>,
    cap: usize,
}

impl FrameReader {
    /// A reader refusing frames over `cap` bytes.
    pub fn new(cap: usize) -> Self {
        FrameReader {
            buf: Vec::new(),
            cap,
        }
    }

    /// Appends bytes read from the stream.
    pub fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// Bytes buffered and not yet returned as a frame.
    pub fn buffered(&self) -> usize {
        self.buf.len()
    }

    /// The next whole frame's payload, if one has arrived.
    ///
    /// # Errors
    /// [`CodecError::TooLarge`] as soon as a length prefix over the cap is seen; the
    /// stream cannot be resynchronised after it.
    pub fn next_frame(&mut self) -> Result<Option<Vec<u8>>, CodecError> {
        if self.buf.len() < LENGTH_PREFIX {
            return Ok(None);
        }
        let len = u32::from_be_bytes([self.buf[0], self.buf[1], self.buf[2], self.buf[3]]) as usize;
        if len > self.cap {
            return Err(CodecError::TooLarge {
                size: len,
                cap: self.cap,
            });
        }
        if self.buf.len() < LENGTH_PREFIX + len {
            return Ok(None);
        }
        let payload = self.buf[LENGTH_PREFIX..LENGTH_PREFIX + len].to_vec();
        self.buf.drain(..LENGTH_PREFIX + len);
        Ok(Some(payload))
    }

    /// The next whole frame decoded as `T`.
    ///
    /// # Errors
    /// As [`Self::next_frame`] and [`decode`].
    pub fn next_value<T: DeserializeOwned>(&mut self) -> Result<Option<T>, CodecError> {
        match self.next_frame()? {
            Some(p) => decode(&p, self.cap).map(Some),
            None => Ok(None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Message, TaskCommand};
    use nop_stream_api::{Batch, EpochId};

    #[test]
    fn round_trip_and_trailing_bytes() {
        let m = Message::Records(Batch {
            data: b"abcdef".to_vec(),
            ends: vec![3, 6],
            keys: b"k1k2".to_vec(),
            key_ends: vec![2, 4],
            timestamps: vec![1, -2],
        });
        let bytes = encode(&m, MAX_DATA_FRAME).unwrap();
        assert_eq!(decode::<Message>(&bytes, MAX_DATA_FRAME).unwrap(), m);
        let mut longer = bytes.clone();
        longer.push(0);
        assert_eq!(
            decode::<Message>(&longer, MAX_DATA_FRAME),
            Err(CodecError::Trailing {
                what: "Message",
                extra: 1
            })
        );
    }

    #[test]
    fn encode_and_decode_refuse_over_the_cap() {
        let m = Message::Records(Batch {
            data: vec![7; 100],
            ends: vec![100],
            ..Batch::default()
        });
        let err = encode(&m, 50).unwrap_err();
        assert!(
            matches!(err, CodecError::TooLarge { cap: 50, size } if size > 100),
            "{err}"
        );
        let bytes = encode(&m, 1000).unwrap();
        assert!(matches!(
            decode::<Message>(&bytes, 50),
            Err(CodecError::TooLarge { cap: 50, .. })
        ));
    }

    #[test]
    fn frame_reader_reassembles_any_chunking() {
        let mut stream = Vec::new();
        let cmds = [
            TaskCommand::InjectBarrier(EpochId(1)),
            TaskCommand::Commit(EpochId(1)),
            TaskCommand::Finish,
        ];
        for c in &cmds {
            write_frame(&mut stream, c, MAX_CONTROL_FRAME).unwrap();
        }
        for chunk in 1..=stream.len() {
            let mut r = FrameReader::new(MAX_CONTROL_FRAME);
            let mut got = Vec::new();
            for piece in stream.chunks(chunk) {
                r.push(piece);
                while let Some(c) = r.next_value::<TaskCommand>().unwrap() {
                    got.push(c);
                }
            }
            assert_eq!(got, cmds, "chunk size {chunk}");
            assert_eq!(r.buffered(), 0);
        }
    }

    #[test]
    fn frame_reader_refuses_an_oversized_prefix_before_reading_it() {
        // Regression: a 4 GiB length prefix must be refused at once, not waited for.
        let mut r = FrameReader::new(1024);
        r.push(&u32::MAX.to_be_bytes());
        assert_eq!(
            r.next_frame(),
            Err(CodecError::TooLarge {
                size: u32::MAX as usize,
                cap: 1024
            })
        );
    }
}
