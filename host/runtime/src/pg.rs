//! The host side of `nop:postgres/client@0.1.1` (issue 13 §1): PostgreSQL sessions for
//! connector plugins, on the connections the job file grants to their node.
//!
//! - The plugin names a connection; the host holds its URL and reads the password from
//!   the environment variable the job file names, when the session opens. Neither ever
//!   crosses into the component, and no message the host builds repeats them.
//! - `execute` / `query` refuse transaction-control and session statements
//!   ([`refused_statement`]); the typed calls send `BEGIN`, `ROLLBACK`, `COMMIT`,
//!   `PREPARE TRANSACTION`, `COMMIT PREPARED` and `ROLLBACK PREPARED` as plain statements
//!   (never a driver transaction object: drivers treat a transaction as open after
//!   PREPARE, and drop guards send ROLLBACK), with the GID quoted by the host.
//! - GIDs are scoped: `prepare` and `commit-prepared` take only this subtask's prefix
//!   `nop_<hash>_<subtask>_`; `rollback-prepared` and `list-prepared` the sink's prefix
//!   `nop_<hash>_`, so a subtask can clean up after subtasks that a downscale removed.
//! - Limits ([`crate::Limits`]): `pg_sessions` per instance, `pg_statement_timeout_ms`
//!   (server-side `statement_timeout`), `pg_result_bytes` per query result,
//!   `pg_connect_timeout_ms`.
//!
//! The client is the blocking `postgres` crate without TLS (loopback and private networks).

use crate::bindings::pg::nop::postgres::client::{
    self as wpg, Column, ErrorKind, PgError, Rows, Value,
};
use crate::host::StoreData;
use bytes::{BufMut, BytesMut};
use postgres::types::{FromSql, IsNull, ToSql, Type, to_sql_checked};
use sha2::{Digest, Sha256};
use std::error::Error as StdError;
use std::str::FromStr;
use std::time::Duration;
use wasmtime::component::Resource;

/// Longest GID PostgreSQL accepts is 199 bytes.
pub const MAX_GID_BYTES: usize = 199;

pub use crate::connection::ConnectionGrant;

/// What a sink instance may reach through `nop:postgres/client`: its granted connections
/// and its GID scope.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PgAccess {
    /// Connections granted to the node.
    pub grants: Vec<ConnectionGrant>,
    /// Operator name, for messages.
    pub operator: String,
    /// `nop_<hash>_`: shared by every subtask of the sink.
    pub sink_prefix: String,
    /// `nop_<hash>_<subtask>_`: this subtask's own.
    pub subtask_prefix: String,
}

impl PgAccess {
    /// The access of subtask `subtask` of the sink `(job, pipeline, operator)`, named
    /// `operator_name` in messages. The GID prefix also hashes the databases the granted
    /// connections name: GIDs share one namespace across the databases of a server, so
    /// the same job writing into two databases of one server must not collide.
    pub fn new(
        grants: Vec<ConnectionGrant>,
        job: &str,
        pipeline: &str,
        operator: &str,
        operator_name: &str,
        subtask: u32,
    ) -> Self {
        let mut databases: Vec<String> = grants.iter().map(|g| database_of(&g.url)).collect();
        databases.sort();
        databases.dedup();
        let sink_prefix = sink_gid_prefix(job, pipeline, operator, &databases.join(","));
        PgAccess {
            grants,
            operator: operator_name.to_owned(),
            subtask_prefix: format!("{sink_prefix}{subtask}_"),
            sink_prefix,
        }
    }
}

/// The database a PostgreSQL URL names (PostgreSQL's default: the user name).
fn database_of(url: &str) -> String {
    match postgres::Config::from_str(url) {
        Ok(c) => c
            .get_dbname()
            .or(c.get_user())
            .unwrap_or_default()
            .to_owned(),
        Err(_) => String::new(),
    }
}

/// `nop_<16 hex digits of sha256(job \0 pipeline \0 operator \0 databases)>_`: the GID
/// prefix of a sink.
pub fn sink_gid_prefix(job: &str, pipeline: &str, operator: &str, databases: &str) -> String {
    let mut h = Sha256::new();
    h.update(job.as_bytes());
    h.update([0]);
    h.update(pipeline.as_bytes());
    h.update([0]);
    h.update(operator.as_bytes());
    h.update([0]);
    h.update(databases.as_bytes());
    format!("nop_{}_", &hex::encode(h.finalize())[..16])
}

/// Per-instance state of the capability (in [`StoreData`]).
#[derive(Debug, Default)]
pub(crate) struct PgState {
    /// `None`: the instance is not a sink, so it may open no connection.
    pub(crate) access: Option<PgAccess>,
    /// Sessions open now.
    pub(crate) open: u32,
    pub(crate) max_sessions: u32,
    pub(crate) statement_timeout_ms: u64,
    pub(crate) result_bytes: u64,
    pub(crate) connect_timeout_ms: u64,
}

