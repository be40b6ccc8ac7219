//! Batch triggers, the core's part: when a partition's waiting records go out as one batch
//! and how many. No I/O and no clock; the partition set applies it. A batch's request key and
//! how its answer is read are the dispatcher's side ([`crate::dispatch::batch`]).

use std::time::Duration;

use std::time::Instant;

/// A trigger's batch bounds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchLimits {
    /// Records per batch at most (at least 1).
    pub max_records: usize,
    /// Key and value bytes per batch at most; a record larger than this goes alone.
    pub max_bytes: usize,
    /// How long the first waiting record waits for more.
    pub max_wait: Duration,
}

impl BatchLimits {
    /// Whether the waiting records (`waiting` of them, `bytes` of keys and values, the first
    /// waiting since `since`) should go out now. `flush`: the partition is being drained.
    pub fn due(
        &self,
        waiting: usize,
        bytes: usize,
        since: Option<Instant>,
        now: Instant,
        flush: bool,
    ) -> bool {
        waiting > 0
            && (flush
                || waiting >= self.max_records
                || bytes >= self.max_bytes
                || since.is_some_and(|s| now.saturating_duration_since(s) >= self.max_wait))
    }

    /// How many records from the front of `sizes` (each record's key and value bytes) form
    /// the next batch: up to `max_records`, and as long as their bytes stay within
    /// `max_bytes`; always at least one when there is one.
    pub fn take(&self, sizes: impl IntoIterator<Item = usize>) -> usize {
        let mut n = 0;
        let mut bytes = 0usize;
        for size in sizes {
            if n == self.max_records || (n > 0 && bytes + size > self.max_bytes) {
                break;
            }
            n += 1;
            bytes += size;
        }
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: BatchLimits = BatchLimits {
        max_records: 3,
        max_bytes: 100,
        max_wait: Duration::from_millis(1000),
    };

    #[test]
    fn a_batch_is_due_at_each_bound_or_when_draining() {
        let t0 = Instant::now();
        let later = |ms| t0 + Duration::from_millis(ms);
        assert!(!LIMITS.due(0, 0, None, t0, true), "nothing waiting");
        assert!(!LIMITS.due(2, 50, Some(t0), later(999), false));
        assert!(LIMITS.due(3, 50, Some(t0), t0, false), "max_records");
        assert!(LIMITS.due(1, 100, Some(t0), t0, false), "max_bytes");
        assert!(LIMITS.due(1, 1, Some(t0), later(1000), false), "max_wait");
        assert!(LIMITS.due(1, 1, Some(t0), t0, true), "drain");
    }

    #[test]
    fn a_batch_takes_records_up_to_each_bound_and_never_none() {
        assert_eq!(LIMITS.take([10, 10, 10, 10]), 3);
        assert_eq!(LIMITS.take([60, 40, 1]), 2);
        assert_eq!(LIMITS.take([60, 41]), 1);
        assert_eq!(LIMITS.take([500, 1]), 1, "an oversized record goes alone");
        assert_eq!(LIMITS.take([]), 0);
    }
}
