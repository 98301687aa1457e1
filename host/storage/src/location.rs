//! Locations: where a store is, as a URL.
//!
//! | form | backend |
//! |---|---|
//! | `/abs/dir`, `rel/dir`, `file:///abs/dir` | [`crate::local::LocalDir`] |
//! | `s3://bucket[/prefix][?endpoint=URL&region=R]` | [`crate::s3::S3Store`] |
//! | `memory://name[/prefix]` | [`crate::memory::MemStore::named`] (tests) |
//!
//! S3 credentials come from the environment only (`AWS_ACCESS_KEY_ID`,
//! `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`, and what else the `object_store` crate
//! reads: `AWS_REGION`, `AWS_ENDPOINT_URL`, ...). A URL that carries user-info is refused
//! without being echoed, and no `Display` of a location or of an error shows a credential.

use crate::{ObjectStore, Scoped, StoreError};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A parsed location.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Location {
    /// A local directory.
    Local(PathBuf),
    /// A prefix of an S3 bucket.
    S3 {
        /// The bucket.
        bucket: String,
        /// The prefix inside it: empty, or `/`-separated components without a trailing
        /// `/`.
        prefix: String,
        /// The endpoint (`http://127.0.0.1:9000` for a local server), if not AWS's or the
        /// environment's.
        endpoint: Option<String>,
        /// The region, if not the environment's (default `us-east-1`).
        region: Option<String>,
    },
    /// A prefix of a named in-memory store of this process.
    Memory {
        /// The store's name.
        name: String,
        /// The prefix inside it.
        prefix: String,
    },
}

/// A location that does not parse. Its message never repeats a credential.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("storage location `{shown}`: {message}")]
pub struct LocationError {
    /// The location as given, with any user-info replaced by `***`.
    pub shown: String,
    /// What is wrong.
    pub message: String,
}

/// `s`, or only its scheme if it holds an `@` anywhere (user-info, or a lax parser's idea
/// of it: everything up to the last `@` may be a credential).
fn redact(s: &str) -> String {
    match s.split_once("://") {
        Some((scheme, rest)) if rest.contains('@') => format!("{scheme}://***"),
        _ => s.to_owned(),
    }
}

fn clean_prefix(p: &str) -> Option<String> {
    let p = p.trim_matches('/');
    if p.is_empty() {
        return Some(String::new());
    }
    p.split('/')
        .all(|c| !c.is_empty() && c != "." && c != "..")
        .then(|| p.to_owned())
}

impl Location {
    /// Parses a location (see the module's table).
    ///
    /// # Errors
    /// An unknown scheme, a URL carrying credentials, a missing bucket name, an unknown
    /// option, a prefix with empty, `.` or `..` components.
    pub fn parse(s: &str) -> Result<Location, LocationError> {
        let err = |message: &str| LocationError {
            shown: redact(s),
            message: message.to_owned(),
        };
        let Some((scheme, rest)) = s.split_once("://") else {
            if s.is_empty() {
                return Err(err("empty"));
            }
            return Ok(Location::Local(PathBuf::from(s)));
        };
        let (rest, query) = match rest.split_once('?') {
            Some((r, q)) => (r, Some(q)),
            None => (rest, None),
        };
        match scheme {
            "file" => {
                if query.is_some() {
                    return Err(err("a file location takes no options"));
                }
                if !rest.starts_with('/') {
                    return Err(err(
                        "a file URL names an absolute path: file:///abs/dir (or give the path itself)",
                    ));
                }
                Ok(Location::Local(PathBuf::from(rest)))
            }
            "s3" | "memory" => {
                if rest.contains('@') {
                    return Err(err(
                        "the URL carries user-info; credentials come from the environment only \
                         (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN)",
                    ));
                }
                let (name, prefix) = rest.split_once('/').unwrap_or((rest, ""));
                if name.is_empty() {
                    return Err(err(if scheme == "s3" {
                        "no bucket name: s3://BUCKET/PREFIX"
                    } else {
                        "no store name: memory://NAME/PREFIX"
                    }));
                }
                let prefix = clean_prefix(prefix)
                    .ok_or_else(|| err("the prefix has an empty, `.` or `..` component"))?;
                if scheme == "memory" {
                    if query.is_some() {
                        return Err(err("a memory location takes no options"));
                    }
                    return Ok(Location::Memory {
                        name: name.to_owned(),
                        prefix,
                    });
                }
                let mut endpoint = None;
                let mut region = None;
                for kv in query.unwrap_or("").split('&').filter(|kv| !kv.is_empty()) {
                    let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
                    match k {
                        "endpoint" => {
                            if !(v.starts_with("http://") || v.starts_with("https://")) {
                                return Err(err(
                                    "option `endpoint` must be an http:// or https:// URL",
                                ));
                            }
                            if v.contains('@') {
                                return Err(err(
                                    "option `endpoint` carries user-info; credentials come from the environment only",
                                ));
                            }
                            endpoint = Some(v.trim_end_matches('/').to_owned());
                        }
                        "region" => region = Some(v.to_owned()),
                        other => {
                            return Err(err(&format!(
                                "unknown option `{other}` (known: endpoint, region)"
                            )));
                        }
                    }
                }
                Ok(Location::S3 {
                    bucket: name.to_owned(),
                    prefix,
                    endpoint,
                    region,
                })
            }
            other => Err(err(&format!(
                "unknown scheme `{other}` (known: file, s3, memory, or a plain path)"
            ))),
        }
    }

