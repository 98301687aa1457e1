//! The host side of `nop:redis/streams@0.1.0` (issue 13 §3, §4): typed Redis Streams
//! calls for connector plugins, on the connections the job file grants to their node.
//!
//! - The plugin names a connection; the host holds its URL and reads the password from the
//!   environment variable the job file names (`password_env`) when it connects. Neither
//!   ever crosses into the component, and every message the host builds is scrubbed of
//!   both ([`scrub`]).
//! - Only connections of kind `redis` granted to the node (`connections = [..]` on the
//!   source or sink) can be used; sources and sinks may use it, operators may not.
//! - One server connection per granted name and instance, opened at the first call and
//!   dropped after a connection error (the next call reconnects).
//! - Limits ([`crate::Limits`]): `redis_reply_bytes` per reply (entry ids, field names
//!   and values), `redis_connect_timeout_ms`, `redis_command_timeout_ms` (socket read and
//!   write timeouts of every command). Time blocked on the server is host wait: it does
//!   not count against `cpu_ms_per_call`.
//!
//! The client is the blocking `redis` crate. `rediss://` URLs use TLS (rustls on the
//! process's ring provider), verifying the server against the system's roots or, with the
//! connection's `ca_file`, against that file's certificates only.

use crate::bindings::redis::nop::redis::streams::{
    self as wr, AddOutcome, Entry, ErrorKind, HashField, RedisError, StreamInfo,
};
use crate::host::StoreData;
use redis::Value;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// A connection granted to a source or sink (only `redis` ones open here).
pub type RedisGrant = crate::connection::ConnectionGrant;

/// What a source or sink instance may reach through `nop:redis/streams`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RedisAccess {
    /// Connections granted to the node (of every kind; only `redis` ones open).
    pub grants: Vec<RedisGrant>,
    /// Operator name and kind (`source`, `sink`), for messages.
    pub operator: String,
    /// `source` or `sink`: the job-file table to name in messages.
    pub table: String,
}

/// Per-instance state of the capability (in [`StoreData`]).
#[derive(Default)]
pub(crate) struct RedisState {
    /// `None`: the instance is neither a source nor a sink; it may use no connection.
    pub(crate) access: Option<RedisAccess>,
    /// Open connections by granted name.
    pub(crate) open: BTreeMap<String, redis::Connection>,
    pub(crate) reply_bytes: u64,
    pub(crate) connect_timeout_ms: u64,
    pub(crate) command_timeout_ms: u64,
}

impl std::fmt::Debug for RedisState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisState")
            .field("access", &self.access)
            .field("open", &self.open.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

fn err(kind: ErrorKind, message: String) -> RedisError {
    RedisError { kind, message }
}

/// `text` with every occurrence of the secrets (the password, the URL and its
/// `host:port`) replaced by `<redacted>`. Driver messages are not known to carry any of
/// them; this is the backstop.
pub fn scrub(text: &str, secrets: &[&str]) -> String {
    let mut out = text.to_owned();
    for s in secrets {
        if s.len() >= 3 {
            out = out.replace(s, "<redacted>");
        }
    }
    out
}

/// The `host:port` part of a URL (for [`scrub`]).
fn authority(url: &str) -> &str {
    let rest = url.split_once("://").map_or(url, |x| x.1);
    let auth = rest.split(['/', '?']).next().unwrap_or("");
    auth.rsplit_once('@').map_or(auth, |x| x.1)
}

/// Checks an entry id `<ms>-<seq>` (both u64) and returns its parts.
///
/// # Errors
/// A message saying what is wrong with it.
pub fn parse_id(id: &str) -> Result<(u64, u64), String> {
    let bad = || format!("`{id}` is not a stream entry id (`<ms>-<seq>`, both unsigned 64-bit)");
    let (ms, seq) = id.split_once('-').ok_or_else(bad)?;
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(ms) || !digits(seq) {
        return Err(bad());
    }
    Ok((
        ms.parse().map_err(|_| bad())?,
        seq.parse().map_err(|_| bad())?,
    ))
}

/// A server connection and the name it was opened for.
struct Conn<'a> {
    con: &'a mut redis::Connection,
    name: String,
}

