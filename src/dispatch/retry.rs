//! Exponential backoff with full jitter (pure).

use std::time::Duration;

/// Backoff between attempts of one message.
#[derive(Clone, Copy, Debug)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
}

impl Backoff {
    /// `initial` doubles per attempt up to `max`.
    pub fn new(initial: Duration, max: Duration) -> Self {
        Self { initial, max }
    }

    /// The ceiling for the delay after `attempt` failures (1-based).
    pub fn ceiling(&self, attempt: u32) -> Duration {
        let factor = 1u32
            .checked_shl(attempt.saturating_sub(1).min(30))
            .unwrap_or(u32::MAX);
        self.initial.saturating_mul(factor).min(self.max)
    }

    /// The delay after `attempt` failures: uniform in [ceiling/2, ceiling] so it never collapses
    /// to zero, and a server's Retry-After wins when longer.
    pub fn delay(&self, attempt: u32, retry_after: Option<Duration>, unit: f64) -> Duration {
        let ceiling = self.ceiling(attempt);
        let jittered = ceiling.mul_f64(0.5 + 0.5 * unit.clamp(0.0, 1.0));
        match retry_after {
            Some(ra) if ra > jittered => ra.min(Duration::from_secs(3600)),
            _ => jittered,
        }
    }
}

/// Parses a Retry-After header given in seconds.
pub fn parse_retry_after(value: &str) -> Option<Duration> {
    value.trim().parse::<u64>().ok().map(Duration::from_secs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_and_stops_at_the_cap() {
        let b = Backoff::new(Duration::from_millis(100), Duration::from_secs(1));
        assert_eq!(b.ceiling(1), Duration::from_millis(100));
        assert_eq!(b.ceiling(2), Duration::from_millis(200));
        assert_eq!(b.ceiling(4), Duration::from_millis(800));
        assert_eq!(b.ceiling(5), Duration::from_secs(1));
        assert_eq!(b.ceiling(500), Duration::from_secs(1));
        assert_eq!(b.delay(3, None, 0.0), Duration::from_millis(200));
        assert_eq!(b.delay(3, None, 1.0), Duration::from_millis(400));
        assert_eq!(
            b.delay(1, Some(Duration::from_secs(5)), 1.0),
            Duration::from_secs(5)
        );
        assert_eq!(parse_retry_after(" 7 "), Some(Duration::from_secs(7)));
        assert_eq!(parse_retry_after("Wed, 21 Oct 2015"), None);
    }
}
