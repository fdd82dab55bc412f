//! When bytes really arrived: the kernel's receive timestamp, on the monotonic clock.
//!
//! A thread blocked in `read` (or a reactor parked in `epoll_wait`) runs some time after
//! the data it waits for has arrived: waking a halted CPU, more so a virtual one, costs
//! tens of µs. Timing a response by when the reader got to run would add that wake-up to
//! every figure. With `SO_TIMESTAMPNS` the kernel stamps each segment as it enters the
//! receiving host's network stack, and `recvmsg` hands the stamp of the last segment read
//! back with the bytes (`sys::recv_stamped`). The stamp is on `CLOCK_REALTIME`; it is
//! carried onto the monotonic clock by its age when read: `arrival = read_at - (real_at -
//! stamp)`. The two clocks tick at the same rate over the µs to ms between arrival and
//! read (NTP slews by at most 500 ppm), so the age is exact to well under a µs; a step of
//! the wall clock in between is detected and the stamp refused (see [`arrival`]).

use std::time::{Duration, Instant};

use crate::limits::ARRIVAL_SKEW_MAX;
use crate::schedule::Nanos;

/// The monotonic instant data read at `read_at` arrived, given the wall clock `real_at`
/// read just before `read_at` and the kernel's receive stamp `stamp` (both since the Unix
/// epoch), or `None` if the stamp cannot be trusted.
///
/// `floor` is the earliest the data can have arrived (for a response: when its request
/// was written). An arrival computed before `floor` by up to `ARRIVAL_SKEW_MAX` is the
/// conversion's rounding and is clamped to it; by more, the wall clock was stepped forward
/// in between, and a stamp after `real_at` means it was stepped back: both give `None`, and
/// the caller uses the read time.
pub fn arrival(
    read_at: Instant,
    real_at: Duration,
    stamp: Duration,
    floor: Instant,
) -> Option<Instant> {
    let age = real_at.checked_sub(stamp)?;
    let arrived = read_at.checked_sub(age)?;
    if arrived >= floor {
        return Some(arrived);
    }
    if floor.duration_since(arrived) <= ARRIVAL_SKEW_MAX {
        return Some(floor);
    }
    None
}

/// When an exchange finished on the run's clock: `returned`, the clock when the exchange
/// returned, less `lead`, how long before that its response's last bytes had arrived (0
/// when unknown), never before `sent`.
pub fn finished(returned: Nanos, sent: Nanos, lead: Nanos) -> Nanos {
    returned.saturating_sub(lead).max(sent)
}

/// How long before `now` the instant `arrived` was, in nanoseconds (0 if it is not before).
pub fn lead(arrived: Option<Instant>, now: Instant) -> Nanos {
    arrived.map_or(0, |a| {
        crate::schedule::nanos(now.saturating_duration_since(a))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const US: Duration = Duration::from_micros(1);

    #[test]
    fn the_stamp_age_is_carried_onto_the_monotonic_clock() {
        let base = Instant::now();
        let read_at = base + 1000 * US;
        let real_at = Duration::from_secs(1_700_000_000);
        // Stamped 40 µs before the wall clock was read: arrived 40 µs before the read.
        let got = arrival(read_at, real_at, real_at - 40 * US, base);
        assert_eq!(got, Some(base + 960 * US));
        // Stamped the very moment it was read.
        assert_eq!(arrival(read_at, real_at, real_at, base), Some(read_at));
    }

    #[test]
    fn a_stamp_just_before_the_floor_is_clamped_a_far_one_refused() {
        let floor = Instant::now() + 5000 * US;
        let read_at = floor + 100 * US;
        let real_at = Duration::from_secs(1_700_000_000);
        let just = real_at - 100 * US - ARRIVAL_SKEW_MAX;
        assert_eq!(arrival(read_at, real_at, just, floor), Some(floor));
        let far = real_at - 100 * US - ARRIVAL_SKEW_MAX - US;
        assert_eq!(arrival(read_at, real_at, far, floor), None);
    }

    #[test]
    fn a_stamp_after_the_wall_clock_reading_is_refused() {
        let base = Instant::now();
        let real_at = Duration::from_secs(1_700_000_000);
        assert_eq!(arrival(base, real_at, real_at + US, base), None);
    }

    #[test]
    fn finished_is_the_arrival_but_never_before_the_send() {
        assert_eq!(finished(10_000, 2_000, 0), 10_000);
        assert_eq!(finished(10_000, 2_000, 3_000), 7_000);
        assert_eq!(finished(10_000, 2_000, 9_000), 2_000);
        assert_eq!(finished(10_000, 2_000, u64::MAX), 2_000);
    }

    #[test]
    fn lead_is_the_time_since_arrival() {
        let now = Instant::now() + 1000 * US;
        assert_eq!(lead(None, now), 0);
        assert_eq!(lead(Some(now - 250 * US), now), 250_000);
        assert_eq!(lead(Some(now + US), now), 0);
    }
}
