//! The Redis store (`type: redis`): the same [`Store`] as the memory store,
//! on a Redis server that several mcpyard nodes share, so that one node in the cluster
//! hydrates the proxy caches and every node serves them.
//!
//! **Thread.** All network I/O of a store runs on one thread of its own, with its own tokio
//! current-thread runtime: the workers run their own loops (possibly io_uring), and none of
//! them may own the connection (a worker's loop must never wait on Redis, and the
//! connection must outlive any one worker's tasks). A worker's operation is a message on a
//! bounded queue to that thread with a one-shot reply; its [`StoreFuture`] only awaits the
//! reply. A full queue, a Redis that is down or an answer later than
//! [`REDIS_OPERATION_TIMEOUT`] is a [`StoreError`] at once, never a hang. Nothing of this
//! is on an agent's request path: the proxy cache reads the store into each worker's own
//! view when a watch fires, and answers lists from that view. (Handing the workers clones
//! of the multiplexed connection instead would also work, but then the bound on queued
//! operations, the deadline, the metrics and the reaction to a failed connection would be
//! spread over every worker; here they are in one place.) What the thread holds is bounded:
//! the queue, [`REDIS_INFLIGHT_MAX`] operations on the connection, and the subscriber's
//! messages, which redis-rs buffers in a channel of its own that this thread drains as they
//! come (they are small, and come at the rate of writes).
//!
//! **Keys** (all under the configured `prefix`, `mcpyard:` by default, so deployments can
//! share one Redis): `<prefix>value:<key>` holds a value, `<prefix>lease:<key>` a lease,
//! `<prefix>version` the version counter, and `<prefix>changes:<db>` is the channel that
//! tells of every change (pub/sub channels are the same in every database of a server, so
//! the database index is in its name).
//!
//! **Values and versions.** A value is stored as `<version>:<bytes>` (the version in
//! decimal). A small server-side script writes it atomically: it takes the next version
//! from the counter, stores the value behind it and publishes `<version> <key>` on the
//! change channel. Versions rise with every write: the counter is `max(counter + 1, the
//! server's clock in µs)`, so they keep rising even across a Redis restart that lost the
//! counter (no persistence), and a watcher can tell a change from a repeat.
//!
//! **Leases.** `lock` is `SET <lease key> <token> NX PX <ttl>` with a random 128-bit token;
//! `renew` and `unlock` are scripts that compare the token and only then `PEXPIRE` or `DEL`,
//! in one step on the server, so a node that lost its lease (it was stuck past the TTL, and
//! another took it) can never extend or release the new holder's.
//!
//! **Watches.** One pub/sub channel (`<prefix>changes:<db>`) carries every change, rather than
//! keyspace notifications: those need `notify-keyspace-events` set in the server's config,
//! which a managed Redis may not allow and an operator could turn off under us, while
//! `PUBLISH` from the write script needs nothing. The store thread keeps one
//! `tokio::sync::watch` sender per watched key (at most [`REDIS_WATCHES_MAX`]) and sets it to
//! a message's version when that is newer, which wakes each watching worker on its own loop
//! once. Messages sent while the store was not subscribed are lost, so after every
//! (re)connection, once subscribed, it reads every watched key's version again and wakes
//! the watchers of those that differ: no change is missed.
//!
//! **Connection loss.** One task on the store thread connects (a multiplexed command
//! connection and a subscriber connection), pings while connected, and after a loss tries
//! again with exponential backoff from [`REDIS_RECONNECT_MIN`] to [`REDIS_RECONNECT_MAX`].
//! Each change of state is one log line (connected; cannot connect or lost, with the reason;
//! back) and the `mcpyard_store_connected` gauge. While not connected, operations fail at
//! once and the proxy cache keeps serving what it last read.
//!
//! Whatever Redis sends back is outside input: a reply of the wrong type, a value without a
//! version in front, an error text with control bytes, all become a [`StoreError`] (its text
//! cleaned for logs), never a panic.

use super::{Over, Put, Store, StoreError, StoreFuture, Token, Value, Watch};
use crate::config::RedisStore as RedisConfig;
use crate::limits::{
    LOG_FIELD_BYTES_MAX, REDIS_CONNECT_TIMEOUT, REDIS_INFLIGHT_MAX, REDIS_LOST_LEASES_MAX,
    REDIS_OPERATION_TIMEOUT, REDIS_PING_INTERVAL, REDIS_QUEUE_LEN, REDIS_RECONNECT_MAX,
    REDIS_RECONNECT_MIN, REDIS_VALUE_BYTES_MAX, REDIS_WATCHES_MAX,
};
use crate::log;
use crate::metrics::store::{StoreOp, StoreOutcome, StoreStats};
use bytes::Bytes;
use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tokio::sync::{Notify, Semaphore, mpsc, oneshot, watch};

/// What a store publishes on its change channel once per ping interval (see `follow`):
/// not `<version> <key>`, so every node's watches ignore it.
const HEARTBEAT: &str = "heartbeat";

/// The code of the error a read of a value longer than the store reads gets (the first
/// word of the script's error, which redis-rs hands back as the error's code); a macro, so
/// the script's text and the check of its answer share it.
macro_rules! too_large_code {
    () => {
        "TOOLARGE"
    };
}

/// Longest version prefix: `u64::MAX` has 20 digits.
const VERSION_DIGITS_MAX: usize = 20;

/// The Lua that takes the next version from the counter (`KEYS[2]`) into `version`: one
/// more than the last, and never behind the server's clock in microseconds, so versions
/// keep rising after a Redis that restarted empty. Every script that changes a value
/// starts its change with it.
macro_rules! next_version {
    () => {
        r"local version = redis.call('INCR', KEYS[2])
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000000 + tonumber(time[2])
if version < now then
  version = now
  redis.call('SET', KEYS[2], string.format('%.0f', version))
end
"
    };
}

