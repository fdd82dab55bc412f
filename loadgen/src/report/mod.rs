//! Reports: the table printed after a run, and the `--json`, `--hgrm` and `--svg` files.
//!
//! Everything is computed from the merged [`Recorder`] (or, for fan-out, the delivery
//! histogram), so the printed table and the files always agree.

pub mod hgrm;
pub mod svg;

use std::fmt::Write as _;
use std::path::Path;

use hdrhistogram::Histogram;
use serde_json::{Map, Value, json};

use crate::args::{Mode, RunArgs};
use crate::limits::{CONNECTION_BUSY_AIM, CONNECTION_BUSY_WARN, LATENCY_US_MAX};
use crate::record::{ErrorKind, Recorder};
use crate::run::RunError;
use crate::schedule::nanos;

/// The quantiles the table shows, with their labels.
pub const TABLE_QUANTILES: [(&str, f64); 4] =
    [("p50", 0.5), ("p90", 0.9), ("p99", 0.99), ("p99.9", 0.999)];

/// Requests per second achieved below this fraction of the target get a warning.
pub const ACHIEVED_RATE_MIN: f64 = 0.99;

/// The headline numbers of a request run.
#[derive(Clone, Debug, PartialEq)]
pub struct Figures {
    /// The measured window in seconds: `--duration` for a closed loop; for an open loop,
    /// from the end of warm-up to the last successful completion, or to the scheduled end
    /// if that is later. A lagging open-loop run keeps finishing requests past
    /// `--duration`; dividing those by `--duration` would overstate what the target
    /// achieved.
    pub measured_secs: f64,
    /// Successful recorded requests per second of the measured window.
    pub throughput: f64,
    /// Recorded requests completed (successful or not) per second of the measured window.
    pub sent_rate: f64,
    /// The target rate, open loop only.
    pub target_rate: Option<u64>,
    /// Open loop: the share of time each connection is busy with an exchange (mean
    /// service time x rate / connections); 1 means no idle time at all.
    pub connection_busy: Option<f64>,
}

impl Figures {
    /// Computes the figures of `rec` for a run of `args`.
    pub fn of(args: &RunArgs, rec: &Recorder) -> Figures {
        let target_rate = match args.mode {
            Mode::Open { rate } => Some(rate),
            Mode::Closed => None,
        };
        // A closed loop sends nothing past the scheduled end: the requests still in
        // flight then (one slow one can take --timeout) finish outside the window.
        let ran_past = match args.mode {
            Mode::Open { .. } => rec.last_done.saturating_sub(nanos(args.warmup)),
            Mode::Closed => 0,
        };
        let secs = (ran_past as f64 / 1e9)
            .max(args.duration.as_secs_f64())
            .max(1e-9);
        let connection_busy = target_rate
            .filter(|_| rec.ok_count() > 0)
            .map(|rate| rec.service.mean() * 1e-6 * rate as f64 / args.connections.max(1) as f64);
        Figures {
            measured_secs: secs,
            throughput: rec.ok_count() as f64 / secs,
            sent_rate: (rec.ok_count() + rec.errors.total()) as f64 / secs,
            target_rate,
            connection_busy,
        }
    }

    /// The connections an open-loop run at this rate and service time should have, when
    /// it had too few (see [`CONNECTION_BUSY_WARN`]).
    pub fn connections_wanted(&self, connections: usize) -> Option<usize> {
        let busy = self.connection_busy?;
        (busy > CONNECTION_BUSY_WARN)
            .then(|| (busy * connections as f64 / CONNECTION_BUSY_AIM).ceil() as usize)
    }

    /// Returns true if an open-loop run fell short of its target rate.
    pub fn rate_short(&self) -> bool {
        self.target_rate
            .is_some_and(|rate| self.sent_rate < rate as f64 * ACHIEVED_RATE_MIN)
    }
}

