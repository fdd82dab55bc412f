//! When each request should be sent, and the loops that send them.
//!
//! Open loop (wrk2 style): request `k` of the whole run is *intended* at `t0 + k / rate`,
//! and requests are dealt round-robin to the connections, so connection `c` of `C` owns
//! `k = c, c + C, c + 2C, ...` and sends every `C / rate` seconds. A connection has one
//! request in flight; when the target stalls, the next request goes out late, and its
//! latency is still measured from its intended time, so the stall shows up as latency
//! instead of as requests that were silently never scheduled (coordinated omission).
//!
//! Closed loop: each connection sends its next request as soon as the previous one is
//! answered; latency is measured from the actual send.
//!
//! Time comes from a [`Clock`], so the loops run unchanged against a simulated clock in
//! the unit tests below.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::arrival::finished;
use crate::limits::SPIN_WINDOW;
use crate::record::{Failure, Recorder, Served};

/// Nanoseconds since the start of a run.
pub type Nanos = u64;

const NANOS_PER_SEC: u128 = 1_000_000_000;

/// Converts a duration to nanoseconds, saturating at `u64::MAX` (584 years).
pub fn nanos(d: Duration) -> Nanos {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// A source of time that can also wait.
pub trait Clock {
    /// Returns the time now.
    fn now(&self) -> Nanos;
    /// Returns once `now() >= deadline` (at once if it already is).
    fn wait_until(&self, deadline: Nanos);
}

/// The real clock: monotonic time since `origin`, with a precise pacer.
#[derive(Clone, Copy, Debug)]
pub struct MonotonicClock {
    origin: Instant,
}

impl MonotonicClock {
    /// Creates a clock that reads 0 at `origin`.
    pub fn new(origin: Instant) -> MonotonicClock {
        MonotonicClock { origin }
    }
}

impl Clock for MonotonicClock {
    fn now(&self) -> Nanos {
        nanos(self.origin.elapsed())
    }

    /// Sleeps until `SPIN_WINDOW` before the deadline, then yield-spins to it.
    ///
    /// Sleeping all the way would be late by the kernel's wake-up latency (tens of µs, more
    /// under load) on every request; spinning all the way would burn a core. The spin
    /// yields (`sched_yield`) rather than busy-waits so that, on a machine shared with the
    /// target, the target's threads still get the CPU while we wait.
    fn wait_until(&self, deadline: Nanos) {
        let spin = nanos(SPIN_WINDOW);
        loop {
            let now = self.now();
            if now >= deadline {
                return;
            }
            let left = deadline - now;
            if left > spin {
                std::thread::sleep(Duration::from_nanos(left - spin));
            } else {
                std::thread::yield_now();
            }
        }
    }
}

/// The open-loop plan of one connection.
///
/// Invariants: `rate > 0`, `index < connections`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Schedule {
    /// When request 0 of the run is intended.
    start: Nanos,
    /// Requests per second over all connections.
    rate: u64,
    /// How many connections share the run's requests.
    connections: u32,
    /// Which connection this plan is for.
    index: u32,
}

impl Schedule {
    /// Creates the plan of connection `index` of `connections` at `rate` requests/s total.
    pub fn new(start: Nanos, rate: u64, connections: u32, index: u32) -> Schedule {
        assert!(rate > 0);
        assert!(index < connections);
        Schedule {
            start,
            rate,
            connections,
            index,
        }
    }

    /// Returns the intended send time of this connection's `i`-th request:
    /// `start + (index + i * connections) / rate` seconds, computed exactly (no drift).
    pub fn intended(&self, i: u64) -> Nanos {
        let k = u128::from(self.index) + u128::from(i) * u128::from(self.connections);
        let offset = k * NANOS_PER_SEC / u128::from(self.rate);
        self.start
            .saturating_add(u64::try_from(offset).unwrap_or(u64::MAX))
    }

    /// Returns how many of this connection's requests are intended before `end`.
    pub fn count_before(&self, end: Nanos) -> u64 {
        let span = u128::from(end.saturating_sub(self.start));
        // Run-wide requests k with k / rate < span, i.e. k * 10^9 < span * rate.
        let run_total = (span * u128::from(self.rate)).div_ceil(NANOS_PER_SEC);
        let mine = u128::from(self.index);
        if run_total <= mine {
            return 0;
        }
        let count = (run_total - mine).div_ceil(u128::from(self.connections));
        u64::try_from(count).unwrap_or(u64::MAX)
    }
}

