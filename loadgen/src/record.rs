//! What one connection measured: latency histograms, errors by kind, and the counters the
//! report adds up.
//!
//! A `Recorder` belongs to one connection thread and is merged into the run's total at the
//! end (`Recorder::merge`), so recording never takes a lock. Latency is kept twice:
//! *response time* from a request's intended send time (what a user waiting on a schedule
//! sees, coordinated omission included) and *service time* from the moment it was actually
//! sent (what the server took). In closed-loop runs the two are the same.

use std::fmt;

use hdrhistogram::Histogram;

use crate::limits::{LATENCY_SIGFIG, LATENCY_US_MAX};
use crate::schedule::Nanos;
use crate::series::SeriesRec;

/// Why one request (or scenario iteration) failed; the report counts each kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// The TCP connection could not be made.
    Connect,
    /// The target answered with an unexpected HTTP status.
    HttpStatus,
    /// The target answered with a JSON-RPC error object.
    JsonRpc,
    /// The target did not answer within the request timeout.
    Timeout,
    /// The answer could not be decoded: malformed HTTP, SSE or JSON-RPC, or the wrong id.
    Decode,
    /// The connection was reset or closed in the middle of an exchange.
    Io,
}

impl ErrorKind {
    /// Every kind, in report order.
    pub const ALL: [ErrorKind; 6] = [
        ErrorKind::Connect,
        ErrorKind::HttpStatus,
        ErrorKind::JsonRpc,
        ErrorKind::Timeout,
        ErrorKind::Decode,
        ErrorKind::Io,
    ];

    /// The short name used in tables and JSON keys.
    pub fn name(self) -> &'static str {
        match self {
            ErrorKind::Connect => "connect",
            ErrorKind::HttpStatus => "http_status",
            ErrorKind::JsonRpc => "jsonrpc",
            ErrorKind::Timeout => "timeout",
            ErrorKind::Decode => "decode",
            ErrorKind::Io => "io",
        }
    }

    fn index(self) -> usize {
        match self {
            ErrorKind::Connect => 0,
            ErrorKind::HttpStatus => 1,
            ErrorKind::JsonRpc => 2,
            ErrorKind::Timeout => 3,
            ErrorKind::Decode => 4,
            ErrorKind::Io => 5,
        }
    }
}

/// A failed exchange: its kind and a one-line description for the report.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    /// What went wrong, for counting.
    pub kind: ErrorKind,
    /// What went wrong, for people: the first failure of each kind is printed.
    pub detail: String,
}

impl Failure {
    /// Creates a failure of `kind` described by `detail`.
    pub fn new(kind: ErrorKind, detail: impl Into<String>) -> Failure {
        Failure {
            kind,
            detail: detail.into(),
        }
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.kind.name(), self.detail)
    }
}

impl std::error::Error for Failure {}

/// What a successful exchange reports besides its timing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Served {
    /// SSE notifications received before the response (progress events).
    pub notifications: u64,
    /// How long before the exchange returned its response's last bytes had arrived, by the
    /// kernel's receive timestamp (`--receive-time kernel`); 0 when unknown, and the
    /// return is then the finish time.
    pub lead: Nanos,
}

/// Error counts by kind, with the first detail seen for each.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ErrorCounts {
    counts: [u64; ErrorKind::ALL.len()],
    first: [Option<String>; ErrorKind::ALL.len()],
}

impl ErrorCounts {
    /// Counts one failure, keeping its detail if it is the first of its kind.
    pub fn count(&mut self, failure: &Failure) {
        let i = failure.kind.index();
        if let Some(slot) = self.counts.get_mut(i) {
            *slot += 1;
        }
        if let Some(first @ None) = self.first.get_mut(i) {
            *first = Some(failure.detail.clone());
        }
    }

    /// Returns how many failures of `kind` were counted.
    pub fn get(&self, kind: ErrorKind) -> u64 {
        self.counts.get(kind.index()).copied().unwrap_or(0)
    }

    /// Returns the detail of the first failure of `kind`, if any.
    pub fn first(&self, kind: ErrorKind) -> Option<&str> {
        self.first.get(kind.index()).and_then(|d| d.as_deref())
    }

