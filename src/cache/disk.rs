//! The disk tier (`[cache] disk_path`, nginx's `proxy_cache_path`): behind the memory tier,
//! every stored response is also written to a directory, one file per key ([`super::file`]),
//! bounded in bytes (`disk_max_bytes`, each file counted in whole 4 KiB blocks) and kept
//! across restarts.
//!
//! - **Off the worker threads.** One writer thread per directory does every write, rename,
//!   removal and eviction; a response reaches it through a bounded queue ([`QUEUE_ENTRIES`],
//!   [`QUEUE_BYTES`]) — when the queue is full the response is not written (counted:
//!   `tollgate_cache_disk_writes_total{result="skipped"}`), never waited for. A read (a miss
//!   of the memory tier that the index knows on disk) runs on the runtime's blocking pool.
//! - **Whole or not at all.** A file is written under a temporary name (`….tmp`) and renamed;
//!   its checksum catches what a crash after the rename left (the gateway does not `fsync`,
//!   as nginx does not). A damaged or foreign file is ignored and removed, never served.
//! - **The index** (in memory, one slot per file: its key, tags, size, last use) is rebuilt at
//!   start by the writer thread, one small read per file, while the gateway already serves:
//!   meanwhile a miss of the memory tier reads the key's file directly, and a purge waits for
//!   the index ([`Disk::loaded`]). The least recently used file (written or read from disk) is
//!   removed to make room; a hit of the memory tier does not touch the disk's order.
//! - **Purge and invalidation** mark a slot doomed at once (no read serves it from then on) and
//!   the writer removes its file; a write queued before the removal is dropped.

use std::collections::{BTreeSet, HashMap};
use std::io::{Read as _, Write as _};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::watch;

use super::file;
use super::store::Entry;
use crate::config::DiskConfig;

/// The most responses waiting to be written.
pub const QUEUE_ENTRIES: usize = 256;
/// The most bytes of bodies waiting to be written.
pub const QUEUE_BYTES: u64 = 32 << 20;
/// The unit a file is counted in (a file takes whole blocks of its file system).
const BLOCK: u64 = 4096;

/// Why the disk tier cannot start.
#[derive(Debug, thiserror::Error)]
pub enum DiskError {
    #[error("cannot create or open the directory {path}: {source}")]
    Directory {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot start the disk writer thread: {0}")]
    Thread(std::io::Error),
}

/// A file's weight against `disk_max_bytes`: its length in whole blocks.
fn weight(len: u64) -> u64 {
    len.div_ceil(BLOCK).saturating_mul(BLOCK).max(BLOCK)
}

/// An entry's file id: its name's 128 bits.
fn id_of(key: &str) -> u128 {
    // `name_of` is 32 hex digits: always a u128.
    u128::from_str_radix(&file::name_of(key), 16).unwrap_or_default()
}

/// One file (or one about to be written, or one being removed).
struct Slot {
    key: Box<str>,
    tags: Box<[Box<str>]>,
    /// The weight of the file under the entry's name, when there is one.
    file: Option<u64>,
    /// The queued write that will replace it (its sequence number).
    pending: Option<u64>,
    /// Removed (purged, invalidated, damaged): never read; the writer removes its file.
    doomed: bool,
    /// Its last use, for the LRU order.
    tick: u64,
    /// Changed by every write, removal and completion: a read that started on another
    /// version is not served (its file may be older than what the memory tier holds).
    version: u64,
}

#[derive(Default)]
struct Index {
    slots: HashMap<u128, Slot>,
    /// (tick, id) of every slot with a file and not doomed.
    lru: BTreeSet<(u64, u128)>,
    /// The weights of the files (and of the one being written).
    bytes: u64,
    files: u64,
    /// Doomed slots whose files the writer removes.
    tombstones: Vec<u128>,
    /// The directory was read in full.
    loaded: bool,
    tick: u64,
    seq: u64,
    version: u64,
}

impl Index {
    fn next_tick(&mut self) -> u64 {
        self.tick = self.tick.saturating_add(1);
        self.tick
    }

    fn next_version(&mut self) -> u64 {
        self.version = self.version.wrapping_add(1);
        self.version
    }

    /// Marks `id`'s slot doomed: no read serves it, its queued write is dropped, the writer
    /// removes its file.
    fn doom(&mut self, id: u128) {
        let version = self.next_version();
        let Some(slot) = self.slots.get_mut(&id) else {
            return;
        };
        slot.version = version;
        slot.pending = None;
        if !slot.doomed {
            slot.doomed = true;
            self.lru.remove(&(slot.tick, id));
            self.tombstones.push(id);
        }
    }

