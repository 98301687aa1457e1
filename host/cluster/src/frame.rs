//! Length-prefixed frames over QUIC streams.
//!
//! There is one frame format in nop-stream, the proto crate's ([`nop_stream_proto::codec`]):
//! a big-endian `u32` payload length followed by that many payload bytes. This module moves
//! such frames over quinn streams; the payload is opaque to [`write_frame`]/[`read_frame`]
//! and a postcard-encoded wire value for [`write_value`]/[`read_value`]. Every reader has a
//! size cap: a prefix above it is an error naming the cap and the size, and nothing of the
//! claimed size is allocated.
//!
//! [`encode`]/[`decode`] are pure (unit- and property-tested, and checked byte for byte
//! against `nop_stream_proto::codec::write_frame`).

use nop_stream_proto::codec::{self, CodecError};
use serde::Serialize;
use serde::de::DeserializeOwned;

/// Bytes of the length prefix (the proto codec's [`codec::LENGTH_PREFIX`]).
pub const PREFIX_LEN: usize = codec::LENGTH_PREFIX;

/// Default payload cap: 16 MiB, irpc's choice. Control frames carry descriptors, never
/// state payloads (design §2.5), so real frames stay far below it.
pub const DEFAULT_MAX_FRAME_LEN: u32 = 16 * 1024 * 1024;

/// QUIC application error code a reader sends (`stop`/`close`) after a frame over the cap.
pub const ERR_FRAME_TOO_LARGE: u32 = 1;

