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

/// The connections the job file grants to `op`, in grant order; a relative `ca_file`
/// resolves against `job_dir`.
pub fn granted(op: &PlannedOperator, job_dir: &std::path::Path) -> Vec<ConnectionGrant> {
    op.connections
        .iter()
        .map(|(name, c)| ConnectionGrant {
            name: name.clone(),
            kind: c.kind.clone(),
            url: c.url.clone(),
            password_env: c.password_env.clone(),
            ca_file: c.ca_file.as_ref().map(|f| job_dir.join(f)),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use std::str::FromStr;

    /// What each driver reads as a password in `url` (`None`: none, or the URL does not
    /// parse, so nothing connects with it).
    fn driver_passwords(url: &str) -> Vec<(&'static str, String)> {
        let mut out = Vec::new();
        if let Ok(c) = postgres::Config::from_str(url)
            && let Some(p) = c.get_password()
        {
            out.push(("postgres", String::from_utf8_lossy(p).into_owned()));
        }
        use redis::IntoConnectionInfo;
        if let Ok(i) = url.into_connection_info()
            && let Some(p) = i.redis_settings().password()
        {
            out.push(("redis", p.to_owned()));
        }
        if let Ok(a) = async_nats::ServerAddr::from_str(url)
            && let Some(p) = a.password()
        {
            out.push(("nats", p.to_owned()));
        }
        if let (_, Some(user)) = crate::nats::split_url(url)
            && let Some((_, pw)) = user.split_once(':')
        {
            out.push(("nats user", pw.to_owned()));
        }
        out
    }

    /// URL-ish strings over the characters that decide where credentials are: `@`, `:`,
    /// `/`, `?`, `#`, `&`, `=`, `%`, with `password` spelled plainly or percent-encoded.
    fn url() -> impl Strategy<Value = (String, String)> {
        let scheme = prop_oneof![
            Just(("postgres", "postgres://")),
            Just(("postgres", "postgresql://")),
            Just(("redis", "redis://")),
            Just(("redis", "rediss://")),
            Just(("nats", "nats://")),
            Just(("nats", "tls://")),
        ];
        let piece = prop_oneof![
            "[a-z0-9]{1,4}",
            Just("@".to_owned()),
            Just(":".to_owned()),
            Just("/".to_owned()),
            Just("?".to_owned()),
            Just("#".to_owned()),
            Just("&".to_owned()),
            Just("=".to_owned()),
            Just("password".to_owned()),
            Just("pass%77ord".to_owned()),
            Just("%70ASSWORD".to_owned()),
            Just("%40".to_owned()),
            Just("%3A".to_owned()),
            Just("%2F".to_owned()),
            Just("[::1]".to_owned()),
        ];
        (scheme, proptest::collection::vec(piece, 1..12))
            .prop_map(|((kind, s), p)| (kind.to_owned(), format!("{s}{}", p.concat())))
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4096))]

        /// Every URL the job-file check accepts carries no password under any driver's own
        /// parser (`postgres::Config`, `redis`'s connection info, `async-nats`'s server
        /// address, the NATS user split), and redaction leaves it unchanged.
        #[test]
        fn an_accepted_url_gives_no_driver_a_password((kind, url) in url()) {
            if nop_stream_core::url::check_url(&kind, &url).is_ok() {
                prop_assert_eq!(driver_passwords(&url), vec![], "{}", url);
                prop_assert_eq!(nop_stream_core::redact_url(&url), url);
            }
        }

        /// Whatever a driver reads as a password, redaction removes: every driver reading
        /// the redacted URL finds no password but the placeholder.
        #[test]
        fn redaction_removes_every_password_a_driver_reads((_kind, url) in url()) {
            let redacted = nop_stream_core::redact_url(&url);
            for (driver, pw) in driver_passwords(&redacted) {
                prop_assert_eq!(
                    pw.as_str(),
                    nop_stream_core::url::REDACTED,
                    "{} reads a password from {} redacted as {}",
                    driver,
                    url,
                    redacted
                );
            }
        }
    }

    #[test]
    fn the_drivers_read_the_forms_the_check_refuses() {
        // The check refuses exactly these because the drivers authenticate with them.
        let pw = driver_passwords("postgres://nop@h:5432/db?pass%77ord=SECRET");
        assert_eq!(pw, [("postgres", "SECRET".to_owned())]);
        let pw = driver_passwords("postgres://user:pa/ss@h/db");
        assert!(pw.contains(&("postgres", "pa/ss".to_owned())), "{pw:?}");
    }
}
