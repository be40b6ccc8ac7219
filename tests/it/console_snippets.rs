//! Each provider's client snippet, pasted whole into a connection's `kafka` table (registry
//! lines included), passes `tessel-kafka config check`: the registry lines land in
//! `[schema_registry]`, every translation is a `# note:` line, and no credential is printed.
//! Hosts are placeholders and credentials fake; nothing connects.

use std::process::Command;

use crate::config_builder::TestConfig;
use crate::support::{binary, temp_config};

/// What `config check` printed: success, the notes, the effective configuration (parsed),
/// and everything it wrote.
struct Checked {
    ok: bool,
    notes: Vec<String>,
    effective: toml::Table,
    output: String,
}

fn config_check(config: &TestConfig) -> Checked {
    let path = temp_config(&config.toml());
    let out = Command::new(binary())
        .args(["config", "check", "--config"])
        .arg(&path)
        .output()
        .expect("run config check");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let output = format!("{stdout}{}", String::from_utf8_lossy(&out.stderr));
    let notes = stdout
        .lines()
        .filter_map(|l| l.strip_prefix("# note: connection it: "))
        .map(str::to_owned)
        .collect();
    let effective = if out.status.success() {
        stdout
            .parse()
            .unwrap_or_else(|e| panic!("effective config is not TOML ({e}): {stdout}"))
    } else {
        toml::Table::new()
    };
    Checked {
        ok: out.status.success(),
        notes,
        effective,
        output,
    }
}

fn base() -> TestConfig {
    TestConfig::new(
        "placeholder.example.invalid:9092",
        "tessel-orders",
        "payments",
        "https://api.tessel.example.invalid/v1/runs",
    )
}

impl Checked {
    fn connection(&self) -> &toml::Table {
        self.effective["connections"]["it"]
            .as_table()
            .expect("connection it")
    }

    fn registry(&self, field: &str) -> Option<&str> {
        self.connection()
            .get("schema_registry")?
            .get(field)?
            .as_str()
    }

    fn kafka(&self) -> &toml::Table {
        self.connection()["kafka"].as_table().expect("kafka table")
    }

    /// Passes, moved every registry line out of the `kafka` table, noted `expected`, and
    /// printed none of `secrets`.
    fn assert_pasted(&self, expected_notes: &[&str], secrets: &[&str]) {
        assert!(self.ok, "config check refused the snippet: {}", self.output);
        for note in expected_notes {
            assert!(
                self.notes.iter().any(|n| n == note),
                "no note {note:?} in {:?}",
                self.notes
            );
        }
        for key in self.kafka().keys() {
            assert!(
                !key.contains("schema.registry")
                    && !key.starts_with("basic.auth")
                    && !key.starts_with("bearer.auth"),
                "{key} left in the kafka table: {}",
                self.output
            );
        }
        for secret in secrets {
            assert!(
                !self.output.contains(secret),
                "{secret} printed: {}",
                self.output
            );
        }
    }
}

/// Confluent Cloud: "Clients" > "Java", with the Schema Registry section ticked.
#[test]
fn confluent_cloud_snippet_pastes_whole_with_its_registry_lines() {
    let snippet = r#"
# Required connection configs for Kafka producer, consumer, and admin
bootstrap.servers=pkc-00000.us-east-1.aws.example.invalid:9092
security.protocol=SASL_SSL
sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required username='CCKEY00000000000' password='cc-cluster-fake-secret';
sasl.mechanism=PLAIN
# Required for correctness in Apache Kafka clients prior to 2.6
client.dns.lookup=use_all_dns_ips

# Best practice for higher availability in Apache Kafka clients prior to 3.0
session.timeout.ms=45000

# Best practice for Kafka producer to prevent data loss
acks=all

# Required connection configs for Confluent Cloud Schema Registry
schema.registry.url=https://psrc-00000.us-east-2.aws.example.invalid
basic.auth.credentials.source=USER_INFO
basic.auth.user.info=SRKEY00000000000:cc-registry-fake-secret
"#;
    let checked = config_check(&base().paste_properties(snippet));
    checked.assert_pasted(
        &[
            "kafka.\"schema.registry.url\" → schema_registry.url",
            "kafka.\"basic.auth.user.info\" → schema_registry.username, schema_registry.password",
            "translated \"sasl.jaas.config\" (PlainLoginModule) to librdkafka's \"sasl.username\" and \"sasl.password\"",
        ],
        &["cc-cluster-fake-secret", "cc-registry-fake-secret"],
    );
    assert_eq!(
        checked.registry("url"),
        Some("https://psrc-00000.us-east-2.aws.example.invalid/")
    );
    assert_eq!(checked.registry("username"), Some("SRKEY00000000000"));
    assert_eq!(checked.registry("password"), Some("***redacted***"));
    assert_eq!(
        checked.kafka()["sasl.username"].as_str(),
        Some("CCKEY00000000000")
    );
    assert_eq!(
        checked.kafka()["bootstrap.servers"].as_str(),
        Some("pkc-00000.us-east-1.aws.example.invalid:9092")
    );
}

