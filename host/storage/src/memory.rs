//! The in-memory backend: a sorted map behind a mutex. Linearisable by construction, so
//! the conditional-create races that the S3 test server cannot arbitrate (it checks
//! `If-None-Match` without a lock) are tested here and on [`crate::local::LocalDir`].
//!
//! Stores can be named and shared within a process ([`MemStore::named`]): a test opens
//! `memory://NAME` through [`crate::Location`] in the code under test and inspects or
//! damages the same objects.

use crate::{Created, ErrorKind, ObjectMeta, ObjectStore, Result, StoreError};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, OnceLock};

/// Objects in memory.
#[derive(Debug, Default)]
pub struct MemStore {
    name: String,
    objects: Mutex<BTreeMap<String, Vec<u8>>>,
}

fn registry() -> &'static Mutex<HashMap<String, Arc<MemStore>>> {
    static R: OnceLock<Mutex<HashMap<String, Arc<MemStore>>>> = OnceLock::new();
    R.get_or_init(Default::default)
}

impl MemStore {
    /// A new, empty, unnamed store.
    pub fn new() -> Self {
        MemStore {
            name: "memory://".into(),
            objects: Mutex::default(),
        }
    }

    /// The process-wide store named `name` (created empty on first use).
    pub fn named(name: &str) -> Arc<MemStore> {
        let mut r = registry().lock().unwrap_or_else(|p| p.into_inner());
        Arc::clone(r.entry(name.to_owned()).or_insert_with(|| {
            Arc::new(MemStore {
                name: format!("memory://{name}"),
                objects: Mutex::default(),
            })
        }))
    }

    fn objects(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Vec<u8>>> {
        self.objects.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn not_found(&self, name: &str) -> StoreError {
        StoreError::new(
            &self.name,
            Some(name),
            ErrorKind::NotFound,
            "no such object",
        )
    }
}

impl ObjectStore for MemStore {
    fn describe(&self) -> String {
        self.name.clone()
    }

    fn get(&self, name: &str) -> Result<Vec<u8>> {
        crate::check_name(&self.name, name)?;
        self.objects()
            .get(name)
            .cloned()
            .ok_or_else(|| self.not_found(name))
    }

    fn get_range(&self, name: &str, offset: u64, len: u64) -> Result<Vec<u8>> {
        crate::check_name(&self.name, name)?;
        let objects = self.objects();
        let bytes = objects.get(name).ok_or_else(|| self.not_found(name))?;
        let end = offset.saturating_add(len);
        if end > bytes.len() as u64 {
            return Err(StoreError::new(
                &self.name,
                Some(name),
                ErrorKind::ShortRead,
                format!(
                    "the object has {} bytes, bytes {offset}..{end} were asked for",
                    bytes.len()
                ),
            ));
        }
        Ok(bytes[offset as usize..end as usize].to_vec())
    }

    fn put(&self, name: &str, bytes: &[u8]) -> Result<()> {
        crate::check_name(&self.name, name)?;
        self.objects().insert(name.to_owned(), bytes.to_vec());
        Ok(())
    }

    fn put_if_absent(&self, name: &str, bytes: &[u8]) -> Result<Created> {
        crate::check_name(&self.name, name)?;
        let mut objects = self.objects();
        if let Some(existing) = objects.get(name) {
            return Ok(Created::Exists(existing.clone()));
        }
        objects.insert(name.to_owned(), bytes.to_vec());
        Ok(Created::Created)
    }

    fn list(&self, prefix: &str) -> Result<Vec<ObjectMeta>> {
        Ok(self
            .objects()
            .range(prefix.to_owned()..)
            .take_while(|(k, _)| k.starts_with(prefix))
            .map(|(k, v)| ObjectMeta {
                name: k.clone(),
                size: v.len() as u64,
            })
            .collect())
    }

    fn delete(&self, name: &str) -> Result<()> {
        crate::check_name(&self.name, name)?;
        self.objects().remove(name);
        Ok(())
    }
}