/// Writes a value: the next version, the value behind it, and the change message.
/// KEYS: the value's key, the counter. ARGV: the bytes, the channel, the key as named, the
/// value's time to live in milliseconds (0: for good), and what it may write over: `0`
/// anything, `1` a value only, `2` nothing only. Returns the version, or when it wrote
/// nothing: 0 (nothing was there), -1 (a value was), -2 (a tombstone was). A stored value
/// is never empty (its version is in front), so an empty head is nothing there.
const PUT_SCRIPT: &str = concat!(
    r"
if ARGV[5] ~= '0' then
  local head = redis.call('GETRANGE', KEYS[1], 0, 21)
  if head == '' then
    if ARGV[5] == '1' then return 0 end
  elseif string.match(head, '^%d+!') then
    return -2
  elseif ARGV[5] == '2' then
    return -1
  end
end
",
    next_version!(),
    r"local v = string.format('%.0f', version)
redis.call('SET', KEYS[1], v .. ':')
redis.call('APPEND', KEYS[1], ARGV[1])
if tonumber(ARGV[4]) > 0 then redis.call('PEXPIRE', KEYS[1], ARGV[4]) end
redis.call('PUBLISH', ARGV[2], v .. ' ' .. ARGV[3])
return version
"
);

/// Replaces a value with a tombstone (`<version>!`) for a time, and tells of it.
/// KEYS: the value's key, the counter. ARGV: the channel, the key as named, the time to
/// live in milliseconds, and the version the value must have (empty: any, or none).
/// Returns 1 when the tombstone was written, 0 when the value was not of that version.
const BURY_SCRIPT: &str = concat!(
    r"
if ARGV[4] ~= '' then
  local head = redis.call('GETRANGE', KEYS[1], 0, 21)
  if string.sub(head, 1, string.len(ARGV[4]) + 1) ~= ARGV[4] .. ':' then return 0 end
end
",
    next_version!(),
    r"local v = string.format('%.0f', version)
redis.call('SET', KEYS[1], v .. '!', 'PX', ARGV[3])
redis.call('PUBLISH', ARGV[1], v .. ' ' .. ARGV[2])
return 1
"
);

