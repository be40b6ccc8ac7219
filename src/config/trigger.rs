//! `[connections.<name>.triggers.<trigger>]`: which topics start which workflow, and how.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::secret::Secret;
use super::ConfigError;

/// A trigger: messages of its topics start runs of one workflow through the run dispatcher.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TriggerConfig {
    /// Topics whose messages start runs. Required, at least one. A name starting with `^` is
    /// a regular expression (as librdkafka and Kafka Connect's `topics.regex` take it): every
    /// topic it matches, including topics created later (found within librdkafka's
    /// `topic.metadata.refresh.interval.ms`, 5 minutes by default).
    pub topics: Vec<String>,
    /// The workflow a message starts; sent in the event as `workflow`.
    pub workflow: String,
    /// Where runs are started.
    pub dispatcher: DispatcherConfig,
    /// Runs in flight at most, across all partitions of the trigger's topics. Default 16; at
    /// most [`MAX_CONCURRENCY`].
    #[serde(default = "default_concurrency")]
    pub concurrency: usize,
    /// `key` (default): same key in order, different keys in parallel; `partition`: one run at
    /// a time per partition; `unordered`: any message may start as soon as there is room.
    #[serde(default)]
    pub ordering: Ordering,
    /// How keys are decoded. Default `auto`.
    #[serde(default)]
    pub key_format: PayloadFormat,
    /// How values are decoded. Default `auto`.
    #[serde(default)]
    pub value_format: PayloadFormat,
    /// What happens to a message that cannot be decoded, that the dispatcher rejects (400,
    /// 404, 410, 422), or whose retry budget ran out: `block` (default: retry until it goes
    /// through), `skip` (log and count, move on) or `dead_letter` (write it to
    /// `dead_letter_topic`; handled once the broker acknowledged the write).
    #[serde(default)]
    pub on_error: ErrorPolicy,
    /// The dead-letter topic, required with `on_error = "dead_letter"`. Written through the
    /// connection's idempotent producer: the principal needs WRITE on it.
    #[serde(default)]
    pub dead_letter_topic: Option<String>,
    /// Backoff between attempts of one message.
    #[serde(default)]
    pub retry: RetryConfig,
    /// A CEL expression on the decoded record (`key`, `value`, `headers`, `topic`,
    /// `partition`, `offset`, `timestamp`); only records for which it is true start runs. The
    /// others are handled without a run and committed (`outcome="filtered"`); a record it
    /// cannot be evaluated on (a missing field, a wrong type) counts as not matching
    /// (`outcome="filter_error"`). Compiled when the configuration is loaded. Default: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filter: Option<crate::config::filter::Filter>,
    /// Records older than this (by their Kafka timestamp, against the clock, checked before
    /// every attempt) start no run: `on_expired` applies. Records without a timestamp never
    /// expire. Default: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_record_age_ms: Option<u64>,
    /// What happens to a record older than `max_record_age_ms`: `skip` (default: counted,
    /// committed) or `dead_letter` (written to `dead_letter_topic` with its age in
    /// `tessel.record.age.ms`).
    #[serde(default)]
    pub on_expired: ExpiredPolicy,
    /// With a `batch` table, one request carries the events of one partition, in offset
    /// order, instead of one request per record (see `docs/event.md`). Default: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch: Option<BatchConfig>,
}

/// `batch = { max_records, max_bytes, max_wait_ms }`: when a partition's waiting records go
/// out as one request.
#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct BatchConfig {
    /// Records per request at most. Default 500.
    #[serde(default = "default_batch_records")]
    pub max_records: usize,
    /// Key and value bytes per request at most (a record larger than this goes alone).
    /// Default 1 MiB.
    #[serde(default = "default_batch_bytes")]
    pub max_bytes: usize,
    /// How long a batch waits for more records after its first one arrived. Default 1000, at
    /// most 3600000.
    #[serde(default = "default_batch_wait_ms")]
    pub max_wait_ms: u64,
}

