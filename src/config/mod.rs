//! Configuration: TOML files plus `TESSEL_KAFKA__…` environment overrides, loaded into typed
//! structs that reject unknown keys.
//!
//! Loading order: built-in defaults, then the file, then the environment. A nested key is
//! reached with double underscores: `TESSEL_KAFKA__CONNECTIONS__ORDERS__KAFKA__SASL_PASSWORD`
//! sets `sasl.password` of connection `orders` (Kafka property names are written with dots in
//! the file; in the environment, underscores stand for the dots).
//!
//! Every field documents its default; `config/example.toml` mirrors these structs.

mod connection;
mod error;
mod otlp;
mod produce;
mod secret;
pub mod security;
mod trigger;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;

use serde::{Deserialize, Serialize};

pub use connection::{ConnectionConfig, RegistryConfig};
pub use error::ConfigError;
pub use otlp::{OtlpConfig, OtlpProtocol};
pub use produce::{topic_matches, ProduceConfig, ProducerConfig, TokenGrant};
pub use secret::{is_secret_property, redact_text, redact_url, Endpoint, Secret, REDACTED};
pub use trigger::{
    DispatcherConfig, ErrorPolicy, Ordering, PayloadFormat, RetryConfig, TriggerConfig,
};

/// Prefix of environment variables that override the file.
pub const ENV_PREFIX: &str = "TESSEL_KAFKA";

/// The root of the daemon's configuration.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// The daemon's own HTTP server (metrics, health, produce API).
    #[serde(default)]
    pub server: ServerConfig,
    /// Logging.
    #[serde(default)]
    pub log: LogConfig,
    /// OpenTelemetry trace export; absent: off.
    #[serde(default)]
    pub otlp: Option<OtlpConfig>,
    /// The produce API: tokens and limits.
    #[serde(default)]
    pub produce: ProduceConfig,
    /// Kafka connections by name (`[connections.<name>]`). Each runs one consumer in a group.
    #[serde(default)]
    pub connections: BTreeMap<String, ConnectionConfig>,
}

/// The daemon's own HTTP server.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ServerConfig {
    /// Address to listen on. Default `0.0.0.0:9464`.
    #[serde(default = "default_listen")]
    pub listen: SocketAddr,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            listen: default_listen(),
        }
    }
}

fn default_listen() -> SocketAddr {
    SocketAddr::from(([0, 0, 0, 0], 9464))
}

/// Log output.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct LogConfig {
    /// `text` (default) or `json`.
    #[serde(default)]
    pub format: LogFormat,
    /// A tracing filter such as `info` or `tessel_kafka=debug,librdkafka=info`. Default `info`;
    /// `RUST_LOG` wins when set.
    #[serde(default = "default_log_level")]
    pub level: String,
}

impl Default for LogConfig {
    fn default() -> Self {
        Self {
            format: LogFormat::default(),
            level: default_log_level(),
        }
    }
}

fn default_log_level() -> String {
    "info".to_owned()
}

/// Log line format.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

