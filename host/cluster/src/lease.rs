//! Node leases, pure: no I/O, no clock. Time is passed in as a [`Duration`] since an
//! arbitrary origin of the caller's monotonic clock (design §2.5, "Leases, generations,
//! fencing").
//!
//! - [`LeaseTable`] is the coordinator's view: grant with a TTL, renew on each heartbeat,
//!   expire. Every grant gets a fresh [`LeaseId`], so a renewal presenting an older lease
//!   of the same node is refused ([`RenewError::StaleLease`]).
//! - [`NodeLease`] is the node's view and implements the rule "a node that cannot renew
//!   stops its own tasks before the coordinator's view expires": its deadline is the send
//!   time of the last *acknowledged* renewal + TTL − safety margin. The coordinator renews
//!   at the time it *receives* that renewal, which is later, so the node's deadline always
//!   precedes the coordinator's expiry by at least the margin (given clocks that advance
//!   at the same rate; the margin absorbs rate drift and scheduling delay).
//!
//! Leases make conflicts rare; they do not exclude them (a paused node cannot act on its
//! deadline). Safety comes from fencing at the receiving end (generations), not from here.

use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::time::Duration;

use crate::identity::NodeId;

/// Identifies one grant. Strictly increasing within a [`LeaseTable`]; never reused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LeaseId(pub u64);

impl fmt::Display for LeaseId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "lease-{}", self.0)
    }
}

/// Lease timing settings, shared by the coordinator and the nodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseConfig {
    /// How long a grant or renewal keeps a lease alive at the coordinator. Default 10 s;
    /// tests use about 2 s.
    pub ttl: Duration,
    /// How often a node sends a renewal heartbeat. Default 2 s. Must be below
    /// `ttl - safety_margin`, or a healthy node would stop between two heartbeats.
    pub heartbeat_interval: Duration,
    /// How long before its TTL runs out (counted from the send time) a node stops its tasks.
    /// Default 2 s. Must be below `ttl`.
    pub safety_margin: Duration,
}

impl Default for LeaseConfig {
    fn default() -> Self {
        Self {
            ttl: Duration::from_secs(10),
            heartbeat_interval: Duration::from_secs(2),
            safety_margin: Duration::from_secs(2),
        }
    }
}

/// A [`LeaseConfig`] whose timings cannot work.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LeaseConfigError {
    /// `safety_margin >= ttl`: a node would stop before it started.
    #[error("lease safety margin {margin:?} must be below the TTL {ttl:?}")]
    MarginNotBelowTtl {
        /// The margin.
        margin: Duration,
        /// The TTL.
        ttl: Duration,
    },
    /// `heartbeat_interval >= ttl - safety_margin`: a healthy node would stop between beats.
    #[error("heartbeat interval {interval:?} must be below TTL - margin = {window:?}")]
    HeartbeatTooSlow {
        /// The interval.
        interval: Duration,
        /// `ttl - safety_margin`.
        window: Duration,
    },
    /// A zero heartbeat interval.
    #[error("heartbeat interval must be positive")]
    ZeroHeartbeat,
}

impl LeaseConfig {
    /// Checks the timings.
    ///
    /// # Errors
    ///
    /// A [`LeaseConfigError`] naming the offending values.
    pub fn validate(&self) -> Result<(), LeaseConfigError> {
        if self.safety_margin >= self.ttl {
            return Err(LeaseConfigError::MarginNotBelowTtl {
                margin: self.safety_margin,
                ttl: self.ttl,
            });
        }
        if self.heartbeat_interval.is_zero() {
            return Err(LeaseConfigError::ZeroHeartbeat);
        }
        let window = self.ttl - self.safety_margin;
        if self.heartbeat_interval >= window {
            return Err(LeaseConfigError::HeartbeatTooSlow {
                interval: self.heartbeat_interval,
                window,
            });
        }
        Ok(())
    }
}

/// One node's lease as the coordinator sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lease {
    /// This grant's id.
    pub id: LeaseId,
    /// The holder.
    pub node: NodeId,
    /// When it was granted.
    pub granted_at: Duration,
    /// When it expires unless renewed: live while `now < expires_at`.
    pub expires_at: Duration,
}

