//! Certificate refusals, named on both sides of a connection (design §2.5, "Transport").
//!
//! With TLS 1.3 mutual authentication a refused client learns of it only when its first
//! read fails (notes P8), and quinn reports that as "connection lost". The reason is still
//! there: the refusing side closes the connection with the TLS alert as a QUIC crypto
//! error and rustls' message as the close reason (a verifier refusal), or with
//! [`crate::ERR_IDENTITY`] and the [`crate::IdentityError`] message (a certificate whose
//! role or name is refused after the handshake). [`classify`] turns a
//! [`quinn::ConnectionError`] into a [`CertRefusal`] naming the problem, on the side that
//! refused and on the side refused.

use std::fmt;

use crate::endpoint::ERR_IDENTITY;

/// What is wrong with a certificate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CertProblem {
    /// Not signed by the cluster's CA (rustls `UnknownIssuer`, or `BadSignature` for a
    /// certificate of another CA with the same name).
    UnknownCa,
    /// Past its validity.
    Expired,
    /// Before its validity.
    NotYetValid,
    /// A role the protocol does not admit (a CLI certificate on the node protocol, a
    /// certificate without the key usage the side needs).
    WrongRole,
    /// Another identity than the one claimed or dialled.
    WrongName,
    /// No certificate was presented.
    NoCertificate,
}

impl CertProblem {
    /// Whether the refusal can end without new certificates: only a certificate not yet
    /// valid becomes valid with time; every other problem repeats on every attempt.
    pub fn heals(self) -> bool {
        self == CertProblem::NotYetValid
    }

    /// The problem's short name, as both sides log it.
    pub fn name(self) -> &'static str {
        match self {
            CertProblem::UnknownCa => "unknown CA",
            CertProblem::Expired => "expired",
            CertProblem::NotYetValid => "not yet valid",
            CertProblem::WrongRole => "wrong role",
            CertProblem::WrongName => "wrong name",
            CertProblem::NoCertificate => "no certificate",
        }
    }

    fn explain(self) -> &'static str {
        match self {
            CertProblem::UnknownCa => "not signed by this cluster's CA",
            CertProblem::Expired => "past its validity",
            CertProblem::NotYetValid => "not valid yet (check the clocks)",
            CertProblem::WrongRole => "its role is not admitted here",
            CertProblem::WrongName => "it names another identity",
            CertProblem::NoCertificate => "none was presented",
        }
    }
}

impl fmt::Display for CertProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.name(), self.explain())
    }
}

/// Whose certificate a refusal is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Whose {
    /// This side's: the peer refused it.
    Ours,
    /// The peer's: this side refused it.
    Theirs,
}

/// A connection refused for a certificate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CertRefusal {
    /// What is wrong.
    pub problem: CertProblem,
    /// Whose certificate.
    pub whose: Whose,
    /// The TLS or identity message it came with.
    pub detail: String,
}

impl fmt::Display for CertRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let whose = match self.whose {
            Whose::Ours => "refused this side's certificate",
            Whose::Theirs => "its certificate was refused here",
        };
        write!(f, "{whose}: {} ({})", self.problem, self.detail)
    }
}

/// TLS alert numbers (RFC 8446 §6) QUIC carries as crypto errors `0x100 + alert`.
const BAD_CERTIFICATE: u8 = 42;
const UNSUPPORTED_CERTIFICATE: u8 = 43;
const CERTIFICATE_EXPIRED: u8 = 45;
const UNKNOWN_CA: u8 = 48;
const DECRYPT_ERROR: u8 = 51;
const CERTIFICATE_REQUIRED: u8 = 116;

