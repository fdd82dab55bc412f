//! A percentile plot as a self-contained SVG: latency (linear, µs) against percentile on
//! the usual log scale of `1/(1-p)`, so 90 %, 99 %, 99.9 % ... are evenly spaced.
//!
//! One polyline through the histogram's percentile steps; axes, decade grid lines and
//! labels. No plotting library: the drawing is a few dozen elements.

use std::fmt::Write as _;

use hdrhistogram::Histogram;

use super::hgrm::TICKS_PER_HALF_DISTANCE;

const WIDTH: f64 = 800.0;
const HEIGHT: f64 = 480.0;
const MARGIN_LEFT: f64 = 80.0;
const MARGIN_RIGHT: f64 = 20.0;
const MARGIN_TOP: f64 = 40.0;
const MARGIN_BOTTOM: f64 = 50.0;
/// Decades of `1/(1-p)` shown at least (0 % .. 99 %) and at most (.. 99.9999 %).
const DECADES_MIN: u32 = 2;
const DECADES_MAX: u32 = 6;
/// Horizontal grid lines.
const Y_TICKS: u32 = 5;

/// Renders the percentile curve of `hist` (µs) with `title` above it.
pub fn render(hist: &Histogram<u64>, title: &str) -> String {
    let decades = decades_for(hist.len());
    let y_max = nice_ceiling(hist.max().max(1) as f64);
    let plot_w = WIDTH - MARGIN_LEFT - MARGIN_RIGHT;
    let plot_h = HEIGHT - MARGIN_TOP - MARGIN_BOTTOM;
    let x_of = |q: f64| {
        let decade = (1.0 / (1.0 - q).max(1e-12)).log10().min(f64::from(decades));
        MARGIN_LEFT + plot_w * decade / f64::from(decades)
    };
    let y_of = |us: f64| MARGIN_TOP + plot_h * (1.0 - us / y_max);
    let mut out = String::new();
    // `fmt::Write` for `String` never fails; results are ignored for that reason.
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(out, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        out,
        r#"<text x="{}" y="24" text-anchor="middle" font-size="14">{}</text>"#,
        WIDTH / 2.0,
        escape(title)
    );
    for d in 0..=decades {
        let x = MARGIN_LEFT + plot_w * f64::from(d) / f64::from(decades);
        let _ = writeln!(
            out,
            r##"<line x1="{x:.1}" y1="{MARGIN_TOP}" x2="{x:.1}" y2="{:.1}" stroke="#ddd"/><text x="{x:.1}" y="{:.1}" text-anchor="middle">{}</text>"##,
            MARGIN_TOP + plot_h,
            MARGIN_TOP + plot_h + 18.0,
            percentile_label(d)
        );
    }
    for t in 0..=Y_TICKS {
        let us = y_max * f64::from(t) / f64::from(Y_TICKS);
        let y = y_of(us);
        let _ = writeln!(
            out,
            r##"<line x1="{MARGIN_LEFT}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" text-anchor="end">{us}</text>"##,
            MARGIN_LEFT + plot_w,
            MARGIN_LEFT - 6.0,
            y + 4.0
        );
    }
    let _ = writeln!(
        out,
        r#"<text x="{}" y="{}" text-anchor="middle">percentile</text><text x="18" y="{}" text-anchor="middle" transform="rotate(-90 18 {})">latency (µs)</text>"#,
        MARGIN_LEFT + plot_w / 2.0,
        HEIGHT - 10.0,
        MARGIN_TOP + plot_h / 2.0,
        MARGIN_TOP + plot_h / 2.0
    );
    let mut points = String::new();
    for step in hist.iter_quantiles(TICKS_PER_HALF_DISTANCE) {
        let x = x_of(step.quantile_iterated_to());
        let y = y_of(step.value_iterated_to() as f64);
        let _ = write!(points, "{x:.1},{y:.1} ");
    }
    let _ = writeln!(
        out,
        r##"<polyline fill="none" stroke="#1f5fbf" stroke-width="2" points="{}"/>"##,
        points.trim_end()
    );
    out.push_str("</svg>\n");
    out
}

/// Decades of `1/(1-p)` worth showing for `count` samples: the last percentile with a
/// sample behind it is about `1 - 1/count`.
fn decades_for(count: u64) -> u32 {
    let mut decades = DECADES_MIN;
    while decades < DECADES_MAX && 10u64.pow(decades) < count {
        decades += 1;
    }
    decades
}

/// The label of decade `d`: 0 %, 90 %, 99 %, 99.9 %, ...
fn percentile_label(d: u32) -> String {
    match d {
        0 => "0%".into(),
        1 => "90%".into(),
        2 => "99%".into(),
        _ => format!("99.{}%", "9".repeat(d as usize - 2)),
    }
}

/// Rounds `v` up to 1, 2 or 5 times a power of ten, so axis labels are round.
fn nice_ceiling(v: f64) -> f64 {
    let magnitude = 10f64.powf(v.log10().floor());
    for step in [1.0, 2.0, 5.0, 10.0] {
        if step * magnitude >= v {
            return step * magnitude;
        }
    }
    10.0 * magnitude
}

/// Escapes text for an SVG text node.
fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::latency_histogram;

    #[test]
    fn labels_and_scales() {
        assert_eq!(percentile_label(0), "0%");
        assert_eq!(percentile_label(1), "90%");
        assert_eq!(percentile_label(2), "99%");
        assert_eq!(percentile_label(4), "99.99%");
        assert_eq!(decades_for(10), 2);
        assert_eq!(decades_for(50_000), 5);
        assert_eq!(decades_for(u64::MAX), 6);
        assert_eq!(nice_ceiling(1052.0), 2000.0);
        assert_eq!(nice_ceiling(1000.0), 1000.0);
        assert_eq!(nice_ceiling(4100.0), 5000.0);
    }

    #[test]
    fn renders_one_polyline_inside_the_canvas() {
        let mut h = latency_histogram();
        for us in 1..=10_000u64 {
            h.saturating_record(us);
        }
        let svg = render(&h, "a < b & c");
        assert!(svg.starts_with("<svg "));
        assert!(svg.ends_with("</svg>\n"));
        assert!(svg.contains("a &lt; b &amp; c"));
        assert_eq!(svg.matches("<polyline").count(), 1);
        let points = svg
            .split("points=\"")
            .nth(1)
            .and_then(|rest| rest.split('"').next())
            .unwrap_or_default();
        let coords: Vec<(f64, f64)> = points
            .split(' ')
            .filter_map(|p| {
                let (x, y) = p.split_once(',')?;
                Some((x.parse().ok()?, y.parse().ok()?))
            })
            .collect();
        assert!(coords.len() > 10);
        for (x, y) in coords {
            assert!((MARGIN_LEFT..=WIDTH - MARGIN_RIGHT).contains(&x), "x {x}");
            assert!((MARGIN_TOP..=HEIGHT - MARGIN_BOTTOM).contains(&y), "y {y}");
        }
    }
}
