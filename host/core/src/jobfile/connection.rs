//! Connection policy: `[connections.<name>]` tables and the rules every connection
//! follows, on a parsed file and on a model built elsewhere alike.

use super::Span;
use super::is_ident;
use super::reader::{Cx, check_keys, find, get_str};
use crate::model::ConnectionSpec;
use toml::Spanned;
use toml::de::DeValue;

/// `[connections.<name>]` tables: `kind`, `url` and `password_env`, checked here (the
/// rules are in [`check_connection`]).
pub(super) fn read_connections(
    cx: &mut Cx<'_>,
    v: &Spanned<DeValue<'_>>,
) -> std::collections::BTreeMap<String, ConnectionSpec> {
    let mut out = std::collections::BTreeMap::new();
    let DeValue::Table(t) = v.get_ref() else {
        cx.err(
            Some(v.span()),
            "connections",
            format!(
                "expected tables `[connections.<name>]`, found {}",
                v.get_ref().type_str()
            ),
        );
        return out;
    };
    for (k, item) in t.iter() {
        let name = k.get_ref().to_string();
        let prefix = format!("connections.{name}");
        let DeValue::Table(ct) = item.get_ref() else {
            cx.err(
                Some(item.span()),
                prefix,
                format!(
                    "expected a table {{ kind = \"postgres\", url = \"..\" }}, found {}",
                    item.get_ref().type_str()
                ),
            );
            continue;
        };
        check_keys(cx, ct, &prefix, &["kind", "url", "password_env", "ca_file"]);
        let mut field = |key: &str, required: bool| -> Option<(String, Span)> {
            match find(ct, key) {
                Some(x) => get_str(cx, x, &format!("{prefix}.{key}")).map(|s| (s, x.span())),
                None => {
                    if required {
                        cx.err(
                            Some(item.span()),
                            format!("{prefix}.{key}"),
                            format!("missing required key `{key}`"),
                        );
                    }
                    None
                }
            }
        };
        let kind = field("kind", true);
        let url = field("url", true);
        let password_env = field("password_env", false);
        let ca_file = field("ca_file", false);
        let (Some((kind, kind_span)), Some((url, url_span))) = (kind, url) else {
            continue;
        };
        let spec = ConnectionSpec {
            kind,
            url,
            password_env: password_env.as_ref().map(|p| p.0.clone()),
            ca_file: ca_file.as_ref().map(|p| p.0.clone()),
        };
        let mut bad = false;
        for (key, message) in check_connection(&name, &spec) {
            let span = match key {
                "kind" => kind_span.clone(),
                "url" => url_span.clone(),
                "password_env" => password_env.as_ref().map_or(item.span(), |p| p.1.clone()),
                "ca_file" => ca_file.as_ref().map_or(item.span(), |p| p.1.clone()),
                _ => k.span(),
            };
            let field = if key.is_empty() {
                prefix.clone()
            } else {
                format!("{prefix}.{key}")
            };
            cx.err(Some(span), field, message);
            bad = true;
        }
        if !bad {
            out.insert(name, spec);
        }
    }
    out
}

