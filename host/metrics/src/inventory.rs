//! The metrics inventory (design §15): every metric family the host exposes, with its type,
//! unit, labels and help. The registry encodes only these; `docs/metrics.md` is
//! [`markdown`] of it, committed, and a test fails when the two differ.
//!
//! Names follow Prometheus' conventions: one prefix (`nopstream_`, added at encoding),
//! base units (seconds, bytes, ratios from 0 to 1) appended as a suffix, `_total` appended
//! to counters by the encoder (so no name here ends in `_total`), `_info` to info
//! families. No label has high cardinality: labels name a job, a vertex, a subtask, a
//! source split, an outcome or a state, never an epoch, an attempt, a key or a record.

/// How a family's samples behave.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    /// Only goes up (reset when its process restarts); encoded with `_total`.
    Counter,
    /// Goes up and down.
    Gauge,
    /// Observations in fixed buckets ([`crate::Histogram`]): `_bucket`, `_sum`, `_count`.
    Histogram,
    /// Constant 1 with descriptive labels; encoded with `_info`.
    Info,
}

impl Kind {
    /// As the inventory table spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
            Kind::Info => "info",
        }
    }
}

/// A family's base unit, appended to its name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// A count or an identifier: no suffix.
    None,
    /// Seconds (durations, and event or wall time as seconds since the Unix epoch).
    Seconds,
    /// Bytes.
    Bytes,
    /// A ratio from 0 to 1.
    Ratios,
}

impl Unit {
    /// The suffix, if any.
    pub fn suffix(self) -> Option<&'static str> {
        match self {
            Unit::None => None,
            Unit::Seconds => Some("seconds"),
            Unit::Bytes => Some("bytes"),
            Unit::Ratios => Some("ratios"),
        }
    }
}

/// One metric family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Family {
    /// Name without the prefix, the unit and the type suffix.
    pub name: &'static str,
    /// Type.
    pub kind: Kind,
    /// Unit.
    pub unit: Unit,
    /// Label names, in the order a [`crate::Sample`] carries their values.
    pub labels: &'static [&'static str],
    /// Help text.
    pub help: &'static str,
}

impl Family {
    /// The name as scraped, without the type suffix: `nopstream_<name>[_<unit>]`.
    pub fn exposed_name(&self) -> String {
        match self.unit.suffix() {
            Some(u) => format!("{PREFIX}_{}_{u}", self.name),
            None => format!("{PREFIX}_{}", self.name),
        }
    }

    /// The sample line's name: [`Self::exposed_name`] with `_total` for counters and
    /// `_info` for info families (histograms add `_bucket`, `_sum` and `_count`).
    pub fn sample_name(&self) -> String {
        match self.kind {
            Kind::Counter => format!("{}_total", self.exposed_name()),
            Kind::Info => format!("{}_info", self.exposed_name()),
            Kind::Gauge | Kind::Histogram => self.exposed_name(),
        }
    }
}

/// The prefix of every exposed name.
pub const PREFIX: &str = "nopstream";

const JOB: &[&str] = &["job"];
const JOB_VERTEX: &[&str] = &["job", "vertex"];
const SUBTASK: &[&str] = &["job", "vertex", "subtask"];
const SPLIT: &[&str] = &["job", "source", "split"];

