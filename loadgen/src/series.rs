//! `--intervals FILE`: the run cut into fixed intervals (`--interval`, 1 s by default), one
//! JSON line per interval, written while the run goes on, for soak tests and anything
//! else that needs the figures over time rather than for the whole run.
//!
//! Each line describes the requests *intended* in that interval (open loop; the actual
//! send in closed loop): how many succeeded, failures by kind, and the percentiles of
//! their response time (from the intended send time, so a stall shows in the interval the
//! waiting requests were due in), of their service time (`service_p50_us`, ...: from the
//! actual send, what the target took once asked), and of the generator's own delay
//! (`generator_delay_p50_us`, ...: from the moment a request was due *and* its connection
//! free, the previous answer having arrived, to its send: the connection thread waking
//! up and getting a CPU; failed requests too). A target too slow for the schedule shows as
//! high service times; a generator that cannot keep up (a busy machine) as high generator
//! delays with service times that stay low. Beside them, `completed` counts the exchanges that
//! *finished* in the interval (successful or not) and `completed_ok` the successful ones
//! among them: the throughput a target managed in that second, dips included.
//!
//! Each connection thread keeps its current interval in a [`SeriesRec`] and hands it to
//! the shared [`Series`] once its next request is due in a later interval (one lock per
//! thread per interval). A connection sends in intended-time order with one request in
//! flight, so once it has moved past interval `k` nothing it does later belongs to `k`,
//! nor finishes in `k`. A line is written when every connection has moved past its
//! interval, in order, and intervals nobody sent in get a line too.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{SystemTime, UNIX_EPOCH};

use hdrhistogram::Histogram;
use serde_json::{Map, Value, json};

use crate::limits::SERIES_PENDING_MAX;
use crate::record::{ErrorKind, Failure, Served, latency_histogram, nanos_to_us};
use crate::schedule::Nanos;

/// The response-time percentiles every line gives, with their keys.
const QUANTILES: [(&str, f64); 4] = [
    ("p50_us", 0.5),
    ("p90_us", 0.9),
    ("p99_us", 0.99),
    ("p999_us", 0.999),
];

/// One interval's figures (of one connection, or merged).
#[derive(Debug)]
struct Slot {
    /// Response times (µs) of the successful requests intended in the interval.
    response: Histogram<u64>,
    /// Their service times (µs), from the actual send.
    service: Histogram<u64>,
    /// Response times (µs) of every request intended in the interval, a failed one at
    /// its time to failure: a failing target's worst moments stay in the latencies.
    with_errors: Histogram<u64>,
    /// The generator's delay (µs) before each send once it was due and possible.
    delay: Histogram<u64>,
    /// Failures of requests intended in the interval, by `ErrorKind::ALL` order.
    errors: [u64; ErrorKind::ALL.len()],
    /// Exchanges (successful or not) that finished in the interval.
    completed: u64,
    /// The successful ones among them.
    completed_ok: u64,
}

impl Slot {
    fn new() -> Slot {
        Slot {
            response: latency_histogram(),
            service: latency_histogram(),
            with_errors: latency_histogram(),
            delay: latency_histogram(),
            errors: [0; ErrorKind::ALL.len()],
            completed: 0,
            completed_ok: 0,
        }
    }

    fn add(&mut self, other: &Slot) {
        // Same bounds on both sides (`latency_histogram`), so adding cannot fail.
        let _ = self.response.add(&other.response);
        let _ = self.service.add(&other.service);
        let _ = self.with_errors.add(&other.with_errors);
        let _ = self.delay.add(&other.delay);
        for (mine, theirs) in self.errors.iter_mut().zip(other.errors) {
            *mine += theirs;
        }
        self.completed += other.completed;
        self.completed_ok += other.completed_ok;
    }

    fn clear(&mut self) {
        self.response.reset();
        self.service.reset();
        self.with_errors.reset();
        self.delay.reset();
        self.errors = [0; ErrorKind::ALL.len()];
        self.completed = 0;
        self.completed_ok = 0;
    }
}