/// Renders the table printed after a request run.
pub fn table(args: &RunArgs, rec: &Recorder) -> String {
    let fig = Figures::of(args, rec);
    let mut out = String::new();
    let mode = match args.mode {
        Mode::Open { rate } => format!("open-loop {rate} req/s"),
        Mode::Closed => "closed-loop".into(),
    };
    // `fmt::Write` for `String` never fails; results are ignored for that reason.
    let _ = writeln!(
        out,
        "mcpyard-loadgen {} {mode}, {} connections, {:.1} s (+{:.1} s warm-up), {}://{}{}, \
         receive time: {}{}",
        args.scenario.name(),
        args.connections,
        args.duration.as_secs_f64(),
        args.warmup.as_secs_f64(),
        if args.target.tls { "https" } else { "http" },
        args.target.authority,
        args.target.path,
        args.receive_time.name(),
        match (args.new_connection, args.target.tls) {
            (true, true) => format!(
                ", a new connection per request (TLS resumption {})",
                args.tls_resumption.name()
            ),
            (true, false) => ", a new connection per request".to_owned(),
            (false, _) => String::new(),
        }
    );
    let _ = write!(
        out,
        "requests {:>10} ok {:>8} errors {:>8} unsent   throughput {:.1} req/s over {:.2} s",
        rec.ok_count(),
        rec.errors.total(),
        rec.unsent,
        fig.throughput,
        fig.measured_secs
    );
    if let Some(rate) = fig.target_rate {
        let _ = write!(
            out,
            " (offered {rate}/s; completed {:.1}/s = {:.1} % of it)",
            fig.sent_rate,
            100.0 * fig.sent_rate / rate as f64
        );
    }
    out.push('\n');
    let _ = write!(out, "errors  ");
    for kind in ErrorKind::ALL {
        let _ = write!(out, " {} {}", kind.name(), rec.errors.get(kind));
    }
    let _ = writeln!(
        out,
        "   reconnects {} (idle keep-alive closed by the target)",
        rec.reconnects
    );
    for kind in ErrorKind::ALL {
        if let Some(detail) = rec.errors.first(kind) {
            let _ = writeln!(out, "  first {}: {detail}", kind.name());
        }
    }
    if rec.notifications > 0 {
        let _ = writeln!(
            out,
            "notifications {} ({:.2} per request)",
            rec.notifications,
            rec.notifications as f64 / rec.ok_count().max(1) as f64
        );
    }
    out.push_str(&latency_rows(&[
        ("response", &rec.response),
        ("service", &rec.service),
        ("with errors", &rec.response_all),
    ]));
    if rec.errors.total() > 0 {
        let _ = writeln!(
            out,
            "note: response and service hold the {} successful requests; with errors also \
             holds the {} failed ones at their time to failure (a timeout at --timeout or more)",
            rec.ok_count(),
            rec.errors.total()
        );
    }
    if rec.clamped > 0 {
        let _ = writeln!(
            out,
            "warning: {} requests took longer than the histograms' {} s and were recorded \
             as {} s: the max shown is a clamp",
            rec.clamped,
            LATENCY_US_MAX / 1_000_000,
            LATENCY_US_MAX / 1_000_000
        );
    }
    if let (Some(busy), Some(wanted)) = (
        fig.connection_busy,
        fig.connections_wanted(args.connections),
    ) {
        let _ = writeln!(
            out,
            "warning: each connection was busy {:.0} % of the time (mean service time x rate \
             / connections): too little idle time to absorb a late answer, so the generator \
             falls behind and latency from the intended send grows while service time does \
             not; use --connections {wanted} or more",
            busy * 100.0
        );
    }
    if fig.rate_short() {
        let _ = writeln!(
            out,
            "warning: sent below {:.0} % of the target rate; the generator or the target is \
             saturated, so these latencies understate the schedule",
            ACHIEVED_RATE_MIN * 100.0
        );
    }
    out
}

/// Renders the latency rows (µs) of the named histograms under one header.
pub fn latency_rows(rows: &[(&str, &Histogram<u64>)]) -> String {
    let mut out = String::new();
    let _ = write!(out, "{:<14}", "latency (us)");
    for (label, _) in TABLE_QUANTILES {
        let _ = write!(out, " {label:>9}");
    }
    let _ = writeln!(out, " {:>9} {:>9}", "max", "mean");
    for (name, hist) in rows {
        let _ = write!(out, "{name:<14}");
        for (_, q) in TABLE_QUANTILES {
            let _ = write!(out, " {:>9}", hist.value_at_quantile(q));
        }
        let _ = writeln!(out, " {:>9} {:>9.1}", hist.max(), hist.mean());
    }
    out
}