/// Reads a value, unless it is longer than the store reads (checked before it is sent).
/// KEYS: the value's key. ARGV: the longest value read, version prefix included.
const GET_SCRIPT: &str = concat!(
    r"
if redis.call('STRLEN', KEYS[1]) > tonumber(ARGV[1]) then
  return redis.error_reply('",
    too_large_code!(),
    r" value larger than mcpyard reads')
end
return redis.call('GET', KEYS[1])
"
);

/// The code of the error [`GET_SCRIPT`] answers for a value longer than the store reads.
const TOO_LARGE_TO_READ: &str = too_large_code!();

/// Removes a value (or a tombstone) and, if there was one, tells of it with a new
/// version. KEYS: the value's key, the counter. ARGV: the channel, the key as named.
/// Returns 1 if a value was there, 0 if nothing or a tombstone was.
const DELETE_SCRIPT: &str = concat!(
    r"
local head = redis.call('GETRANGE', KEYS[1], 0, 21)
if redis.call('DEL', KEYS[1]) == 0 then return 0 end
",
    next_version!(),
    r"redis.call('PUBLISH', ARGV[1], string.format('%.0f', version) .. ' ' .. ARGV[2])
if string.match(head, '^%d+!') then return 0 end
return 1
"
);

/// Extends a lease only for the token that holds it. KEYS: the lease. ARGV: token, ms.
const RENEW_SCRIPT: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
";

/// Releases a lease only for the token that holds it. KEYS: the lease. ARGV: token.
const UNLOCK_SCRIPT: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
";

/// A store operation, sent to the store thread.
enum Op {
    Get,
    /// The bytes, how long they live (`None`: for good), and whether only over a value
    /// that is there.
    Put(Bytes, Option<Duration>, Option<Over>),
    /// A tombstone's time to live, and the version the value must have.
    Bury(Duration, Option<u64>),
    Delete,
    /// The lease's TTL and the token to take it with (made by the caller, so a lock whose
    /// answer is lost can still be released).
    Lock(Duration, Token),
    Renew(Token, Duration),
    Unlock(Token),
}

impl Op {
    fn metric(&self) -> StoreOp {
        match self {
            Op::Get => StoreOp::Get,
            Op::Put(..) => StoreOp::Put,
            // A tombstone is how a shared session's record is deleted.
            Op::Delete | Op::Bury(..) => StoreOp::Delete,
            Op::Lock(..) => StoreOp::Lock,
            Op::Renew(..) => StoreOp::Renew,
            Op::Unlock(_) => StoreOp::Unlock,
        }
    }
}

/// What an operation gives back.
enum Reply {
    Value(Option<Value>),
    Put(Put),
    Done(bool),
    Lease(Option<Token>),
}

/// One queued operation: what, on which key, where the answer goes, and by when.
struct Request {
    op: Op,
    key: Box<str>,
    reply: oneshot::Sender<Result<Reply, StoreError>>,
    deadline: Instant,
}

/// Why an operation failed, before it becomes a [`StoreError`].
enum Failure {
    /// Redis answered with an error that may pass (busy, loading, out of memory).
    Error(String),
    /// Redis answered with an error that will come again for the same operation (a key of
    /// another type, a value larger than we read), or the reply made no sense.
    Refused(String),
    /// The connection failed under the operation: the store reconnects.
    Connection(String),
    /// No answer in time.
    Timeout,
    /// Not asked: not connected, or the queue was full.
    Unavailable(&'static str),
}

/// What the workers and the store thread share.
struct Shared {
    /// The store's name in `stores:`, for logs and metrics.
    name: Box<str>,
    /// The configured prefix of every key and of the channel.
    prefix: String,
    /// The database index, part of the channel's name.
    db: u32,
    /// One sender per watched key. Invariant: `len() <= REDIS_WATCHES_MAX`.
    watches: Mutex<HashMap<Box<str>, watch::Sender<u64>>>,
    /// Watches refused since the watch table last made room (see
    /// [`super::watch_sweep_due`]); changed under the `watches` lock.
    watch_refusals: AtomicUsize,
    stats: Arc<StoreStats>,
}

impl Shared {
    fn value_key(&self, key: &str) -> String {
        format!("{}value:{key}", self.prefix)
    }

    fn lease_key(&self, key: &str) -> String {
        format!("{}lease:{key}", self.prefix)
    }

    fn counter_key(&self) -> String {
        format!("{}version", self.prefix)
    }

    fn channel(&self) -> String {
        format!("{}changes:{}", self.prefix, self.db)
    }

    fn error(&self, what: &str) -> StoreError {
        StoreError::new(format!("redis store {}: {what}", self.name))
    }

    /// As [`Shared::error`], for an error that will come again (see
    /// [`StoreError::lasting`]).
    fn refusal(&self, what: &str) -> StoreError {
        StoreError {
            lasting: true,
            ..self.error(what)
        }
    }

    /// As [`Shared::error`], for an operation that went out and got no answer: it may
    /// have been done.
    fn maybe_done(&self, what: &str) -> StoreError {
        StoreError {
            maybe_done: true,
            ..self.error(what)
        }
    }
}

/// A mutex's guard whatever a panicking holder left (every critical section here leaves
/// its map consistent, and panics abort the process anyway).
fn guard<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A store on a Redis server; see the module doc.
pub struct RedisStore {
    shared: Arc<Shared>,
    queue: mpsc::Sender<Request>,
}

impl RedisStore {
    /// Starts the store named `name`: its thread, which connects (and keeps reconnecting)
    /// on its own. Returns an error when the thread or its runtime cannot start, or the
    /// TLS files cannot be read or used; an unreachable Redis is not one (the node serves,
    /// and the store connects when it can).
    pub fn start(name: &str, config: &RedisConfig) -> Result<RedisStore, String> {
        let client = client(config).map_err(|e| format!("redis store {name}: {e}"))?;
        let shared = Arc::new(Shared {
            name: Box::from(name),
            prefix: config.prefix.clone(),
            db: config.url.db,
            watches: Mutex::new(HashMap::new()),
            watch_refusals: AtomicUsize::new(0),
            stats: crate::metrics::store::register(name),
        });
        let (queue, requests) = mpsc::channel(REDIS_QUEUE_LEN);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| format!("redis store {name}: cannot start its event loop: {e}"))?;
        let thread_shared = shared.clone();
        let shown = config.url.shown.clone();
        let (tried, first_try) = std::sync::mpsc::sync_channel(1);
        std::thread::Builder::new()
            .name(format!("mcpyard-store-{name}"))
            .spawn(move || {
                let local = tokio::task::LocalSet::new();
                let serving = serve(client, shown, requests, thread_shared, tried);
                local.block_on(&runtime, serving);
            })
            .map_err(|e| format!("redis store {name}: cannot start its thread: {e}"))?;
        // The workers start next, and their first reads should find the store connected:
        // wait for the first attempt (bounded by its own deadline), whatever its outcome.
        let _ = first_try.recv_timeout(REDIS_CONNECT_TIMEOUT + REDIS_RECONNECT_MIN);
        Ok(RedisStore { shared, queue })
    }

    /// Writes `bytes` under `key`, for good or for `ttl`; with `over`, only over that.
    fn write<'a>(
        &'a self,
        key: &str,
        bytes: Bytes,
        ttl: Option<Duration>,
        over: Option<Over>,
    ) -> StoreFuture<'a, Put> {
        if bytes.len() > REDIS_VALUE_BYTES_MAX {
            let error = self.shared.refusal(&format!(
                "a value of {} bytes, over {REDIS_VALUE_BYTES_MAX}",
                bytes.len()
            ));
            return Box::pin(std::future::ready(Err(error)));
        }
        let call = self.call(Op::Put(bytes, ttl, over), key);
        Box::pin(async move {
            match call.await? {
                Reply::Put(put) => Ok(put),
                _ => Err(self.shared.refusal("mismatched reply")),
            }
        })
    }

    /// Queues `op` on `key` and waits for its answer (bounded: the store thread answers
    /// by the deadline, and the wait here ends a little after it whatever happens).
    fn call<'a>(&'a self, op: Op, key: &str) -> StoreFuture<'a, Reply> {
        let metric = op.metric();
        let (tx, rx) = oneshot::channel();
        let request = Request {
            op,
            key: Box::from(key),
            reply: tx,
            deadline: Instant::now() + REDIS_OPERATION_TIMEOUT,
        };
        let sent = self.queue.try_send(request);
        Box::pin(async move {
            if let Err(e) = sent {
                self.shared
                    .stats
                    .record(metric, StoreOutcome::Unavailable, Duration::ZERO);
                return Err(self.shared.error(match e {
                    mpsc::error::TrySendError::Full(_) => "too many operations queued",
                    mpsc::error::TrySendError::Closed(_) => "its thread has stopped",
                }));
            }
            match tokio::time::timeout(REDIS_OPERATION_TIMEOUT * 2, rx).await {
                Ok(Ok(answer)) => answer,
                Ok(Err(_)) => Err(self.shared.maybe_done("its thread has stopped")),
                Err(_) => Err(self.shared.maybe_done("no answer in time")),
            }
        })
    }
}

/// The redis-rs client: address, database and credentials, and with `tls:` files the CA
/// to trust (in place of the platform's roots) and a client certificate.
fn client(config: &RedisConfig) -> Result<redis::Client, String> {
    let info = connection_info(config).map_err(|e| clean(&e.to_string()))?;
    let tls = &config.tls;
    if tls.ca.is_none() && tls.identity.is_none() {
        return redis::Client::open(info).map_err(|e| clean(&e.to_string()));
    }
    let read = |path: &std::path::Path| {
        std::fs::read(path).map_err(|e| format!("{}: cannot read: {e}", path.display()))
    };
    let root_cert = tls.ca.as_deref().map(read).transpose()?;
    let client_tls = match &tls.identity {
        Some((cert, key)) => Some(redis::ClientTlsConfig {
            client_cert: read(cert)?,
            client_key: read(key)?,
        }),
        None => None,
    };
    let certificates = redis::TlsCertificates {
        client_tls,
        root_cert,
    };
    redis::Client::build_with_tls(info, certificates).map_err(|e| clean(&e.to_string()))
}

