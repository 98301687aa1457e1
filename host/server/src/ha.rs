//! A coordinator process that leads or stands by (design §14.5, "Coordinator HA").
//!
//! [`HaCoordinator`] serves the cluster's endpoint from the start. Until its election is
//! won it stands by: it answers every node hello and every CLI request with the leader's
//! address, so nodes and the CLI, given several coordinator addresses, follow the leader.
//! Once won, it starts the [`ClusterCoordinator`] under the leadership (which reloads
//! every job and the registry from storage and resumes each job from its latest durable
//! epoch) and forwards everything to it. A leader whose leadership is lost (lease expired
//! or revoked, another leader's key) exits at once with [`EXIT_LEADERSHIP_LOST`]; a
//! supervisor restarts it as a standby. It never deletes metadata or checkpoints on the
//! way out.

use crate::coordinator::{ClusterCoordinator, ClusterOptions};
use nop_stream_cluster::session::{CoordinatorRole, CoordinatorService, NodeRegistry, SessionPush};
use nop_stream_cluster::{Identity, LeaseId, NodeId};
use nop_stream_coordinator::election::{Announcement, Election, Leadership};
use nop_stream_coordinator::jobs::JobStore;
use nop_stream_proto::cli::{CliRequest, CliResponse, Leadership as LeadershipStatus};
use nop_stream_proto::session::{ComponentFrame, Hello, LeaderHint, NodeFrame, NodeRequestFrame};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// Exit status of a coordinator process whose leadership was lost.
pub const EXIT_LEADERSHIP_LOST: i32 = 75;

/// How often a leader checks that its leadership still holds (besides the checks before
/// every barrier, manifest and commit).
const WATCH: Duration = Duration::from_millis(50);

/// The coordinator process's service: a standby, then the leader.
pub struct HaCoordinator {
    election: Arc<dyn Election>,
    advertise: String,
    announcement: Announcement,
    leading: OnceLock<(Arc<ClusterCoordinator>, Arc<Leadership>)>,
    registry: OnceLock<NodeRegistry>,
}

impl std::fmt::Debug for HaCoordinator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HaCoordinator")
            .field("election", &self.election.describe())
            .field("advertise", &self.advertise)
            .finish_non_exhaustive()
    }
}

impl HaCoordinator {
    /// A standby announced as `announcement` (the address nodes and the CLI reach it at,
    /// and its HTTP address if it serves one).
    pub fn new(election: Arc<dyn Election>, announcement: Announcement) -> Arc<Self> {
        Arc::new(HaCoordinator {
            election,
            advertise: announcement.addr.clone(),
            announcement,
            leading: OnceLock::new(),
            registry: OnceLock::new(),
        })
    }

    /// Campaigns (blocking until this process leads), then starts the coordinator under
    /// the leadership with `jobs` as its job store and watches the leadership: its loss
    /// exits the process with [`EXIT_LEADERSHIP_LOST`].
    ///
    /// # Errors
    /// The election backend fails, or the coordinator cannot start.
    pub fn lead(
        self: &Arc<Self>,
        mut opts: ClusterOptions,
        jobs: Option<Arc<dyn JobStore>>,
    ) -> Result<(), String> {
        let started = std::time::Instant::now();
        let leadership = self
            .election
            .campaign(&self.announcement.encode())
            .map_err(|e| e.to_string())?;
        let elected = started.elapsed();
        tracing::info!(term = leadership.term, election = %self.election.describe(), "leading");
        opts.leadership = Some(Arc::clone(&leadership));
        opts.jobs = jobs;
        let t = std::time::Instant::now();
        let coordinator = ClusterCoordinator::start(opts)?;
        tracing::info!(
            term = leadership.term,
            campaign_ms = elected.as_millis() as u64,
            reload_ms = t.elapsed().as_millis() as u64,
            "coordinator started under its leadership"
        );
        if let Some(r) = self.registry.get() {
            coordinator.set_registry(r.clone());
        }
        let _ = self.leading.set((coordinator, Arc::clone(&leadership)));
        std::thread::Builder::new()
            .name("leadership".into())
            .spawn(move || {
                while leadership.is_valid() {
                    std::thread::sleep(WATCH);
                }
                tracing::error!(
                    term = leadership.term,
                    "leadership lost: exiting at once (a supervisor restarts this process as a standby)"
                );
                std::process::exit(EXIT_LEADERSHIP_LOST);
            })
            .map_err(|e| e.to_string())?;
        Ok(())
    }

    /// Hands the session layer's node registry over (for `cluster status`).
    pub fn set_registry(&self, registry: NodeRegistry) {
        if let Some((c, _)) = self.leading.get() {
            c.set_registry(registry.clone());
        }
        let _ = self.registry.set(registry);
    }

    /// The coordinator, once this process leads.
    pub fn leader(&self) -> Option<&Arc<ClusterCoordinator>> {
        self.leading
            .get()
            .filter(|(_, l)| l.is_valid())
            .map(|(c, _)| c)
    }