/// The phases of a run, on the run's clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Window {
    /// Requests intended before this are warm-up.
    pub warmup_end: Nanos,
    /// No request is intended at or after this.
    pub end: Nanos,
    /// A lagging connection stops sending here; what it still owed is counted unsent.
    pub drain_end: Nanos,
}

/// One request (or one scenario iteration) against the target.
pub trait Exchange {
    /// Performs it and returns what was served, or why it failed.
    fn exchange(&mut self) -> Result<Served, Failure>;
}

/// Live counters the progress line reads while connections run.
#[derive(Debug, Default)]
pub struct Progress {
    /// Exchanges finished (warm-up included).
    pub completed: AtomicU64,
    /// Exchanges failed (warm-up included).
    pub failed: AtomicU64,
}

impl Progress {
    fn on_complete(&self, outcome: &Result<Served, Failure>) {
        self.completed.fetch_add(1, Ordering::Relaxed);
        if outcome.is_err() {
            self.failed.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Runs one connection open-loop on `schedule` until `window.end`, recording into `rec`.
pub fn drive_open(
    clock: &impl Clock,
    exchange: &mut impl Exchange,
    schedule: &Schedule,
    window: &Window,
    rec: &mut Recorder,
    progress: &Progress,
) {
    let owed = schedule.count_before(window.end);
    let mut i = 0;
    let mut last_done: Nanos = 0;
    while i < owed {
        if clock.now() >= window.drain_end {
            rec.unsent += owed - i;
            return;
        }
        let intended = schedule.intended(i);
        clock.wait_until(intended);
        let sent = clock.now();
        let outcome = exchange.exchange();
        let done = finished(clock.now(), sent, lead(&outcome));
        // Due and the connection free: from then on, any wait before the send was ours.
        rec.ready_at(intended.max(last_done));
        rec.on_complete(intended, sent, done, &outcome);
        progress.on_complete(&outcome);
        last_done = done;
        i += 1;
    }
}

/// Runs one connection closed-loop from now until `window.end`, recording into `rec`.
pub fn drive_closed(
    clock: &impl Clock,
    exchange: &mut impl Exchange,
    window: &Window,
    rec: &mut Recorder,
    progress: &Progress,
) {
    let mut last_done = None;
    loop {
        let sent = clock.now();
        if sent >= window.end {
            return;
        }
        let outcome = exchange.exchange();
        let done = finished(clock.now(), sent, lead(&outcome));
        rec.ready_at(last_done.unwrap_or(sent));
        last_done = Some(done);
        rec.on_complete(sent, sent, done, &outcome);
        progress.on_complete(&outcome);
    }
}

/// How long before the exchange returned its response arrived (0 for a failure: a failure
/// is counted, not timed).
fn lead(outcome: &Result<Served, Failure>) -> Nanos {
    outcome.as_ref().map_or(0, |served| served.lead)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    const US: Nanos = 1_000;
    const MS: Nanos = 1_000_000;
    const SEC: Nanos = 1_000_000_000;

    /// A clock that only moves when told to: waiting jumps to the deadline.
    struct SimClock {
        now: Cell<Nanos>,
    }

    impl Clock for SimClock {
        fn now(&self) -> Nanos {
            self.now.get()
        }
        fn wait_until(&self, deadline: Nanos) {
            self.now.set(self.now.get().max(deadline));
        }
    }

    /// A target that takes `service` per request, except that nothing sent during
    /// `[stall_from, stall_to)` is answered before `stall_to + service`.
    struct SimTarget<'a> {
        clock: &'a SimClock,
        service: Nanos,
        stall_from: Nanos,
        stall_to: Nanos,
    }

    impl Exchange for SimTarget<'_> {
        fn exchange(&mut self) -> Result<Served, Failure> {
            let sent = self.clock.now();
            let done = if (self.stall_from..self.stall_to).contains(&sent) {
                self.stall_to + self.service
            } else {
                sent + self.service
            };
            self.clock.now.set(done);
            Ok(Served::default())
        }
    }

    fn window(warmup: Nanos, end: Nanos) -> Window {
        Window {
            warmup_end: warmup,
            end,
            drain_end: end + 10 * SEC,
        }
    }

    #[test]
    fn intended_times_spread_evenly_over_connections() {
        // 1000 req/s over 4 connections: the run sends every 1 ms, each connection every
        // 4 ms, and together they cover every millisecond exactly once.
        let mut all: Vec<Nanos> = (0..4u32)
            .flat_map(|c| {
                let s = Schedule::new(5 * MS, 1000, 4, c);
                (0..250u64).map(move |i| s.intended(i))
            })
            .collect();
        all.sort_unstable();
        let expected: Vec<Nanos> = (0..1000u64).map(|k| 5 * MS + k * MS).collect();
        assert_eq!(all, expected);
        let s = Schedule::new(0, 1000, 4, 3);
        assert_eq!(s.intended(0), 3 * MS);
        assert_eq!(s.intended(1) - s.intended(0), 4 * MS);
    }

    #[test]
    fn intended_times_do_not_drift_at_rates_that_do_not_divide_a_second() {
        let s = Schedule::new(0, 3, 1, 0);
        assert_eq!(s.intended(1), 333_333_333);
        assert_eq!(s.intended(3), SEC);
        assert_eq!(s.intended(3_000_000), 1_000_000 * SEC);
    }

    #[test]
    fn count_before_matches_enumeration() {
        for (rate, connections, end) in [
            (1000, 4, SEC),
            (3, 2, SEC),
            (7, 3, 2 * SEC + 1),
            (5, 8, SEC),
        ] {
            for c in 0..connections {
                let s = Schedule::new(0, rate, connections, c);
                let brute = (0..100_000u64).take_while(|&i| s.intended(i) < end).count();
                assert_eq!(
                    s.count_before(end),
                    brute as u64,
                    "rate {rate} c {c}/{connections}"
                );
            }
        }
        assert_eq!(Schedule::new(SEC, 10, 1, 0).count_before(0), 0);
    }

    #[test]
    fn a_stall_shows_up_as_growing_latency_not_as_missing_samples() {
        // 1000 req/s on one connection, 100 µs service, the target stalls for 1 s at t = 2 s.
        let clock = SimClock { now: Cell::new(0) };
        let mut target = SimTarget {
            clock: &clock,
            service: 100 * US,
            stall_from: 2 * SEC,
            stall_to: 3 * SEC,
        };
        let schedule = Schedule::new(0, 1000, 1, 0);
        let mut rec = Recorder::new(SEC);
        drive_open(
            &clock,
            &mut target,
            &schedule,
            &window(SEC, 5 * SEC),
            &mut rec,
            &Progress::default(),
        );

        assert_eq!(rec.warmup_count, 1000);
        assert_eq!(rec.ok_count(), 4000);
        assert_eq!(rec.unsent, 0);
        // The request sent into the stall waited the full second.
        assert!(rec.response.max() >= 1_000_000);
        // Every request scheduled during the stall waited too, each a little less: about
        // 1000 of them (each catching up 900 µs on the backlog, so ~1100 are affected).
        let delayed = rec.response.count_between(100_000, u64::MAX);
        assert!((900..=1100).contains(&delayed), "delayed {delayed}");
        let p50 = rec.response.value_at_quantile(0.5);
        assert!(p50 < 200, "p50 {p50}");
        let p90 = rec.response.value_at_quantile(0.9);
        assert!(p90 > 500_000, "p90 {p90}");
        // Service time (from the actual send) hides it: one slow request only.
        assert_eq!(rec.service.count_between(100_000, u64::MAX), 1);
    }

    #[test]
    fn closed_loop_measures_from_the_actual_send() {
        let clock = SimClock { now: Cell::new(0) };
        let mut target = SimTarget {
            clock: &clock,
            service: MS,
            stall_from: 2 * SEC,
            stall_to: 3 * SEC,
        };
        let mut rec = Recorder::new(SEC);
        drive_closed(
            &clock,
            &mut target,
            &window(SEC, 4 * SEC),
            &mut rec,
            &Progress::default(),
        );
        // 1000 per second outside the stall, one request across it.
        assert_eq!(rec.warmup_count, 1000);
        assert_eq!(rec.ok_count(), 2000);
        assert_eq!(rec.response.count_between(100_000, u64::MAX), 1);
    }

    /// A target that answers after `service` and whose reader gets to run `wake` after the
    /// answer arrived, reporting that lag as the exchange's lead (a kernel receive stamp).
    struct LateReader<'a> {
        clock: &'a SimClock,
        service: Nanos,
        wake: Nanos,
    }

