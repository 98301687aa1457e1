//! `postgres-sink`: writes JSON records into a PostgreSQL table exactly once, with one
//! two-phase-commit transaction per epoch (issue 13 §2; capability two-phase-commit). It
//! reaches the database only through the host's `nop:postgres/client` capability, on the
//! connection the job file grants to its node; it never sees the address or the password.
//!
//! Config:
//!
//! ```toml
//! config = { connection = "pg", table = "departures", mode = "insert",
//!            columns = [{ name = "carrier" }, { name = "dep", field = "dep_delay" }],
//!            key = ["carrier"], rows_per_statement = 500 }
//! ```
//!
//! - `connection` (required): a connection name granted to the node (`connections = [..]`).
//! - `table` (required): the target table, created by the user; an SQL identifier,
//!   optionally schema-qualified (`[A-Za-z_][A-Za-z0-9_]*`, dot-separated).
//! - `columns` (required): column `name`, record `field` (default: the name), `type`:
//!   `auto` (default: JSON numbers bind as `int8`/`float8`, strings as `text`, booleans,
//!   objects and arrays as `jsonb`; the host converts to the column type where it fits),
//!   `bool`, `int2`, `int4`, `int8`, `float4`, `float8`, `numeric`, `text`, `jsonb`,
//!   `bytea` (base64, or hex after `\x`), `uuid`, `timestamptz` (an RFC 3339 string),
//!   `timestamptz-ms` (an integer of milliseconds). What each accepts: [`convert`]. A
//!   value that does not fit fails the record with an error naming the column, e.g.
//!   `column "n" (int2, field "n"): 70000 is out of range for int2 (-32768..=32767)`.
//! - `mode`: `insert` (append; default) or `upsert` (`ON CONFLICT (key) DO UPDATE`).
//! - `key`: the conflict columns; required for `upsert`.
//! - `transactions`: `two-phase` (default; capability two-phase-commit) or `none` (upsert
//!   only; capability idempotent, see below).
//! - `rows_per_statement`: rows per multi-row `INSERT` (default 500, at most 4096).
//!
//! # Transactions (see [`GID`](Committable::gid) and the README)
//!
//! Epoch N's writes go into one transaction on the *writer* session: `BEGIN` (lazily, at
//! the first row), the rows, a marker row `nop_sink_epochs(sink, subtask, epoch, gid)`
//! (insert only), then `PREPARE TRANSACTION gid` at pre-commit, with
//! `gid = nop_<hash of job, pipeline, operator, database>_<subtask>_<epoch>`. The committable is the
//! GID and the marker's key. `commit` runs `COMMIT PREPARED` on a second, *control*
//! session (the writer is already inside epoch N+1's transaction); 42704 with the marker
//! present means already committed, 42704 without it is an error. `recover` first looks in
//! `pg_prepared_xacts` (this database) and commits what it finds there; otherwise the
//! marker decides: present is committed, absent is unknown (the host only asks about
//! committables of durable epochs, so a missing transaction was rolled back behind the
//! engine's back). Errors are unknown, never committed. `abort` (the host aborts only
//! epochs that are not durable, on recovery every one after the restored epoch, listed or
//! not) runs `ROLLBACK PREPARED`; when the transaction is not prepared but its marker is
//! there, the epoch was committed outside the protocol, and `abort` fails naming the GID
//! and the epoch (design §7.4).
//!
//! # `transactions = "none"`: effectively once, without two-phase commit
//!
//! For servers without `max_prepared_transactions`, or to skip the marker table, an
//! `upsert` sink may commit each epoch's writes in one ordinary transaction *at
//! pre-commit*: `BEGIN`, the rows, `COMMIT`. Committing later, at `commit`, would need the
//! transaction to survive a crash between the epoch becoming durable and the commit,
//! which only `PREPARE` gives. Committed at pre-commit, the rows of an epoch that never
//! becomes durable stay in the table, and the restarted job replays that epoch from the
//! last durable one and upserts the same keys again: the final table is the same, but a
//! reader may see a later epoch's values, then earlier ones, while the replay catches
//! up. So the sink is idempotent, not strict: its schema maps `transactions = "none"`
//! to the capability `idempotent` (`x-sink-capability`), the planner refuses it in a
//! `strict-exactly-once` job, naming the sink and the setting, and an `effectively-once`
//! job runs it. `commit` and `recover` have nothing to do (the committable says it is
//! committed), and `abort` of an epoch already pre-committed keeps its rows. `insert`
//! with `transactions = "none"` is refused at open: a replay would append the rows again.
//!
//! # No deadlock with the open next epoch
//!
//! A prepared transaction keeps its row locks, so in `upsert` mode epoch N+1 writing a key
//! N wrote would wait for N's commit, which the same task thread must issue. So while an
//! earlier epoch of this subtask is prepared but not committed, `upsert` writes are
//! buffered in memory (last write per key wins) and flushed once it commits. If the
//! pre-commit of N+1 comes first (an aborted checkpoint kept N pending), the buffer is
//! flushed then, and a conflicting key fails after the host's `statement_timeout` instead
//! of hanging; recovery then settles both epochs. `insert` mode needs no buffer: replayed
//! rows never meet a prepared transaction (recovery rolls those back first).
//!
//! # Cleanup
//!
//! `pending-transactions` lists, through `list-prepared`, this subtask's prepared GIDs and
//! those of subtasks that no longer exist (`j >= parallelism`, `j mod parallelism ==
//! subtask`), so recovery after a downscale leaves nothing prepared.