/// One session: a server connection of a granted connection name.
pub struct Session {
    client: postgres::Client,
    connection: String,
}

fn err(kind: ErrorKind, message: String) -> PgError {
    PgError {
        kind,
        sqlstate: None,
        message,
    }
}

/// A driver error as a [`PgError`] naming the connection. The driver's messages carry no
/// password or address (connect errors say e.g. "Connection refused"); server errors keep
/// their SQLSTATE.
fn pg_error(connection: &str, e: &postgres::Error) -> PgError {
    if let Some(db) = e.as_db_error() {
        let code = db.code().code().to_owned();
        let kind = if code.starts_with("08") {
            ErrorKind::Connection
        } else {
            ErrorKind::Server
        };
        return PgError {
            kind,
            message: format!("connection `{connection}`: {} ({code})", db.message()),
            sqlstate: Some(code),
        };
    }
    let text = e.to_string();
    let kind = if e.is_closed()
        || text.contains("connect")
        || e.source().is_some_and(|s| s.is::<std::io::Error>())
    {
        ErrorKind::Connection
    } else if text.contains("serializing") || text.contains("deserializing") {
        ErrorKind::Conversion
    } else {
        ErrorKind::Connection
    };
    let detail = match e.source() {
        Some(s) => format!("{text}: {s}"),
        None => text,
    };
    err(kind, format!("connection `{connection}`: {detail}"))
}

/// Why `sql` may not go through `execute` / `query`, if it may not: transaction control
/// and session state belong to the host (the typed calls), and `COPY`, `DO` and `CALL`
/// could run either. A guard for honest plugins, not a security boundary: the database
/// role's privileges are.
pub fn refused_statement(sql: &str) -> Option<String> {
    let mut s = sql.trim_start();
    loop {
        if let Some(rest) = s.strip_prefix("--") {
            s = rest.split_once('\n').map_or("", |x| x.1).trim_start();
        } else if let Some(rest) = s.strip_prefix("/*") {
            s = rest.split_once("*/").map_or("", |x| x.1).trim_start();
        } else if let Some(rest) = s.strip_prefix('(') {
            s = rest.trim_start();
        } else {
            break;
        }
    }
    let word: String = s
        .chars()
        .take_while(|c| c.is_ascii_alphabetic() || *c == '_')
        .collect::<String>()
        .to_ascii_uppercase();
    const REFUSED: &[&str] = &[
        "BEGIN",
        "START",
        "COMMIT",
        "END",
        "ROLLBACK",
        "ABORT",
        "SAVEPOINT",
        "RELEASE",
        "PREPARE",
        "SET",
        "RESET",
        "DISCARD",
        "LISTEN",
        "UNLISTEN",
        "NOTIFY",
        "COPY",
        "DO",
        "CALL",
        "LOAD",
    ];
    if word.is_empty() {
        return Some("an empty statement".into());
    }
    if REFUSED.contains(&word.as_str()) {
        return Some(format!(
            "`{word}` statements are refused: transaction control goes through the typed calls \
             (begin, prepare, commit-prepared, rollback-prepared, rollback) and session state \
             belongs to the host"
        ));
    }
    let lower = sql.to_ascii_lowercase();
    if lower.contains("set_config") {
        return Some("`set_config` is refused: session state belongs to the host".into());
    }
    None
}

/// Checks a GID against `prefix` and PostgreSQL's rules; `what` names the call.
fn check_gid(gid: &str, prefix: &str, what: &str) -> Result<(), PgError> {
    if !gid.starts_with(prefix) {
        return Err(err(
            ErrorKind::Refused,
            format!("{what}: GID `{gid}` is outside this sink's prefix `{prefix}`"),
        ));
    }
    if gid.len() > MAX_GID_BYTES {
        return Err(err(
            ErrorKind::Refused,
            format!(
                "{what}: GID is {} bytes; PostgreSQL takes at most {MAX_GID_BYTES}",
                gid.len()
            ),
        ));
    }
    if !gid
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.' | b':'))
    {
        return Err(err(
            ErrorKind::Refused,
            format!("{what}: GID `{gid}` may hold only [A-Za-z0-9_.:-]"),
        ));
    }
    Ok(())
}

/// `'gid'` as an SQL literal (check_gid already refused quotes; this stays safe anyway).
fn quote(gid: &str) -> String {
    format!("'{}'", gid.replace('\'', "''"))
}

impl StoreData {
    fn session(&mut self, s: &Resource<Session>) -> wasmtime::Result<&mut Session> {
        Ok(self.table.get_mut(s)?)
    }

