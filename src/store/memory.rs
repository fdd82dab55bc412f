//! The embedded store (`type: memory`): one per `stores:` entry, shared by every worker of
//! the process.
//!
//! Reads are lock-free: the values live in an immutable snapshot (a map of `Bytes`) behind
//! an `ArcSwap`; `get` loads the current snapshot and clones the value's `Bytes` (a
//! reference count). A write copies the small map, changes it and publishes the new
//! snapshot in one atomic swap, so a reader sees a whole old value or a whole new one.
//! Writers take a mutex among themselves (writes are rare: hydration), never readers.
//!
//! Leases are a mutex-guarded map of (token, expiry); they expire by the store's clock, so
//! a holder whose worker is stuck loses its lease however stuck it is. Watches are one
//! `tokio::sync::watch` channel per key: each worker's watcher task waits on its own
//! receiver and is woken on its own event loop, once per change however many of its
//! sessions care.

use super::{Clock, StoreError, StoreFuture, SystemClock, Token, Value, Watch};
use crate::limits::MEMORY_STORE_KEYS_MAX;
use arc_swap::ArcSwap;
use bytes::Bytes;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// A held lease.
struct Lease {
    token: Token,
    expires: Instant,
}

/// A value and, if it was written with a time to live ([`super::Store::put_for`]), when
/// it is gone (it reads as absent from then on, and is dropped by the next write that
/// needs its room).
#[derive(Clone)]
struct Stored {
    value: Value,
    until: Option<Instant>,
}

/// The process-wide in-memory store.
pub struct MemoryStore {
    /// The values. Invariant: `len() <= MEMORY_STORE_KEYS_MAX`.
    values: ArcSwap<HashMap<Box<str>, Stored>>,
    /// Serializes writers (copy, change, swap); readers never take it.
    writing: Mutex<()>,
    /// The last version given out.
    version: AtomicU64,
    /// Invariant: `len() <= MEMORY_STORE_KEYS_MAX`.
    leases: Mutex<HashMap<Box<str>, Lease>>,
    /// Invariant: `len() <= MEMORY_STORE_KEYS_MAX`.
    watches: Mutex<HashMap<Box<str>, watch::Sender<u64>>>,
    clock: Arc<dyn Clock>,
}

impl Default for MemoryStore {
    fn default() -> Self {
        MemoryStore::with_clock(Arc::new(SystemClock))
    }
}

/// A mutex's guard whatever a panicking holder left (every critical section here leaves
/// its map consistent, and panics abort the process anyway).
fn guard<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn full() -> StoreError {
    StoreError {
        message: format!("memory store full ({MEMORY_STORE_KEYS_MAX} keys)"),
    }
}

impl MemoryStore {
    /// An empty store whose leases expire by `clock`.
    pub fn with_clock(clock: Arc<dyn Clock>) -> MemoryStore {
        MemoryStore {
            values: ArcSwap::from_pointee(HashMap::new()),
            writing: Mutex::new(()),
            version: AtomicU64::new(0),
            leases: Mutex::new(HashMap::new()),
            watches: Mutex::new(HashMap::new()),
            clock,
        }
    }

    /// The value of `key` now, without waiting: lock-free, no copy.
    pub fn get_now(&self, key: &str) -> Option<Value> {
        let values = self.values.load();
        let stored = values.get(key)?;
        if stored.until.is_some_and(|until| until <= self.clock.now()) {
            return None;
        }
        Some(stored.value.clone())
    }

    /// Writes `bytes` under `key` (or removes it) and wakes its watchers.
    /// `until`: when a written value is gone (`None`: never).
    fn write(
        &self,
        key: &str,
        bytes: Option<Bytes>,
        until: Option<Instant>,
    ) -> Result<Option<u64>, StoreError> {
        let version = {
            let _turn = guard(&self.writing);
            let current = self.values.load();
            let mut next = HashMap::clone(&current);
            if bytes.is_some() && !next.contains_key(key) && next.len() >= MEMORY_STORE_KEYS_MAX {
                let now = self.clock.now();
                next.retain(|_, stored| stored.until.is_none_or(|until| until > now));
                if next.len() >= MEMORY_STORE_KEYS_MAX {
                    return Err(full());
                }
            }
            let version = self.version.fetch_add(1, Ordering::AcqRel) + 1;
            let changed = match bytes {
                Some(bytes) => {
                    let value = Value { bytes, version };
                    next.insert(Box::from(key), Stored { value, until });
                    true
                }
                None => next.remove(key).is_some(),
            };
            if !changed {
                return Ok(None);
            }
            self.values.store(Arc::new(next));
            version
        };
        if let Some(tx) = guard(&self.watches).get(key) {
            tx.send_replace(version);
        }
        Ok(Some(version))
    }