use nop_stream_sdk::{
    Batch, CommitOutcome, LogLevel, PluginError, PluginInfo, Result, Sink, SinkCapability,
    TaskInfo, log,
};
use serde::{Deserialize, Serialize};
use serde_json::Value as Json;
use std::collections::{BTreeSet, HashMap};

pub mod convert;

use convert::ColumnType;
use nop_stream_sdk::postgres::{self as pg, PgError, Session, Value};

/// JSON Schema of the config, reported by `describe()`.
pub const CONFIG_SCHEMA: &str = r#"{"type":"object","additionalProperties":false,"required":["connection","table","columns"],"properties":{"connection":{"type":"string","description":"a connection granted to the node"},"table":{"type":"string"},"mode":{"enum":["insert","upsert"],"default":"insert"},"transactions":{"enum":["two-phase","none"],"default":"two-phase","description":"none: upsert only, one ordinary transaction per epoch committed at pre-commit (idempotent)","x-sink-capability":{"none":"idempotent"}},"columns":{"type":"array","items":{"type":"object","additionalProperties":false,"required":["name"],"properties":{"name":{"type":"string"},"field":{"type":"string"},"type":{"enum":["auto","bool","int2","int4","int8","float4","float8","numeric","text","jsonb","bytea","uuid","timestamptz","timestamptz-ms"],"default":"auto"}}}},"key":{"type":"array","items":{"type":"string"}},"rows_per_statement":{"type":"integer","minimum":1,"maximum":4096,"default":500}}}"#;

/// The marker table, created if missing.
pub const MARKER_DDL: &str = "CREATE TABLE IF NOT EXISTS nop_sink_epochs (\
    sink text NOT NULL, subtask integer NOT NULL, epoch bigint NOT NULL, gid text NOT NULL, \
    written_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (sink, subtask, epoch))";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
enum Mode {
    Insert,
    Upsert,
}

/// How an epoch's writes become visible (`transactions`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
enum Transactions {
    /// `PREPARE TRANSACTION` at pre-commit, `COMMIT PREPARED` at commit.
    #[default]
    TwoPhase,
    /// `COMMIT` at pre-commit (upsert only).
    None,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct ColumnSpec {
    name: String,
    field: Option<String>,
    #[serde(default, rename = "type")]
    ty: ColumnType,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    connection: String,
    table: String,
    #[serde(default = "default_mode")]
    mode: Mode,
    columns: Vec<ColumnSpec>,
    #[serde(default)]
    key: Vec<String>,
    #[serde(default)]
    transactions: Transactions,
    #[serde(default = "default_rows")]
    rows_per_statement: usize,
}

fn default_mode() -> Mode {
    Mode::Insert
}

fn default_rows() -> usize {
    500
}

fn is_ident(s: &str) -> bool {
    let mut c = s.chars();
    c.next()
        .is_some_and(|f| f.is_ascii_alphabetic() || f == '_')
        && c.all(|x| x.is_ascii_alphanumeric() || x == '_')
}

fn check_config(c: &Config) -> Result<()> {
    let bad = |m: String| {
        Err(PluginError::invalid_config(format!(
            "postgres-sink config: {m}"
        )))
    };
    if !c.table.split('.').all(is_ident) || c.table.split('.').count() > 2 {
        return bad(format!(
            "\"table\": {:?} must be an identifier, optionally schema-qualified",
            c.table
        ));
    }
    if c.columns.is_empty() {
        return bad("\"columns\" must name at least one column".into());
    }
    let mut seen = BTreeSet::new();
    for col in &c.columns {
        if !is_ident(&col.name) {
            return bad(format!("column name {:?} must be an identifier", col.name));
        }
        if !seen.insert(col.name.as_str()) {
            return bad(format!("column {:?} appears twice", col.name));
        }
    }
    for k in &c.key {
        if !seen.contains(k.as_str()) {
            return bad(format!("key column {k:?} is not among \"columns\""));
        }
    }
    if c.mode == Mode::Upsert && c.key.is_empty() {
        return bad("\"mode\" = \"upsert\" needs \"key\" (the conflict columns)".into());
    }
    if c.mode == Mode::Upsert && c.key.len() == c.columns.len() {
        return bad("\"upsert\" needs at least one column outside \"key\" to update".into());
    }
    if c.transactions == Transactions::None && c.mode != Mode::Upsert {
        return bad(
            "\"transactions\" = \"none\" needs \"mode\" = \"upsert\": without two-phase commit \
             the rows of an epoch replayed after a crash would be inserted again (duplicates); \
             use \"transactions\" = \"two-phase\" for insert"
                .into(),
        );
    }
    if !(1..=4096).contains(&c.rows_per_statement) {
        return bad("\"rows_per_statement\" must be in 1..=4096".into());
    }
    Ok(())
}

/// The column of a parameter the host could not bind: its message says `parameter <i>`
/// (0-based over the statement's rows of `columns.len()` values).
fn failed_column<'a>(message: &str, columns: &'a [ColumnSpec]) -> Option<&'a ColumnSpec> {
    let rest = &message[message.find("parameter ")? + "parameter ".len()..];
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    let i: usize = digits.parse().ok()?;
    columns.get(i % columns.len().max(1))
}

