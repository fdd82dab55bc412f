//! `auth.limits`: token buckets per caller and limit, kept per worker.
//!
//! A bucket holds up to `burst` tokens and refills at `count` per `period`; a request takes
//! one token from every bucket of a limit that applies to it, and is refused, taking none,
//! when any is empty. The table is bounded ([`RATE_BUCKETS_PER_WORKER_MAX`]): when it is
//! full, buckets that have filled up again are dropped first (a full bucket is the same as
//! none), then the one idle longest.

use crate::FastMap;
use crate::config::Limit;
use std::time::{Duration, Instant};

/// Buckets one worker keeps, over every limit and caller.
pub const RATE_BUCKETS_PER_WORKER_MAX: usize = 4096;

struct Bucket {
    tokens: f64,
    at: Instant,
}

/// One worker's buckets, by limit index and caller key.
#[derive(Default)]
pub struct Buckets {
    /// Invariant: `len() <= RATE_BUCKETS_PER_WORKER_MAX`.
    map: FastMap<(u8, u64), Bucket>,
    /// Buckets dropped before they had filled up again (the table was full of live ones).
    pub evicted: u64,
}

/// A refused request: which limit, and how long until it would pass.
#[derive(Debug, PartialEq, Eq)]
pub struct Limited {
    pub limit: usize,
    pub retry_after: Duration,
}

fn per_second(limit: &Limit) -> f64 {
    f64::from(limit.count) / limit.period.as_secs_f64()
}

/// The bucket's tokens at `now`.
fn level(bucket: Option<&Bucket>, limit: &Limit, now: Instant) -> f64 {
    match bucket {
        None => f64::from(limit.burst),
        Some(b) => {
            let refilled = now.saturating_duration_since(b.at).as_secs_f64() * per_second(limit);
            (b.tokens + refilled).min(f64::from(limit.burst))
        }
    }
}

impl Buckets {
    /// Takes one token for each limit `applies` picks, from the bucket of the caller's key
    /// for it (`keys[i]` for limit `i`), or refuses with the longest wait.
    pub fn take(
        &mut self,
        limits: &[Limit],
        keys: &[u64],
        applies: impl Fn(&Limit) -> bool,
        now: Instant,
    ) -> Result<(), Limited> {
        let mut refused: Option<Limited> = None;
        for (i, (limit, key)) in limits.iter().zip(keys).enumerate() {
            if !applies(limit) {
                continue;
            }
            let tokens = level(self.map.get(&(i as u8, *key)), limit, now);
            if tokens < 1.0 {
                let wait = Duration::from_secs_f64((1.0 - tokens) / per_second(limit));
                if refused.as_ref().is_none_or(|r| wait > r.retry_after) {
                    refused = Some(Limited {
                        limit: i,
                        retry_after: wait,
                    });
                }
            }
        }
        if let Some(refused) = refused {
            return Err(refused);
        }
        for (i, (limit, key)) in limits.iter().zip(keys).enumerate() {
            if !applies(limit) {
                continue;
            }
            let tokens = level(self.map.get(&(i as u8, *key)), limit, now) - 1.0;
            if !self.map.contains_key(&(i as u8, *key)) {
                self.make_room(limits, now);
            }
            self.map.insert((i as u8, *key), Bucket { tokens, at: now });
        }
        assert!(self.map.len() <= RATE_BUCKETS_PER_WORKER_MAX);
        Ok(())
    }

    /// Frees one entry at least when the table is full.
    fn make_room(&mut self, limits: &[Limit], now: Instant) {
        if self.map.len() < RATE_BUCKETS_PER_WORKER_MAX {
            return;
        }
        self.map.retain(|(i, _), b| {
            limits
                .get(usize::from(*i))
                .is_some_and(|l| level(Some(b), l, now) < f64::from(l.burst))
        });
        if self.map.len() >= RATE_BUCKETS_PER_WORKER_MAX {
            let oldest = self.map.iter().min_by_key(|(_, b)| b.at).map(|(k, _)| *k);
            if let Some(oldest) = oldest {
                self.map.remove(&oldest);
                self.evicted += 1;
            }
        }
    }

    /// Buckets kept now.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// True when no bucket is kept.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

/// Whole seconds to tell an agent to wait: rounded up, at least 1.
pub fn retry_after_secs(wait: Duration) -> u64 {
    let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
    secs.max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limit(count: u32, burst: u32) -> Limit {
        Limit {
            name: "calls".to_owned(),
            per: "sub".to_owned(),
            tools: None,
            count,
            period: Duration::from_secs(1),
            burst,
        }
    }

    #[test]
    fn a_bucket_empties_refills_and_tells_how_long_to_wait() {
        let limits = [limit(2, 3)];
        let mut b = Buckets::default();
        let t0 = Instant::now();
        for _ in 0..3 {
            assert_eq!(b.take(&limits, &[7], |_| true, t0), Ok(()));
        }
        let refused = b.take(&limits, &[7], |_| true, t0).unwrap_err();
        assert_eq!(refused.limit, 0);
        assert_eq!(refused.retry_after, Duration::from_millis(500));
        assert_eq!(retry_after_secs(refused.retry_after), 1);
        // Another caller has its own bucket; a limit that does not apply takes nothing.
        assert_eq!(b.take(&limits, &[8], |_| true, t0), Ok(()));
        assert_eq!(b.take(&limits, &[7], |_| false, t0), Ok(()));
        assert_eq!(
            b.take(&limits, &[7], |_| true, t0 + Duration::from_millis(500)),
            Ok(())
        );
        assert!(
            b.take(&limits, &[7], |_| true, t0 + Duration::from_millis(500))
                .is_err()
        );
    }

    #[test]
    fn a_refusal_by_one_limit_takes_nothing_from_the_others() {
        let limits = [limit(100, 100), limit(1, 1)];
        let mut b = Buckets::default();
        let t0 = Instant::now();
        assert_eq!(b.take(&limits, &[1, 1], |_| true, t0), Ok(()));
        for _ in 0..5 {
            assert_eq!(b.take(&limits, &[1, 1], |_| true, t0).unwrap_err().limit, 1);
        }
        let first = b.map.get(&(0, 1)).map(|b| b.tokens);
        assert_eq!(first, Some(99.0));
    }

    #[test]
    fn a_full_table_drops_refilled_buckets_then_the_idlest() {
        let limits = [limit(1, 2)];
        let mut b = Buckets::default();
        let t0 = Instant::now();
        for key in 0..RATE_BUCKETS_PER_WORKER_MAX as u64 {
            b.take(&limits, &[key], |_| true, t0).unwrap();
        }
        assert_eq!(b.len(), RATE_BUCKETS_PER_WORKER_MAX);
        // Nothing has refilled yet: the idlest (all equal: one of them) goes.
        b.take(&limits, &[u64::MAX], |_| true, t0).unwrap();
        assert_eq!(b.len(), RATE_BUCKETS_PER_WORKER_MAX);
        // A second later every old bucket is full again and all of them go at once.
        b.take(
            &limits,
            &[u64::MAX - 1],
            |_| true,
            t0 + Duration::from_secs(2),
        )
        .unwrap();
        assert!(b.len() <= 3, "{}", b.len());
    }
}