    fn open_session(&mut self, connection: &str) -> Result<Session, PgError> {
        let pg = &self.pg;
        let Some(access) = &pg.access else {
            return Err(err(
                ErrorKind::Refused,
                format!("connection `{connection}`: only sinks may be granted connections"),
            ));
        };
        let Some(grant) = access.grants.iter().find(|g| g.name == connection) else {
            let granted: Vec<String> = access
                .grants
                .iter()
                .map(|g| format!("`{}`", g.name))
                .collect();
            return Err(err(
                ErrorKind::Refused,
                format!(
                    "connection `{connection}` is not granted to sink `{}`; add `connections = [\"{connection}\"]` to its [[sink]] table (granted: {})",
                    access.operator,
                    if granted.is_empty() {
                        "none".into()
                    } else {
                        granted.join(", ")
                    }
                ),
            ));
        };
        if pg.open >= pg.max_sessions {
            return Err(err(
                ErrorKind::Refused,
                format!(
                    "connection `{connection}`: exceeded limit `pg_sessions` ({} open sessions per instance)",
                    pg.max_sessions
                ),
            ));
        }
        let mut config = postgres::Config::from_str(&grant.url).map_err(|_| {
            err(
                ErrorKind::Refused,
                format!("connection `{connection}`: the URL in the job file does not parse"),
            )
        })?;
        // The job file refuses a URL with a password; the driver's own reading of it is
        // checked too, so no credential ever comes from a URL.
        if config.get_password().is_some() {
            return Err(err(
                ErrorKind::Refused,
                format!(
                    "connection `{connection}`: the URL holds a password; name an environment \
                     variable in `password_env` instead"
                ),
            ));
        }
        if let Some(pw) = grant.password().map_err(|m| err(ErrorKind::Refused, m))? {
            config.password(pw);
        }
        config.connect_timeout(Duration::from_millis(pg.connect_timeout_ms.max(1)));
        config.application_name("nop-stream");
        let mut client = config.connect(postgres::NoTls).map_err(|e| {
            let mut pe = pg_error(connection, &e);
            if pe.kind != ErrorKind::Server
                || pe.sqlstate.as_deref().is_some_and(|c| c.starts_with("28"))
            {
                pe.kind = ErrorKind::Connection;
            }
            pe.message = format!("cannot connect: {}", pe.message);
            pe
        })?;
        client
            .batch_execute(&format!(
                "SET statement_timeout = {}",
                pg.statement_timeout_ms
            ))
            .map_err(|e| pg_error(connection, &e))?;
        Ok(Session {
            client,
            connection: connection.to_owned(),
        })
    }

    fn access(&self) -> Result<&PgAccess, PgError> {
        self.pg.access.as_ref().ok_or_else(|| {
            err(
                ErrorKind::Refused,
                "only sinks may use nop:postgres/client".into(),
            )
        })
    }

    /// A two-phase-commit call on `gid`: checks it lies under the subtask's (or the
    /// sink's) GID prefix, runs `run` with the GID quoted, and counts the time as host wait.
    fn on_gid<T>(
        &mut self,
        s: &Resource<Session>,
        gid: &str,
        scope: GidScope,
        what: &str,
        run: impl FnOnce(&mut Session, &str) -> Result<T, PgError>,
    ) -> wasmtime::Result<Result<T, PgError>> {
        let started = std::time::Instant::now();
        let checked = self.access().and_then(|a| {
            let prefix = match scope {
                GidScope::Subtask => &a.subtask_prefix,
                GidScope::Sink => &a.sink_prefix,
            };
            check_gid(gid, prefix, what)
        });
        let out = match checked {
            Err(e) => Err(e),
            Ok(()) => run(self.session(s)?, &quote(gid)),
        };
        self.host_wait += started.elapsed();
        Ok(out)
    }
}

impl wpg::Host for StoreData {
    fn gid_prefix(&mut self) -> wasmtime::Result<String> {
        Ok(self
            .pg
            .access
            .as_ref()
            .map(|a| a.subtask_prefix.clone())
            .unwrap_or_default())
    }

    fn sink_gid_prefix(&mut self) -> wasmtime::Result<String> {
        Ok(self
            .pg
            .access
            .as_ref()
            .map(|a| a.sink_prefix.clone())
            .unwrap_or_default())
    }
}

/// Which GID prefix a two-phase-commit call must stay under: the subtask's own (prepare,
/// commit) or the sink's, which spans subtasks that no longer exist (rollback, list).
#[derive(Clone, Copy)]
enum GidScope {
    Subtask,
    Sink,
}

/// Runs a simple (unparameterised) statement the host built.
fn simple(s: &mut Session, sql: &str) -> Result<(), PgError> {
    s.client
        .batch_execute(sql)
        .map_err(|e| pg_error(&s.connection, &e))
}