fn text(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        Value::VerbatimString { text, .. } => Some(text.clone()),
        Value::Int(i) => Some(i.to_string()),
        Value::Okay => Some("OK".into()),
        _ => None,
    }
}

fn int(v: &Value) -> Option<u64> {
    match v {
        Value::Int(i) => u64::try_from(*i).ok(),
        other => text(other)?.parse().ok(),
    }
}

/// Key-value pairs of a reply that is a flat array (RESP2) or a map (RESP3).
fn pairs(v: &Value) -> Vec<(&Value, &Value)> {
    match v {
        Value::Array(items) => items
            .chunks(2)
            .filter_map(|c| Some((&c[0], c.get(1)?)))
            .collect(),
        Value::Map(m) => m.iter().map(|(k, v)| (k, v)).collect(),
        _ => Vec::new(),
    }
}

impl StoreData {
    /// The open connection named `name`, connecting first if needed.
    fn redis_conn(&mut self, name: &str) -> Result<Conn<'_>, RedisError> {
        let rs = &mut self.redis;
        let Some(access) = &rs.access else {
            return Err(err(
                ErrorKind::Refused,
                format!("connection `{name}`: only sources and sinks may be granted connections"),
            ));
        };
        let Some(grant) = access.grants.iter().find(|g| g.name == name) else {
            let granted: Vec<String> = access
                .grants
                .iter()
                .map(|g| format!("`{}`", g.name))
                .collect();
            return Err(err(
                ErrorKind::Refused,
                format!(
                    "connection `{name}` is not granted to {} `{}`; add `connections = [\"{name}\"]` to its [[{}]] table (granted: {})",
                    access.table,
                    access.operator,
                    access.table,
                    if granted.is_empty() {
                        "none".into()
                    } else {
                        granted.join(", ")
                    }
                ),
            ));
        };
        if grant.kind != "redis" {
            return Err(err(
                ErrorKind::Refused,
                format!(
                    "connection `{name}` is of kind `{}`; nop:redis/streams needs a `redis` connection",
                    grant.kind
                ),
            ));
        }
        if !rs.open.contains_key(name) {
            let con = connect(grant, rs.connect_timeout_ms, rs.command_timeout_ms)?;
            rs.open.insert(name.to_owned(), con);
        }
        let con = rs.open.get_mut(name).ok_or_else(|| {
            err(
                ErrorKind::Connection,
                format!("connection `{name}` vanished"),
            )
        })?;
        Ok(Conn {
            con,
            name: name.to_owned(),
        })
    }

    /// Runs `f` on connection `name`: counts the time as host wait, scrubs messages, drops
    /// the connection after a connection error, and logs refusals and connection failures.
    fn with_redis<T>(
        &mut self,
        name: &str,
        f: impl FnOnce(&mut Conn<'_>, u64) -> Result<T, RedisError>,
    ) -> wasmtime::Result<Result<T, RedisError>> {
        let started = Instant::now();
        let reply_bytes = self.redis.reply_bytes;
        let out = self
            .redis_conn(name)
            .and_then(|mut c| f(&mut c, reply_bytes));
        self.host_wait += started.elapsed();
        let out = out.map_err(|mut e| {
            if let Some(g) = self
                .redis
                .access
                .as_ref()
                .and_then(|a| a.grants.iter().find(|g| g.name == name))
            {
                let pw = g.password().ok().flatten().unwrap_or_default();
                e.message = scrub(&e.message, &[&pw, &g.url, authority(&g.url)]);
            }
            e
        });
        if let Err(e) = &out {
            if e.kind == ErrorKind::Connection {
                self.redis.open.remove(name);
            }
            if matches!(e.kind, ErrorKind::Connection | ErrorKind::Refused) {
                tracing::warn!(plugin = %self.label, "{}", e.message);
            }
        }
        Ok(out)
    }
}

