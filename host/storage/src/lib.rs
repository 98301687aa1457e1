//! Storage by location (design §6, "Storage by location"): an object store of few
//! operations, opened from a location URL, with three backends written once each.
//!
//! - [`ObjectStore`]: get, get a range, put, put-if-absent (created, or the bytes already
//!   there), list by prefix, delete; and a streaming writer whose object appears whole at
//!   its finish. No rename, no append: everything above is built from these.
//! - [`Location`]: `file:///...` or a plain path, `s3://bucket/prefix` (with an
//!   `endpoint` option), `memory://name` (tests). Credentials come from the environment
//!   only and appear in no `Display` of a location or error.
//! - Backends: [`local::LocalDir`] (the default: fsync, conditional create by hard link),
//!   [`s3::S3Store`] (an S3-compatible store through the `object_store` crate,
//!   `If-None-Match: *`), [`memory::MemStore`]; and [`faults::Faulty`], a wrapper that
//!   injects a lost acknowledgement, a 503, a 409 or a stall in mid-write into any of them.
//! - [`Scoped`]: a store seen under a prefix, so callers name objects relative to their
//!   own part of a location.
//!
//! Object names are `/`-separated relative paths of non-empty components, none `.` or
//! `..` ([`check_name`]); the checkpoint layer (`nop-stream-checkpoint`'s `names`) builds
//! every name it uses.

pub mod conformance;
pub mod faults;
pub mod local;
mod location;
pub mod memory;
pub mod s3;

pub use location::{Location, LocationError};

use std::sync::Arc;

/// What [`ObjectStore::put_if_absent`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Created {
    /// The object did not exist and now holds the bytes written.
    Created,
    /// The object already existed; these are its bytes (which may equal the ones offered:
    /// a retry after a lost acknowledgement finds its own write).
    Exists(Vec<u8>),
}

impl Created {
    /// Whether the object now holds exactly `bytes`: created by this call, or found with
    /// identical bytes (design §6: a retry that finds identical bytes is a success).
    pub fn holds(&self, bytes: &[u8]) -> bool {
        match self {
            Created::Created => true,
            Created::Exists(b) => b == bytes,
        }
    }
}

/// An object listed by [`ObjectStore::list`].
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct ObjectMeta {
    /// Its name, relative to the store (the prefix included).
    pub name: String,
    /// Its size in bytes.
    pub size: u64,
}

/// Why a store operation failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The object does not exist.
    NotFound,
    /// The service is unavailable or overloaded (an HTTP 503, 409 or 429, a refused or
    /// reset connection, a timeout before the request was sent): nothing was written, and
    /// a retry may succeed.
    Unavailable,
    /// A write whose outcome is unknown: it may or may not have taken effect (a lost
    /// acknowledgement, a timeout after the request was sent). Callers resolve it by
    /// reading, or by repeating an idempotent or conditional write.
    OutcomeUnknown,
    /// The credentials were refused or lack permission.
    PermissionDenied,
    /// The bucket (or the root directory) does not exist.
    NoSuchBucket,
    /// The endpoint cannot be reached at all.
    Unreachable,
    /// A read returned fewer bytes than asked (the object is shorter than the range).
    ShortRead,
    /// A bad object name or configuration.
    Invalid,
    /// Anything else (an I/O error of the local file system, an unexpected reply).
    Other,
}

/// A failed store operation. Its message names the location and the object, never a
/// credential.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{location}{}: {message}", object.as_deref().map(|o| format!(": object {o}")).unwrap_or_default())]
pub struct StoreError {
    /// The location, as [`Location`]'s `Display` shows it (no credentials).
    pub location: String,
    /// The object, if the failure concerns one.
    pub object: Option<String>,
    /// What kind of failure.
    pub kind: ErrorKind,
    /// What went wrong, in words.
    pub message: String,
}

impl StoreError {
    /// A failure of `kind` at `location`, concerning `object` if given.
    pub fn new(
        location: impl Into<String>,
        object: Option<&str>,
        kind: ErrorKind,
        message: impl Into<String>,
    ) -> Self {
        StoreError {
            location: location.into(),
            object: object.map(str::to_owned),
            kind,
            message: message.into(),
        }
    }