    fn gauges(&self) {
        crate::metrics::cache_disk_stored(self.files, self.bytes);
    }
}

struct Shared {
    index: Mutex<Index>,
    max_bytes: AtomicU64,
    queued_bytes: AtomicU64,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Index> {
        // A panic while the index was held leaves it as consistent as each step: go on.
        self.index
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

enum Command {
    Write {
        id: u128,
        seq: u64,
        key: Box<str>,
        entry: Arc<Entry>,
        queued: u64,
    },
    /// Removals to carry out (the tombstones).
    Wake,
}

/// The disk tier of one directory.
pub struct Disk {
    dir: PathBuf,
    shared: Arc<Shared>,
    tx: SyncSender<Command>,
    loaded: watch::Receiver<bool>,
}

impl std::fmt::Debug for Disk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Disk").field("dir", &self.dir).finish()
    }
}

impl Disk {
    /// Opens the directory (created if missing) and starts its writer thread, which reads the
    /// directory into the index first.
    pub fn open(config: &DiskConfig) -> Result<Arc<Disk>, DiskError> {
        let dir = config.path.clone();
        std::fs::create_dir_all(&dir)
            .and_then(|()| std::fs::read_dir(&dir).map(drop))
            .map_err(|source| DiskError::Directory {
                path: dir.clone(),
                source,
            })?;
        // Ticks after every file's modification time (the order the directory is read in).
        let start = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX / 2));
        let shared = Arc::new(Shared {
            index: Mutex::new(Index {
                tick: start,
                ..Index::default()
            }),
            max_bytes: AtomicU64::new(config.max_bytes),
            queued_bytes: AtomicU64::new(0),
        });
        let (tx, rx) = mpsc::sync_channel(QUEUE_ENTRIES);
        let (loaded_tx, loaded) = watch::channel(false);
        let writer = Writer {
            dir: dir.clone(),
            shared: Arc::clone(&shared),
        };
        std::thread::Builder::new()
            .name("tollgate-cache-disk".into())
            .spawn(move || writer.run(rx, loaded_tx))
            .map_err(DiskError::Thread)?;
        Ok(Arc::new(Disk {
            dir,
            shared,
            tx,
            loaded,
        }))
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// A new bound (a reload that changed `disk_max_bytes`): applied at the next write.
    pub fn set_max_bytes(&self, max: u64) {
        self.shared.max_bytes.store(max, Ordering::Relaxed);
    }

    /// Waits until the directory has been read into the index (a purge must see every file).
    pub async fn loaded(&self) {
        let mut rx = self.loaded.clone();
        // An error: the writer thread is gone, nothing more will load.
        let _ = rx.wait_for(|l| *l).await;
    }

    /// (Files, bytes as counted.)
    pub fn usage(&self) -> (u64, u64) {
        let index = self.shared.lock();
        (index.files, index.bytes)
    }

    /// Queues `entry` (stored under `key` in the memory tier) to be written; when the queue is
    /// full it is not (counted), and the disk keeps what it had.
    pub fn store(&self, key: &str, entry: Arc<Entry>) {
        let queued = entry.body.len() as u64 + 1024;
        let before = self
            .shared
            .queued_bytes
            .fetch_add(queued, Ordering::Relaxed);
        if before.saturating_add(queued) > QUEUE_BYTES {
            self.shared
                .queued_bytes
                .fetch_sub(queued, Ordering::Relaxed);
            crate::metrics::cache_disk_write("skipped");
            return;
        }
        let id = id_of(key);
        let mut index = self.shared.lock();
        index.seq = index.seq.wrapping_add(1);
        let seq = index.seq;
        let version = index.next_version();
        let slot = index.slots.entry(id).or_insert_with(|| Slot {
            key: key.into(),
            tags: Box::default(),
            file: None,
            pending: None,
            doomed: false,
            tick: 0,
            version,
        });
        slot.key = key.into();
        slot.tags = entry.tags.clone();
        slot.pending = Some(seq);
        slot.version = version;
        let sent = self.tx.try_send(Command::Write {
            id,
            seq,
            key: key.into(),
            entry,
            queued,
        });
        if let Err(e) = sent {
            self.shared
                .queued_bytes
                .fetch_sub(queued, Ordering::Relaxed);
            if let Some(slot) = index.slots.get_mut(&id) {
                slot.pending = None;
                if slot.file.is_none() && !slot.doomed {
                    index.slots.remove(&id);
                }
            }
            crate::metrics::cache_disk_write(match e {
                TrySendError::Full(_) => "skipped",
                TrySendError::Disconnected(_) => "failed",
            });
        }
    }

