//! Durations as the config file writes them: an unsigned integer followed by one unit,
//! `ms`, `s`, `m` or `h` (`100ms`, `30s`, `5m`, `1h`).
//!
//! Nothing else is accepted (no fractions, no signs, no spaces, no bare numbers), so a
//! value means the same thing to every reader. `format_duration` writes a duration back in
//! the same notation for error messages.

use std::time::Duration;

/// What every duration error says is expected.
pub(super) const DURATION_EXPECTED: &str = "a duration such as 100ms, 30s, 5m or 1h";

/// Digits accepted before the unit; enough for any sane timeout, and small enough that the
/// number always fits a `u64`.
const DURATION_DIGITS_MAX: usize = 15;

/// Parses `<digits><unit>` with unit `ms`, `s`, `m` or `h`.
///
/// Returns the duration, or a complete message of the form
/// `found "5 minutes", expected a duration such as 100ms, 30s, 5m or 1h`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let invalid = || {
        format!(
            "found {}, expected {DURATION_EXPECTED}",
            super::text::quote(s)
        )
    };
    let digits_len = s.bytes().take_while(u8::is_ascii_digit).count();
    let (digits, unit) = s.split_at(digits_len);
    if digits.is_empty() || digits.len() > DURATION_DIGITS_MAX {
        return Err(invalid());
    }
    let count: u64 = digits.parse().map_err(|_| invalid())?;
    let millis_per_unit: u64 = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        _ => return Err(invalid()),
    };
    let millis = count.checked_mul(millis_per_unit).ok_or_else(invalid)?;
    Ok(Duration::from_millis(millis))
}

/// Writes a duration in config notation, using the largest unit that represents it exactly
/// (`300000ms` is written `5m`). Sub-millisecond parts, which the config cannot express,
/// are truncated.
pub fn format_duration(d: Duration) -> String {
    let millis = d.as_millis();
    if millis == 0 {
        return "0ms".to_owned();
    }
    if millis.is_multiple_of(3_600_000) {
        format!("{}h", millis / 3_600_000)
    } else if millis.is_multiple_of(60_000) {
        format!("{}m", millis / 60_000)
    } else if millis.is_multiple_of(1_000) {
        format!("{}s", millis / 1_000)
    } else {
        format!("{millis}ms")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn valid_durations_parse() {
        let table = [
            ("100ms", Duration::from_millis(100)),
            ("0ms", Duration::ZERO),
            ("30s", Duration::from_secs(30)),
            ("5m", Duration::from_secs(300)),
            ("1h", Duration::from_secs(3600)),
            ("007s", Duration::from_secs(7)),
        ];
        for (text, want) in table {
            assert_eq!(parse_duration(text), Ok(want), "{text}");
        }
    }

    #[test]
    fn invalid_durations_are_refused() {
        let table = [
            "",
            "5",
            "s",
            "-1s",
            "+1s",
            "1.5s",
            "5 minutes",
            " 5m",
            "5m ",
            "5M",
            "5d",
            "5us",
            "1msx",
            "999999999999999999h",
            "1000000000000000h",
        ];
        for text in table {
            let want = format!("found {text:?}, expected {DURATION_EXPECTED}");
            assert_eq!(parse_duration(text), Err(want), "{text}");
        }
    }

    #[test]
    fn durations_format_in_the_largest_exact_unit() {
        let table = [
            (Duration::ZERO, "0ms"),
            (Duration::from_millis(1500), "1500ms"),
            (Duration::from_secs(90), "90s"),
            (Duration::from_secs(300), "5m"),
            (Duration::from_secs(7200), "2h"),
        ];
        for (d, want) in table {
            assert_eq!(format_duration(d), want);
        }
    }
}