/// What `commit`, `abort` and `recover` need: stored in the epoch snapshot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Committable {
    /// `nop_<hash>_<subtask>_<epoch>`: determined by the sink, subtask and epoch only.
    pub gid: String,
    /// `nop_<hash>`: the marker's sink column.
    pub sink: String,
    /// Subtask that wrote it.
    pub subtask: u32,
    /// Epoch.
    pub epoch: u64,
    /// Committed at pre-commit (`transactions = "none"`): nothing is prepared under `gid`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub committed: bool,
}

/// The transaction open on the writer session.
#[derive(Debug)]
struct Open {
    txn: String,
    epoch: u64,
    /// `BEGIN` was sent.
    begun: bool,
}

/// The sink instance of one subtask.
pub struct PostgresSink {
    cfg: Config,
    task: TaskInfo,
    /// `{job}:{pipeline}:{operator}:` (the host's transaction id prefix without subtask).
    txn_base: String,
    /// `nop_<hash>_`.
    sink_prefix: String,
    writer: Session,
    control: Session,
    open: Option<Open>,
    /// GIDs this instance prepared and has not committed or rolled back yet.
    unresolved: BTreeSet<String>,
    /// Upsert rows held back while an earlier epoch is prepared (see module docs), with
    /// the index of each key's row.
    buffer: Vec<Vec<Value>>,
    buffer_keys: HashMap<String, usize>,
    key_idx: Vec<usize>,
    /// Multi-row statement text per row count.
    statements: HashMap<usize, String>,
}

/// Logs at debug level how long a step of `epoch` took, in microseconds:
/// `postgres-sink: epoch 3 pre-commit took 1234 us` (read by `nopstream-bench postgres`).
fn timing(epoch: u64, step: &str, started: std::time::Instant) {
    log(
        LogLevel::Debug,
        &format!(
            "postgres-sink: epoch {epoch} {step} took {} us",
            started.elapsed().as_micros()
        ),
    );
}

fn db_err(what: &str, e: PgError) -> PluginError {
    e.into_plugin_error(&format!("postgres-sink: {what}"))
}

impl PostgresSink {
    fn gid(&self, subtask: u32, epoch: u64) -> String {
        format!("{}{subtask}_{epoch}", self.sink_prefix)
    }

    fn sink_id(&self) -> String {
        self.sink_prefix.trim_end_matches('_').to_owned()
    }

    /// `(subtask, epoch)` of one of this sink's transaction ids.
    fn parse_txn(&self, txn: &str) -> Result<(u32, u64)> {
        let parsed = txn.strip_prefix(&self.txn_base).and_then(|rest| {
            let (s, e) = rest.split_once(':')?;
            Some((s.parse().ok()?, e.parse().ok()?))
        });
        parsed.ok_or_else(|| {
            PluginError::transaction(format!(
                "postgres-sink: transaction id {txn:?} is not one of this sink's ({}<subtask>:<epoch>)",
                self.txn_base
            ))
        })
    }

