//! The data plane: what travels on one channel, and the header a channel's stream opens
//! with.

use nop_stream_api::{Batch, ChannelId, EpochId, FencingToken, JobId};
use serde::{Deserialize, Serialize};

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