/// `Ok(false)` for 42704 (no such prepared transaction).
fn finish_prepared(s: &mut Session, sql: &str) -> Result<bool, PgError> {
    match simple(s, sql) {
        Ok(()) => Ok(true),
        Err(e) if e.sqlstate.as_deref() == Some("42704") => Ok(false),
        Err(e) => Err(e),
    }
}

impl wpg::HostSession for StoreData {
    fn open(&mut self, connection: String) -> wasmtime::Result<Result<Resource<Session>, PgError>> {
        let started = std::time::Instant::now();
        let out = self.open_session(&connection);
        self.host_wait += started.elapsed();
        match out {
            Ok(s) => {
                self.pg.open += 1;
                Ok(Ok(self.table.push(s)?))
            }
            Err(e) => {
                tracing::warn!(plugin = %self.label, "{}", e.message);
                Ok(Err(e))
            }
        }
    }

    fn execute(
        &mut self,
        s: Resource<Session>,
        statement: String,
        params: Vec<Value>,
    ) -> wasmtime::Result<Result<u64, PgError>> {
        let started = std::time::Instant::now();
        let session = self.session(&s)?;
        let out = (|| {
            if let Some(why) = refused_statement(&statement) {
                return Err(err(
                    ErrorKind::Refused,
                    format!("connection `{}`: {why}", session.connection),
                ));
            }
            let refs: Vec<Param<'_>> = params.iter().map(Param).collect();
            let dyns: Vec<&(dyn ToSql + Sync)> =
                refs.iter().map(|p| p as &(dyn ToSql + Sync)).collect();
            session
                .client
                .execute(statement.as_str(), &dyns)
                .map_err(|e| pg_error(&session.connection, &e))
        })();
        self.host_wait += started.elapsed();
        Ok(out)
    }

    fn query(
        &mut self,
        s: Resource<Session>,
        statement: String,
        params: Vec<Value>,
    ) -> wasmtime::Result<Result<Rows, PgError>> {
        let started = std::time::Instant::now();
        let max_bytes = self.pg.result_bytes;
        let session = self.session(&s)?;
        let out = (|| {
            if let Some(why) = refused_statement(&statement) {
                return Err(err(
                    ErrorKind::Refused,
                    format!("connection `{}`: {why}", session.connection),
                ));
            }
            let refs: Vec<Param<'_>> = params.iter().map(Param).collect();
            let dyns: Vec<&(dyn ToSql + Sync)> =
                refs.iter().map(|p| p as &(dyn ToSql + Sync)).collect();
            let conn = session.connection.clone();
            let stmt = session
                .client
                .prepare(statement.as_str())
                .map_err(|e| pg_error(&conn, &e))?;
            let rows = session
                .client
                .query(&stmt, &dyns)
                .map_err(|e| pg_error(&conn, &e))?;
            let columns: Vec<Column> = stmt
                .columns()
                .iter()
                .map(|c| Column {
                    name: c.name().to_owned(),
                    type_name: c.type_().name().to_owned(),
                })
                .collect();
            let mut bytes = 0u64;
            let mut out = Vec::with_capacity(rows.len());
            for row in &rows {
                let mut values = Vec::with_capacity(columns.len());
                for (i, c) in stmt.columns().iter().enumerate() {
                    let raw: Option<Raw<'_>> = row.try_get(i).map_err(|e| pg_error(&conn, &e))?;
                    let v = match raw {
                        None => Value::Null,
                        Some(r) => {
                            bytes += r.0.len() as u64;
                            decode(c.type_(), r.0).map_err(|m| {
                                err(
                                    ErrorKind::Conversion,
                                    format!("connection `{conn}`: column `{}`: {m}", c.name()),
                                )
                            })?
                        }
                    };
                    values.push(v);
                }
                if bytes > max_bytes {
                    return Err(err(
                        ErrorKind::Limit,
                        format!(
                            "connection `{conn}`: exceeded limit `pg_result_bytes` ({max_bytes} bytes per query result)"
                        ),
                    ));
                }
                out.push(values);
            }
            Ok(Rows { columns, rows: out })
        })();
        self.host_wait += started.elapsed();
        Ok(out)
    }

    fn begin(&mut self, s: Resource<Session>) -> wasmtime::Result<Result<(), PgError>> {
        let started = std::time::Instant::now();
        let out = simple(self.session(&s)?, "BEGIN");
        self.host_wait += started.elapsed();
        Ok(out)
    }

    fn rollback(&mut self, s: Resource<Session>) -> wasmtime::Result<Result<(), PgError>> {
        let started = std::time::Instant::now();
        let out = simple(self.session(&s)?, "ROLLBACK");
        self.host_wait += started.elapsed();
        Ok(out)
    }