/// The result of [`LeaseTable::grant`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Grant {
    /// The new lease.
    pub lease: Lease,
    /// The node's previous lease, now invalid (a re-registration); the caller fences what
    /// ran under it.
    pub replaced: Option<Lease>,
}

/// What a new registration of a node finds in the [`LeaseTable`] ([`LeaseTable::claim`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Claim {
    /// The node holds no live lease: the registration is granted.
    Free,
    /// The node holds a live lease, but nothing was heard under it (grant or renewal) for
    /// at least the silence allowed: its process is presumed gone (a restarted node), and
    /// the registration replaces the lease.
    Silent(Lease),
    /// The node holds a live lease renewed `heard_ago` ago, within the silence allowed:
    /// its holder is presumed alive, and a second registration is refused while it is.
    Held {
        /// The lease.
        lease: Lease,
        /// Since the last grant or renewal.
        heard_ago: Duration,
    },
}

/// Why a renewal or release was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RenewError {
    /// The node holds no lease (never granted, expired and reaped, or released).
    #[error("{node} holds no lease (presented {presented}); it must register again")]
    UnknownNode {
        /// The node.
        node: NodeId,
        /// The id it presented.
        presented: LeaseId,
    },
    /// The node presented an older (or otherwise different) lease than its current one.
    #[error("{node} presented {presented} but its current lease is {current}")]
    StaleLease {
        /// The node.
        node: NodeId,
        /// The id it presented.
        presented: LeaseId,
        /// Its current lease id.
        current: LeaseId,
    },
    /// The lease ran out before this renewal arrived.
    #[error("{node}'s {lease} expired at {expired_at:?}, renewal arrived at {now:?}")]
    Expired {
        /// The node.
        node: NodeId,
        /// Its lease id.
        lease: LeaseId,
        /// When it expired.
        expired_at: Duration,
        /// When the renewal arrived.
        now: Duration,
    },
}

/// The coordinator's lease table.
#[derive(Clone, Debug)]
pub struct LeaseTable {
    ttl: Duration,
    next_id: u64,
    leases: BTreeMap<NodeId, Lease>,
}

impl LeaseTable {
    /// An empty table granting leases of `ttl`, ids from 1.
    pub fn new(ttl: Duration) -> Self {
        Self::with_first_id(ttl, 1)
    }

    /// An empty table whose first id is `first_id`. A restarted coordinator starts above
    /// every id it handed out before (e.g. from its durable fencing token), so a node's
    /// pre-restart lease can never match a new one.
    pub fn with_first_id(ttl: Duration, first_id: u64) -> Self {
        Self {
            ttl,
            next_id: first_id,
            leases: BTreeMap::new(),
        }
    }

    /// The TTL of every grant and renewal.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// Grants `node` a fresh lease valid until `now + ttl`, replacing any lease it held.
    pub fn grant(&mut self, node: NodeId, now: Duration) -> Grant {
        let id = LeaseId(self.next_id);
        self.next_id += 1;
        let lease = Lease {
            id,
            node,
            granted_at: now,
            expires_at: now.saturating_add(self.ttl),
        };
        let replaced = self.leases.insert(node, lease);
        Grant { lease, replaced }
    }

    /// Renews `node`'s lease `id` on a heartbeat received at `now`: expiry becomes
    /// `now + ttl` (never earlier than before).
    ///
    /// # Errors
    ///
    /// [`RenewError::UnknownNode`], [`RenewError::StaleLease`] if `id` is not the current
    /// lease, [`RenewError::Expired`] if `now >= expires_at` (the table is unchanged; the
    /// next [`LeaseTable::expire`] reports it).
    pub fn renew(&mut self, node: NodeId, id: LeaseId, now: Duration) -> Result<Lease, RenewError> {
        let ttl = self.ttl;
        let lease = self.current_mut(node, id)?;
        if now >= lease.expires_at {
            return Err(RenewError::Expired {
                node,
                lease: id,
                expired_at: lease.expires_at,
                now,
            });
        }
        lease.expires_at = lease.expires_at.max(now.saturating_add(ttl));
        Ok(*lease)
    }