    /// Whether the object was not found.
    pub fn is_not_found(&self) -> bool {
        self.kind == ErrorKind::NotFound
    }
}

/// Result alias.
pub type Result<T, E = StoreError> = std::result::Result<T, E>;

/// An object store of few operations (design §6). Every write is durable when it returns
/// `Ok` and visible whole or not at all; reads and lists see every write that returned
/// (read-after-write, list-after-write).
pub trait ObjectStore: Send + Sync + std::fmt::Debug {
    /// The store's location, for messages (no credentials).
    fn describe(&self) -> String;

    /// The location of `prefix` in the store, for messages (no credentials). Default:
    /// `<describe>/<prefix>`.
    fn describe_prefix(&self, prefix: &str) -> String {
        let base = self.describe();
        if prefix.is_empty() {
            base
        } else {
            format!("{}/{prefix}", base.trim_end_matches('/'))
        }
    }

    /// The bytes of object `name`.
    ///
    /// # Errors
    /// [`ErrorKind::NotFound`] if it does not exist; other failures.
    fn get(&self, name: &str) -> Result<Vec<u8>>;

    /// `len` bytes of object `name` from `offset`.
    ///
    /// # Errors
    /// [`ErrorKind::NotFound`]; [`ErrorKind::ShortRead`] if the object ends before
    /// `offset + len`; other failures.
    fn get_range(&self, name: &str, offset: u64, len: u64) -> Result<Vec<u8>>;

    /// Writes object `name`, replacing any object of that name atomically.
    ///
    /// # Errors
    /// Failures; [`ErrorKind::OutcomeUnknown`] if it may have been written anyway.
    fn put(&self, name: &str, bytes: &[u8]) -> Result<()>;

    /// Creates object `name` unless it exists (`If-None-Match: *`); linearisable: of two
    /// concurrent creates exactly one returns [`Created::Created`].
    ///
    /// # Errors
    /// Failures; [`ErrorKind::OutcomeUnknown`] if it may have been created anyway (repeat
    /// the call: a retry finds its own bytes).
    fn put_if_absent(&self, name: &str, bytes: &[u8]) -> Result<Created>;

    /// Every object whose name starts with `prefix`, sorted by name.
    ///
    /// # Errors
    /// Failures (not an empty result).
    fn list(&self, prefix: &str) -> Result<Vec<ObjectMeta>>;

    /// Deletes object `name`; deleting an absent object succeeds.
    ///
    /// # Errors
    /// Failures.
    fn delete(&self, name: &str) -> Result<()>;

    /// Opens object `name` to be written in parts: it is durable and visible whole once
    /// [`ObjectWriter::finish`] returns, and absent if the writer is dropped unfinished.
    /// The default collects the parts in memory and [`Self::put`]s them at the finish.
    ///
    /// # Errors
    /// Failures.
    fn writer<'a>(&'a self, name: &str) -> Result<Box<dyn ObjectWriter + 'a>> {
        check_name(&self.describe(), name)?;
        Ok(Box::new(BufferedWriter {
            store: self,
            name: name.to_owned(),
            bytes: Vec::new(),
        }))
    }
}

/// An object being written in parts ([`ObjectStore::writer`]).
pub trait ObjectWriter {
    /// Appends `bytes`.
    ///
    /// # Errors
    /// Failures.
    fn write(&mut self, bytes: &[u8]) -> Result<()>;

    /// Makes the object durable and visible under its name.
    ///
    /// # Errors
    /// Failures.
    fn finish(self: Box<Self>) -> Result<()>;
}

struct BufferedWriter<'a, S: ?Sized> {
    store: &'a S,
    name: String,
    bytes: Vec<u8>,
}

impl<S: ObjectStore + ?Sized> ObjectWriter for BufferedWriter<'_, S> {
    fn write(&mut self, bytes: &[u8]) -> Result<()> {
        self.bytes.extend_from_slice(bytes);
        Ok(())
    }

    fn finish(self: Box<Self>) -> Result<()> {
        self.store.put(&self.name, &self.bytes)
    }
}

