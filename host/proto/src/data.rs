//! The data plane: what travels on one channel, and the header a channel's stream opens
//! with.

use nop_stream_api::{Batch, ChannelId, EpochId, FencingToken, JobId};
use serde::{Deserialize, Serialize};

use crate::codec::{self, CodecError};

/// What travels on a channel, in order (design §19: records, watermarks and barriers share
/// a channel and keep its order).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Message {
    /// A batch of records.
    Records(Batch),
    /// The sender's event-time watermark advanced (ms since the Unix epoch).
    Watermark(i64),
    /// A checkpoint barrier (design §5.3).
    Barrier(EpochId),
    /// The sender's inputs are all idle (design §8.5): leave this channel out of the
    /// watermark minimum until records or a watermark arrive on it again.
    Idle,
    /// The sender will send nothing more on this channel.
    End,
}

/// The first frame of every data stream, written by the producer (design §2.5,
/// "Transport"). The receiver refuses the stream unless `job`, `generation` and `token`
/// are the ones in force for `channel` on its side.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamHeader {
    /// Job the channel belongs to.
    pub job: JobId,
    /// Generation of the deployment that opened the stream.
    pub generation: u64,
    /// Fencing token of the producing attempt.
    pub token: FencingToken,
    /// The channel.
    pub channel: ChannelId,
}

/// Where a [`Message::Records`] payload keeps its record bytes, read from the payload's
/// first bytes by [`records_head`], so that a reader can move `Batch::data` from the
/// stream straight into its own vector (design §4.3) and decode the rest with
/// [`records_from_parts`].
///
/// The postcard layout of a records payload: the variant index `0` (one byte), the length
/// of `data` as a varint, the `data` bytes, then `ends`, `keys`, `key_ends` and
/// `timestamps` (each a varint length and a byte string, [`nop_stream_api::delta`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PayloadHead {
    /// More bytes are needed to tell.
    Incomplete,
    /// A records payload: `data` is the `data_len` bytes after the first `head_len` bytes.
    Records {
        /// Bytes of the variant index and the data length.
        head_len: usize,
        /// Bytes of `Batch::data`.
        data_len: usize,
    },
    /// Any other message, or a head that is not valid postcard: decode the whole payload
    /// with [`codec::decode`], which names the fault.
    Other,
}

/// Bytes of a varint `usize` at most (postcard, 64-bit targets).
const MAX_VARINT: usize = 10;

/// Bytes [`records_head`] may need to decide: the variant index and the longest varint.
pub const MAX_PAYLOAD_HEAD: usize = 1 + MAX_VARINT;

/// Classifies a data-frame payload from its first bytes (`head`, any prefix of it).
pub fn records_head(head: &[u8]) -> PayloadHead {
    let Some((&variant, rest)) = head.split_first() else {
        return PayloadHead::Incomplete;
    };
    // `Records` is variant 0, encoded as the one-byte varint 0; every other variant's
    // first byte is non-zero.
    if variant != 0 {
        return PayloadHead::Other;
    }
    let mut value: u64 = 0;
    for (i, &b) in rest.iter().take(MAX_VARINT).enumerate() {
        let bits = u64::from(b & 0x7f);
        let shift = 7 * i as u32;
        if shift == 63 && bits > 1 {
            return PayloadHead::Other;
        }
        value |= bits << shift;
        if b & 0x80 == 0 {
            return match usize::try_from(value) {
                Ok(data_len) => PayloadHead::Records {
                    head_len: 2 + i,
                    data_len,
                },
                Err(_) => PayloadHead::Other,
            };
        }
    }
    if rest.len() >= MAX_VARINT {
        PayloadHead::Other
    } else {
        PayloadHead::Incomplete
    }
}

/// The fields of a records payload after `data`, in [`Batch`]'s field order.
#[derive(Deserialize)]
struct RecordsTail {
    #[serde(with = "nop_stream_api::delta::u32s")]
    ends: Vec<u32>,
    #[serde(with = "serde_bytes")]
    keys: Vec<u8>,
    #[serde(with = "nop_stream_api::delta::u32s")]
    key_ends: Vec<u32>,
    #[serde(with = "nop_stream_api::delta::i64s")]
    timestamps: Vec<i64>,
}

/// The [`Message::Records`] whose payload is a head (see [`PayloadHead::Records`]), `data`,
/// then `tail`; `data` becomes the batch's payload vector without a copy.
///
/// # Errors
/// [`CodecError::Malformed`] or [`CodecError::Trailing`] if `tail` is not the rest of a
/// batch; [`CodecError::TooLarge`] if it is longer than `cap`.
pub fn records_from_parts(data: Vec<u8>, tail: &[u8], cap: usize) -> Result<Message, CodecError> {
    let t: RecordsTail = codec::decode(tail, cap)?;
    Ok(Message::Records(Batch {
        data,
        ends: t.ends,
        keys: t.keys,
        key_ends: t.key_ends,
        timestamps: t.timestamps,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::MAX_DATA_FRAME;

    #[test]
    fn records_heads_with_long_data_lengths_split_exactly() {
        for len in [0usize, 1, 127, 128, 300, 16_383, 16_384, 70_000] {
            let m = Message::Records(Batch {
                data: (0..len).map(|i| i as u8).collect(),
                ends: vec![len as u32],
                keys: b"k".to_vec(),
                key_ends: vec![1],
                timestamps: vec![-1],
            });
            let payload = codec::encode(&m, MAX_DATA_FRAME).unwrap();
            let PayloadHead::Records { head_len, data_len } = records_head(&payload) else {
                panic!("not split at {len}");
            };
            assert_eq!(data_len, len);
            for cut in 0..head_len {
                assert_eq!(records_head(&payload[..cut]), PayloadHead::Incomplete);
            }
            let data = payload[head_len..head_len + data_len].to_vec();
            let back =
                records_from_parts(data, &payload[head_len + data_len..], MAX_DATA_FRAME).unwrap();
            assert_eq!(back, m);
        }
    }

    #[test]
    fn other_messages_and_overlong_varints_are_left_to_the_decoder() {
        for m in [Message::Watermark(5), Message::End, Message::Idle] {
            let payload = codec::encode(&m, MAX_DATA_FRAME).unwrap();
            assert_eq!(records_head(&payload), PayloadHead::Other);
        }
        let mut overlong = vec![0u8];
        overlong.extend([0xff; MAX_VARINT]);
        assert_eq!(records_head(&overlong), PayloadHead::Other);
        let mut too_big = vec![0u8];
        too_big.extend([0xff; MAX_VARINT - 1]);
        too_big.push(0x02);
        assert_eq!(records_head(&too_big), PayloadHead::Other);
        assert_eq!(records_head(&[0, 0x80, 0x80]), PayloadHead::Incomplete);
    }
}