    /// The response stored on disk under `key`, read off the worker threads; `None` when
    /// there is none (or its file is damaged: then it is removed).
    pub async fn get(&self, key: &str) -> Option<Entry> {
        self.read(key, true).await
    }

    /// The response stored on disk under `key`, changing nothing: not its place in the LRU
    /// order, not the index, a damaged file left for a read to find (`/-/explain`).
    pub async fn peek(&self, key: &str) -> Option<Entry> {
        self.read(key, false).await
    }

    async fn read(&self, key: &str, touch: bool) -> Option<Entry> {
        let id = id_of(key);
        let version = {
            let index = self.shared.lock();
            match index.slots.get(&id) {
                Some(s) if s.doomed || s.file.is_none() || s.pending.is_some() => return None,
                Some(s) => Some(s.version),
                None if index.loaded => return None,
                // The directory is still being read: the file itself says.
                None => None,
            }
        };
        let path = self.dir.join(file::name_of(key));
        let max = self.shared.max_bytes.load(Ordering::Relaxed);
        let read = tokio::task::spawn_blocking(move || read_file(&path, max)).await;
        let read = match read {
            Ok(r) => r,
            Err(_) => return None,
        };
        if !touch {
            return match read {
                Ok(Some((bytes, _))) => file::decode(bytes)
                    .ok()
                    .filter(|(_, stored)| **stored == *key)
                    .map(|(entry, _)| entry),
                _ => None,
            };
        }
        let mut index = self.shared.lock();
        let (entry, len) = match read {
            Ok(Some((bytes, len))) => match file::decode(bytes) {
                Ok((entry, stored)) if *stored == *key => (entry, len),
                // Another key of the same name (a 128-bit collision): not this one's.
                Ok(_) => return None,
                Err(e) => {
                    tracing::warn!(dir = %self.dir.display(), error = %e, "cache: a damaged file on disk was removed");
                    crate::metrics::cache_disk_read("corrupt");
                    self.doom_read(&mut index, id, key, version);
                    return None;
                }
            },
            Ok(None) | Err(_) => {
                crate::metrics::cache_disk_read("miss");
                if version.is_some() {
                    self.doom_read(&mut index, id, key, version);
                }
                return None;
            }
        };
        let loaded = index.loaded;
        let tick = index.next_tick();
        let clean = |s: &Slot| !s.doomed && s.file.is_some() && s.pending.is_none();
        let served = match index.slots.get_mut(&id) {
            Some(s) if version.is_none_or(|v| v == s.version) && clean(s) => {
                let old = s.tick;
                s.tick = tick;
                index.lru.remove(&(old, id));
                index.lru.insert((tick, id));
                true
            }
            Some(_) => false,
            None if loaded || version.is_some() => false,
            None => {
                // Read before the directory's turn: indexed now.
                let version = index.next_version();
                let w = weight(len);
                index.slots.insert(
                    id,
                    Slot {
                        key: key.into(),
                        tags: entry.tags.clone(),
                        file: Some(w),
                        pending: None,
                        doomed: false,
                        tick,
                        version,
                    },
                );
                index.lru.insert((tick, id));
                index.bytes = index.bytes.saturating_add(w);
                index.files = index.files.saturating_add(1);
                index.gauges();
                true
            }
        };
        if served {
            crate::metrics::cache_disk_read("hit");
            Some(entry)
        } else {
            None
        }
    }

    /// Dooms the file a read of `version` found missing or damaged (unless it changed since).
    fn doom_read(&self, index: &mut Index, id: u128, key: &str, version: Option<u64>) {
        match index.slots.get(&id) {
            Some(s) if version.is_none_or(|v| v == s.version) => index.doom(id),
            Some(_) => return,
            None => {
                if index.loaded {
                    return;
                }
                let v = index.next_version();
                index.slots.insert(id, doomed_slot(key, v));
                index.tombstones.push(id);
            }
        }
        self.wake();
    }