/// Opens a connection for `grant`: URL parsed by the driver, password from the
/// environment, timeouts set.
fn connect(
    grant: &RedisGrant,
    connect_timeout_ms: u64,
    command_timeout_ms: u64,
) -> Result<redis::Connection, RedisError> {
    use redis::IntoConnectionInfo;
    let name = &grant.name;
    let ca = grant.ca_pem().map_err(|m| err(ErrorKind::Refused, m))?;
    let mut info = grant.url.as_str().into_connection_info().map_err(|_| {
        err(
            ErrorKind::Refused,
            format!("connection `{name}`: the URL in the job file does not parse"),
        )
    })?;
    // The job file refuses a URL with a password; the driver's own reading of it is
    // checked too, so no credential ever comes from a URL.
    if info.redis_settings().password().is_some() {
        return Err(err(
            ErrorKind::Refused,
            format!(
                "connection `{name}`: the URL holds a password; name an environment variable \
                 in `password_env` instead"
            ),
        ));
    }
    let mut settings = info.redis_settings().clone().set_skip_set_lib_name();
    if let Some(pw) = grant.password().map_err(|m| err(ErrorKind::Refused, m))? {
        settings = settings.set_password(pw);
    }
    info = info.set_redis_settings(settings);
    // `rediss://`: rustls with the system's roots, or only the connection's `ca_file`.
    let client = match ca {
        Some(root_cert) => redis::Client::build_with_tls(
            info,
            redis::TlsCertificates {
                client_tls: None,
                root_cert: Some(root_cert),
            },
        ),
        None => redis::Client::open(info),
    }
    .map_err(|e| {
        err(
            ErrorKind::Refused,
            format!("connection `{name}`: {}", describe(&e)),
        )
    })?;
    let con = client
        .get_connection_with_timeout(Duration::from_millis(connect_timeout_ms.max(1)))
        .map_err(|e| {
            err(
                ErrorKind::Connection,
                format!("connection `{name}`: cannot connect: {}", describe(&e)),
            )
        })?;
    let timeout = Some(Duration::from_millis(command_timeout_ms.max(1)));
    con.set_read_timeout(timeout)
        .and_then(|()| con.set_write_timeout(timeout))
        .map_err(|e| {
            err(
                ErrorKind::Connection,
                format!("connection `{name}`: {}", describe(&e)),
            )
        })?;
    Ok(con)
}

/// A driver error as text (the caller adds the connection and scrubs).
fn describe(e: &redis::RedisError) -> String {
    if e.is_timeout() {
        return format!("timed out ({e})");
    }
    e.to_string()
}

/// A driver error of a command on `c` as a [`RedisError`]; `what` names the command and key.
fn cmd_error(c: &Conn<'_>, what: &str, e: &redis::RedisError) -> RedisError {
    let kind = if e.is_io_error()
        || e.is_timeout()
        || e.is_connection_dropped()
        || e.code().is_some_and(|c| c == "NOAUTH" || c == "WRONGPASS")
    {
        ErrorKind::Connection
    } else {
        ErrorKind::Server
    };
    err(
        kind,
        format!("connection `{}`: {what}: {}", c.name, describe(e)),
    )
}

fn check_id(c: &Conn<'_>, key: &str, id: &str) -> Result<(), RedisError> {
    parse_id(id).map(|_| ()).map_err(|m| {
        err(
            ErrorKind::Refused,
            format!("connection `{}`: stream `{key}`: {m}", c.name),
        )
    })
}

