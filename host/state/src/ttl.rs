//! Processing time and the write-time prefix of TTL states (see the
//! [crate docs](crate#state-ttl)).

/// Processing time in ms since the Unix epoch.
pub type Clock = std::sync::Arc<dyn Fn() -> u64 + Send + Sync>;

pub(crate) fn system_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Bytes of the write-time prefix of a TTL state's stored values.
pub(crate) const TTL_PREFIX: usize = 8;

/// The value bytes of a TTL state's stored `stored` if it has not expired at `now`;
/// `None` if it has; the whole of `stored` when `ttl` is `None`. A stored value shorter
/// than the prefix (never written so) reads as expired.
pub(crate) fn live(stored: &[u8], ttl: Option<u64>, now: u64) -> Option<&[u8]> {
    let Some(ttl) = ttl else {
        return Some(stored);
    };
    let written = u64::from_be_bytes(stored.get(..TTL_PREFIX)?.try_into().ok()?);
    (written.saturating_add(ttl) > now).then(|| &stored[TTL_PREFIX..])
}