    /// Writes `bytes` under `key` only if a value is there now (atomically: writers are
    /// serialized); `None` if there was none.
    fn write_over(
        &self,
        key: &str,
        bytes: Bytes,
        until: Instant,
    ) -> Result<Option<u64>, StoreError> {
        let version = {
            let _turn = guard(&self.writing);
            let current = self.values.load();
            let now = self.clock.now();
            let present = current
                .get(key)
                .is_some_and(|stored| stored.until.is_none_or(|u| u > now));
            if !present {
                return Ok(None);
            }
            let mut next = HashMap::clone(&current);
            let version = self.version.fetch_add(1, Ordering::AcqRel) + 1;
            let value = Value { bytes, version };
            next.insert(
                Box::from(key),
                Stored {
                    value,
                    until: Some(until),
                },
            );
            self.values.store(Arc::new(next));
            version
        };
        if let Some(tx) = guard(&self.watches).get(key) {
            tx.send_replace(version);
        }
        Ok(Some(version))
    }

    fn lock_now(&self, key: &str, ttl: Duration) -> Result<Option<Token>, StoreError> {
        let now = self.clock.now();
        let mut leases = guard(&self.leases);
        if let Some(lease) = leases.get(key)
            && lease.expires > now
        {
            return Ok(None);
        }
        if !leases.contains_key(key) && leases.len() >= MEMORY_STORE_KEYS_MAX {
            return Err(full());
        }
        let token = Token(new_token()?);
        leases.insert(
            Box::from(key),
            Lease {
                token: token.clone(),
                expires: now + ttl,
            },
        );
        Ok(Some(token))
    }

    fn renew_now(&self, key: &str, token: &Token, ttl: Duration) -> bool {
        let now = self.clock.now();
        let mut leases = guard(&self.leases);
        match leases.get_mut(key) {
            // An expired lease is lost even if nobody took it yet: its holder may have been
            // stuck, and must not go on as if it had held the lease all along.
            Some(lease) if lease.token == *token && lease.expires > now => {
                lease.expires = now + ttl;
                true
            }
            _ => false,
        }
    }

    fn unlock_now(&self, key: &str, token: &Token) -> bool {
        let mut leases = guard(&self.leases);
        if leases.get(key).is_some_and(|l| l.token == *token) {
            leases.remove(key);
            return true;
        }
        false
    }

    fn watch_now(&self, key: &str) -> Result<Watch, StoreError> {
        let mut watches = guard(&self.watches);
        if let Some(tx) = watches.get(key) {
            return Ok(Watch::new(tx.subscribe()));
        }
        if watches.len() >= MEMORY_STORE_KEYS_MAX {
            // Keys nobody watches any more make room.
            watches.retain(|_, tx| tx.receiver_count() > 0);
        }
        if watches.len() >= MEMORY_STORE_KEYS_MAX {
            return Err(full());
        }
        let version = self.get_now(key).map_or(0, |v| v.version);
        let (tx, rx) = watch::channel(version);
        watches.insert(Box::from(key), tx);
        Ok(Watch::new(rx))
    }
}

/// 128 random bits for a lease token.
pub(super) fn new_token() -> Result<u128, StoreError> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).map_err(|e| StoreError {
        message: format!("no entropy for a lease token: {e}"),
    })?;
    Ok(u128::from_le_bytes(bytes))
}

impl super::Store for MemoryStore {
    fn get<'a>(&'a self, key: &'a str) -> StoreFuture<'a, Option<Value>> {
        Box::pin(std::future::ready(Ok(self.get_now(key))))
    }

    fn put<'a>(&'a self, key: &'a str, bytes: Bytes) -> StoreFuture<'a, u64> {
        let written = self
            .write(key, Some(bytes), None)
            .map(|v| v.unwrap_or_else(|| self.version.load(Ordering::Acquire)));
        Box::pin(std::future::ready(written))
    }

    fn put_for<'a>(
        &'a self,
        key: &'a str,
        bytes: Bytes,
        ttl: Duration,
        existing_only: bool,
    ) -> StoreFuture<'a, Option<u64>> {
        let until = self.clock.now() + ttl;
        let written = if existing_only {
            self.write_over(key, bytes, until)
        } else {
            self.write(key, Some(bytes), Some(until))
                .map(|v| Some(v.unwrap_or_else(|| self.version.load(Ordering::Acquire))))
        };
        Box::pin(std::future::ready(written))
    }

    fn delete<'a>(&'a self, key: &'a str) -> StoreFuture<'a, bool> {
        Box::pin(std::future::ready(
            self.write(key, None, None).map(|v| v.is_some()),
        ))
    }

    fn lock<'a>(&'a self, key: &'a str, ttl: Duration) -> StoreFuture<'a, Option<Token>> {
        Box::pin(std::future::ready(self.lock_now(key, ttl)))
    }

    fn renew<'a>(&'a self, key: &'a str, token: &'a Token, ttl: Duration) -> StoreFuture<'a, bool> {
        Box::pin(std::future::ready(Ok(self.renew_now(key, token, ttl))))
    }

    fn unlock<'a>(&'a self, key: &'a str, token: &'a Token) -> StoreFuture<'a, bool> {
        Box::pin(std::future::ready(Ok(self.unlock_now(key, token))))
    }

    fn watch(&self, key: &str) -> Result<Watch, StoreError> {
        self.watch_now(key)
    }
}