/// What the connections have handed in and what is still to be written.
struct Shared {
    /// Merged slots of the intervals not written yet; `pending[0]` is interval `next`.
    pending: std::collections::VecDeque<Slot>,
    /// The first interval not written yet.
    next: u64,
    /// Per connection: every interval before this one is final for it (`u64::MAX`: the
    /// connection has finished).
    moved_past: Vec<u64>,
    out: BufWriter<File>,
    /// The first write error, reported at the end of the run.
    error: Option<std::io::Error>,
    /// Requests handed in after their interval's line was forced out (see
    /// `SERIES_PENDING_MAX`), not yet reported in a line.
    late_dropped: u64,
}

/// The run's series: where every connection's intervals meet and become lines.
pub struct Series {
    interval: Nanos,
    warmup_end: Nanos,
    /// Wall-clock seconds (Unix) at the run's time 0, set when the clock starts.
    origin_unix: Mutex<Option<f64>>,
    shared: Mutex<Shared>,
}

impl std::fmt::Debug for Series {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Series")
            .field("interval", &self.interval)
            .finish_non_exhaustive()
    }
}

impl Series {
    /// Creates the series file at `path` for `connections` connections; `interval` > 0.
    pub fn create(
        path: &Path,
        interval: Nanos,
        warmup_end: Nanos,
        connections: usize,
    ) -> std::io::Result<Arc<Series>> {
        let file = File::create(path)?;
        Ok(Arc::new(Series::with_writer(
            BufWriter::new(file),
            interval,
            warmup_end,
            connections,
        )))
    }

    fn with_writer(
        out: BufWriter<File>,
        interval: Nanos,
        warmup_end: Nanos,
        connections: usize,
    ) -> Series {
        Series {
            interval: interval.max(1),
            warmup_end,
            origin_unix: Mutex::new(None),
            shared: Mutex::new(Shared {
                pending: std::collections::VecDeque::new(),
                next: 0,
                moved_past: vec![0; connections],
                out,
                error: None,
                late_dropped: 0,
            }),
        }
    }

    /// Notes the wall-clock time of the run's time 0 (the lines carry it).
    pub fn start_now(&self) {
        let unix = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        *lock(&self.origin_unix) = Some(unix);
    }

    /// The recorder of connection `index`.
    pub fn recorder(self: &Arc<Series>, index: usize) -> SeriesRec {
        SeriesRec {
            series: Arc::clone(self),
            index,
            current: 0,
            slot: Slot::new(),
            completed: Finished::new(),
        }
    }

    /// Interval index of time `t`.
    fn index_of(&self, t: Nanos) -> u64 {
        t / self.interval
    }

    /// Takes connection `index`'s figures of interval `at` (`slot`) and its completion
    /// counts of intervals before `moved_past`, notes that every interval before
    /// `moved_past` is final for it, and writes the lines that became final for all.
    fn hand_in(
        &self,
        index: usize,
        at: u64,
        slot: &Slot,
        completed: &mut Finished,
        moved_past: u64,
    ) {
        let origin = *lock(&self.origin_unix);
        let mut shared = lock(&self.shared);
        let shared = &mut *shared;
        let mut merge = |k: u64, count: u64, f: &dyn Fn(&mut Slot)| {
            // A connection far behind the others would make the pending lines grow without
            // limit: past `SERIES_PENDING_MAX`, the oldest are written without its part.
            while k >= shared.next && k - shared.next >= SERIES_PENDING_MAX as u64 {
                self.write_next(shared, origin, true);
            }
            if k < shared.next {
                // Its line is written already (only when forced out above): counted.
                shared.late_dropped += count;
                return;
            }
            let offset = usize::try_from(k - shared.next).unwrap_or(usize::MAX);
            if offset >= shared.pending.len() {
                shared
                    .pending
                    .resize_with(offset.saturating_add(1), Slot::new);
            }
            if let Some(s) = shared.pending.get_mut(offset) {
                f(s);
            }
        };
        merge(at, slot.with_errors.len(), &|s: &mut Slot| s.add(slot));
        let keep = completed.split_off(&moved_past);
        for (k, (n, ok)) in std::mem::replace(completed, keep) {
            merge(k, 0, &|s: &mut Slot| {
                s.completed += n;
                s.completed_ok += ok;
            });
        }
        if let Some(m) = shared.moved_past.get_mut(index) {
            *m = (*m).max(moved_past);
        }
        let everyone = shared.moved_past.iter().copied().min().unwrap_or(u64::MAX);
        let last = if everyone == u64::MAX {
            // Every connection has finished: write what is left, then stop.
            shared.next + shared.pending.len() as u64
        } else {
            everyone
        };
        while shared.next < last {
            self.write_next(shared, origin, false);
        }
    }

