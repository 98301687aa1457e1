//! Who a peer is: roles, node ids, CLI names, and their certificate names.
//!
//! # Identity scheme
//!
//! A peer's identity is carried by its certificate, as exactly one DNS subject alternative
//! name under the suffix [`NAME_SUFFIX`] (`.nopstream`):
//!
//! | role          | DNS SAN                    | example              | EKU                    |
//! |---------------|----------------------------|----------------------|------------------------|
//! | coordinator   | `coordinator.nopstream`    | —                    | server + client auth   |
//! | runtime node  | `node-<id>.nopstream`      | `node-3.nopstream`   | server + client auth   |
//! | CLI client    | `cli-<name>.nopstream`     | `cli-ops.nopstream`  | client auth            |
//!
//! `<id>` is a decimal `u32` without leading zeros; `<name>` is 1–32 characters of
//! `[a-z0-9-]` and does not start or end with `-`. A certificate with no such name, or with
//! more than one, has no identity and is refused. Which CA signed it decides which cluster
//! it belongs to: every cluster has its own CA (see [`crate::pki`]).
//!
//! The same string is the TLS server name a dialler passes to `connect` (so the server's
//! certificate is checked against the role it dials) and, without the suffix, the identity
//! a peer claims in its hello ([`Identity::label`], parsed back by [`str::parse`]).

use std::fmt;
use std::str::FromStr;

/// The DNS suffix under which every identity name lives.
pub const NAME_SUFFIX: &str = ".nopstream";

/// Longest CLI client name, in characters.
pub const MAX_CLI_NAME_LEN: usize = 32;

/// A runtime node's id, unique within a cluster (design §2.5, `RuntimeNode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NodeId(pub u32);

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "node-{}", self.0)
    }
}

/// A CLI client's name: 1–[`MAX_CLI_NAME_LEN`] characters of `[a-z0-9-]`, not starting or
/// ending with `-`. Build it with [`CliName::new`] or [`str::parse`].
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CliName(String);

impl CliName {
    /// Checks and wraps a CLI client name.
    ///
    /// # Errors
    ///
    /// [`IdentityParseError::BadCliName`] if the name is empty, too long, or has a character
    /// outside `[a-z0-9-]` or a leading/trailing `-`.
    pub fn new(name: impl Into<String>) -> Result<Self, IdentityParseError> {
        let name = name.into();
        let ok = !name.is_empty()
            && name.len() <= MAX_CLI_NAME_LEN
            && !name.starts_with('-')
            && !name.ends_with('-')
            && name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
        if ok {
            Ok(Self(name))
        } else {
            Err(IdentityParseError::BadCliName(name))
        }
    }

    /// The name as a string slice.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for CliName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl FromStr for CliName {
    type Err = IdentityParseError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::new(s)
    }
}

/// The role a certificate grants, without the id.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Role {
    /// The job coordinator (design §2.5, `JobCoordinator`).
    Coordinator,
    /// A runtime node that runs task attempts.
    Node,
    /// An operator's command-line client (upload, submit, status).
    Cli,
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Role::Coordinator => "coordinator",
            Role::Node => "node",
            Role::Cli => "cli",
        })
    }
}

/// A peer identity: a role plus, for nodes and CLI clients, its id or name.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Identity {
    /// `coordinator.nopstream`.
    Coordinator,
    /// `node-<id>.nopstream`.
    Node(NodeId),
    /// `cli-<name>.nopstream`.
    Cli(CliName),
}

impl Identity {
    /// The role this identity holds.
    pub fn role(&self) -> Role {
        match self {
            Identity::Coordinator => Role::Coordinator,
            Identity::Node(_) => Role::Node,
            Identity::Cli(_) => Role::Cli,
        }
    }

