//! Connection URLs: the check that keeps credentials out of a job file, and the
//! redaction that keeps them out of every plan, error and log (design §14, "no credential
//! ever in a log, error, plan or manifest").
//!
//! The check reads a URL the way the drivers do, and refuses any shape on which two of
//! them could disagree about where the credentials are:
//! - `tokio-postgres` 0.7 (`Config::from_str`) takes the user-info up to the *first* `@`
//!   anywhere after the scheme (even past a `/` or `?`), splits it at its first `:` into
//!   user and password, and percent-decodes every parameter *name* before matching it
//!   (`pass%77ord=x` sets the password);
//! - the `url` crate (under `redis` and `async-nats`) ends the authority at the first `/`,
//!   `?` or `#` and takes the user-info up to the *last* `@` before it.
//!
//! So a URL is accepted only with at most one raw `@`, a user-info free of `:`, `/`, `?`
//! and `#` (where both readings agree, and hold no password), and no parameter whose
//! percent-decoded name is a credential ([`is_credential_name`]). Each host capability also
//! checks its driver's parse of the URL it opens (`host/capabilities/*`), and
//! `host/task/tests/url_credentials.rs` holds every URL this module accepts against the
//! drivers' own parsers.

/// Whether a (percent-decoded) URL parameter name names a credential: it contains
/// `pass`, `pwd`, `secret`, `token` or `credential`, or is `auth`, in any case. This
/// covers the drivers' own (`password` for PostgreSQL, `pass` for a Redis socket URL) and
/// common spellings, so a password never rides in a URL under another name.
pub fn is_credential_name(name: &str) -> bool {
    let n = name.to_ascii_lowercase();
    n == "auth"
        || ["pass", "pwd", "secret", "token", "credential"]
            .iter()
            .any(|w| n.contains(w))
}