    fn commit(&mut self, s: Resource<Session>) -> wasmtime::Result<Result<(), PgError>> {
        let started = std::time::Instant::now();
        let out = simple(self.session(&s)?, "COMMIT");
        self.host_wait += started.elapsed();
        Ok(out)
    }

    fn prepare(
        &mut self,
        s: Resource<Session>,
        gid: String,
    ) -> wasmtime::Result<Result<(), PgError>> {
        self.on_gid(&s, &gid, GidScope::Subtask, "prepare", |session, gid| {
            simple(session, &format!("PREPARE TRANSACTION {gid}"))
        })
    }

    fn commit_prepared(
        &mut self,
        s: Resource<Session>,
        gid: String,
    ) -> wasmtime::Result<Result<bool, PgError>> {
        self.on_gid(
            &s,
            &gid,
            GidScope::Subtask,
            "commit-prepared",
            |session, gid| finish_prepared(session, &format!("COMMIT PREPARED {gid}")),
        )
    }

    fn rollback_prepared(
        &mut self,
        s: Resource<Session>,
        gid: String,
    ) -> wasmtime::Result<Result<bool, PgError>> {
        self.on_gid(
            &s,
            &gid,
            GidScope::Sink,
            "rollback-prepared",
            |session, gid| finish_prepared(session, &format!("ROLLBACK PREPARED {gid}")),
        )
    }

    fn list_prepared(
        &mut self,
        s: Resource<Session>,
        prefix: String,
    ) -> wasmtime::Result<Result<Vec<String>, PgError>> {
        let started = std::time::Instant::now();
        let sink_prefix = match self.access() {
            Ok(a) => a.sink_prefix.clone(),
            Err(e) => return Ok(Err(e)),
        };
        let session = self.session(&s)?;
        let out = if !prefix.starts_with(&sink_prefix) {
            Err(err(
                ErrorKind::Refused,
                format!(
                    "list-prepared: prefix `{prefix}` is outside this sink's prefix `{sink_prefix}`"
                ),
            ))
        } else {
            session
                .client
                .query(
                    "SELECT gid FROM pg_prepared_xacts \
                     WHERE database = current_database() AND starts_with(gid, $1) ORDER BY gid",
                    &[&prefix],
                )
                .map(|rows| rows.iter().map(|r| r.get::<_, String>(0)).collect())
                .map_err(|e| pg_error(&session.connection, &e))
        };
        self.host_wait += started.elapsed();
        Ok(out)
    }

    fn drop(&mut self, s: Resource<Session>) -> wasmtime::Result<()> {
        let session = self.table.delete(s)?;
        self.pg.open = self.pg.open.saturating_sub(1);
        drop(session);
        Ok(())
    }
}

// ---- values ----------------------------------------------------------------------------

/// Microseconds from 1970-01-01 to PostgreSQL's epoch 2000-01-01.
const PG_EPOCH_US: i64 = 946_684_800_000_000;

/// A WIT value as a statement parameter, converted to the type the server inferred.
#[derive(Debug)]
struct Param<'a>(&'a Value);

type BoxError = Box<dyn StdError + Sync + Send>;

fn mismatch(v: &Value, ty: &Type) -> BoxError {
    let name = match v {
        Value::Null => "null",
        Value::Boolean(_) => "boolean",
        Value::Int2(_) => "int2",
        Value::Int4(_) => "int4",
        Value::Int8(_) => "int8",
        Value::Float4(_) => "float4",
        Value::Float8(_) => "float8",
        Value::Text(_) => "text",
        Value::Bytea(_) => "bytea",
        Value::Jsonb(_) => "jsonb",
        Value::Numeric(_) => "numeric",
        Value::Timestamptz(_) => "timestamptz",
        Value::Uuid(_) => "uuid",
    };
    format!(
        "a {name} value does not bind to a parameter of type {}",
        ty.name()
    )
    .into()
}

fn is_text(ty: &Type) -> bool {
    [
        Type::TEXT,
        Type::VARCHAR,
        Type::BPCHAR,
        Type::NAME,
        Type::UNKNOWN,
    ]
    .contains(ty)
}