/// What redis-rs needs to connect: address, TLS, database, credentials.
fn connection_info(config: &RedisConfig) -> redis::RedisResult<redis::ConnectionInfo> {
    let url = &config.url;
    let addr = if url.tls {
        redis::ConnectionAddr::TcpTls {
            host: url.host.clone(),
            port: url.port,
            insecure: false,
            tls_params: None,
        }
    } else {
        redis::ConnectionAddr::Tcp(url.host.clone(), url.port)
    };
    let mut settings = redis::RedisConnectionInfo::default().set_db(i64::from(url.db));
    if let Some(user) = &url.username {
        settings = settings.set_username(user);
    }
    if let Some(password) = &url.password {
        settings = settings.set_password(password.expose());
    }
    redis::IntoConnectionInfo::into_connection_info(addr)
        .map(|info| info.set_redis_settings(settings))
}

impl Store for RedisStore {
    fn get<'a>(&'a self, key: &'a str) -> StoreFuture<'a, Option<Value>> {
        let call = self.call(Op::Get, key);
        Box::pin(async move {
            match call.await? {
                Reply::Value(v) => Ok(v),
                _ => Err(self.shared.refusal("mismatched reply")),
            }
        })
    }

    fn put<'a>(&'a self, key: &'a str, bytes: Bytes) -> StoreFuture<'a, u64> {
        let write = self.write(key, bytes, None, None);
        Box::pin(async move {
            match write.await? {
                Put::Written(version) => Ok(version),
                _ => Err(self.shared.refusal("mismatched reply")),
            }
        })
    }

    fn put_for<'a>(
        &'a self,
        key: &'a str,
        bytes: Bytes,
        ttl: Duration,
        over: Over,
    ) -> StoreFuture<'a, Put> {
        // At least a millisecond: 0 means "for good" to the script.
        let ttl = ttl.max(Duration::from_millis(1));
        self.write(key, bytes, Some(ttl), Some(over))
    }

    fn bury<'a>(
        &'a self,
        key: &'a str,
        ttl: Duration,
        version: Option<u64>,
    ) -> StoreFuture<'a, bool> {
        let call = self.call(Op::Bury(ttl, version), key);
        Box::pin(async move {
            match call.await? {
                Reply::Done(d) => Ok(d),
                _ => Err(self.shared.refusal("mismatched reply")),
            }
        })
    }

    fn delete<'a>(&'a self, key: &'a str) -> StoreFuture<'a, bool> {
        let call = self.call(Op::Delete, key);
        Box::pin(async move {
            match call.await? {
                Reply::Done(d) => Ok(d),
                _ => Err(self.shared.refusal("mismatched reply")),
            }
        })
    }

    fn lock<'a>(&'a self, key: &'a str, ttl: Duration) -> StoreFuture<'a, Option<Token>> {
        let token = match super::memory::new_token() {
            Ok(t) => Token(t),
            Err(e) => return Box::pin(async move { Err(e) }),
        };
        let call = self.call(Op::Lock(ttl, token), key);
        Box::pin(async move {
            match call.await? {
                Reply::Lease(t) => Ok(t),
                _ => Err(self.shared.refusal("mismatched reply")),
            }
        })
    }

    fn renew<'a>(&'a self, key: &'a str, token: &'a Token, ttl: Duration) -> StoreFuture<'a, bool> {
        let call = self.call(Op::Renew(token.clone(), ttl), key);
        Box::pin(async move {
            match call.await? {
                Reply::Done(d) => Ok(d),
                _ => Err(self.shared.refusal("mismatched reply")),
            }
        })
    }

    fn unlock<'a>(&'a self, key: &'a str, token: &'a Token) -> StoreFuture<'a, bool> {
        let call = self.call(Op::Unlock(token.clone()), key);
        Box::pin(async move {
            match call.await? {
                Reply::Done(d) => Ok(d),
                _ => Err(self.shared.refusal("mismatched reply")),
            }
        })
    }

    fn watch(&self, key: &str) -> Result<Watch, StoreError> {
        let mut watches = guard(&self.shared.watches);
        if let Some(tx) = watches.get(key) {
            return Ok(Watch::new(tx.subscribe()));
        }
        if watches.len() >= REDIS_WATCHES_MAX {
            let refusals = &self.shared.watch_refusals;
            let refused = refusals.load(Ordering::Relaxed);
            if super::watch_sweep_due(refused) {
                // Keys nobody watches any more (a shared session that ended) make room.
                watches.retain(|_, tx| tx.receiver_count() > 0);
            }
            if watches.len() >= REDIS_WATCHES_MAX {
                refusals.store(refused.wrapping_add(1), Ordering::Relaxed);
                return Err(self
                    .shared
                    .error(&format!("too many watched keys ({REDIS_WATCHES_MAX})")));
            }
            refusals.store(0, Ordering::Relaxed);
        }
        // Version 0 until the store thread reads the key's version at its next
        // (re)subscription or sees a change: the watcher reads the key itself first.
        let (tx, rx) = watch::channel(0);
        watches.insert(Box::from(key), tx);
        Ok(Watch::new(rx))
    }
}

/// The store thread's scripts (their SHA1 is computed once).
struct Scripts {
    get: redis::Script,
    put: redis::Script,
    bury: redis::Script,
    delete: redis::Script,
    renew: redis::Script,
    unlock: redis::Script,
}

/// The connection the store thread's operations use, and how they report its failure.
#[derive(Default)]
struct Link {
    /// `Some` while connected: the connection, and which one it is (it counts up with
    /// every connection made).
    connection: RefCell<Option<(u64, redis::aio::MultiplexedConnection)>>,
    /// Why the connection failed under an operation, for the supervisor to act on.
    failed: RefCell<Option<String>>,
    failure: Notify,
}

impl Link {
    /// Reports that connection `which` failed; a report about an earlier connection (an
    /// operation that outlived it) is not news.
    fn fail(&self, which: u64, reason: String) {
        let current = self.connection.borrow().as_ref().map(|(n, _)| *n);
        if current != Some(which) {
            return;
        }
        let mut failed = self.failed.borrow_mut();
        if failed.is_none() {
            *failed = Some(reason);
        }
        self.failure.notify_one();
    }
}

