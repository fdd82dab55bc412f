//! The HdrHistogram percentile distribution text (`.hgrm`), the format HdrHistogram's own
//! `outputPercentileDistribution` prints and its online plotter reads.
//!
//! Layout: a header line and a blank line; one line per percentile step with the value,
//! the percentile as a fraction, the count up to that value and `1/(1-percentile)` (left
//! out on the final 100 % line); then three `#[...]` summary lines. Values are written in
//! milliseconds (recorded in µs, divided by 1000), as wrk2 does.

use std::fmt::Write as _;

use hdrhistogram::Histogram;

/// Percentile steps per halving of the distance to 100 %, as HdrHistogram's default.
pub const TICKS_PER_HALF_DISTANCE: u32 = 5;

/// Recorded values (µs) per written unit (ms).
pub const US_PER_OUTPUT_UNIT: f64 = 1000.0;

/// Renders `hist` (values in µs) as `.hgrm` text in milliseconds.
pub fn render(hist: &Histogram<u64>) -> String {
    let mut out = String::new();
    // `fmt::Write` for `String` never fails; the results are ignored for that reason.
    let _ = writeln!(
        out,
        "{:>12} {:>14} {:>10} {:>14}\n",
        "Value", "Percentile", "TotalCount", "1/(1-Percentile)"
    );
    let mut total = 0u64;
    for step in hist.iter_quantiles(TICKS_PER_HALF_DISTANCE) {
        total += step.count_since_last_iteration();
        let value = step.value_iterated_to() as f64 / US_PER_OUTPUT_UNIT;
        let q = step.quantile_iterated_to();
        if q < 1.0 {
            let _ = writeln!(
                out,
                "{value:12.3} {q:2.12} {total:10} {:14.2}",
                1.0 / (1.0 - q)
            );
        } else {
            let _ = writeln!(out, "{value:12.3} {q:2.12} {total:10}");
        }
    }
    let scale = |v: f64| v / US_PER_OUTPUT_UNIT;
    let _ = writeln!(
        out,
        "#[Mean    = {:12.3}, StdDeviation   = {:12.3}]",
        scale(hist.mean()),
        scale(hist.stdev())
    );
    let _ = writeln!(
        out,
        "#[Max     = {:12.3}, Total count    = {:12}]",
        scale(hist.max() as f64),
        hist.len()
    );
    let _ = writeln!(
        out,
        "#[Buckets = {:12}, SubBuckets     = {:12}]",
        hist.buckets(),
        sub_bucket_count(hist.sigfig())
    );
    out
}

/// The sub-buckets per bucket of a histogram with `sigfig` significant figures: the
/// smallest power of two that resolves `2 * 10^sigfig` distinct values.
fn sub_bucket_count(sigfig: u8) -> u64 {
    let single_unit_resolution = 2 * 10u64.pow(u32::from(sigfig));
    single_unit_resolution.next_power_of_two()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::latency_histogram;

    #[test]
    fn uniform_values_render_in_the_standard_layout() {
        let mut h = latency_histogram();
        for us in 1..=1000u64 {
            h.saturating_record(us);
        }
        let text = render(&h);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines.first().copied(),
            Some("       Value     Percentile TotalCount 1/(1-Percentile)")
        );
        assert_eq!(lines.get(1).copied(), Some(""));
        assert_eq!(
            lines.get(2).copied(),
            Some("       0.001 0.000000000000          1           1.00")
        );
        assert!(lines.contains(&"       0.500 0.500000000000        500           2.00"));
        assert!(lines.contains(&"       0.901 0.900000000000        901          10.00"));
        let last_step = lines.iter().rev().nth(3).copied();
        assert_eq!(last_step, Some("       1.000 1.000000000000       1000"));
        let footer: Vec<&str> = lines.iter().rev().take(3).rev().copied().collect();
        assert_eq!(
            footer,
            [
                "#[Mean    =        0.500, StdDeviation   =        0.289]",
                "#[Max     =        1.000, Total count    =         1000]",
                &format!(
                    "#[Buckets = {:12}, SubBuckets     =         2048]",
                    h.buckets()
                ),
            ]
        );
    }

    #[test]
    fn counts_are_cumulative_and_end_at_the_total() {
        let mut h = latency_histogram();
        h.saturating_record_n(100, 99);
        h.saturating_record(5000);
        let text = render(&h);
        // 5000 µs lands in a bucket whose highest equivalent value is 5003 µs.
        let counts: Vec<u64> = text
            .lines()
            .skip(2)
            .take_while(|l| !l.starts_with('#'))
            .filter_map(|l| l.split_whitespace().nth(2)?.parse().ok())
            .collect();
        assert!(counts.windows(2).all(|w| w.first() <= w.get(1)));
        assert_eq!(counts.last().copied(), Some(100));
        assert!(text.contains("#[Max     =        5.003, Total count    =          100]"));
    }

    #[test]
    fn sub_buckets_follow_the_significant_figures() {
        assert_eq!(sub_bucket_count(1), 32);
        assert_eq!(sub_bucket_count(2), 256);
        assert_eq!(sub_bucket_count(3), 2048);
    }
}