/// Entries of an XRANGE reply on connection `name`; `budget` is the reply-bytes limit
/// (`redis_reply_bytes`): ids, field names and values summed.
fn entries(name: &str, key: &str, v: Value, budget: u64) -> Result<Vec<Entry>, RedisError> {
    let bad = || {
        err(
            ErrorKind::Server,
            format!(
                "connection `{}`: stream `{key}`: unexpected reply shape",
                name
            ),
        )
    };
    let Value::Array(items) = v else {
        return if v == Value::Nil {
            Ok(Vec::new())
        } else {
            Err(bad())
        };
    };
    let mut bytes = 0u64;
    let mut out = Vec::with_capacity(items.len());
    for item in items {
        let Value::Array(mut parts) = item else {
            return Err(bad());
        };
        if parts.len() != 2 {
            return Err(bad());
        }
        let fv = parts.pop().ok_or_else(bad)?;
        let id = text(&parts[0]).ok_or_else(bad)?;
        bytes += id.len() as u64;
        let mut fields = Vec::new();
        match fv {
            Value::Array(fv) => {
                let mut it = fv.into_iter();
                while let (Some(f), Some(v)) = (it.next(), it.next()) {
                    let f = text(&f).ok_or_else(bad)?;
                    let v = match v {
                        Value::BulkString(b) => b,
                        other => text(&other).ok_or_else(bad)?.into_bytes(),
                    };
                    bytes += (f.len() + v.len()) as u64;
                    fields.push((f, v));
                }
            }
            Value::Map(m) => {
                for (f, v) in m {
                    let f = text(&f).ok_or_else(bad)?;
                    let v = match v {
                        Value::BulkString(b) => b,
                        other => text(&other).ok_or_else(bad)?.into_bytes(),
                    };
                    bytes += (f.len() + v.len()) as u64;
                    fields.push((f, v));
                }
            }
            Value::Nil => {}
            _ => return Err(bad()),
        }
        if bytes > budget {
            return Err(err(
                ErrorKind::Limit,
                format!(
                    "connection `{}`: stream `{key}`: exceeded limit `redis_reply_bytes` ({budget} bytes per reply); read fewer entries per call",
                    name
                ),
            ));
        }
        out.push(Entry { id, fields });
    }
    Ok(out)
}

fn stream_info(c: &mut Conn<'_>, key: &str) -> Result<Option<StreamInfo>, RedisError> {
    let v: Value = match redis::cmd("XINFO")
        .arg("STREAM")
        .arg(key)
        .query(&mut *c.con)
    {
        Ok(v) => v,
        Err(e) if e.detail().is_some_and(|d| d.contains("no such key")) => return Ok(None),
        Err(e) if e.to_string().contains("no such key") => return Ok(None),
        Err(e) => return Err(cmd_error(c, &format!("XINFO STREAM `{key}`"), &e)),
    };
    let mut info = StreamInfo {
        length: 0,
        first_id: String::new(),
        last_id: String::new(),
        last_generated_id: "0-0".into(),
        max_deleted_id: "0-0".into(),
        entries_added: 0,
    };
    let entry_id = |v: &Value| match v {
        Value::Array(parts) => parts.first().and_then(text).unwrap_or_default(),
        _ => String::new(),
    };
    for (k, v) in pairs(&v) {
        match text(k).as_deref() {
            Some("length") => info.length = int(v).unwrap_or(0),
            Some("last-generated-id") => info.last_generated_id = text(v).unwrap_or_default(),
            Some("max-deleted-entry-id") => info.max_deleted_id = text(v).unwrap_or_default(),
            Some("entries-added") => info.entries_added = int(v).unwrap_or(0),
            Some("first-entry") => info.first_id = entry_id(v),
            Some("last-entry") => info.last_id = entry_id(v),
            _ => {}
        }
    }
    Ok(Some(info))
}

impl wr::Host for StoreData {
    fn info(
        &mut self,
        connection: String,
        key: String,
    ) -> wasmtime::Result<Result<Option<StreamInfo>, RedisError>> {
        self.with_redis(&connection, |c, _| stream_info(c, &key))
    }

    fn range(
        &mut self,
        connection: String,
        key: String,
        after: String,
        until: String,
        count: u32,
    ) -> wasmtime::Result<Result<Vec<Entry>, RedisError>> {
        self.with_redis(&connection, |c, budget| {
            let start = if after.is_empty() {
                "-".to_owned()
            } else {
                check_id(c, &key, &after)?;
                format!("({after}")
            };
            let end = if until.is_empty() {
                "+".to_owned()
            } else {
                check_id(c, &key, &until)?;
                until.clone()
            };
            if count == 0 {
                return Ok(Vec::new());
            }
            let v: Value = redis::cmd("XRANGE")
                .arg(&key)
                .arg(&start)
                .arg(&end)
                .arg("COUNT")
                .arg(count)
                .query(&mut *c.con)
                .map_err(|e| cmd_error(c, &format!("XRANGE `{key}`"), &e))?;
            entries(&c.name, &key, v, budget)
        })
    }