macro_rules! families {
    ($( $(#[$doc:meta])* $id:ident = $name:literal, $kind:ident, $unit:ident, $labels:expr, $help:literal; )*) => {
        $( $(#[$doc])* pub const $id: Family = Family {
            name: $name,
            kind: Kind::$kind,
            unit: Unit::$unit,
            labels: $labels,
            help: $help,
        }; )*
        /// Every family, in the order of the inventory table.
        pub const INVENTORY: &[Family] = &[$($id),*];
    };
}

families! {
    /// The host build.
    BUILD = "build", Info, None, &["version", "wit"],
        "The host's version and the newest WIT package it serves.";
    /// Whether this coordinator process leads.
    COORDINATOR_LEADING = "coordinator_leading", Gauge, None, &[],
        "1 on the coordinator that leads the cluster, 0 on a standby (design §14.5); a standby serves only the coordinator families.";
    /// The leader's term.
    COORDINATOR_TERM = "coordinator_term", Gauge, None, &[],
        "The term of the cluster's leader as this coordinator knows it (its own while it leads); 0 when none is known.";
    /// Refused election-guarded writes.
    ELECTION_FENCED_WRITES = "election_fenced_writes", Counter, None, &[],
        "Job-record writes of this process the election store refused because its leadership no longer held (design §14.5).";
    /// Refused epoch claims.
    EPOCH_CLAIMS_REFUSED = "epoch_claims_refused", Counter, None, &[],
        "Epoch claims of this process the checkpoint store refused because another attempt had created the epoch's record (a zombie or deposed attempt retiring, design §6).";
    /// One job.
    JOB_INFO = "job", Info, None, &["job", "name", "semantic", "fingerprint"],
        "A job: its name, semantic mode (design §13) and plan fingerprint.";
    /// A job's state as a state set.
    JOB_STATE = "job_state", Gauge, None, &["job", "state"],
        "1 for the job's state (submitted, running, finished, failed, cancelled, stopped), 0 for the others.";
    /// Generation.
    JOB_GENERATION = "job_generation", Gauge, None, JOB,
        "The generation deployed last: grows with every deployment and recovery (design §2.5).";
    /// Recoveries.
    JOB_RECOVERIES = "job_recoveries", Counter, None, JOB,
        "Global recoveries of the job's current run (design §10.1), restarts of the coordinator included.";
    /// Fenced events.
    FENCED_EVENTS = "fenced_events", Counter, None, JOB,
        "Task events (acknowledgements, ends of data, commits) of a fenced attempt refused by the coordinator.";
    /// Fenced streams.
    FENCED_STREAMS = "fenced_streams", Counter, None, JOB,
        "Data streams of a fenced generation refused at a receiving node.";
    /// Fenced commands.
    FENCED_COMMANDS = "fenced_commands", Counter, None, JOB,
        "Commands (barriers, commits) of a generation other than the one a node runs, refused there.";
    /// Latest triggered epoch.
    EPOCH_TRIGGERED = "epoch_triggered", Gauge, None, JOB,
        "The latest epoch triggered (its barrier sent to the sources); 0 before the first.";
    /// Latest durable epoch.
    EPOCH_DURABLE = "epoch_durable", Gauge, None, JOB,
        "The latest durable epoch (its manifest published, design §5.6); 0 before the first.";
    /// Latest committed epoch.
    EPOCH_COMMITTED = "epoch_committed", Gauge, None, JOB,
        "The latest epoch whose sink transactions all committed (design §5.7); 0 before the first.";
    /// When the latest epoch became durable.
    LAST_DURABLE = "last_durable_timestamp", Gauge, Seconds, JOB,
        "When the latest durable epoch became durable, in seconds since the Unix epoch.";
    /// Pending epochs.
    EPOCHS_PENDING = "epochs_pending", Gauge, None, JOB,
        "Epochs triggered and neither committed nor aborted yet.";
    /// Committed epochs.
    EPOCHS_COMMITTED = "epochs_committed", Counter, None, JOB,
        "Epochs the job's durable epoch log records committed (it survives restarts).";
    /// Aborted epochs.
    EPOCHS_ABORTED = "epochs_aborted", Counter, None, JOB,
        "Epochs the job's durable epoch log records aborted (timed out, or a task failed).";
    /// Checkpoint duration.
    CHECKPOINT_DURATION = "checkpoint_duration", Histogram, Seconds, JOB,
        "Time from an epoch's creation until its manifest was durable, over the epochs of the durable epoch log.";
    /// Alignment.
    CHECKPOINT_ALIGNMENT = "checkpoint_alignment", Histogram, Seconds, JOB,
        "The longest barrier alignment of any task in a durable epoch (design §5.4).";
    /// Start delay.
    CHECKPOINT_START_DELAY = "checkpoint_start_delay", Histogram, Seconds, JOB,
        "The longest time from an epoch's trigger until a task of it saw its first barrier, per durable epoch.";
    /// Snapshot bytes.
    SNAPSHOT = "snapshot", Counter, Bytes, JOB_VERTEX,
        "Bytes of state the vertex's tasks wrote into durable epochs.";
    /// Compaction bytes.
    COMPACTION = "compaction", Counter, Bytes, JOB_VERTEX,
        "Bytes of full payloads the vertex's background compactions wrote, as durable epochs adopted them.";
    /// Records read by the sources.
    SOURCE_RECORDS = "source_records", Counter, None, JOB,
        "Records the job's sources read in this process, over every attempt.";
    /// Records written by the sinks.
    SINK_RECORDS = "sink_records", Counter, None, JOB,
        "Records the job's sinks wrote into transactions in this process, over every attempt (committed or not).";
    /// Source lag in connector units.
    SOURCE_PENDING_UNITS = "source_pending_units", Gauge, None, SPLIT,
        "Units of a split not read yet (its total minus its position, as the connector reports its progress: bytes for file sources); only for splits whose total the connector knows.";
    /// Source event-time lag.
    SOURCE_EVENT_TIME_LAG = "source_event_time_lag", Gauge, Seconds, SPLIT,
        "Wall-clock time minus the largest event timestamp read from a split; only for splits that carry timestamps.";
    /// Sink transactions awaiting commit.
    SINK_PENDING_TRANSACTIONS = "sink_pending_transactions", Gauge, None, SUBTASK,
        "Pre-committed sink transactions of a subtask waiting for their epoch to be durable and committed (design §7.3).";
    /// Sink commits by outcome.
    SINK_COMMITS = "sink_commits", Counter, None, &["job", "vertex", "outcome"],
        "Sink transactions committed, by outcome: committed (commit succeeded), recovered (its outcome was established through recover, design §5.7).";
    /// Records in.
    RECORDS_IN = "records_in", Counter, None, SUBTASK,
        "Records that entered a subtask's chain (read by a source head, or received).";
    /// Records out.
    RECORDS_OUT = "records_out", Counter, None, SUBTASK,
        "Records a subtask's chain emitted on its output edges or wrote to its sink.";
    /// Bytes in.
    INPUT = "input", Counter, Bytes, SUBTASK,
        "Record payload bytes that entered a subtask's chain.";
    /// Bytes out.
    OUTPUT = "output", Counter, Bytes, SUBTASK,
        "Record payload bytes a subtask's chain emitted or wrote.";
    /// Busy time.
    BUSY_TIME = "busy_time", Counter, Seconds, SUBTASK,
        "Time a subtask's thread spent working: its life minus its idle and backpressured time.";
    /// Backpressured time.
    BACKPRESSURED_TIME = "backpressured_time", Counter, Seconds, SUBTASK,
        "Time a subtask's thread spent handing batches, watermarks and barriers to its output channels: blocked there when a channel is full (design §4.4).";
    /// Idle time.
    IDLE_TIME = "idle_time", Counter, Seconds, SUBTASK,
        "Time a subtask's thread spent waiting for input (or, at a source, pausing after empty reads).";
    /// Input watermark.
    INPUT_WATERMARK = "input_watermark", Gauge, Seconds, SUBTASK,
        "The smallest watermark over a subtask's active input channels, as event time in seconds since the Unix epoch; absent before the first.";
    /// Output watermark.
    OUTPUT_WATERMARK = "output_watermark", Gauge, Seconds, SUBTASK,
        "The watermark a subtask last emitted, as event time in seconds since the Unix epoch; absent before the first.";
    /// Late records.
    LATE_RECORDS = "late_records", Counter, None, SUBTASK,
        "Records a subtask's operators sent to their `late` side output (behind the watermark, design §9.1).";
    /// Timers fired.
    TIMERS_FIRED = "timers_fired", Counter, None, SUBTASK,
        "Event- and processing-time timers fired into a subtask's operators.";
    /// Skipped records.
    SKIPPED_RECORDS = "skipped_records", Counter, None, SUBTASK,
        "Records an operator's error policy `skip` dropped (design §16).";
    /// Dead-lettered records.
    DEAD_LETTERED_RECORDS = "dead_lettered_records", Counter, None, SUBTASK,
        "Records an operator's error policy `dead-letter` sent to its `errors` side output (design §16).";
    /// Plugin traps.
    PLUGIN_TRAPS = "plugin_traps", Counter, None, SUBTASK,
        "Traps and exceeded limits of a subtask's plugins (each fails the task).";
    /// Live node leases.
    NODE_LEASES = "node_leases", Gauge, None, &[],
        "Nodes holding a live lease with this coordinator.";
    /// Lease renewals.
    NODE_LEASE_RENEWALS = "node_lease_renewals", Counter, None, &[],
        "Lease renewals this coordinator accepted.";
    /// Lease expirations.
    NODE_LEASE_EXPIRATIONS = "node_lease_expirations", Counter, None, &[],
        "Node leases that ended without the node leaving (expired, or its session lost).";
    /// Stale-term refusals at the nodes.
    NODE_STALE_TERM_REFUSALS = "node_stale_term_refusals", Counter, None, &["node", "what"],
        "What a node refused from a coordinator whose term was lower than the highest the node had seen (a deposed leader, design §14.5), by what: `welcome` (its answer to the node's hello), `command` (a frame of its session); cumulative since the node process started, as the node last reported it to the leader.";
}

/// The family named `name` (without prefix, unit or suffix).
pub fn family(name: &str) -> Option<&'static Family> {
    INVENTORY.iter().find(|f| f.name == name)
}

/// The inventory as the Markdown table committed in `docs/metrics.md`.
pub fn markdown() -> String {
    let mut out = String::from(
        "# Metrics inventory\n\n\
         Every metric family `/metrics` exposes (OpenMetrics text), generated from\n\
         `host/metrics/src/inventory.rs`; a test fails when the two differ (regenerate with\n\
         `NOPSTREAM_BLESS=1 cargo test -p nop-stream-metrics --test inventory`). Names carry\n\
         the `nopstream_` prefix and their base unit; counters end in `_total`, info families\n\
         in `_info`, histograms expose `_bucket`, `_sum` and `_count`. No label carries an\n\
         epoch, an attempt, a key or a record.\n\n\
         | name | type | unit | labels | help |\n|---|---|---|---|---|\n",
    );
    for f in INVENTORY {
        out.push_str(&format!(
            "| `{}` | {} | {} | {} | {} |\n",
            f.sample_name(),
            f.kind.as_str(),
            f.unit.suffix().unwrap_or("-"),
            if f.labels.is_empty() {
                "-".to_owned()
            } else {
                f.labels
                    .iter()
                    .map(|l| format!("`{l}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            },
            f.help.replace('|', "\\|"),
        ));
    }
    out
}