impl ToSql for Param<'_> {
    fn to_sql(&self, ty: &Type, out: &mut BytesMut) -> Result<IsNull, BoxError> {
        let v = self.0;
        match v {
            Value::Null => return Ok(IsNull::Yes),
            Value::Boolean(b) if *ty == Type::BOOL => out.put_u8(u8::from(*b)),
            Value::Int2(_) | Value::Int4(_) | Value::Int8(_) => {
                let n = match v {
                    Value::Int2(n) => i64::from(*n),
                    Value::Int4(n) => i64::from(*n),
                    Value::Int8(n) => *n,
                    _ => unreachable!(),
                };
                let range =
                    || -> BoxError { format!("{n} is out of range for {}", ty.name()).into() };
                match *ty {
                    Type::INT2 => out.put_i16(i16::try_from(n).map_err(|_| range())?),
                    Type::INT4 => out.put_i32(i32::try_from(n).map_err(|_| range())?),
                    Type::INT8 => out.put_i64(n),
                    Type::FLOAT4 => out.put_f32(n as f32),
                    Type::FLOAT8 => out.put_f64(n as f64),
                    Type::NUMERIC => encode_numeric(&n.to_string(), out)?,
                    _ if is_text(ty) => out.put_slice(n.to_string().as_bytes()),
                    _ => return Err(mismatch(v, ty)),
                }
            }
            Value::Float4(_) | Value::Float8(_) => {
                let x = match v {
                    Value::Float4(x) => f64::from(*x),
                    Value::Float8(x) => *x,
                    _ => unreachable!(),
                };
                match *ty {
                    Type::FLOAT4 => out.put_f32(x as f32),
                    Type::FLOAT8 => out.put_f64(x),
                    Type::NUMERIC if x.is_finite() => encode_numeric(&format!("{x}"), out)?,
                    Type::NUMERIC if x.is_nan() => encode_numeric("NaN", out)?,
                    _ => return Err(mismatch(v, ty)),
                }
            }
            Value::Text(s) => match *ty {
                Type::JSON => out.put_slice(s.as_bytes()),
                Type::JSONB => {
                    out.put_u8(1);
                    out.put_slice(s.as_bytes());
                }
                Type::NUMERIC => encode_numeric(s, out)?,
                Type::UUID => out.put_slice(&parse_uuid(s)?),
                _ if is_text(ty) => out.put_slice(s.as_bytes()),
                _ => return Err(mismatch(v, ty)),
            },
            Value::Bytea(b) if *ty == Type::BYTEA => out.put_slice(b),
            Value::Jsonb(s) => match *ty {
                Type::JSONB => {
                    out.put_u8(1);
                    out.put_slice(s.as_bytes());
                }
                Type::JSON => out.put_slice(s.as_bytes()),
                _ if is_text(ty) => out.put_slice(s.as_bytes()),
                _ => return Err(mismatch(v, ty)),
            },
            Value::Numeric(s) => match *ty {
                Type::NUMERIC => encode_numeric(s, out)?,
                _ if is_text(ty) => out.put_slice(s.as_bytes()),
                _ => return Err(mismatch(v, ty)),
            },
            Value::Timestamptz(us) if *ty == Type::TIMESTAMPTZ || *ty == Type::TIMESTAMP => {
                out.put_i64(
                    us.checked_sub(PG_EPOCH_US)
                        .ok_or("timestamp out of range")?,
                );
            }
            Value::Uuid(s) if *ty == Type::UUID => out.put_slice(&parse_uuid(s)?),
            _ => return Err(mismatch(v, ty)),
        }
        Ok(IsNull::No)
    }

    fn accepts(_: &Type) -> bool {
        true
    }

    to_sql_checked!();
}

fn parse_uuid(s: &str) -> Result<[u8; 16], BoxError> {
    let hex: String = s.chars().filter(|c| *c != '-').collect();
    let bytes = hex::decode(&hex).map_err(|_| format!("`{s}` is not a UUID"))?;
    bytes
        .try_into()
        .map_err(|_| format!("`{s}` is not a UUID").into())
}

/// NUMERIC's binary form from decimal text (`-12.340`, `NaN`): base-10000 digit groups.
fn encode_numeric(s: &str, out: &mut BytesMut) -> Result<(), BoxError> {
    let t = s.trim();
    if t.eq_ignore_ascii_case("nan") {
        out.put_i16(0);
        out.put_i16(0);
        out.put_u16(0xC000);
        out.put_u16(0);
        return Ok(());
    }
    let bad = || -> BoxError { format!("`{s}` is not a decimal number").into() };
    let (neg, body) = match t.strip_prefix('-') {
        Some(r) => (true, r),
        None => (false, t.strip_prefix('+').unwrap_or(t)),
    };
    let (int, frac) = body.split_once('.').unwrap_or((body, ""));
    if (int.is_empty() && frac.is_empty())
        || !int.bytes().all(|b| b.is_ascii_digit())
        || !frac.bytes().all(|b| b.is_ascii_digit())
    {
        return Err(bad());
    }
    let dscale = u16::try_from(frac.len()).map_err(|_| bad())?;
    let int = int.trim_start_matches('0');
    // Integer part padded on the left, fraction on the right, to whole groups of 4.
    let int_pad = (4 - int.len() % 4) % 4;
    let frac_pad = (4 - frac.len() % 4) % 4;
    let digits: String = "0".repeat(int_pad) + int + frac + &"0".repeat(frac_pad);
    let mut groups: Vec<i16> = digits
        .as_bytes()
        .chunks(4)
        .map(|c| {
            std::str::from_utf8(c)
                .unwrap_or("0")
                .parse::<i16>()
                .unwrap_or(0)
        })
        .collect();
    let mut weight = ((int_pad + int.len()) / 4) as i32 - 1;
    while groups.first() == Some(&0) {
        groups.remove(0);
        weight -= 1;
    }
    while groups.last() == Some(&0) {
        groups.pop();
    }
    if groups.is_empty() {
        weight = 0;
    }
    out.put_i16(i16::try_from(groups.len()).map_err(|_| bad())?);
    out.put_i16(i16::try_from(weight).map_err(|_| bad())?);
    out.put_u16(if neg && !groups.is_empty() { 0x4000 } else { 0 });
    out.put_u16(dscale);
    for g in groups {
        out.put_i16(g);
    }
    Ok(())
}