/// The problem a refusal's message names, else the one its TLS alert stands for. Pure.
pub fn problem_of(alert: Option<u8>, message: &str) -> Option<CertProblem> {
    let m = message.to_ascii_lowercase();
    let has = |words: &[&str]| words.iter().any(|w| m.contains(w));
    let by_text = if has(&["unknownissuer", "badsignature", "unknown ca"]) {
        Some(CertProblem::UnknownCa)
    } else if has(&["not valid yet", "notvalidyet"]) {
        Some(CertProblem::NotYetValid)
    } else if has(&["certificate expired", "expired"]) {
        Some(CertProblem::Expired)
    } else if has(&["does not admit", "extended key usage", "invalidpurpose"]) {
        Some(CertProblem::WrongRole)
    } else if has(&[
        "claims to be",
        "not valid for name",
        "notvalidforname",
        "no identity name",
        "more than one identity name",
    ]) {
        Some(CertProblem::WrongName)
    } else if has(&["no certificates", "presented no certificate"]) {
        Some(CertProblem::NoCertificate)
    } else {
        None
    };
    by_text.or_else(|| match alert? {
        UNKNOWN_CA | DECRYPT_ERROR => Some(CertProblem::UnknownCa),
        CERTIFICATE_EXPIRED => Some(CertProblem::Expired),
        UNSUPPORTED_CERTIFICATE => Some(CertProblem::WrongRole),
        BAD_CERTIFICATE => Some(CertProblem::WrongName),
        CERTIFICATE_REQUIRED => Some(CertProblem::NoCertificate),
        _ => None,
    })
}

fn alert_of(code: quinn::TransportErrorCode) -> Option<u8> {
    let code = u64::from(code);
    (0x100..=0x1ff)
        .contains(&code)
        .then(|| (code - 0x100) as u8)
}

/// The certificate refusal a connection ended with, if it ended with one: the peer's
/// close carrying a TLS alert or [`ERR_IDENTITY`] (`Whose::Ours`), or this side's own TLS
/// verifier failing (`Whose::Theirs`).
pub fn classify(e: &quinn::ConnectionError) -> Option<CertRefusal> {
    let (alert, message, whose) = match e {
        quinn::ConnectionError::ConnectionClosed(c) => (
            Some(alert_of(c.error_code)?),
            String::from_utf8_lossy(&c.reason).into_owned(),
            Whose::Ours,
        ),
        quinn::ConnectionError::ApplicationClosed(c)
            if c.error_code == quinn::VarInt::from_u32(ERR_IDENTITY) =>
        {
            (
                None,
                String::from_utf8_lossy(&c.reason).into_owned(),
                Whose::Ours,
            )
        }
        quinn::ConnectionError::TransportError(t) => {
            (Some(alert_of(t.code)?), t.reason.clone(), Whose::Theirs)
        }
        _ => return None,
    };
    Some(CertRefusal {
        problem: problem_of(alert, &message)?,
        whose,
        detail: message,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_and_alerts_name_the_problem() {
        for (alert, message, want) in [
            (
                Some(48),
                "invalid peer certificate: UnknownIssuer",
                CertProblem::UnknownCa,
            ),
            (
                Some(51),
                "invalid peer certificate: BadSignature",
                CertProblem::UnknownCa,
            ),
            (
                Some(45),
                "invalid peer certificate: certificate expired: verification time 5 (UNIX), \
                 but certificate is not valid after 4 (1 seconds ago)",
                CertProblem::Expired,
            ),
            (
                Some(45),
                "invalid peer certificate: certificate not valid yet: verification time 4",
                CertProblem::NotYetValid,
            ),
            (
                None,
                "peer 127.0.0.1:1 presents the certificate of cli-ops (role cli), which \
                 protocol nopstream-node/1 does not admit as client (allowed: coordinator, node)",
                CertProblem::WrongRole,
            ),
            (
                None,
                "peer 127.0.0.1:1 claims to be node-2 but its certificate names node-1",
                CertProblem::WrongName,
            ),
            (
                Some(42),
                "invalid peer certificate: certificate not valid for name \"node-2.nopstream\"",
                CertProblem::WrongName,
            ),
            (
                Some(116),
                "peer sent no certificates",
                CertProblem::NoCertificate,
            ),
            (Some(48), "", CertProblem::UnknownCa),
        ] {
            assert_eq!(problem_of(alert, message), Some(want), "{message}");
        }
        assert_eq!(problem_of(None, "stream reset"), None);
        assert_eq!(problem_of(Some(10), "unexpected message"), None);
        assert!(CertProblem::NotYetValid.heals());
        assert!(!CertProblem::UnknownCa.heals() && !CertProblem::Expired.heals());
    }
}