/// The store thread: one task keeps the connection, and each queued operation runs as a
/// task of its own (at most [`REDIS_INFLIGHT_MAX`] at once) on the shared connection.
async fn serve(
    client: redis::Client,
    shown: String,
    mut requests: mpsc::Receiver<Request>,
    shared: Arc<Shared>,
    tried: std::sync::mpsc::SyncSender<()>,
) {
    let link = Rc::new(Link::default());
    let scripts = Rc::new(Scripts {
        get: redis::Script::new(GET_SCRIPT),
        put: redis::Script::new(PUT_SCRIPT),
        bury: redis::Script::new(BURY_SCRIPT),
        delete: redis::Script::new(DELETE_SCRIPT),
        renew: redis::Script::new(RENEW_SCRIPT),
        unlock: redis::Script::new(UNLOCK_SCRIPT),
    });
    let supervising = supervise(client, shown, link.clone(), shared.clone(), tried);
    tokio::task::spawn_local(supervising);
    let inflight = Arc::new(Semaphore::new(REDIS_INFLIGHT_MAX));
    let releases = Rc::new(Semaphore::new(REDIS_LOST_LEASES_MAX));
    loop {
        let Ok(permit) = inflight.clone().acquire_owned().await else {
            return;
        };
        let Some(request) = requests.recv().await else {
            // Every handle on the store is gone: the process is ending.
            return;
        };
        let (link, scripts, shared) = (link.clone(), scripts.clone(), shared.clone());
        let releases = releases.clone();
        tokio::task::spawn_local(async move {
            let lost = execute(request, &link, &scripts, &shared).await;
            // The release can take up to the lease's TTL: it must not hold a place on
            // the connection meanwhile, or lost answers would starve every operation.
            drop(permit);
            let Some(lost) = lost else {
                return;
            };
            match releases.try_acquire() {
                Ok(_releasing) => release_lost_lease(&link, &scripts, &shared, lost).await,
                // Too many at once (Redis is failing under a burst of locks): this one
                // expires with its TTL, and the refusal is counted.
                Err(_) => {
                    let refused = StoreOutcome::Unavailable;
                    shared
                        .stats
                        .record(StoreOp::Unlock, refused, Duration::ZERO);
                }
            }
        });
    }
}

/// A lease whose `SET NX` went out but whose answer did not come: it may be held under a
/// token nobody knows.
struct LostLease {
    key: Box<str>,
    token: Token,
    ttl: Duration,
}

/// Runs one operation and answers it. A lock whose answer was lost comes back, to be
/// released.
async fn execute(
    request: Request,
    link: &Link,
    scripts: &Scripts,
    shared: &Shared,
) -> Option<LostLease> {
    let started = Instant::now();
    let lock = match &request.op {
        Op::Lock(ttl, token) => Some((token.clone(), *ttl)),
        _ => None,
    };
    let metric = request.op.metric();
    let connection = link.connection.borrow().clone();
    let which = connection.as_ref().map_or(0, |(n, _)| *n);
    let result = match connection {
        None => Err(Failure::Unavailable("not connected")),
        // Never sent, so never done (a lock is not lost): its time ran out in the queue.
        Some(_) if started >= request.deadline => {
            Err(Failure::Unavailable("no time left when its turn came"))
        }
        Some((_, mut connection)) => {
            let work = run(&mut connection, scripts, shared, request.op, &request.key);
            match tokio::time::timeout_at(request.deadline.into(), work).await {
                Ok(result) => result,
                Err(_) => Err(Failure::Timeout),
            }
        }
    };
    // The command may have run although its answer did not come.
    let lost = matches!(result, Err(Failure::Timeout | Failure::Connection(_)));
    let (outcome, answer) = match result {
        Ok(reply) => (StoreOutcome::Ok, Ok(reply)),
        Err(Failure::Error(why)) => (StoreOutcome::Error, Err(shared.error(&why))),
        Err(Failure::Refused(why)) => (StoreOutcome::Error, Err(shared.refusal(&why))),
        Err(Failure::Connection(why)) => {
            let error = shared.maybe_done(&format!("connection failed: {why}"));
            link.fail(which, why);
            (StoreOutcome::Error, Err(error))
        }
        Err(Failure::Timeout) => (
            StoreOutcome::Timeout,
            Err(shared.maybe_done("no answer in time")),
        ),
        Err(Failure::Unavailable(why)) => (StoreOutcome::Unavailable, Err(shared.error(why))),
    };
    shared.stats.record(metric, outcome, started.elapsed());
    let _ = request.reply.send(answer);
    match lock {
        Some((token, ttl)) if lost => Some(LostLease {
            key: request.key,
            token,
            ttl,
        }),
        _ => None,
    }
}

/// Releases a lease that may have been taken although its answer was lost (the script
/// compares the token, so a lease never taken, or taken by another, is left alone). Tried
/// while the lease could still be held, a try per reconnection pace.
async fn release_lost_lease(link: &Link, scripts: &Scripts, shared: &Shared, lost: LostLease) {
    let until = Instant::now() + lost.ttl;
    while Instant::now() < until {
        let connection = link.connection.borrow().as_ref().map(|(_, c)| c.clone());
        if let Some(mut connection) = connection {
            let unlock = run(
                &mut connection,
                scripts,
                shared,
                Op::Unlock(lost.token.clone()),
                &lost.key,
            );
            if let Ok(Ok(_)) = tokio::time::timeout(REDIS_OPERATION_TIMEOUT, unlock).await {
                return;
            }
        }
        tokio::time::sleep(REDIS_RECONNECT_MIN).await;
    }
}

/// A redis-rs error as a [`Failure`]: the connection's, or the operation's own.
fn failure(e: &redis::RedisError) -> Failure {
    let text = clean(&e.to_string());
    // A slow answer is not a broken connection (the pings tell those apart).
    if e.is_timeout() {
        Failure::Timeout
    } else if e.is_io_error() || e.is_connection_dropped() || e.is_connection_refusal() {
        Failure::Connection(text)
    } else if matches!(e.code(), Some("WRONGTYPE" | TOO_LARGE_TO_READ)) {
        Failure::Refused(text)
    } else {
        Failure::Error(text)
    }
}

/// Milliseconds of a TTL, at least 1 (Redis refuses 0).
fn millis(ttl: Duration) -> u64 {
    u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).max(1)
}

/// A lease token as stored: 32 hex digits.
fn token_text(token: &Token) -> String {
    format!("{:032x}", token.0)
}