    /// Writes the line of interval `shared.next` and moves on; `incomplete` marks a line
    /// written before every connection had handed its part in.
    fn write_next(&self, shared: &mut Shared, origin: Option<f64>, incomplete: bool) {
        let slot = shared.pending.pop_front().unwrap_or_else(Slot::new);
        let mut line = self.line(shared.next, &slot, origin);
        line["incomplete"] = json!(incomplete);
        line["late_dropped"] = json!(std::mem::take(&mut shared.late_dropped));
        if shared.error.is_none()
            && let Err(e) = writeln!(shared.out, "{line}").and_then(|()| shared.out.flush())
        {
            shared.error = Some(e);
        }
        shared.next += 1;
    }

    /// The JSON line of interval `k`.
    fn line(&self, k: u64, slot: &Slot, origin_unix: Option<f64>) -> Value {
        let start = k.saturating_mul(self.interval);
        let secs = self.interval as f64 / 1e9;
        let mut errors = Map::new();
        for (kind, n) in ErrorKind::ALL.iter().zip(slot.errors) {
            errors.insert(kind.name().to_owned(), json!(n));
        }
        let ok = slot.response.len();
        let mut v = json!({
            "t_s": start as f64 / 1e9,
            "interval_s": secs,
            "warmup": start < self.warmup_end,
            "ok": ok,
            "errors": errors,
            "completed": slot.completed,
            "completed_per_s": slot.completed as f64 / secs,
            "completed_ok": slot.completed_ok,
            "completed_ok_per_s": slot.completed_ok as f64 / secs,
        });
        if let Some(origin) = origin_unix {
            v["unix"] = json!(origin + start as f64 / 1e9);
        }
        for (key, q) in QUANTILES {
            v[key] = if ok > 0 {
                json!(slot.response.value_at_quantile(q))
            } else {
                Value::Null
            };
        }
        for (key, q) in QUANTILES {
            v[format!("service_{key}")] = if ok > 0 {
                json!(slot.service.value_at_quantile(q))
            } else {
                Value::Null
            };
        }
        let sent = slot.delay.len();
        for (key, q) in [("p50_us", 0.5), ("p99_us", 0.99)] {
            v[format!("generator_delay_{key}")] = if sent > 0 {
                json!(slot.delay.value_at_quantile(q))
            } else {
                Value::Null
            };
        }
        v["generator_delay_max_us"] = if sent > 0 {
            json!(slot.delay.max())
        } else {
            Value::Null
        };
        v["max_us"] = if ok > 0 {
            json!(slot.response.max())
        } else {
            Value::Null
        };
        let all = slot.with_errors.len();
        for (key, value) in [
            (
                "with_errors_p99_us",
                slot.with_errors.value_at_quantile(0.99),
            ),
            ("with_errors_max_us", slot.with_errors.max()),
        ] {
            v[key] = if all > 0 { json!(value) } else { Value::Null };
        }
        v
    }

    /// The first error writing the file, if any (taken: reported once).
    pub fn take_error(&self) -> Option<std::io::Error> {
        lock(&self.shared).error.take()
    }
}

/// A poisoned lock only means another connection thread panicked; the data is counts.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Exchanges finished per interval, (all, successful), not handed in yet.
type Finished = std::collections::BTreeMap<u64, (u64, u64)>;

/// One connection's part of the series: its current interval, handed in when it moves on.
#[derive(Debug)]
pub struct SeriesRec {
    series: Arc<Series>,
    index: usize,
    /// The interval `slot` holds.
    current: u64,
    slot: Slot,
    /// Exchanges finished per interval, not handed in yet.
    completed: Finished,
}