/// The summary of one histogram (µs) as JSON, with its percentile steps.
pub fn histogram_json(hist: &Histogram<u64>) -> Value {
    let mut summary = Map::new();
    summary.insert("count".into(), json!(hist.len()));
    for (label, q) in TABLE_QUANTILES {
        summary.insert(label.replace('.', "_"), json!(hist.value_at_quantile(q)));
    }
    summary.insert("max".into(), json!(hist.max()));
    summary.insert("mean".into(), json!(hist.mean()));
    summary.insert("stdev".into(), json!(hist.stdev()));
    let steps: Vec<Value> = hist
        .iter_quantiles(hgrm::TICKS_PER_HALF_DISTANCE)
        .map(|step| {
            json!({
                "percentile": step.quantile_iterated_to() * 100.0,
                "value_us": step.value_iterated_to(),
                "count": step.count_since_last_iteration(),
            })
        })
        .collect();
    summary.insert("percentiles".into(), Value::Array(steps));
    Value::Object(summary)
}

/// The JSON report of a request run.
pub fn run_json(args: &RunArgs, rec: &Recorder) -> Value {
    let fig = Figures::of(args, rec);
    let errors: Map<String, Value> = ErrorKind::ALL
        .iter()
        .map(|k| (k.name().to_owned(), json!(rec.errors.get(*k))))
        .collect();
    let examples: Map<String, Value> = ErrorKind::ALL
        .iter()
        .filter_map(|k| Some((k.name().to_owned(), json!(rec.errors.first(*k)?))))
        .collect();
    json!({
        "scenario": args.scenario.name(),
        "mode": if fig.target_rate.is_some() { "open" } else { "closed" },
        "target_rate": fig.target_rate,
        "url": format!(
            "{}://{}{}",
            if args.target.tls { "https" } else { "http" },
            args.target.authority,
            args.target.path
        ),
        "tls": args.target.tls,
        "tls_resumption": args.target.tls.then(|| args.tls_resumption.name()),
        "new_connection": args.new_connection,
        "connections": args.connections,
        "duration_s": args.duration.as_secs_f64(),
        "warmup_s": args.warmup.as_secs_f64(),
        "receive_time": args.receive_time.name(),
        "no_initialize": args.no_initialize,
        "request_id": args.request_id,
        "requests_ok": rec.ok_count(),
        "errors": errors,
        "error_examples": examples,
        "unsent": rec.unsent,
        "warmup_requests": rec.warmup_count,
        "notifications": rec.notifications,
        "measured_s": fig.measured_secs,
        "throughput_rps": fig.throughput,
        "sent_rps": fig.sent_rate,
        "offered_rps": fig.target_rate,
        "reconnects": rec.reconnects,
        "latency_clamped": rec.clamped,
        "latency_max_us": LATENCY_US_MAX,
        "connection_busy": fig.connection_busy,
        "response_us": histogram_json(&rec.response),
        "service_us": histogram_json(&rec.service),
        "response_with_errors_us": histogram_json(&rec.response_all),
    })
}

/// Writes `text` to `path`, mapping failure to a [`RunError`] that names the file.
pub fn write_file(path: &Path, text: &str) -> Result<(), RunError> {
    std::fs::write(path, text).map_err(|err| RunError::Write {
        path: path.display().to_string(),
        err,
    })
}

