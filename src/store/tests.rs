//! Store tests: values, leases under a hand-moved clock, watches woken on the watcher's own
//! event loop, and readers on several threads racing a writer (seeded, so a failure can be
//! replayed with `MCPYARD_SEED`).

use super::memory::MemoryStore;
use super::{Clock, Over, Put, Store, Token};
use crate::testing::{Rng, run_local};
use bytes::Bytes;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A clock the test moves by hand.
struct ManualClock(Mutex<Instant>);

impl ManualClock {
    fn advance(&self, by: Duration) {
        let mut now = self.0.lock().unwrap_or_else(|e| e.into_inner());
        *now += by;
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Instant {
        *self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[test]
fn values_are_put_got_and_deleted_with_rising_versions() {
    run_local(async {
        let store = MemoryStore::default();
        assert_eq!(store.get("k").await, Ok(None));
        let v1 = store.put("k", Bytes::from_static(b"one")).await.unwrap();
        let v2 = store.put("j", Bytes::from_static(b"two")).await.unwrap();
        assert!(v2 > v1);
        let got = store.get("k").await.unwrap().unwrap();
        assert_eq!((&got.bytes[..], got.version), (&b"one"[..], v1));
        assert_eq!(store.delete("k").await, Ok(true));
        assert_eq!(store.delete("k").await, Ok(false));
        assert_eq!(store.get("k").await, Ok(None));
    });
}

#[test]
fn a_got_value_is_the_stored_bytes_not_a_copy() {
    let store = MemoryStore::default();
    let bytes = Bytes::from(vec![7u8; 64 * 1024]);
    let ptr = bytes.as_ptr();
    run_local(async { store.put("big", bytes).await.unwrap() });
    assert_eq!(store.get_now("big").unwrap().bytes.as_ptr(), ptr);
}

#[test]
fn a_value_put_for_a_time_is_gone_after_it_and_makes_room_when_full() {
    run_local(async {
        let clock = Arc::new(ManualClock(Mutex::new(Instant::now())));
        let store = MemoryStore::with_clock(clock.clone());
        let ttl = Duration::from_secs(10);
        store
            .put_for("s", Bytes::from_static(b"r"), ttl, Over::Nothing)
            .await
            .unwrap();
        clock.advance(Duration::from_secs(9));
        assert!(store.get("s").await.unwrap().is_some());
        store
            .put_for("s", Bytes::from_static(b"r"), ttl, Over::Value)
            .await
            .unwrap();
        clock.advance(Duration::from_secs(9));
        assert!(store.get_now("s").is_some(), "written again: lives on");
        clock.advance(Duration::from_secs(2));
        assert_eq!(store.get("s").await, Ok(None));
        // Expired values give their room to new keys once the store is full.
        // Written over what is there only: nothing when it is gone.
        assert_eq!(
            store.put_for("s", Bytes::new(), ttl, Over::Value).await,
            Ok(Put::Missing)
        );
        assert_eq!(store.get("s").await, Ok(None));
        store
            .put_for("s", Bytes::new(), ttl, Over::Nothing)
            .await
            .unwrap();
        let written = store.put_for("s", Bytes::from_static(b"2"), ttl, Over::Value);
        assert!(matches!(written.await, Ok(Put::Written(_))));
        assert_eq!(&store.get("s").await.unwrap().unwrap().bytes[..], b"2");
        assert_eq!(store.delete("s").await, Ok(true));
        let limit = crate::limits::MEMORY_STORE_KEYS_MAX;
        for i in 0..limit - 1 {
            store.put(&format!("k{i}"), Bytes::new()).await.unwrap();
        }
        let written = store.put_for("s", Bytes::new(), ttl, Over::Nothing);
        assert!(matches!(written.await, Ok(Put::Written(_))));
        assert!(store.put("one-more", Bytes::new()).await.is_err());
        clock.advance(ttl);
        assert!(store.put("one-more", Bytes::new()).await.is_ok());
        assert_eq!(store.get("s").await, Ok(None));
    });
}

#[test]
fn leases_are_exclusive_renewable_and_expire_by_time() {
    run_local(async {
        let clock = Arc::new(ManualClock(Mutex::new(Instant::now())));
        let store = MemoryStore::with_clock(clock.clone());
        let ttl = Duration::from_secs(30);
        let a = store.lock("lease", ttl).await.unwrap().expect("free");
        assert_eq!(store.lock("lease", ttl).await, Ok(None), "held");
        clock.advance(Duration::from_secs(20));
        assert_eq!(store.renew("lease", &a, ttl).await, Ok(true));
        clock.advance(Duration::from_secs(20));
        assert_eq!(
            store.lock("lease", ttl).await,
            Ok(None),
            "renewed: held till 50 s"
        );
        // The holder gets stuck past its expiry: another takes over, the old one cannot
        // renew, release or take the lease back by mistake.
        clock.advance(Duration::from_secs(11));
        assert_eq!(
            store.renew("lease", &a, ttl).await,
            Ok(false),
            "expired is lost"
        );
        let b = store
            .lock("lease", ttl)
            .await
            .unwrap()
            .expect("expired: free");
        assert_ne!(a, b);
        assert_eq!(store.renew("lease", &a, ttl).await, Ok(false));
        assert_eq!(store.unlock("lease", &a).await, Ok(false));
        assert_eq!(store.unlock("lease", &b).await, Ok(true));
        assert!(
            store.lock("lease", ttl).await.unwrap().is_some(),
            "released: free"
        );
        let stranger = Token(1);
        assert_eq!(store.unlock("other", &stranger).await, Ok(false));
        assert!(
            !format!("{b:?}").contains(&format!("{:x}", b.0)),
            "tokens are not printed"
        );
    });
}

#[test]
fn watches_wake_each_worker_on_its_own_loop_once_per_change() {
    let store = Arc::new(MemoryStore::default());
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let workers: Vec<_> = (0..2)
        .map(|_| {
            let store = store.clone();
            let ready = ready_tx.clone();
            std::thread::spawn(move || {
                run_local(async move {
                    let mut watch = store.watch("tools").unwrap();
                    let me = std::thread::current().id();
                    ready.send(()).unwrap();
                    let mut seen = Vec::new();
                    while seen.len() < 2 {
                        assert!(watch.changed().await);
                        assert_eq!(std::thread::current().id(), me, "woken on its own thread");
                        seen.push(store.get_now("tools").unwrap().bytes);
                    }
                    seen
                })
            })
        })
        .collect();
    for _ in 0..2 {
        ready_rx.recv().unwrap();
    }
    run_local(async {
        store.put("tools", Bytes::from_static(b"v1")).await.unwrap();
    });
    // The second change waits until both have seen the first (changes coalesce).
    std::thread::sleep(Duration::from_millis(50));
    run_local(async {
        store.put("other", Bytes::from_static(b"x")).await.unwrap();
        store.put("tools", Bytes::from_static(b"v2")).await.unwrap();
    });
    for w in workers {
        let seen = w.join().unwrap();
        assert_eq!(seen, [Bytes::from_static(b"v1"), Bytes::from_static(b"v2")]);
    }
}

/// A value that checks itself: its version's bytes, then a byte pattern derived from them.
fn stamped(n: u64, len: usize) -> Bytes {
    let mut v = n.to_le_bytes().to_vec();
    v.extend((0..len).map(|i| (n as usize + i) as u8));
    Bytes::from(v)
}

fn whole(bytes: &[u8]) -> Option<u64> {
    let n = u64::from_le_bytes(bytes.get(..8)?.try_into().ok()?);
    let body = bytes.get(8..)?;
    body.iter()
        .enumerate()
        .all(|(i, b)| *b == (n as usize + i) as u8)
        .then_some(n)
}

#[test]
fn readers_racing_a_writer_see_only_whole_values_in_order() {
    let (mut rng, seed) = Rng::seeded(0x5709e);
    let store = Arc::new(MemoryStore::default());
    run_local(async { store.put("list", stamped(0, 100)).await.unwrap() });
    let done = Arc::new(AtomicBool::new(false));
    let readers: Vec<_> = (0..3)
        .map(|_| {
            let (store, done) = (store.clone(), done.clone());
            std::thread::spawn(move || {
                let (mut last, mut reads) = (0u64, 0u64);
                while !done.load(Ordering::Acquire) || reads < 1000 {
                    let value = store.get_now("list").expect("never absent");
                    let n = whole(&value.bytes).unwrap_or_else(|| panic!("torn value"));
                    assert!(n >= last, "went back from {last} to {n}");
                    last = n;
                    reads += 1;
                }
                last
            })
        })
        .collect();
    let writes = 3000;
    for n in 1..=writes {
        let len = rng.index(4096);
        run_local(async { store.put("list", stamped(n, len)).await.unwrap() });
        if rng.chance(5) {
            std::thread::yield_now();
        }
    }
    done.store(true, Ordering::Release);
    for r in readers {
        let last = r
            .join()
            .unwrap_or_else(|_| panic!("a reader failed (seed {seed})"));
        assert!(last <= writes, "seed {seed}");
    }
    assert_eq!(whole(&store.get_now("list").unwrap().bytes), Some(writes));
}

/// A full watch table is swept for keys nobody watches at its first refusal, then once
/// per spacing of refusals: not a pass over the whole table at every one.
#[test]
fn a_full_watch_table_is_swept_once_per_spacing_of_refusals() {
    use crate::limits::{MEMORY_STORE_KEYS_MAX, STORE_WATCH_SWEEP_SPACING};
    let store = MemoryStore::default();
    let held: Vec<super::Watch> = (0..MEMORY_STORE_KEYS_MAX)
        .map(|n| store.watch(&format!("k{n}")))
        .collect::<Result<_, _>>()
        .expect("room for every watch");
    assert!(
        store.watch("more").is_err(),
        "swept, and every watch is held"
    );
    drop(held);
    for n in 1..STORE_WATCH_SWEEP_SPACING {
        assert!(store.watch("more").is_err(), "refusal {n} swept the table");
    }
    assert!(store.watch("more").is_ok(), "the next sweep makes room");
}

/// The record contract every store keeps, the memory store and redis alike: a record is
/// made only where nothing is, updated only where it is, and a deleted one leaves a
/// tombstone that reads as nothing, wakes watchers and refuses every write until it ends;
/// a delete decided on a version read earlier holds only while the record is of it.
pub(super) async fn records_keep_their_contract(store: &dyn Store, ttl: Duration) {
    let mut watch = store.watch("r").expect("a watch");
    let put = |key: &'static str, bytes: &'static [u8], over| {
        store.put_for(key, Bytes::from_static(bytes), ttl, over)
    };
    let Ok(Put::Written(v1)) = put("r", b"one", Over::Nothing).await else {
        panic!("a record is made where nothing is")
    };
    assert_eq!(put("r", b"x", Over::Nothing).await, Ok(Put::Taken));
    let Ok(Put::Written(v2)) = put("r", b"two", Over::Value).await else {
        panic!("a record is updated where it is")
    };
    assert!(v2 > v1);
    assert_eq!(
        store.bury("r", ttl, Some(v1)).await,
        Ok(false),
        "written since"
    );
    assert_eq!(&store.get("r").await.unwrap().unwrap().bytes[..], b"two");
    let woken = tokio::time::timeout(Duration::from_secs(2), watch.changed());
    assert_eq!(woken.await, Ok(true));
    assert_eq!(store.bury("r", ttl, Some(v2)).await, Ok(true));
    let woken = tokio::time::timeout(Duration::from_secs(2), watch.changed());
    assert_eq!(woken.await, Ok(true), "a tombstone wakes the watchers");
    assert_eq!(store.get("r").await, Ok(None));
    assert_eq!(put("r", b"x", Over::Nothing).await, Ok(Put::Buried));
    assert_eq!(put("r", b"x", Over::Value).await, Ok(Put::Buried));
    assert_eq!(store.bury("r", ttl, Some(v2)).await, Ok(false));
    // A delete with nothing there leaves a tombstone too (a write on its way may land).
    assert_eq!(store.bury("n", ttl, None).await, Ok(true));
    assert_eq!(put("n", b"x", Over::Nothing).await, Ok(Put::Buried));
    assert_eq!(put("n", b"x", Over::Value).await, Ok(Put::Buried));
    assert_eq!(
        store.delete("n").await,
        Ok(false),
        "a tombstone is no value"
    );
}

#[test]
fn records_are_made_updated_and_buried_as_the_contract_says() {
    run_local(async {
        let clock = Arc::new(ManualClock(Mutex::new(Instant::now())));
        let store = MemoryStore::with_clock(clock.clone());
        let ttl = Duration::from_secs(10);
        records_keep_their_contract(&store, ttl).await;
        clock.advance(ttl);
        let made = store.put_for("r", Bytes::from_static(b"new"), ttl, Over::Nothing);
        assert!(
            matches!(made.await, Ok(Put::Written(_))),
            "a tombstone ends"
        );
    });
}
