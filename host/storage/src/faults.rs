//! A fault-injecting wrapper over any [`ObjectStore`] (in the manner of redb's crash tests
//! over a storage backend that can fail or stop mid-write): scripted faults match an
//! operation and a part of the object name, fire a number of times, and model what an
//! object store does to a client.
//!
//! | fault | the write | the caller sees |
//! |---|---|---|
//! | [`Fault::LostAck`] | takes effect | [`ErrorKind::OutcomeUnknown`] |
//! | [`Fault::Unavailable`] (HTTP 503) | does not happen | [`ErrorKind::Unavailable`] |
//! | [`Fault::Conflict`] (HTTP 409) | does not happen | [`ErrorKind::Unavailable`] |
//! | [`Fault::Stall`] (stalled mid-write) | held, lands at [`Faulty::release_stalled`] | [`ErrorKind::OutcomeUnknown`] |
//!
//! Reads and lists can fail with 503s too.

use crate::{Created, ErrorKind, ObjectMeta, ObjectStore, Result, StoreError};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// A fault to inject.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// The write takes effect, its acknowledgement is lost.
    LostAck,
    /// A 503: nothing happens.
    Unavailable,
    /// A 409 (a concurrent operation on the object): nothing happens.
    Conflict,
    /// The write stalls in mid-flight: the caller times out, and the write lands later,
    /// when [`Faulty::release_stalled`] is called (with its own condition then).
    Stall,
}

/// The operations a fault can match.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// `get` and `get_range`.
    Get,
    /// `put` (and a writer's finish).
    Put,
    /// `put_if_absent`.
    PutIfAbsent,
    /// `list`.
    List,
    /// `delete`.
    Delete,
}

#[derive(Debug)]
struct Rule {
    op: Op,
    contains: String,
    left: u32,
    fault: Fault,
}

#[derive(Debug)]
enum Held {
    Put(String, Vec<u8>),
    PutIfAbsent(String, Vec<u8>),
    Delete(String),
}

/// `inner` with scripted faults.
#[derive(Debug)]
pub struct Faulty {
    inner: Arc<dyn ObjectStore>,
    rules: Mutex<Vec<Rule>>,
    held: Mutex<Vec<Held>>,
    injected: AtomicU64,
}

impl Faulty {
    /// `inner` without faults (yet).
    pub fn new(inner: Arc<dyn ObjectStore>) -> Self {
        Faulty {
            inner,
            rules: Mutex::default(),
            held: Mutex::default(),
            injected: AtomicU64::new(0),
        }
    }

    /// The next `times` operations `op` on an object whose name contains `contains` meet
    /// `fault`.
    pub fn inject(&self, op: Op, contains: &str, times: u32, fault: Fault) {
        self.rules
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(Rule {
                op,
                contains: contains.to_owned(),
                left: times,
                fault,
            });
    }

    /// How many faults fired so far.
    pub fn injected(&self) -> u64 {
        self.injected.load(Ordering::SeqCst)
    }

    /// Lets every stalled write land now, in the order they were made; returns what each
    /// conditional one found.
    ///
    /// # Errors
    /// The inner store's failure.
    pub fn release_stalled(&self) -> Result<Vec<Created>> {
        let held: Vec<Held> =
            std::mem::take(&mut *self.held.lock().unwrap_or_else(|p| p.into_inner()));
        let mut out = Vec::new();
        for h in held {
            match h {
                Held::Put(n, b) => self.inner.put(&n, &b)?,
                Held::PutIfAbsent(n, b) => out.push(self.inner.put_if_absent(&n, &b)?),
                Held::Delete(n) => self.inner.delete(&n)?,
            }
        }
        Ok(out)
    }

    fn fault(&self, op: Op, name: &str) -> Option<Fault> {
        let mut rules = self.rules.lock().unwrap_or_else(|p| p.into_inner());
        let r = rules
            .iter_mut()
            .find(|r| r.op == op && r.left > 0 && name.contains(&r.contains))?;
        r.left -= 1;
        self.injected.fetch_add(1, Ordering::SeqCst);
        Some(r.fault)
    }

    fn error(&self, name: &str, fault: Fault) -> StoreError {
        let (kind, message) = match fault {
            Fault::LostAck => (
                ErrorKind::OutcomeUnknown,
                "injected: the acknowledgement was lost",
            ),
            Fault::Unavailable => (ErrorKind::Unavailable, "injected: 503 Service Unavailable"),
            Fault::Conflict => (ErrorKind::Unavailable, "injected: 409 Conflict"),
            Fault::Stall => (
                ErrorKind::OutcomeUnknown,
                "injected: the write stalled and timed out",
            ),
        };
        StoreError::new(self.inner.describe(), Some(name), kind, message)
    }

    /// Runs a write under the faults of `op`.
    fn write<T>(
        &self,
        op: Op,
        name: &str,
        hold: impl FnOnce() -> Held,
        run: impl FnOnce() -> Result<T>,
    ) -> Result<T> {
        match self.fault(op, name) {
            None => run(),
            Some(Fault::LostAck) => {
                run()?;
                Err(self.error(name, Fault::LostAck))
            }
            Some(Fault::Stall) => {
                self.held
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(hold());
                Err(self.error(name, Fault::Stall))
            }
            Some(f) => Err(self.error(name, f)),
        }
    }

    fn read<T>(&self, op: Op, name: &str, run: impl FnOnce() -> Result<T>) -> Result<T> {
        match self.fault(op, name) {
            None => run(),
            Some(f) => Err(self.error(name, f)),
        }
    }
}

impl ObjectStore for Faulty {
    fn describe(&self) -> String {
        self.inner.describe()
    }

    fn get(&self, name: &str) -> Result<Vec<u8>> {
        self.read(Op::Get, name, || self.inner.get(name))
    }

    fn get_range(&self, name: &str, offset: u64, len: u64) -> Result<Vec<u8>> {
        self.read(Op::Get, name, || self.inner.get_range(name, offset, len))
    }

    fn put(&self, name: &str, bytes: &[u8]) -> Result<()> {
        self.write(
            Op::Put,
            name,
            || Held::Put(name.to_owned(), bytes.to_vec()),
            || self.inner.put(name, bytes),
        )
    }

    fn put_if_absent(&self, name: &str, bytes: &[u8]) -> Result<Created> {
        self.write(
            Op::PutIfAbsent,
            name,
            || Held::PutIfAbsent(name.to_owned(), bytes.to_vec()),
            || self.inner.put_if_absent(name, bytes),
        )
    }

    fn list(&self, prefix: &str) -> Result<Vec<ObjectMeta>> {
        self.read(Op::List, prefix, || self.inner.list(prefix))
    }

    fn delete(&self, name: &str) -> Result<()> {
        self.write(
            Op::Delete,
            name,
            || Held::Delete(name.to_owned()),
            || self.inner.delete(name),
        )
    }
}
