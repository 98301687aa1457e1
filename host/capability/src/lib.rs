//! What a host capability shares with the plugin host that serves it (design §16.1).
//!
//! A capability is a WIT interface the host implements for plugins that reach an
//! external system (`nop:postgres/client`, `nop:redis/streams`, `nop:nats/jetstream`). Each
//! lives in its own crate, in the manner of wasmtime's `wasi-keyvalue`:
//!
//! - it owns its per-instance context `C` (granted connections, open sessions, limits),
//!   made by [`Capability::context`] from what the job grants the instance
//!   ([`CapabilityGrants`]);
//! - its `add_to_linker(linker, getter)` adds its imports to a linker of any store type;
//!   the getter hands each host call a [`CapabilityView`] of the instance's context, its
//!   resource table and its host-wait clock, so the capability never names the store type;
//! - the plugin host keeps one context per registered capability in a
//!   [`CapabilityContexts`] table and never names a capability: a build registers its
//!   capabilities in one list (`nop_stream_task::capabilities`).
//!
//! So adding a connector touches its own crate, the job-file schema and its registration
//! (`docs/capabilities.md`: three lines in three files), never the plugin host.

mod grant;

pub use grant::ConnectionGrant;
use nop_stream_api::PluginKind;
use std::any::Any;
use std::time::Duration;
use wasmtime::component::{Linker, ResourceTable};

/// Who an instance serves and the connections the job file grants it: what a capability
/// makes the instance's context from. Instances that serve no operator (a plugin's
/// `describe` at load, state migrations) get no grants and may use no capability.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CapabilityGrants {
    /// The operator's role: a capability decides which roles it serves (the Postgres
    /// client sinks only, the JetStream reader sources only, Redis Streams both).
    pub kind: PluginKind,
    /// `[job] id`.
    pub job: String,
    /// `[job] pipeline`.
    pub pipeline: String,
    /// The operator's stable id (design §3.2).
    pub operator_id: String,
    /// The operator's name in the job file, for messages.
    pub operator: String,
    /// The subtask the instance serves; `None` for a one-off instance of the operator
    /// (split discovery).
    pub subtask: Option<u32>,
    /// The connections granted to the operator (`connections = [..]`), of every kind, in
    /// grant order.
    pub connections: Vec<ConnectionGrant>,
}

/// What a host call of capability context `C` may touch in the instance's store: the
/// context itself, the instance's resource table (for WIT resources such as a Postgres
/// session), the clock of time spent waiting on the outside world, and the instance's
/// label for logs.
pub struct CapabilityView<'a, C> {
    /// The instance's context of this capability.
    pub ctx: &'a mut C,
    /// The instance's resource table.
    pub table: &'a mut ResourceTable,
    /// Wall-clock time this guest call spent blocked in host calls that wait on an
    /// external system. Add to it: it is granted back against the call's CPU budget
    /// (`cpu_ms_per_call`), so a slow database never traps a plugin.
    pub host_wait: &'a mut Duration,
    /// `plugin `x` (operator `y`, subtask n)`, for log lines.
    pub label: &'a str,
}

/// A store that keeps capability contexts: the plugin host's store data.
pub trait CapabilityStore: Send + 'static {
    /// The view of this instance's context of type `C`; a default context (one that
    /// grants nothing) if the instance has none.
    fn capability<C: Default + Send + 'static>(&mut self) -> CapabilityView<'_, C>;
}

/// A capability as the plugin host registers it, for store type `T`.
pub trait Capability<T>: Send + Sync + 'static {
    /// The WIT interface it implements, with its version (`nop:postgres/client@0.1.1`).
    fn interface(&self) -> &'static str;

    /// Adds the interface's imports to `linker`. Every component is linked with every
    /// registered capability; only an instance whose context grants it can use one.
    ///
    /// # Errors
    /// wasmtime's, when the interface is already defined in `linker`.
    fn add_to_linker(&self, linker: &mut Linker<T>) -> wasmtime::Result<()>;

    /// The context of a new instance with `grants` (`None`: an instance that serves no
    /// operator), boxed for the instance's [`CapabilityContexts`].
    fn context(&self, grants: Option<&CapabilityGrants>) -> Box<dyn Any + Send>;
}

/// The capability contexts of one instance, one per capability type.
#[derive(Default)]
pub struct CapabilityContexts {
    contexts: Vec<Box<dyn Any + Send>>,
}

impl std::fmt::Debug for CapabilityContexts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CapabilityContexts")
            .field("contexts", &self.contexts.len())
            .finish()
    }
}

impl CapabilityContexts {
    /// Adds a context; one of a type already held replaces it.
    pub fn insert(&mut self, context: Box<dyn Any + Send>) {
        let ty = (*context).type_id();
        self.contexts.retain(|c| (**c).type_id() != ty);
        self.contexts.push(context);
    }

    /// The context of type `C`, a default one inserted first if there is none.
    pub fn get_or_default<C: Default + Send + 'static>(&mut self) -> &mut C {
        let at = match self.contexts.iter().position(|c| c.is::<C>()) {
            Some(at) => at,
            None => {
                self.contexts.push(Box::new(C::default()));
                self.contexts.len() - 1
            }
        };
        self.contexts[at]
            .downcast_mut::<C>()
            .expect("found by its type")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Default, Debug, PartialEq)]
    struct A(u32);
    #[derive(Default, Debug, PartialEq)]
    struct B(&'static str);

    #[test]
    fn contexts_are_kept_one_per_type() {
        let mut t = CapabilityContexts::default();
        t.insert(Box::new(A(1)));
        t.insert(Box::new(B("b")));
        t.insert(Box::new(A(2)));
        assert_eq!(t.get_or_default::<A>(), &A(2));
        assert_eq!(t.get_or_default::<B>(), &B("b"));
        t.get_or_default::<A>().0 = 7;
        assert_eq!(t.get_or_default::<A>(), &A(7));
        assert_eq!(t.contexts.len(), 2);
    }

    #[test]
    fn a_missing_context_is_the_default() {
        let mut t = CapabilityContexts::default();
        assert_eq!(t.get_or_default::<A>(), &A(0));
        assert_eq!(t.contexts.len(), 1);
    }
}
