//! Segment files in checkpoint storage (design §3.5, §14.2): appending one operator's
//! payloads to its file, and reading a payload back with its checksum verified.

use nop_stream_checkpoint::{Namespace, ObjectWriter, SegmentDescriptor, payload_checksum};

/// One operator's segment file, opened at its first payload (an operator with nothing
/// to snapshot writes no file), with the offset of the next payload.
pub(crate) struct SegmentAppender<'a> {
    pub storage: &'a Namespace,
    pub file: &'a str,
    pub writer: Option<Box<dyn ObjectWriter + 'a>>,
    pub offset: u64,
}

impl<'a> SegmentAppender<'a> {
    /// An appender of `file` in `storage` that has written nothing yet.
    pub fn new(storage: &'a Namespace, file: &'a str) -> Self {
        SegmentAppender {
            storage,
            file,
            writer: None,
            offset: 0,
        }
    }

    /// Appends `payload`; returns its offset in the file.
    pub fn append(&mut self, payload: &[u8]) -> std::result::Result<u64, String> {
        let w = match &mut self.writer {
            Some(w) => w,
            None => self.writer.insert(
                self.storage
                    .segment_writer(self.file)
                    .map_err(|e| e.to_string())?,
            ),
        };
        w.write(payload).map_err(|e| e.to_string())?;
        let at = self.offset;
        self.offset += payload.len() as u64;
        Ok(at)
    }
}

/// The payload `seg` points at, its checksum verified; the message names the segment.
pub(crate) fn read_segment(
    storage: &Namespace,
    seg: &SegmentDescriptor,
) -> std::result::Result<Vec<u8>, String> {
    let bytes = storage
        .read_range(&seg.file, seg.offset, seg.len)
        .map_err(|e| e.to_string())?;
    if payload_checksum(&bytes) != seg.checksum {
        return Err(format!("segment {} failed its checksum", seg.state_path));
    }
    Ok(bytes)
}