/// NUMERIC's binary form as decimal text.
fn decode_numeric(b: &[u8]) -> Result<String, String> {
    let rd = |i: usize| -> Result<u16, String> {
        b.get(i..i + 2)
            .map(|x| u16::from_be_bytes([x[0], x[1]]))
            .ok_or_else(|| "truncated numeric".to_string())
    };
    let ndigits = rd(0)? as usize;
    let weight = rd(2)? as i16 as i32;
    let sign = rd(4)?;
    let dscale = rd(6)? as usize;
    if sign == 0xC000 {
        return Ok("NaN".into());
    }
    let digits: Vec<u16> = (0..ndigits)
        .map(|i| rd(8 + 2 * i))
        .collect::<Result<_, _>>()?;
    let group = |e: i32| -> u16 {
        let i = weight - e;
        if i >= 0 && (i as usize) < digits.len() {
            digits[i as usize]
        } else {
            0
        }
    };
    let mut int = String::new();
    if weight >= 0 {
        int.push_str(&group(weight).to_string());
        for e in (0..weight).rev() {
            int.push_str(&format!("{:04}", group(e)));
        }
    } else {
        int.push('0');
    }
    let mut frac = String::new();
    let mut e = -1;
    while frac.len() < dscale {
        frac.push_str(&format!("{:04}", group(e)));
        e -= 1;
    }
    frac.truncate(dscale);
    let mut s = String::new();
    if sign == 0x4000 {
        s.push('-');
    }
    s.push_str(&int);
    if dscale > 0 {
        s.push('.');
        s.push_str(&frac);
    }
    Ok(s)
}

/// A result column's raw bytes, decoded by [`decode`].
struct Raw<'a>(&'a [u8]);

impl<'a> FromSql<'a> for Raw<'a> {
    fn from_sql(_: &Type, raw: &'a [u8]) -> Result<Self, BoxError> {
        Ok(Raw(raw))
    }

    fn accepts(_: &Type) -> bool {
        true
    }
}