    /// Removes `node`'s lease `id` on an orderly leave.
    ///
    /// # Errors
    ///
    /// [`RenewError::UnknownNode`] or [`RenewError::StaleLease`].
    pub fn release(&mut self, node: NodeId, id: LeaseId) -> Result<Lease, RenewError> {
        self.current_mut(node, id)?;
        Ok(self.leases.remove(&node).expect("checked present"))
    }

    /// Removes and returns every lease with `expires_at <= now`, in node order. The caller
    /// fences what ran under them.
    pub fn expire(&mut self, now: Duration) -> Vec<Lease> {
        let expired: Vec<Lease> = self
            .leases
            .values()
            .filter(|l| l.expires_at <= now)
            .copied()
            .collect();
        for l in &expired {
            self.leases.remove(&l.node);
        }
        expired
    }

    /// When the holder of `lease` was last heard from: its grant or latest renewal
    /// (renewals set `expires_at` to the receipt time + TTL).
    pub fn heard_at(&self, lease: &Lease) -> Duration {
        lease
            .expires_at
            .saturating_sub(self.ttl)
            .max(lease.granted_at)
    }

    /// What a registration of `node` at `now` finds (see [`Claim`]): a live lease whose
    /// holder was heard from less than `silence` ago is [`Claim::Held`]. A node renews
    /// every heartbeat interval, so `silence` is that interval with room for delays (the
    /// coordinator uses 1.5 intervals); a restarted node waits at most that long before
    /// its old lease counts as [`Claim::Silent`].
    pub fn claim(&self, node: NodeId, now: Duration, silence: Duration) -> Claim {
        match self.leases.get(&node) {
            Some(l) if now < l.expires_at => {
                let heard_ago = now.saturating_sub(self.heard_at(l));
                if heard_ago >= silence {
                    Claim::Silent(*l)
                } else {
                    Claim::Held {
                        lease: *l,
                        heard_ago,
                    }
                }
            }
            _ => Claim::Free,
        }
    }

    /// `node`'s current lease, expired or not.
    pub fn get(&self, node: NodeId) -> Option<&Lease> {
        self.leases.get(&node)
    }

    /// Whether `node` holds a lease that is live at `now`.
    pub fn is_live(&self, node: NodeId, now: Duration) -> bool {
        self.leases.get(&node).is_some_and(|l| now < l.expires_at)
    }

    /// The earliest expiry in the table: when to call [`LeaseTable::expire`] next.
    pub fn next_expiry(&self) -> Option<Duration> {
        self.leases.values().map(|l| l.expires_at).min()
    }

    /// All current leases, in node order.
    pub fn iter(&self) -> impl Iterator<Item = &Lease> {
        self.leases.values()
    }

    fn current_mut(&mut self, node: NodeId, presented: LeaseId) -> Result<&mut Lease, RenewError> {
        let lease = self
            .leases
            .get_mut(&node)
            .ok_or(RenewError::UnknownNode { node, presented })?;
        if lease.id != presented {
            return Err(RenewError::StaleLease {
                node,
                presented,
                current: lease.id,
            });
        }
        Ok(lease)
    }
}

/// Sequence number of a renewal a node sent, echoed in the coordinator's ack.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RenewalSeq(pub u64);

/// Most renewals a [`NodeLease`] remembers awaiting an ack; older ones are forgotten (an ack
/// for them is then ignored, which only makes the node stop earlier).
pub const MAX_PENDING_RENEWALS: usize = 64;

/// What a node must do at a given time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeLeaseStatus {
    /// The lease holds until `deadline` (exclusive); keep running.
    Valid {
        /// The node-side deadline.
        deadline: Duration,
    },
    /// The deadline passed: stop every task now and register again. Sticky.
    MustStop {
        /// The deadline that passed.
        deadline: Duration,
    },
}

