//! The redis store against a real `redis-server` (Debian's package; `tests/run.sh` installs
//! it), started by each test on a free loopback port with no persistence and stopped when
//! the test ends: the store contract (versions, leases, watches), two stores sharing one
//! server as two nodes would, and what happens when the server goes away and comes back.

use super::redis::RedisStore;
use super::{Over, Put, Store, Token};
use crate::config::{RedisStore as RedisConfig, RedisUrl};
use crate::testing::run_local;
use bytes::Bytes;
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A `redis-server` of the test's own.
struct Server {
    port: u16,
    dir: PathBuf,
    child: Option<Child>,
}

impl Server {
    /// Starts one on a free port (tried again on another port if it could not bind).
    fn start(tag: &str) -> Server {
        let dir = std::env::temp_dir().join(format!(
            "mcpyard-redis-{tag}-{}-{:x}",
            std::process::id(),
            Instant::now().elapsed().as_nanos() ^ u128::from(free_port())
        ));
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        for _ in 0..3 {
            let mut server = Server {
                port: free_port(),
                dir: dir.clone(),
                child: None,
            };
            if server.spawn() {
                return server;
            }
        }
        panic!("redis-server did not start (is it installed? tests/run.sh installs it)");
    }

    /// Runs redis-server on `self.port`; true once it answers.
    fn spawn(&mut self) -> bool {
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(&self.dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn();
        let mut child = match child {
            Ok(child) => child,
            Err(e) => panic!("cannot run redis-server ({e}); tests/run.sh installs it"),
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return false;
            }
            if self.client().and_then(|c| c.get_connection()).is_ok() {
                self.child = Some(child);
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
        false
    }

    fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Stops the server and starts it again on the same port: empty, as after a crash of
    /// a server without persistence.
    fn restart(&mut self) {
        self.stop();
        assert!(
            self.spawn(),
            "redis-server did not come back on {}",
            self.port
        );
    }

    fn client(&self) -> redis::RedisResult<redis::Client> {
        redis::Client::open(format!("redis://127.0.0.1:{}/", self.port))
    }

    /// A raw command on a connection of the test's own.
    fn raw(&self, args: &[&str]) -> redis::Value {
        let mut cmd = redis::cmd(args.first().copied().unwrap_or("PING"));
        for a in args.iter().skip(1) {
            cmd.arg(*a);
        }
        let mut connection = self
            .client()
            .and_then(|c| c.get_connection())
            .unwrap_or_else(|e| panic!("raw connection: {e}"));
        cmd.query(&mut connection)
            .unwrap_or_else(|e| panic!("{args:?}: {e}"))
    }

    fn store(&self, name: &str, prefix: &str) -> RedisStore {
        self.store_in(name, prefix, 0)
    }

    /// A store on database `db`.
    fn store_in(&self, name: &str, prefix: &str, db: u32) -> RedisStore {
        let config = RedisConfig {
            url: RedisUrl {
                tls: false,
                host: "127.0.0.1".into(),
                port: self.port,
                db,
                username: None,
                password: None,
                shown: format!("redis://127.0.0.1:{}/{db}", self.port),
            },
            prefix: prefix.into(),
            tls: Default::default(),
        };
        RedisStore::start(name, &config).unwrap_or_else(|e| panic!("{e}"))
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or_else(|e| panic!("no free port: {e}"))
}

/// Waits (polling, bounded) until `store` answers a `get`.
async fn connected(store: &RedisStore) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while store.get("probe").await.is_err() {
        assert!(Instant::now() < deadline, "the store never connected");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits for a watch to fire, at most `within`; true if it did.
async fn fired(watch: &mut super::Watch, within: Duration) -> bool {
    tokio::time::timeout(within, watch.changed()).await.is_ok()
}

#[test]
fn values_round_trip_with_rising_versions_and_prefixes_keep_deployments_apart() {
    let server = Server::start("values");
    run_local(async {
        let store = server.store("a", "t1:");
        let other = server.store("b", "t2:");
        connected(&store).await;
        connected(&other).await;
        assert_eq!(store.get("k").await, Ok(None));
        let binary = Bytes::from_static(b"\0\r\n:1 2\xff");
        let v1 = store.put("k", binary.clone()).await.unwrap();
        let v2 = store.put("j", Bytes::from_static(b"two")).await.unwrap();
        let v3 = store.put("k", binary.clone()).await.unwrap();
        assert!(v1 < v2 && v2 < v3, "{v1} {v2} {v3}");
        let got = store.get("k").await.unwrap().unwrap();
        assert_eq!((got.bytes, got.version), (binary, v3));
        assert_eq!(
            other.get("k").await,
            Ok(None),
            "another prefix sees nothing"
        );
        assert_eq!(store.delete("k").await, Ok(true));
        assert_eq!(store.delete("k").await, Ok(false));
        assert_eq!(store.get("k").await, Ok(None));
        let empty = store.put("e", Bytes::new()).await.unwrap();
        assert_eq!(store.get("e").await.unwrap().unwrap().version, empty);
    });
    // What is stored is `<version>:<bytes>` under the prefix, readable by an operator.
    let raw = server.raw(&["GET", "t1:value:j"]);
    let redis::Value::BulkString(raw) = raw else {
        panic!("{raw:?}")
    };
    assert!(raw.ends_with(b":two"), "{raw:?}");
}

#[test]
fn a_value_put_for_a_time_lives_that_long_and_a_plain_put_makes_it_last() {
    let server = Server::start("ttl");
    run_local(async {
        let store = server.store("a", "ttl:");
        connected(&store).await;
        let ttl = Duration::from_millis(300);
        store
            .put_for("s", Bytes::from_static(b"record"), ttl, Over::Nothing)
            .await
            .unwrap();
        assert!(store.get("s").await.unwrap().is_some());
        let redis::Value::Int(left) = server.raw(&["PTTL", "ttl:value:s"]) else {
            panic!("PTTL did not answer a number")
        };
        assert!(left > 0 && left <= 300, "{left}");
        // Written again with its time to live: it lives on from the new write.
        tokio::time::sleep(Duration::from_millis(200)).await;
        store
            .put_for("s", Bytes::from_static(b"record"), ttl, Over::Value)
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(store.get("s").await.unwrap().is_some());
        tokio::time::sleep(Duration::from_millis(250)).await;
        assert_eq!(store.get("s").await, Ok(None));
        // Written over what is there only: nothing once it is gone.
        assert_eq!(
            store
                .put_for("s", Bytes::from_static(b"r"), ttl, Over::Value)
                .await,
            Ok(Put::Missing)
        );
        assert_eq!(store.get("s").await, Ok(None));
        // A plain put keeps the value for good.
        store
            .put_for("k", Bytes::from_static(b"x"), ttl, Over::Nothing)
            .await
            .unwrap();
        store.put("k", Bytes::from_static(b"y")).await.unwrap();
        assert_eq!(server.raw(&["PTTL", "ttl:value:k"]), redis::Value::Int(-1));
    });
}

#[test]
fn hostile_stored_values_are_store_errors() {
    let server = Server::start("hostile");
    server.raw(&["SET", "h:value:nover", "no version here"]);
    server.raw(&["SET", "h:value:zero", "0:x"]);
    server.raw(&["HSET", "h:value:hash", "f", "v"]);
    // Larger than the store reads: made in Redis (zeros up to the offset), never sent.
    let past = (crate::limits::REDIS_VALUE_BYTES_MAX + 64).to_string();
    server.raw(&["SETRANGE", "h:value:huge", &past, "x"]);
    run_local(async {
        let store = server.store("h", "h:");
        connected(&store).await;
        for key in ["nover", "zero", "hash", "huge"] {
            let e = store.get(key).await.expect_err(key);
            assert!(e.message.starts_with("redis store h: "), "{e}");
            // Reading it again would fail the same way (the cache takes it for nothing).
            assert!(e.lasting, "{key}: {e}");
        }
        // A wrong-type key under a lease name: the script's error comes back as one.
        server.raw(&["HSET", "h:lease:l", "f", "v"]);
        assert!(
            store
                .renew("l", &Token(1), Duration::from_secs(1))
                .await
                .is_err()
        );
        // The store still works after them.
        assert!(store.put("ok", Bytes::from_static(b"1")).await.is_ok());
    });
}

#[test]
fn leases_exclude_compare_their_token_and_expire() {
    let server = Server::start("leases");
    run_local(async {
        let a = server.store("a", "l:");
        let b = server.store("b", "l:");
        connected(&a).await;
        connected(&b).await;
        let ttl = Duration::from_millis(300);
        let held = a.lock("lease", ttl).await.unwrap().expect("free");
        assert_eq!(b.lock("lease", ttl).await, Ok(None), "held by a");
        assert_eq!(
            b.renew("lease", &Token(7), ttl).await,
            Ok(false),
            "wrong token"
        );
        assert_eq!(b.unlock("lease", &Token(7)).await, Ok(false), "wrong token");
        assert_eq!(a.renew("lease", &held, ttl).await, Ok(true));
        // The holder stalls past its TTL: b takes over, and a can neither renew nor
        // release b's lease.
        tokio::time::sleep(ttl + Duration::from_millis(100)).await;
        let taken = b.lock("lease", ttl).await.unwrap().expect("expired: free");
        assert_ne!(held, taken);
        assert_eq!(a.renew("lease", &held, ttl).await, Ok(false));
        assert_eq!(a.unlock("lease", &held).await, Ok(false));
        assert_eq!(a.lock("lease", ttl).await, Ok(None), "b holds it");
        assert_eq!(b.unlock("lease", &taken).await, Ok(true));
        assert!(
            a.lock("lease", ttl).await.unwrap().is_some(),
            "released: free"
        );
        // Leases and values are apart: a value named like a lease does not hold it.
        a.put("other", Bytes::from_static(b"x")).await.unwrap();
        assert!(a.lock("other", ttl).await.unwrap().is_some());
    });
}

#[test]
fn a_watch_fires_once_per_change_on_every_node() {
    let server = Server::start("watch");
    run_local(async {
        let writer = server.store("w", "w:");
        let reader = server.store("r", "w:");
        connected(&writer).await;
        connected(&reader).await;
        let mut watch = reader.watch("tools").unwrap();
        let mut twin = reader.watch("tools").unwrap();
        let mut unrelated = reader.watch("prompts").unwrap();
        // The reader's first resync is behind it once a write reaches it.
        writer
            .put("tools", Bytes::from_static(b"v0"))
            .await
            .unwrap();
        assert!(fired(&mut watch, Duration::from_secs(5)).await);
        assert!(fired(&mut twin, Duration::from_secs(5)).await);
        for n in 1..=3u8 {
            writer.put("tools", Bytes::from(vec![n])).await.unwrap();
            assert!(
                fired(&mut watch, Duration::from_secs(5)).await,
                "change {n}"
            );
            assert!(fired(&mut twin, Duration::from_secs(5)).await, "change {n}");
            let got = reader.get("tools").await.unwrap().unwrap();
            assert_eq!(&got.bytes[..], [n]);
            assert!(!fired(&mut watch, Duration::from_millis(150)).await, "once");
        }
        assert!(!fired(&mut unrelated, Duration::from_millis(50)).await);
        writer.delete("tools").await.unwrap();
        assert!(
            fired(&mut watch, Duration::from_secs(5)).await,
            "a delete is a change"
        );
        assert_eq!(reader.get("tools").await, Ok(None));
    });
}

#[test]
fn a_change_made_while_unsubscribed_is_found_at_resubscription() {
    let server = Server::start("resub");
    run_local(async {
        let reader = server.store("r", "s:");
        connected(&reader).await;
        let mut watch = reader.watch("k").unwrap();
        reader.put("k", Bytes::from_static(b"one")).await.unwrap();
        assert!(fired(&mut watch, Duration::from_secs(5)).await);
        // A write nobody announces (as if its message were lost while the reader was not
        // subscribed), then the reader's connections are cut: it reconnects, reads the
        // watched versions again, and the watch fires.
        server.raw(&["SET", "s:value:k", "99999999999999999:two"]);
        assert!(!fired(&mut watch, Duration::from_millis(200)).await);
        server.raw(&["CLIENT", "KILL", "TYPE", "pubsub"]);
        server.raw(&["CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"]);
        assert!(fired(&mut watch, Duration::from_secs(10)).await, "missed");
        connected(&reader).await;
        let got = reader.get("k").await.unwrap().unwrap();
        assert_eq!(
            (&got.bytes[..], got.version),
            (&b"two"[..], 99999999999999999)
        );
    });
}

#[test]
fn a_redis_restart_fails_operations_promptly_and_misses_no_change() {
    let mut server = Server::start("restart");
    run_local(async {
        let writer = server.store("w", "x:");
        let reader = server.store("r", "x:");
        connected(&writer).await;
        connected(&reader).await;
        let mut watch = reader.watch("tools").unwrap();
        let before = writer
            .put("tools", Bytes::from_static(b"old"))
            .await
            .unwrap();
        assert!(fired(&mut watch, Duration::from_secs(5)).await);
        server.stop();
        // Down: every operation fails, and soon (no hang), with a typed error.
        let started = Instant::now();
        for _ in 0..5 {
            let e = reader.get("tools").await.expect_err("redis is down");
            assert!(e.message.starts_with("redis store r: "), "{e}");
            assert!(writer.lock("l", Duration::from_secs(1)).await.is_err());
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );
        // Back, empty (no persistence): the reader's watch fires for the value that went
        // away, and again for the writer's next value, whose version is still newer.
        server.restart();
        assert!(
            fired(&mut watch, Duration::from_secs(15)).await,
            "the loss was missed"
        );
        connected(&reader).await;
        connected(&writer).await;
        let after = writer
            .put("tools", Bytes::from_static(b"new"))
            .await
            .unwrap();
        assert!(after > before, "{after} after {before}");
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            assert!(
                fired(&mut watch, Duration::from_secs(10)).await,
                "the new value was missed"
            );
            let got = reader.get("tools").await.unwrap();
            if got.as_ref().is_some_and(|v| &v.bytes[..] == b"new") {
                break;
            }
            assert!(Instant::now() < deadline);
        }
    });
    // The store reported its state changes (each once) in its metrics.
    let mut out = String::new();
    crate::metrics::store::render(&mut out);
    assert!(
        out.contains("mcpyard_store_connected{store=\"r\"} 1"),
        "{out}"
    );
}

#[test]
fn a_store_that_never_reached_redis_answers_errors_at_once() {
    let port = free_port();
    run_local(async {
        let config = RedisConfig {
            url: RedisUrl {
                tls: false,
                host: "127.0.0.1".into(),
                port,
                db: 0,
                username: None,
                password: None,
                shown: format!("redis://127.0.0.1:{port}/0"),
            },
            prefix: "n:".into(),
            tls: Default::default(),
        };
        let store = RedisStore::start("nowhere", &config).unwrap();
        let started = Instant::now();
        let e = store.get("k").await.expect_err("no redis");
        assert!(!e.lasting, "a store that is down may come back: {e}");
        assert!(store.put("k", Bytes::new()).await.is_err());
        assert!(store.watch("k").is_ok(), "watching needs no connection");
        assert!(started.elapsed() < Duration::from_secs(3));
    });
    // Nothing listens there: the connection was refused, not hung.
    assert!(TcpStream::connect(("127.0.0.1", port)).is_err());
}

#[test]
fn a_stalled_redis_fills_the_queue_and_every_caller_gets_an_answer_in_bounded_time() {
    let server = Server::start("stall");
    run_local(async {
        let store = std::rc::Rc::new(server.store("stall", "q:"));
        connected(&store).await;
        // Redis stops answering this client (its commands wait), as a stalled server would.
        server.raw(&["CLIENT", "PAUSE", "4000", "ALL"]);
        let callers = crate::limits::REDIS_QUEUE_LEN + crate::limits::REDIS_INFLIGHT_MAX + 200;
        let started = Instant::now();
        let tasks: Vec<_> = (0..callers)
            .map(|_| {
                let store = store.clone();
                tokio::task::spawn_local(async move {
                    let result = store.get("k").await;
                    (result, Instant::now())
                })
            })
            .collect();
        let (mut full, mut late) = (0, 0);
        for task in tasks {
            let (result, at) = task.await.unwrap();
            let error = result.expect_err("paused: no answer");
            assert!(
                at - started < crate::limits::REDIS_OPERATION_TIMEOUT * 2 + Duration::from_secs(1),
                "answered after {:?}",
                at - started
            );
            if error.message.contains("too many operations queued") {
                full += 1;
            } else {
                late += 1;
            }
        }
        // What did not fit in the queue was refused at once; the rest timed out.
        assert!(full >= 200, "{full} refused, {late} timed out");
        assert!(
            late >= crate::limits::REDIS_INFLIGHT_MAX,
            "{full} refused, {late} timed out"
        );
        server.raw(&["CLIENT", "UNPAUSE"]);
        connected(&store).await;
        assert!(store.put("k", Bytes::from_static(b"after")).await.is_ok());
    });
}

#[test]
fn databases_of_one_server_are_apart_values_and_watches_alike() {
    let server = Server::start("dbs");
    run_local(async {
        let zero = server.store_in("zero", "d:", 0);
        let two = server.store_in("two", "d:", 2);
        connected(&zero).await;
        connected(&two).await;
        let mut watching_zero = zero.watch("k").unwrap();
        two.put("k", Bytes::from_static(b"in two")).await.unwrap();
        assert_eq!(zero.get("k").await, Ok(None));
        assert!(
            !fired(&mut watching_zero, Duration::from_millis(300)).await,
            "a change in database 2 woke a watcher of database 0"
        );
        zero.put("k", Bytes::from_static(b"in zero")).await.unwrap();
        assert!(fired(&mut watching_zero, Duration::from_secs(5)).await);
        let got = two.get("k").await.unwrap().unwrap();
        assert_eq!(&got.bytes[..], b"in two");
    });
}

#[test]
fn a_forged_change_message_cannot_silence_later_changes() {
    let server = Server::start("forged");
    run_local(async {
        let writer = server.store("w", "f:");
        let reader = server.store("r", "f:");
        connected(&writer).await;
        connected(&reader).await;
        let mut watch = reader.watch("tools").unwrap();
        writer
            .put("tools", Bytes::from_static(b"v0"))
            .await
            .unwrap();
        assert!(fired(&mut watch, Duration::from_secs(5)).await);
        // Anyone who may PUBLISH on that Redis can send a change with the largest version.
        server.raw(&["PUBLISH", "f:changes:0", "18446744073709551615 tools"]);
        assert!(
            fired(&mut watch, Duration::from_secs(5)).await,
            "a change is a change"
        );
        // A real change after it still wakes the watcher.
        writer
            .put("tools", Bytes::from_static(b"v1"))
            .await
            .unwrap();
        assert!(fired(&mut watch, Duration::from_secs(5)).await, "silenced");
        let got = reader.get("tools").await.unwrap().unwrap();
        assert_eq!(&got.bytes[..], b"v1");
    });
}

#[test]
fn a_watched_key_that_is_not_a_string_does_not_keep_the_store_down() {
    let server = Server::start("wrongtype");
    run_local(async {
        let store = server.store("s", "t:");
        connected(&store).await;
        let _odd = store.watch("odd").unwrap();
        let mut fine = store.watch("fine").unwrap();
        // Someone else's hash where a value would be, then the connections cut: the
        // resync at reconnection reads it as version 0 and the store is usable again.
        server.raw(&["HSET", "t:value:odd", "a", "b"]);
        server.raw(&["CLIENT", "KILL", "TYPE", "pubsub"]);
        server.raw(&["CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"]);
        tokio::time::sleep(Duration::from_millis(300)).await;
        connected(&store).await;
        store.put("fine", Bytes::from_static(b"x")).await.unwrap();
        assert!(
            fired(&mut fine, Duration::from_secs(5)).await,
            "watches work again"
        );
        assert!(
            store.get("odd").await.is_err(),
            "the odd key itself is an error"
        );
    });
}

#[test]
fn a_lock_whose_answer_was_lost_is_released() {
    let server = Server::start("lostlock");
    run_local(async {
        let a = server.store("a", "l:");
        let b = server.store("b", "l:");
        connected(&a).await;
        connected(&b).await;
        // Redis stalls past the operation deadline; the SET runs once it resumes, after
        // the caller was told "no answer in time".
        server.raw(&["CLIENT", "PAUSE", "2500", "WRITE"]);
        let ttl = Duration::from_secs(30);
        assert!(a.lock("lease", ttl).await.is_err(), "timed out");
        tokio::time::sleep(Duration::from_millis(1500)).await;
        // The lease it may have taken is given back, so another node gets it long before
        // the 30 s TTL.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(Some(_)) = b.lock("lease", ttl).await {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "lease stuck with a lost token"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
}

#[test]
fn lost_leases_being_released_leave_the_connection_to_other_operations() {
    let server = Server::start("lostmany");
    run_local(async {
        let store = std::rc::Rc::new(server.store("many", "m:"));
        connected(&store).await;
        // Each lease key holds a hash, so each release of a lost lease fails
        // (WRONGTYPE) and is tried again until the lease's TTL.
        let leases = crate::limits::REDIS_INFLIGHT_MAX + 44;
        for n in 0..leases {
            server.raw(&["HSET", &format!("m:lease:k{n}"), "f", "v"]);
        }
        // Every lock's answer is lost: Redis holds writes past the operation deadline.
        server.raw(&["CLIENT", "PAUSE", "2500", "WRITE"]);
        let ttl = Duration::from_secs(10);
        let locks: Vec<_> = (0..leases)
            .map(|n| {
                let store = store.clone();
                tokio::task::spawn_local(async move { store.lock(&format!("k{n}"), ttl).await })
            })
            .collect();
        for lock in locks {
            assert!(lock.await.unwrap().is_err(), "paused: no answer");
        }
        tokio::time::sleep(Duration::from_millis(800)).await;
        // The releases go on for the TTL; other operations still get the connection.
        assert!(store.put("k", Bytes::from_static(b"v")).await.is_ok());
        let value = store.get("k").await.unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!(value.map(|v| v.bytes), Some(Bytes::from_static(b"v")));
    });
}

#[test]
fn records_are_made_updated_and_buried_as_the_contract_says() {
    let server = Server::start("records");
    run_local(async {
        let store = server.store("a", "rec:");
        connected(&store).await;
        let ttl = Duration::from_millis(400);
        super::tests::records_keep_their_contract(&store, ttl).await;
        tokio::time::sleep(ttl).await;
        let made = store.put_for("r", Bytes::from_static(b"new"), ttl, Over::Nothing);
        assert!(
            matches!(made.await, Ok(Put::Written(_))),
            "a tombstone ends"
        );
        // A tombstone is what the store writes, and reads as nothing at another node.
        assert_eq!(store.bury("r", ttl, None).await, Ok(true));
        let other = server.store("b", "rec:");
        connected(&other).await;
        assert_eq!(other.get("r").await, Ok(None));
    });
}