    /// Returns the total over all kinds.
    pub fn total(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// Adds `other`'s counts; first details already held are kept.
    pub fn merge(&mut self, other: &ErrorCounts) {
        for kind in ErrorKind::ALL {
            let i = kind.index();
            if let (Some(mine), Some(theirs)) = (self.counts.get_mut(i), other.counts.get(i)) {
                *mine += theirs;
            }
            if let (Some(mine @ None), Some(Some(theirs))) =
                (self.first.get_mut(i), other.first.get(i))
            {
                *mine = Some(theirs.clone());
            }
        }
    }
}

/// Returns an empty latency histogram in microseconds (1 µs .. `LATENCY_US_MAX`).
pub fn latency_histogram() -> Histogram<u64> {
    // The bounds are constants that satisfy the crate's rules (checked below at compile
    // time), so creation cannot fail.
    Histogram::new_with_bounds(1, LATENCY_US_MAX, LATENCY_SIGFIG)
        .unwrap_or_else(|e| panic!("constant histogram bounds refused: {e}"))
}

const _: () = assert!(LATENCY_US_MAX >= 2);
const _: () = assert!(LATENCY_SIGFIG <= 5);

/// Converts a span in nanoseconds to whole microseconds, rounded to nearest, at least 1
/// (the histogram's lowest value).
pub fn nanos_to_us(span: Nanos) -> u64 {
    (span.saturating_add(500) / 1000).max(1)
}

/// One connection's measurements.
#[derive(Debug)]
pub struct Recorder {
    /// Requests intended before this instant are warm-up: counted, never recorded.
    warmup_end: Nanos,
    /// Response time in µs, from each request's intended send time.
    pub response: Histogram<u64>,
    /// Service time in µs, from each request's actual send time.
    pub service: Histogram<u64>,
    /// Response time in µs of every recorded request, successful or failed (a failure at
    /// the moment it failed), from its intended send time.
    pub response_all: Histogram<u64>,
    /// Recorded requests whose response time exceeded `LATENCY_US_MAX` and was recorded
    /// as that maximum: when non-zero, the histograms' max is a clamp.
    pub clamped: u64,
    /// When the last recorded successful request finished, on the run's clock: an
    /// open-loop run's measured window ends here (or at the scheduled end, if later).
    pub last_done: Nanos,
    /// Keep-alive connections the target closed while idle, reopened and the request sent
    /// again (warm-up included): normal HTTP, not errors.
    pub reconnects: u64,
    /// Failures of recorded (post-warm-up) requests.
    pub errors: ErrorCounts,
    /// Warm-up requests completed (successful or not).
    pub warmup_count: u64,
    /// Scheduled requests that were never sent because the connection fell too far behind.
    pub unsent: u64,
    /// SSE notifications received with recorded responses.
    pub notifications: u64,
    /// This connection's part of `--intervals` (warm-up included), if asked for.
    pub series: Option<SeriesRec>,
    /// When the next exchange could have gone out at the earliest (its intended time, or
    /// the previous answer's arrival if that came later): set by the loop before each
    /// `on_complete`, for the series' generator delay.
    ready: Option<Nanos>,
}

impl Recorder {
    /// Creates a recorder that ignores requests intended before `warmup_end`.
    pub fn new(warmup_end: Nanos) -> Recorder {
        Recorder {
            warmup_end,
            response: latency_histogram(),
            service: latency_histogram(),
            response_all: latency_histogram(),
            clamped: 0,
            last_done: 0,
            reconnects: 0,
            errors: ErrorCounts::default(),
            warmup_count: 0,
            unsent: 0,
            notifications: 0,
            series: None,
            ready: None,
        }
    }

    /// Notes when the exchange about to be recorded could have been sent at the earliest;
    /// its actual send minus this is the generator's own delay (its thread waking up and
    /// getting a CPU), which `--intervals` reports.
    pub fn ready_at(&mut self, ready: Nanos) {
        self.ready = Some(ready);
    }

    /// Hands everything the connection's `--intervals` part still holds to the series.
    pub fn finish_series(&mut self) {
        if let Some(series) = self.series.take() {
            series.finish();
        }
    }

    /// Records one finished exchange that was intended at `intended`, actually sent at
    /// `sent` and finished at `done` (all on the run's clock).
    ///
    /// Response time is `done - intended`, so a request that had to wait for a stalled
    /// predecessor carries that wait: coordinated omission is not hidden. A failure is
    /// counted by kind and recorded in `response_all` only.
    pub fn on_complete(
        &mut self,
        intended: Nanos,
        sent: Nanos,
        done: Nanos,
        outcome: &Result<Served, Failure>,
    ) {
        let ready = self.ready.take().unwrap_or(intended);
        if let Some(series) = &mut self.series {
            series.on_complete(intended, ready, sent, done, outcome);
        }
        if intended < self.warmup_end {
            self.warmup_count += 1;
            return;
        }
        let response = nanos_to_us(done.saturating_sub(intended));
        if response > LATENCY_US_MAX {
            self.clamped += 1;
        }
        self.response_all.saturating_record(response);
        match outcome {
            Ok(served) => {
                self.last_done = self.last_done.max(done);
                let service = nanos_to_us(done.saturating_sub(sent));
                self.response.saturating_record(response);
                self.service.saturating_record(service);
                self.notifications += served.notifications;
            }
            Err(failure) => self.errors.count(failure),
        }
    }

    /// Returns how many recorded requests succeeded.
    pub fn ok_count(&self) -> u64 {
        self.response.len()
    }

