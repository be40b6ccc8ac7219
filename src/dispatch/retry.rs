//! Exponential backoff with full jitter (pure).

use std::time::Duration;

/// Backoff between attempts of one message.
#[derive(Clone, Copy, Debug)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    max_retry_after: Duration,
}

impl From<&crate::config::RetryConfig> for Backoff {
    /// The delays between attempts a trigger's `retry` settings describe.
    fn from(r: &crate::config::RetryConfig) -> Self {
        Backoff::new(
            Duration::from_millis(r.initial_backoff_ms),
            Duration::from_millis(r.max_backoff_ms),
        )
        .with_max_retry_after(Duration::from_millis(r.max_retry_after_ms))
    }
}

impl Backoff {
    /// `initial` doubles per attempt up to `max`; a server's Retry-After is honoured up to
    /// `max` or five minutes, whichever is longer (see [`Backoff::with_max_retry_after`]).
    pub fn new(initial: Duration, max: Duration) -> Self {
        Self {
            initial,
            max,
            max_retry_after: max.max(Duration::from_secs(300)),
        }
    }

    /// Honours a server's Retry-After up to `cap` (`retry.max_retry_after_ms`).
    pub fn with_max_retry_after(mut self, cap: Duration) -> Self {
        self.max_retry_after = cap;
        self
    }

    /// The ceiling for the delay after `attempt` failures (1-based).
    pub fn ceiling(&self, attempt: u32) -> Duration {
        let factor = 1u32
            .checked_shl(attempt.saturating_sub(1).min(30))
            .unwrap_or(u32::MAX);
        self.initial.saturating_mul(factor).min(self.max)
    }

    /// The delay after `attempt` failures: uniform in [ceiling/2, ceiling] so it never collapses
    /// to zero, and a server's Retry-After wins when longer, up to its cap.
    pub fn delay(&self, attempt: u32, retry_after: Option<Duration>, unit: f64) -> Duration {
        let ceiling = self.ceiling(attempt);
        let jittered = ceiling.mul_f64(0.5 + 0.5 * unit.clamp(0.0, 1.0));
        match retry_after {
            Some(ra) if ra > jittered => self.clamp(ra),
            _ => jittered,
        }
    }

    /// A server-given wait, bounded by `retry.max_retry_after_ms`: a huge or absurd
    /// Retry-After must not park a key (or throttle a trigger) for ever.
    pub fn clamp(&self, retry_after: Duration) -> Duration {
        retry_after.min(self.max_retry_after)
    }
}

/// Parses a Retry-After header: delta-seconds (`120`) or an HTTP-date
/// (`Wed, 21 Oct 2015 07:28:00 GMT`, also the obsolete RFC 850 and asctime forms), relative to
/// `now`. A date in the past is zero; a number too large for 64 bits is the largest duration
/// (callers clamp it); anything else (negative, fractional, garbage) is ignored.
pub fn parse_retry_after(value: &str, now: std::time::SystemTime) -> Option<Duration> {
    let v = value.trim();
    if !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()) {
        return Some(v.parse::<u64>().map_or(Duration::MAX, Duration::from_secs));
    }
    let at = httpdate::parse_http_date(v).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_and_stops_at_the_cap() {
        let b = Backoff::new(Duration::from_millis(100), Duration::from_secs(1))
            .with_max_retry_after(Duration::from_secs(1));
        assert_eq!(b.ceiling(1), Duration::from_millis(100));
        assert_eq!(b.ceiling(2), Duration::from_millis(200));
        assert_eq!(b.ceiling(4), Duration::from_millis(800));
        assert_eq!(b.ceiling(5), Duration::from_secs(1));
        assert_eq!(b.ceiling(500), Duration::from_secs(1));
        assert_eq!(b.delay(3, None, 0.0), Duration::from_millis(200));
        assert_eq!(b.delay(3, None, 1.0), Duration::from_millis(400));
        assert_eq!(
            b.delay(1, Some(Duration::from_millis(700)), 1.0),
            Duration::from_millis(700),
            "a longer Retry-After wins"
        );
        assert_eq!(
            b.delay(1, Some(Duration::MAX), 0.0),
            Duration::from_secs(1),
            "a huge Retry-After is clamped to its cap"
        );
    }

    #[test]
    fn parses_retry_after_of_any_shape() {
        let now = std::time::UNIX_EPOCH + Duration::from_secs(1_445_412_000); // 21 Oct 2015 07:20
        let p = |v: &str| parse_retry_after(v, now);
        assert_eq!(p(" 7 "), Some(Duration::from_secs(7)));
        assert_eq!(p("0"), Some(Duration::ZERO));
        assert_eq!(
            p("9223372036854775807"),
            Some(Duration::from_secs(i64::MAX as u64))
        );
        assert_eq!(p("99999999999999999999999"), Some(Duration::MAX));
        assert_eq!(
            p("Wed, 21 Oct 2015 07:28:00 GMT"),
            Some(Duration::from_secs(480))
        );
        assert_eq!(
            p("Wednesday, 21-Oct-15 07:28:00 GMT"),
            Some(Duration::from_secs(480))
        );
        assert_eq!(
            p("Wed Oct 21 07:28:00 2015"),
            Some(Duration::from_secs(480))
        );
        assert_eq!(
            p("Tue, 20 Oct 2015 07:28:00 GMT"),
            Some(Duration::ZERO),
            "past"
        );
        for garbage in ["", "-5", "1.5", "soon", "Wed, 21 Oct 2015", "１２"] {
            assert_eq!(p(garbage), None, "{garbage:?}");
        }
    }
}
