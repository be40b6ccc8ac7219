//! The HTTP client of the run dispatcher: one pooled keep-alive client per trigger.

use std::time::Duration;

use reqwest::header::{HeaderMap, HeaderName, HeaderValue, AUTHORIZATION, CONTENT_TYPE};

use super::retry::parse_retry_after;
use super::{classify, DispatchOutcome};
use crate::config::DispatcherConfig;

/// POSTs events to one trigger's dispatcher URL.
#[derive(Clone, Debug)]
pub struct HttpDispatcher {
    client: reqwest::Client,
    url: url::Url,
}

impl HttpDispatcher {
    /// Builds the client with the trigger's auth and headers as defaults.
    pub fn try_new(config: &DispatcherConfig) -> Result<Self, String> {
        let mut headers = HeaderMap::new();
        let _ = headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        for (k, v) in &config.headers {
            let name =
                HeaderName::from_bytes(k.as_bytes()).map_err(|e| format!("header {k}: {e}"))?;
            let value = HeaderValue::from_str(v).map_err(|e| format!("header {k}: {e}"))?;
            let _ = headers.insert(name, value);
        }
        if let Some(token) = &config.token {
            let mut value = HeaderValue::from_str(&format!("Bearer {}", token.expose()))
                .map_err(|_| "dispatcher token is not a valid header value".to_owned())?;
            value.set_sensitive(true);
            let _ = headers.insert(AUTHORIZATION, value);
        }
        let client = reqwest::Client::builder()
            .default_headers(headers)
            .timeout(Duration::from_millis(config.timeout_ms))
            .connect_timeout(Duration::from_millis(config.timeout_ms.min(10_000)))
            .pool_idle_timeout(Duration::from_secs(90))
            .tcp_nodelay(true)
            // A dispatcher answers; it does not redirect. Following one would resend the run
            // (and its token) elsewhere, and the policy parsed the URL on every request.
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(concat!("tessel-kafka/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| e.to_string())?;
        Ok(Self {
            client,
            url: config.url.expose().clone(),
        })
    }

    /// One attempt to start a run for `body`.
    pub async fn dispatch(
        &self,
        body: Vec<u8>,
        idempotency_key: &str,
        traceparent: Option<&str>,
    ) -> DispatchOutcome {
        self.dispatch_with(body, idempotency_key, traceparent, HeaderMap::new())
            .await
    }

    /// [`HttpDispatcher::dispatch`] with request headers of its own (the envelope's: a
    /// CloudEvent's `ce-*` and `Content-Type`), which take the place of the defaults.
    pub async fn dispatch_with(
        &self,
        body: Vec<u8>,
        idempotency_key: &str,
        traceparent: Option<&str>,
        headers: HeaderMap,
    ) -> DispatchOutcome {
        let mut req = self
            .client
            .post(self.url.clone())
            .header("Idempotency-Key", idempotency_key)
            .body(body);
        if !headers.is_empty() {
            req = req.headers(headers);
        }
        if let Some(tp) = traceparent {
            req = req.header("traceparent", tp);
        }
        match req.send().await {
            Ok(resp) => {
                let status = resp.status().as_u16();
                let retry_after = resp
                    .headers()
                    .get(reqwest::header::RETRY_AFTER)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| parse_retry_after(v, std::time::SystemTime::now()));
                let body = if (200..300).contains(&status) {
                    String::new()
                } else if (300..400).contains(&status) {
                    let location = resp
                        .headers()
                        .get(reqwest::header::LOCATION)
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or("(no Location)");
                    format!("(Location: {})", crate::config::redact_text(location))
                } else {
                    resp.text().await.unwrap_or_default()
                };
                classify(status, &body, retry_after)
            }
            Err(e) if e.is_builder() => DispatchOutcome::Invalid {
                reason: crate::config::redacted_error_chain(&e.without_url()),
            },
            Err(e) => DispatchOutcome::Retryable {
                status: None,
                reason: if e.is_timeout() {
                    "request timed out".to_owned()
                } else if e.is_connect() {
                    "cannot connect to the dispatcher".to_owned()
                } else {
                    crate::config::redacted_error_chain(&e.without_url())
                },
                retry_after: None,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_header_http_cannot_carry_is_invalid_not_retryable() {
        let config: DispatcherConfig =
            toml::from_str("url = \"http://u:s3cr3t@127.0.0.1:9/runs?token=t0k\"").unwrap();
        let d = HttpDispatcher::try_new(&config).unwrap();
        let outcome = d
            .dispatch(b"{}".to_vec(), "kafka:g:t:0:1", Some("00-bad\n"))
            .await;
        match outcome {
            DispatchOutcome::Invalid { reason } => {
                assert!(
                    !reason.contains("s3cr3t") && !reason.contains("t0k"),
                    "{reason}"
                );
            }
            other => panic!("expected Invalid, got {other:?}"),
        }
    }
}
