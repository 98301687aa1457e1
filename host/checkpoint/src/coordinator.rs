//! The epoch protocol as a pure state machine (design §5, §10.1–§10.2): no I/O, no clock,
//! no threads. The runner feeds [`Event`]s (with the current time) and carries out the
//! [`Command`]s; storage and transport stay behind it.
//!
//! Rules enforced here:
//! - only this coordinator creates epochs; one epoch is in flight at a time (design §5.8);
//! - an epoch completes only when every task of the ACK set acknowledged it **in the
//!   current attempt**; acknowledgements of other attempts, unknown tasks, other epochs,
//!   and duplicates are ignored (design §10.2);
//! - the manifest is published before any commit (design §5.6, invariant 5); commits of
//!   `<= N` follow DURABLE(N);
//! - an epoch exceeding the timeout is ABORTED and the job continues (design §4.4);
//! - when every task reported the end of its data, a final epoch is taken; the job ends
//!   once that epoch is committed (design §5.9).

use crate::manifest::TaskSnapshot;
use nop_stream_api::{AttemptId, EpochId, TaskId};
use std::collections::{BTreeSet, HashMap};

/// Lifecycle of an epoch (design §5.2). INJECTING covers barrier injection; ALIGNING and
/// SNAPSHOTTING happen inside tasks, so the coordinator sees SNAPSHOTTING once the first
/// acknowledgement arrives; PRECOMMITTED once all arrived (sinks pre-commit before they
/// acknowledge).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum EpochState {
    /// Epoch id allocated, ACK set fixed.
    Created,
    /// Barrier injection requested from the sources.
    Injecting,
    /// Acknowledgements arriving.
    Snapshotting,
    /// Every task acknowledged; the manifest can be published.
    Precommitted,
    /// Manifest published.
    Durable,
    /// Sinks committed.
    Committed,
    /// Given up (timeout, decline, or failure of the attempt).
    Aborted,
}

/// Inputs of the state machine. `now_ms` is milliseconds on any monotonic clock.
#[derive(Debug, Clone)]
pub enum Event {
    /// Time passed.
    Tick {
        /// Current time.
        now_ms: u64,
    },
    /// A checkpoint was requested on demand.
    Trigger {
        /// Current time.
        now_ms: u64,
    },
    /// A task acknowledged an epoch with its snapshot.
    Ack {
        /// Attempt the task runs in.
        attempt: AttemptId,
        /// The snapshot (names task and epoch).
        snapshot: Box<TaskSnapshot>,
    },
    /// A task declined an epoch (it cannot snapshot it).
    Decline {
        /// Attempt.
        attempt: AttemptId,
        /// Task.
        task: TaskId,
        /// Epoch.
        epoch: EpochId,
        /// Why.
        reason: String,
    },
    /// A task processed the end of all its input.
    EndOfData {
        /// Attempt.
        attempt: AttemptId,
        /// Task.
        task: TaskId,
    },
    /// The runner published the manifest of `epoch`.
    ManifestDurable {
        /// Epoch.
        epoch: EpochId,
    },
    /// Every sink committed everything `<= epoch`.
    SinksCommitted {
        /// Epoch.
        epoch: EpochId,
    },
}

/// Outputs of the state machine, to be carried out in order.
#[derive(Debug, Clone, PartialEq)]
pub enum Command {
    /// Record CREATED and ask every source subtask to inject barrier `epoch`.
    InjectBarrier {
        /// Epoch.
        epoch: EpochId,
        /// Whether it is the final epoch.
        final_epoch: bool,
    },
    /// Every task acknowledged: write segments' manifest atomically, then report
    /// [`Event::ManifestDurable`].
    PublishManifest {
        /// Epoch.
        epoch: EpochId,
        /// Final epoch?
        final_epoch: bool,
        /// Snapshots in ACK-set order.
        snapshots: Vec<TaskSnapshot>,
        /// When the epoch was created.
        created_ms: u64,
    },
    /// Tell every sink to commit all pre-committed transactions `<= epoch`; report
    /// [`Event::SinksCommitted`] when done.
    Commit {
        /// Epoch.
        epoch: EpochId,
    },
    /// The epoch is given up; the job continues (pre-committed transactions stay pending
    /// for a later subsuming commit, design §7.3).
    Abort {
        /// Epoch.
        epoch: EpochId,
        /// Why.
        reason: String,
    },
    /// The final epoch is committed: stop every task.
    Finish,
}

#[derive(Debug, Clone)]
struct InFlight {
    epoch: EpochId,
    final_epoch: bool,
    created_ms: u64,
    state: EpochState,
    /// Acknowledged snapshots by the task's position in the ack set (boxed as they
    /// arrive, so a slot is a pointer: 10,000 of them cost 80 KB, not 4 MB).
    acks: Vec<Option<Box<TaskSnapshot>>>,
    /// How many slots of `acks` are filled.
    acked: usize,
}