fn decode(ty: &Type, b: &[u8]) -> Result<Value, String> {
    let fixed = |n: usize| -> Result<&[u8], String> {
        (b.len() == n)
            .then_some(b)
            .ok_or_else(|| format!("{} value of {} bytes", ty.name(), b.len()))
    };
    let text = || String::from_utf8(b.to_vec()).map_err(|_| "invalid UTF-8".to_string());
    Ok(match *ty {
        Type::BOOL => Value::Boolean(fixed(1)?[0] != 0),
        Type::INT2 => Value::Int2(i16::from_be_bytes(fixed(2)?.try_into().unwrap_or_default())),
        Type::INT4 => Value::Int4(i32::from_be_bytes(fixed(4)?.try_into().unwrap_or_default())),
        Type::INT8 => Value::Int8(i64::from_be_bytes(fixed(8)?.try_into().unwrap_or_default())),
        Type::OID => Value::Int8(i64::from(u32::from_be_bytes(
            fixed(4)?.try_into().unwrap_or_default(),
        ))),
        Type::FLOAT4 => Value::Float4(f32::from_be_bytes(fixed(4)?.try_into().unwrap_or_default())),
        Type::FLOAT8 => Value::Float8(f64::from_be_bytes(fixed(8)?.try_into().unwrap_or_default())),
        Type::BYTEA => Value::Bytea(b.to_vec()),
        Type::JSON => Value::Jsonb(text()?),
        Type::JSONB => {
            if b.first() != Some(&1) {
                return Err("unknown jsonb version".into());
            }
            Value::Jsonb(String::from_utf8(b[1..].to_vec()).map_err(|_| "invalid UTF-8")?)
        }
        Type::NUMERIC => Value::Numeric(decode_numeric(b)?),
        Type::TIMESTAMPTZ | Type::TIMESTAMP => {
            let us = i64::from_be_bytes(fixed(8)?.try_into().unwrap_or_default());
            Value::Timestamptz(us.saturating_add(PG_EPOCH_US))
        }
        Type::UUID => {
            let h = hex::encode(fixed(16)?);
            Value::Uuid(format!(
                "{}-{}-{}-{}-{}",
                &h[0..8],
                &h[8..12],
                &h[12..16],
                &h[16..20],
                &h[20..32]
            ))
        }
        _ if is_text(ty) => Value::Text(text()?),
        _ => {
            return Err(format!(
                "type {} is not carried by nop:postgres (cast it in SQL, e.g. `::text`)",
                ty.name()
            ));
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transaction_control_and_session_statements_are_refused() {
        for sql in [
            "BEGIN",
            "  commit",
            "-- x\nROLLBACK",
            "/* c */ prepare transaction 'x'",
            "SET ROLE admin",
            "set statement_timeout = 0",
            "RESET ALL",
            "DISCARD ALL",
            "COPY t FROM STDIN",
            "do $$ begin commit; end $$",
            "CALL p()",
            "START TRANSACTION",
            "END",
            "SAVEPOINT a",
            "select set_config('role', 'x', false)",
            "",
            "   ",
        ] {
            assert!(refused_statement(sql).is_some(), "{sql:?}");
        }
        for sql in [
            "INSERT INTO t VALUES ($1)",
            "select 1",
            "WITH x AS (SELECT 1) SELECT * FROM x",
            "CREATE TABLE IF NOT EXISTS t (a int)",
            "(SELECT 1)",
            "UPDATE settings SET x = 1",
        ] {
            assert_eq!(refused_statement(sql), None, "{sql:?}");
        }
    }

    #[test]
    fn gids_are_scoped_quoted_and_bounded() {
        let a = PgAccess::new(Vec::new(), "job", "main", "sinks/out", "out", 3);
        assert!(a.sink_prefix.starts_with("nop_") && a.sink_prefix.len() == 21);
        assert_eq!(a.subtask_prefix, format!("{}3_", a.sink_prefix));
        assert!(check_gid(&format!("{}7", a.subtask_prefix), &a.subtask_prefix, "p").is_ok());
        assert!(check_gid(&format!("{}4_7", a.sink_prefix), &a.subtask_prefix, "p").is_err());
        assert!(check_gid(&format!("{}4_7", a.sink_prefix), &a.sink_prefix, "p").is_ok());
        assert!(check_gid(&format!("{}x'y", a.subtask_prefix), &a.subtask_prefix, "p").is_err());
        let long = format!("{}{}", a.subtask_prefix, "9".repeat(200));
        assert!(check_gid(&long, &a.subtask_prefix, "p").is_err());
        assert_eq!(quote("a'b"), "'a''b'");
        assert_ne!(
            sink_gid_prefix("job", "main", "sinks/out", "db"),
            sink_gid_prefix("job", "main", "sinks/out2", "db")
        );
        let grant = |url: &str| ConnectionGrant {
            name: "pg".into(),
            kind: "postgres".into(),
            url: url.into(),
            password_env: None,
            ca_file: None,
        };
        let on = |url: &str| PgAccess::new(vec![grant(url)], "j", "main", "o", "o", 0);
        assert_ne!(
            on("postgres://u@h/one").sink_prefix,
            on("postgres://u@h/two").sink_prefix,
            "GIDs are server-wide: another database, another prefix"
        );
        assert_eq!(
            on("postgres://u@h/u").sink_prefix,
            on("postgres://u@h").sink_prefix
        );
    }

    #[test]
    fn numerics_round_trip_through_the_binary_form() {
        for s in [
            "0",
            "1",
            "-1",
            "12345",
            "-12.340",
            "0.0001",
            "100000000",
            "3.14159265358979",
            "NaN",
            "0.50",
            "99999999.99999",
        ] {
            let mut b = BytesMut::new();
            encode_numeric(s, &mut b).unwrap();
            assert_eq!(decode_numeric(&b).unwrap(), s, "{s}");
        }
        assert!(encode_numeric("1e5", &mut BytesMut::new()).is_err());
        assert!(encode_numeric("abc", &mut BytesMut::new()).is_err());
        assert!(encode_numeric(".", &mut BytesMut::new()).is_err());
    }

    #[test]
    fn connection_grants_do_not_print_their_url() {
        let g = ConnectionGrant {
            name: "pg".into(),
            kind: "postgres".into(),
            url: "postgres://u@secret-host/db".into(),
            password_env: Some("PW".into()),
            ca_file: None,
        };
        let text = format!("{g:?}");
        assert!(
            text.contains("pg") && !text.contains("secret-host"),
            "{text}"
        );
    }
}
