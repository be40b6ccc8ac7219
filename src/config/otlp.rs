//! `[otlp]`: OpenTelemetry trace export over OTLP/HTTP.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::secret::Secret;
use super::ConfigError;

/// Exports a trace per message (spans `consume`, `decode`, `dispatch`, `commit`) that
/// continues the `traceparent` header the message carries. Absent: no export, no cost.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct OtlpConfig {
    /// Collector base URL; `/v1/traces` is appended, e.g. `http://otel-collector:4318`.
    pub endpoint: super::secret::Endpoint,
    /// `http_protobuf` (default) or `http_json`.
    #[serde(default)]
    pub protocol: OtlpProtocol,
    /// Headers sent with each export (for example an API key); values are secrets.
    #[serde(default)]
    pub headers: BTreeMap<String, Secret>,
    /// `service.name` of the exported spans. Default `tessel-kafka`.
    #[serde(default = "default_service_name")]
    pub service_name: String,
    /// Share of traces sampled (0.0 to 1.0) when the message does not decide: a message
    /// whose `traceparent` is sampled is always traced. Default 1.0.
    #[serde(default = "default_sample_ratio")]
    pub sample_ratio: f64,
    /// Spans are sent in batches at least this often. Default 2000.
    #[serde(default = "default_export_interval_ms")]
    pub export_interval_ms: u64,
    /// Timeout of one export request. Default 10000.
    #[serde(default = "default_timeout_ms")]
    pub timeout_ms: u64,
}

/// OTLP transport encodings.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum OtlpProtocol {
    /// Protobuf over HTTP (`application/x-protobuf`).
    #[default]
    HttpProtobuf,
    /// JSON over HTTP (`application/json`).
    HttpJson,
}

fn default_service_name() -> String {
    "tessel-kafka".to_owned()
}
fn default_sample_ratio() -> f64 {
    1.0
}
fn default_export_interval_ms() -> u64 {
    2_000
}
fn default_timeout_ms() -> u64 {
    10_000
}

impl OtlpConfig {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if !(0.0..=1.0).contains(&self.sample_ratio) {
            return Err(ConfigError::invalid(
                "otlp.sample_ratio",
                "must be between 0.0 and 1.0",
            ));
        }
        if !matches!(self.endpoint.scheme(), "http" | "https") {
            return Err(ConfigError::invalid(
                "otlp.endpoint",
                "must be an http or https URL",
            ));
        }
        Ok(())
    }

    /// The traces URL: the endpoint with `/v1/traces` appended.
    pub fn traces_url(&self) -> String {
        format!(
            "{}/v1/traces",
            self.endpoint.expose().as_str().trim_end_matches('/')
        )
    }
}