/// Counters for observability (design §15).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CoordinatorStats {
    /// Acknowledgements refused because they came from another attempt.
    pub fenced_acks: u64,
    /// Acknowledgements ignored as duplicates, unknown tasks or other epochs.
    pub ignored_acks: u64,
    /// Epochs aborted.
    pub aborted: u64,
}

/// The coordinator's decisions.
#[derive(Debug, Clone)]
pub struct EpochCoordinator {
    /// The tasks that must acknowledge an epoch, each with its position in ack-set
    /// order (ascending [`TaskId`]): a manifest lists its snapshots in that order.
    ack_set: HashMap<TaskId, usize>,
    attempt: AttemptId,
    next_epoch: EpochId,
    interval_ms: Option<u64>,
    timeout_ms: u64,
    last_epoch_ms: Option<u64>,
    /// See [`Self::with_first_interval_ms`].
    first_interval_ms: Option<u64>,
    /// When the first periodic epoch is due (from the first tick), until it starts.
    first_due_ms: Option<u64>,
    in_flight: Option<InFlight>,
    end_of_data: BTreeSet<TaskId>,
    final_epoch: Option<EpochId>,
    latest_durable: Option<EpochId>,
    latest_committed: Option<EpochId>,
    finished: bool,
    stats: CoordinatorStats,
}

impl EpochCoordinator {
    /// A coordinator for `ack_set` in `attempt`, allocating epochs from `next_epoch`
    /// (strictly above every epoch ever created in this namespace), taking one every
    /// `interval_ms` (none: only on demand and the final epoch), aborting epochs older
    /// than `timeout_ms`. `latest_durable`: the epoch restored from, if any.
    pub fn new(
        ack_set: impl IntoIterator<Item = TaskId>,
        attempt: AttemptId,
        next_epoch: EpochId,
        interval_ms: Option<u64>,
        timeout_ms: u64,
        latest_durable: Option<EpochId>,
    ) -> Self {
        EpochCoordinator {
            ack_set: ack_set
                .into_iter()
                .collect::<BTreeSet<_>>()
                .into_iter()
                .enumerate()
                .map(|(i, t)| (t, i))
                .collect(),
            attempt,
            next_epoch,
            interval_ms,
            timeout_ms,
            last_epoch_ms: None,
            first_interval_ms: None,
            first_due_ms: None,
            in_flight: None,
            end_of_data: BTreeSet::new(),
            final_epoch: None,
            latest_durable,
            latest_committed: None,
            finished: false,
            stats: CoordinatorStats::default(),
        }
    }

    /// The first periodic epoch starts `ms` after the first tick (at most one interval)
    /// instead of a whole interval after it; later ones keep the interval. A recovered
    /// attempt uses it so that what its sinks write after the restore is committed soon
    /// after the tasks run again, not up to an interval later (design §11: recovery ends
    /// at the first epoch the new attempt commits). Without a periodic interval it has
    /// no effect.
    #[must_use]
    pub fn with_first_interval_ms(mut self, ms: u64) -> Self {
        self.first_interval_ms = Some(ms);
        self
    }

    /// The epoch in flight and its state.
    pub fn in_flight(&self) -> Option<(EpochId, EpochState)> {
        self.in_flight.as_ref().map(|f| (f.epoch, f.state))
    }

    /// Latest durable epoch.
    pub fn latest_durable(&self) -> Option<EpochId> {
        self.latest_durable
    }

    /// Latest committed epoch.
    pub fn latest_committed(&self) -> Option<EpochId> {
        self.latest_committed
    }

    /// Whether the final epoch is committed.
    pub fn is_finished(&self) -> bool {
        self.finished
    }

    /// Observability counters.
    pub fn stats(&self) -> &CoordinatorStats {
        &self.stats
    }

    /// The next epoch id that would be allocated.
    pub fn next_epoch(&self) -> EpochId {
        self.next_epoch
    }

    fn start_epoch(&mut self, now_ms: u64, final_epoch: bool) -> Vec<Command> {
        let epoch = self.next_epoch;
        self.next_epoch = EpochId(epoch.0 + 1);
        self.last_epoch_ms = Some(now_ms);
        self.first_due_ms = None;
        if final_epoch {
            self.final_epoch = Some(epoch);
        }
        self.in_flight = Some(InFlight {
            epoch,
            final_epoch,
            created_ms: now_ms,
            state: EpochState::Injecting,
            acks: Vec::new(),
            acked: 0,
        });
        vec![Command::InjectBarrier { epoch, final_epoch }]
    }

    /// Every task of the ack set reached its end of data. `end_of_data` holds members of
    /// the ack set only, so comparing sizes is enough, and a tick costs O(1), not a scan.
    fn all_ended(&self) -> bool {
        self.end_of_data.len() == self.ack_set.len()
    }