/// Why a node refused an ack.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NodeLeaseError {
    /// The ack is for another lease (an older registration).
    #[error("ack for {acked} but this node holds {current}")]
    OtherLease {
        /// The acked lease.
        acked: LeaseId,
        /// The node's lease.
        current: LeaseId,
    },
    /// The ack names a renewal this node did not send or has forgotten.
    #[error("ack for unknown renewal {0:?}")]
    UnknownRenewal(RenewalSeq),
    /// The node already stopped under this lease; it must register again.
    #[error("lease {0} already ran out on this node")]
    Stopped(LeaseId),
}

/// A node's view of its own lease.
#[derive(Clone, Debug)]
pub struct NodeLease {
    id: LeaseId,
    window: Duration,
    deadline: Duration,
    next_seq: u64,
    pending: VecDeque<(RenewalSeq, Duration)>,
    stopped: bool,
}

impl NodeLease {
    /// The lease `id` granted in reply to a registration sent at `requested_at` (the send
    /// time, not the receipt time of the grant). Deadline: `requested_at + ttl − margin`.
    ///
    /// # Errors
    ///
    /// [`LeaseConfigError`] if `config` is invalid.
    pub fn new(
        id: LeaseId,
        config: &LeaseConfig,
        requested_at: Duration,
    ) -> Result<Self, LeaseConfigError> {
        config.validate()?;
        let window = config.ttl - config.safety_margin;
        Ok(Self {
            id,
            window,
            deadline: requested_at.saturating_add(window),
            next_seq: 1,
            pending: VecDeque::new(),
            stopped: false,
        })
    }

    /// The lease this node holds.
    pub fn id(&self) -> LeaseId {
        self.id
    }

    /// The current node-side deadline: the node runs tasks only while `now < deadline`.
    pub fn deadline(&self) -> Duration {
        self.deadline
    }

    /// Records a renewal sent at `now`; put the returned sequence number in the heartbeat.
    pub fn renewal_sent(&mut self, now: Duration) -> RenewalSeq {
        let seq = RenewalSeq(self.next_seq);
        self.next_seq += 1;
        if self.pending.len() == MAX_PENDING_RENEWALS {
            self.pending.pop_front();
        }
        self.pending.push_back((seq, now));
        seq
    }

    /// Applies the coordinator's ack of renewal `seq` of lease `id`: the deadline becomes
    /// at least that renewal's send time + TTL − margin. Earlier pending renewals are
    /// dropped (their deadlines would be earlier). Returns the new deadline.
    ///
    /// # Errors
    ///
    /// [`NodeLeaseError::OtherLease`], [`NodeLeaseError::UnknownRenewal`], or
    /// [`NodeLeaseError::Stopped`] if [`NodeLease::status`] already said stop.
    pub fn renewal_acked(
        &mut self,
        id: LeaseId,
        seq: RenewalSeq,
    ) -> Result<Duration, NodeLeaseError> {
        if id != self.id {
            return Err(NodeLeaseError::OtherLease {
                acked: id,
                current: self.id,
            });
        }
        if self.stopped {
            return Err(NodeLeaseError::Stopped(self.id));
        }
        let pos = self
            .pending
            .iter()
            .position(|(s, _)| *s == seq)
            .ok_or(NodeLeaseError::UnknownRenewal(seq))?;
        let (_, sent_at) = self.pending[pos];
        self.pending.drain(..=pos);
        self.deadline = self.deadline.max(sent_at.saturating_add(self.window));
        Ok(self.deadline)
    }

