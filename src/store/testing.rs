//! A store for tests that need to see or disturb what a store does: the memory store,
//! recording every value written with `put`, whose next renewals fail on demand.

use super::memory::MemoryStore;
use super::{Store, StoreError, StoreFuture, Token, Value, Watch};
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
        existing_only: bool,
    ) -> StoreFuture<'a, Option<u64>> {
        self.inner.put_for(key, bytes, ttl, existing_only)
    }
    fn delete<'a>(&'a self, key: &'a str) -> StoreFuture<'a, bool> {
        self.inner.delete(key)
    }
    fn lock<'a>(&'a self, key: &'a str, ttl: Duration) -> StoreFuture<'a, Option<Token>> {
        self.inner.lock(key, ttl)
    }
    fn renew<'a>(&'a self, key: &'a str, token: &'a Token, ttl: Duration) -> StoreFuture<'a, bool> {
        let failing = self
            .renew_errors
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
            .is_ok();
        if failing {
            let error = StoreError {
                message: "no answer in time".to_owned(),
            };
            return Box::pin(std::future::ready(Err(error)));
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