    fn get(
        &mut self,
        connection: String,
        key: String,
        id: String,
    ) -> wasmtime::Result<Result<Option<Entry>, RedisError>> {
        self.with_redis(&connection, |c, budget| {
            check_id(c, &key, &id)?;
            let v: Value = redis::cmd("XRANGE")
                .arg(&key)
                .arg(&id)
                .arg(&id)
                .query(&mut *c.con)
                .map_err(|e| cmd_error(c, &format!("XRANGE `{key}`"), &e))?;
            Ok(entries(&c.name, &key, v, budget)?.into_iter().next())
        })
    }

    fn add_batch(
        &mut self,
        connection: String,
        key: String,
        batch: Vec<Entry>,
        marker: Option<HashField>,
    ) -> wasmtime::Result<Result<Vec<AddOutcome>, RedisError>> {
        self.with_redis(&connection, |c, _| {
            if batch.is_empty() && marker.is_none() {
                return Ok(Vec::new());
            }
            let mut p = redis::pipe();
            p.atomic().ignore_errors();
            for e in &batch {
                check_id(c, &key, &e.id)?;
                if e.fields.is_empty() {
                    return Err(err(
                        ErrorKind::Refused,
                        format!(
                            "connection `{}`: stream `{key}`: entry {} has no field (XADD needs one)",
                            c.name, e.id
                        ),
                    ));
                }
                let cmd = p.cmd("XADD").arg(&key).arg(&e.id);
                for (f, v) in &e.fields {
                    cmd.arg(f).arg(v.as_slice());
                }
            }
            if let Some(m) = &marker {
                p.cmd("HSET").arg(&m.key).arg(&m.field).arg(&m.value);
            }
            let replies: Vec<Value> = p
                .query(&mut *c.con)
                .map_err(|e| cmd_error(c, &format!("MULTI/XADD/EXEC on `{key}`"), &e))?;
            let mut out = Vec::with_capacity(batch.len());
            for (i, r) in replies.iter().enumerate() {
                match r {
                    Value::ServerError(se) if i < batch.len() => {
                        let detail = se.details().unwrap_or("");
                        if detail.contains("equal or smaller than the target stream top item") {
                            out.push(AddOutcome::NotAboveTop);
                        } else {
                            return Err(err(
                                ErrorKind::Server,
                                format!(
                                    "connection `{}`: XADD `{key}` {}: {} {detail}",
                                    c.name,
                                    batch[i].id,
                                    se.code()
                                ),
                            ));
                        }
                    }
                    Value::ServerError(se) => {
                        return Err(err(
                            ErrorKind::Server,
                            format!(
                                "connection `{}`: HSET of the batch marker: {} {}",
                                c.name,
                                se.code(),
                                se.details().unwrap_or("")
                            ),
                        ));
                    }
                    _ if i < batch.len() => out.push(AddOutcome::Added),
                    _ => {}
                }
            }
            if out.len() != batch.len() {
                return Err(err(
                    ErrorKind::Server,
                    format!(
                        "connection `{}`: MULTI/EXEC on `{key}`: {} replies for {} entries",
                        c.name,
                        out.len(),
                        batch.len()
                    ),
                ));
            }
            Ok(out)
        })
    }

    fn delete(
        &mut self,
        connection: String,
        key: String,
        ids: Vec<String>,
    ) -> wasmtime::Result<Result<u64, RedisError>> {
        self.with_redis(&connection, |c, _| {
            if ids.is_empty() {
                return Ok(0);
            }
            for id in &ids {
                check_id(c, &key, id)?;
            }
            redis::cmd("XDEL")
                .arg(&key)
                .arg(&ids)
                .query::<u64>(&mut *c.con)
                .map_err(|e| cmd_error(c, &format!("XDEL `{key}`"), &e))
        })
    }