/// Aiven for Apache Kafka: the Java client-certificate properties (PKCS#12 keystore, the
/// project CA as a PEM truststore) and the Karapace registry's.
#[test]
fn aiven_snippet_pastes_whole_with_its_registry_lines() {
    let snippet = r#"
bootstrap.servers=kafka-orders-myproject.example.invalid:12345
security.protocol=SSL
ssl.truststore.type=PEM
ssl.truststore.location=/etc/tessel-kafka/aiven/ca.pem
ssl.keystore.type=PKCS12
ssl.keystore.location=/etc/tessel-kafka/aiven/client.keystore.p12
ssl.keystore.password=aiven-keystore-fake-secret
ssl.key.password=aiven-key-fake-secret
schema.registry.url=https://kafka-orders-myproject.example.invalid:12346
basic.auth.credentials.source=USER_INFO
basic.auth.user.info=avnadmin:aiven-registry-fake-secret
schema.registry.ssl.truststore.type=PEM
schema.registry.ssl.truststore.location=/etc/tessel-kafka/aiven/ca.pem
"#;
    let checked = config_check(&base().paste_properties(snippet));
    checked.assert_pasted(
        &[
            "kafka.\"schema.registry.url\" → schema_registry.url",
            "kafka.\"basic.auth.user.info\" → schema_registry.username, schema_registry.password",
            "kafka.\"schema.registry.ssl.truststore.location\" → schema_registry.ca_location",
            "translated \"ssl.truststore.location\" (PEM) to librdkafka's \"ssl.ca.location\"",
        ],
        &[
            "aiven-keystore-fake-secret",
            "aiven-key-fake-secret",
            "aiven-registry-fake-secret",
        ],
    );
    assert_eq!(checked.registry("username"), Some("avnadmin"));
    assert_eq!(checked.registry("password"), Some("***redacted***"));
    assert_eq!(
        checked.registry("ca_location"),
        Some("/etc/tessel-kafka/aiven/ca.pem")
    );
    assert_eq!(
        checked.kafka()["ssl.ca.location"].as_str(),
        Some("/etc/tessel-kafka/aiven/ca.pem")
    );
}

/// Redpanda Cloud: the Kafka API's SCRAM properties and the Schema Registry's basic auth.
#[test]
fn redpanda_cloud_snippet_pastes_whole_with_its_registry_lines() {
    let snippet = r#"
bootstrap.servers=seed-0a1b2c3d.example.invalid:9092
security.protocol=SASL_SSL
sasl.mechanism=SCRAM-SHA-256
sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required username="tessel" password="redpanda-kafka-fake-secret";
schema.registry.url=https://schema-registry-0a1b2c3d.example.invalid:30081
basic.auth.credentials.source=USER_INFO
basic.auth.user.info=tessel:redpanda-registry-fake-secret
"#;
    let checked = config_check(&base().paste_properties(snippet));
    checked.assert_pasted(
        &[
            "kafka.\"schema.registry.url\" → schema_registry.url",
            "kafka.\"basic.auth.user.info\" → schema_registry.username, schema_registry.password",
            "translated \"sasl.jaas.config\" (ScramLoginModule) to librdkafka's \"sasl.username\" and \"sasl.password\"",
        ],
        &["redpanda-kafka-fake-secret", "redpanda-registry-fake-secret"],
    );
    assert_eq!(
        checked.registry("url"),
        Some("https://schema-registry-0a1b2c3d.example.invalid:30081/")
    );
    assert_eq!(checked.registry("username"), Some("tessel"));
    assert_eq!(
        checked.kafka()["sasl.mechanism"].as_str(),
        Some("SCRAM-SHA-256")
    );
}