impl SeriesRec {
    /// Counts one exchange intended at `intended` that finished at `done` (a connection's
    /// exchanges come in intended order).
    pub fn on_complete(
        &mut self,
        intended: Nanos,
        ready: Nanos,
        sent: Nanos,
        done: Nanos,
        outcome: &Result<Served, Failure>,
    ) {
        let at = self.series.index_of(intended);
        if at > self.current {
            self.hand_in(at);
            self.current = at;
        }
        self.slot
            .delay
            .saturating_record(nanos_to_us(sent.saturating_sub(ready)));
        self.slot
            .with_errors
            .saturating_record(nanos_to_us(done.saturating_sub(intended)));
        match outcome {
            Ok(_) => {
                let slot = &mut self.slot;
                slot.response
                    .saturating_record(nanos_to_us(done.saturating_sub(intended)));
                slot.service
                    .saturating_record(nanos_to_us(done.saturating_sub(sent)));
            }
            Err(failure) => {
                let i = ErrorKind::ALL
                    .iter()
                    .position(|k| *k == failure.kind)
                    .unwrap_or(0);
                if let Some(n) = self.slot.errors.get_mut(i) {
                    *n += 1;
                }
            }
        }
        let finished = self
            .completed
            .entry(self.series.index_of(done.max(intended)))
            .or_insert((0, 0));
        finished.0 += 1;
        finished.1 += u64::from(outcome.is_ok());
    }

    /// Hands in the current interval; every interval before `moved_past` is final.
    fn hand_in(&mut self, moved_past: u64) {
        self.series.hand_in(
            self.index,
            self.current,
            &self.slot,
            &mut self.completed,
            moved_past,
        );
        self.slot.clear();
    }

