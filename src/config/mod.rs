//! Configuration: TOML files plus `TESSEL_KAFKA__…` environment overrides, loaded into typed
//! structs that reject unknown keys.
//!
//! Loading order: built-in defaults, then the file, then the environment. A nested key is
//! reached with double underscores: `TESSEL_KAFKA__CONNECTIONS__ORDERS__KAFKA__SASL_PASSWORD`
//! sets `sasl.password` of connection `orders` (Kafka property names are written with dots in
//! the file; in the environment, underscores stand for the dots).
//!
//! Every field documents its default; `config/example.toml` mirrors these structs.

mod api;
mod connection;
mod dispatch;
mod error;
pub mod filter;
mod otlp;
mod produce;
mod region;
mod registry_paste;
mod secret;
pub mod security;
mod trigger;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;

use serde::{Deserialize, Serialize};

pub use api::{Access, ApiConfig, ApiGrant};
pub use connection::{CommitFallback, ConnectionConfig, RegistryConfig};
pub use dispatch::{DispatchConfig, MAX_CONNECTIONS_PER_ORIGIN};
pub use error::ConfigError;
pub use otlp::{OtlpConfig, OtlpProtocol};
pub use produce::{topic_matches, ProduceConfig, ProducerConfig, TokenGrant};
pub use region::{
    ControlConfig, PlacementConfig, RegionConfig, MAX_PLACEMENT_SLOTS, REGION_OWNED_PROPERTIES,
};
pub use secret::{
    fingerprint, is_secret_property, redact_text, redact_url, redacted_error_chain, Endpoint,
    Secret, REDACTED,
};
pub(crate) use trigger::is_secret_header;
pub use trigger::{
    is_pattern, BatchConfig, DispatcherConfig, Envelope, ErrorPolicy, ExpiredPolicy, Ordering,
    PayloadFormat, RetryConfig, TriggerConfig, MAX_BATCH_RECORDS, MAX_CONCURRENCY,
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
    /// The operator API and web console: tokens (read or act, per connection and trigger)
    /// and an optional listener of their own.
    #[serde(default)]
    pub api: ApiConfig,
    /// The connections kept to run dispatchers, shared per origin.
    #[serde(default)]
    pub dispatch: DispatchConfig,
    /// This replica and its region: placement of connections on replicas, where operators'
    /// target states live, the peers that actions are forwarded to.
    #[serde(default)]
    pub region: RegionConfig,
    /// Kafka connections by name (`[connections.<name>]`). Each runs one consumer in a group.
    #[serde(default)]
    pub connections: BTreeMap<String, ConnectionConfig>,
    /// The files secrets were read from (not a setting): watched for reloads.
    #[serde(skip)]
    secret_files: std::collections::BTreeSet<std::path::PathBuf>,
}

