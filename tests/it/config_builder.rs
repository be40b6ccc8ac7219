//! One builder for the connector configs tests need, instead of hand-written TOML and
//! `.replace(…)` patches: a connection `it` with one trigger `main`.

use std::collections::BTreeMap;

/// A test connection config. Values are TOML literals (`"\"text\""`, `"5"`, `"true"`).
#[derive(Clone, Debug)]
pub struct TestConfig {
    bootstrap: String,
    group: String,
    topics: Vec<String>,
    dispatcher_url: String,
    dispatcher_timeout_ms: u64,
    server_listen: Option<String>,
    kafka: BTreeMap<String, String>,
    registry: BTreeMap<String, String>,
    connection: BTreeMap<String, String>,
    trigger: BTreeMap<String, String>,
    retry: BTreeMap<String, String>,
}

impl TestConfig {
    /// A connection on `bootstrap` in `group`, one trigger on `topic` posting to `dispatcher_url`,
    /// reading from the earliest offset, with short drain and backoff times.
    pub fn new(bootstrap: &str, group: &str, topic: &str, dispatcher_url: &str) -> Self {
        let mut c = Self {
            bootstrap: bootstrap.to_owned(),
            group: group.to_owned(),
            topics: vec![topic.to_owned()],
            dispatcher_url: dispatcher_url.to_owned(),
            dispatcher_timeout_ms: 5000,
            server_listen: None,
            kafka: BTreeMap::new(),
            registry: BTreeMap::new(),
            connection: BTreeMap::new(),
            trigger: BTreeMap::new(),
            retry: BTreeMap::new(),
        };
        c = c
            .kafka("auto.offset.reset", "earliest")
            .connection("drain_timeout_ms", "10000")
            .retry("initial_backoff_ms", "50")
            .retry("max_backoff_ms", "500");
        c
    }

    /// Sets a librdkafka property of the connection.
    pub fn kafka(mut self, key: &str, value: &str) -> Self {
        let _ = self.kafka.insert(key.to_owned(), value.to_owned());
        self
    }

    /// Pastes a Java client properties file as a provider's console hands it out: each
    /// `key=value` line (split at the first `=`, no escapes; `#` comments and blank lines
    /// skipped) becomes a property of the connection's `kafka` table, and the file's
    /// `bootstrap.servers` replaces the builder's.
    pub fn paste_properties(mut self, text: &str) -> Self {
        for line in text.lines().map(str::trim) {
            if line.is_empty() || line.starts_with('#') || line.starts_with('!') {
                continue;
            }
            let (key, value) = line.split_once('=').unwrap_or((line, ""));
            let (key, value) = (key.trim(), value.trim());
            if key == "bootstrap.servers" {
                self.bootstrap = value.to_owned();
            } else {
                self = self.kafka(key, value);
            }
        }
        self
    }

    /// Sets a `[connections.it.schema_registry]` key (a TOML literal); the table is written
    /// only when some key is set.
    pub fn registry(mut self, key: &str, toml_value: &str) -> Self {
        let _ = self.registry.insert(key.to_owned(), toml_value.to_owned());
        self
    }

    /// Sets a `[connections.it]` key (a TOML literal).
    pub fn connection(mut self, key: &str, toml_value: &str) -> Self {
        let _ = self
            .connection
            .insert(key.to_owned(), toml_value.to_owned());
        self
    }

    /// Sets a `[connections.it.triggers.main]` key (a TOML literal).
    pub fn trigger(mut self, key: &str, toml_value: &str) -> Self {
        let _ = self.trigger.insert(key.to_owned(), toml_value.to_owned());
        self
    }

    /// Sets a `retry` key of the trigger (a TOML literal).
    pub fn retry(mut self, key: &str, toml_value: &str) -> Self {
        let _ = self.retry.insert(key.to_owned(), toml_value.to_owned());
        self
    }

    /// The trigger's dispatch request timeout (default 5000 ms).
    pub fn dispatcher_timeout_ms(mut self, ms: u64) -> Self {
        self.dispatcher_timeout_ms = ms;
        self
    }

    /// Serves metrics, health and the produce API on `listen`.
    pub fn server(mut self, listen: &str) -> Self {
        self.server_listen = Some(listen.to_owned());
        self
    }

    /// The TOML text.
    pub fn toml(&self) -> String {
        let q = |s: &str| serde_json::to_string(s).expect("string");
        let mut out = String::new();
        if let Some(listen) = &self.server_listen {
            out.push_str(&format!("[server]\nlisten = {}\n", q(listen)));
        }
        out.push_str("[connections.it]\n");
        for (k, v) in &self.connection {
            out.push_str(&format!("{k} = {v}\n"));
        }
        out.push_str("[connections.it.kafka]\n");
        out.push_str(&format!("\"bootstrap.servers\" = {}\n", q(&self.bootstrap)));
        out.push_str(&format!("\"group.id\" = {}\n", q(&self.group)));
        for (k, v) in &self.kafka {
            out.push_str(&format!("{} = {}\n", q(k), q(v)));
        }
        if !self.registry.is_empty() {
            out.push_str("[connections.it.schema_registry]\n");
            for (k, v) in &self.registry {
                out.push_str(&format!("{k} = {v}\n"));
            }
        }
        out.push_str("[connections.it.triggers.main]\n");
        let topics: Vec<String> = self.topics.iter().map(|t| q(t)).collect();
        out.push_str(&format!("topics = [{}]\n", topics.join(", ")));
        out.push_str(&format!(
            "workflow = {}\n",
            q(&format!("wf-{}", self.topics[0]))
        ));
        out.push_str(&format!(
            "dispatcher = {{ url = {}, timeout_ms = {} }}\n",
            q(&self.dispatcher_url),
            self.dispatcher_timeout_ms
        ));
        let retry: Vec<String> = self
            .retry
            .iter()
            .map(|(k, v)| format!("{k} = {v}"))
            .collect();
        out.push_str(&format!("retry = {{ {} }}\n", retry.join(", ")));
        for (k, v) in &self.trigger {
            out.push_str(&format!("{k} = {v}\n"));
        }
        out
    }
}

#[test]
fn the_builder_writes_a_config_the_connector_loads() {
    let text = TestConfig::new("127.0.0.1:9092", "g", "t", "http://127.0.0.1:1/runs")
        .kafka("session.timeout.ms", "6000")
        .connection("max_buffered_per_partition", "5")
        .trigger("concurrency", "4")
        .retry("max_attempts", "3")
        .toml();
    let c = tessel_kafka::config::Config::from_toml_with_env(&text, Vec::new())
        .unwrap_or_else(|e| panic!("{e}\n{text}"));
    let conn = &c.connections["it"];
    assert_eq!(conn.max_buffered_per_partition, 5);
    assert_eq!(conn.triggers["main"].concurrency, 4);
    assert_eq!(conn.triggers["main"].retry.max_attempts, 3);
    assert_eq!(conn.kafka["session.timeout.ms"], "6000");
}