/// The rules of one connection, as (key, message) per violation (empty key: the name):
/// - the name uses the id charset (`[A-Za-z0-9][A-Za-z0-9._-]*`);
/// - `kind` is one of [`crate::model::CONNECTION_KINDS`];
/// - the `url` scheme fits the kind: `postgres://` or `postgresql://` for `postgres`,
///   `nats://` or `tls://` for `nats`, `redis://` or `rediss://` for `redis`;
/// - the `url` holds no password, read the way the drivers read it
///   ([`crate::url::check_url`]: no `user:password@`, no parameter whose percent-decoded
///   name is a credential, no user-info any driver could read as one): passwords come
///   from the environment variable `password_env` on the host running the job;
/// - `password_env` is a variable name (`[A-Za-z_][A-Za-z0-9_]*`);
/// - `ca_file` goes only with a TLS URL (`rediss://`, `tls://`); Postgres has no TLS yet.
///
/// Messages never repeat the URL, so a misplaced password is not echoed.
pub fn check_connection(name: &str, spec: &ConnectionSpec) -> Vec<(&'static str, String)> {
    let mut out = Vec::new();
    if !is_ident(name) {
        out.push((
            "",
            format!("connection name `{name}` must match [A-Za-z0-9][A-Za-z0-9._-]*"),
        ));
    }
    if !crate::model::CONNECTION_KINDS.contains(&spec.kind.as_str()) {
        out.push((
            "kind",
            format!(
                "unknown connection kind `{}`; expected one of: {}",
                spec.kind,
                crate::model::CONNECTION_KINDS.join(", ")
            ),
        ));
    } else if let Err(e) = crate::url::check_url(&spec.kind, &spec.url) {
        out.push(("url", e));
    }
    if spec.ca_file.is_some() {
        if spec.kind == "postgres" {
            out.push((
                "ca_file",
                "TLS to PostgreSQL is not supported by this host yet".into(),
            ));
        } else if !(spec.url.starts_with("rediss://") || spec.url.starts_with("tls://")) {
            out.push((
                "ca_file",
                "goes with a TLS URL (`rediss://` for redis, `tls://` for nats)".into(),
            ));
        }
    }
    if let Some(var) = &spec.password_env {
        let mut chars = var.chars();
        let ok = chars
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !ok {
            out.push((
                "password_env",
                "must be an environment variable name ([A-Za-z_][A-Za-z0-9_]*), not a password"
                    .into(),
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::tests::{MINIMAL_JOB, at, errs};
    use super::super::{parse_job_file, validate_model};

    fn with_connections(connections: &str, sink_extra: &str) -> String {
        format!(
            "{MINIMAL_JOB}{connections}[[source]]\nname = \"s\"\nplugin = \"s@1\"\n\
             [[sink]]\nname = \"k\"\nplugin = \"k@1\"\ninputs = [\"s\"]\n{sink_extra}"
        )
    }

    #[test]
    fn connections_are_declared_by_name_and_granted_to_sinks() {
        let pg = "[connections.pg]\nkind = \"postgres\"\nurl = \"postgres://u@127.0.0.1:5432/db\"\npassword_env = \"PGPASSWORD\"\n";
        let m = parse_job_file(
            "job.toml",
            &with_connections(pg, "connections = [\"pg\"]\n"),
        )
        .unwrap();
        assert_eq!(m.connections["pg"].kind, "postgres");
        assert_eq!(
            m.connections["pg"].password_env.as_deref(),
            Some("PGPASSWORD")
        );
        assert_eq!(m.node("k").unwrap().connections, ["pg"]);
        validate_model(&m).unwrap();
        // Declared but not granted: fine (the sink just cannot open it).
        assert!(parse_job_file("job.toml", &with_connections(pg, "")).is_ok());

        let d = errs(&with_connections(pg, "connections = [\"pgx\"]\n"));
        let e = at(&d, "sink[0].connections[0]");
        assert!(
            e.message
                .contains("connection `pgx` is not declared; declared: `pg`"),
            "{d}"
        );
        assert!(e.line.is_some());
        let d = errs(&with_connections("", "connections = [\"pg\", \"pg\"]\n"));
        assert!(
            at(&d, "sink[0].connections[0]")
                .message
                .contains("add a `[connections.pg]` table"),
            "{d}"
        );

        for (conn, field, needle) in [
            (
                "url = \"postgres://u:s3cret@h/db\"",
                "connections.pg.url",
                "holds a password",
            ),
            (
                "url = \"postgres://u@h/db?password=s3cret\"",
                "connections.pg.url",
                "`password` parameter",
            ),
            // The two forms the PostgreSQL driver authenticated with while this check let
            // them through: a percent-encoded parameter name and a `/` in the password.
            (
                "url = \"postgres://u@h:5432/db?pass%77ord=s3cret\"",
                "connections.pg.url",
                "a credential",
            ),
            (
                "url = \"postgres://u:pa/s3cret@h/db\"",
                "connections.pg.url",
                "holds a password",
            ),
            (
                "url = \"host=h user=u\"",
                "connections.pg.url",
                "expected a URL",
            ),
            (
                "url = \"postgres://u@h/db\"\npassword_env = \"s3cret pw\"",
                "connections.pg.password_env",
                "variable name",
            ),
            (
                "url = \"postgres://u@h/db\"\nsecret = 1",
                "connections.pg.secret",
                "unknown key",
            ),
            (
                "url = \"postgres://u@h/db\"\nca_file = \"ca.pem\"",
                "connections.pg.ca_file",
                "not supported by this host yet",
            ),
        ] {
            let text = with_connections(
                &format!("[connections.pg]\nkind = \"postgres\"\n{conn}\n"),
                "",
            );
            let d = errs(&text);
            let e = at(&d, field);
            assert!(e.message.contains(needle), "{d}");
            assert!(
                !d.to_string().contains("s3cret"),
                "a password is echoed: {d}"
            );
        }
        let d = errs(&with_connections(
            "[connections.pg]\nkind = \"mysql\"\nurl = \"x\"\n",
            "",
        ));
        assert!(
            at(&d, "connections.pg.kind")
                .message
                .contains("unknown connection kind"),
            "{d}"
        );

        // Sources and sinks take connections; operators do not.
        let text = format!(
            "{MINIMAL_JOB}{pg}[[source]]\nname = \"s\"\nplugin = \"s@1\"\nconnections = [\"pg\"]\n\
             [[sink]]\nname = \"k\"\nplugin = \"k@1\"\ninputs = [\"s\"]\n"
        );
        let m = parse_job_file("job.toml", &text).unwrap();
        assert_eq!(m.node("s").unwrap().connections, ["pg"]);
        let text = format!(
            "{MINIMAL_JOB}{pg}[[source]]\nname = \"s\"\nplugin = \"s@1\"\n\
             [[operator]]\nname = \"o\"\nplugin = \"o@1\"\ninputs = [\"s\"]\nconnections = [\"pg\"]\n\
             [[sink]]\nname = \"k\"\nplugin = \"k@1\"\ninputs = [\"o\"]\n"
        );
        let d = errs(&text);
        assert!(
            at(&d, "operator[0].connections[0]")
                .message
                .contains("only sources and sinks"),
            "{d}"
        );
    }

    #[test]
    fn nats_and_redis_connections_take_their_own_schemes_and_no_password() {
        for (kind, url) in [
            ("nats", "nats://127.0.0.1:4222"),
            ("nats", "tls://nop@queue.example:4222"),
            ("redis", "redis://127.0.0.1:6379/0"),
            ("redis", "rediss://nop@cache.example:6380"),
        ] {
            let c = format!("[connections.q]\nkind = \"{kind}\"\nurl = \"{url}\"\n");
            let m = parse_job_file("job.toml", &with_connections(&c, "connections = [\"q\"]\n"))
                .unwrap_or_else(|d| panic!("{kind} {url}: {d}"));
            assert_eq!(m.connections["q"].kind, kind);
        }
        for (kind, url, needle) in [
            ("nats", "redis://127.0.0.1:6379", "expected a URL `nats://"),
            ("redis", "nats://127.0.0.1:4222", "expected a URL `redis://"),
            ("postgres", "redis://h", "expected a URL `postgres://"),
            ("nats", "nats://u:s3cret@h:4222", "holds a password"),
            ("redis", "redis://:s3cret@h:6379", "holds a password"),
            (
                "redis",
                "redis://h:6379/0?password=s3cret",
                "`password` parameter",
            ),
        ] {
            let c = format!("[connections.q]\nkind = \"{kind}\"\nurl = \"{url}\"\n");
            let d = errs(&with_connections(&c, ""));
            assert!(
                at(&d, "connections.q.url").message.contains(needle),
                "{kind} {url}: {d}"
            );
            assert!(
                !d.to_string().contains("s3cret"),
                "a password is echoed: {d}"
            );
        }
        // ca_file: only with a TLS URL.
        for (kind, url) in [("nats", "tls://h:4222"), ("redis", "rediss://h:6380")] {
            let c = format!(
                "[connections.q]\nkind = \"{kind}\"\nurl = \"{url}\"\nca_file = \"certs/ca.pem\"\n"
            );
            let m = parse_job_file("job.toml", &with_connections(&c, "connections = [\"q\"]\n"))
                .unwrap_or_else(|d| panic!("{kind} {url}: {d}"));
            assert_eq!(m.connections["q"].ca_file.as_deref(), Some("certs/ca.pem"));
        }
        for (kind, url) in [("nats", "nats://h:4222"), ("redis", "redis://h:6379")] {
            let c = format!(
                "[connections.q]\nkind = \"{kind}\"\nurl = \"{url}\"\nca_file = \"ca.pem\"\n"
            );
            let d = errs(&with_connections(&c, ""));
            assert!(
                at(&d, "connections.q.ca_file")
                    .message
                    .contains("goes with a TLS URL"),
                "{kind} {url}: {d}"
            );
        }
    }
}