impl From<&BatchConfig> for crate::core::batch::BatchLimits {
    fn from(c: &BatchConfig) -> Self {
        Self {
            max_records: c.max_records.max(1),
            max_bytes: c.max_bytes.max(1),
            max_wait: std::time::Duration::from_millis(c.max_wait_ms),
        }
    }
}

/// The longest `batch.max_wait_ms`: records never wait longer than an hour for a batch.
const MAX_BATCH_WAIT_MS: u64 = 3_600_000;

fn default_batch_records() -> usize {
    500
}
fn default_batch_bytes() -> usize {
    1 << 20
}
fn default_batch_wait_ms() -> u64 {
    1000
}

/// What to do with a record older than `max_record_age_ms`.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ExpiredPolicy {
    /// Count it and treat it as handled.
    #[default]
    Skip,
    /// Write it to the dead-letter topic, then treat it as handled.
    DeadLetter,
}

/// The run dispatcher endpoint of a trigger. Debug and Serialize redact the token and the
/// values of credential-like headers.
#[derive(Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct DispatcherConfig {
    /// URL the event is POSTed to.
    pub url: super::secret::Endpoint,
    /// Bearer token sent as `Authorization: Bearer …`.
    #[serde(default)]
    pub token: Option<Secret>,
    /// Extra request headers. Values may be `{ env = "VAR" }` or `{ file = "/path" }`;
    /// those of credential-like headers (`Authorization`, `Cookie`, names with `token`,
    /// `key`, `secret`, `password` or `auth`) are never printed.
    #[serde(
        default,
        serialize_with = "serialize_headers",
        deserialize_with = "super::secret::deserialize_properties"
    )]
    pub headers: BTreeMap<String, String>,
    /// Timeout of one dispatch request. Default 30000.
    #[serde(default = "default_dispatch_timeout_ms")]
    pub timeout_ms: u64,
    /// What a request carries: `tessel` (default: the event of docs/event.md as JSON) or
    /// `cloudevents` (CloudEvents 1.0, HTTP binary mode: the decoded value as the body, the
    /// record's attributes in `ce-*` headers).
    #[serde(default)]
    pub envelope: Envelope,
    /// The CloudEvents `type` with `envelope = "cloudevents"`. Default
    /// `dev.tessel.kafka.record`.
    #[serde(default = "default_cloudevents_type")]
    pub cloudevents_type: String,
    /// CA certificates (PEM) that sign the dispatcher's certificate, *instead of* the
    /// system's trust store (as `schema_registry.ca_location`). With an https:// `url` only.
    #[serde(default)]
    pub ca_location: Option<std::path::PathBuf>,
    /// Client certificate (PEM, the chain) for mTLS; needs `key_location`.
    #[serde(default)]
    pub certificate_location: Option<std::path::PathBuf>,
    /// Client private key (PEM, unencrypted) for mTLS, typically a mounted secret file.
    #[serde(default)]
    pub key_location: Option<std::path::PathBuf>,
    /// An HTTP proxy, `http://[user:password@]host:port`, through which every connection to
    /// the dispatcher is a CONNECT tunnel (TLS, when the `url` is https, runs end to end
    /// inside it). Unset: `HTTPS_PROXY` / `HTTP_PROXY` / `ALL_PROXY` (or their lower-case
    /// forms) apply as curl reads them, with `NO_PROXY` exempting hosts, read when the
    /// trigger starts. Credentials in it become `Proxy-Authorization: Basic`.
    #[serde(default)]
    pub proxy: Option<super::secret::Endpoint>,
}

impl DispatcherConfig {
    /// The CA and client certificate files of this dispatcher.
    pub fn tls_files(&self) -> crate::tls::TlsFiles<'_> {
        crate::tls::TlsFiles::of(
            &self.ca_location,
            &self.certificate_location,
            &self.key_location,
        )
    }
}

/// The shape of a dispatch request.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Envelope {
    /// The connector's own event (docs/event.md).
    #[default]
    Tessel,
    /// CloudEvents 1.0, HTTP binary content mode.
    Cloudevents,
}