    /// Adds `other` into this recorder (histograms, errors and counters; `--intervals`
    /// parts go to the series file, not here).
    ///
    /// Returns an error only if the histograms were created with incompatible bounds, which
    /// `latency_histogram` never does.
    pub fn merge(&mut self, other: &Recorder) -> Result<(), hdrhistogram::AdditionError> {
        self.response.add(&other.response)?;
        self.service.add(&other.service)?;
        self.response_all.add(&other.response_all)?;
        self.clamped += other.clamped;
        self.last_done = self.last_done.max(other.last_done);
        self.reconnects += other.reconnects;
        self.errors.merge(&other.errors);
        self.warmup_count += other.warmup_count;
        self.unsent += other.unsent;
        self.notifications += other.notifications;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Nanos = 1_000_000;

    #[test]
    fn warmup_requests_are_counted_not_recorded() {
        let mut rec = Recorder::new(10 * MS);
        rec.on_complete(9 * MS, 9 * MS, 11 * MS, &Ok(Served::default()));
        rec.on_complete(10 * MS, 10 * MS, 11 * MS, &Ok(Served::default()));
        assert_eq!(rec.warmup_count, 1);
        assert_eq!(rec.ok_count(), 1);
        assert_eq!(rec.response.max(), 1000);
    }

    #[test]
    fn response_time_counts_from_intended_service_time_from_sent() {
        let mut rec = Recorder::new(0);
        rec.on_complete(0, 5 * MS, 6 * MS, &Ok(Served::default()));
        assert_eq!(rec.response.max(), rec.response.highest_equivalent(6000));
        assert_eq!(rec.service.max(), 1000);
    }

    #[test]
    fn failures_are_counted_by_kind_with_first_detail() {
        let mut rec = Recorder::new(0);
        rec.on_complete(
            0,
            0,
            1,
            &Err(Failure::new(ErrorKind::HttpStatus, "http 404")),
        );
        rec.on_complete(
            0,
            0,
            1,
            &Err(Failure::new(ErrorKind::HttpStatus, "http 500")),
        );
        rec.on_complete(0, 0, 1, &Err(Failure::new(ErrorKind::Timeout, "10 s")));
        assert_eq!(rec.errors.get(ErrorKind::HttpStatus), 2);
        assert_eq!(rec.errors.get(ErrorKind::Timeout), 1);
        assert_eq!(rec.errors.get(ErrorKind::Connect), 0);
        assert_eq!(rec.errors.total(), 3);
        assert_eq!(rec.errors.first(ErrorKind::HttpStatus), Some("http 404"));
        assert_eq!(rec.ok_count(), 0);
    }

    #[test]
    fn merging_adds_histograms_errors_and_counters() {
        let mut a = Recorder::new(0);
        let mut b = Recorder::new(0);
        for us in 1..=100u64 {
            a.on_complete(
                0,
                0,
                us * 1000,
                &Ok(Served {
                    notifications: 2,
                    lead: 0,
                }),
            );
        }
        for us in 101..=200u64 {
            b.on_complete(0, 0, us * 1000, &Ok(Served::default()));
        }
        b.on_complete(0, 0, 1, &Err(Failure::new(ErrorKind::Decode, "bad")));
        b.unsent = 3;
        a.merge(&b).unwrap_or_else(|e| panic!("merge: {e}"));
        assert_eq!(a.ok_count(), 200);
        assert_eq!(a.response.min(), 1);
        assert_eq!(a.response.max(), 200);
        assert_eq!(a.response.value_at_quantile(0.5), 100);
        assert_eq!(a.errors.get(ErrorKind::Decode), 1);
        assert_eq!(a.errors.first(ErrorKind::Decode), Some("bad"));
        assert_eq!(a.unsent, 3);
        assert_eq!(a.notifications, 200);
    }

    #[test]
    fn failures_are_in_the_histogram_with_errors_at_their_time_to_failure() {
        let mut rec = Recorder::new(0);
        rec.on_complete(0, 0, MS, &Ok(Served::default()));
        let timeout = Failure::new(ErrorKind::Timeout, "no complete response within 10s");
        rec.on_complete(0, 0, 10_000 * MS, &Err(timeout));
        assert_eq!(rec.ok_count(), 1);
        assert_eq!(rec.response.max(), 1000);
        assert_eq!(rec.response_all.len(), 2);
        assert_eq!(
            rec.response_all.max(),
            rec.response_all.highest_equivalent(10_000_000)
        );
    }

    #[test]
    fn latencies_past_the_histogram_are_counted_as_clamped() {
        let mut rec = Recorder::new(0);
        let beyond = (LATENCY_US_MAX + 5_000_000) * 1000;
        rec.on_complete(0, 0, beyond, &Ok(Served::default()));
        rec.on_complete(0, 0, MS, &Ok(Served::default()));
        assert_eq!(rec.clamped, 1);
        let mut total = Recorder::new(0);
        total.merge(&rec).unwrap_or_else(|e| panic!("merge: {e}"));
        assert_eq!(total.clamped, 1);
        assert_eq!(total.last_done, beyond);
    }

    #[test]
    fn nanos_round_to_nearest_microsecond_at_least_one() {
        assert_eq!(nanos_to_us(0), 1);
        assert_eq!(nanos_to_us(499), 1);
        assert_eq!(nanos_to_us(1_499), 1);
        assert_eq!(nanos_to_us(1_500), 2);
        assert_eq!(nanos_to_us(u64::MAX), u64::MAX / 1000);
    }
}