/// The daemon's own HTTP server.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ServerConfig {
    /// Address to listen on. Default `0.0.0.0:9464`.
    #[serde(default = "default_listen")]
    pub listen: SocketAddr,
    /// Serve `POST /-/reload` (reload the configuration file, as SIGHUP does). Off by
    /// default: whoever reaches the admin port could otherwise trigger reloads.
    #[serde(default)]
    pub reload_endpoint: bool,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            listen: default_listen(),
            reload_endpoint: false,
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
        let text = std::fs::read_to_string(path).map_err(|error| ConfigError::Read {
            path: path.display().to_string(),
            error,
        })?;
        Self::from_source(&text, Some(&path.display().to_string()), env)
    }

    /// Parses TOML text, applies overrides from `env` and validates.
    pub fn from_toml_with_env(
        text: &str,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Self, ConfigError> {
        Self::from_source(text, None, env)
    }

    /// Parses `text` (read from `file`, named in syntax errors), applies overrides from `env`
    /// and validates.
    fn from_source(
        text: &str,
        file: Option<&str>,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Self, ConfigError> {
        let mut doc: toml::Table = text.parse().map_err(|e: toml::de::Error| {
            let (line, column) = e
                .span()
                .map_or((1, 1), |span| line_and_column(text, span.start));
            ConfigError::Syntax {
                file: file.map(str::to_owned),
                line,
                column,
                message: one_line(e.message()),
            }
        })?;
        let mut overrides = Vec::new();
        for (name, value) in env {
            if let Some(o) = apply_env_override(&mut doc, &name, value)? {
                overrides.push(o);
            }
        }
        let (config, secret_files) =
            secret::recording_secret_files(|| deserialize_with_overrides(doc, overrides));
        let mut config = config?;
        config.secret_files = secret_files;
        if let Some(id) = config.region.group_instance_id() {
            for conn in config.connections.values_mut().filter(|c| c.consumes()) {
                let _ = conn
                    .kafka
                    .entry("group.instance.id".to_owned())
                    .or_insert_with(|| id.clone());
            }
        }
        for (name, conn) in &mut config.connections {
            conn.normalize(name)?;
        }
        config.validate()?;
        Ok(config)
    }

    /// The files this configuration read secrets from (`{ file = … }`, `"<property>_file"`),
    /// such as a mounted Kubernetes Secret's: the daemon reloads when one of them changes.
    pub fn secret_files(&self) -> &std::collections::BTreeSet<std::path::PathBuf> {
        &self.secret_files
    }

    /// Cross-field rules that serde cannot express.
    pub fn validate(&self) -> Result<(), ConfigError> {
        validate_log_level(&self.log.level)?;
        self.dispatch.validate()?;
        self.region.validate()?;
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
        let triggers = self
            .connections
            .iter()
            .map(|(c, conn)| {
                (
                    c.as_str(),
                    conn.triggers.keys().map(String::as_str).collect(),
                )
            })
            .collect();
        self.api.validate(&triggers, self.server.listen)?;
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

/// The 1-based line and column (in characters) of byte `offset` of `text`.
fn line_and_column(text: &str, offset: usize) -> (usize, usize) {
    let before = text.get(..offset).unwrap_or(text);
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().unwrap_or("").chars().count() + 1;
    (line, column)
}

/// The tracing levels a `log.level` directive may name.
const LOG_LEVELS: &[&str] = &["off", "error", "warn", "info", "debug", "trace"];

/// `log.level` is a tracing filter: `level` or `target=level` directives, comma-separated.
/// A bare word that is not a level would silently select a target instead, so it is refused.
fn validate_log_level(level: &str) -> Result<(), ConfigError> {
    let refuse = |reason: String| ConfigError::invalid("log.level", reason);
    if level.trim().is_empty() {
        return Err(refuse("empty; use a level such as \"info\"".to_owned()));
    }
    for directive in level.split(',').map(str::trim) {
        let named = match directive.rsplit_once('=') {
            Some((_, lvl)) => lvl,
            None if directive.contains(['[', '{']) => continue,
            None => directive,
        };
        if !LOG_LEVELS
            .iter()
            .any(|l| l.eq_ignore_ascii_case(named.trim()))
        {
            return Err(refuse(format!(
                "unknown level {named:?} in {directive:?}; use one of {} (optionally as target=level)",
                LOG_LEVELS.join(", ")
            )));
        }
    }
    tracing_subscriber::EnvFilter::builder()
        .parse(level)
        .map(drop)
        .map_err(|e| refuse(one_line(&e.to_string())))
}

/// An environment override, at its key path, inserted as a string.
struct EnvOverride {
    /// The key path as serde reports it (`connections.orders.drain_timeout_ms`).
    path: String,
    /// The table segments leading to the value.
    segments: Vec<String>,
    /// The variable's text.
    value: String,
}

/// Deserializes `doc`. Environment values go in as strings (so `007` stays `007` in a
/// `group.id` or a password); one whose field wants a number, a boolean or a list, as serde
/// reports at its path, is parsed as TOML and tried again.
fn deserialize_with_overrides(
    mut doc: toml::Table,
    mut overrides: Vec<EnvOverride>,
) -> Result<Config, ConfigError> {
    loop {
        let e = match serde_path_to_error::deserialize(toml::Value::Table(doc.clone())) {
            Ok(config) => return Ok(config),
            Err(e) => e,
        };
        let path = e.path().to_string();
        let message = one_line(&e.into_inner().to_string());
        let wants_other_type = message.starts_with("invalid type: string");
        match overrides.iter().position(|o| o.path == path) {
            Some(i) if wants_other_type => {
                let o = overrides.swap_remove(i);
                set_value(&mut doc, &o.segments, parse_env_value(&o.value));
            }
            _ => {
                return Err(ConfigError::Parse {
                    message,
                    key: (path != ".").then_some(path),
                })
            }
        }
    }
}

/// Sets the value at `segments`, which [`apply_env_override`] created.
fn set_value(doc: &mut toml::Table, segments: &[String], value: toml::Value) {
    let Some((last, parents)) = segments.split_last() else {
        return;
    };
    let mut table = doc;
    for seg in parents {
        match table.get_mut(seg) {
            Some(toml::Value::Table(t)) => table = t,
            _ => return,
        }
    }
    let _ = table.insert(last.clone(), value);
}

/// `TESSEL_KAFKA__A__B__C=value` sets `a.b.c`. Within a connection's `kafka` table the last
/// segment is a Kafka property, where `_` stands for `.`. The value is inserted as a string;
/// [`deserialize_with_overrides`] parses it when its field is a number, boolean or list.
fn apply_env_override(
    doc: &mut toml::Table,
    name: &str,
    value: String,
) -> Result<Option<EnvOverride>, ConfigError> {
    let Some(rest) = name
        .strip_prefix(ENV_PREFIX)
        .and_then(|r| r.strip_prefix("__"))
    else {
        return Ok(None);
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
    // region.kafka.<property>
    if segments.len() == 3 && segments[0] == "region" && segments[1] == "kafka" {
        segments[2] = segments[2].replace('_', ".");
    }
    // connections.<name>.producer.kafka.<property>
    if segments.len() == 5
        && segments[0] == "connections"
        && segments[2] == "producer"
        && segments[3] == "kafka"
    {
        segments[4] = segments[4].replace('_', ".");
    }
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
    let _ = table.insert(last.clone(), toml::Value::String(value.clone()));
    Ok(Some(EnvOverride {
        path: segments.join("."),
        segments,
        value,
    }))
}

/// An environment value for a field that is not a string: a TOML number, boolean or array
/// (`30000`, `true`, `["a", "b"]`); anything else stays a string, and the field's type error
/// names the variable's key.
fn parse_env_value(value: &str) -> toml::Value {
    let trimmed = value.trim();
    format!("v = {trimmed}")
        .parse::<toml::Table>()
        .ok()
        .and_then(|mut t| t.remove("v"))
        .unwrap_or_else(|| toml::Value::String(value.to_owned()))
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod loading_tests;
#[cfg(test)]
mod tests;