/// Writes whichever of `--json`, `--hgrm` and `--svg` were asked for.
pub fn write_files(
    args: &RunArgs,
    json: &Value,
    hist: &Histogram<u64>,
    title: &str,
) -> Result<(), RunError> {
    if let Some(path) = &args.json {
        let mut text = serde_json::to_string_pretty(json).unwrap_or_else(|_| json.to_string());
        text.push('\n');
        write_file(path, &text)?;
    }
    if let Some(path) = &args.hgrm {
        write_file(path, &hgrm::render(hist))?;
    }
    if let Some(path) = &args.svg {
        write_file(path, &svg::render(hist, title))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::args::{ReceiveTime, Scenario, Target};
    use crate::record::{Failure, Served};
    use std::time::Duration;

    fn args(mode: Mode) -> RunArgs {
        RunArgs {
            target: Target {
                authority: "127.0.0.1:1".into(),
                path: "/mcp".into(),
                tls: false,
                headers: Vec::new(),
            },
            scenario: Scenario::ToolsCall,
            mode,
            connections: 2,
            duration: Duration::from_secs(2),
            warmup: Duration::ZERO,
            timeout: Duration::from_secs(1),
            receive_time: ReceiveTime::Kernel,
            params_bytes: 0,
            tool: "echo".into(),
            args_json: None,
            sessions: 1,
            trigger: None,
            rounds: 1,
            no_initialize: false,
            request_id: None,
            json: None,
            hgrm: None,
            svg: None,
            new_connection: false,
            tls_ca: None,
            tls_resumption: crate::tls::Resumption::On,
            session_calls: 0,
            intervals: None,
            interval: Duration::from_secs(1),
        }
    }

    fn recorder() -> Recorder {
        let mut rec = Recorder::new(0);
        for us in 1..=1000u64 {
            rec.on_complete(0, 0, us * 1000, &Ok(Served::default()));
        }
        rec.on_complete(
            0,
            0,
            1,
            &Err(Failure::new(ErrorKind::Timeout, "read: timed out")),
        );
        rec
    }

    #[test]
    fn figures_use_measured_time() {
        let fig = Figures::of(&args(Mode::Open { rate: 1000 }), &recorder());
        assert_eq!(fig.throughput, 500.0);
        assert_eq!(fig.sent_rate, 500.5);
        assert!(fig.rate_short());
        assert!(!Figures::of(&args(Mode::Closed), &recorder()).rate_short());
    }

    #[test]
    fn completions_past_the_duration_stretch_the_window_they_are_divided_by() {
        // A 2 s run whose lagging connections finish their 1000 requests at 4 s: the
        // target achieved 250 req/s, not 500.
        let mut rec = Recorder::new(0);
        for i in 1..=1000u64 {
            rec.on_complete(0, 0, i * 4_000_000, &Ok(Served::default()));
        }
        let fig = Figures::of(&args(Mode::Open { rate: 1000 }), &rec);
        assert_eq!(fig.measured_secs, 4.0);
        assert_eq!(fig.throughput, 250.0);
        let v = run_json(&args(Mode::Open { rate: 1000 }), &rec);
        assert_eq!(v["offered_rps"], 1000);
        assert_eq!(v["measured_s"], 4.0);
    }

    #[test]
    fn clamped_latencies_are_shown_in_the_table_and_json() {
        let mut rec = recorder();
        rec.on_complete(
            0,
            0,
            (LATENCY_US_MAX + 1_000_000) * 1000,
            &Ok(Served::default()),
        );
        let text = table(&args(Mode::Closed), &rec);
        assert!(text.contains("1 requests took longer"), "{text}");
        assert_eq!(run_json(&args(Mode::Closed), &rec)["latency_clamped"], 1);
        assert_eq!(
            run_json(&args(Mode::Closed), &recorder())["latency_clamped"],
            0
        );
    }

    #[test]
    fn table_shows_counts_errors_and_percentiles() {
        let text = table(&args(Mode::Open { rate: 500 }), &recorder());
        assert!(text.contains("requests       1000 ok        1 errors        0 unsent"));
        assert!(text.contains("receive time: kernel"));
        assert!(text.contains("timeout 1"));
        assert!(text.contains("first timeout: read: timed out"));
        assert!(text.contains("response             500       900       990       999      1000"));
        assert!(!text.contains("warning"));
    }

    #[test]
    fn an_open_loop_run_with_busy_connections_is_told_to_use_more() {
        // Mean service 500.5 µs at 2000 req/s over 2 connections: each is busy half the
        // time; 5 connections bring that to a quarter.
        let fig = Figures::of(&args(Mode::Open { rate: 2000 }), &recorder());
        assert!(
            fig.connection_busy
                .is_some_and(|b| (b - 0.5005).abs() < 1e-3)
        );
        assert_eq!(fig.connections_wanted(2), Some(5));
        let text = table(&args(Mode::Open { rate: 2000 }), &recorder());
        assert!(text.contains("busy 50 % of the time"), "{text}");
        assert!(text.contains("use --connections 5 or more"), "{text}");
        // At 500 req/s each connection idles seven eighths of the time: no warning.
        let fig = Figures::of(&args(Mode::Open { rate: 500 }), &recorder());
        assert_eq!(fig.connections_wanted(2), None);
        assert_eq!(
            Figures::of(&args(Mode::Closed), &recorder()).connection_busy,
            None
        );
        let v = run_json(&args(Mode::Open { rate: 2000 }), &recorder());
        assert!(v["connection_busy"].as_f64().is_some());
    }

    #[test]
    fn json_has_errors_by_kind_and_percentiles() {
        let v = run_json(&args(Mode::Closed), &recorder());
        assert_eq!(v["mode"], "closed");
        assert_eq!(v["receive_time"], "kernel");
        assert_eq!(v["errors"]["timeout"], 1);
        assert_eq!(v["errors"]["connect"], 0);
        assert_eq!(v["response_us"]["p50"], 500);
        assert_eq!(v["response_us"]["p99_9"], 999);
        assert!(
            v["response_us"]["percentiles"]
                .as_array()
                .is_some_and(|a| a.len() > 10)
        );
    }
}
