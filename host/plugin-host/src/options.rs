//! How to build one plugin instance: its site, limits, directories, keyed state and
//! capability grants.

use crate::error::Site;
use crate::limits::Limits;
use nop_stream_capability::CapabilityGrants;
use nop_stream_state::StateConfig;
use std::path::PathBuf;

/// A directory granted to an instance (a WASI preopen).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirGrant {
    /// Host directory (must exist).
    pub host: PathBuf,
    /// Path the guest sees.
    pub guest: String,
    /// Whether the guest may write.
    pub writable: bool,
}

/// How to build one instance.
#[derive(Debug, Clone)]
pub struct InstanceOptions {
    /// Who the instance is, for messages.
    pub site: Site,
    /// Sandbox limits.
    pub limits: Limits,
    /// Preopened directories; nothing else of the host filesystem is visible.
    pub grants: Vec<DirGrant>,
    /// Keyed state of the operator subtask, if the operator declares states.
    pub state: Option<StateConfig>,
    /// The operator the instance serves and the connections the job grants it, from
    /// which every registered host capability makes the instance's context (design
    /// §16.1); `None` for an instance that serves no operator (it can use none).
    pub capabilities: Option<CapabilityGrants>,
}

impl InstanceOptions {
    /// Options of an instance that serves no operator (a `describe` at load, a state
    /// migration): default limits, no directories, no state, no capability.
    pub fn unserving(site: Site) -> Self {
        InstanceOptions {
            site,
            limits: Limits::default(),
            grants: Vec::new(),
            state: None,
            capabilities: None,
        }
    }
}
