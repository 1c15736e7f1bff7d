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

/// Microseconds since the Unix epoch.
type Micros = u64;

const DAY: Micros = 86_400_000_000;

/// A calendar unit a quota window is aligned to (UTC).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "lowercase"))]
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

/// A calendar window: its unit and where its windows start. Month windows may start on a
/// billing day (`anchor_day`, 1–28: every month has it, so every window is one month long, 28 to
/// 31 days); day and week windows may follow a fixed offset from UTC (`utc_offset`: a day from
/// local midnight, a week from local Monday midnight). The defaults (the 1st, UTC) are the plain
/// units.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CalendarWindow {
    pub unit: Calendar,
    /// Month: the day of the month windows start on, 1–28.
    pub anchor_day: u8,
    /// Day and week: minutes east of UTC (`-05:00` is −300), within ±14:00.
    pub utc_offset_min: i16,
}

impl From<Calendar> for CalendarWindow {
    fn from(unit: Calendar) -> CalendarWindow {
        CalendarWindow {
            unit,
            anchor_day: 1,
            utc_offset_min: 0,
        }
    }
}

/// The largest `utc_offset`, in minutes (UTC+14:00, Kiribati).
pub const MAX_OFFSET_MIN: i16 = 14 * 60;

impl CalendarWindow {
    /// The config spelling of the unit.
    pub fn as_str(self) -> &'static str {
        self.unit.as_str()
    }

    /// See [`Calendar::max_len`].
    pub fn max_len(self) -> Micros {
        self.unit.max_len()
    }

    /// See [`Calendar::nominal_secs`].
    pub fn nominal_secs(self) -> u64 {
        self.unit.nominal_secs()
    }

    /// How the Redis scripts take it (state.lua's `cal_window`): the unit (1 day, 2 week,
    /// 3 month) plus 16 × a parameter, 0 for the defaults: a month's anchor day, or a day's or
    /// week's offset in minutes plus 2048 (so never 0).
    pub fn script_code(self) -> u64 {
        let unit = match self.unit {
            Calendar::Day => 1,
            Calendar::Week => 2,
            Calendar::Month => 3,
        };
        let param = match self.unit {
            Calendar::Month if self.anchor_day > 1 => u64::from(self.anchor_day),
            Calendar::Day | Calendar::Week if self.utc_offset_min != 0 => {
                u64::try_from(i64::from(self.utc_offset_min) + 2048).unwrap_or(0)
            }
            _ => 0,
        };
        unit + 16 * param
    }

    /// The window `[start, end)` containing `now`, in microseconds since the epoch.
    pub fn window(self, now: Micros) -> (Micros, Micros) {
        match self.unit {
            Calendar::Month if self.anchor_day > 1 => {
                let a = u64::from(self.anchor_day.min(28));
                let at = |d: u64| d.saturating_mul(DAY);
                let day = now / DAY;
                let (y, m, d) = civil_from_days(day);
                let next = |y: u64, m: u64| if m == 12 { (y + 1, 1) } else { (y, m + 1) };
                let prev = |y: u64, m: u64| {
                    if m == 1 {
                        (y.saturating_sub(1), 12)
                    } else {
                        (y, m - 1)
                    }
                };
                let (from, to) = if d >= a {
                    ((y, m), next(y, m))
                } else {
                    (prev(y, m), (y, m))
                };
                (
                    at(days_from_civil(from.0, from.1, a)),
                    at(days_from_civil(to.0, to.1, a)),
                )
            }
            Calendar::Day | Calendar::Week if self.utc_offset_min != 0 => {
                // The UTC window of the shifted clock, shifted back.
                let off = i128::from(self.utc_offset_min) * 60_000_000;
                let shift = |t: u64, by: i128| {
                    u64::try_from((i128::from(t) + by).max(0)).unwrap_or(u64::MAX)
                };
                let (s, e) = self.unit.window(shift(now, off));
                (shift(s, -off), shift(e, -off))
            }
            _ => self.unit.window(now),
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

    fn anchored(day: u8) -> CalendarWindow {
        CalendarWindow {
            anchor_day: day,
            ..Calendar::Month.into()
        }
    }

    fn offset(unit: Calendar, min: i16) -> CalendarWindow {
        CalendarWindow {
            utc_offset_min: min,
            ..unit.into()
        }
    }

    #[test]
    fn a_billing_month_runs_from_its_anchor_day_across_the_year_end() {
        let w = anchored(15);
        // 14 January is in the window of 15 December (across the year end).
        assert_eq!(
            w.window(at(2026, 1, 14, 23, 59, 59)),
            (at(2025, 12, 15, 0, 0, 0), at(2026, 1, 15, 0, 0, 0))
        );
        let jan15 = at(2026, 1, 15, 0, 0, 0);
        assert_eq!(w.window(jan15), (jan15, at(2026, 2, 15, 0, 0, 0)));
        assert_eq!(w.window(jan15 - 1).1, jan15);
        // The window's start is in its own window (state ids are starts).
        assert_eq!(w.window(w.window(jan15 - 1).0).0, w.window(jan15 - 1).0);
    }

    #[test]
    fn a_billing_month_over_february_has_its_days_and_a_leap_day() {
        let w = anchored(28);
        // 28 January to 28 February: 31 days; 28 February to 28 March: 28 days (2026), 29 in a
        // leap year (2028: 29 February is in the window of 28 February).
        let (s, e) = w.window(at(2026, 2, 10, 0, 0, 0));
        assert_eq!((s, e), (at(2026, 1, 28, 0, 0, 0), at(2026, 2, 28, 0, 0, 0)));
        let (s, e) = w.window(at(2026, 3, 1, 0, 0, 0));
        assert_eq!(((e - s) / DAY), 28);
        let leap = w.window(at(2028, 2, 29, 12, 0, 0));
        assert_eq!(leap, (at(2028, 2, 28, 0, 0, 0), at(2028, 3, 28, 0, 0, 0)));
        assert_eq!((leap.1 - leap.0) / DAY, 29);
        // Anchored on the 1st is the plain month.
        for t in [at(2028, 2, 29, 0, 0, 0), at(2026, 12, 31, 23, 0, 0)] {
            assert_eq!(anchored(1).window(t), Calendar::Month.window(t));
        }
    }

    #[test]
    fn a_day_with_an_offset_runs_from_local_midnight() {
        let ny = offset(Calendar::Day, -300);
        // 2028-02-29 03:00 UTC is 28 February 22:00 in UTC−05:00.
        assert_eq!(
            ny.window(at(2028, 2, 29, 3, 0, 0)),
            (at(2028, 2, 28, 5, 0, 0), at(2028, 2, 29, 5, 0, 0))
        );
        let tokyo = offset(Calendar::Day, 540);
        // 28 February 2026 20:00 UTC is 1 March 05:00 in UTC+09:00 (across the month end).
        assert_eq!(
            tokyo.window(at(2026, 2, 28, 20, 0, 0)),
            (at(2026, 2, 28, 15, 0, 0), at(2026, 3, 1, 15, 0, 0))
        );
        // A week from local Monday midnight: Monday 2 March 2026 00:00 in UTC+09:00 is Sunday
        // 1 March 15:00 UTC.
        let w = offset(Calendar::Week, 540).window(at(2026, 3, 1, 16, 0, 0));
        assert_eq!(w, (at(2026, 3, 1, 15, 0, 0), at(2026, 3, 8, 15, 0, 0)));
        assert_eq!(
            offset(Calendar::Day, 0).window(at(2026, 3, 1, 16, 0, 0)),
            Calendar::Day.window(at(2026, 3, 1, 16, 0, 0))
        );
    }

    #[test]
    fn script_codes_keep_the_plain_units() {
        assert_eq!(CalendarWindow::from(Calendar::Day).script_code(), 1);
        assert_eq!(CalendarWindow::from(Calendar::Week).script_code(), 2);
        assert_eq!(CalendarWindow::from(Calendar::Month).script_code(), 3);
        assert_eq!(anchored(15).script_code(), 3 + 16 * 15);
        assert_eq!(
            offset(Calendar::Day, -300).script_code(),
            1 + 16 * (2048 - 300)
        );
    }

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