    /// The short label: `coordinator`, `node-<id>` or `cli-<name>`. Also the file stem of
    /// this identity's certificate and key in a certs directory, and what a hello claims.
    pub fn label(&self) -> String {
        match self {
            Identity::Coordinator => "coordinator".to_owned(),
            Identity::Node(id) => id.to_string(),
            Identity::Cli(name) => format!("cli-{name}"),
        }
    }

    /// The certificate DNS name and TLS server name: `<label>.nopstream`.
    pub fn dns_name(&self) -> String {
        format!("{}{NAME_SUFFIX}", self.label())
    }

    /// Parses a certificate DNS name (`<label>.nopstream`).
    ///
    /// # Errors
    ///
    /// [`IdentityParseError::NotClusterName`] without the suffix, else as [`str::parse`].
    pub fn from_dns_name(name: &str) -> Result<Self, IdentityParseError> {
        let label = name
            .strip_suffix(NAME_SUFFIX)
            .ok_or_else(|| IdentityParseError::NotClusterName(name.to_owned()))?;
        label.parse()
    }
}

impl fmt::Display for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.label())
    }
}

impl FromStr for Identity {
    type Err = IdentityParseError;

    /// Parses a label: `coordinator`, `node-<id>` or `cli-<name>`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s == "coordinator" {
            return Ok(Identity::Coordinator);
        }
        if let Some(id) = s.strip_prefix("node-") {
            let canonical = !id.is_empty()
                && id.bytes().all(|b| b.is_ascii_digit())
                && (id == "0" || !id.starts_with('0'));
            return match id.parse::<u32>() {
                Ok(n) if canonical => Ok(Identity::Node(NodeId(n))),
                _ => Err(IdentityParseError::BadNodeId(s.to_owned())),
            };
        }
        if let Some(name) = s.strip_prefix("cli-") {
            return CliName::new(name).map(Identity::Cli);
        }
        Err(IdentityParseError::UnknownRole(s.to_owned()))
    }
}

/// Why a string is not an identity.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdentityParseError {
    /// The DNS name does not end in `.nopstream`.
    #[error("`{0}` is not a cluster name (expected `<label>{NAME_SUFFIX}`)")]
    NotClusterName(String),
    /// The label starts with none of `coordinator`, `node-`, `cli-`.
    #[error("`{0}` names no role (expected `coordinator`, `node-<id>` or `cli-<name>`)")]
    UnknownRole(String),
    /// `node-` is not followed by a canonical decimal `u32`.
    #[error("`{0}` has no valid node id (expected `node-<decimal u32>`, no leading zeros)")]
    BadNodeId(String),
    /// The CLI name breaks the [`CliName`] rules.
    #[error(
        "CLI name `{0}` must be 1-{MAX_CLI_NAME_LEN} characters of [a-z0-9-], not starting or ending with `-`"
    )]
    BadCliName(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_and_dns_names_round_trip() {
        for id in [
            Identity::Coordinator,
            Identity::Node(NodeId(0)),
            Identity::Node(NodeId(u32::MAX)),
            Identity::Cli(CliName::new("ops-1").unwrap()),
        ] {
            assert_eq!(id.label().parse::<Identity>().unwrap(), id);
            assert_eq!(Identity::from_dns_name(&id.dns_name()).unwrap(), id);
        }
        assert_eq!(Identity::Node(NodeId(7)).dns_name(), "node-7.nopstream");
    }

    #[test]
    fn malformed_labels_are_refused() {
        for bad in [
            "node-",
            "node-01",
            "node-x",
            "node-4294967296",
            "cli-",
            "cli-A",
            "cli--x",
            "worker-1",
            "",
        ] {
            assert!(bad.parse::<Identity>().is_err(), "{bad:?} parsed");
        }
        assert!(matches!(
            Identity::from_dns_name("node-1.example.com"),
            Err(IdentityParseError::NotClusterName(_))
        ));
        assert!(CliName::new("x".repeat(MAX_CLI_NAME_LEN + 1)).is_err());
    }
}
