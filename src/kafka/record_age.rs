//! `max_record_age_ms`: a record older than this, by its Kafka timestamp against the clock,
//! starts no run; `on_expired` skips it or dead-letters it with its age. Checked before every
//! attempt, so a record whose retries outlast the limit expires too. Pure, apart from
//! [`now_ms`].

/// `__connect.errors.stage` and `tessel.stage` of an expired record's dead letter.
pub const STAGE: &str = "RECORD_AGE";
/// `tessel.error.class` of an expired record's dead letter.
pub const CLASS: &str = "record_expired";
/// The dead-letter header carrying the record's age, in ms, when it was written.
pub const AGE_HEADER: &str = "tessel.record.age.ms";

/// Milliseconds since the epoch, now.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// The age of a record stamped `timestamp_ms` at `now_ms`; None without a timestamp (or a
/// negative one); 0 for a timestamp in the future (a producer's clock ahead of ours).
pub fn age_ms(timestamp_ms: Option<i64>, now_ms: i64) -> Option<u64> {
    let ts = timestamp_ms.filter(|t| *t >= 0)?;
    Some(u64::try_from(now_ms.saturating_sub(ts)).unwrap_or(0))
}

/// The record's age when it is older than `max_age_ms`; None when it may run (no limit, no
/// timestamp, young enough).
pub fn expired(timestamp_ms: Option<i64>, now_ms: i64, max_age_ms: Option<u64>) -> Option<u64> {
    let max = max_age_ms?;
    age_ms(timestamp_ms, now_ms).filter(|age| *age > max)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_older_than_the_limit_expires_and_others_do_not() {
        let now = 1_700_000_060_000;
        let limit = Some(60_000);
        assert_eq!(expired(Some(now - 60_001), now, limit), Some(60_001));
        assert_eq!(expired(Some(now - 60_000), now, limit), None);
        assert_eq!(expired(Some(now - 5), now, limit), None);
        // No limit, no timestamp, a negative one, one from the future.
        assert_eq!(expired(Some(0), now, None), None);
        assert_eq!(expired(None, now, limit), None);
        assert_eq!(expired(Some(-1), now, limit), None);
        assert_eq!(expired(Some(now + 10_000), now, Some(1)), None);
        assert_eq!(age_ms(Some(now + 10_000), now), Some(0));
    }
}
