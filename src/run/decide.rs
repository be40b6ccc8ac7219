//! What happens next to a run's records after an attempt: the pure part of the run loop.
//! [`decide`] turns what an attempt observed into the next step; [`Step`] is that step with
//! the failure `on_error` is told of. No I/O, no clock; every branch is unit-tested.

use std::time::Duration;

use tokio::time::Instant;

use super::WorkOutcome;
use crate::codec::Disposition;

/// How long a trigger stopped by a configuration error waits between attempts.
pub(super) const STOPPED_RETRY: Duration = Duration::from_secs(30);

/// Why a message is handed to the error policy.
#[derive(Debug, Clone)]
pub(super) struct Failure {
    /// `KEY_DESERIALIZE`, `VALUE_DESERIALIZE` or `DISPATCH`.
    pub(super) stage: &'static str,
    /// Stable error class.
    pub(super) class: &'static str,
    /// Sanitised, one line.
    pub(super) message: String,
    pub(super) status: Option<u16>,
    pub(super) schema_id: Option<u32>,
}

pub(super) enum Step {
    Done(WorkOutcome),
    Retry { retry_after: Option<Duration> },
    Fail(Failure),
}

impl Step {
    /// The step [`decide`] chose; `failure` describes the failure, given its class, when
    /// `on_error` applies.
    pub(super) fn of(next: Next, failure: impl FnOnce(&'static str) -> Failure) -> Self {
        match next {
            Next::Done(outcome) => Step::Done(outcome),
            Next::Retry { retry_after } => Step::Retry { retry_after },
            Next::Stop => Step::Retry {
                retry_after: Some(STOPPED_RETRY),
            },
            Next::Fail(class) => Step::Fail(failure(class)),
        }
    }
}

/// What one attempt observed, as far as the next step depends on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Observed {
    /// The dispatcher accepted the run (2xx, or 409 for a run it already has).
    Accepted,
    /// A transient dispatch failure (5xx, 429, timeout, connection error).
    Retryable {
        /// The dispatcher's Retry-After, if it sent one.
        retry_after: Option<Duration>,
    },
    /// The dispatcher refused this message (4xx other than 401, 403, 409, 429).
    Rejected,
    /// No request can be built from this record.
    Invalid,
    /// The dispatcher refused the connector's credentials (401, 403).
    Unauthorized,
    /// The key or value could not be decoded.
    Undecodable {
        /// What the error means.
        disposition: Disposition,
        /// The registry does not know the schema id (yet).
        schema_not_found: bool,
        /// Since the schema id was first found missing.
        missing_for: Duration,
    },
    /// The attempt panicked.
    Panicked,
}

/// The retry settings [`decide`] applies.
#[derive(Debug, Clone, Copy)]
pub struct RetryPolicy {
    /// Transient failures before `on_error` applies (0: no limit).
    pub max_attempts: u32,
    /// How long an unknown schema id is retried before `on_error` applies.
    pub schema_not_found: Duration,
}

impl Observed {
    /// A decode error as an observation; `first_missing` remembers since when the registry
    /// has not known the schema id (set here on the first such error).
    pub fn undecodable(e: &crate::codec::DecodeError, first_missing: &mut Option<Instant>) -> Self {
        let schema_not_found = e.class() == "schema_not_found";
        let missing_for = if schema_not_found {
            first_missing.get_or_insert_with(Instant::now).elapsed()
        } else {
            Duration::ZERO
        };
        Observed::Undecodable {
            disposition: e.disposition(),
            schema_not_found,
            missing_for,
        }
    }
}

impl From<&crate::config::RetryConfig> for RetryPolicy {
    /// The settings of a trigger's `retry` table that [`decide`] applies.
    fn from(r: &crate::config::RetryConfig) -> Self {
        Self {
            max_attempts: r.max_attempts,
            schema_not_found: std::time::Duration::from_millis(r.schema_not_found_ms),
        }
    }
}

/// What happens next to a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// It is handled.
    Done(WorkOutcome),
    /// Try again after the backoff (or the dispatcher's Retry-After).
    Retry {
        /// The dispatcher's Retry-After.
        retry_after: Option<Duration>,
    },
    /// `on_error` applies, with this error class.
    Fail(&'static str),
    /// A configuration error: the trigger stops and tries again every 30 s.
    Stop,
}