    /// Removes `key`'s file (an unsafe method's invalidation).
    pub fn remove(&self, key: &str) {
        let id = id_of(key);
        let mut index = self.shared.lock();
        if index.slots.contains_key(&id) {
            index.doom(id);
        } else if !index.loaded {
            // Its file may not be indexed yet: the writer removes it by name.
            let v = index.next_version();
            index.slots.insert(id, doomed_slot(key, v));
            index.tombstones.push(id);
        } else {
            return;
        }
        drop(index);
        self.wake();
    }

    /// Removes every file whose key and tags `matches` (wait for [`Disk::loaded`] first, or
    /// files not yet read escape); the keys removed.
    pub fn remove_matching(&self, matches: impl Fn(&str, &[Box<str>]) -> bool) -> Vec<Box<str>> {
        let mut index = self.shared.lock();
        let ids: Vec<u128> = index
            .slots
            .iter()
            .filter(|(_, s)| !s.doomed && (s.file.is_some() || s.pending.is_some()))
            .filter(|(_, s)| matches(&s.key, &s.tags))
            .map(|(id, _)| *id)
            .collect();
        let mut keys = Vec::with_capacity(ids.len());
        for id in ids {
            if let Some(s) = index.slots.get(&id) {
                keys.push(s.key.clone());
            }
            index.doom(id);
        }
        drop(index);
        if !keys.is_empty() {
            self.wake();
        }
        keys
    }

    fn wake(&self) {
        // Full: the writer is busy and removes the tombstones before its next command.
        let _ = self.tx.try_send(Command::Wake);
    }
}

fn doomed_slot(key: &str, version: u64) -> Slot {
    Slot {
        key: key.into(),
        tags: Box::default(),
        file: None,
        pending: None,
        doomed: true,
        tick: 0,
        version,
    }
}

/// A whole file (at most `max` bytes) and its length; `None` when there is none.
fn read_file(path: &Path, max: u64) -> std::io::Result<Option<(Vec<u8>, u64)>> {
    let mut f = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let len = f.metadata()?.len();
    if len > max {
        return Err(std::io::Error::other("larger than the disk tier"));
    }
    let mut bytes = Vec::with_capacity(usize::try_from(len).unwrap_or(0));
    std::io::Read::take(&mut f, max.saturating_add(1)).read_to_end(&mut bytes)?;
    let len = bytes.len() as u64;
    Ok(Some((bytes, len)))
}

/// The writer thread of a directory.
struct Writer {
    dir: PathBuf,
    shared: Arc<Shared>,
}

impl Writer {
    fn run(self, rx: Receiver<Command>, loaded: watch::Sender<bool>) {
        let started = std::time::Instant::now();
        let (files, removed) = self.scan();
        let mut index = self.shared.lock();
        index.loaded = true;
        let evicted = self.evict(&mut index, 0);
        index.gauges();
        drop(index);
        self.unlink(&evicted);
        let _ = loaded.send(true);
        tracing::info!(
            dir = %self.dir.display(),
            files,
            removed,
            evicted = evicted.len(),
            ms = started.elapsed().as_millis() as u64,
            "cache: the disk tier's directory is read"
        );
        loop {
            self.tombstones();
            match rx.recv_timeout(Duration::from_secs(1)) {
                Ok(Command::Write {
                    id,
                    seq,
                    key,
                    entry,
                    queued,
                }) => {
                    self.shared
                        .queued_bytes
                        .fetch_sub(queued, Ordering::Relaxed);
                    self.tombstones();
                    self.write(id, seq, &key, &entry);
                }
                Ok(Command::Wake) | Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => break,
            }
        }
        self.tombstones();
    }

    fn path(&self, id: u128) -> PathBuf {
        self.dir.join(format!("{id:032x}"))
    }

