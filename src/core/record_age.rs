//! Record ages.
//!
//! - `max_record_age_ms`: a record older than this, by its Kafka timestamp against the clock,
//!   starts no run; `on_expired` skips it or dead-letters it with its age. Checked before
//!   every attempt, so a record whose retries outlast the limit expires too.
//! - [`Unhandled`]: a partition's records received and not yet handled, for the lag in
//!   seconds (the age of the oldest of them).
//!
//! Pure: the time is an argument ([`crate::clock::now_ms`] in the shell).

use std::collections::VecDeque;

/// `__connect.errors.stage` and `tessel.stage` of an expired record's dead letter.
pub const STAGE: &str = "RECORD_AGE";
/// `tessel.error.class` of an expired record's dead letter.
pub const CLASS: &str = "record_expired";
/// The dead-letter header carrying the record's age, in ms, when it was written.
pub const AGE_HEADER: &str = "tessel.record.age.ms";

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

/// The timestamps of a partition's records received and not yet handled, in offset order.
/// A record is pushed when it arrives; records below the partition's commit offset (handled
/// and every record before them too) are dropped when the oldest is asked for. Records
/// handled above the commit offset stay until it passes them: they are younger than the one
/// it waits for, so the oldest is right.
#[derive(Debug, Default)]
pub struct Unhandled {
    records: VecDeque<(i64, Option<i64>)>,
}

impl Unhandled {
    /// Above this many records, arrivals also drop what the commit offset passed, so memory
    /// stays bounded between two reports.
    const PRUNE_ABOVE: usize = 65_536;

    /// A record at `offset` stamped `timestamp_ms` arrived (offsets arrive in order).
    pub fn push(&mut self, offset: i64, timestamp_ms: Option<i64>, commit_offset: Option<i64>) {
        if self.records.len() >= Self::PRUNE_ABOVE {
            self.prune(commit_offset);
        }
        self.records.push_back((offset, timestamp_ms));
    }

    fn prune(&mut self, commit_offset: Option<i64>) {
        let Some(c) = commit_offset else {
            return;
        };
        while self.records.front().is_some_and(|(o, _)| *o < c) {
            let _ = self.records.pop_front();
        }
    }

    /// The age in ms, at `now_ms`, of the oldest record not yet handled, given the
    /// partition's commit offset (every record below it is handled); 0 when none waits or
    /// it has no timestamp.
    pub fn oldest_age_ms(&mut self, commit_offset: Option<i64>, now_ms: i64) -> u64 {
        self.prune(commit_offset);
        self.records
            .front()
            .and_then(|(_, ts)| age_ms(*ts, now_ms))
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_oldest_unhandled_record_sets_the_age_until_the_commit_offset_passes_it() {
        let now = 1_700_000_100_000;
        let mut u = Unhandled::default();
        assert_eq!(u.oldest_age_ms(None, now), 0, "nothing received");
        // Offsets 10, 11, 12 stamped 90 s, 60 s and 30 s ago; nothing handled yet.
        for (offset, ago) in [(10, 90_000), (11, 60_000), (12, 30_000)] {
            u.push(offset, Some(now - ago), Some(10));
        }
        assert_eq!(u.oldest_age_ms(Some(10), now), 90_000);
        // 12 handled first (another key): 10 still waits.
        assert_eq!(u.oldest_age_ms(Some(10), now + 1_000), 91_000);
        // 10 handled: 11 is the oldest.
        assert_eq!(u.oldest_age_ms(Some(11), now), 60_000);
        // Everything handled: none waits.
        assert_eq!(u.oldest_age_ms(Some(13), now), 0);
        // A record without a timestamp gives no age.
        u.push(13, None, Some(13));
        assert_eq!(u.oldest_age_ms(Some(13), now), 0);
    }

    #[test]
    fn arrivals_drop_handled_records_past_the_bound() {
        let mut u = Unhandled::default();
        let n = i64::try_from(Unhandled::PRUNE_ABOVE).unwrap();
        for offset in 0..n {
            u.push(offset, Some(offset), None);
        }
        // All but the last handled: the next arrival drops them.
        u.push(n, Some(n), Some(n - 1));
        assert_eq!(u.records.len(), 2);
        assert_eq!(u.oldest_age_ms(Some(n - 1), n + 4), 5);
    }

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
