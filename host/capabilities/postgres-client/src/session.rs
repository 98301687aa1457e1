//! The host calls of `nop:postgres/client`: the GID prefixes and the `session` resource.

use crate::bindings::nop::postgres::client::{
    self as wpg, Column, ErrorKind, PgError, Rows, Value,
};
use crate::values::{Param, Raw, decode};
use crate::{PgAccess, PgCtx, Session, check_gid, err, pg_error, quote, refused_statement};
use nop_stream_capability::CapabilityView;
use postgres::types::ToSql;
use std::str::FromStr;
use std::time::Duration;
use wasmtime::component::Resource;

/// The calls every session method shares.
trait Sessions {
    fn session(&mut self, s: &Resource<Session>) -> wasmtime::Result<&mut Session>;
    fn open_session(&mut self, connection: &str) -> Result<Session, PgError>;
    fn access(&self) -> Result<&PgAccess, PgError>;
    fn on_gid<T>(
        &mut self,
        s: &Resource<Session>,
        gid: &str,
        scope: GidScope,
        what: &str,
        run: impl FnOnce(&mut Session, &str) -> Result<T, PgError>,
    ) -> wasmtime::Result<Result<T, PgError>>;
}

impl Sessions for CapabilityView<'_, PgCtx> {
    fn session(&mut self, s: &Resource<Session>) -> wasmtime::Result<&mut Session> {
        Ok(self.table.get_mut(s)?)
    }

    fn open_session(&mut self, connection: &str) -> Result<Session, PgError> {
        let pg = &*self.ctx;
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
        if pg.open >= pg.limits.pg_sessions {
            return Err(err(
                ErrorKind::Refused,
                format!(
                    "connection `{connection}`: exceeded limit `pg_sessions` ({} open sessions per instance)",
                    pg.limits.pg_sessions
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
        config.connect_timeout(Duration::from_millis(
            pg.limits.pg_connect_timeout_ms.max(1),
        ));
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
                pg.limits.pg_statement_timeout_ms
            ))
            .map_err(|e| pg_error(connection, &e))?;
        Ok(Session {
            client,
            connection: connection.to_owned(),
        })
    }

    fn access(&self) -> Result<&PgAccess, PgError> {
        self.ctx.access.as_ref().ok_or_else(|| {
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
        *self.host_wait += started.elapsed();
        Ok(out)
    }
}

impl wpg::Host for CapabilityView<'_, PgCtx> {
    fn gid_prefix(&mut self) -> wasmtime::Result<String> {
        Ok(self
            .ctx
            .access
            .as_ref()
            .map(|a| a.subtask_prefix.clone())
            .unwrap_or_default())
    }

    fn sink_gid_prefix(&mut self) -> wasmtime::Result<String> {
        Ok(self
            .ctx
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

impl wpg::HostSession for CapabilityView<'_, PgCtx> {
    fn open(&mut self, connection: String) -> wasmtime::Result<Result<Resource<Session>, PgError>> {
        let started = std::time::Instant::now();
        let out = self.open_session(&connection);
        *self.host_wait += started.elapsed();
        match out {
            Ok(s) => {
                self.ctx.open += 1;
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
        *self.host_wait += started.elapsed();
        Ok(out)
    }

    fn query(
        &mut self,
        s: Resource<Session>,
        statement: String,
        params: Vec<Value>,
    ) -> wasmtime::Result<Result<Rows, PgError>> {
        let started = std::time::Instant::now();
        let max_bytes = self.ctx.limits.pg_result_bytes;
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
        *self.host_wait += started.elapsed();
        Ok(out)
    }

    fn begin(&mut self, s: Resource<Session>) -> wasmtime::Result<Result<(), PgError>> {
        let started = std::time::Instant::now();
        let out = simple(self.session(&s)?, "BEGIN");
        *self.host_wait += started.elapsed();
        Ok(out)
    }

    fn rollback(&mut self, s: Resource<Session>) -> wasmtime::Result<Result<(), PgError>> {
        let started = std::time::Instant::now();
        let out = simple(self.session(&s)?, "ROLLBACK");
        *self.host_wait += started.elapsed();
        Ok(out)
    }

    fn commit(&mut self, s: Resource<Session>) -> wasmtime::Result<Result<(), PgError>> {
        let started = std::time::Instant::now();
        let out = simple(self.session(&s)?, "COMMIT");
        *self.host_wait += started.elapsed();
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
        *self.host_wait += started.elapsed();
        Ok(out)
    }

    fn drop(&mut self, s: Resource<Session>) -> wasmtime::Result<()> {
        let session = self.table.delete(s)?;
        self.ctx.open = self.ctx.open.saturating_sub(1);
        drop(session);
        Ok(())
    }
}