    /// Reads the directory into the index: every entry file's head (its key, tags and
    /// lengths); temporary files (a write a crash cut) and damaged files are removed, other
    /// files left alone. (Files read, files removed.)
    fn scan(&self) -> (u64, u64) {
        let Ok(dir) = std::fs::read_dir(&self.dir) else {
            return (0, 0);
        };
        let (mut files, mut removed) = (0u64, 0u64);
        for item in dir.flatten() {
            let name = item.file_name();
            let Some(name) = name.to_str() else { continue };
            if name.ends_with(".tmp") {
                let _ = std::fs::remove_file(item.path());
                removed += 1;
                continue;
            }
            if !file::is_entry_name(name) {
                continue;
            }
            let Ok(id) = u128::from_str_radix(name, 16) else {
                continue;
            };
            if self.shared.lock().slots.contains_key(&id) {
                // Read, written or removed since the start: known already.
                continue;
            }
            match read_head(&item.path()) {
                Ok((head, len, mtime)) if file::name_of(&head.key) == name => {
                    let mut index = self.shared.lock();
                    if index.slots.contains_key(&id) {
                        continue;
                    }
                    let w = weight(len);
                    let version = index.next_version();
                    index.slots.insert(
                        id,
                        Slot {
                            key: head.key,
                            tags: head.tags,
                            file: Some(w),
                            pending: None,
                            doomed: false,
                            tick: mtime,
                            version,
                        },
                    );
                    index.lru.insert((mtime, id));
                    index.bytes = index.bytes.saturating_add(w);
                    index.files = index.files.saturating_add(1);
                    files += 1;
                }
                Ok(_) | Err(_) => {
                    tracing::warn!(file = %item.path().display(), "cache: a damaged file on disk was removed");
                    let _ = std::fs::remove_file(item.path());
                    removed += 1;
                }
            }
        }
        (files, removed)
    }

    /// Takes the least recently used files out of the index until `room` more bytes fit; the
    /// ids whose files to remove (once the index is released).
    fn evict(&self, index: &mut Index, room: u64) -> Vec<u128> {
        let max = self.shared.max_bytes.load(Ordering::Relaxed);
        let mut out = Vec::new();
        let mut skipped = Vec::new();
        while index.bytes.saturating_add(room) > max {
            let Some((tick, id)) = index.lru.pop_first() else {
                break;
            };
            let Some(slot) = index.slots.get(&id) else {
                continue;
            };
            if slot.pending.is_some() {
                // About to be replaced by its queued write: kept.
                skipped.push((tick, id));
                continue;
            }
            let w = slot.file.unwrap_or(0);
            index.slots.remove(&id);
            index.bytes = index.bytes.saturating_sub(w);
            index.files = index.files.saturating_sub(1);
            out.push(id);
        }
        index.lru.extend(skipped);
        out
    }

    fn unlink(&self, ids: &[u128]) {
        for id in ids {
            let _ = std::fs::remove_file(self.path(*id));
        }
    }

    /// Removes the files of the doomed slots.
    fn tombstones(&self) {
        let ids = std::mem::take(&mut self.shared.lock().tombstones);
        for id in ids {
            let w = {
                let mut index = self.shared.lock();
                match index.slots.get_mut(&id) {
                    Some(s) if s.doomed => s.file.take(),
                    _ => continue,
                }
            };
            let _ = std::fs::remove_file(self.path(id));
            let mut index = self.shared.lock();
            if let Some(w) = w {
                index.bytes = index.bytes.saturating_sub(w);
                index.files = index.files.saturating_sub(1);
            }
            let gone = index
                .slots
                .get(&id)
                .is_some_and(|s| s.doomed && s.pending.is_none() && s.file.is_none());
            if gone {
                index.slots.remove(&id);
            } else if let Some(s) = index.slots.get_mut(&id) {
                // A write was queued since: its file replaces the removed one.
                if s.doomed && s.pending.is_some() {
                    s.doomed = false;
                }
            }
            index.gauges();
        }
    }