fn default_cloudevents_type() -> String {
    "dev.tessel.kafka.record".to_owned()
}

/// Whether a request header carries a credential.
pub(crate) fn is_secret_header(name: &str) -> bool {
    let n = name.to_ascii_lowercase();
    n == "cookie"
        || ["auth", "token", "key", "secret", "password"]
            .iter()
            .any(|w| n.contains(w))
}

fn redacted_headers(headers: &BTreeMap<String, String>) -> BTreeMap<&str, &str> {
    headers
        .iter()
        .map(|(k, v)| {
            let v = if is_secret_header(k) {
                super::secret::REDACTED
            } else {
                v.as_str()
            };
            (k.as_str(), v)
        })
        .collect()
}

fn serialize_headers<S: serde::Serializer>(
    headers: &BTreeMap<String, String>,
    s: S,
) -> Result<S::Ok, S::Error> {
    if super::secret::exposing_for_fingerprint() {
        return headers.serialize(s);
    }
    redacted_headers(headers).serialize(s)
}

impl std::fmt::Debug for DispatcherConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DispatcherConfig")
            .field("url", &self.url)
            .field("token", &self.token)
            .field("headers", &redacted_headers(&self.headers))
            .field("timeout_ms", &self.timeout_ms)
            .field("envelope", &self.envelope)
            .field("cloudevents_type", &self.cloudevents_type)
            .field("ca_location", &self.ca_location)
            .field("certificate_location", &self.certificate_location)
            .field("key_location", &self.key_location)
            .field("proxy", &self.proxy)
            .finish()
    }
}

pub use crate::core::types::Ordering;

/// How a key or value is decoded.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum PayloadFormat {
    /// Schema Registry framing when present (and a registry is configured), else JSON when it
    /// parses as a JSON object or array, else UTF-8 text, else bytes.
    #[default]
    Auto,
    /// Confluent wire format, required.
    SchemaRegistry,
    /// JSON text.
    Json,
    /// UTF-8 text.
    String,
    /// Raw bytes, base64 in the event.
    Bytes,
}

/// What to do with a message that cannot be decoded or that the dispatcher rejects.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ErrorPolicy {
    /// Retry forever; the message's key waits (its partition, with `ordering = "partition"`).
    #[default]
    Block,
    /// Log and count, then treat the message as handled.
    Skip,
    /// Write the message to the dead-letter topic, then treat it as handled.
    DeadLetter,
}

/// Exponential backoff with full jitter.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RetryConfig {
    /// First delay. Default 200.
    #[serde(default = "default_initial_backoff_ms")]
    pub initial_backoff_ms: u64,
    /// Largest delay. Default 30000.
    #[serde(default = "default_max_backoff_ms")]
    pub max_backoff_ms: u64,
    /// Dispatch attempts for 5xx, timeouts and connection errors before `on_error` applies;
    /// 0 (default) retries until the dispatcher recovers, so an outage never dead-letters.
    #[serde(default)]
    pub max_attempts: u32,
    /// How long a schema id the registry does not know (40403) is retried before `on_error`
    /// applies (a registry replica can lag behind a producer). Default 60000.
    #[serde(default = "default_schema_not_found_ms")]
    pub schema_not_found_ms: u64,
    /// The longest wait a dispatcher's `Retry-After` (seconds or an HTTP date) is honoured
    /// for; a longer or absurd one waits this long. Default 300000 (5 minutes).
    #[serde(default = "default_max_retry_after_ms")]
    pub max_retry_after_ms: u64,
}

impl Default for RetryConfig {
    fn default() -> Self {
        Self {
            initial_backoff_ms: default_initial_backoff_ms(),
            max_backoff_ms: default_max_backoff_ms(),
            max_attempts: 0,
            schema_not_found_ms: default_schema_not_found_ms(),
            max_retry_after_ms: default_max_retry_after_ms(),
        }
    }
}

