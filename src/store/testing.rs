//! A store for tests that need to see or disturb what a store does: the memory store,
//! recording every value written with `put`, whose next renewals fail on demand.

use super::memory::MemoryStore;
use super::{Over, Put, Store, StoreError, StoreFuture, Token, Value, Watch};
use bytes::Bytes;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

#[derive(Default)]
pub struct Hooked {
    pub inner: MemoryStore,
    /// Every `put`, in order.
    puts: Mutex<Vec<(Box<str>, Bytes)>>,
    /// The next this many renewals fail with a store error.
    pub renew_errors: AtomicU32,
    /// The next this many reads (`get`) fail, as with a store that is down.
    pub read_errors: AtomicU32,
    /// The next this many reads fail for good ([`StoreError::lasting`]), as with a value
    /// planted under the key that is not one of ours.
    pub unreadable: AtomicU32,
    /// The next this many writes (`put_for`, `delete`) fail without writing, as with a
    /// store that is down.
    pub write_errors: AtomicU32,
    /// The next this many writes (`put_for`, `delete`) are done but answer an error, as
    /// one whose answer came too late.
    pub late_answers: AtomicU32,
    /// The next this many writes (`put_for`, `delete`) land, and answer, only after
    /// [`SLOW_WRITE`], as on a store that is slow for a moment.
    pub slow_writes: AtomicU32,
}

/// How long a slow write (see [`Hooked::slow_writes`]) is in flight.
pub const SLOW_WRITE: Duration = Duration::from_millis(600);

/// Takes one from `n` if it is not 0.
fn take_one(n: &AtomicU32) -> bool {
    n.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
        .is_ok()
}

/// A failed operation: surely not done, or (`maybe_done`) done without an answer.
fn refused<'a, T: 'a>(message: &str, maybe_done: bool) -> StoreFuture<'a, T> {
    let error = StoreError {
        maybe_done,
        ..StoreError::new(message.to_owned())
    };
    Box::pin(std::future::ready(Err(error)))
}

/// `done` unless the next write is to fail (see [`Hooked::write_errors`] and
/// [`Hooked::late_answers`]).
/// (`write` is called only when the write is to be done: the memory store writes at once.)
fn hooked<'a, T: 'a>(
    store: &'a Hooked,
    write: impl FnOnce() -> StoreFuture<'a, T> + 'a,
) -> StoreFuture<'a, T> {
    if take_one(&store.write_errors) {
        return refused("not connected", false);
    }
    if take_one(&store.slow_writes) {
        return Box::pin(async move {
            tokio::time::sleep(SLOW_WRITE).await;
            write().await
        });
    }
    let done = write();
    if take_one(&store.late_answers) {
        return Box::pin(async move {
            let _ = done.await;
            refused::<T>("no answer in time", true).await
        });
    }
    done
}

impl Hooked {
    /// Every value `put` under `key`, in order.
    pub fn put_under(&self, key: &str) -> Vec<Bytes> {
        let puts = self.puts.lock().unwrap_or_else(|e| e.into_inner());
        puts.iter()
            .filter(|(k, _)| &**k == key)
            .map(|(_, v)| v.clone())
            .collect()
    }
}

impl Store for Hooked {
    fn get<'a>(&'a self, key: &'a str) -> StoreFuture<'a, Option<Value>> {
        if take_one(&self.read_errors) {
            return refused("not connected", false);
        }
        if take_one(&self.unreadable) {
            let error = StoreError::lasting("a value of another type".to_owned());
            return Box::pin(std::future::ready(Err(error)));
        }
        self.inner.get(key)
    }
    fn put<'a>(&'a self, key: &'a str, bytes: Bytes) -> StoreFuture<'a, u64> {
        let mut puts = self.puts.lock().unwrap_or_else(|e| e.into_inner());
        puts.push((Box::from(key), bytes.clone()));
        drop(puts);
        self.inner.put(key, bytes)
    }
    fn put_for<'a>(
        &'a self,
        key: &'a str,
        bytes: Bytes,
        ttl: Duration,
        over: Over,
    ) -> StoreFuture<'a, Put> {
        hooked(self, move || self.inner.put_for(key, bytes, ttl, over))
    }
    fn bury<'a>(
        &'a self,
        key: &'a str,
        ttl: Duration,
        version: Option<u64>,
    ) -> StoreFuture<'a, bool> {
        hooked(self, move || self.inner.bury(key, ttl, version))
    }
    fn delete<'a>(&'a self, key: &'a str) -> StoreFuture<'a, bool> {
        hooked(self, move || self.inner.delete(key))
    }
    fn lock<'a>(&'a self, key: &'a str, ttl: Duration) -> StoreFuture<'a, Option<Token>> {
        self.inner.lock(key, ttl)
    }
    fn renew<'a>(&'a self, key: &'a str, token: &'a Token, ttl: Duration) -> StoreFuture<'a, bool> {
        if take_one(&self.renew_errors) {
            return refused("no answer in time", true);
        }
        self.inner.renew(key, token, ttl)
    }
    fn unlock<'a>(&'a self, key: &'a str, token: &'a Token) -> StoreFuture<'a, bool> {
        self.inner.unlock(key, token)
    }
    fn watch(&self, key: &str) -> Result<Watch, StoreError> {
        self.inner.watch(key)
    }
}