    /// Writes the queued write `seq` of `id`, unless removed or replaced since it was queued.
    fn write(&self, id: u128, seq: u64, key: &str, entry: &Entry) {
        let bytes = file::encode(key, entry);
        let w = weight(bytes.len() as u64);
        let max = self.shared.max_bytes.load(Ordering::Relaxed);
        let evicted = {
            let mut index = self.shared.lock();
            if index.slots.get(&id).and_then(|s| s.pending) != Some(seq) {
                return;
            }
            if w > max {
                if let Some(s) = index.slots.get_mut(&id) {
                    s.pending = None;
                    if s.file.is_none() && !s.doomed {
                        index.slots.remove(&id);
                    }
                }
                drop(index);
                crate::metrics::cache_disk_write("skipped");
                return;
            }
            // The file it replaces leaves room too.
            let replaced = index.slots.get(&id).and_then(|s| s.file).unwrap_or(0);
            let evicted = self.evict(&mut index, w.saturating_sub(replaced));
            index.bytes = index.bytes.saturating_add(w);
            evicted
        };
        self.unlink(&evicted);
        let temp = self.dir.join(format!("{id:032x}.{seq}.tmp"));
        let written = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&temp)
            .and_then(|mut f| f.write_all(&bytes))
            .and_then(|()| std::fs::rename(&temp, self.path(id)));
        let mut index = self.shared.lock();
        if let Err(e) = written {
            drop(index);
            let _ = std::fs::remove_file(&temp);
            tracing::warn!(dir = %self.dir.display(), error = %e, "cache: a response could not be written to disk");
            crate::metrics::cache_disk_write("failed");
            let mut index = self.shared.lock();
            index.bytes = index.bytes.saturating_sub(w);
            if let Some(s) = index.slots.get_mut(&id) {
                if s.pending == Some(seq) {
                    s.pending = None;
                    if s.file.is_none() && !s.doomed {
                        index.slots.remove(&id);
                    }
                }
            }
            return;
        }
        let tick = index.next_tick();
        let version = index.next_version();
        let Some(slot) = index.slots.get_mut(&id) else {
            // Only this thread takes slots out: not reached. Counted all the same.
            index.files = index.files.saturating_add(1);
            return;
        };
        let old = slot.file.replace(w);
        let old_tick = slot.tick;
        let current = slot.pending == Some(seq);
        if current {
            slot.pending = None;
            slot.doomed = false;
            slot.tick = tick;
            slot.version = version;
        }
        let listed = !slot.doomed;
        let new_tick = slot.tick;
        match old {
            Some(o) => index.bytes = index.bytes.saturating_sub(o),
            None => index.files = index.files.saturating_add(1),
        }
        index.lru.remove(&(old_tick, id));
        if listed {
            index.lru.insert((new_tick, id));
        }
        index.gauges();
        drop(index);
        crate::metrics::cache_disk_write("written");
    }
}

