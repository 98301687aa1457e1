//! Keyed-state segment payload codecs (design §8.2, §5.5: incremental
//! snapshots). A [`SegmentDescriptor`](crate::SegmentDescriptor)'s `codec` names one:
//!
//! - [`KV_CODEC`] (`kv-lp/1`), a **full** payload: every live entry of one state in one
//!   shard, as alternating length-prefixed items `key, value` (`len (u32 LE) | bytes`), in
//!   key order. Restoring it starts the (shard, state) from these entries.
//! - [`KV_DELTA_CODEC`] (`kv-delta/1`), a **delta** payload: the entries of one state in
//!   one shard written or deleted since the subtask's previous snapshot, as alternating
//!   items `key, change`, in key order. A change is one tag byte, [`DELTA_PUT`] followed
//!   by the new value, or [`DELTA_DELETE`] alone (a tombstone). Restoring it applies the
//!   changes on top of what the (shard, state) holds.
//!
//! A manifest lists, per operator, shard and state, one full payload and then the deltas
//! taken after it, oldest first (the chain); restore applies them in that order. Keys are
//! the state's table keys without the shard: `namespace length (u32 BE) | namespace |
//! record key`.

/// Codec of a full payload.
pub const KV_CODEC: &str = "kv-lp/1";
/// Codec of a delta payload.
pub const KV_DELTA_CODEC: &str = "kv-delta/1";
/// Tag of a delta change that writes a value (the value follows the tag).
pub const DELTA_PUT: u8 = 1;
/// Tag of a delta change that deletes the key (nothing follows the tag).
pub const DELTA_DELETE: u8 = 0;

/// Appends one length-prefixed item.
pub fn push_item(out: &mut Vec<u8>, item: &[u8]) {
    out.extend_from_slice(&(item.len() as u32).to_le_bytes());
    out.extend_from_slice(item);
}

/// Appends one delta change: `key`, then [`DELTA_PUT`] and `value`, or [`DELTA_DELETE`]
/// when `value` is `None`.
pub fn push_change(out: &mut Vec<u8>, key: &[u8], value: Option<&[u8]>) {
    push_item(out, key);
    match value {
        Some(v) => {
            out.extend_from_slice(&(v.len() as u32 + 1).to_le_bytes());
            out.push(DELTA_PUT);
            out.extend_from_slice(v);
        }
        None => {
            out.extend_from_slice(&1u32.to_le_bytes());
            out.push(DELTA_DELETE);
        }
    }
}

/// The items of a payload, borrowed; `None` if it is truncated.
fn items(mut buf: &[u8]) -> Option<Vec<&[u8]>> {
    let mut out = Vec::new();
    while !buf.is_empty() {
        let len = u32::from_le_bytes(buf.get(..4)?.try_into().ok()?) as usize;
        out.push(buf.get(4..4 + len)?);
        buf = &buf[4 + len..];
    }
    Some(out)
}

/// The `(key, value)` entries of a [`KV_CODEC`] payload, borrowed; `None` if it is
/// truncated or holds an odd number of items.
pub fn entries(buf: &[u8]) -> Option<Vec<(&[u8], &[u8])>> {
    let flat = items(buf)?;
    if flat.len() % 2 != 0 {
        return None;
    }
    Some(flat.chunks_exact(2).map(|p| (p[0], p[1])).collect())
}

/// The `(key, change)` entries of a [`KV_DELTA_CODEC`] payload, borrowed: `Some(value)`
/// for a put, `None` for a delete. `None` if it is truncated, holds an odd number of items
/// or a change with an unknown tag (or a delete followed by bytes).
#[allow(clippy::type_complexity)]
pub fn changes(buf: &[u8]) -> Option<Vec<(&[u8], Option<&[u8]>)>> {
    let flat = items(buf)?;
    if flat.len() % 2 != 0 {
        return None;
    }
    flat.chunks_exact(2)
        .map(|p| match p[1].split_first() {
            Some((&DELTA_PUT, v)) => Some((p[0], Some(v))),
            Some((&DELTA_DELETE, [])) => Some((p[0], None)),
            _ => None,
        })
        .collect()
}