fn default_schema_not_found_ms() -> u64 {
    60_000
}
fn default_max_retry_after_ms() -> u64 {
    300_000
}
/// The most runs a trigger may have in flight. A partition whose gap is full stops starting
/// runs, but those in flight still finish above the gap: with at most this many, the records
/// it tracks above a parked key stay within twice the gap bound
/// (`core::offsets::MAX_TRACKED_ABOVE`); the commit metadata's start gate keeps room for
/// every run in flight, so an orderly handover repeats nothing.
pub const MAX_CONCURRENCY: usize = 10_000;

/// The most records in one batch. A batch trigger's partition has one batch in flight, and a
/// batch that fails in part leaves its other records handled above the gap: like
/// [`MAX_CONCURRENCY`] runs, they are bounded by the gap bound (and a batch shrinks to the
/// record at the gap when the commit metadata might not hold its others).
pub const MAX_BATCH_RECORDS: usize = MAX_CONCURRENCY;

fn default_concurrency() -> usize {
    16
}
fn default_dispatch_timeout_ms() -> u64 {
    30_000
}
fn default_initial_backoff_ms() -> u64 {
    200
}
fn default_max_backoff_ms() -> u64 {
    30_000
}

impl TriggerConfig {
    pub(super) fn validate(&self, key: &str) -> Result<(), ConfigError> {
        if self.topics.is_empty() || self.topics.iter().any(|t| t.trim().is_empty()) {
            return Err(ConfigError::invalid(
                format!("{key}.topics"),
                "at least one non-empty topic is required",
            ));
        }
        for t in self.topics.iter().filter(|t| is_pattern(t)) {
            if let Err(e) = regex::Regex::new(t) {
                return Err(ConfigError::invalid(
                    format!("{key}.topics"),
                    format!(
                        "{t:?} is not a regular expression: {}",
                        e.to_string().replace('\n', " ")
                    ),
                ));
            }
        }
        if self.concurrency == 0 || self.concurrency > MAX_CONCURRENCY {
            return Err(ConfigError::invalid(
                format!("{key}.concurrency"),
                format!("must be from 1 to {MAX_CONCURRENCY}"),
            ));
        }
        if self.retry.initial_backoff_ms == 0
            || self.retry.max_backoff_ms < self.retry.initial_backoff_ms
        {
            return Err(ConfigError::invalid(
                format!("{key}.retry"),
                "initial_backoff_ms must be at least 1 and not above max_backoff_ms",
            ));
        }
        match (&self.on_error, &self.dead_letter_topic) {
            (ErrorPolicy::DeadLetter, None) => {
                return Err(ConfigError::invalid(
                    format!("{key}.dead_letter_topic"),
                    "is required with on_error = \"dead_letter\"",
                ))
            }
            (_, Some(t)) if self.consumes_topic(t) => {
                return Err(ConfigError::invalid(
                    format!("{key}.dead_letter_topic"),
                    "must not be one of the trigger's own topics (nor match one of its patterns)",
                ))
            }
            _ => {}
        }
        if self.on_expired == ExpiredPolicy::DeadLetter && self.dead_letter_topic.is_none() {
            return Err(ConfigError::invalid(
                format!("{key}.dead_letter_topic"),
                "is required with on_expired = \"dead_letter\"",
            ));
        }
        if self.max_record_age_ms == Some(0) {
            return Err(ConfigError::invalid(
                format!("{key}.max_record_age_ms"),
                "must be at least 1 (leave it out for no limit)",
            ));
        }
        if let Some(b) = &self.batch {
            if b.max_records == 0 || b.max_bytes == 0 {
                return Err(ConfigError::invalid(
                    format!("{key}.batch"),
                    "max_records and max_bytes must be at least 1",
                ));
            }
            if b.max_records > MAX_BATCH_RECORDS {
                return Err(ConfigError::invalid(
                    format!("{key}.batch.max_records"),
                    format!("must be at most {MAX_BATCH_RECORDS}"),
                ));
            }
            if b.max_wait_ms > MAX_BATCH_WAIT_MS {
                return Err(ConfigError::invalid(
                    format!("{key}.batch.max_wait_ms"),
                    format!("must be at most {MAX_BATCH_WAIT_MS} (an hour)"),
                ));
            }
            if self.ordering == Ordering::Unordered {
                return Err(ConfigError::invalid(
                    format!("{key}.batch"),
                    "a batch trigger sends each partition's records in offset order; ordering = \"unordered\" does not apply",
                ));
            }
        }
        let ce_type = &self.dispatcher.cloudevents_type;
        if ce_type.is_empty() || ce_type.chars().any(|c| c.is_control() || !c.is_ascii()) {
            return Err(ConfigError::invalid(
                format!("{key}.dispatcher.cloudevents_type"),
                "must be non-empty printable ASCII (it is sent as the ce-type header)",
            ));
        }
        if !matches!(self.dispatcher.url.scheme(), "http" | "https") {
            return Err(ConfigError::invalid(
                format!("{key}.dispatcher.url"),
                "must be http or https",
            ));
        }
        self.validate_dispatcher_transport(&format!("{key}.dispatcher"))
    }