/// Checks an object name: non-empty `/`-separated components, none empty, `.` or `..`,
/// no NUL, no leading `/`.
///
/// # Errors
/// [`ErrorKind::Invalid`] naming the object.
pub fn check_name(location: &str, name: &str) -> Result<()> {
    let bad = name.is_empty()
        || name.contains('\0')
        || name
            .split('/')
            .any(|c| c.is_empty() || c == "." || c == "..");
    if bad {
        return Err(StoreError::new(
            location,
            Some(name),
            ErrorKind::Invalid,
            "not a valid object name (non-empty `/`-separated components, none `.` or `..`)",
        ));
    }
    Ok(())
}

/// A store seen under a prefix: object `x` of the scoped store is `prefix/x` of the inner
/// one, and lists return names relative to the prefix.
#[derive(Debug, Clone)]
pub struct Scoped {
    inner: Arc<dyn ObjectStore>,
    /// Empty, or ends with `/`.
    prefix: String,
}

impl Scoped {
    /// `inner` under `prefix` (`""`: all of it; a trailing `/` is added if missing).
    pub fn new(inner: Arc<dyn ObjectStore>, prefix: &str) -> Self {
        let prefix = prefix.trim_matches('/');
        Scoped {
            inner,
            prefix: if prefix.is_empty() {
                String::new()
            } else {
                format!("{prefix}/")
            },
        }
    }

    /// A scope inside this one.
    pub fn scope(&self, sub: &str) -> Scoped {
        Scoped::new(
            Arc::clone(&self.inner),
            &format!("{}{}", self.prefix, sub.trim_matches('/')),
        )
    }

    /// The prefix in the inner store (empty, or ending with `/`).
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The inner store.
    pub fn inner(&self) -> &Arc<dyn ObjectStore> {
        &self.inner
    }

    fn full(&self, name: &str) -> String {
        format!("{}{name}", self.prefix)
    }
}

impl ObjectStore for Scoped {
    fn describe(&self) -> String {
        self.inner
            .describe_prefix(self.prefix.trim_end_matches('/'))
    }

    fn describe_prefix(&self, prefix: &str) -> String {
        let inner = self.prefix.trim_end_matches('/');
        match (inner.is_empty(), prefix.is_empty()) {
            (true, _) => self.inner.describe_prefix(prefix),
            (false, true) => self.inner.describe_prefix(inner),
            (false, false) => self.inner.describe_prefix(&format!("{inner}/{prefix}")),
        }
    }

    fn get(&self, name: &str) -> Result<Vec<u8>> {
        self.inner.get(&self.full(name))
    }

    fn get_range(&self, name: &str, offset: u64, len: u64) -> Result<Vec<u8>> {
        self.inner.get_range(&self.full(name), offset, len)
    }

    fn put(&self, name: &str, bytes: &[u8]) -> Result<()> {
        self.inner.put(&self.full(name), bytes)
    }

    fn put_if_absent(&self, name: &str, bytes: &[u8]) -> Result<Created> {
        self.inner.put_if_absent(&self.full(name), bytes)
    }

    fn list(&self, prefix: &str) -> Result<Vec<ObjectMeta>> {
        let n = self.prefix.len();
        Ok(self
            .inner
            .list(&self.full(prefix))?
            .into_iter()
            .map(|m| ObjectMeta {
                name: m.name[n..].to_owned(),
                size: m.size,
            })
            .collect())
    }

    fn delete(&self, name: &str) -> Result<()> {
        self.inner.delete(&self.full(name))
    }

    fn writer<'a>(&'a self, name: &str) -> Result<Box<dyn ObjectWriter + 'a>> {
        self.inner.writer(&self.full(name))
    }
}

/// Copies every object under `from_prefix` of `from` to the same relative name under
/// `to_prefix` of `to` (a savepoint relocated, design §6: a prefix of objects). Returns
/// the number of objects copied.
///
/// # Errors
/// The first failure.
pub fn copy_prefix(
    from: &dyn ObjectStore,
    from_prefix: &str,
    to: &dyn ObjectStore,
    to_prefix: &str,
) -> Result<usize> {
    let objects = from.list(from_prefix)?;
    for o in &objects {
        let rel = &o.name[from_prefix.len()..];
        to.put(&format!("{to_prefix}{rel}"), &from.get(&o.name)?)?;
    }
    Ok(objects.len())
}
