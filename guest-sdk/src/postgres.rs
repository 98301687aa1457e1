//! PostgreSQL through the host: the `nop:postgres/client@0.1.1` capability (cargo feature
//! `postgres`), for sinks whose component is built for the `postgres-sink` world.
//!
//! The plugin never sees an address or a password. It opens a [`Session`] on a
//! *connection name* the job file declares (`[connections.<name>]`, `kind = "postgres"`)
//! and grants to the sink (`connections = ["<name>"]`); any other name fails with
//! [`ErrorKind::Refused`]. Statements take `$1..$n` parameters as [`Value`]s.
//! Transaction control goes through the typed calls ([`Session::begin`],
//! [`Session::commit`], [`Session::rollback`], [`Session::prepare`],
//! [`Session::commit_prepared`], [`Session::rollback_prepared`],
//! [`Session::list_prepared`]); `execute` and `query` refuse `BEGIN`, `COMMIT`, `SET`,
//! `COPY`, ... with [`ErrorKind::Refused`].
//!
//! Host limits per plugin instance (defaults): 4 open sessions, `statement_timeout`
//! 30,000 ms, 16 MiB of values per `query` result, 5,000 ms to connect.
//!
//! ```no_run
//! use nop_stream_sdk::postgres::{Session, Value};
//!
//! # fn run() -> Result<(), nop_stream_sdk::postgres::PgError> {
//! let s = Session::open("pg")?;
//! s.begin()?;
//! s.execute(
//!     "INSERT INTO totals (carrier, n) VALUES ($1, $2) ON CONFLICT (carrier) DO UPDATE SET n = EXCLUDED.n",
//!     &[Value::from("AA"), Value::from(42_i64)],
//! )?;
//! s.commit()?;
//! let rows = s.query("SELECT n FROM totals WHERE carrier = $1", &[Value::from("AA")])?;
//! assert_eq!(rows.rows[0][0].as_i64(), Some(42));
//! # Ok(()) }
//! ```
//!
//! Natively (unit tests) the types exist and convert, but calling the host panics: keep
//! database calls behind a trait of your own and test the logic against a model.

use crate::PluginError;

pub use crate::wit::postgres::nop::postgres::client::{
    Column, ErrorKind, PgError, Rows, Session, Value, gid_prefix, sink_gid_prefix,
};

impl PgError {
    /// `<message> [sqlstate <code>]`, `-` when there is none. (The generated `Display`
    /// prints the `Debug` form.)
    pub fn summary(&self) -> String {
        format!(
            "{} [sqlstate {}]",
            self.message,
            self.sqlstate.as_deref().unwrap_or("-")
        )
    }

    /// Whether the server answered with this SQLSTATE (e.g. `"42704"`).
    pub fn is_sqlstate(&self, code: &str) -> bool {
        self.sqlstate.as_deref() == Some(code)
    }

    /// This error as a [`PluginError`] prefixed with `what` (e.g. `"writing into t"`):
    /// [`ErrorKind::Connection`] becomes an I/O error (the outcome of a statement in flight
    /// is unknown), [`ErrorKind::Refused`] an invalid config (the plugin asked for
    /// something it was not granted), anything else a transaction error. The message keeps
    /// the SQLSTATE.
    pub fn into_plugin_error(self, what: &str) -> PluginError {
        let msg = format!("{what}: {}", self.summary());
        match self.kind {
            ErrorKind::Connection => PluginError::io(msg),
            ErrorKind::Refused => PluginError::invalid_config(msg),
            _ => PluginError::transaction(msg),
        }
    }
}

impl PartialEq for Value {
    /// Same variant and same payload; floats compare by bits, so `NaN == NaN` (the same
    /// NaN) and `0.0 != -0.0`: equality of what crosses the boundary, not SQL equality.
    fn eq(&self, other: &Self) -> bool {
        use Value as V;
        match (self, other) {
            (V::Null, V::Null) => true,
            (V::Boolean(a), V::Boolean(b)) => a == b,
            (V::Int2(a), V::Int2(b)) => a == b,
            (V::Int4(a), V::Int4(b)) => a == b,
            (V::Int8(a), V::Int8(b)) => a == b,
            (V::Float4(a), V::Float4(b)) => a.to_bits() == b.to_bits(),
            (V::Float8(a), V::Float8(b)) => a.to_bits() == b.to_bits(),
            (V::Text(a), V::Text(b))
            | (V::Jsonb(a), V::Jsonb(b))
            | (V::Numeric(a), V::Numeric(b))
            | (V::Uuid(a), V::Uuid(b)) => a == b,
            (V::Bytea(a), V::Bytea(b)) => a == b,
            (V::Timestamptz(a), V::Timestamptz(b)) => a == b,
            _ => false,
        }
    }
}

impl Value {
    /// The integer of an `int2`, `int4` or `int8` value.
    pub fn as_i64(&self) -> Option<i64> {
        match self {
            Value::Int2(n) => Some(i64::from(*n)),
            Value::Int4(n) => Some(i64::from(*n)),
            Value::Int8(n) => Some(*n),
            _ => None,
        }
    }

    /// The number of a `float4` or `float8` value.
    pub fn as_f64(&self) -> Option<f64> {
        match self {
            Value::Float4(x) => Some(f64::from(*x)),
            Value::Float8(x) => Some(*x),
            _ => None,
        }
    }

    /// The text of a `text`, `jsonb`, `numeric` or `uuid` value.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Text(s) | Value::Jsonb(s) | Value::Numeric(s) | Value::Uuid(s) => Some(s),
            _ => None,
        }
    }

    /// Whether this is SQL NULL.
    pub fn is_null(&self) -> bool {
        matches!(self, Value::Null)
    }
}

macro_rules! value_from {
    ($($t:ty => $v:ident),* $(,)?) => {$(
        impl From<$t> for Value {
            fn from(x: $t) -> Value {
                Value::$v(x.into())
            }
        }
    )*};
}

value_from!(
    bool => Boolean,
    i16 => Int2,
    i32 => Int4,
    i64 => Int8,
    f32 => Float4,
    f64 => Float8,
    String => Text,
    &str => Text,
    Vec<u8> => Bytea,
);

impl<T: Into<Value>> From<Option<T>> for Value {
    /// `None` is SQL NULL.
    fn from(x: Option<T>) -> Value {
        x.map_or(Value::Null, Into::into)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_convert_and_compare() {
        assert_eq!(Value::from(7_i16), Value::Int2(7));
        assert_eq!(Value::from(Some("a")), Value::Text("a".into()));
        assert_eq!(Value::from(None::<i64>), Value::Null);
        assert_eq!(Value::Float8(f64::NAN), Value::Float8(f64::NAN));
        assert_ne!(Value::Float8(0.0), Value::Float8(-0.0));
        assert_ne!(Value::Text("1".into()), Value::Numeric("1".into()));
        assert_eq!(Value::Int4(-3).as_i64(), Some(-3));
        assert_eq!(Value::Uuid("u".into()).as_str(), Some("u"));
        assert!(Value::Null.is_null());
    }

    #[test]
    fn errors_keep_their_sqlstate_and_kind() {
        let e = PgError {
            kind: ErrorKind::Server,
            sqlstate: Some("42704".into()),
            message: "no such prepared transaction".into(),
        };
        assert!(e.is_sqlstate("42704"));
        assert_eq!(e.summary(), "no such prepared transaction [sqlstate 42704]");
        let p = e.into_plugin_error("COMMIT PREPARED g");
        assert!(p.to_string().contains("COMMIT PREPARED g: no such"), "{p}");
    }
}