    /// The location of `sub` inside this one (`/`-separated, relative).
    pub fn join(&self, sub: &str) -> Location {
        let sub = sub.trim_matches('/');
        let join = |p: &str| {
            if p.is_empty() {
                sub.to_owned()
            } else if sub.is_empty() {
                p.to_owned()
            } else {
                format!("{p}/{sub}")
            }
        };
        match self {
            Location::Local(p) => Location::Local(if sub.is_empty() {
                p.clone()
            } else {
                p.join(sub)
            }),
            Location::S3 {
                bucket,
                prefix,
                endpoint,
                region,
            } => Location::S3 {
                bucket: bucket.clone(),
                prefix: join(prefix),
                endpoint: endpoint.clone(),
                region: region.clone(),
            },
            Location::Memory { name, prefix } => Location::Memory {
                name: name.clone(),
                prefix: join(prefix),
            },
        }
    }

    /// The directory of a local location.
    pub fn local_dir(&self) -> Option<&Path> {
        match self {
            Location::Local(p) => Some(p),
            _ => None,
        }
    }

    /// Opens the store at this location, scoped to its prefix. For S3 this lists the
    /// prefix once, so a missing bucket, refused credentials or an unreachable endpoint
    /// fail here, naming the location.
    ///
    /// # Errors
    /// The store cannot be opened or reached.
    pub fn open(&self) -> Result<Scoped, StoreError> {
        match self {
            Location::Local(p) => Ok(Scoped::new(
                Arc::new(crate::local::LocalDir::open(p)?) as Arc<dyn ObjectStore>,
                "",
            )),
            Location::S3 {
                bucket,
                prefix,
                endpoint,
                region,
            } => {
                let store =
                    crate::s3::S3Store::open(bucket, endpoint.as_deref(), region.as_deref())?;
                store.probe(prefix)?;
                Ok(Scoped::new(Arc::new(store), prefix))
            }
            Location::Memory { name, prefix } => Ok(Scoped::new(
                crate::memory::MemStore::named(name) as Arc<dyn ObjectStore>,
                prefix,
            )),
        }
    }
}

impl std::str::FromStr for Location {
    type Err = LocationError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Location::parse(s)
    }
}

impl std::fmt::Display for Location {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Location::Local(p) => write!(f, "{}", p.display()),
            Location::S3 {
                bucket,
                prefix,
                endpoint,
                region,
            } => {
                write!(f, "s3://{bucket}")?;
                if !prefix.is_empty() {
                    write!(f, "/{prefix}")?;
                }
                let mut sep = '?';
                if let Some(e) = endpoint {
                    write!(f, "{sep}endpoint={e}")?;
                    sep = '&';
                }
                if let Some(r) = region {
                    write!(f, "{sep}region={r}")?;
                }
                Ok(())
            }
            Location::Memory { name, prefix } => {
                write!(f, "memory://{name}")?;
                if !prefix.is_empty() {
                    write!(f, "/{prefix}")?;
                }
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locations_parse_and_display_without_credentials() {
        assert_eq!(
            Location::parse("/tmp/x").unwrap(),
            Location::Local("/tmp/x".into())
        );
        assert_eq!(
            Location::parse("file:///tmp/x").unwrap(),
            Location::Local("/tmp/x".into())
        );
        let l = Location::parse("s3://b/p/q/?endpoint=http://127.0.0.1:9000/&region=eu-west-1")
            .unwrap();
        assert_eq!(
            l,
            Location::S3 {
                bucket: "b".into(),
                prefix: "p/q".into(),
                endpoint: Some("http://127.0.0.1:9000".into()),
                region: Some("eu-west-1".into())
            }
        );
        assert_eq!(
            l.to_string(),
            "s3://b/p/q?endpoint=http://127.0.0.1:9000&region=eu-west-1"
        );
        assert_eq!(
            l.join("checkpoints/j.main").to_string(),
            "s3://b/p/q/checkpoints/j.main?endpoint=http://127.0.0.1:9000&region=eu-west-1"
        );
        assert_eq!(
            Location::parse("memory://t/a")
                .unwrap()
                .join("b")
                .to_string(),
            "memory://t/a/b"
        );
    }

    #[test]
    fn credentials_in_a_url_are_refused_and_never_echoed() {
        for url in [
            "s3://AKIDSECRET:hunter2@bucket/prefix",
            "s3://bucket/prefix@hunter2",
            "s3://bucket/p?endpoint=http://u:hunter2@host:9000",
        ] {
            let e = Location::parse(url).unwrap_err().to_string();
            assert!(!e.contains("hunter2"), "{e}");
            assert!(e.contains("environment"), "{e}");
        }
        for bad in [
            "s3:///p",
            "ftp://x/y",
            "s3://b/a//c",
            "s3://b/../c",
            "s3://b/p?key=v",
            "",
        ] {
            assert!(Location::parse(bad).is_err(), "{bad}");
        }
    }
}
