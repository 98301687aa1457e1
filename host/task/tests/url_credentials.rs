//! The job file's URL check against the drivers' own parsers: a URL the check accepts
//! gives no driver a password, and redaction removes every password a driver reads
//! (design §7.5: no credential ever comes from a URL, or shows in a log or plan).

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
    if let (_, Some(user)) = nop_stream_nats_jetstream::split_url(url)
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
