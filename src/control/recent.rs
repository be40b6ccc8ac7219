//! Sliding windows the status shows: a trigger's outcomes in the last five minutes, and its
//! lag over the last ten. Pure: the time comes in as an argument.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Width of one bucket of [`RecentOutcomes`], in milliseconds.
const BUCKET_MS: i64 = 10_000;
/// Buckets of [`RecentOutcomes`]: 30 × 10 s = the last five minutes.
const BUCKETS: usize = 30;

/// The outcomes the status counts (labels of [`crate::run::WorkOutcome`] and the operators'
/// skips).
pub const COUNTED: [&str; 8] = [
    "accepted",
    "filtered",
    "filter_error",
    "expired",
    "expired_dead_lettered",
    "dead_lettered",
    "skipped",
    "abandoned",
];

/// Records handled per outcome in the last five minutes, in 10-second buckets: the count
/// covers between 290 and 300 s.
#[derive(Debug, Default)]
pub struct RecentOutcomes {
    /// Per bucket: which 10-second period it holds, and its counts by [`COUNTED`] index.
    buckets: Vec<(i64, [u64; COUNTED.len()])>,
}

impl RecentOutcomes {
    /// `n` records ended with `outcome` at `now_ms`; unknown labels are not counted.
    pub fn count(&mut self, outcome: &str, n: u64, now_ms: i64) {
        let Some(i) = COUNTED.iter().position(|c| *c == outcome) else {
            return;
        };
        if self.buckets.is_empty() {
            self.buckets = vec![(i64::MIN, [0; COUNTED.len()]); BUCKETS];
        }
        let period = now_ms.div_euclid(BUCKET_MS);
        let slot = &mut self.buckets[period.rem_euclid(BUCKETS as i64) as usize];
        if slot.0 != period {
            *slot = (period, [0; COUNTED.len()]);
        }
        slot.1[i] += n;
    }

    /// The counts of the last five minutes at `now_ms`, by outcome (every outcome of
    /// [`COUNTED`], 0 included).
    pub fn totals(&self, now_ms: i64) -> BTreeMap<&'static str, u64> {
        let period = now_ms.div_euclid(BUCKET_MS);
        let mut out: BTreeMap<&'static str, u64> = COUNTED.iter().map(|c| (*c, 0)).collect();
        for (p, counts) in &self.buckets {
            if *p > period - BUCKETS as i64 && *p <= period {
                for (i, n) in counts.iter().enumerate() {
                    *out.entry(COUNTED[i]).or_default() += n;
                }
            }
        }
        out
    }
}

/// Width of one point of [`LagHistory`], in milliseconds.
pub const LAG_STEP_MS: i64 = 10_000;
/// Points of [`LagHistory`]: 60 × 10 s = the last ten minutes.
const LAG_POINTS: usize = 60;

/// One point of a lag chart: the period's start and the largest lag reported in it.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct LagPoint {
    /// Start of the 10-second period, in milliseconds since the epoch.
    pub at_ms: i64,
    /// The largest lag in records seen in the period (the trigger's partitions summed).
    pub records: i64,
    /// The largest lag in seconds seen in the period (its oldest partition).
    pub seconds: f64,
}

/// A trigger's lag over the last ten minutes, one point per 10 s.
#[derive(Debug, Default)]
pub struct LagHistory {
    points: std::collections::VecDeque<LagPoint>,
}

impl LagHistory {
    /// The lag reported at `now_ms`.
    pub fn record(&mut self, now_ms: i64, records: i64, seconds: f64) {
        let at_ms = now_ms.div_euclid(LAG_STEP_MS) * LAG_STEP_MS;
        match self.points.back_mut() {
            Some(last) if last.at_ms == at_ms => {
                last.records = last.records.max(records);
                last.seconds = last.seconds.max(seconds);
            }
            _ => self.points.push_back(LagPoint {
                at_ms,
                records,
                seconds,
            }),
        }
        while self
            .points
            .front()
            .is_some_and(|p| p.at_ms <= at_ms - LAG_STEP_MS * LAG_POINTS as i64)
        {
            let _ = self.points.pop_front();
        }
    }

    /// The points, oldest first.
    pub fn points(&self) -> Vec<LagPoint> {
        self.points.iter().copied().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcomes_count_for_five_minutes_then_fall_out() {
        let mut r = RecentOutcomes::default();
        let t0 = 1_000_000_000;
        r.count("accepted", 3, t0);
        r.count("accepted", 2, t0 + 5_000);
        r.count("dead_lettered", 1, t0 + 60_000);
        r.count("no-such-outcome", 9, t0);
        let at = r.totals(t0 + 60_000);
        assert_eq!(
            (at["accepted"], at["dead_lettered"], at["filtered"]),
            (5, 1, 0)
        );
        // 290 s later the first bucket is still in; 300 s later it is out.
        assert_eq!(r.totals(t0 + 290_000)["accepted"], 5);
        assert_eq!(r.totals(t0 + 300_000)["accepted"], 0);
        assert_eq!(r.totals(t0 + 300_000)["dead_lettered"], 1);
        // A bucket reused ten minutes later starts from zero.
        r.count("accepted", 1, t0 + 600_000);
        assert_eq!(r.totals(t0 + 600_000)["accepted"], 1);
    }

    #[test]
    fn lag_keeps_the_largest_per_ten_seconds_for_ten_minutes() {
        let mut h = LagHistory::default();
        let t0 = 2_000_000_000;
        h.record(t0, 5, 1.0);
        h.record(t0 + 1_000, 9, 0.5);
        h.record(t0 + 10_000, 2, 0.2);
        let p = h.points();
        assert_eq!(p.len(), 2);
        assert_eq!((p[0].records, p[0].seconds), (9, 1.0));
        assert_eq!(p[1].records, 2);
        h.record(t0 + 600_000, 0, 0.0);
        let p = h.points();
        assert_eq!(p.first().unwrap().at_ms, t0 + 10_000, "ten minutes kept");
        assert_eq!(p.len(), 2);
    }
}
