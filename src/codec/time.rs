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
/// Written digit by digit into one string: it runs for every event (the record's timestamp)
/// and for every timestamp field of a decoded value.
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
    let (y, m, d) = civil_from_days(days);
    if !(0..=9999).contains(&y) {
        return timestamp_by_format(days, day_nanos, digits, utc);
    }
    let day_secs = day_nanos / 1_000_000_000;
    let frac = (day_nanos % 1_000_000_000) / 10_i64.pow(9 - digits);
    let mut out = String::with_capacity(31);
    push_digits(&mut out, y, 4);
    out.push('-');
    push_digits(&mut out, i64::from(m), 2);
    out.push('-');
    push_digits(&mut out, i64::from(d), 2);
    out.push('T');
    push_digits(&mut out, day_secs / 3600, 2);
    out.push(':');
    push_digits(&mut out, (day_secs / 60) % 60, 2);
    out.push(':');
    push_digits(&mut out, day_secs % 60, 2);
    out.push('.');
    push_digits(&mut out, frac, digits);
    if utc {
        out.push('Z');
    }
    out
}

/// The general form (any year, as `format!` writes it).
fn timestamp_by_format(days: i64, day_nanos: i64, digits: u32, utc: bool) -> String {
    format!(
        "{}T{}{}",
        date(days),
        time_of_day(day_nanos, digits),
        if utc { "Z" } else { "" }
    )
}

/// Appends `value` (non-negative, fewer than `width` + 1 digits) zero-padded to `width`.
fn push_digits(out: &mut String, value: i64, width: u32) {
    for i in (0..width).rev() {
        let digit = (value / 10_i64.pow(i)) % 10;
        out.push(char::from(b'0' + digit as u8));
    }
}

/// (year, month, day) to days since 1970-01-01, proleptic Gregorian (Hinnant's algorithm).
pub(crate) fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let m = i64::from(m);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

fn digits(s: &str) -> Option<i64> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// `YYYY-MM-DD` to days since the epoch.
pub(crate) fn parse_date(s: &str) -> Option<i64> {
    let mut parts = s.splitn(3, '-');
    let (y, m, d) = (parts.next()?, parts.next()?, parts.next()?);
    if y.len() != 4 || m.len() != 2 || d.len() != 2 {
        return None;
    }
    let (y, m, d) = (digits(y)?, digits(m)?, digits(d)?);
    if !(1..=12).contains(&m) || !(1..=31).contains(&d) {
        return None;
    }
    let days = days_from_civil(y, m as u32, d as u32);
    // Reject dates such as 2023-02-30 that do not round-trip.
    (civil_from_days(days) == (y, m as u32, d as u32)).then_some(days)
}

/// `HH:MM:SS[.fraction]` to nanoseconds since midnight.
pub(crate) fn parse_time_of_day(s: &str) -> Option<i64> {
    let (hms, frac) = match s.split_once('.') {
        Some((a, b)) => (a, Some(b)),
        None => (s, None),
    };
    let mut parts = hms.split(':');
    let (h, m, sec) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() || h.len() != 2 || m.len() != 2 || sec.len() != 2 {
        return None;
    }
    let (h, m, sec) = (digits(h)?, digits(m)?, digits(sec)?);
    if h > 23 || m > 59 || sec > 60 {
        return None;
    }
    let nanos = match frac {
        None => 0,
        Some(f) if !f.is_empty() && f.len() <= 9 => digits(f)? * 10_i64.pow(9 - f.len() as u32),
        Some(_) => return None,
    };
    Some(((h * 60 + m) * 60 + sec) * 1_000_000_000 + nanos)
}

/// An RFC 3339 timestamp to nanoseconds since the epoch. With `utc`, an offset (`Z` or
/// `+HH:MM`) is required and applied; without, none may be given (Avro's local timestamps).
pub(crate) fn parse_timestamp(s: &str, utc: bool) -> Option<i128> {
    let (date, rest) = s.split_once(['T', 't', ' '])?;
    let days = parse_date(date)?;
    let (time, offset_secs) = if utc {
        if let Some(t) = rest.strip_suffix(['Z', 'z']) {
            (t, 0)
        } else {
            let at = rest.rfind(['+', '-'])?;
            let (t, off) = rest.split_at(at);
            let sign = if off.starts_with('-') { -1 } else { 1 };
            let (oh, om) = off[1..].split_once(':')?;
            if oh.len() != 2 || om.len() != 2 {
                return None;
            }
            (t, sign * (digits(oh)? * 3600 + digits(om)? * 60))
        }
    } else {
        (rest, 0)
    };
    let nanos = parse_time_of_day(time)?;
    Some(
        i128::from(days) * 86_400_000_000_000 + i128::from(nanos)
            - i128::from(offset_secs) * 1_000_000_000,
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

    proptest::proptest! {
        #[test]
        fn the_digit_by_digit_timestamp_is_the_formatted_one(
            // Years -1 to 10000: both sides of the digit-by-digit range.
            secs in -62_198_755_200i64..253_433_923_200,
            sub in 0i64..1_000_000_000,
            unit in 0usize..3,
            utc in proptest::prelude::any::<bool>(),
        ) {
            let per_second = [1_000, 1_000_000, 1_000_000_000][unit];
            let digits = [3, 6, 9][unit];
            // Nanoseconds in an i64 reach only the years 1677 to 2262.
            let secs = if unit == 2 { secs % 9_000_000_000 } else { secs };
            let count = secs * per_second + sub % per_second;
            let day_nanos = secs.rem_euclid(86_400) * 1_000_000_000
                + count.rem_euclid(per_second) * (1_000_000_000 / per_second);
            proptest::prop_assert_eq!(
                timestamp(count, per_second, utc),
                timestamp_by_format(secs.div_euclid(86_400), day_nanos, digits, utc)
            );
        }
    }

    #[test]
    fn parses_what_it_formats() {
        for days in [-700_000, -1, 0, 1, 19_723, 2_932_896] {
            assert_eq!(parse_date(&date(days)), Some(days));
        }
        assert_eq!(parse_date("2023-02-30"), None);
        assert_eq!(parse_date("2023-2-3"), None);
        assert_eq!(parse_time_of_day("01:02:03.004"), Some(3_723_004_000_000));
        assert_eq!(parse_time_of_day("24:00:00"), None);
        for ms in [-1_i64, 0, 1_700_000_000_123] {
            let s = timestamp(ms, 1_000, true);
            assert_eq!(parse_timestamp(&s, true), Some(i128::from(ms) * 1_000_000));
        }
        assert_eq!(
            parse_timestamp("2023-11-14T23:13:20.123+01:00", true),
            Some(1_700_000_000_123_000_000)
        );
        assert_eq!(parse_timestamp("2023-11-14T22:13:20", true), None);
        assert_eq!(
            parse_timestamp("1970-01-01T00:00:01.500000", false),
            Some(1_500_000_000)
        );
    }
}
