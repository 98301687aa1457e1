//! The local-directory backend: one file per object under a root directory.
//!
//! - `put` writes a temporary file beside the target (`.<name>.tmp-<pid>-<n>`), fsyncs it,
//!   renames it over the target and fsyncs the directory: a crash leaves the old object
//!   or the new one.
//! - `put_if_absent` writes and fsyncs a temporary file, then hard-links it to the target:
//!   `link(2)` fails with `EEXIST` atomically if the target exists (on every local file
//!   system, and on NFS since v3), so of two concurrent creates exactly one wins; the
//!   loser reads the winner's bytes.
//! - `list` walks the directories below the prefix; files whose name starts with `.`
//!   (temporary files) are never objects.
//! - `delete` removes the file and then every directory left empty up to the root.

use crate::{Created, ErrorKind, ObjectMeta, ObjectStore, ObjectWriter, Result, StoreError};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// Objects as files under a root directory.
#[derive(Debug)]
pub struct LocalDir {
    root: PathBuf,
    label: String,
    tmp_counter: AtomicU64,
}

impl LocalDir {
    /// The store rooted at `root`, which is created if missing.
    ///
    /// # Errors
    /// The root cannot be created, or is not a directory.
    pub fn open(root: impl Into<PathBuf>) -> Result<Self> {
        let root = root.into();
        let label = format!(
            "file://{}",
            std::path::absolute(&root).unwrap_or(root.clone()).display()
        );
        std::fs::create_dir_all(&root).map_err(|e| {
            StoreError::new(
                &label,
                None,
                ErrorKind::NoSuchBucket,
                format!("cannot create the directory: {e}"),
            )
        })?;
        Ok(LocalDir {
            root,
            label,
            tmp_counter: AtomicU64::new(0),
        })
    }

    /// The root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    fn path(&self, name: &str) -> Result<PathBuf> {
        crate::check_name(&self.label, name)?;
        Ok(self.root.join(name))
    }

    fn err(&self, name: &str, e: &std::io::Error) -> StoreError {
        let kind = match e.kind() {
            std::io::ErrorKind::NotFound => ErrorKind::NotFound,
            std::io::ErrorKind::PermissionDenied => ErrorKind::PermissionDenied,
            _ => ErrorKind::Other,
        };
        StoreError::new(&self.label, Some(name), kind, e.to_string())
    }

    /// A fresh temporary file name beside `path` (never listed: it starts with `.`).
    fn tmp_path(&self, path: &Path) -> PathBuf {
        let n = self.tmp_counter.fetch_add(1, Ordering::Relaxed);
        let file = path
            .file_name()
            .map(|f| f.to_string_lossy().into_owned())
            .unwrap_or_default();
        path.with_file_name(format!(".{file}.tmp-{}-{n}", std::process::id()))
    }

    /// Writes `bytes` to a new temporary file beside `path` and fsyncs it.
    fn write_tmp(&self, name: &str, path: &Path, bytes: &[u8]) -> Result<PathBuf> {
        let dir = path.parent().unwrap_or(&self.root);
        std::fs::create_dir_all(dir).map_err(|e| self.err(name, &e))?;
        let tmp = self.tmp_path(path);
        let result = (|| {
            let mut f = std::fs::File::create(&tmp)?;
            f.write_all(bytes)?;
            f.sync_all()
        })();
        if let Err(e) = result {
            let _ = std::fs::remove_file(&tmp);
            return Err(self.err(name, &e));
        }
        Ok(tmp)
    }

    fn list_into(&self, dir: &Path, prefix: &str, out: &mut Vec<ObjectMeta>) -> Result<()> {
        let entries = match std::fs::read_dir(dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(self.err(prefix, &e)),
        };
        for entry in entries {
            let entry = entry.map_err(|e| self.err(prefix, &e))?;
            let file_name = entry.file_name();
            let file_name = file_name.to_string_lossy();
            if file_name.starts_with('.') {
                continue;
            }
            let path = entry.path();
            let rel = path
                .strip_prefix(&self.root)
                .map(|p| p.to_string_lossy().replace(std::path::MAIN_SEPARATOR, "/"))
                .unwrap_or_default();
            let ty = entry.file_type().map_err(|e| self.err(&rel, &e))?;
            if ty.is_dir() {
                // Only descend where names under the directory can start with the prefix.
                let dir_name = format!("{rel}/");
                if dir_name.starts_with(prefix) || prefix.starts_with(&dir_name) {
                    self.list_into(&path, prefix, out)?;
                }
            } else if rel.starts_with(prefix) {
                let size = entry.metadata().map_err(|e| self.err(&rel, &e))?.len();
                out.push(ObjectMeta { name: rel, size });
            }
        }
        Ok(())
    }
}

fn fsync_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}

impl ObjectStore for LocalDir {
    fn describe(&self) -> String {
        self.label.clone()
    }

    fn get(&self, name: &str) -> Result<Vec<u8>> {
        let path = self.path(name)?;
        std::fs::read(&path).map_err(|e| self.err(name, &e))
    }