impl Config {
    /// Loads the file at `path`, applies `TESSEL_KAFKA__…` overrides and validates the result.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let env = std::env::vars().filter(|(k, _)| k.starts_with(ENV_PREFIX));
        Self::load_with_env(path, env)
    }

    /// Like [`Config::load`] with an explicit environment (for tests).
    pub fn load_with_env(
        path: &Path,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Self::from_toml_with_env(&text, env)
    }

    /// Parses TOML text, applies overrides from `env` and validates.
    pub fn from_toml_with_env(
        text: &str,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Self, ConfigError> {
        let mut doc: toml::Table =
            text.parse()
                .map_err(|e: toml::de::Error| ConfigError::Parse {
                    message: one_line(e.message()),
                    key: None,
                })?;
        for (name, value) in env {
            apply_env_override(&mut doc, &name, value)?;
        }
        let mut config: Config = serde_path_to_error::deserialize(toml::Value::Table(doc))
            .map_err(|e| {
                let path = e.path().to_string();
                ConfigError::Parse {
                    message: one_line(&e.into_inner().to_string()),
                    key: (path != ".").then_some(path),
                }
            })?;
        for (name, conn) in &mut config.connections {
            conn.normalize(name)?;
        }
        config.validate()?;
        Ok(config)
    }

    /// Cross-field rules that serde cannot express.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.connections.is_empty() {
            return Err(ConfigError::invalid(
                "connections",
                "at least one connection is required",
            ));
        }
        for (name, conn) in &self.connections {
            conn.validate(name)?;
        }
        let names: Vec<&str> = self.connections.keys().map(String::as_str).collect();
        self.produce.validate(&names)?;
        for (name, conn) in &self.connections {
            if !conn.consumes() && !self.produce.grants_connection(name) {
                return Err(ConfigError::invalid(
                    format!("connections.{name}.triggers"),
                    "a connection needs a trigger, or a [produce] token that grants it (a connection without triggers only serves the produce API)",
                ));
            }
        }
        if let Some(o) = &self.otlp {
            o.validate()?;
        }
        Ok(())
    }

    /// Topics connection `name` writes to: its [`ConnectionConfig::produced_topics`] plus
    /// every exact topic name (not a `prefix*` pattern) a produce token grants on it. The
    /// principal needs WRITE on each; `tessel-kafka check` probes them.
    pub fn produced_topics(&self, name: &str) -> std::collections::BTreeSet<String> {
        let mut topics: std::collections::BTreeSet<String> = self
            .connections
            .get(name)
            .map(|c| c.produced_topics().into_iter().map(str::to_owned).collect())
            .unwrap_or_default();
        for grant in self.produce.tokens.values() {
            if grant.connections.iter().any(|c| c == "*" || c == name) {
                topics.extend(grant.topics.iter().filter(|t| !t.ends_with('*')).cloned());
            }
        }
        topics
    }

    /// What the loader translated, as `connection: notice` lines (logged at start).
    pub fn notices(&self) -> Vec<String> {
        self.connections
            .iter()
            .flat_map(|(name, c)| {
                c.notices
                    .iter()
                    .map(move |n| format!("connection {name}: {n}"))
            })
            .collect()
    }
}

/// `TESSEL_KAFKA__A__B__C=value` sets `a.b.c`. Within a connection's `kafka` table the last
/// segment is a Kafka property, where `_` stands for `.`. Values are parsed as TOML when they
/// look like a TOML scalar or array, else taken as a string.
fn apply_env_override(doc: &mut toml::Table, name: &str, value: String) -> Result<(), ConfigError> {
    let Some(rest) = name
        .strip_prefix(ENV_PREFIX)
        .and_then(|r| r.strip_prefix("__"))
    else {
        return Ok(());
    };
    let mut segments: Vec<String> = rest.split("__").map(|s| s.to_ascii_lowercase()).collect();
    if segments.iter().any(String::is_empty) {
        return Err(ConfigError::invalid(
            name,
            "empty segment in environment override",
        ));
    }
    // connections.<name>.kafka.<property>
    if segments.len() == 4 && segments[0] == "connections" && segments[2] == "kafka" {
        segments[3] = segments[3].replace('_', ".");
    }
    // connections.<name>.producer.kafka.<property>
    if segments.len() == 5
        && segments[0] == "connections"
        && segments[2] == "producer"
        && segments[3] == "kafka"
    {
        segments[4] = segments[4].replace('_', ".");
    }
    let parsed = parse_env_value(&value);
    let (last, parents) = segments.split_last().expect("at least one segment");
    let mut table = doc;
    for seg in parents {
        let entry = table
            .entry(seg.clone())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        table = match entry {
            toml::Value::Table(t) => t,
            _ => {
                return Err(ConfigError::invalid(
                    name,
                    "overrides a value that is not a table",
                ))
            }
        };
    }
    let _ = table.insert(last.clone(), parsed);
    Ok(())
}

fn parse_env_value(value: &str) -> toml::Value {
    let trimmed = value.trim();
    if trimmed.starts_with('[') || trimmed == "true" || trimmed == "false" {
        if let Ok(mut t) = format!("v = {trimmed}").parse::<toml::Table>() {
            if let Some(v) = t.remove("v") {
                return v;
            }
        }
    }
    if let Ok(n) = trimmed.parse::<i64>() {
        return toml::Value::Integer(n);
    }
    toml::Value::String(value.to_owned())
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests;