    /// Feeds one event; returns the commands to carry out, in order.
    pub fn handle(&mut self, event: Event) -> Vec<Command> {
        if self.finished {
            return Vec::new();
        }
        match event {
            Event::Tick { now_ms } => self.on_tick(now_ms, false),
            Event::Trigger { now_ms } => self.on_tick(now_ms, true),
            Event::Ack { attempt, snapshot } => self.on_ack(attempt, snapshot),
            Event::Decline {
                attempt,
                task,
                epoch,
                reason,
            } => {
                let current = self.in_flight.as_ref().map(|f| f.epoch);
                if attempt != self.attempt
                    || current != Some(epoch)
                    || !self.ack_set.contains_key(&task)
                {
                    return Vec::new();
                }
                self.abort_in_flight(format!("task {task} declined: {reason}"))
            }
            Event::EndOfData { attempt, task } => {
                if attempt == self.attempt && self.ack_set.contains_key(&task) {
                    self.end_of_data.insert(task);
                }
                Vec::new()
            }
            Event::ManifestDurable { epoch } => match &mut self.in_flight {
                Some(f) if f.epoch == epoch && f.state == EpochState::Precommitted => {
                    f.state = EpochState::Durable;
                    self.latest_durable = Some(epoch);
                    // The epoch no longer blocks a new one: commits of <= N subsume.
                    self.in_flight = None;
                    vec![Command::Commit { epoch }]
                }
                _ => Vec::new(),
            },
            Event::SinksCommitted { epoch } => {
                if self.latest_durable.is_some_and(|d| epoch <= d) {
                    self.latest_committed =
                        Some(self.latest_committed.map_or(epoch, |c| c.max(epoch)));
                    if self.final_epoch == Some(epoch) {
                        self.finished = true;
                        return vec![Command::Finish];
                    }
                }
                Vec::new()
            }
        }
    }

    fn abort_in_flight(&mut self, reason: String) -> Vec<Command> {
        match self.in_flight.take() {
            Some(f) => {
                self.stats.aborted += 1;
                if f.final_epoch {
                    // A new final epoch will be started on the next tick.
                    self.final_epoch = None;
                }
                vec![Command::Abort {
                    epoch: f.epoch,
                    reason,
                }]
            }
            None => Vec::new(),
        }
    }

    fn on_tick(&mut self, now_ms: u64, triggered: bool) -> Vec<Command> {
        let mut out = Vec::new();
        if let Some(f) = &self.in_flight
            && f.state < EpochState::Durable
            && now_ms.saturating_sub(f.created_ms) > self.timeout_ms
        {
            let epoch = f.epoch;
            out.extend(self.abort_in_flight(format!(
                "epoch {epoch} exceeded the checkpoint timeout of {} ms",
                self.timeout_ms
            )));
        }
        if self.in_flight.is_some() {
            return out;
        }
        if self.final_epoch.is_none() && self.all_ended() {
            out.extend(self.start_epoch(now_ms, true));
            return out;
        }
        if self.final_epoch.is_some() {
            return out;
        }
        let due = match (self.interval_ms, self.last_epoch_ms) {
            (Some(_), Some(_)) if self.first_due_ms.is_some_and(|d| now_ms >= d) => true,
            (Some(i), Some(last)) => now_ms.saturating_sub(last) >= i,
            (Some(i), None) => {
                // The first interval counts from the first tick.
                self.last_epoch_ms = Some(now_ms);
                self.first_due_ms = self
                    .first_interval_ms
                    .map(|f| now_ms.saturating_add(f.min(i)));
                self.first_interval_ms == Some(0)
            }
            (None, _) => false,
        };
        if due || triggered {
            out.extend(self.start_epoch(now_ms, false));
        }
        out
    }

    fn on_ack(&mut self, attempt: AttemptId, snapshot: Box<TaskSnapshot>) -> Vec<Command> {
        if attempt != self.attempt {
            self.stats.fenced_acks += 1;
            return Vec::new();
        }
        let Some(f) = self.in_flight.as_mut() else {
            self.stats.ignored_acks += 1;
            return Vec::new();
        };
        let slot = self.ack_set.get(&snapshot.task).copied();
        let Some(slot) =
            slot.filter(|_| snapshot.epoch == f.epoch && f.state < EpochState::Precommitted)
        else {
            self.stats.ignored_acks += 1;
            return Vec::new();
        };
        if f.acks.is_empty() {
            f.acks.resize_with(self.ack_set.len(), || None);
        }
        if f.acks[slot].is_some() {
            self.stats.ignored_acks += 1;
            return Vec::new();
        }
        f.state = EpochState::Snapshotting;
        f.acks[slot] = Some(snapshot);
        f.acked += 1;
        if f.acked < self.ack_set.len() {
            return Vec::new();
        }
        f.state = EpochState::Precommitted;
        // Every task of the ack set acknowledged: the acks, in ack-set order, move into
        // the command (a duplicate that arrives later is refused by the state above).
        let snapshots = std::mem::take(&mut f.acks)
            .into_iter()
            .flatten()
            .map(|b| *b)
            .collect();
        vec![Command::PublishManifest {
            epoch: f.epoch,
            final_epoch: f.final_epoch,
            snapshots,
            created_ms: f.created_ms,
        }]
    }
}

#[cfg(test)]
mod tests;