/// Why a frame could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// A payload is longer than the cap, on write or as announced by a prefix on read.
    #[error("frame of {size} bytes exceeds the cap of {max} bytes")]
    TooLarge {
        /// Payload bytes (claimed by the prefix when reading).
        size: u64,
        /// The cap in force, in bytes.
        max: u32,
    },
    /// The stream ended inside a frame.
    #[error("stream ended inside a frame: {got} of {expected} bytes received")]
    Truncated {
        /// Bytes the prefix or payload needed.
        expected: u64,
        /// Bytes that arrived.
        got: u64,
    },
    /// Reading from the stream failed (reset, connection lost).
    #[error("cannot read frame: {0}")]
    Read(#[from] quinn::ReadError),
    /// Writing to the stream failed (stopped, connection lost).
    #[error("cannot write frame: {0}")]
    Write(#[from] quinn::WriteError),
    /// A wire value could not be encoded, or a frame's payload is not a valid encoding.
    #[error("bad frame payload: {0}")]
    Codec(#[from] CodecError),
}

/// Appends one frame carrying `payload` to `out`.
///
/// # Errors
///
/// [`FrameError::TooLarge`] if `payload` is longer than `max` bytes; `out` is unchanged.
pub fn encode(payload: &[u8], max: u32, out: &mut Vec<u8>) -> Result<(), FrameError> {
    let size = payload.len() as u64;
    if size > u64::from(max) {
        return Err(FrameError::TooLarge { size, max });
    }
    out.reserve(PREFIX_LEN + payload.len());
    out.extend_from_slice(&(size as u32).to_be_bytes());
    out.extend_from_slice(payload);
    Ok(())
}

/// Decodes the first frame of `buf`.
///
/// Returns `Ok(Some((payload, consumed)))` when a whole frame is present (`consumed` =
/// prefix + payload bytes), `Ok(None)` when more bytes are needed.
///
/// # Errors
///
/// [`FrameError::TooLarge`] as soon as the prefix announces more than `max` bytes, before
/// the payload is awaited.
pub fn decode(buf: &[u8], max: u32) -> Result<Option<(&[u8], usize)>, FrameError> {
    let Some(prefix) = buf.first_chunk::<PREFIX_LEN>() else {
        return Ok(None);
    };
    let len = u32::from_be_bytes(*prefix);
    if len > max {
        return Err(FrameError::TooLarge {
            size: u64::from(len),
            max,
        });
    }
    let end = PREFIX_LEN + len as usize;
    Ok(buf.get(PREFIX_LEN..end).map(|payload| (payload, end)))
}

/// Writes one frame to a quinn stream.
///
/// # Errors
///
/// [`FrameError::TooLarge`] before anything is written, or [`FrameError::Write`].
pub async fn write_frame(
    send: &mut quinn::SendStream,
    payload: &[u8],
    max: u32,
) -> Result<(), FrameError> {
    let mut buf = Vec::new();
    encode(payload, max, &mut buf)?;
    send.write_all(&buf).await?;
    Ok(())
}

/// Reads one frame from a quinn stream. Returns `Ok(None)` if the stream finished cleanly
/// before a new frame began.
///
/// # Errors
///
/// [`FrameError::TooLarge`] (the stream is then stopped with [`ERR_FRAME_TOO_LARGE`]),
/// [`FrameError::Truncated`] if the stream ends inside a frame, [`FrameError::Read`].
pub async fn read_frame(
    recv: &mut quinn::RecvStream,
    max: u32,
) -> Result<Option<Vec<u8>>, FrameError> {
    let mut prefix = [0u8; PREFIX_LEN];
    let got = read_full(recv, &mut prefix).await?;
    if got == 0 {
        return Ok(None);
    }
    if got < PREFIX_LEN {
        return Err(FrameError::Truncated {
            expected: PREFIX_LEN as u64,
            got: got as u64,
        });
    }
    let len = u32::from_be_bytes(prefix);
    if len > max {
        // The stream may already be finished or reset; stopping it is best effort.
        let _ = recv.stop(quinn::VarInt::from_u32(ERR_FRAME_TOO_LARGE));
        return Err(FrameError::TooLarge {
            size: u64::from(len),
            max,
        });
    }
    let mut payload = vec![0u8; len as usize];
    let got = read_full(recv, &mut payload).await?;
    if got < payload.len() {
        return Err(FrameError::Truncated {
            expected: u64::from(len),
            got: got as u64,
        });
    }
    Ok(Some(payload))
}

/// Writes `value` as one frame (proto codec: postcard payload behind the length prefix).
///
/// # Errors
///
/// [`FrameError::Codec`] if the encoding exceeds `max` bytes (nothing is written), or
/// [`FrameError::Write`].
pub async fn write_value<T: Serialize>(
    send: &mut quinn::SendStream,
    value: &T,
    max: u32,
) -> Result<(), FrameError> {
    let mut buf = Vec::new();
    codec::write_frame(&mut buf, value, max as usize)?;
    send.write_all(&buf).await?;
    Ok(())
}

/// Reads one frame and decodes it as `T`. Returns `Ok(None)` if the stream finished
/// cleanly before a new frame began.
///
/// # Errors
///
/// As [`read_frame`], and [`FrameError::Codec`] if the payload is not a `T`.
pub async fn read_value<T: DeserializeOwned>(
    recv: &mut quinn::RecvStream,
    max: u32,
) -> Result<Option<T>, FrameError> {
    match read_frame(recv, max).await? {
        Some(payload) => Ok(Some(codec::decode(&payload, max as usize)?)),
        None => Ok(None),
    }
}

/// Fills `buf` unless the stream finishes first; returns the bytes read.
async fn read_full(recv: &mut quinn::RecvStream, buf: &mut [u8]) -> Result<usize, FrameError> {
    let mut filled = 0;
    while filled < buf.len() {
        match recv.read(&mut buf[filled..]).await? {
            Some(n) => filled += n,
            None => break,
        }
    }
    Ok(filled)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn round_trip_and_partial_input() {
        let mut buf = Vec::new();
        encode(b"hello", 16, &mut buf).unwrap();
        encode(b"", 16, &mut buf).unwrap();
        assert_eq!(&buf[..4], &[0, 0, 0, 5]);
        let (p, n) = decode(&buf, 16).unwrap().unwrap();
        assert_eq!((p, n), (&b"hello"[..], 9));
        let (p, n2) = decode(&buf[n..], 16).unwrap().unwrap();
        assert_eq!((p, n2), (&b""[..], 4));
        for cut in 0..9 {
            assert!(decode(&buf[..cut], 16).unwrap().is_none(), "cut {cut}");
        }
    }

    #[test]
    fn oversized_frames_are_refused_naming_cap_and_size() {
        let mut buf = Vec::new();
        let err = encode(&[0; 17], 16, &mut buf).unwrap_err();
        assert_eq!(
            err.to_string(),
            "frame of 17 bytes exceeds the cap of 16 bytes"
        );
        assert!(buf.is_empty());
        // A 4 GiB claim is refused from the prefix alone.
        let err = decode(&[0xff, 0xff, 0xff, 0xff], DEFAULT_MAX_FRAME_LEN).unwrap_err();
        assert!(matches!(
            err,
            FrameError::TooLarge {
                size: 0xffff_ffff,
                max: DEFAULT_MAX_FRAME_LEN
            }
        ));
        // Exactly the cap is fine.
        encode(&[7; 16], 16, &mut buf).unwrap();
        assert_eq!(decode(&buf, 16).unwrap().unwrap().1, 20);
    }

    #[test]
    fn the_byte_format_is_the_proto_codecs() {
        let value = ("channel", 7u64, vec![1u8, 2, 3]);
        let mut ours = Vec::new();
        encode(&codec::encode(&value, 1024).unwrap(), 1024, &mut ours).unwrap();
        let mut theirs = Vec::new();
        codec::write_frame(&mut theirs, &value, 1024).unwrap();
        assert_eq!(ours, theirs);
        let mut reader = codec::FrameReader::new(1024);
        reader.push(&ours);
        assert_eq!(
            reader.next_value::<(String, u64, Vec<u8>)>().unwrap(),
            Some(("channel".to_owned(), 7, vec![1, 2, 3]))
        );
    }

    proptest! {
        #[test]
        fn decoder_never_panics_on_arbitrary_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..64), max in 0u32..64) {
            match decode(&bytes, max) {
                Ok(Some((payload, used))) => {
                    prop_assert!(used <= bytes.len());
                    prop_assert_eq!(used, PREFIX_LEN + payload.len());
                    prop_assert!(payload.len() as u64 <= u64::from(max));
                }
                Ok(None) => prop_assert!(bytes.len() < PREFIX_LEN || u32::from_be_bytes(bytes[..4].try_into().unwrap()) as usize > bytes.len() - PREFIX_LEN),
                Err(FrameError::TooLarge { size, max: m }) => prop_assert!(size > u64::from(m)),
                Err(e) => prop_assert!(false, "unexpected {e}"),
            }
        }

        #[test]
        fn frames_round_trip_in_sequence(payloads in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..40), 0..8)) {
            let mut buf = Vec::new();
            for p in &payloads {
                encode(p, 64, &mut buf).unwrap();
            }
            let mut rest = &buf[..];
            for p in &payloads {
                let (got, used) = decode(rest, 64).unwrap().unwrap();
                prop_assert_eq!(got, &p[..]);
                rest = &rest[used..];
            }
            prop_assert!(rest.is_empty());
        }
    }
}