/// A payload decoded by its codec: full entries (every value `Some`) or delta changes.
/// `Err` names what is wrong: an unknown codec, or a malformed payload.
#[allow(clippy::type_complexity)]
pub fn decode<'a>(codec: &str, buf: &'a [u8]) -> Result<Vec<(&'a [u8], Option<&'a [u8]>)>, String> {
    match codec {
        KV_CODEC => entries(buf)
            .map(|e| e.into_iter().map(|(k, v)| (k, Some(v))).collect())
            .ok_or_else(|| format!("{KV_CODEC} payload is truncated or malformed")),
        KV_DELTA_CODEC => changes(buf)
            .ok_or_else(|| format!("{KV_DELTA_CODEC} payload is truncated or malformed")),
        other => Err(format!(
            "unknown payload codec `{other}` (this host reads {KV_CODEC} and {KV_DELTA_CODEC})"
        )),
    }
}

/// The entries a chain of one (state, shard) restores to: `chain` holds its payloads with
/// their codecs in chain order (a full payload, then its deltas, oldest first). Every key
/// that ends up with a value, once, with its last value, in key order. `Err` as
/// [`decode`]'s.
#[allow(clippy::type_complexity)]
pub fn fold<'a>(chain: &[(&str, &'a [u8])]) -> Result<Vec<(&'a [u8], &'a [u8])>, String> {
    if let [(KV_CODEC, buf)] = chain {
        // A lone full payload is already folded (written in key order).
        return entries(buf).ok_or_else(|| format!("{KV_CODEC} payload is truncated or malformed"));
    }
    let decoded = chain
        .iter()
        .map(|(codec, buf)| decode(codec, buf))
        .collect::<Result<Vec<_>, _>>()?;
    let sorted = |p: &[(&[u8], Option<&[u8]>)]| p.windows(2).all(|w| w[0].0 < w[1].0);
    if decoded.iter().all(|p| sorted(p)) {
        // Every payload is written in key order: linear merges, a newer change winning a tie
        // (where a map would pay a search per key). A newer-wins merge is associative, so
        // the deltas (each usually a small part of the state) are merged first, oldest
        // first, and the result once into the chain's first payload: one pass over the
        // large full payload instead of one per delta. Deletes survive until that last
        // merge, which drops them as it goes.
        let mut payloads = decoded.into_iter();
        let first = payloads.next().unwrap_or_default();
        let mut newer: Vec<(&[u8], Option<&[u8]>)> = Vec::new();
        for delta in payloads {
            newer = if newer.is_empty() {
                delta
            } else {
                let mut merged = Vec::with_capacity(newer.len() + delta.len());
                merge(newer, delta, |e| merged.push(e));
                merged
            };
        }
        let mut folded = Vec::with_capacity(first.len() + newer.len());
        merge(first, newer, |(k, v)| {
            if let Some(v) = v {
                folded.push((k, v));
            }
        });
        return Ok(folded);
    }
    // Not in key order (never written so by this host): fold through a map.
    let mut map = std::collections::BTreeMap::new();
    for (k, v) in decoded.into_iter().flatten() {
        map.insert(k, v);
    }
    Ok(map.into_iter().filter_map(|(k, v)| Some((k, v?))).collect())
}