/// Runs one operation on the connection.
async fn run(
    connection: &mut redis::aio::MultiplexedConnection,
    scripts: &Scripts,
    shared: &Shared,
    op: Op,
    key: &str,
) -> Result<Reply, Failure> {
    let reply: redis::Value = match &op {
        Op::Get => {
            scripts
                .get
                .key(shared.value_key(key))
                .arg(REDIS_VALUE_BYTES_MAX + VERSION_DIGITS_MAX + 1)
                .invoke_async(connection)
                .await
        }
        Op::Put(bytes, ttl, over) => {
            scripts
                .put
                .key(shared.value_key(key))
                .key(shared.counter_key())
                .arg(&bytes[..])
                .arg(shared.channel())
                .arg(key)
                .arg(ttl.map_or(0, millis))
                .arg(match over {
                    None => "0",
                    Some(Over::Value) => "1",
                    Some(Over::Nothing) => "2",
                })
                .invoke_async(connection)
                .await
        }
        Op::Bury(ttl, version) => {
            scripts
                .bury
                .key(shared.value_key(key))
                .key(shared.counter_key())
                .arg(shared.channel())
                .arg(key)
                .arg(millis(*ttl))
                .arg(version.map_or_else(String::new, |v| v.to_string()))
                .invoke_async(connection)
                .await
        }
        Op::Delete => {
            scripts
                .delete
                .key(shared.value_key(key))
                .key(shared.counter_key())
                .arg(shared.channel())
                .arg(key)
                .invoke_async(connection)
                .await
        }
        Op::Lock(ttl, token) => {
            let token = token.clone();
            let set = redis::cmd("SET")
                .arg(shared.lease_key(key))
                .arg(token_text(&token))
                .arg("NX")
                .arg("PX")
                .arg(millis(*ttl))
                .query_async(connection)
                .await
                .map_err(|e| failure(&e))?;
            return match set {
                redis::Value::Okay => Ok(Reply::Lease(Some(token))),
                redis::Value::SimpleString(s) if s == "OK" => Ok(Reply::Lease(Some(token))),
                redis::Value::Nil => Ok(Reply::Lease(None)),
                other => Err(unexpected(&other)),
            };
        }
        Op::Renew(token, ttl) => {
            scripts
                .renew
                .key(shared.lease_key(key))
                .arg(token_text(token))
                .arg(millis(*ttl))
                .invoke_async(connection)
                .await
        }
        Op::Unlock(token) => {
            scripts
                .unlock
                .key(shared.lease_key(key))
                .arg(token_text(token))
                .invoke_async(connection)
                .await
        }
    }
    .map_err(|e| failure(&e))?;
    match op {
        Op::Get => match reply {
            redis::Value::Nil => Ok(Reply::Value(None)),
            // A tombstone reads as no value.
            redis::Value::BulkString(stored) if tombstone(&stored).is_some() => {
                Ok(Reply::Value(None))
            }
            redis::Value::BulkString(stored) => decode_value(stored)
                .map(|v| Reply::Value(Some(v)))
                .map_err(|e| Failure::Refused(e.message)),
            other => Err(unexpected(&other)),
        },
        Op::Put(..) => match reply {
            redis::Value::Int(v) if v > 0 => Ok(Reply::Put(Put::Written(v.unsigned_abs()))),
            redis::Value::Int(0) => Ok(Reply::Put(Put::Missing)),
            redis::Value::Int(-1) => Ok(Reply::Put(Put::Taken)),
            redis::Value::Int(-2) => Ok(Reply::Put(Put::Buried)),
            other => Err(unexpected(&other)),
        },
        Op::Delete | Op::Bury(..) | Op::Renew(..) | Op::Unlock(_) => match reply {
            redis::Value::Int(0) => Ok(Reply::Done(false)),
            redis::Value::Int(1) => Ok(Reply::Done(true)),
            other => Err(unexpected(&other)),
        },
        Op::Lock(..) => Err(Failure::Refused("unreachable: lock answered above".into())),
    }
}

/// A reply of a type the operation does not give.
fn unexpected(reply: &redis::Value) -> Failure {
    let kind = match reply {
        redis::Value::Nil => "nil",
        redis::Value::Int(_) => "an integer",
        redis::Value::BulkString(_) => "a string",
        redis::Value::Array(_) => "an array",
        redis::Value::SimpleString(_) | redis::Value::Okay => "a status",
        redis::Value::ServerError(_) => "an error",
        _ => "another type",
    };
    Failure::Refused(format!("unexpected reply: {kind}"))
}

/// A stored value: `<version>:<bytes>`. The bytes are a slice of what Redis sent (no copy).
pub(crate) fn decode_value(stored: Vec<u8>) -> Result<Value, StoreError> {
    let version = parse_version(&stored).ok_or_else(|| {
        StoreError::lasting("a stored value without a valid version in front".to_owned())
    })?;
    let (version, header) = version;
    Ok(Value {
        bytes: Bytes::from(stored).slice(header..),
        version,
    })
}

/// The version in front of a stored value (`<digits>:`), and where the bytes start;
/// `None` for anything else (no digits, too many, a zero version, no colon).
fn parse_version(stored: &[u8]) -> Option<(u64, usize)> {
    let head = stored.get(..stored.len().min(VERSION_DIGITS_MAX + 1))?;
    let colon = memchr::memchr(b':', head)?;
    let digits = head.get(..colon)?;
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let version: u64 = std::str::from_utf8(digits).ok()?.parse().ok()?;
    (version > 0).then_some((version, colon + 1))
}

/// The version of a tombstone (`<digits>!`, nothing after it); `None` for anything else.
fn tombstone(stored: &[u8]) -> Option<u64> {
    let (digits, mark) = stored.split_at_checked(stored.len().checked_sub(1)?)?;
    if mark != b"!"
        || digits.is_empty()
        || digits.len() > VERSION_DIGITS_MAX
        || !digits.iter().all(u8::is_ascii_digit)
    {
        return None;
    }
    std::str::from_utf8(digits).ok()?.parse().ok()
}

