//! `bid-map`: Nexmark q1 on binary bid records — the price converted with factor 0.908,
//! exactly, as a fixed-point decimal with scale 3 (Flink's `0.908 * price` is a
//! `DECIMAL(23,3)`; here `price_milli = price × 908`, i.e. `0.908 × price` in thousandths).
//!
//! Input: bid records as `bids-parser` writes them (auction, bidder, price, date_time as
//! `i64` LE, then the channel). Output, [`MAPPED_BYTES`] bytes, the columns of Flink's q1:
//!
//! | bytes | field |
//! |---|---|
//! | 0..8 | auction, `i64` LE |
//! | 8..16 | bidder, `i64` LE |
//! | 16..24 | `0.908 × price` in thousandths of a cent, `i64` LE (wrapping on overflow) |
//! | 24..32 | date_time, `i64` LE |
//!
//! Keys and timestamps pass through. No config, no state, nothing allocated per record.

use nop_stream_sdk::{Batch, Context, Operator, PluginError, PluginInfo, Result, TaskInfo};

/// Size of an input bid's fixed part and of an output record, in bytes.
pub const MAPPED_BYTES: usize = 32;

/// The conversion factor in thousandths (0.908).
pub const FACTOR_MILLI: i64 = 908;

/// Appends the q1 record of the encoded bid `rec` to `out`; `false` (and nothing appended)
/// if `rec` is shorter than [`MAPPED_BYTES`].
#[inline]
pub fn map_bid(rec: &[u8], out: &mut Vec<u8>) -> bool {
    if rec.len() < MAPPED_BYTES {
        return false;
    }
    let mut price = [0u8; 8];
    price.copy_from_slice(&rec[16..24]);
    let milli = i64::from_le_bytes(price).wrapping_mul(FACTOR_MILLI);
    out.extend_from_slice(&rec[0..16]);
    out.extend_from_slice(&milli.to_le_bytes());
    out.extend_from_slice(&rec[24..32]);
    true
}

/// The operator; stateless.
#[derive(Debug)]
pub struct BidMap;

impl Operator for BidMap {
    fn describe() -> PluginInfo {
        PluginInfo::operator("bid-map", "0.1.0")
            .description("Nexmark q1: price x 0.908 as a decimal with scale 3")
            .config_schema(r#"{"type":"object","additionalProperties":false}"#)
    }

    fn open(_ctx: &mut dyn Context, _task: &TaskInfo, _config: &str) -> Result<Self> {
        Ok(Self)
    }

    fn process(
        &mut self,
        _ctx: &mut dyn Context,
        _input: u32,
        batch: &Batch,
        out: &mut Batch,
    ) -> Result<()> {
        out.data.reserve(batch.len() * MAPPED_BYTES);
        for (i, rec) in batch.iter().enumerate() {
            let ok = out.push_with(rec.key, rec.timestamp, |buf| map_bid(rec.data, buf));
            if !ok {
                return Err(PluginError::invalid_record(format!(
                    "record {i}: {} bytes, a bid record has at least {MAPPED_BYTES}",
                    rec.data.len()
                )));
            }
        }
        Ok(())
    }
}

nop_stream_sdk::export_operator!(BidMap);

#[cfg(test)]
mod tests {
    use nop_stream_sdk::{ErrorCode, MockContext};

    use super::*;

    fn bid(auction: i64, price: i64) -> Vec<u8> {
        let mut v = Vec::new();
        for x in [auction, 7, price, 1_700_000_000_000] {
            v.extend_from_slice(&x.to_le_bytes());
        }
        v.extend_from_slice(b"Apple");
        v
    }

    #[test]
    fn maps_price_exactly_and_keeps_keys() {
        let mut ctx = MockContext::for_operator::<BidMap>();
        let mut op = BidMap::open(&mut ctx, &TaskInfo::for_tests(), "{}").unwrap();
        let mut input = Batch::default();
        input.push_record(Some(b"k"), Some(5), &bid(1000, 12345));
        let mut out = Batch::default();
        op.process(&mut ctx, 0, &input, &mut out).unwrap();
        let r = out.record(0);
        assert_eq!(r.len(), MAPPED_BYTES);
        assert_eq!(&r[16..24], &(12345i64 * 908).to_le_bytes());
        assert_eq!(&r[0..8], &1000i64.to_le_bytes());
        assert_eq!((out.key(0), out.timestamp(0)), (Some(&b"k"[..]), Some(5)));

        let mut bad = Batch::default();
        bad.push(b"short");
        let err = op
            .process(&mut ctx, 0, &bad, &mut Batch::default())
            .unwrap_err();
        assert_eq!(err.code, ErrorCode::InvalidRecord);
    }
}