    /// `(subtask, epoch)` of one of this sink's GIDs.
    fn parse_gid(&self, gid: &str) -> Option<(u32, u64)> {
        let (s, e) = gid.strip_prefix(&self.sink_prefix)?.split_once('_')?;
        Some((s.parse().ok()?, e.parse().ok()?))
    }

    fn convert(&self, record: &[u8]) -> Result<Vec<Value>> {
        let v: Json = serde_json::from_slice(record).map_err(|e| {
            PluginError::invalid_record(format!("postgres-sink: record is not JSON: {e}"))
        })?;
        let Json::Object(map) = v else {
            return Err(PluginError::invalid_record(
                "postgres-sink: record is not a JSON object",
            ));
        };
        self.cfg
            .columns
            .iter()
            .map(|c| {
                let field = c.field.as_deref().unwrap_or(&c.name);
                convert::convert(c.ty, map.get(field).unwrap_or(&Json::Null)).map_err(|e| {
                    PluginError::invalid_record(format!(
                        "postgres-sink: column {:?} ({}, field {field:?}): {e}",
                        c.name,
                        c.ty.name()
                    ))
                })
            })
            .collect()
    }

    fn statement(&mut self, rows: usize) -> String {
        if let Some(s) = self.statements.get(&rows) {
            return s.clone();
        }
        let cols: Vec<&str> = self.cfg.columns.iter().map(|c| c.name.as_str()).collect();
        let n = cols.len();
        let mut sql = format!(
            "INSERT INTO {} ({}) VALUES ",
            self.cfg.table,
            cols.iter()
                .map(|c| format!("\"{c}\""))
                .collect::<Vec<_>>()
                .join(", ")
        );
        for r in 0..rows {
            if r > 0 {
                sql.push_str(", ");
            }
            sql.push('(');
            for c in 0..n {
                if c > 0 {
                    sql.push_str(", ");
                }
                sql.push_str(&format!("${}", r * n + c + 1));
            }
            sql.push(')');
        }
        if self.cfg.mode == Mode::Upsert {
            let keys: Vec<String> = self.cfg.key.iter().map(|k| format!("\"{k}\"")).collect();
            let sets: Vec<String> = cols
                .iter()
                .filter(|c| !self.cfg.key.iter().any(|k| k == *c))
                .map(|c| format!("\"{c}\" = EXCLUDED.\"{c}\""))
                .collect();
            sql.push_str(&format!(
                " ON CONFLICT ({}) DO UPDATE SET {}",
                keys.join(", "),
                sets.join(", ")
            ));
        }
        self.statements.insert(rows, sql.clone());
        sql
    }

    fn key_of(&self, row: &[Value]) -> String {
        format!(
            "{:?}",
            self.key_idx.iter().map(|&i| &row[i]).collect::<Vec<_>>()
        )
    }

    fn ensure_begun(&mut self) -> Result<()> {
        let Some(open) = self.open.as_mut() else {
            return Err(PluginError::transaction(
                "postgres-sink: no transaction is open",
            ));
        };
        if !open.begun {
            self.writer.begin().map_err(|e| db_err("BEGIN", e))?;
            open.begun = true;
        }
        Ok(())
    }

    /// Writes `rows` into the open transaction, in multi-row statements; in upsert mode a
    /// key repeated within one statement keeps its last row (PostgreSQL refuses to update
    /// a row twice in one statement).
    fn flush(&mut self, mut rows: Vec<Vec<Value>>) -> Result<()> {
        if rows.is_empty() {
            return Ok(());
        }
        self.ensure_begun()?;
        let per = self.cfg.rows_per_statement;
        while !rows.is_empty() {
            let rest = rows.split_off(rows.len().min(per));
            let mut chunk = std::mem::replace(&mut rows, rest);
            if self.cfg.mode == Mode::Upsert {
                let mut last: HashMap<String, usize> = HashMap::new();
                for (i, r) in chunk.iter().enumerate() {
                    last.insert(self.key_of(r), i);
                }
                if last.len() < chunk.len() {
                    let keep: BTreeSet<usize> = last.into_values().collect();
                    chunk = chunk
                        .into_iter()
                        .enumerate()
                        .filter(|(i, _)| keep.contains(i))
                        .map(|(_, r)| r)
                        .collect();
                }
            }
            let sql = self.statement(chunk.len());
            let params: Vec<Value> = chunk.into_iter().flatten().collect();
            if let Err(e) = self.writer.execute(&sql, &params) {
                let mut what = format!("writing into {}", self.cfg.table);
                if let Some(col) = failed_column(&e.message, &self.cfg.columns) {
                    what.push_str(&format!(
                        " (column {:?}, type {}: the value does not bind to the table's column type)",
                        col.name,
                        col.ty.name()
                    ));
                }
                return Err(db_err(&what, e));
            }
        }
        Ok(())
    }