    fn get_range(&self, name: &str, offset: u64, len: u64) -> Result<Vec<u8>> {
        let path = self.path(name)?;
        let mut f = std::fs::File::open(&path).map_err(|e| self.err(name, &e))?;
        let size = f.metadata().map_err(|e| self.err(name, &e))?.len();
        let end = offset.saturating_add(len);
        let short = |size: u64| {
            StoreError::new(
                &self.label,
                Some(name),
                ErrorKind::ShortRead,
                format!("the object has {size} bytes, bytes {offset}..{end} were asked for"),
            )
        };
        if end > size {
            return Err(short(size));
        }
        f.seek(SeekFrom::Start(offset))
            .map_err(|e| self.err(name, &e))?;
        let mut buf = vec![0; len as usize];
        f.read_exact(&mut buf).map_err(|e| {
            if e.kind() == std::io::ErrorKind::UnexpectedEof {
                short(f.metadata().map_or(0, |m| m.len()))
            } else {
                self.err(name, &e)
            }
        })?;
        Ok(buf)
    }

    fn put(&self, name: &str, bytes: &[u8]) -> Result<()> {
        let path = self.path(name)?;
        let tmp = self.write_tmp(name, &path, bytes)?;
        if let Err(e) = std::fs::rename(&tmp, &path) {
            let _ = std::fs::remove_file(&tmp);
            return Err(self.err(name, &e));
        }
        fsync_dir(path.parent().unwrap_or(&self.root)).map_err(|e| self.err(name, &e))
    }

    fn put_if_absent(&self, name: &str, bytes: &[u8]) -> Result<Created> {
        let path = self.path(name)?;
        let tmp = self.write_tmp(name, &path, bytes)?;
        let linked = std::fs::hard_link(&tmp, &path);
        let _ = std::fs::remove_file(&tmp);
        match linked {
            Ok(()) => {
                fsync_dir(path.parent().unwrap_or(&self.root)).map_err(|e| self.err(name, &e))?;
                Ok(Created::Created)
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(Created::Exists(
                std::fs::read(&path).map_err(|e| self.err(name, &e))?,
            )),
            Err(e) => Err(self.err(name, &e)),
        }
    }

    fn list(&self, prefix: &str) -> Result<Vec<ObjectMeta>> {
        // Start at the deepest directory the prefix names.
        let dir_part = match prefix.rfind('/') {
            Some(i) => &prefix[..i],
            None => "",
        };
        let start = if dir_part.is_empty() {
            self.root.clone()
        } else {
            self.path(dir_part)?
        };
        let mut out = Vec::new();
        self.list_into(&start, prefix, &mut out)?;
        out.sort();
        Ok(out)
    }

    fn delete(&self, name: &str) -> Result<()> {
        let path = self.path(name)?;
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(self.err(name, &e)),
        }
        // Directories left empty go too (a concurrent writer recreates what it needs).
        let mut dir = path.parent();
        while let Some(d) = dir {
            if d == self.root || std::fs::remove_dir(d).is_err() {
                break;
            }
            dir = d.parent();
        }
        Ok(())
    }

    fn writer<'a>(&'a self, name: &str) -> Result<Box<dyn ObjectWriter + 'a>> {
        let path = self.path(name)?;
        let dir = path.parent().unwrap_or(&self.root).to_owned();
        std::fs::create_dir_all(&dir).map_err(|e| self.err(name, &e))?;
        let tmp = self.tmp_path(&path);
        let file = std::fs::File::create(&tmp).map_err(|e| self.err(name, &e))?;
        Ok(Box::new(FileWriter {
            store: self,
            name: name.to_owned(),
            path,
            tmp,
            file: Some(std::io::BufWriter::with_capacity(1 << 20, file)),
        }))
    }
}

/// [`LocalDir`]'s writer: a buffered temporary file beside the target, fsynced and
/// renamed at the finish; removed if dropped unfinished.
struct FileWriter<'a> {
    store: &'a LocalDir,
    name: String,
    path: PathBuf,
    tmp: PathBuf,
    file: Option<std::io::BufWriter<std::fs::File>>,
}

impl ObjectWriter for FileWriter<'_> {
    fn write(&mut self, bytes: &[u8]) -> Result<()> {
        let f = self.file.as_mut().expect("open until finished");
        f.write_all(bytes)
            .map_err(|e| self.store.err(&self.name, &e))
    }

    fn finish(mut self: Box<Self>) -> Result<()> {
        let f = self.file.take().expect("open until finished");
        let f = f
            .into_inner()
            .map_err(|e| self.store.err(&self.name, e.error()))?;
        f.sync_all().map_err(|e| self.store.err(&self.name, &e))?;
        std::fs::rename(&self.tmp, &self.path).map_err(|e| self.store.err(&self.name, &e))?;
        fsync_dir(self.path.parent().unwrap_or(&self.store.root))
            .map_err(|e| self.store.err(&self.name, &e))
    }
}

impl Drop for FileWriter<'_> {
    fn drop(&mut self) {
        if self.file.take().is_some() {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}
