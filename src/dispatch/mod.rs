//! Starting runs: the HTTP run dispatcher client and the retry policy.
//!
//! A dispatch is accepted on 2xx, and on 409 (the dispatcher already accepted this
//! idempotency key). Everything else is classified into [`DispatchOutcome`].

pub mod batch;
pub mod cloudevents;
pub mod event;
mod http;
pub mod pool;
pub mod retry;

pub use http::HttpDispatcher;
pub use pool::DispatchPools;

use std::time::Duration;

use hyper::header::HeaderMap;

/// One request to the dispatcher: its Idempotency-Key, its body and the headers its envelope
/// adds (a CloudEvent's `ce-*` and `Content-Type`), which take the place of the defaults.
#[derive(Clone, Debug)]
pub struct DispatchRequest {
    /// The Idempotency-Key: a record's, or a batch's.
    pub key: String,
    /// The body.
    pub body: Vec<u8>,
    /// The envelope's headers.
    pub envelope: HeaderMap,
}

/// The answer to one dispatch attempt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DispatchOutcome {
    /// The run was started (2xx) or had been started already (409).
    Accepted {
        /// HTTP status.
        status: u16,
    },
    /// Try again later: 5xx, 408, 429, timeouts and connection errors.
    Retryable {
        /// HTTP status, when there was an answer.
        status: Option<u16>,
        /// What happened.
        reason: String,
        /// The dispatcher's Retry-After, when given.
        retry_after: Option<Duration>,
    },
    /// The dispatcher refused this message (400, 404, 410, 422 and other 4xx).
    Rejected {
        /// HTTP status.
        status: u16,
        /// The start of the answer body.
        reason: String,
    },
    /// The request could not be built from this record (a header value that HTTP cannot
    /// carry): no attempt can succeed, so the error policy applies at once.
    Invalid {
        /// What was wrong.
        reason: String,
    },
    /// 401 or 403: the trigger's dispatcher credentials are wrong; or a redirect (3xx): its
    /// URL is; or TLS refused (the dispatcher's certificate is not trusted, or it refused our
    /// client certificate). Either way a configuration error that stops the trigger.
    Unauthorized {
        /// HTTP status; 0 for a TLS refusal (there was no HTTP answer).
        status: u16,
        /// The start of the answer body.
        reason: String,
    },
}

impl DispatchOutcome {
    /// A bounded label for metrics.
    pub fn label(&self) -> &'static str {
        match self {
            Self::Accepted { .. } => "accepted",
            Self::Retryable { .. } => "retryable",
            Self::Rejected { .. } => "rejected",
            Self::Unauthorized { .. } => "unauthorized",
            Self::Invalid { .. } => "invalid",
        }
    }
}

/// Classifies an HTTP answer.
pub fn classify(status: u16, body: &str, retry_after: Option<Duration>) -> DispatchOutcome {
    let reason = body.chars().take(200).collect::<String>();
    match status {
        200..=299 | 409 => DispatchOutcome::Accepted { status },
        401 | 403 => DispatchOutcome::Unauthorized {
            status,
            reason: format!("check dispatcher.token: {reason}"),
        },
        // Redirects are not followed (the run and its token would go elsewhere).
        300..=399 => DispatchOutcome::Unauthorized {
            status,
            reason: format!(
                "the dispatcher redirects; set dispatcher.url to where it points {reason}"
            ),
        },
        408 | 429 | 500..=599 => DispatchOutcome::Retryable {
            status: Some(status),
            reason: if reason.is_empty() {
                format!("HTTP {status}")
            } else {
                format!("HTTP {status}: {reason}")
            },
            retry_after,
        },
        _ => DispatchOutcome::Rejected { status, reason },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_statuses() {
        assert_eq!(classify(202, "", None).label(), "accepted");
        assert_eq!(classify(409, "", None).label(), "accepted");
        assert_eq!(classify(500, "", None).label(), "retryable");
        // A redirect is a configuration error, like refused credentials: never followed.
        assert_eq!(
            classify(308, "(Location: https://x/runs)", None).label(),
            "unauthorized"
        );
        assert!(matches!(
            classify(401, "no", None),
            DispatchOutcome::Unauthorized { reason, .. } if reason.contains("dispatcher.token")
        ));
        assert_eq!(
            classify(429, "", Some(Duration::from_secs(2))),
            DispatchOutcome::Retryable {
                status: Some(429),
                reason: "HTTP 429".into(),
                retry_after: Some(Duration::from_secs(2))
            }
        );
        assert_eq!(classify(422, "bad", None).label(), "rejected");
        assert_eq!(classify(401, "", None).label(), "unauthorized");
        assert_eq!(classify(403, "", None).label(), "unauthorized");
    }
}