    /// Who leads, with the leader's HTTP address (for a standby's HTTP answers).
    pub fn leader_info(&self) -> Option<nop_stream_coordinator::election::LeaderInfo> {
        match self.election.leader() {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!("cannot tell who leads: {e}");
                None
            }
        }
    }

    /// The nodes as this coordinator sees them (`cluster status`'s answer); empty while
    /// it stands by.
    pub fn nodes(&self) -> Vec<nop_stream_proto::cli::NodeStatus> {
        match (self.leader(), self.registry.get()) {
            (Some(_), Some(r)) => r.status(),
            _ => Vec::new(),
        }
    }

    /// This process's coordinator families: whether it leads, the leader's term, the
    /// writes its election store refused and, while it leads, the node leases and the
    /// nodes' own samples (their stale-term refusals).
    pub fn samples(&self) -> Vec<nop_stream_metrics::Sample> {
        use nop_stream_metrics::{Sample, inventory as inv};
        let (leading, term) = match self.leading.get() {
            Some((_, l)) if l.is_valid() => (1.0, l.term),
            _ => (0.0, self.leader_info().map_or(0, |l| l.term)),
        };
        let mut out = Vec::new();
        if leading > 0.0 {
            let nodes = self.nodes();
            out.extend([
                Sample::gauge(
                    &inv::NODE_LEASES,
                    Vec::new(),
                    nodes.iter().filter(|n| n.live).count() as f64,
                ),
                Sample::counter(
                    &inv::NODE_LEASE_RENEWALS,
                    Vec::new(),
                    nodes.iter().map(|n| n.renewals_total).sum::<u64>() as f64,
                ),
                Sample::counter(
                    &inv::NODE_LEASE_EXPIRATIONS,
                    Vec::new(),
                    nodes.iter().map(|n| u64::from(n.lost)).sum::<u64>() as f64,
                ),
            ]);
            if let Some((c, _)) = self.leading.get() {
                out.extend(c.hub().node_samples());
            }
        }
        out.extend([
            Sample::gauge(&inv::COORDINATOR_LEADING, Vec::new(), leading),
            Sample::gauge(&inv::COORDINATOR_TERM, Vec::new(), term as f64),
            Sample::counter(
                &inv::ELECTION_FENCED_WRITES,
                Vec::new(),
                self.election.fenced_writes() as f64,
            ),
        ]);
        out
    }

    fn hint(&self) -> LeaderHint {
        match self.election.leader() {
            Ok(Some(l)) => LeaderHint {
                leader: Some(l.addr),
                term: l.term,
            },
            Ok(None) => LeaderHint {
                leader: None,
                term: 0,
            },
            Err(e) => {
                tracing::warn!("cannot tell who leads: {e}");
                LeaderHint {
                    leader: None,
                    term: 0,
                }
            }
        }
    }

    fn leadership_status(&self, term: u64) -> CliResponse {
        let members = self.election.members().unwrap_or_else(|e| {
            tracing::warn!("cannot list the coordinators: {e}");
            Vec::new()
        });
        CliResponse::Leadership(LeadershipStatus {
            leader: self.advertise.clone(),
            term,
            election: self.election.describe(),
            standbys: members
                .into_iter()
                .filter(|m| *m != self.advertise)
                .collect(),
        })
    }
}

impl CoordinatorService for HaCoordinator {
    fn role(&self) -> CoordinatorRole {
        match self.leading.get() {
            Some((_, l)) if l.is_valid() => CoordinatorRole::Leader { term: l.term },
            _ => CoordinatorRole::Standby(self.hint()),
        }
    }

    fn node_up(&self, node: NodeId, lease: LeaseId, hello: &Hello, push: SessionPush) {
        if let Some(c) = self.leader() {
            c.node_up(node, lease, hello, push);
        }
    }

    fn node_frame(&self, node: NodeId, lease: LeaseId, frame: NodeFrame) {
        if let Some(c) = self.leader() {
            c.node_frame(node, lease, frame);
        }
    }

    fn node_down(&self, node: NodeId, lease: LeaseId, reason: &str) {
        if let Some((c, _)) = self.leading.get() {
            c.node_down(node, lease, reason);
        }
    }

    fn node_request(&self, node: NodeId, request: NodeRequestFrame) -> ComponentFrame {
        match self.leader() {
            Some(c) => c.node_request(node, request),
            None => ComponentFrame::NotFound("this coordinator does not lead".into()),
        }
    }

    fn cli_request(&self, client: &Identity, request: CliRequest) -> CliResponse {
        match self.leading.get() {
            Some((c, l)) if l.is_valid() => match request {
                CliRequest::Leadership => self.leadership_status(l.term),
                other => c.cli_request(client, other),
            },
            _ => {
                let hint = self.hint();
                CliResponse::NotLeader {
                    leader: hint.leader,
                    term: hint.term,
                }
            }
        }
    }
}
