//! What every Kafka client of a connection shares: its security (TLS, SASL, OAUTHBEARER and
//! MSK IAM tokens, the classification of connection failures) and AWS credentials. Used by
//! the consumer, the producers and the operator tools.

mod aws_credentials;
pub mod probe;
pub mod security;

use rdkafka::config::ClientConfig;

use crate::config::ConnectionConfig;

/// Consumer-only properties that a producer built from a connection leaves out.
const CONSUMER_ONLY: &[&str] = &[
    "group.id",
    "group.instance.id",
    "group.protocol",
    "group.remote.assignor",
    "auto.offset.reset",
    "isolation.level",
    "enable.auto.commit",
    "enable.auto.offset.store",
    "auto.commit.interval.ms",
    "partition.assignment.strategy",
    "session.timeout.ms",
    "heartbeat.interval.ms",
    "max.poll.interval.ms",
    "queued.max.messages.kbytes",
    "queued.min.messages",
    "fetch.max.bytes",
    "fetch.min.bytes",
    "fetch.wait.max.ms",
    "max.partition.fetch.bytes",
    "enable.partition.eof",
    "check.crcs",
];

/// The producer configuration of a connection: its cluster and security settings plus
/// `[connections.<name>.producer] kafka`, with idempotence and full acknowledgement forced on.
/// Topics are never created by producing (`allow.auto.create.topics=false`).
pub fn producer_config(name: &str, conn: &ConnectionConfig) -> ClientConfig {
    let mut cfg = ClientConfig::new();
    for (k, v) in &conn.kafka {
        if !CONSUMER_ONLY.contains(&k.as_str()) {
            let _ = cfg.set(k, v);
        }
    }
    if !conn.kafka.contains_key("client.id") {
        let _ = cfg.set("client.id", format!("tessel-kafka-{name}-producer"));
    }
    let _ = cfg
        .set("partitioner", "murmur2_random")
        .set("allow.auto.create.topics", "false");
    for (k, v) in &conn.producer.kafka {
        let _ = cfg.set(k, v);
    }
    let _ = cfg
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set(
            "message.timeout.ms",
            conn.producer.ack_timeout_ms.to_string(),
        );
    cfg
}