/// The next step for a message after an attempt: `transient` counts its transient failures,
/// this attempt's included. Pure; every branch is unit-tested.
pub fn decide(observed: Observed, transient: u32, policy: &RetryPolicy) -> Next {
    match observed {
        Observed::Accepted => Next::Done(WorkOutcome::Accepted),
        Observed::Retryable { retry_after } => {
            if policy.max_attempts > 0 && transient >= policy.max_attempts {
                Next::Fail("retries_exhausted")
            } else {
                Next::Retry { retry_after }
            }
        }
        Observed::Rejected => Next::Fail("dispatch_rejected"),
        Observed::Invalid => Next::Fail("request_invalid"),
        Observed::Unauthorized => Next::Stop,
        Observed::Undecodable {
            disposition,
            schema_not_found,
            missing_for,
        } => match disposition {
            Disposition::Reject => Next::Fail("decode"),
            Disposition::Retry if schema_not_found && missing_for >= policy.schema_not_found => {
                Next::Fail("decode")
            }
            Disposition::Retry => Next::Retry { retry_after: None },
            Disposition::Fatal => Next::Stop,
        },
        // A panic is retried like a transient failure, but never without limit: a record
        // that panics the decoder would otherwise block its key for ever.
        Observed::Panicked => {
            if transient >= policy.max_attempts.max(1) {
                Next::Fail("worker_panic")
            } else {
                Next::Retry { retry_after: None }
            }
        }
    }
}

/// A record's retry state.
#[derive(Default)]
pub(super) struct Attempts {
    /// Attempts made (the dead letter's `tessel.attempts`).
    pub(super) total: u32,
    /// Transient failures among them (the retry budget [`decide`] counts).
    pub(super) transient: u32,
    /// When its schema id was first found missing.
    pub(super) first_schema_not_found: Option<Instant>,
}

#[cfg(test)]
mod tests {
    use super::{decide, Disposition, Next, Observed, RetryPolicy, WorkOutcome};
    use std::time::Duration;

    const POLICY: RetryPolicy = RetryPolicy {
        max_attempts: 3,
        schema_not_found: Duration::from_secs(60),
    };
    const UNLIMITED: RetryPolicy = RetryPolicy {
        max_attempts: 0,
        ..POLICY
    };

    #[test]
    fn an_accepted_run_is_done() {
        assert_eq!(
            decide(Observed::Accepted, 0, &POLICY),
            Next::Done(WorkOutcome::Accepted)
        );
    }

    #[test]
    fn transient_failures_retry_until_the_budget_then_fail() {
        let ra = Some(Duration::from_secs(2));
        let observed = Observed::Retryable { retry_after: ra };
        assert_eq!(
            decide(observed, 1, &POLICY),
            Next::Retry { retry_after: ra }
        );
        assert_eq!(
            decide(observed, 2, &POLICY),
            Next::Retry { retry_after: ra }
        );
        assert_eq!(
            decide(observed, 3, &POLICY),
            Next::Fail("retries_exhausted")
        );
        // max_attempts = 0: until the dispatcher recovers.
        assert_eq!(
            decide(observed, 1_000_000, &UNLIMITED),
            Next::Retry { retry_after: ra }
        );
    }

    #[test]
    fn rejections_and_invalid_requests_fail_at_once_and_credentials_stop_the_trigger() {
        for (observed, transient, policy, next) in [
            (
                Observed::Rejected,
                0,
                UNLIMITED,
                Next::Fail("dispatch_rejected"),
            ),
            (
                Observed::Invalid,
                0,
                UNLIMITED,
                Next::Fail("request_invalid"),
            ),
            (Observed::Unauthorized, 9, POLICY, Next::Stop),
        ] {
            assert_eq!(decide(observed, transient, &policy), next, "{observed:?}");
        }
    }

    #[test]
    fn decode_errors_follow_their_disposition() {
        let undecodable = |disposition, schema_not_found, missing_for| Observed::Undecodable {
            disposition,
            schema_not_found,
            missing_for,
        };
        let reject = undecodable(Disposition::Reject, false, Duration::ZERO);
        assert_eq!(decide(reject, 0, &POLICY), Next::Fail("decode"));
        // A registry outage is retried without limit, whatever max_attempts says.
        let outage = undecodable(Disposition::Retry, false, Duration::ZERO);
        assert_eq!(
            decide(outage, 50, &POLICY),
            Next::Retry { retry_after: None }
        );
        // An unknown schema id is retried for schema_not_found, then fails.
        let missing = |d| undecodable(Disposition::Retry, true, d);
        assert_eq!(
            decide(missing(Duration::from_secs(59)), 0, &POLICY),
            Next::Retry { retry_after: None }
        );
        assert_eq!(
            decide(missing(Duration::from_secs(60)), 0, &POLICY),
            Next::Fail("decode")
        );
        let fatal = undecodable(Disposition::Fatal, false, Duration::ZERO);
        assert_eq!(decide(fatal, 0, &POLICY), Next::Stop);
    }

    #[test]
    fn a_panic_is_retried_within_the_budget_and_never_without_limit() {
        let retry = Next::Retry { retry_after: None };
        for (transient, policy, next) in [
            (1, POLICY, retry),
            (3, POLICY, Next::Fail("worker_panic")),
            (1, UNLIMITED, Next::Fail("worker_panic")),
        ] {
            assert_eq!(decide(Observed::Panicked, transient, &policy), next);
        }
    }
}