/// Amazon MSK with IAM: the console's client.properties for Java, with the lines of a
/// Confluent-compatible registry beside the cluster that takes a static bearer token.
#[test]
fn msk_iam_snippet_pastes_whole_with_its_registry_lines() {
    let snippet = r#"
bootstrap.servers=b-1.orders.abc123.c2.kafka.eu-west-1.amazonaws.com:9098
security.protocol=SASL_SSL
sasl.mechanism=AWS_MSK_IAM
sasl.jaas.config=software.amazon.msk.auth.iam.IAMLoginModule required;
sasl.client.callback.handler.class=software.amazon.msk.auth.iam.IAMClientCallbackHandler
schema.registry.url=https://registry.example.invalid/apis/ccompat/v7
bearer.auth.credentials.source=STATIC_TOKEN
bearer.auth.token=msk-registry-fake-token
schema.registry.ssl.ca.location=/etc/tessel-kafka/registry-ca.pem
"#;
    let checked = config_check(&base().paste_properties(snippet));
    checked.assert_pasted(
        &[
            "kafka.\"schema.registry.url\" → schema_registry.url",
            "kafka.\"bearer.auth.token\" → schema_registry.bearer_token",
            "kafka.\"schema.registry.ssl.ca.location\" → schema_registry.ca_location",
            "dropped \"sasl.jaas.config\" (IAMLoginModule): AWS_MSK_IAM tokens are signed by the connector",
        ],
        &["msk-registry-fake-token"],
    );
    assert_eq!(
        checked.registry("url"),
        Some("https://registry.example.invalid/apis/ccompat/v7")
    );
    assert_eq!(checked.registry("bearer_token"), Some("***redacted***"));
    assert_eq!(
        checked.kafka()["sasl.mechanism"].as_str(),
        Some("OAUTHBEARER")
    );
}

/// A pasted registry line that contradicts `[schema_registry]` is refused with one line
/// naming both keys, and the pasted credential is not in it.
#[test]
fn a_pasted_registry_line_that_contradicts_the_registry_table_is_refused_naming_both() {
    let pasted = base().paste_properties(
        "schema.registry.url=https://psrc-00000.example.invalid\n\
         basic.auth.user.info=SRKEY:pasted-fake-secret\n",
    );
    let checked = config_check(
        &pasted
            .clone()
            .registry("url", "\"https://other-registry.example.invalid\""),
    );
    assert!(!checked.ok, "accepted: {}", checked.output);
    let lines: Vec<&str> = checked
        .output
        .lines()
        .filter(|l| !l.trim().is_empty())
        .collect();
    assert_eq!(lines.len(), 1, "{}", checked.output);
    assert!(
        lines[0].contains("connections.it.kafka.\"schema.registry.url\"")
            && lines[0].contains("connections.it.schema_registry.url"),
        "{}",
        lines[0]
    );
    let checked = config_check(
        &pasted
            .clone()
            .registry("url", "\"https://psrc-00000.example.invalid\"")
            .registry("password", "\"table-fake-secret\""),
    );
    assert!(!checked.ok, "accepted: {}", checked.output);
    assert!(
        checked
            .output
            .contains("connections.it.kafka.\"basic.auth.user.info\"")
            && checked
                .output
                .contains("connections.it.schema_registry.password"),
        "{}",
        checked.output
    );
    assert!(
        !checked.output.contains("fake-secret"),
        "{}",
        checked.output
    );
    // Agreeing values are no conflict.
    let checked = config_check(
        &pasted
            .registry("url", "\"https://psrc-00000.example.invalid\"")
            .registry("username", "\"SRKEY\""),
    );
    checked.assert_pasted(
        &["kafka.\"schema.registry.url\" → schema_registry.url"],
        &["pasted-fake-secret"],
    );
}
