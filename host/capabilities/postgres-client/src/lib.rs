//! The host side of `nop:postgres/client@0.1.1` (design §16.1): PostgreSQL sessions for
//! connector plugins, on the connections the job file grants to their node.
//!
//! - The plugin names a connection; the host holds its URL and reads the password from
//!   the environment variable the job file names, when the session opens. Neither ever
//!   crosses into the component, and no message the host builds repeats them.
//! - Only sink instances get a [`PgAccess`] ([`Postgres::context`]); every other instance
//!   is refused with an error naming the connection.
//! - `execute` / `query` refuse transaction-control and session statements
//!   ([`refused_statement`]); the typed calls send `BEGIN`, `ROLLBACK`, `COMMIT`,
//!   `PREPARE TRANSACTION`, `COMMIT PREPARED` and `ROLLBACK PREPARED` as plain statements
//!   (never a driver transaction object: drivers treat a transaction as open after
//!   PREPARE, and drop guards send ROLLBACK), with the GID quoted by the host.
//! - GIDs are scoped: `prepare` and `commit-prepared` take only this subtask's prefix
//!   `nop_<hash>_<subtask>_`; `rollback-prepared` and `list-prepared` the sink's prefix
//!   `nop_<hash>_`, so a subtask can clean up after subtasks that a downscale removed.
//! - Limits ([`PgLimits`]): `pg_sessions` per instance, `pg_statement_timeout_ms`
//!   (server-side `statement_timeout`), `pg_result_bytes` per query result,
//!   `pg_connect_timeout_ms`.
//!
//! The client is the blocking `postgres` crate without TLS (loopback and private networks).

mod session;
mod values;

/// Generated bindings of the one interface this crate implements.
mod bindings {
    #![allow(missing_docs, clippy::all)]
    wasmtime::component::bindgen!({
        interfaces: "import nop:postgres/client@0.1.1;",
        path: "../../../wit",
        imports: { default: trappable },
        with: {
            "nop:postgres/client.session": crate::Session,
        },
    });
}

use bindings::nop::postgres::client::{ErrorKind, PgError};
use nop_stream_api::PluginKind;
pub use nop_stream_capability::ConnectionGrant;
use nop_stream_capability::{Capability, CapabilityGrants, CapabilityStore, CapabilityView};
use sha2::{Digest, Sha256};
use std::error::Error as StdError;
use std::str::FromStr;
use wasmtime::component::{HasData, Linker};

/// The WIT interface this crate implements.
pub const INTERFACE: &str = "nop:postgres/client@0.1.1";

/// Longest GID PostgreSQL accepts is 199 bytes.
pub const MAX_GID_BYTES: usize = 199;

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

/// Limits of the capability, per instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PgLimits {
    /// Open sessions per instance. Default 4.
    pub pg_sessions: u32,
    /// The server-side `statement_timeout` of every session, in milliseconds. Default
    /// 30,000 ms.
    pub pg_statement_timeout_ms: u64,
    /// Maximum bytes of values in one `query` result. Default 16 MiB.
    pub pg_result_bytes: u64,
    /// How long opening a session may take, in milliseconds. Default 5,000 ms.
    pub pg_connect_timeout_ms: u64,
}

impl Default for PgLimits {
    fn default() -> Self {
        PgLimits {
            pg_sessions: 4,
            pg_statement_timeout_ms: 30_000,
            pg_result_bytes: 16 << 20,
            pg_connect_timeout_ms: 5_000,
        }
    }
}

/// Per-instance context of the capability.
#[derive(Debug, Default)]
pub struct PgCtx {
    /// `None`: the instance is not a sink, so it may open no connection.
    access: Option<PgAccess>,
    /// Sessions open now.
    open: u32,
    limits: PgLimits,
}

impl PgCtx {
    /// The context of an instance with `access` (`None`: it may open no session).
    pub fn new(access: Option<PgAccess>, limits: PgLimits) -> Self {
        PgCtx {
            access,
            open: 0,
            limits,
        }
    }
}

/// The capability as a plugin host registers it: sinks get their granted connections and
/// GID scope, every other instance nothing.
#[derive(Debug, Clone, Default)]
pub struct Postgres {
    /// Limits of every instance.
    pub limits: PgLimits,
}

impl<T: CapabilityStore> Capability<T> for Postgres {
    fn interface(&self) -> &'static str {
        INTERFACE
    }

    fn add_to_linker(&self, linker: &mut Linker<T>) -> wasmtime::Result<()> {
        add_to_linker(linker, view::<T>)
    }

    fn context(&self, grants: Option<&CapabilityGrants>) -> Box<dyn std::any::Any + Send> {
        let access = grants.filter(|g| g.kind == PluginKind::Sink).map(|g| {
            PgAccess::new(
                g.connections.clone(),
                &g.job,
                &g.pipeline,
                &g.operator_id,
                &g.operator,
                g.subtask.unwrap_or(0),
            )
        });
        Box::new(PgCtx::new(access, self.limits.clone()))
    }
}

fn view<T: CapabilityStore>(store: &mut T) -> CapabilityView<'_, PgCtx> {
    store.capability::<PgCtx>()
}

struct HasPostgres;

impl HasData for HasPostgres {
    type Data<'a> = CapabilityView<'a, PgCtx>;
}

/// Adds `nop:postgres/client` to `linker`; `getter` reaches an instance's [`PgCtx`].
///
/// # Errors
/// wasmtime's, when the interface is already defined in `linker`.
pub fn add_to_linker<T: Send + 'static>(
    linker: &mut Linker<T>,
    getter: fn(&mut T) -> CapabilityView<'_, PgCtx>,
) -> wasmtime::Result<()> {
    bindings::nop::postgres::client::add_to_linker::<T, HasPostgres>(linker, getter)
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
