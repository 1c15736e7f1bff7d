//! Calendar windows: the UTC day, week (starting Monday) or month a timestamp falls in.
//!
//! A `fixed_window` limit with `calendar = "day" | "week" | "month"` counts in windows aligned to
//! UTC calendar boundaries instead of multiples of its period since the epoch. The window is a
//! pure function of the time: the in-process store calls this one inside the algorithm, and the
//! Redis scripts compute the same function (`state.lua`'s `cal_window`) from Redis `TIME`, so
//! that a Redis decision has one clock (a gateway's skewed clock cannot move or switch off a
//! quota); the calendar tests hold the two to each other on injected time. Months are 28–31 days long, so a month
//! window cannot be `floor(now / period)`; the civil-date conversion below is Howard Hinnant's
//! `days_from_civil` / `civil_from_days`, exact for every date the gateway can meet.

use serde::Deserialize;

/// Microseconds since the Unix epoch.
type Micros = u64;

const DAY: Micros = 86_400_000_000;

/// A calendar unit a quota window is aligned to (UTC).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Calendar {
    Day,
    /// ISO weeks: Monday 00:00 UTC to the next Monday.
    Week,
    Month,
}

impl Calendar {
    /// The config spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Calendar::Day => "day",
            Calendar::Week => "week",
            Calendar::Month => "month",
        }
    }

    /// The longest window of this unit (a 31-day month): what validation bounds `limit ×
    /// window` with, and the `w` advertised in `RateLimit-Policy` for day and week.
    pub fn max_len(self) -> Micros {
        match self {
            Calendar::Day => DAY,
            Calendar::Week => 7 * DAY,
            Calendar::Month => 31 * DAY,
        }
    }

    /// The nominal length in seconds for `RateLimit-Policy`'s `w`: a day, a week, or 30 days
    /// for a month (the window's real length varies from 28 to 31 days; `RateLimit`'s `t`
    /// carries the exact time left).
    pub fn nominal_secs(self) -> u64 {
        match self {
            Calendar::Day => 86_400,
            Calendar::Week => 7 * 86_400,
            Calendar::Month => 30 * 86_400,
        }
    }

    /// The window `[start, end)` containing `now`, in microseconds since the epoch. (Saturating
    /// at the end of `u64` time, some 580,000 years away.)
    pub fn window(self, now: Micros) -> (Micros, Micros) {
        let day = now / DAY;
        let at = |d: u64| d.saturating_mul(DAY);
        match self {
            Calendar::Day => (at(day), at(day + 1)),
            Calendar::Week => {
                // 1970-01-01 was a Thursday: day 0 is 3 days after a Monday.
                let since_monday = (day + 3) % 7;
                (
                    at(day.saturating_sub(since_monday)),
                    at(day + 7 - since_monday),
                )
            }
            Calendar::Month => {
                let (y, m, _) = civil_from_days(day);
                let (ny, nm) = if m == 12 { (y + 1, 1) } else { (y, m + 1) };
                (at(days_from_civil(y, m, 1)), at(days_from_civil(ny, nm, 1)))
            }
        }
    }
}

/// (year, month 1–12, day 1–31) of a day number since 1970-01-01 (non-negative).
pub fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// The day number since 1970-01-01 of a date on or after it (0 for earlier dates); `m` in 1–12,
/// `d` in 1–31.
pub fn days_from_civil(y: u64, m: u64, d: u64) -> u64 {
    let y = if m <= 2 { y.saturating_sub(1) } else { y };
    let era = y / 400;
    let yoe = y - era * 400;
    let mp = if m > 2 { m - 3 } else { m + 9 };
    let doy = ((153 * mp + 2) / 5 + d).saturating_sub(1);
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    (era * 146_097 + doe).saturating_sub(719_468)
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000;

    /// Microseconds at `y-m-d hh:mm:ss` UTC.
    fn at(y: u64, m: u64, d: u64, hh: u64, mm: u64, ss: u64) -> u64 {
        (days_from_civil(y, m, d) * 86_400 + hh * 3600 + mm * 60 + ss) * S
    }

    #[test]
    fn civil_dates_round_trip() {
        assert_eq!(days_from_civil(1970, 1, 1), 0);
        assert_eq!(days_from_civil(2000, 3, 1), 11_017);
        for day in (0..200_000).step_by(7) {
            let (y, m, d) = civil_from_days(day);
            assert_eq!(days_from_civil(y, m, d), day);
        }
    }

    #[test]
    fn a_day_runs_from_midnight_to_midnight() {
        let now = at(2026, 11, 22, 7, 30, 0);
        assert_eq!(
            Calendar::Day.window(now),
            (at(2026, 11, 22, 0, 0, 0), at(2026, 11, 23, 0, 0, 0))
        );
        let midnight = at(2026, 11, 23, 0, 0, 0);
        assert_eq!(Calendar::Day.window(midnight).0, midnight);
        assert_eq!(Calendar::Day.window(midnight - 1).1, midnight);
    }

    #[test]
    fn a_week_starts_on_monday() {
        // Sunday 2026-11-22 belongs to the week of Monday 2026-11-16.
        let w = Calendar::Week.window(at(2026, 11, 22, 23, 59, 59));
        assert_eq!(w, (at(2026, 11, 16, 0, 0, 0), at(2026, 11, 23, 0, 0, 0)));
        let monday = at(2026, 11, 23, 0, 0, 0);
        assert_eq!(Calendar::Week.window(monday).0, monday);
        // The epoch (a Thursday) is in the week of Monday 1969-12-29, clamped to 0.
        assert_eq!(Calendar::Week.window(0), (0, 4 * DAY));
    }

    #[test]
    fn months_have_28_to_31_days() {
        let cases = [
            ((2026, 1), 31),
            ((2026, 2), 28),
            ((2028, 2), 29),
            ((2100, 2), 28),
            ((2000, 2), 29),
            ((2026, 4), 30),
            ((2026, 12), 31),
        ];
        for ((y, m), days) in cases {
            let (s, e) = Calendar::Month.window(at(y, m, 15, 12, 0, 0));
            assert_eq!(s, at(y, m, 1, 0, 0, 0), "{y}-{m}");
            assert_eq!((e - s) / DAY, days, "{y}-{m}");
        }
        // The last microsecond of January and the first of February.
        let feb = at(2026, 2, 1, 0, 0, 0);
        assert_eq!(Calendar::Month.window(feb - 1).1, feb);
        assert_eq!(Calendar::Month.window(feb).0, feb);
    }
}