    /// The dispatcher's TLS files and proxy (`key`: the dispatcher's key path).
    fn validate_dispatcher_transport(&self, key: &str) -> Result<(), ConfigError> {
        let d = &self.dispatcher;
        if let Some(reason) = d.tls_files().unpaired("dispatcher") {
            return Err(ConfigError::invalid(key, reason));
        }
        if d.tls_files().any() && d.url.scheme() != "https" {
            return Err(ConfigError::invalid(
                key,
                "ca_location, certificate_location and key_location need an https:// url",
            ));
        }
        if let Some(proxy) = &d.proxy {
            let p = proxy.expose();
            if p.scheme() != "http" {
                return Err(ConfigError::invalid(
                    format!("{key}.proxy"),
                    "must be an http:// URL (the tunnel to the proxy itself is not TLS)",
                ));
            }
            if p.host_str().is_none_or(str::is_empty)
                || !matches!(p.path(), "" | "/")
                || p.query().is_some()
                || p.fragment().is_some()
            {
                return Err(ConfigError::invalid(
                    format!("{key}.proxy"),
                    "must be http://[user:password@]host[:port], with no path or query",
                ));
            }
        }
        Ok(())
    }

    /// Whether `topic` is one of the trigger's: named, or matched by one of its patterns.
    pub fn consumes_topic(&self, topic: &str) -> bool {
        self.names_topic(topic) || self.pattern_matches(topic)
    }

    /// Whether `topic` is named among the trigger's topics.
    pub fn names_topic(&self, topic: &str) -> bool {
        self.topics.iter().any(|t| !is_pattern(t) && t == topic)
    }

    /// Whether one of the trigger's patterns matches `topic`.
    pub fn pattern_matches(&self, topic: &str) -> bool {
        self.topics
            .iter()
            .filter(|t| is_pattern(t))
            .any(|t| regex::Regex::new(t).is_ok_and(|r| r.is_match(topic)))
    }

    /// Whether the trigger writes records to its dead-letter topic: it has one (`on_error`
    /// or `on_expired` is `dead_letter`, or an operator's skip writes there; validation
    /// requires the topic with either policy).
    pub fn dead_letters(&self) -> bool {
        self.dead_letter_topic.is_some()
            || self.on_error == ErrorPolicy::DeadLetter
            || self.on_expired == ExpiredPolicy::DeadLetter
    }

    pub(super) fn needs_registry(&self) -> bool {
        self.key_format == PayloadFormat::SchemaRegistry
            || self.value_format == PayloadFormat::SchemaRegistry
    }
}

/// Whether a trigger topic is a pattern (starts with `^`), as librdkafka decides.
pub fn is_pattern(topic: &str) -> bool {
    topic.starts_with('^')
}
