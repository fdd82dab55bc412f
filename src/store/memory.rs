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

use super::{Clock, Over, Put, StoreError, StoreFuture, SystemClock, Token, Value, Watch};
use crate::limits::MEMORY_STORE_KEYS_MAX;
use arc_swap::ArcSwap;
use bytes::Bytes;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
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
    /// A tombstone ([`super::Store::bury`]): reads as no value, and refuses `put_for`.
    buried: bool,
}

/// What a write does to a key, decided from what is there under the writers' turn.
enum Step {
    Set(Stored),
    Remove,
    Keep,
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
    /// Watches refused since the watch table last made room (see
    /// [`super::watch_sweep_due`]); changed under the `watches` lock.
    watch_refusals: AtomicUsize,
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
    StoreError::new(format!("memory store full ({MEMORY_STORE_KEYS_MAX} keys)"))
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
            watch_refusals: AtomicUsize::new(0),
            clock,
        }
    }

    /// The value of `key` now, without waiting: lock-free, no copy.
    pub fn get_now(&self, key: &str) -> Option<Value> {
        let values = self.values.load();
        let stored = values.get(key)?;
        if stored.buried || stored.until.is_some_and(|until| until <= self.clock.now()) {
            return None;
        }
        Some(stored.value.clone())
    }

    /// Changes `key` as `decide` says from what is there now (`None`: nothing, or a value
    /// whose time ran out), in one step (writers take turns), and wakes its watchers if it
    /// changed. `decide` is given the version a written value gets.
    fn change<T>(
        &self,
        key: &str,
        decide: impl FnOnce(Option<&Stored>, u64) -> (Step, T),
    ) -> Result<T, StoreError> {
        let (version, out) = {
            let _turn = guard(&self.writing);
            let current = self.values.load();
            let now = self.clock.now();
            let live = current
                .get(key)
                .filter(|stored| stored.until.is_none_or(|until| until > now));
            // Only writers change the counter, and they take turns.
            let version = self.version.load(Ordering::Acquire) + 1;
            let (step, out) = decide(live, version);
            let next = match step {
                Step::Keep => return Ok(out),
                Step::Remove if !current.contains_key(key) => return Ok(out),
                Step::Remove => {
                    let mut next = HashMap::clone(&current);
                    next.remove(key);
                    next
                }
                Step::Set(stored) => {
                    let mut next = HashMap::clone(&current);
                    if !next.contains_key(key) && next.len() >= MEMORY_STORE_KEYS_MAX {
                        next.retain(|_, stored| stored.until.is_none_or(|until| until > now));
                        if next.len() >= MEMORY_STORE_KEYS_MAX {
                            return Err(full());
                        }
                    }
                    next.insert(Box::from(key), stored);
                    next
                }
            };
            assert!(next.len() <= MEMORY_STORE_KEYS_MAX);
            self.version.store(version, Ordering::Release);
            self.values.store(Arc::new(next));
            (version, out)
        };
        if let Some(tx) = guard(&self.watches).get(key) {
            tx.send_replace(version);
        }
        Ok(out)
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
            let refused = self.watch_refusals.load(Ordering::Relaxed);
            if super::watch_sweep_due(refused) {
                // Keys nobody watches any more make room.
                watches.retain(|_, tx| tx.receiver_count() > 0);
            }
            if watches.len() >= MEMORY_STORE_KEYS_MAX {
                self.watch_refusals
                    .store(refused.wrapping_add(1), Ordering::Relaxed);
                return Err(full());
            }
            self.watch_refusals.store(0, Ordering::Relaxed);
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
    getrandom::fill(&mut bytes)
        .map_err(|e| StoreError::new(format!("no entropy for a lease token: {e}")))?;
    Ok(u128::from_le_bytes(bytes))
}

impl super::Store for MemoryStore {
    fn get<'a>(&'a self, key: &'a str) -> StoreFuture<'a, Option<Value>> {
        Box::pin(std::future::ready(Ok(self.get_now(key))))
    }

    fn put<'a>(&'a self, key: &'a str, bytes: Bytes) -> StoreFuture<'a, u64> {
        let written = self.change(key, |_, version| {
            let value = Value { bytes, version };
            let stored = Stored {
                value,
                until: None,
                buried: false,
            };
            (Step::Set(stored), version)
        });
        Box::pin(std::future::ready(written))
    }

    fn put_for<'a>(
        &'a self,
        key: &'a str,
        bytes: Bytes,
        ttl: Duration,
        over: Over,
    ) -> StoreFuture<'a, Put> {
        let until = Some(self.clock.now() + ttl);
        let written = self.change(key, |there, version| {
            let refused = match (there, over) {
                (Some(stored), _) if stored.buried => Some(Put::Buried),
                (Some(_), Over::Nothing) => Some(Put::Taken),
                (None, Over::Value) => Some(Put::Missing),
                (None, Over::Nothing) | (Some(_), Over::Value) => None,
            };
            if let Some(refused) = refused {
                return (Step::Keep, refused);
            }
            let value = Value { bytes, version };
            let stored = Stored {
                value,
                until,
                buried: false,
            };
            (Step::Set(stored), Put::Written(version))
        });
        Box::pin(std::future::ready(written))
    }

    fn bury<'a>(
        &'a self,
        key: &'a str,
        ttl: Duration,
        version: Option<u64>,
    ) -> StoreFuture<'a, bool> {
        let until = Some(self.clock.now() + ttl);
        let buried = self.change(key, |there, next| {
            let due = match version {
                None => true,
                Some(read) => there.is_some_and(|s| !s.buried && s.value.version == read),
            };
            if !due {
                return (Step::Keep, false);
            }
            let value = Value {
                bytes: Bytes::new(),
                version: next,
            };
            let stored = Stored {
                value,
                until,
                buried: true,
            };
            (Step::Set(stored), true)
        });
        Box::pin(std::future::ready(buried))
    }

    fn delete<'a>(&'a self, key: &'a str) -> StoreFuture<'a, bool> {
        let deleted = self.change(key, |there, _| {
            (Step::Remove, there.is_some_and(|stored| !stored.buried))
        });
        Box::pin(std::future::ready(deleted))
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
