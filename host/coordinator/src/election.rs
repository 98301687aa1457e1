//! Coordinator leadership (design §14.5, "Coordinator HA"): one active coordinator holds a
//! lease; its term is the fencing token.
//!
//! - An [`Election`] elects one leader among the coordinators of a cluster and tells a
//!   standby who leads. Backends: [`LocalElection`] (one coordinator: always the leader,
//!   terms from a counter), and etcd in the coordinator process (`nop-stream-server`).
//! - A [`Leadership`] is held, never assumed: it is valid only until its lease's deadline
//!   on this process's monotonic clock, which each renewal moves forward. A process that
//!   was stopped (SIGSTOP, a long pause) finds its deadline passed when it runs again, and
//!   acts on nothing before it renews: the coordinator role checks it before every barrier,
//!   manifest and commit (`CoordinatorOptions::leadership`). Safety never rests on that
//!   clock alone (etcd renews leases to their full TTL on its own leader changes): nodes
//!   refuse a lower term than the highest they saw, etcd writes are transactions guarded on
//!   the term, and checkpoint ownership is decided by the store's conditional creates.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Leadership held by this process.
#[derive(Debug)]
pub struct Leadership {
    /// The term: the fencing token every command and guarded write carries. Greater than
    /// every earlier leader's.
    pub term: u64,
    valid_until: Mutex<Instant>,
    lost: AtomicBool,
}

impl Leadership {
    /// Leadership of `term`, valid for `ttl` from now.
    pub fn new(term: u64, ttl: Duration) -> Arc<Self> {
        Arc::new(Leadership {
            term,
            valid_until: Mutex::new(Instant::now() + ttl),
            lost: AtomicBool::new(false),
        })
    }

    /// Leadership of `term`, valid until `until` (the send time of the lease renewal
    /// acknowledged last, plus the TTL).
    pub fn until(term: u64, until: Instant) -> Arc<Self> {
        Arc::new(Leadership {
            term,
            valid_until: Mutex::new(until),
            lost: AtomicBool::new(false),
        })
    }

    /// Whether this process may act as the leader now.
    pub fn is_valid(&self) -> bool {
        !self.lost.load(Ordering::SeqCst)
            && Instant::now() < *self.valid_until.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A renewal acknowledged at `at` extends the lease to `at + ttl` (never backwards).
    pub fn renewed(&self, at: Instant, ttl: Duration) {
        let mut until = self.valid_until.lock().unwrap_or_else(|p| p.into_inner());
        *until = (*until).max(at + ttl);
    }

    /// The lease is gone (expired, revoked, or another leader holds the key): for good.
    pub fn lose(&self) {
        self.lost.store(true, Ordering::SeqCst);
    }

    /// Whether [`Self::lose`] was called.
    pub fn is_lost(&self) -> bool {
        self.lost.load(Ordering::SeqCst)
    }
}

/// Who leads a cluster, as a standby tells it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaderInfo {
    /// The leader's advertised address (nodes and the CLI reach it there).
    pub addr: String,
    /// The leader's HTTP address (`/metrics`, `/api/v1/`), if it serves one.
    pub http: Option<String>,
    /// Its term.
    pub term: u64,
}

/// What a coordinator announces when it takes part in an election: the address nodes and
/// the CLI reach it at and, if it serves HTTP, that address too. Encoded as `ADDR` or
/// `ADDR http=HTTP_ADDR` (the value an election backend stores and hands back).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Announcement {
    /// The cluster address (`HOST:PORT`, QUIC).
    pub addr: String,
    /// The HTTP address (`HOST:PORT`), if any.
    pub http: Option<String>,
}

impl Announcement {
    /// The encoded form an [`Election`] campaigns with.
    pub fn encode(&self) -> String {
        match &self.http {
            Some(h) => format!("{} http={h}", self.addr),
            None => self.addr.clone(),
        }
    }