/// A change message: `<version> <key>`; `None` for anything else.
pub(crate) fn parse_change(payload: &[u8]) -> Option<(u64, &str)> {
    let space = memchr::memchr(b' ', payload)?;
    let digits = payload.get(..space)?;
    if digits.is_empty()
        || digits.len() > VERSION_DIGITS_MAX
        || !digits.iter().all(u8::is_ascii_digit)
    {
        return None;
    }
    let version: u64 = std::str::from_utf8(digits).ok()?.parse().ok()?;
    let key = std::str::from_utf8(payload.get(space + 1..)?).ok()?;
    Some((version, key))
}

/// Text from Redis (or about it) made safe for a log line: control bytes replaced, bounded.
fn clean(text: &str) -> String {
    let bytes_max = LOG_FIELD_BYTES_MAX * 2;
    let mut out = String::with_capacity(text.len().min(bytes_max) + '…'.len_utf8());
    for c in text.chars() {
        let c = if c.is_control() { '?' } else { c };
        if out.len() + c.len_utf8() > bytes_max {
            out.push('…');
            break;
        }
        out.push(c);
    }
    out
}

/// Where the store was before its connection attempt, for one log line per change (while
/// connected, the supervisor is in `follow`).
#[derive(Clone, Copy, PartialEq, Eq)]
enum State {
    /// Never connected, and no attempt failed yet.
    Starting,
    /// Not connected, and that was logged.
    Down,
}

/// Keeps the store connected: connects, subscribes, re-reads the watched versions, then
/// watches the connection until it fails; backs off and starts again.
/// `tried` hears once, when the first attempt has connected (and read the watched
/// versions) or failed.
async fn supervise(
    client: redis::Client,
    shown: String,
    link: Rc<Link>,
    shared: Arc<Shared>,
    tried: std::sync::mpsc::SyncSender<()>,
) {
    let name = &shared.name;
    let mut state = State::Starting;
    let mut backoff = REDIS_RECONNECT_MIN;
    let mut tried = Some(tried);
    let mut generation = 0u64;
    loop {
        let attempt = connect(&client, &shared).await;
        if attempt.is_err()
            && let Some(tried) = tried.take()
        {
            let _ = tried.try_send(());
        }
        match attempt {
            Ok((connection, messages)) => {
                generation += 1;
                *link.failed.borrow_mut() = None;
                *link.connection.borrow_mut() = Some((generation, connection.clone()));
                shared.stats.set_connected(true);
                if state == State::Down {
                    log::info(format_args!("store {name}: redis at {shown} is back"));
                } else {
                    log::info(format_args!("store {name}: connected to redis at {shown}"));
                }
                backoff = REDIS_RECONNECT_MIN;
                let why = follow(connection, messages, &link, &shared, &mut tried).await;
                link.connection.borrow_mut().take();
                shared.stats.set_connected(false);
                log::warn(format_args!(
                    "store {name}: lost redis at {shown}: {}; reconnecting",
                    clean(&why)
                ));
                state = State::Down;
            }
            Err(why) => {
                if state != State::Down {
                    log::warn(format_args!(
                        "store {name}: cannot connect to redis at {shown}: {}; retrying",
                        clean(&why)
                    ));
                    state = State::Down;
                }
            }
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(REDIS_RECONNECT_MAX);
    }
}

/// Opens the command connection and the subscriber, subscribed to the change channel.
async fn connect(
    client: &redis::Client,
    shared: &Shared,
) -> Result<(redis::aio::MultiplexedConnection, redis::aio::PubSubStream), String> {
    // redis-rs's own response timeout (500 ms by default) would cut a large value's write
    // short: it gets the operation's deadline, which each operation enforces anyway.
    let config = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(REDIS_CONNECT_TIMEOUT))
        .set_response_timeout(Some(REDIS_OPERATION_TIMEOUT));
    let opening = async {
        let connection = client
            .get_multiplexed_async_connection_with_config(&config)
            .await
            .map_err(|e| e.to_string())?;
        let mut subscriber = client.get_async_pubsub().await.map_err(|e| e.to_string())?;
        subscriber
            .subscribe(shared.channel())
            .await
            .map_err(|e| e.to_string())?;
        Ok::<_, String>((connection, subscriber.into_on_message()))
    };
    match tokio::time::timeout(REDIS_CONNECT_TIMEOUT, opening).await {
        Ok(opened) => opened,
        Err(_) => Err(format!(
            "no connection within {} ms",
            REDIS_CONNECT_TIMEOUT.as_millis()
        )),
    }
}

/// While connected: re-reads the watched keys' versions, then applies change messages and
/// pings, until the connection fails; returns why.
async fn follow(
    mut connection: redis::aio::MultiplexedConnection,
    mut messages: redis::aio::PubSubStream,
    link: &Link,
    shared: &Shared,
    tried: &mut Option<std::sync::mpsc::SyncSender<()>>,
) -> String {
    let synced = resync(&mut connection, shared).await;
    if let Some(tried) = tried.take() {
        let _ = tried.try_send(());
    }
    if let Err(why) = synced {
        return why;
    }
    let mut ping = tokio::time::interval(REDIS_PING_INTERVAL);
    ping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The ping is a heartbeat published on the change channel: its answer proves the
    // command connection, and hearing it (or any message) proves the subscriber, which
    // could otherwise die without a word (a partition) and leave every watch deaf.
    let mut heard = Instant::now();
    loop {
        if heard.elapsed() > REDIS_PING_INTERVAL + REDIS_OPERATION_TIMEOUT {
            return "the subscriber heard nothing, not even its own heartbeat".to_owned();
        }
        // This thread runs tokio's epoll loop, not a worker's io_uring: what `select!`
        // drops here (a channel receive, a timer, a ping's reply wait on the multiplexed
        // connection, whose driver task goes on) is safe to drop.
        tokio::select! {
            message = next_message(&mut messages) => {
                let Some(message) = message else {
                    return "the subscriber connection closed".to_owned();
                };
                heard = Instant::now();
                apply_change(shared, message.get_payload_bytes());
            }
            () = link.failure.notified() => {
                if let Some(why) = link.failed.borrow_mut().take() {
                    return why;
                }
            }
            _ = ping.tick() => {
                let pong = tokio::time::timeout(
                    REDIS_OPERATION_TIMEOUT,
                    redis::cmd("PUBLISH")
                        .arg(shared.channel())
                        .arg(HEARTBEAT)
                        .query_async::<redis::Value>(&mut connection),
                )
                .await;
                match pong {
                    Ok(Ok(_)) => {}
                    Ok(Err(e)) => return e.to_string(),
                    Err(_) => return "no answer to a ping in time".to_owned(),
                }
            }
        }
    }
}

