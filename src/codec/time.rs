//! RFC 3339 formatting of Avro's date and time logical types, without a calendar crate.

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian (Hinnant's algorithm).
pub(crate) fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// `YYYY-MM-DD`.
pub(crate) fn date(days: i64) -> String {
    let (y, m, d) = civil_from_days(days);
    format!("{y:04}-{m:02}-{d:02}")
}

/// `HH:MM:SS[.fraction]` from nanoseconds since midnight; the fraction has `digits` digits.
pub(crate) fn time_of_day(nanos: i64, digits: u32) -> String {
    let nanos = nanos.rem_euclid(86_400 * 1_000_000_000);
    let secs = nanos / 1_000_000_000;
    let frac = nanos % 1_000_000_000;
    let base = format!(
        "{:02}:{:02}:{:02}",
        secs / 3600,
        (secs / 60) % 60,
        secs % 60
    );
    if digits == 0 {
        return base;
    }
    let frac = frac / 10_i64.pow(9 - digits);
    format!("{base}.{frac:0width$}", width = digits as usize)
}

/// RFC 3339 timestamp from a count of `unit`s (1_000 for millis, 1_000_000 for micros,
/// 1_000_000_000 for nanos) since the epoch; `utc` appends `Z` (local timestamps have none).
pub(crate) fn timestamp(count: i64, per_second: i64, utc: bool) -> String {
    let secs = count.div_euclid(per_second);
    let sub = count.rem_euclid(per_second);
    let nanos = sub * (1_000_000_000 / per_second);
    let days = secs.div_euclid(86_400);
    let day_nanos = secs.rem_euclid(86_400) * 1_000_000_000 + nanos;
    let digits = match per_second {
        1_000 => 3,
        1_000_000 => 6,
        _ => 9,
    };
    format!(
        "{}T{}{}",
        date(days),
        time_of_day(day_nanos, digits),
        if utc { "Z" } else { "" }
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_dates_and_timestamps() {
        assert_eq!(date(0), "1970-01-01");
        assert_eq!(date(19_723), "2024-01-01");
        assert_eq!(date(-1), "1969-12-31");
        assert_eq!(
            timestamp(1_700_000_000_123, 1_000, true),
            "2023-11-14T22:13:20.123Z"
        );
        assert_eq!(timestamp(-1, 1_000, true), "1969-12-31T23:59:59.999Z");
        assert_eq!(
            timestamp(1_500_000, 1_000_000, false),
            "1970-01-01T00:00:01.500000"
        );
        assert_eq!(time_of_day(3_723_004_000_000, 3), "01:02:03.004");
    }
}