    fn flush_buffer(&mut self) -> Result<()> {
        let rows = std::mem::take(&mut self.buffer);
        self.buffer_keys.clear();
        self.flush(rows)
    }

    fn marker_exists(&self, c: &Committable) -> std::result::Result<bool, PgError> {
        let rows = self.control.query(
            "SELECT 1 FROM nop_sink_epochs WHERE sink = $1 AND subtask = $2 AND epoch = $3 AND gid = $4",
            &[
                Value::Text(c.sink.clone()),
                Value::Int8(i64::from(c.subtask)),
                Value::Int8(c.epoch as i64),
                Value::Text(c.gid.clone()),
            ],
        )?;
        Ok(!rows.rows.is_empty())
    }

    fn decode(&self, committable: &[u8]) -> Result<Committable> {
        let c: Committable = serde_json::from_slice(committable).map_err(|e| {
            PluginError::transaction(format!("postgres-sink: malformed committable: {e}"))
        })?;
        if !c.gid.starts_with(&self.sink_prefix) {
            return Err(PluginError::transaction(format!(
                "postgres-sink: committable {} belongs to another sink",
                c.gid
            )));
        }
        Ok(c)
    }

    /// After an earlier epoch resolved: flush held-back upsert rows once none is pending.
    fn resolved(&mut self, gid: &str) -> Result<()> {
        self.unresolved.remove(gid);
        if self.unresolved.is_empty() && !self.buffer.is_empty() && self.open.is_some() {
            self.flush_buffer()?;
        }
        Ok(())
    }
}

impl Sink for PostgresSink {
    fn describe() -> PluginInfo {
        PluginInfo::sink("postgres-sink", "0.1.0")
            .description("Writes JSON records into a PostgreSQL table exactly once: one prepared transaction per epoch (two-phase commit); or, with transactions = \"none\", upserts committed at pre-commit (idempotent)")
            .sink_capability(SinkCapability::TwoPhaseCommit)
            .config_schema(CONFIG_SCHEMA)
    }

    fn open(task: &TaskInfo, config: &str) -> Result<Self> {
        let cfg: Config = serde_json::from_str(config)
            .map_err(|e| PluginError::invalid_config(format!("postgres-sink config: {e}")))?;
        check_config(&cfg)?;
        let open = |what: &str| {
            Session::open(&cfg.connection)
                .map_err(|e| db_err(&format!("opening the {what} session"), e))
        };
        let writer = open("writer")?;
        let control = open("control")?;
        if cfg.transactions == Transactions::TwoPhase
            && let Err(e) = control.execute(MARKER_DDL, &[])
        {
            // Concurrent subtasks may race on CREATE TABLE IF NOT EXISTS (a unique violation
            // in the catalog, or the table's row type "already exists"): the table exists then.
            if !matches!(
                e.sqlstate.as_deref(),
                Some("23505") | Some("42P07") | Some("42710")
            ) {
                return Err(db_err("creating table nop_sink_epochs", e));
            }
        }
        let key_idx = cfg
            .key
            .iter()
            .filter_map(|k| cfg.columns.iter().position(|c| &c.name == k))
            .collect();
        Ok(PostgresSink {
            txn_base: format!("{}:{}:{}:", task.job_id, task.pipeline_id, task.operator_id),
            sink_prefix: pg::sink_gid_prefix(),
            task: task.clone(),
            cfg,
            writer,
            control,
            open: None,
            unresolved: BTreeSet::new(),
            buffer: Vec::new(),
            buffer_keys: HashMap::new(),
            key_idx,
            statements: HashMap::new(),
        })
    }

    fn begin(&mut self, txn: &str) -> Result<()> {
        let (subtask, epoch) = self.parse_txn(txn)?;
        if subtask != self.task.subtask_index {
            return Err(PluginError::transaction(format!(
                "postgres-sink: transaction {txn} is not this subtask's ({})",
                self.task.subtask_index
            )));
        }
        if let Some(o) = &self.open {
            return Err(PluginError::transaction(format!(
                "postgres-sink: begin {txn} while {} is open",
                o.txn
            )));
        }
        self.open = Some(Open {
            txn: txn.to_owned(),
            epoch,
            begun: false,
        });
        Ok(())
    }