/// Percent-decodes `s` as the drivers do (`%XX` with two hex digits becomes that byte; any
/// other `%` stays), then reads the bytes as UTF-8, replacing invalid sequences.
pub fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        if b[i] == b'%'
            && let (Some(h), Some(l)) = (
                b.get(i + 1).copied().and_then(hex),
                b.get(i + 2).copied().and_then(hex),
            )
        {
            out.push((h * 16 + l) as u8);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The parts of `scheme://[user-info@]rest` as this module reads them: the scheme (with
/// `://`), the user-info before the *last* `@` (the widest reading of any driver's) and
/// what follows it.
fn split(url: &str) -> Option<(&str, Option<&str>, &str)> {
    let at = url.find("://")?;
    let (scheme, rest) = url.split_at(at + 3);
    Some(match rest.rsplit_once('@') {
        Some((user, tail)) => (scheme, Some(user), tail),
        None => (scheme, None, rest),
    })
}

/// The query of `tail` (what follows the user-info): the text after its first `?`.
fn query(tail: &str) -> Option<&str> {
    tail.split_once('?').map(|(_, q)| q)
}

/// Checks a connection URL of `kind` (one of [`crate::model::CONNECTION_KINDS`]) for
/// the scheme of its kind and refuses one that carries a password or could carry one
/// under some driver's reading (see the module docs).
///
/// # Errors
/// A message saying what to change; it never repeats the URL or any part of it, so a
/// misplaced password is not echoed.
pub fn check_url(kind: &str, url: &str) -> Result<(), String> {
    let (schemes, shape): (&[&str], &str) = match kind {
        "postgres" => (
            &["postgres://", "postgresql://"],
            "`postgres://user@host:port/database` (key-value connection strings are not accepted)",
        ),
        "nats" => (&["nats://", "tls://"], "`nats://[user@]host:port`"),
        "redis" => (
            &["redis://", "rediss://"],
            "`redis://[user@]host:port[/db]`",
        ),
        // A kind without rules here is a new capability whose URL rules were not added
        // (docs/capabilities.md §3): refused, never passed unchecked.
        _ => {
            return Err(format!(
                "connection kind `{kind}` has no URL rules in this host (host/core/src/url.rs)"
            ));
        }
    };
    if !schemes.iter().any(|s| url.starts_with(s)) {
        return Err(format!("expected a URL {shape}"));
    }
    let Some((_, user, tail)) = split(url) else {
        return Err(format!("expected a URL {shape}"));
    };
    const MOVE: &str = "remove it and name an environment variable in `password_env`";
    if let Some(user) = user {
        if user.contains('@') {
            return Err(
                "the URL holds more than one `@`: drivers disagree on which ends the user; \
                 percent-encode an `@` in a name as `%40`"
                    .into(),
            );
        }
        if user.contains(':') {
            return Err(format!(
                "the URL holds a password (`user:password@`); {MOVE}"
            ));
        }
        if user.contains(['/', '?', '#']) {
            return Err(format!(
                "the URL's user part (before `@`) holds `/`, `?` or `#`, which drivers read \
                 as a password or as the path; if it is a password, {MOVE}; a user name \
                 with these characters must be percent-encoded"
            ));
        }
    }
    if let Some(q) = query(tail) {
        for kv in q.split('&') {
            let name = percent_decode(kv.split('=').next().unwrap_or(""));
            if is_credential_name(&name) {
                return Err(format!(
                    "the URL holds a `{}` parameter (a credential); {MOVE}",
                    if name.eq_ignore_ascii_case("password") {
                        "password".to_owned()
                    } else {
                        "password-like".to_owned()
                    }
                ));
            }
        }
    }
    let host = tail.split(['/', '?', '#']).next().unwrap_or("");
    if host.is_empty() {
        return Err("the URL names no host".into());
    }
    Ok(())
}

/// Placeholder written where a credential was.
pub const REDACTED: &str = "***";

/// `url` with every credential replaced by [`REDACTED`], whatever its form:
/// - the user-info (up to the last `@`, the widest reading) keeps a plain user name and
///   loses everything after its first `:` (`user:***@`); one whose part before the
///   first `:` holds `/`, `?`, `#` or `@` is replaced whole (`***@`);
/// - every parameter whose percent-decoded name is a credential ([`is_credential_name`])
///   keeps its name and loses its value;
/// - a string that is not `scheme://...` (a key-value connection string, say) is
///   replaced whole when any word in it names a credential.
///
/// A URL without credentials comes back unchanged, so redacting is safe to apply to
/// every string that may be a URL.
pub fn redact_url(url: &str) -> String {
    let Some((scheme, user, tail)) = split(url) else {
        let credential = url
            .split(|c: char| !c.is_ascii_alphanumeric() && c != '_' && c != '%')
            .any(|w| is_credential_name(&percent_decode(w)));
        return if credential {
            REDACTED.to_owned()
        } else {
            url.to_owned()
        };
    };
    let mut out = String::from(scheme);
    if let Some(user) = user {
        let (name, password) = match user.split_once(':') {
            Some((n, _)) => (n, true),
            None => (user, false),
        };
        if name.contains(['/', '?', '#', '@']) {
            out.push_str(REDACTED);
        } else {
            out.push_str(name);
            if password {
                out.push(':');
                out.push_str(REDACTED);
            }
        }
        out.push('@');
    }
    match tail.split_once('?') {
        None => out.push_str(tail),
        Some((before, q)) => {
            out.push_str(before);
            out.push('?');
            let params: Vec<String> = q
                .split('&')
                .map(|kv| match kv.split_once('=') {
                    Some((k, _)) if is_credential_name(&percent_decode(k)) => {
                        format!("{k}={REDACTED}")
                    }
                    _ => kv.to_owned(),
                })
                .collect();
            out.push_str(&params.join("&"));
        }
    }
    out
}

/// Redacts, in place, every string in `value` that holds `://` ([`redact_url`]): the
/// connection URLs of any plan layer, and any URL a plugin config holds. Used wherever a
/// plan is printed; the plans themselves keep their URLs (nodes connect with them).
pub fn redact_urls_in_json(value: &mut serde_json::Value) {
    match value {
        serde_json::Value::String(s) if s.contains("://") => {
            let r = redact_url(s);
            if r != *s {
                *s = r;
            }
        }
        serde_json::Value::Array(a) => a.iter_mut().for_each(redact_urls_in_json),
        serde_json::Value::Object(o) => o.values_mut().for_each(redact_urls_in_json),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_connection_kind_has_url_rules_and_an_unknown_kind_is_refused() {
        for kind in crate::model::CONNECTION_KINDS {
            let e = check_url(kind, "bogus").expect_err(kind);
            assert!(e.starts_with("expected a URL"), "{kind}: {e}");
        }
        let e = check_url("toy", "toy://host").expect_err("an unknown kind");
        assert!(e.contains("no URL rules"), "{e}");
    }
    use proptest::prelude::*;

    /// Pins the check that let `pass%77ord=` (a percent-encoded parameter name) and
    /// `user:pa/ss@` (a `/` in the password) through, while the PostgreSQL driver
    /// authenticated with both.
    #[test]
    fn passwords_the_driver_reads_are_refused() {
        for url in [
            "postgres://nop@127.0.0.1:5432/db?pass%77ord=SECRET",
            "postgres://nop@127.0.0.1:5432/db?PASSWORD=SECRET",
            "postgres://nop@127.0.0.1:5432/db?sslmode=disable&%70assword=SECRET",
            "postgres://user:pa/ss@127.0.0.1/db",
            "postgres://user:pa?ss@127.0.0.1/db",
            "postgresql://user:SECRET@127.0.0.1/db",
            "postgres://u@x:SECRET@127.0.0.1/db",
            "postgres://127.0.0.1/db?application_name=a&password=SECRET@b",
        ] {
            let e = check_url("postgres", url).expect_err(url);
            assert!(!e.contains("SECRET") && !e.contains("pa/ss"), "{url}: {e}");
        }
        for url in [
            "redis://u:p@ss@127.0.0.1:6379",
            "redis://127.0.0.1:6379/0?pass=SECRET",
            "nats://tok/en@127.0.0.1:4222",
            "nats://127.0.0.1:4222?auth_token=SECRET",
        ] {
            let kind = &url[..url.find(':').unwrap()];
            check_url(kind, url).expect_err(url);
        }
        for (kind, url) in [
            ("postgres", "postgres://nop@127.0.0.1:5432/db"),
            (
                "postgres",
                "postgres://nop@127.0.0.1:5432/db?sslmode=disable",
            ),
            (
                "postgres",
                "postgresql://n%40p@[::1]:5432/db?application_name=x%40y",
            ),
            ("postgres", "postgres://127.0.0.1/db"),
            ("redis", "redis://127.0.0.1:6379/0"),
            ("nats", "tls://nop@queue.example:4222"),
        ] {
            check_url(kind, url).unwrap_or_else(|e| panic!("{url}: {e}"));
        }
    }

    #[test]
    fn redaction_keeps_names_and_drops_secrets() {
        for (url, want) in [
            (
                "postgres://nop@h:5432/db?pass%77ord=SECRET",
                "postgres://nop@h:5432/db?pass%77ord=***",
            ),
            ("postgres://user:pa/ss@h/db", "postgres://user:***@h/db"),
            ("redis://u:p@ss@h", "redis://u:***@h"),
            ("redis://u/x@h", "redis://***@h"),
            (
                "postgres://h/db?application_name=a&password=SECRET@b",
                "postgres://***@b",
            ),
            ("postgres://nop@h/db", "postgres://nop@h/db"),
            ("host=h password=SECRET", "***"),
            ("file:///tmp/x", "file:///tmp/x"),
        ] {
            assert_eq!(redact_url(url), want, "{url}");
        }
        let mut v = serde_json::json!({
            "connections": {"pg": {"kind": "postgres", "url": "postgres://u:SECRET@h/db"}},
            "config": {"list": ["redis://:SECRET@h"]},
        });
        redact_urls_in_json(&mut v);
        assert!(!v.to_string().contains("SECRET"), "{v}");
    }

    /// A credential and how a URL may carry it.
    fn secret() -> impl Strategy<Value = String> {
        "[A-Za-z0-9/:@?#&=%._-]{1,12}".prop_map(|s| format!("S3CR3T{s}"))
    }

    /// A parameter name spelling `password` with any subset of its characters
    /// percent-encoded and any case.
    fn password_name() -> impl Strategy<Value = String> {
        proptest::collection::vec((any::<bool>(), any::<bool>()), 8).prop_map(|flags| {
            "password"
                .chars()
                .zip(flags)
                .map(|(c, (enc, upper))| {
                    let c = if upper { c.to_ascii_uppercase() } else { c };
                    if enc {
                        format!("%{:02X}", c as u8)
                    } else {
                        c.to_string()
                    }
                })
                .collect()
        })
    }

    fn scheme() -> impl Strategy<Value = (&'static str, &'static str)> {
        prop_oneof![
            Just(("postgres", "postgres://")),
            Just(("postgres", "postgresql://")),
            Just(("redis", "redis://")),
            Just(("redis", "rediss://")),
            Just(("nats", "nats://")),
            Just(("nats", "tls://")),
        ]
    }

    proptest! {
        /// Every URL shape that carries a secret (user-info password with `/`, `:`, `@`,
        /// `?` in it; a percent-encoded, mixed-case `password` parameter, repeated or
        /// not) is refused, the message never holds the secret, and redaction removes it.
        #[test]
        fn a_url_carrying_a_secret_is_refused_and_redacted(
            (kind, scheme) in scheme(),
            user in "[a-z]{1,6}",
            host in "[a-z]{1,6}(:[0-9]{1,4})?",
            path in "(/[a-z]{1,6})?",
            secret in secret(),
            name in password_name(),
            shape in 0..3u8,
            other in proptest::collection::vec("[a-z_]{1,8}=[a-z0-9]{0,4}", 0..3),
            repeat in any::<bool>(),
        ) {
            let mut params = other.clone();
            let url = match shape {
                0 => format!("{scheme}{user}:{secret}@{host}{path}"),
                _ => {
                    let enc: String = secret.bytes()
                        .map(|b| if b.is_ascii_alphanumeric() { (b as char).to_string() } else { format!("%{b:02X}") })
                        .collect();
                    params.insert(params.len() / 2, format!("{name}={enc}"));
                    if repeat {
                        params.push(format!("{name}={enc}"));
                    }
                    let userinfo = if shape == 1 { format!("{user}@") } else { String::new() };
                    format!("{scheme}{userinfo}{host}{path}?{}", params.join("&"))
                }
            };
            let e = check_url(kind, &url);
            prop_assert!(e.is_err(), "accepted: {url}");
            prop_assert!(!e.unwrap_err().contains("S3CR3T"));
            let r = redact_url(&url);
            prop_assert!(!r.contains("S3CR3T"), "{url} -> {r}");
        }

        /// A URL without credentials is accepted and left unchanged by redaction.
        #[test]
        fn a_url_without_a_secret_is_accepted_and_unchanged(
            (kind, scheme) in scheme(),
            user in "([a-z%0-9]{1,6}@)?",
            host in "[a-z]{1,6}(:[0-9]{1,4})?",
            path in "(/[a-z]{1,6})?",
            params in proptest::collection::vec("[a-z_]{1,8}=[a-z0-9%]{0,4}", 0..3),
        ) {
            prop_assume!(!params.iter().any(|p| is_credential_name(p.split('=').next().unwrap())));
            let q = if params.is_empty() { String::new() } else { format!("?{}", params.join("&")) };
            let url = format!("{scheme}{user}{host}{path}{q}");
            prop_assert!(check_url(kind, &url).is_ok(), "{url}: {:?}", check_url(kind, &url));
            prop_assert_eq!(redact_url(&url), url);
        }
    }
}