    impl Exchange for LateReader<'_> {
        fn exchange(&mut self) -> Result<Served, Failure> {
            let now = self.clock.now();
            self.clock.now.set(now + self.service + self.wake);
            Ok(Served {
                notifications: 0,
                lead: self.wake,
            })
        }
    }

    #[test]
    fn latency_ends_at_the_arrival_not_when_the_reader_woke() {
        let clock = SimClock { now: Cell::new(0) };
        let mut target = LateReader {
            clock: &clock,
            service: MS,
            wake: 60 * US,
        };
        let schedule = Schedule::new(0, 100, 1, 0);
        let mut rec = Recorder::new(0);
        let w = window(0, SEC);
        drive_open(
            &clock,
            &mut target,
            &schedule,
            &w,
            &mut rec,
            &Progress::default(),
        );
        assert_eq!(rec.ok_count(), 100);
        assert_eq!(rec.response.min(), 1000);
        assert_eq!(rec.response.max(), 1000);
        assert_eq!(rec.service.max(), 1000);

        let clock = SimClock { now: Cell::new(0) };
        let mut target = LateReader {
            clock: &clock,
            service: MS,
            wake: 60 * US,
        };
        let mut rec = Recorder::new(0);
        drive_closed(&clock, &mut target, &w, &mut rec, &Progress::default());
        // Back to back, each exchange takes 1.06 ms of the loop's time but 1 ms of latency.
        assert_eq!(rec.ok_count(), 944);
        assert_eq!(rec.response.max(), 1000);
    }

    #[test]
    fn the_generators_own_delay_is_what_it_takes_to_send_once_due_and_free() {
        // 1000 req/s on one connection, 1 ms service, and a reader that runs 60 µs after
        // each answer arrived: the connection falls behind, and from then on each request
        // goes out 60 µs after it could have (the answer was in); service time stays 1 ms.
        let path = std::env::temp_dir().join(format!(
            "mcpyard-schedule-{}-delay.jsonl",
            std::process::id()
        ));
        let series =
            crate::series::Series::create(&path, SEC, 0, 1).unwrap_or_else(|e| panic!("{e}"));
        let clock = SimClock { now: Cell::new(0) };
        let mut target = LateReader {
            clock: &clock,
            service: MS,
            wake: 60 * US,
        };
        let mut rec = Recorder::new(0);
        rec.series = Some(series.recorder(0));
        let schedule = Schedule::new(0, 1000, 1, 0);
        drive_open(
            &clock,
            &mut target,
            &schedule,
            &window(0, SEC),
            &mut rec,
            &Progress::default(),
        );
        rec.finish_series();
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        let _ = std::fs::remove_file(&path);
        let first: serde_json::Value = text
            .lines()
            .next()
            .and_then(|l| serde_json::from_str(l).ok())
            .unwrap_or_else(|| panic!("no line: {text}"));
        assert_eq!(first["generator_delay_p99_us"], 60, "{first}");
        assert_eq!(first["service_p99_us"], 1000, "{first}");
        // Behind by 60 µs more with every request, so the response time grows.
        assert!(
            first["max_us"].as_u64().is_some_and(|m| m > 50_000),
            "{first}"
        );
    }

    #[test]
    fn a_connection_too_far_behind_counts_what_it_owes_as_unsent() {
        let clock = SimClock { now: Cell::new(0) };
        let mut target = SimTarget {
            clock: &clock,
            service: 10 * MS, // 100/s max, asked for 1000/s
            stall_from: 0,
            stall_to: 0,
        };
        let schedule = Schedule::new(0, 1000, 1, 0);
        let w = Window {
            warmup_end: 0,
            end: SEC,
            drain_end: SEC,
        };
        let progress = Progress::default();
        let mut rec = Recorder::new(0);
        drive_open(&clock, &mut target, &schedule, &w, &mut rec, &progress);
        assert_eq!(rec.ok_count(), 100);
        assert_eq!(rec.unsent, 900);
        assert_eq!(progress.completed.load(Ordering::Relaxed), 100);
    }
}