    fn write(&mut self, txn: &str, batch: &Batch) -> Result<()> {
        if self.open.as_ref().is_none_or(|o| o.txn != txn) {
            return Err(PluginError::transaction(format!(
                "postgres-sink: write to {txn}, which is not the open transaction"
            )));
        }
        let mut rows = Vec::with_capacity(batch.len());
        for i in 0..batch.len() {
            rows.push(self.convert(batch.record(i))?);
        }
        if self.cfg.mode == Mode::Upsert && !self.unresolved.is_empty() {
            for row in rows {
                let key = self.key_of(&row);
                match self.buffer_keys.get(&key) {
                    Some(&i) => self.buffer[i] = row,
                    None => {
                        self.buffer_keys.insert(key, self.buffer.len());
                        self.buffer.push(row);
                    }
                }
            }
            return Ok(());
        }
        self.flush(rows)
    }

    fn pre_commit(&mut self, txn: &str) -> Result<Vec<u8>> {
        let started = std::time::Instant::now();
        let epoch = match &self.open {
            Some(o) if o.txn == txn => o.epoch,
            _ => {
                return Err(PluginError::transaction(format!(
                    "postgres-sink: pre-commit of {txn}, which is not the open transaction"
                )));
            }
        };
        self.flush_buffer()?;
        let mut c = Committable {
            gid: self.gid(self.task.subtask_index, epoch),
            sink: self.sink_id(),
            subtask: self.task.subtask_index,
            epoch,
            committed: false,
        };
        if self.cfg.transactions == Transactions::None {
            // Committed here, before the epoch is durable: see the module docs.
            let begun = self.open.take().is_some_and(|o| o.begun);
            if begun {
                self.writer
                    .commit()
                    .map_err(|e| db_err(&format!("COMMIT of epoch {epoch}"), e))?;
            }
            c.committed = true;
            timing(epoch, "pre-commit", started);
            return serde_json::to_vec(&c)
                .map_err(|e| PluginError::internal(format!("postgres-sink: committable: {e}")));
        }
        self.ensure_begun()?;
        if let Err(e) = self.writer.execute(
            "INSERT INTO nop_sink_epochs (sink, subtask, epoch, gid) VALUES ($1, $2, $3, $4)",
            &[
                Value::Text(c.sink.clone()),
                Value::Int8(i64::from(c.subtask)),
                Value::Int8(c.epoch as i64),
                Value::Text(c.gid.clone()),
            ],
        ) {
            let _ = self.writer.rollback();
            self.open = None;
            if e.sqlstate.as_deref() == Some("23505") {
                return Err(PluginError::transaction(format!(
                    "postgres-sink: epoch {epoch} of subtask {} is already committed in nop_sink_epochs \
                     (gid {}): the job's epochs restarted below committed ones (a fresh run of the \
                     same job id against the same database?)",
                    c.subtask, c.gid
                )));
            }
            return Err(db_err("writing the epoch marker", e));
        }
        if let Err(e) = self.writer.prepare(&c.gid) {
            // A failed PREPARE ends the transaction (rolled back).
            self.open = None;
            if e.sqlstate.as_deref() == Some("55000") {
                return Err(PluginError::transaction(format!(
                    "postgres-sink: connection `{}`: the server has prepared transactions disabled \
                     (max_prepared_transactions = 0); start PostgreSQL with \
                     max_prepared_transactions >= parallelism x 2 [sqlstate 55000]",
                    self.cfg.connection
                )));
            }
            return Err(db_err(&format!("PREPARE TRANSACTION {}", c.gid), e));
        }
        self.open = None;
        self.unresolved.insert(c.gid.clone());
        timing(epoch, "pre-commit", started);
        serde_json::to_vec(&c)
            .map_err(|e| PluginError::internal(format!("postgres-sink: committable: {e}")))
    }

    fn commit(&mut self, committable: &[u8]) -> Result<()> {
        let c = self.decode(committable)?;
        if c.committed {
            return Ok(());
        }
        let started = std::time::Instant::now();
        let found = self
            .control
            .commit_prepared(&c.gid)
            .map_err(|e| db_err(&format!("COMMIT PREPARED {}", c.gid), e))?;
        if !found {
            let marker = self
                .marker_exists(&c)
                .map_err(|e| db_err("looking up the epoch marker", e))?;
            if !marker {
                return Err(PluginError::transaction(format!(
                    "postgres-sink: COMMIT PREPARED {}: no such prepared transaction (42704) and no \
                     marker row in nop_sink_epochs: it was rolled back or lost, not committed",
                    c.gid
                )));
            }
        }
        timing(c.epoch, "commit", started);
        self.resolved(&c.gid)
    }

