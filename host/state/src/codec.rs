//! Length-prefixed encoding of list items and map entries inside one stored value:
//! a sequence of `len (u32 LE) | bytes`; a map alternates keys and values.

/// Appends one length-prefixed item.
pub fn push_item(out: &mut Vec<u8>, item: &[u8]) {
    out.extend_from_slice(&(item.len() as u32).to_le_bytes());
    out.extend_from_slice(item);
}

/// Decodes every item; `None` if the buffer is truncated.
pub fn items(mut buf: &[u8]) -> Option<Vec<Vec<u8>>> {
    let mut out = Vec::new();
    while !buf.is_empty() {
        let len = u32::from_le_bytes(buf.get(..4)?.try_into().ok()?) as usize;
        let item = buf.get(4..4 + len)?;
        out.push(item.to_vec());
        buf = &buf[4 + len..];
    }
    Some(out)
}

/// Decodes alternating key/value items; `None` if truncated or odd.
pub fn pairs(buf: &[u8]) -> Option<Vec<(Vec<u8>, Vec<u8>)>> {
    let flat = items(buf)?;
    if flat.len() % 2 != 0 {
        return None;
    }
    let mut it = flat.into_iter();
    let mut out = Vec::new();
    while let (Some(k), Some(v)) = (it.next(), it.next()) {
        out.push((k, v));
    }
    Some(out)
}