/// The next change message; `None` once the subscriber connection has closed.
async fn next_message(messages: &mut redis::aio::PubSubStream) -> Option<redis::Msg> {
    std::future::poll_fn(|cx| {
        futures_core::Stream::poll_next(std::pin::Pin::new(&mut *messages), cx)
    })
    .await
}

/// Wakes the watchers of a key a change message names, when its version differs from the
/// one they were last woken for. A message only says that a key changed: the watchers
/// read the value itself, so a forged version (even the largest) cannot silence later
/// changes. Messages that are not `<version> <key>` are ignored.
fn apply_change(shared: &Shared, payload: &[u8]) {
    let Some((version, key)) = parse_change(payload) else {
        return;
    };
    if let Some(tx) = guard(&shared.watches).get(key) {
        tx.send_if_modified(|seen| {
            let changed = version != *seen;
            *seen = version;
            changed
        });
    }
}

/// After a (re)subscription: reads the version of every watched key and wakes the
/// watchers of each that differs from the one they last saw (changes while unsubscribed
/// were not heard; a key that is gone reads as version 0).
async fn resync(
    connection: &mut redis::aio::MultiplexedConnection,
    shared: &Shared,
) -> Result<(), String> {
    let keys: Vec<Box<str>> = {
        let mut watches = guard(&shared.watches);
        // Keys nobody watches any more (shared sessions that ended) are not read again.
        watches.retain(|_, tx| tx.receiver_count() > 0);
        watches.keys().cloned().collect()
    };
    if keys.is_empty() {
        return Ok(());
    }
    let mut pipe = redis::pipe();
    // A key that is not a string (written by someone else) answers with an error, read as
    // version 0, rather than failing the whole resync and with it every connection.
    pipe.ignore_errors();
    for key in &keys {
        pipe.cmd("GETRANGE")
            .arg(shared.value_key(key))
            .arg(0)
            .arg(VERSION_DIGITS_MAX);
    }
    let read = tokio::time::timeout(
        REDIS_OPERATION_TIMEOUT,
        pipe.query_async::<Vec<redis::Value>>(connection),
    )
    .await
    .map_err(|_| "no answer to reading the watched versions in time".to_owned())?
    .map_err(|e| e.to_string())?;
    let watches = guard(&shared.watches);
    for (key, reply) in keys.iter().zip(read) {
        let version = match reply {
            redis::Value::BulkString(head) => tombstone(&head)
                .or_else(|| parse_version(&head).map(|(v, _)| v))
                .unwrap_or(0),
            _ => 0,
        };
        if let Some(tx) = watches.get(key) {
            tx.send_if_modified(|seen| {
                let changed = version != *seen;
                *seen = version;
                changed
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod unit {
    use super::*;

    #[test]
    fn stored_values_decode_behind_their_version() {
        let v = decode_value(b"42:{\"tools\":[]}".to_vec()).unwrap();
        assert_eq!((v.version, &v.bytes[..]), (42, &b"{\"tools\":[]}"[..]));
        let v = decode_value(b"18446744073709551615:".to_vec()).unwrap();
        assert_eq!((v.version, v.bytes.len()), (u64::MAX, 0));
        let v = decode_value(b"7:a:b\r\n\0".to_vec()).unwrap();
        assert_eq!(&v.bytes[..], b"a:b\r\n\0");
    }

    #[test]
    fn hostile_stored_bytes_are_errors_not_panics() {
        for bad in [
            &b""[..],
            b":",
            b"0:x",
            b"x:1",
            b"-1:x",
            b"+1:x",
            b" 1:x",
            b"1 :x",
            b"12",
            b"18446744073709551616:x",
            b"000000000000000000001:x",
            b"\xff\xfe:x",
            b"1\r\n:x",
        ] {
            assert!(decode_value(bad.to_vec()).is_err(), "{bad:?}");
        }
        let mut rng = crate::testing::Rng::seeded(0x5ed15).0;
        for _ in 0..10_000 {
            let len = rng.index(30);
            let bytes: Vec<u8> = (0..len)
                .map(|_| rng.pick(b"0123456789:: \r\nx\xff"))
                .collect();
            if let Ok(v) = decode_value(bytes.clone()) {
                assert!(v.version > 0 && v.bytes.len() < bytes.len(), "{bytes:?}");
            }
        }
    }

    #[test]
    fn change_messages_parse_or_are_ignored() {
        assert_eq!(parse_change(HEARTBEAT.as_bytes()), None);
        assert_eq!(parse_change(b"5 tools/tools"), Some((5, "tools/tools")));
        assert_eq!(parse_change(b"5 a b"), Some((5, "a b")));
        for bad in [
            &b""[..],
            b"5",
            b" k",
            b"x k",
            b"-5 k",
            b"99999999999999999999999 k",
            b"5 \xff",
        ] {
            assert_eq!(parse_change(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn text_from_redis_is_cleaned_for_logs() {
        assert_eq!(clean("ERR bad\r\nINJECTED\0"), "ERR bad??INJECTED?");
        assert!(clean(&"x".repeat(10_000)).len() <= 2 * LOG_FIELD_BYTES_MAX + 3);
        // Bounded in bytes, not characters: four-byte characters do not make it longer.
        assert!(clean(&"\u{1F600}".repeat(10_000)).len() <= 2 * LOG_FIELD_BYTES_MAX + 3);
        let exact = "x".repeat(2 * LOG_FIELD_BYTES_MAX);
        assert_eq!(clean(&exact), exact);
    }

    #[test]
    fn tokens_are_fixed_width_hex() {
        assert_eq!(token_text(&Token(1)), format!("{:0>32}", "1"));
        assert_eq!(token_text(&Token(u128::MAX)).len(), 32);
        assert_eq!(millis(Duration::ZERO), 1);
        assert_eq!(millis(Duration::from_secs(30)), 30_000);
    }
}