    /// The connection is done: hands in everything it holds.
    pub fn finish(mut self) {
        self.hand_in(u64::MAX);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::Failure;

    const MS: Nanos = 1_000_000;
    const SEC: Nanos = 1_000_000_000;

    fn temp(name: &str) -> std::path::PathBuf {
        std::env::temp_dir().join(format!("mcpyard-series-{}-{name}", std::process::id()))
    }

    fn lines(path: &Path) -> Vec<Value> {
        std::fs::read_to_string(path)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
            .collect()
    }

    #[test]
    fn lines_wait_for_every_connection_and_count_by_intended_and_finished_time() {
        let path = temp("two");
        let series = Series::create(&path, SEC, SEC, 2).unwrap_or_else(|e| panic!("{e}"));
        series.start_now();
        let mut a = series.recorder(0);
        let mut b = series.recorder(1);
        let ok = Ok(Served::default());
        // Connection a: 10 requests in second 0 (1 ms each), then one in second 2 that
        // failed; second 1 sees nothing from a.
        for i in 0..10 {
            a.on_complete(
                i * 100 * MS,
                i * 100 * MS,
                i * 100 * MS,
                i * 100 * MS + MS,
                &ok,
            );
        }
        a.on_complete(
            2 * SEC,
            2 * SEC,
            2 * SEC,
            2 * SEC + MS,
            &Err(Failure::new(ErrorKind::Io, "x")),
        );
        // a has moved past seconds 0 and 1, b has not started: nothing written yet.
        assert!(lines(&path).is_empty());
        // Connection b: one request intended at 0.5 s, sent at 0.9 s, finished 1 s after it
        // was due (in second 1), then one at 1.6 s.
        b.on_complete(SEC / 2, SEC / 2, SEC / 2 + 400 * MS, SEC / 2 + SEC, &ok);
        b.on_complete(
            SEC + 600 * MS,
            SEC + 600 * MS,
            SEC + 600 * MS,
            SEC + 610 * MS,
            &ok,
        );
        // Both have moved past second 0 now.
        let got = lines(&path);
        assert_eq!(got.len(), 1, "{got:?}");
        assert_eq!(got[0]["ok"], 11);
        assert_eq!(got[0]["completed"], 10, "b's slow one finished in second 1");
        assert_eq!(got[0]["warmup"], true);
        let h = latency_histogram();
        assert_eq!(
            got[0]["max_us"],
            h.highest_equivalent(1_000_000),
            "{}",
            got[0]
        );
        assert_eq!(got[0]["service_p999_us"], h.highest_equivalent(600_000));
        assert_eq!(got[0]["service_p50_us"], h.highest_equivalent(1_000));
        // b's first was due at 0.5 s and went out at 0.9 s: the generator's delay.
        assert_eq!(
            got[0]["generator_delay_max_us"],
            h.highest_equivalent(400_000)
        );
        assert_eq!(got[0]["generator_delay_p50_us"], 1);
        assert!(got[0]["unix"].as_f64().is_some_and(|u| u > 1e9));
        a.finish();
        b.finish();
        let got = lines(&path);
        assert_eq!(got.len(), 3, "{got:?}");
        assert_eq!(got[1]["t_s"], 1.0);
        assert_eq!(got[1]["ok"], 1);
        assert_eq!(got[1]["completed"], 2);
        assert_eq!(got[1]["warmup"], false);
        assert_eq!(got[1]["p50_us"], h.highest_equivalent(10_000));
        assert_eq!(got[2]["ok"], 0);
        assert_eq!(got[2]["errors"]["io"], 1);
        assert_eq!(got[2]["completed"], 1);
        assert_eq!(got[2]["completed_ok"], 0);
        assert_eq!(got[1]["completed_ok"], 2);
        assert_eq!(got[2]["p99_us"], Value::Null);
        // The failed request is in the latencies with errors, at its time to failure.
        assert_eq!(got[2]["with_errors_max_us"], 1000);
        assert_eq!(got[0]["incomplete"], false);
        assert!(series.take_error().is_none());
        let _ = std::fs::remove_file(path);
    }

    #[test]
    fn a_stalled_connection_holds_back_at_most_the_bound_of_lines_and_late_data_is_counted() {
        let path = temp("stall");
        let series = Series::create(&path, MS, 0, 2).unwrap_or_else(|e| panic!("{e}"));
        let mut fast = series.recorder(0);
        let mut stalled = series.recorder(1);
        let ok = Ok(Served::default());
        // The stalled connection's one request is in interval 0 and it has not moved on;
        // the other runs far past the bound.
        stalled.on_complete(0, 0, 0, 1, &ok);
        let far = SERIES_PENDING_MAX as u64 + 10;
        for k in 0..=far {
            fast.on_complete(k * MS, k * MS, k * MS, k * MS + 1, &ok);
        }
        let got = lines(&path);
        assert!(!got.is_empty(), "the oldest lines were forced out");
        assert!(got.len() as u64 <= far, "{}", got.len());
        assert!(got.iter().all(|l| l["incomplete"] == true));
        // The stalled connection's interval-0 part now arrives too late for its line.
        stalled.finish();
        fast.finish();
        let got = lines(&path);
        assert_eq!(got.len() as u64, far + 1);
        let dropped: u64 = got.iter().filter_map(|l| l["late_dropped"].as_u64()).sum();
        assert_eq!(dropped, 1);
        let _ = std::fs::remove_file(path);
    }

    #[test]
    fn an_interval_nobody_sent_in_still_gets_its_line() {
        let path = temp("gap");
        let series = Series::create(&path, SEC, 0, 1).unwrap_or_else(|e| panic!("{e}"));
        let mut a = series.recorder(0);
        let ok = Ok(Served::default());
        a.on_complete(0, 0, 0, MS, &ok);
        // A stall: the next request was intended at 3.2 s.
        a.on_complete(
            3 * SEC + 200 * MS,
            3 * SEC + 200 * MS,
            3 * SEC + 200 * MS,
            3 * SEC + 201 * MS,
            &ok,
        );
        a.finish();
        let got = lines(&path);
        let oks: Vec<u64> = got.iter().filter_map(|v| v["ok"].as_u64()).collect();
        assert_eq!(oks, [1, 0, 0, 1]);
        assert_eq!(got[1]["completed_per_s"], 0.0);
        assert_eq!(got[3]["t_s"], 3.0);
        let _ = std::fs::remove_file(path);
    }
}