/// Merges two runs of changes in key order into `out`, in key order; on an equal key only
/// `newer`'s change.
#[allow(clippy::type_complexity)]
fn merge<'a>(
    older: Vec<(&'a [u8], Option<&'a [u8]>)>,
    newer: Vec<(&'a [u8], Option<&'a [u8]>)>,
    mut out: impl FnMut((&'a [u8], Option<&'a [u8]>)),
) {
    let (mut a, mut b) = (older.into_iter().peekable(), newer.into_iter().peekable());
    loop {
        let next = match (a.peek(), b.peek()) {
            (Some(x), Some(y)) => match x.0.cmp(y.0) {
                std::cmp::Ordering::Less => a.next(),
                std::cmp::Ordering::Greater => b.next(),
                std::cmp::Ordering::Equal => {
                    a.next();
                    b.next()
                }
            },
            (Some(_), None) => a.next(),
            (None, _) => b.next(),
        };
        match next {
            Some(e) => out(e),
            None => break,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_and_delta_payloads_round_trip() {
        let mut full = Vec::new();
        push_item(&mut full, b"a");
        push_item(&mut full, b"1");
        push_item(&mut full, b"b");
        push_item(&mut full, b"");
        assert_eq!(
            entries(&full).unwrap(),
            vec![(&b"a"[..], &b"1"[..]), (&b"b"[..], &b""[..])]
        );
        let mut delta = Vec::new();
        push_change(&mut delta, b"a", Some(b"2"));
        push_change(&mut delta, b"b", None);
        push_change(&mut delta, b"c", Some(b""));
        assert_eq!(
            changes(&delta).unwrap(),
            vec![
                (&b"a"[..], Some(&b"2"[..])),
                (&b"b"[..], None),
                (&b"c"[..], Some(&b""[..]))
            ]
        );
        assert_eq!(decode(KV_DELTA_CODEC, &delta).unwrap().len(), 3);
        assert_eq!(
            decode(KV_CODEC, &full).unwrap()[0],
            (&b"a"[..], Some(&b"1"[..]))
        );
    }

    #[test]
    fn a_chain_folds_to_each_key_s_last_value_in_key_order() {
        let mut full = Vec::new();
        push_item(&mut full, b"a");
        push_item(&mut full, b"1");
        push_item(&mut full, b"c");
        push_item(&mut full, b"3");
        let mut d1 = Vec::new();
        push_change(&mut d1, b"a", None);
        push_change(&mut d1, b"b", Some(b"2"));
        let mut d2 = Vec::new();
        push_change(&mut d2, b"a", Some(b"9"));
        push_change(&mut d2, b"c", None);
        let chain = [
            (KV_CODEC, full.as_slice()),
            (KV_DELTA_CODEC, d1.as_slice()),
            (KV_DELTA_CODEC, d2.as_slice()),
        ];
        assert_eq!(
            fold(&chain).unwrap(),
            vec![(&b"a"[..], &b"9"[..]), (&b"b"[..], &b"2"[..])]
        );
        assert_eq!(fold(&chain[..1]).unwrap().len(), 2);
        assert!(fold(&[(KV_DELTA_CODEC, &full[..3])]).is_err());
    }

    proptest::proptest! {
        /// The merge of sorted payloads equals a map's fold, and so does the fallback for
        /// payloads out of key order.
        #[test]
        fn the_fold_is_each_key_s_last_change(
            chain in proptest::collection::vec(
                proptest::collection::btree_map(0u8..40, proptest::option::of(0u8..4), 0..30),
                1..6,
            ),
            shuffle in proptest::bool::ANY,
            // A chain may start with a delta (a state that started empty), deletes and all.
            first_delta in proptest::bool::ANY,
        ) {
            let mut model = std::collections::BTreeMap::new();
            let mut bufs = Vec::new();
            for (i, changes) in chain.iter().enumerate() {
                let mut buf = Vec::new();
                let mut entries: Vec<_> = changes.iter().collect();
                if shuffle && i > 0 {
                    // A delta out of key order (a full payload is always in key order).
                    entries.reverse();
                }
                for (k, v) in entries {
                    let v = v.map(|v| [v]);
                    if i == 0 && !first_delta {
                        // A full first payload: only puts.
                        push_item(&mut buf, &[*k]);
                        push_item(&mut buf, &v.unwrap_or([9]));
                        model.insert(vec![*k], Some(v.unwrap_or([9]).to_vec()));
                    } else {
                        push_change(&mut buf, &[*k], v.as_ref().map(|v| &v[..]));
                        model.insert(vec![*k], v.map(|v| v.to_vec()));
                    }
                }
                bufs.push(buf);
            }
            let with_codecs: Vec<(&str, &[u8])> = bufs
                .iter()
                .enumerate()
                .map(|(i, b)| {
                    let full = i == 0 && !first_delta;
                    (if full { KV_CODEC } else { KV_DELTA_CODEC }, b.as_slice())
                })
                .collect();
            let got: Vec<(Vec<u8>, Vec<u8>)> = fold(&with_codecs)
                .unwrap()
                .into_iter()
                .map(|(k, v)| (k.to_vec(), v.to_vec()))
                .collect();
            let want: Vec<(Vec<u8>, Vec<u8>)> = model
                .into_iter()
                .filter_map(|(k, v)| Some((k, v?)))
                .collect();
            proptest::prop_assert_eq!(got, want);
        }
    }

    #[test]
    fn malformed_payloads_are_refused() {
        let mut delta = Vec::new();
        push_change(&mut delta, b"a", Some(b"2"));
        assert!(changes(&delta[..delta.len() - 1]).is_none(), "truncated");
        let mut bad = Vec::new();
        push_item(&mut bad, b"a");
        push_item(&mut bad, &[7, 1]);
        assert!(changes(&bad).is_none(), "unknown tag");
        let mut bad = Vec::new();
        push_item(&mut bad, b"a");
        push_item(&mut bad, &[DELTA_DELETE, 1]);
        assert!(changes(&bad).is_none(), "a delete with bytes");
        let mut odd = Vec::new();
        push_item(&mut odd, b"a");
        assert!(entries(&odd).is_none());
        assert!(decode("zstd/1", &odd).unwrap_err().contains("zstd/1"));
    }
}