    fn abort(&mut self, txn: &str) -> Result<()> {
        let (subtask, epoch) = self.parse_txn(txn)?;
        if let Some(o) = &self.open
            && o.txn == txn
        {
            if o.begun {
                self.writer
                    .rollback()
                    .map_err(|e| db_err(&format!("ROLLBACK of {txn}"), e))?;
            }
            self.open = None;
            self.buffer.clear();
            self.buffer_keys.clear();
            return Ok(());
        }
        if self.cfg.transactions == Transactions::None {
            // Committed at pre-commit; a replay upserts the same keys again.
            return Ok(());
        }
        let gid = self.gid(subtask, epoch);
        let found = self
            .control
            .rollback_prepared(&gid)
            .map_err(|e| db_err(&format!("ROLLBACK PREPARED {gid}"), e))?;
        if found {
            log(
                LogLevel::Info,
                &format!("postgres-sink: rolled back prepared transaction {gid}"),
            );
        } else {
            let c = Committable {
                gid: gid.clone(),
                sink: self.sink_id(),
                subtask,
                epoch,
                committed: false,
            };
            // The host aborts only epochs that are not durable (design §7.4): a marker
            // means the epoch's rows were committed outside the protocol (a COMMIT
            // PREPARED by hand), and the replay would write them again.
            if self
                .marker_exists(&c)
                .map_err(|e| db_err("looking up the epoch marker", e))?
            {
                return Err(PluginError::transaction(format!(
                    "postgres-sink: epoch {epoch} of subtask {subtask} is not durable, yet its \
                     transaction {gid} is committed (its marker row is in nop_sink_epochs): its \
                     rows were committed outside the protocol, by a COMMIT PREPARED by hand or \
                     another writer, and the replay of the epoch would write them again. \
                     Nothing more is written: delete that epoch's rows and its marker row to \
                     resume, or start the job afresh"
                )));
            }
        }
        self.resolved(&gid)
    }

    fn recover(&mut self, committable: &[u8]) -> Result<CommitOutcome> {
        let c = self.decode(committable)?;
        if c.committed {
            return Ok(CommitOutcome::Committed);
        }
        let outcome = (|| -> std::result::Result<CommitOutcome, PgError> {
            let prepared = self.control.list_prepared(&c.gid)?;
            if prepared.contains(&c.gid) && self.control.commit_prepared(&c.gid)? {
                return Ok(CommitOutcome::Committed);
            }
            Ok(if self.marker_exists(&c)? {
                CommitOutcome::Committed
            } else {
                CommitOutcome::Unknown
            })
        })();
        match outcome {
            Ok(o) => {
                if o == CommitOutcome::Committed {
                    self.resolved(&c.gid)?;
                } else {
                    log(
                        LogLevel::Error,
                        &format!(
                            "postgres-sink: transaction {} is neither prepared nor committed (no marker row): rolled back behind the engine's back, or the database was restored",
                            c.gid
                        ),
                    );
                }
                Ok(o)
            }
            Err(e) => {
                log(
                    LogLevel::Error,
                    &format!(
                        "postgres-sink: recover {}: {} [sqlstate {}]; outcome unknown",
                        c.gid,
                        e.message,
                        e.sqlstate.as_deref().unwrap_or("-")
                    ),
                );
                Ok(CommitOutcome::Unknown)
            }
        }
    }

    fn pending_transactions(&mut self) -> Result<Vec<String>> {
        if self.cfg.transactions == Transactions::None {
            return Ok(self.open.iter().map(|o| o.txn.clone()).collect());
        }
        let gids = self
            .control
            .list_prepared(&self.sink_prefix)
            .map_err(|e| db_err("listing prepared transactions", e))?;
        let me = self.task.subtask_index;
        let p = self.task.parallelism.max(1);
        let mut out: Vec<String> = gids
            .iter()
            .filter_map(|g| self.parse_gid(g))
            .filter(|&(s, _)| s == me || (s >= p && s % p == me))
            .map(|(s, e)| format!("{}{s}:{e}", self.txn_base))
            .collect();
        if let Some(o) = &self.open {
            out.push(o.txn.clone());
        }
        Ok(out)
    }

    fn close(&mut self) {
        // Dropping the sessions closes the connections: an open transaction is rolled back
        // by the server, prepared ones stay for commit or recovery.
        self.open = None;
    }
}