    /// Whether the node may keep running at `now`. Once it returns
    /// [`NodeLeaseStatus::MustStop`] it always does.
    pub fn status(&mut self, now: Duration) -> NodeLeaseStatus {
        if now >= self.deadline {
            self.stopped = true;
        }
        if self.stopped {
            NodeLeaseStatus::MustStop {
                deadline: self.deadline,
            }
        } else {
            NodeLeaseStatus::Valid {
                deadline: self.deadline,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const TTL: Duration = Duration::from_millis(2000);

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn config() -> LeaseConfig {
        LeaseConfig {
            ttl: TTL,
            heartbeat_interval: ms(500),
            safety_margin: ms(500),
        }
    }

    #[test]
    fn grant_renew_expire() {
        let mut t = LeaseTable::new(TTL);
        let n = NodeId(1);
        let g = t.grant(n, ms(100));
        assert_eq!(g.lease.expires_at, ms(2100));
        assert_eq!(g.replaced, None);
        assert!(t.is_live(n, ms(2099)) && !t.is_live(n, ms(2100)));
        assert_eq!(
            t.renew(n, g.lease.id, ms(1000)).unwrap().expires_at,
            ms(3000)
        );
        assert_eq!(t.next_expiry(), Some(ms(3000)));
        assert!(t.expire(ms(2999)).is_empty());
        assert_eq!(
            t.expire(ms(3000)),
            vec![Lease {
                expires_at: ms(3000),
                ..g.lease
            }]
        );
        assert!(t.get(n).is_none());
        assert!(matches!(
            t.renew(n, g.lease.id, ms(3001)),
            Err(RenewError::UnknownNode { .. })
        ));
    }

    #[test]
    fn a_late_renewal_is_refused_and_leaves_the_lease_for_expire() {
        let mut t = LeaseTable::new(TTL);
        let g = t.grant(NodeId(1), ms(0));
        let err = t.renew(NodeId(1), g.lease.id, ms(2000)).unwrap_err();
        assert_eq!(
            err,
            RenewError::Expired {
                node: NodeId(1),
                lease: g.lease.id,
                expired_at: ms(2000),
                now: ms(2000)
            }
        );
        assert_eq!(t.expire(ms(2000)).len(), 1);
    }

    #[test]
    fn renewal_never_shortens_and_old_lease_ids_are_refused() {
        let mut t = LeaseTable::new(TTL);
        let n = NodeId(2);
        let first = t.grant(n, ms(0)).lease;
        t.renew(n, first.id, ms(1500)).unwrap();
        // An out-of-order (earlier-timestamped) renewal does not shorten the lease.
        assert_eq!(t.renew(n, first.id, ms(1000)).unwrap().expires_at, ms(3500));
        let second = t.grant(n, ms(1600));
        assert_eq!(second.replaced.map(|l| l.id), Some(first.id));
        assert!(second.lease.id > first.id);
        let err = t.renew(n, first.id, ms(1700)).unwrap_err();
        assert_eq!(
            err.to_string(),
            "node-2 presented lease-1 but its current lease is lease-2"
        );
        assert!(matches!(
            t.release(n, first.id),
            Err(RenewError::StaleLease { .. })
        ));
        assert_eq!(t.release(n, second.lease.id).unwrap().id, second.lease.id);
        assert!(t.iter().next().is_none());
    }

    #[test]
    fn a_registration_finds_a_held_a_silent_or_no_lease() {
        let mut t = LeaseTable::new(ms(2000));
        let n = NodeId(1);
        let silence = ms(450);
        assert_eq!(t.claim(n, ms(0), silence), Claim::Free);
        let l = t.grant(n, ms(100)).lease;
        // Renewed at 1000: held until 450 ms of silence, then silent, then free once expired.
        t.renew(n, l.id, ms(1000)).unwrap();
        assert_eq!(
            t.claim(n, ms(1200), silence),
            Claim::Held {
                lease: *t.get(n).unwrap(),
                heard_ago: ms(200)
            }
        );
        assert!(matches!(t.claim(n, ms(1450), silence), Claim::Silent(x) if x.id == l.id));
        assert_eq!(t.claim(n, ms(3000), silence), Claim::Free);
        // Heard from at the grant when never renewed.
        let mut t = LeaseTable::new(ms(2000));
        t.grant(n, ms(100));
        assert!(
            matches!(t.claim(n, ms(300), silence), Claim::Held { heard_ago, .. } if heard_ago == ms(200))
        );
        assert!(matches!(t.claim(n, ms(600), silence), Claim::Silent(_)));
        // Another node's lease is no matter.
        assert_eq!(t.claim(NodeId(2), ms(300), silence), Claim::Free);
    }

    #[test]
    fn a_restarted_table_starts_above_old_ids() {
        let mut t = LeaseTable::with_first_id(TTL, 500);
        assert_eq!(t.grant(NodeId(1), ms(0)).lease.id, LeaseId(500));
        assert_eq!(t.ttl(), TTL);
    }

    #[test]
    fn config_validation() {
        config().validate().unwrap();
        LeaseConfig::default().validate().unwrap();
        let bad = LeaseConfig {
            safety_margin: TTL,
            ..config()
        };
        assert!(matches!(
            bad.validate(),
            Err(LeaseConfigError::MarginNotBelowTtl { .. })
        ));
        let bad = LeaseConfig {
            heartbeat_interval: ms(1500),
            ..config()
        };
        assert!(matches!(
            bad.validate(),
            Err(LeaseConfigError::HeartbeatTooSlow { .. })
        ));
        let bad = LeaseConfig {
            heartbeat_interval: ms(0),
            ..config()
        };
        assert_eq!(bad.validate(), Err(LeaseConfigError::ZeroHeartbeat));
        assert!(
            NodeLease::new(
                LeaseId(1),
                &LeaseConfig {
                    safety_margin: TTL,
                    ..config()
                },
                ms(0)
            )
            .is_err()
        );
    }

    #[test]
    fn node_deadline_follows_acked_send_times() {
        let mut l = NodeLease::new(LeaseId(7), &config(), ms(100)).unwrap();
        assert_eq!(l.deadline(), ms(1600));
        let s1 = l.renewal_sent(ms(500));
        let s2 = l.renewal_sent(ms(1000));
        // Ack of the later renewal drops the earlier one.
        assert_eq!(l.renewal_acked(LeaseId(7), s2).unwrap(), ms(2500));
        assert_eq!(
            l.renewal_acked(LeaseId(7), s1),
            Err(NodeLeaseError::UnknownRenewal(s1))
        );
        assert_eq!(
            l.renewal_acked(LeaseId(6), s2),
            Err(NodeLeaseError::OtherLease {
                acked: LeaseId(6),
                current: LeaseId(7)
            })
        );
        assert_eq!(
            l.status(ms(2499)),
            NodeLeaseStatus::Valid { deadline: ms(2500) }
        );
        assert_eq!(
            l.status(ms(2500)),
            NodeLeaseStatus::MustStop { deadline: ms(2500) }
        );
    }

    #[test]
    fn must_stop_is_sticky() {
        let mut l = NodeLease::new(LeaseId(1), &config(), ms(0)).unwrap();
        let s = l.renewal_sent(ms(1000));
        assert!(matches!(
            l.status(ms(1500)),
            NodeLeaseStatus::MustStop { .. }
        ));
        assert_eq!(
            l.renewal_acked(LeaseId(1), s),
            Err(NodeLeaseError::Stopped(LeaseId(1)))
        );
        assert!(matches!(
            l.status(ms(1501)),
            NodeLeaseStatus::MustStop { .. }
        ));
    }

    #[test]
    fn pending_renewals_are_bounded() {
        let mut l = NodeLease::new(LeaseId(1), &config(), ms(0)).unwrap();
        let first = l.renewal_sent(ms(1));
        for i in 0..MAX_PENDING_RENEWALS as u64 {
            l.renewal_sent(ms(2 + i));
        }
        assert_eq!(
            l.renewal_acked(LeaseId(1), first),
            Err(NodeLeaseError::UnknownRenewal(first))
        );
        assert_eq!(l.id(), LeaseId(1));
    }

    /// One heartbeat in the simulation: sent `gap` ms after the previous, delivered after
    /// `delay` ms (None = lost), acked after `ack_delay` ms more (None = lost).
    fn beat() -> impl Strategy<Value = (u64, Option<u64>, Option<u64>)> {
        (
            1u64..1200,
            proptest::option::weighted(0.8, 0u64..1500),
            proptest::option::weighted(0.8, 0u64..1500),
        )
    }

    proptest! {
        /// The design rule: whenever the node believes it may run, the coordinator's view is
        /// still live — under any delays and losses of heartbeats and acks.
        #[test]
        fn node_stops_before_the_coordinator_expires(reg_delay in 0u64..1000, beats in proptest::collection::vec(beat(), 0..30)) {
            #[derive(Debug)]
            enum Ev { Arrive(RenewalSeq), Ack(RenewalSeq) }
            let cfg = config();
            let node = NodeId(1);
            let mut table = LeaseTable::new(cfg.ttl);
            let id = table.grant(node, ms(reg_delay)).lease.id;
            let mut nl = NodeLease::new(id, &cfg, ms(0)).unwrap();
            // Sends, then deliveries/acks interleaved by time (stable sort keeps causal order
            // at equal times: a renewal arrives before its ack).
            let mut events: Vec<(u64, u8, Ev, Option<u64>)> = Vec::new();
            let mut t = 0;
            for (gap, delay, ack) in &beats {
                t += gap;
                let seq = nl.renewal_sent(ms(t));
                if let Some(d) = delay {
                    events.push((t + d, 0, Ev::Arrive(seq), ack.map(|a| t + d + a)));
                }
            }
            let mut queue: Vec<(u64, u8, Ev)> = Vec::new();
            for (at, _, ev, ack_at) in events {
                if let (Ev::Arrive(seq), Some(ack_at)) = (&ev, ack_at) {
                    queue.push((ack_at, 1, Ev::Ack(*seq)));
                }
                queue.push((at, 0, ev));
            }
            queue.sort_by_key(|(at, order, _)| (*at, *order));
            let mut renewed = std::collections::HashSet::new();
            for (at, _, ev) in queue {
                let now = ms(at);
                match ev {
                    Ev::Arrive(seq) => { if table.renew(node, id, now).is_ok() { renewed.insert(seq); } }
                    Ev::Ack(seq) => { if renewed.contains(&seq) { let _ = nl.renewal_acked(id, seq); } }
                }
                if let NodeLeaseStatus::Valid { deadline } = nl.status(now) {
                    prop_assert!(table.is_live(node, now), "node runs at {now:?} but the coordinator expired it");
                    let coord = table.get(node).unwrap().expires_at;
                    prop_assert!(deadline + cfg.safety_margin <= coord, "deadline {deadline:?} vs coordinator {coord:?}");
                }
            }
        }

        /// Against a model: a renewal succeeds iff it presents the node's current lease id
        /// before that lease's expiry.
        #[test]
        fn renewals_match_the_model(ops in proptest::collection::vec((0u8..3, 0u32..3, 0u64..6, 0u64..700), 1..60)) {
            let mut table = LeaseTable::new(TTL);
            let mut model: BTreeMap<NodeId, (LeaseId, Duration)> = BTreeMap::new();
            let mut issued = vec![];
            let mut now = ms(0);
            for (op, node, pick, step) in ops {
                now += ms(step);
                let node = NodeId(node);
                match op {
                    0 => {
                        let g = table.grant(node, now);
                        issued.push(g.lease.id);
                        prop_assert_eq!(g.replaced.map(|l| l.id), model.get(&node).map(|m| m.0));
                        model.insert(node, (g.lease.id, now + TTL));
                    }
                    1 if !issued.is_empty() => {
                        let id = issued[pick as usize % issued.len()];
                        let ok = model.get(&node).is_some_and(|(cur, exp)| *cur == id && now < *exp);
                        let got = table.renew(node, id, now);
                        prop_assert_eq!(got.is_ok(), ok, "{:?}", got);
                        if ok { model.get_mut(&node).unwrap().1 = now + TTL; }
                    }
                    _ => {
                        let gone: Vec<Lease> = table.expire(now);
                        let want: Vec<NodeId> = model.iter().filter(|(_, (_, e))| *e <= now).map(|(n, _)| *n).collect();
                        prop_assert_eq!(gone.iter().map(|l| l.node).collect::<Vec<_>>(), want);
                        model.retain(|_, (_, e)| *e > now);
                    }
                }
            }
        }
    }
}
