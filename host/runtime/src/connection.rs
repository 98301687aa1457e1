//! What the host needs to open a connection the job file grants to a node (issue 13):
//! one type for every connector capability (`nop:postgres/client`, `nop:redis/streams`,
//! `nop:nats/jetstream`); each opens only the grants of its own kind.

use nop_stream_core::PlannedOperator;

/// A connection granted to an instance: its job-file name and what the host needs to open
/// it. `Debug` leaves the URL out.
#[derive(Clone, PartialEq, Eq)]
pub struct ConnectionGrant {
    /// Name in the job file (`[connections.<name>]`).
    pub name: String,
    /// The connection's `kind` (`postgres`, `redis`, `nats`).
    pub kind: String,
    /// Where to connect (the job file refuses a URL with a password).
    pub url: String,
    /// Environment variable holding the password (or a NATS token), read when the host
    /// connects.
    pub password_env: Option<String>,
}

impl std::fmt::Debug for ConnectionGrant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnectionGrant")
            .field("name", &self.name)
            .field("kind", &self.kind)
            .finish_non_exhaustive()
    }
}

impl ConnectionGrant {
    /// The password (or NATS token) from the environment variable named by
    /// `password_env`, read now; `None` without one.
    ///
    /// # Errors
    /// A message naming the connection and the variable (never a value) when the variable
    /// is not set or not UTF-8 on this host.
    pub fn password(&self) -> Result<Option<String>, String> {
        let Some(var) = &self.password_env else {
            return Ok(None);
        };
        std::env::var(var).map(Some).map_err(|_| {
            format!(
                "connection `{}`: environment variable `{var}` (password_env) is not set on this host",
                self.name
            )
        })
    }
}

/// The connections the job file grants to `op`, in grant order.
pub fn granted(op: &PlannedOperator) -> Vec<ConnectionGrant> {
    op.connections
        .iter()
        .map(|(name, c)| ConnectionGrant {
            name: name.clone(),
            kind: c.kind.clone(),
            url: c.url.clone(),
            password_env: c.password_env.clone(),
        })
        .collect()
}
