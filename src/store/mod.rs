//! The store: the one thing workers (and, later, nodes) share.
//!
//! [`Store`] is the one cross-worker (and, later, cross-node) abstraction: values by key (`get`, `put`,
//! `delete`; records with a time to live, made, updated and buried in one step each:
//! `put_for`, `bury`), leases (`lock` → a [`Token`], `renew`, `unlock`) that expire by time whatever
//! their holder is doing, and [`Watch`]es that wake a worker's task on that worker's own
//! event loop when a key changes. Every operation is asynchronous and fallible, and leases
//! are tokens with TTLs, so a networked implementation (Redis: `GET`/`SET`, `SET NX PX` with
//! a random token, compare-and-delete/extend scripts, a change channel feeding the
//! watches) fits the same trait.
//!
//! [`memory::MemoryStore`] is the embedded default: process-wide, lock-free for readers.
//! [`redis::RedisStore`] puts the same trait on a Redis server that several nodes share.
//!
//! Flow: the proxy cache's lease holder hydrates lists and `put`s their bytes; every
//! worker `watch`es the keys and `get`s them (a refcount, not a copy) into its own view.

pub mod memory;
pub mod redis;

#[cfg(test)]
mod redis_tests;
#[cfg(test)]
pub mod testing;
#[cfg(test)]
mod tests;

use crate::limits::STORE_WATCH_SWEEP_SPACING;
use bytes::Bytes;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// What a store operation gives back, later.
pub type StoreFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, StoreError>> + 'a>>;

/// A stored value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Value {
    /// The bytes, shared (cloning is a reference count, not a copy).
    pub bytes: Bytes,
    /// Rises with every write to the store: a reader can tell a newer value from an older.
    pub version: u64,
}

/// Proof of holding a lease; only its holder can renew or release it.
#[derive(Clone, PartialEq, Eq)]
pub struct Token(pub(crate) u128);

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // A token is a credential of sorts: it is never printed whole.
        write!(f, "Token({:04x}…)", self.0 >> 112)
    }
}

/// Why a store operation failed (a networked store can; the memory store does not).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoreError {
    /// What went wrong, for logs.
    pub message: String,
    /// The operation may have been done all the same: it went out and its answer did not
    /// come (a timeout, a connection lost under it). False when it surely was not done.
    pub maybe_done: bool,
    /// The store answered, and the same operation will fail the same way again: the value
    /// under the key cannot be read as one of ours (planted by someone else, of another
    /// type, larger than we read), or the answer made no sense. False when the store could
    /// not be reached or did not answer in time, or said it is busy: trying again helps.
    pub lasting: bool,
}

impl StoreError {
    /// An operation that was surely not done, and may work when tried again.
    pub fn new(message: String) -> StoreError {
        StoreError {
            message,
            maybe_done: false,
            lasting: false,
        }
    }

    /// An operation that was surely not done, and will fail again (see `lasting`).
    pub fn lasting(message: String) -> StoreError {
        StoreError {
            lasting: true,
            ..StoreError::new(message)
        }
    }
}

/// Which value [`Store::put_for`] may write over. A *tombstone* ([`Store::bury`]) is what
/// a deleted record leaves for a while, so that no late or stale write makes it again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Over {
    /// Nothing: neither a value nor a tombstone is there (a record being made).
    Nothing,
    /// A value only: not a tombstone, not nothing (a record being updated).
    Value,
}

/// What came of a [`Store::put_for`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Put {
    /// Written, with this version.
    Written(u64),
    /// Not written: nothing was there ([`Over::Value`]).
    Missing,
    /// Not written: a value was there ([`Over::Nothing`]).
    Taken,
    /// Not written: a tombstone was there.
    Buried,
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

/// Wakes its holder when a key changes. Changes coalesce: a watcher that was busy sees the
/// latest version once, not every one in between.
pub struct Watch {
    rx: watch::Receiver<u64>,
}

impl Watch {
    pub(crate) fn new(rx: watch::Receiver<u64>) -> Watch {
        Watch { rx }
    }

    /// Resolves once the key changed since the last call (or since the watch began);
    /// false once the store is gone. Safe to drop while waiting.
    pub async fn changed(&mut self) -> bool {
        self.rx.changed().await.is_ok()
    }
}

/// The cross-worker store.
pub trait Store: Send + Sync {
    /// The value of `key`, if any.
    fn get<'a>(&'a self, key: &'a str) -> StoreFuture<'a, Option<Value>>;
    /// Replaces the value of `key`; returns the new value's version.
    fn put<'a>(&'a self, key: &'a str, bytes: Bytes) -> StoreFuture<'a, u64>;
    /// As [`Store::put`], and the value is gone `ttl` from now unless written again (a
    /// record whose writers may all die, such as a shared session's). Its end is not a
    /// change: watchers are not woken by it. Writes only over what `over` names, checked
    /// and written in one step (no other write comes between); a tombstone is never
    /// written over.
    fn put_for<'a>(
        &'a self,
        key: &'a str,
        bytes: Bytes,
        ttl: Duration,
        over: Over,
    ) -> StoreFuture<'a, Put>;
    /// Replaces the value of `key` with a tombstone that lasts `ttl`, in one step: a
    /// deleted record that must not come back. A tombstone reads as no value
    /// ([`Store::get`]), wakes the key's watchers as a write does, and refuses every
    /// [`Store::put_for`] until it ends. With `version`, only a value of that version is
    /// replaced (a decision taken on a value read earlier holds only if nobody wrote it
    /// since); without, whatever is there (nothing, or another tombstone, included).
    /// True if the tombstone was written.
    fn bury<'a>(
        &'a self,
        key: &'a str,
        ttl: Duration,
        version: Option<u64>,
    ) -> StoreFuture<'a, bool>;
    /// Removes `key`; true if it had a value.
    fn delete<'a>(&'a self, key: &'a str) -> StoreFuture<'a, bool>;
    /// Takes the lease `key` for `ttl` if nobody holds it (or its holder's lease ran out);
    /// `None` if it is held.
    fn lock<'a>(&'a self, key: &'a str, ttl: Duration) -> StoreFuture<'a, Option<Token>>;
    /// Extends the lease `key` to `ttl` from now; false if `token` no longer holds it.
    fn renew<'a>(&'a self, key: &'a str, token: &'a Token, ttl: Duration) -> StoreFuture<'a, bool>;
    /// Gives the lease `key` up; false if `token` did not hold it.
    fn unlock<'a>(&'a self, key: &'a str, token: &'a Token) -> StoreFuture<'a, bool>;
    /// A watch of `key`, waking the calling worker's task on change.
    fn watch(&self, key: &str) -> Result<Watch, StoreError>;
}

/// Whether a full watch table is swept for keys nobody watches any more at this refusal
/// (`refused`: refusals since it last made room): at the first, then once per
/// [`STORE_WATCH_SWEEP_SPACING`]. A sweep is a pass over the whole table under the store's
/// lock, too much to repeat for every new shared session while the table is full.
pub(crate) fn watch_sweep_due(refused: usize) -> bool {
    refused.is_multiple_of(STORE_WATCH_SWEEP_SPACING)
}

/// Where a store reads the time (leases expire by it); tests move it by hand.
pub trait Clock: Send + Sync {
    fn now(&self) -> Instant;
}

/// The monotonic system clock.
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Instant {
        Instant::now()
    }
}