/// A file's head, length and modification time (µs since the epoch).
fn read_head(path: &Path) -> Result<(file::Head, u64, u64), ()> {
    let mut f = std::fs::File::open(path).map_err(drop)?;
    let meta = f.metadata().map_err(drop)?;
    let len = meta.len();
    let mtime = meta
        .modified()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(0));
    let mut prefix = [0u8; file::PREFIX_LEN];
    f.read_exact(&mut prefix).map_err(drop)?;
    let n = file::head_len(&prefix).map_err(drop)?;
    // The head and the body's length after it.
    let mut start = prefix.to_vec();
    start.resize(file::PREFIX_LEN + n + 8, 0);
    f.read_exact(&mut start[file::PREFIX_LEN..]).map_err(drop)?;
    let head = file::read_head(&start, len).map_err(drop)?;
    Ok((head, len, mtime))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::freshness::Times;
    use bytes::Bytes;

    fn entry(body: usize) -> Arc<Entry> {
        Arc::new(Entry {
            status: http::StatusCode::OK,
            headers: http::HeaderMap::new(),
            body: Bytes::from(vec![b'x'; body]),
            times: Times {
                request: 1,
                response: 2,
            },
            lifetime: 60,
            directives: Default::default(),
            vary: Vec::new(),
            tags: vec![Box::from("t")].into_boxed_slice(),
        })
    }

    fn config(dir: &Path, max: u64) -> DiskConfig {
        DiskConfig {
            path: dir.to_path_buf(),
            max_bytes: max,
        }
    }

    /// Waits for the writer to have nothing queued.
    fn settle(disk: &Disk) {
        for _ in 0..500 {
            let idle = {
                let i = disk.shared.lock();
                i.loaded && i.tombstones.is_empty() && i.slots.values().all(|s| s.pending.is_none())
            };
            if idle && disk.shared.queued_bytes.load(Ordering::Relaxed) == 0 {
                std::thread::sleep(Duration::from_millis(20));
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!("the disk writer never settled");
    }

    fn dir_bytes(dir: &Path) -> (u64, u64) {
        let mut out = (0, 0);
        for f in std::fs::read_dir(dir).unwrap().flatten() {
            out.0 += 1;
            out.1 += f.metadata().unwrap().len();
        }
        out
    }

    #[tokio::test]
    async fn written_kept_across_a_restart_bounded_and_removed() {
        let dir = tempfile::tempdir().unwrap();
        let disk = Disk::open(&config(dir.path(), 1 << 20)).unwrap();
        disk.loaded().await;
        disk.store("http://a/1", entry(100));
        settle(&disk);
        let e = disk.get("http://a/1").await.expect("a hit from disk");
        assert_eq!(e.body.len(), 100);
        assert!(disk.get("http://a/2").await.is_none());
        drop(disk);
        // Reopened: the index is read back.
        let disk = Disk::open(&config(dir.path(), 1 << 20)).unwrap();
        assert!(
            disk.get("http://a/1").await.is_some(),
            "read before the scan"
        );
        disk.loaded().await;
        assert_eq!(disk.usage().0, 1);
        assert!(disk.get("http://a/1").await.is_some());
        // Ten times the bound: never more than it in the directory.
        for i in 0..100 {
            disk.store(&format!("http://a/b{i}"), entry(100_000));
            if i % 10 == 0 {
                settle(&disk);
            }
        }
        settle(&disk);
        let (files, bytes) = dir_bytes(dir.path());
        assert!(bytes <= 1 << 20, "{files} files, {bytes} bytes");
        assert!(files >= 5, "{files} files");
        assert_eq!(disk.usage().0, files);
        // The newest stay, the oldest went.
        assert!(disk.get("http://a/b99").await.is_some());
        assert!(disk.get("http://a/b0").await.is_none());
        // Removed by key, by predicate.
        disk.remove("http://a/b99");
        assert!(disk.get("http://a/b99").await.is_none(), "doomed at once");
        let keys = disk.remove_matching(|k, _| k.starts_with("http://a/b98"));
        assert_eq!(keys, vec![Box::<str>::from("http://a/b98")]);
        settle(&disk);
        assert!(!dir.path().join(file::name_of("http://a/b98")).exists());
        let keys = disk.remove_matching(|_, tags| tags.iter().any(|t| &**t == "t"));
        settle(&disk);
        assert_eq!(keys.len() as u64, files - 2);
        assert_eq!(dir_bytes(dir.path()).0, 0);
        assert_eq!(disk.usage(), (0, 0));
    }

    #[tokio::test]
    async fn damaged_and_temporary_files_are_removed_at_start() {
        let dir = tempfile::tempdir().unwrap();
        let disk = Disk::open(&config(dir.path(), 1 << 20)).unwrap();
        disk.loaded().await;
        disk.store("http://a/good", entry(10));
        disk.store("http://a/cut", entry(10));
        settle(&disk);
        drop(disk);
        let cut = dir.path().join(file::name_of("http://a/cut"));
        let bytes = std::fs::read(&cut).unwrap();
        std::fs::write(&cut, &bytes[..bytes.len() - 3]).unwrap();
        std::fs::write(dir.path().join("0123456789abcdef0123456789abcdef"), b"junk").unwrap();
        std::fs::write(
            dir.path().join("0123456789abcdef0123456789abcdef.7.tmp"),
            b"x",
        )
        .unwrap();
        std::fs::write(dir.path().join("README"), b"not ours").unwrap();
        let disk = Disk::open(&config(dir.path(), 1 << 20)).unwrap();
        disk.loaded().await;
        assert_eq!(disk.usage().0, 1);
        assert!(disk.get("http://a/good").await.is_some());
        assert!(disk.get("http://a/cut").await.is_none());
        let mut names: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .flatten()
            .map(|f| f.file_name().into_string().unwrap())
            .collect();
        names.sort();
        let mut want = vec!["README".to_owned(), file::name_of("http://a/good")];
        want.sort();
        assert_eq!(names, want);
        // A file damaged after the start: found when read, removed.
        let good = dir.path().join(file::name_of("http://a/good"));
        let mut bytes = std::fs::read(&good).unwrap();
        let at = bytes.len() - 6;
        bytes[at] ^= 1;
        std::fs::write(&good, bytes).unwrap();
        assert!(disk.get("http://a/good").await.is_none());
        settle(&disk);
        assert!(!good.exists());
    }

    #[tokio::test]
    async fn a_removal_drops_a_write_queued_before_it() {
        let dir = tempfile::tempdir().unwrap();
        let disk = Disk::open(&config(dir.path(), 1 << 20)).unwrap();
        // Queued while the directory is read (the writer takes commands after the scan).
        disk.store("http://a/x", entry(10));
        disk.remove("http://a/x");
        disk.loaded().await;
        settle(&disk);
        assert!(disk.get("http://a/x").await.is_none());
        assert!(!dir.path().join(file::name_of("http://a/x")).exists());
    }
}
