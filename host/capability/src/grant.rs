//! What the host needs to open a connection the job file grants to a node (design §16,
//! "No ambient authority"): one type for every capability; each opens only the grants of
//! its own kind.

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
    /// PEM file of the certificate authorities to trust for a TLS URL (resolved against
    /// the job file's directory); none: the system's roots.
    pub ca_file: Option<std::path::PathBuf>,
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

    /// The CA file's certificates (PEM bytes), read now; `None` without a `ca_file`.
    ///
    /// # Errors
    /// A message naming the connection and the file when it cannot be read or holds no
    /// PEM certificate.
    pub fn ca_pem(&self) -> Result<Option<Vec<u8>>, String> {
        let Some(path) = &self.ca_file else {
            return Ok(None);
        };
        let bytes = std::fs::read(path).map_err(|e| {
            format!(
                "connection `{}`: cannot read ca_file {}: {e}",
                self.name,
                path.display()
            )
        })?;
        if !String::from_utf8_lossy(&bytes).contains("-----BEGIN CERTIFICATE-----") {
            return Err(format!(
                "connection `{}`: ca_file {} holds no PEM certificate",
                self.name,
                path.display()
            ));
        }
        Ok(Some(bytes))
    }
}