nop_stream_sdk::export_sink!(PostgresSink);

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(text: &str) -> Result<Config> {
        let c: Config =
            serde_json::from_str(text).map_err(|e| PluginError::invalid_config(e.to_string()))?;
        check_config(&c)?;
        Ok(c)
    }

    #[test]
    fn configs_are_checked() {
        assert!(cfg(r#"{"connection":"pg","table":"t","columns":[{"name":"a"}]}"#).is_ok());
        assert!(
            cfg(r#"{"connection":"pg","table":"s.t","mode":"upsert","key":["a"],"columns":[{"name":"a"},{"name":"b","type":"jsonb"}]}"#)
                .is_ok()
        );
        for bad in [
            r#"{"connection":"pg","table":"t; drop","columns":[{"name":"a"}]}"#,
            r#"{"connection":"pg","table":"t","columns":[]}"#,
            r#"{"connection":"pg","table":"t","columns":[{"name":"a b"}]}"#,
            r#"{"connection":"pg","table":"t","columns":[{"name":"a"},{"name":"a"}]}"#,
            r#"{"connection":"pg","table":"t","mode":"upsert","columns":[{"name":"a"},{"name":"b"}]}"#,
            r#"{"connection":"pg","table":"t","mode":"upsert","key":["a"],"columns":[{"name":"a"}]}"#,
            r#"{"connection":"pg","table":"t","key":["z"],"columns":[{"name":"a"}]}"#,
            r#"{"connection":"pg","table":"t","columns":[{"name":"a"}],"rows_per_statement":0}"#,
            r#"{"connection":"pg","table":"t","columns":[{"name":"a"}],"extra":1}"#,
            r#"{"table":"t","columns":[{"name":"a"}]}"#,
            r#"{"connection":"pg","table":"t","transactions":"none","columns":[{"name":"a"}]}"#,
            r#"{"connection":"pg","table":"t","transactions":"maybe","mode":"upsert","key":["a"],"columns":[{"name":"a"},{"name":"b"}]}"#,
            r#"{"connection":"pg","table":"t","columns":[{"name":"a","type":"int16"}]}"#,
        ] {
            assert!(cfg(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn transactions_none_is_upsert_only_and_idempotent_by_schema() {
        let ok = cfg(r#"{"connection":"pg","table":"t","mode":"upsert","key":["a"],"transactions":"none","columns":[{"name":"a"},{"name":"b","type":"numeric"}]}"#)
            .unwrap();
        assert_eq!(ok.transactions, Transactions::None);
        let err = cfg(r#"{"connection":"pg","table":"t","mode":"insert","transactions":"none","columns":[{"name":"a"}]}"#)
            .err()
            .unwrap()
            .to_string();
        assert!(
            err.contains("\"transactions\" = \"none\" needs \"mode\" = \"upsert\"")
                && err.contains("duplicates"),
            "{err}"
        );
        let schema: Json = serde_json::from_str(CONFIG_SCHEMA).unwrap();
        assert_eq!(
            schema["properties"]["transactions"]["x-sink-capability"]["none"],
            "idempotent"
        );
        // Every column type the schema lists parses as a ColumnType.
        for t in schema["properties"]["columns"]["items"]["properties"]["type"]["enum"]
            .as_array()
            .unwrap()
        {
            serde_json::from_value::<ColumnType>(t.clone()).unwrap();
        }
        let c = Committable {
            gid: "nop_0123456789abcdef_0_4".into(),
            sink: "nop_0123456789abcdef".into(),
            subtask: 0,
            epoch: 4,
            committed: true,
        };
        let back: Committable = serde_json::from_slice(&serde_json::to_vec(&c).unwrap()).unwrap();
        assert!(back.committed);
    }

    #[test]
    fn a_host_binding_error_names_its_column() {
        let c = cfg(r#"{"connection":"pg","table":"t","columns":[{"name":"a"},{"name":"b","type":"uuid"},{"name":"c"}]}"#)
            .unwrap();
        let msg = "connection `pg`: error serializing parameter 4: a uuid value does not bind";
        assert_eq!(failed_column(msg, &c.columns).unwrap().name, "b");
        assert!(failed_column("duplicate key", &c.columns).is_none());
    }

    #[test]
    fn describes_itself_as_two_phase_commit() {
        let info = PostgresSink::describe();
        assert_eq!(info.sink_capability, Some(SinkCapability::TwoPhaseCommit));
        serde_json::from_str::<serde_json::Value>(&info.config_schema).unwrap();
    }

    #[test]
    fn committables_round_trip() {
        let c = Committable {
            gid: "nop_0123456789abcdef_3_17".into(),
            sink: "nop_0123456789abcdef".into(),
            subtask: 3,
            epoch: 17,
            committed: false,
        };
        let bytes = serde_json::to_vec(&c).unwrap();
        assert_eq!(serde_json::from_slice::<Committable>(&bytes).unwrap(), c);
        assert!(c.gid.len() < 200);
    }
}