    fn set_last_id(
        &mut self,
        connection: String,
        key: String,
        last_id: String,
        max_deleted_id: Option<String>,
        entries_added: Option<u64>,
    ) -> wasmtime::Result<Result<(), RedisError>> {
        self.with_redis(&connection, |c, _| {
            check_id(c, &key, &last_id)?;
            let mut cmd = redis::cmd("XSETID");
            cmd.arg(&key).arg(&last_id);
            if let Some(n) = entries_added {
                cmd.arg("ENTRIESADDED").arg(n);
            }
            if let Some(m) = max_deleted_id.as_ref().filter(|m| m.as_str() != "0-0") {
                check_id(c, &key, m)?;
                cmd.arg("MAXDELETEDID").arg(m);
            }
            cmd.query::<()>(&mut *c.con)
                .map_err(|e| cmd_error(c, &format!("XSETID `{key}` {last_id}"), &e))
        })
    }

    fn hash_get(
        &mut self,
        connection: String,
        key: String,
        field: String,
    ) -> wasmtime::Result<Result<Option<String>, RedisError>> {
        self.with_redis(&connection, |c, _| {
            redis::cmd("HGET")
                .arg(&key)
                .arg(&field)
                .query::<Option<String>>(&mut *c.con)
                .map_err(|e| cmd_error(c, &format!("HGET `{key}` `{field}`"), &e))
        })
    }

    fn hash_set(
        &mut self,
        connection: String,
        key: String,
        field: String,
        value: String,
    ) -> wasmtime::Result<Result<(), RedisError>> {
        self.with_redis(&connection, |c, _| {
            redis::cmd("HSET")
                .arg(&key)
                .arg(&field)
                .arg(&value)
                .query::<()>(&mut *c.con)
                .map_err(|e| cmd_error(c, &format!("HSET `{key}` `{field}`"), &e))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_ids_parse_strictly() {
        assert_eq!(parse_id("5-3"), Ok((5, 3)));
        assert_eq!(parse_id("0-0"), Ok((0, 0)));
        assert_eq!(
            parse_id("18446744073709551615-18446744073709551615"),
            Ok((u64::MAX, u64::MAX))
        );
        for bad in [
            "",
            "5",
            "5-",
            "-3",
            "a-1",
            "1-b",
            "1-2-3",
            "+5-1",
            "18446744073709551616-0",
            "(5-1",
        ] {
            assert!(parse_id(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn replies_over_redis_reply_bytes_fail_with_limit() {
        let bulk = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        let entry = |id: &str, v: &str| {
            Value::Array(vec![bulk(id), Value::Array(vec![bulk("line"), bulk(v)])])
        };
        let reply = Value::Array(vec![entry("1-1", "abc"), entry("1-2", "defgh")]);
        // 3 + 4 + 3 and 3 + 4 + 5 bytes: 22 in all.
        let got = entries("r", "k", reply.clone(), 22).unwrap();
        assert_eq!(got.len(), 2);
        assert_eq!(
            (got[1].id.as_str(), got[1].fields[0].1.as_slice()),
            ("1-2", &b"defgh"[..])
        );
        let e = entries("r", "k", reply, 21).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Limit);
        assert!(
            e.message.contains("connection `r`: stream `k`: exceeded limit `redis_reply_bytes` (21 bytes per reply)"),
            "{}",
            e.message
        );
        assert!(entries("r", "k", Value::Nil, 1).unwrap().is_empty());
        assert_eq!(
            entries("r", "k", bulk("x"), 1).unwrap_err().kind,
            ErrorKind::Server
        );
    }

    #[test]
    fn scrub_removes_secrets_and_grants_do_not_print_their_url() {
        let url = "redis://u@secret-host:6390/2";
        assert_eq!(authority(url), "secret-host:6390");
        assert_eq!(
            scrub(
                "failed at secret-host:6390 with s3cr3t",
                &["s3cr3t", url, authority(url)]
            ),
            "failed at <redacted> with <redacted>"
        );
        let g = RedisGrant {
            name: "r".into(),
            kind: "redis".into(),
            url: url.into(),
            password_env: Some("PW".into()),
            ca_file: None,
        };
        let text = format!("{g:?}");
        assert!(
            text.contains("\"r\"") && !text.contains("secret-host"),
            "{text}"
        );
    }
}