    /// Reads [`Self::encode`]'s form; a bare address has no HTTP address.
    pub fn decode(value: &str) -> Self {
        match value.split_once(" http=") {
            Some((addr, http)) => Announcement {
                addr: addr.trim().to_owned(),
                http: Some(http.trim().to_owned()).filter(|h| !h.is_empty()),
            },
            None => Announcement {
                addr: value.trim().to_owned(),
                http: None,
            },
        }
    }
}

/// Why an election operation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("election {backend}: {message}")]
pub struct ElectionError {
    /// The backend, e.g. `etcd http://127.0.0.1:2379` (no credentials).
    pub backend: String,
    /// What went wrong.
    pub message: String,
}

/// Elects one leader among a cluster's coordinators.
pub trait Election: Send + Sync + std::fmt::Debug {
    /// The backend for messages and `cluster status`, e.g. `etcd http://127.0.0.1:2379`
    /// (never credentials).
    fn describe(&self) -> String;

    /// The advertised cluster addresses of the coordinators taking part (the leader and
    /// the standbys), sorted.
    ///
    /// # Errors
    /// The backend cannot be reached.
    fn members(&self) -> Result<Vec<String>, ElectionError>;

    /// Campaigns until this coordinator (announced as `addr`, an [`Announcement`]'s
    /// encoded form) leads; returns the leadership, which the backend keeps renewing (and
    /// loses for good when it cannot).
    ///
    /// # Errors
    /// The backend cannot be reached.
    fn campaign(&self, addr: &str) -> Result<Arc<Leadership>, ElectionError>;

    /// The current leader, if any.
    ///
    /// # Errors
    /// The backend cannot be reached.
    fn leader(&self) -> Result<Option<LeaderInfo>, ElectionError>;

    /// Writes the backend refused this process because its leadership no longer held
    /// (a deposed leader's job-record writes); 0 for a backend that cannot refuse any.
    fn fenced_writes(&self) -> u64 {
        0
    }
}

/// One coordinator, always the leader: its term is one more than the last one recorded
/// at the storage location (a counter the caller persists), and its lease never expires.
#[derive(Debug)]
pub struct LocalElection {
    term: u64,
    addr: Mutex<String>,
}

impl LocalElection {
    /// Leadership of `term` (e.g. one more than the term a store recorded last).
    pub fn new(term: u64) -> Self {
        LocalElection {
            term,
            addr: Mutex::new(String::new()),
        }
    }
}

impl Election for LocalElection {
    fn describe(&self) -> String {
        "local (one coordinator)".into()
    }

    fn members(&self) -> Result<Vec<String>, ElectionError> {
        Ok(self.leader()?.map(|l| l.addr).into_iter().collect())
    }

    fn campaign(&self, addr: &str) -> Result<Arc<Leadership>, ElectionError> {
        *self.addr.lock().unwrap_or_else(|p| p.into_inner()) = addr.to_owned();
        // A century: the only coordinator never loses its lease.
        Ok(Leadership::new(
            self.term,
            Duration::from_secs(100 * 365 * 24 * 3600),
        ))
    }

    fn leader(&self) -> Result<Option<LeaderInfo>, ElectionError> {
        let addr = self.addr.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let a = Announcement::decode(&addr);
        Ok((!addr.is_empty()).then_some(LeaderInfo {
            addr: a.addr,
            http: a.http,
            term: self.term,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leadership_is_valid_until_its_deadline_or_its_loss() {
        let l = Leadership::new(7, Duration::from_millis(50));
        assert!(l.is_valid());
        std::thread::sleep(Duration::from_millis(80));
        assert!(
            !l.is_valid(),
            "a deadline passed (a paused process) is not leadership"
        );
        l.renewed(Instant::now(), Duration::from_millis(200));
        assert!(l.is_valid());
        // A renewal never moves the deadline back.
        l.renewed(
            Instant::now() - Duration::from_secs(10),
            Duration::from_millis(1),
        );
        assert!(l.is_valid());
        l.lose();
        assert!(!l.is_valid() && l.is_lost());
        l.renewed(Instant::now(), Duration::from_secs(10));
        assert!(!l.is_valid(), "a lost lease stays lost");
    }
}
