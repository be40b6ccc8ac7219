//! Every metric the connector exports: names, descriptions and the helpers that record them.
//! Labels are bounded: connection, trigger, topic, partition, outcome, class. Never an offset,
//! a key or an error text.

use metrics::{counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

/// Messages received from Kafka.
pub const MESSAGES_CONSUMED: &str = "tessel_kafka_messages_consumed_total";
/// Dispatch attempts by outcome.
pub const DISPATCH_ATTEMPTS: &str = "tessel_kafka_dispatch_attempts_total";
/// Messages handled (accepted or skipped) by outcome.
pub const MESSAGES_HANDLED: &str = "tessel_kafka_messages_handled_total";
/// Decode failures by class.
pub const DECODE_ERRORS: &str = "tessel_kafka_decode_errors_total";
/// Dispatch latency.
pub const DISPATCH_SECONDS: &str = "tessel_kafka_dispatch_duration_seconds";
/// Runs in flight.
pub const RUNS_IN_FLIGHT: &str = "tessel_kafka_runs_in_flight";
/// Partitions paused for backpressure.
pub const PAUSED_PARTITIONS: &str = "tessel_kafka_paused_partitions";
/// Consumer lag: last stable offset minus the group's committed offset.
pub const CONSUMER_LAG: &str = "tessel_kafka_consumer_lag_messages";
/// Message timestamp to acceptance of its run.
pub const END_TO_END_SECONDS: &str = "tessel_kafka_end_to_end_latency_seconds";
/// Keys and values decoded, by format, and failures by class (DECODE_ERRORS).
pub const DECODED: &str = "tessel_kafka_messages_decoded_total";
/// Schema registry requests that failed, by class.
pub const REGISTRY_ERRORS: &str = "tessel_kafka_registry_errors_total";
/// Records written by the idempotent producer, by result.
pub const PRODUCER_DELIVERIES: &str = "tessel_kafka_producer_deliveries_total";
/// Time from send to the broker's acknowledgement.
pub const PRODUCER_SECONDS: &str = "tessel_kafka_producer_delivery_duration_seconds";
/// Whether the connection's brokers are reachable (1) or not (0).
pub const BROKERS_UP: &str = "tessel_kafka_brokers_up";
/// Partitions with a backlog and no progress for `stall_after_ms`.
pub const STALLED_PARTITIONS: &str = "tessel_kafka_stalled_partitions";
/// Assigned partitions.
pub const ASSIGNED_PARTITIONS: &str = "tessel_kafka_assigned_partitions";
/// Rebalance events by kind.
pub const REBALANCES: &str = "tessel_kafka_rebalances_total";
/// Offset commits by result.
pub const COMMITS: &str = "tessel_kafka_offset_commits_total";
/// Schema cache lookups by result.
pub const REGISTRY_CACHE: &str = "tessel_kafka_registry_cache_lookups_total";
/// Produce API and command requests, by HTTP status.
pub const PRODUCE_REQUESTS: &str = "tessel_kafka_produce_requests_total";
/// Worker tasks that panicked on a record, by connection and trigger.
pub const WORKER_PANICS: &str = "tessel_kafka_worker_panics_total";

/// Installs the Prometheus recorder and describes every metric.
pub fn install() -> Option<PrometheusHandle> {
    let handle = PrometheusBuilder::new().install_recorder().ok()?;
    describe_counter!(MESSAGES_CONSUMED, "Messages received from Kafka.");
    describe_counter!(
        WORKER_PANICS,
        "Worker tasks that panicked while handling a record (contained; the record is retried, then on_error applies)."
    );
    describe_counter!(
        DISPATCH_ATTEMPTS,
        "Dispatch attempts to the run dispatcher, by outcome."
    );
    describe_counter!(
        MESSAGES_HANDLED,
        "Messages handled, by outcome (accepted, skipped)."
    );
    describe_counter!(
        DECODE_ERRORS,
        "Keys or values that failed to decode, by class."
    );
    describe_histogram!(DISPATCH_SECONDS, "Duration of one dispatch request.");
    describe_gauge!(RUNS_IN_FLIGHT, "Dispatches in flight.");
    describe_gauge!(
        PAUSED_PARTITIONS,
        "Partitions paused because their buffer is full."
    );
    describe_gauge!(ASSIGNED_PARTITIONS, "Partitions assigned to this consumer.");
    describe_gauge!(
        STALLED_PARTITIONS,
        "Partitions with a backlog and no progress for stall_after_ms."
    );
    describe_counter!(
        REBALANCES,
        "Rebalance events, by kind (assign, revoke, lost)."
    );
    describe_counter!(COMMITS, "Offset commits, by result.");
    describe_counter!(
        REGISTRY_CACHE,
        "Schema cache lookups, by result (hit, miss)."
    );
    describe_counter!(
        PRODUCE_REQUESTS,
        "Produce API requests, by connection and HTTP status."
    );
    Some(handle)
}

/// A schema cache lookup.
pub fn registry_cache(hit: bool) {
    counter!(REGISTRY_CACHE, "result" => if hit { "hit" } else { "miss" }).increment(1);
}

/// A message was received.
pub fn consumed(connection: &str, topic: &str) {
    counter!(MESSAGES_CONSUMED, "connection" => connection.to_owned(), "topic" => topic.to_owned())
        .increment(1);
}

/// A dispatch attempt ended.
pub fn dispatch_attempt(connection: &str, trigger: &str, outcome: &'static str, seconds: f64) {
    counter!(DISPATCH_ATTEMPTS, "connection" => connection.to_owned(), "trigger" => trigger.to_owned(), "outcome" => outcome).increment(1);
    histogram!(DISPATCH_SECONDS, "connection" => connection.to_owned(), "trigger" => trigger.to_owned()).record(seconds);
}

/// A message was handled.
pub fn handled(connection: &str, trigger: &str, outcome: &'static str) {
    counter!(MESSAGES_HANDLED, "connection" => connection.to_owned(), "trigger" => trigger.to_owned(), "outcome" => outcome).increment(1);
}

/// A decode failed.
pub fn decode_error(connection: &str, trigger: &str, class: &'static str) {
    counter!(DECODE_ERRORS, "connection" => connection.to_owned(), "trigger" => trigger.to_owned(), "class" => class).increment(1);
}

/// A worker panicked on a record.
pub fn worker_panic(connection: &str, trigger: &str) {
    counter!(WORKER_PANICS, "connection" => connection.to_owned(), "trigger" => trigger.to_owned())
        .increment(1);
}

/// Runs in flight changed.
pub fn in_flight(connection: &str, delta: f64) {
    gauge!(RUNS_IN_FLIGHT, "connection" => connection.to_owned()).increment(delta);
}

/// Partition counts of a connection.
pub fn partitions(connection: &str, assigned: usize, paused: usize) {
    gauge!(ASSIGNED_PARTITIONS, "connection" => connection.to_owned()).set(assigned as f64);
    gauge!(PAUSED_PARTITIONS, "connection" => connection.to_owned()).set(paused as f64);
}

/// A rebalance event.
pub fn rebalance(connection: &str, kind: &'static str) {
    counter!(REBALANCES, "connection" => connection.to_owned(), "kind" => kind).increment(1);
}

/// An offset commit finished.
pub fn commit(connection: &str, ok: bool) {
    counter!(COMMITS, "connection" => connection.to_owned(), "result" => if ok { "ok" } else { "error" }).increment(1);
}

/// Stalled partitions of a connection.
pub fn stalled(connection: &str, n: usize) {
    gauge!(STALLED_PARTITIONS, "connection" => connection.to_owned()).set(n as f64);
}

/// Consumer lag of one partition.
pub fn consumer_lag(connection: &str, topic: &str, partition: i32, lag: i64) {
    gauge!(CONSUMER_LAG, "connection" => connection.to_owned(), "topic" => topic.to_owned(), "partition" => partition.to_string()).set(lag as f64);
}

/// A run was accepted `seconds` after its message's timestamp.
pub fn end_to_end(connection: &str, trigger: &str, seconds: f64) {
    histogram!(END_TO_END_SECONDS, "connection" => connection.to_owned(), "trigger" => trigger.to_owned()).record(seconds);
}

/// A message decoded.
pub fn decoded(connection: &str, trigger: &str, format: &'static str) {
    counter!(DECODED, "connection" => connection.to_owned(), "trigger" => trigger.to_owned(), "format" => format).increment(1);
}

/// A registry lookup failed.
pub fn registry_error(class: &'static str) {
    counter!(REGISTRY_ERRORS, "class" => class).increment(1);
}

/// The idempotent producer finished a write.
pub fn producer_delivery(connection: &str, ok: bool, seconds: f64) {
    counter!(PRODUCER_DELIVERIES, "connection" => connection.to_owned(), "result" => if ok { "ok" } else { "error" }).increment(1);
    histogram!(PRODUCER_SECONDS, "connection" => connection.to_owned()).record(seconds);
}

/// A produce request was answered with `status`. `connection` is only a configured name.
pub fn produce_request(connection: &str, status: u16) {
    counter!(PRODUCE_REQUESTS, "connection" => connection.to_owned(), "status" => status.to_string()).increment(1);
}

/// Broker reachability of a connection.
pub fn brokers_up(connection: &str, up: bool) {
    gauge!(BROKERS_UP, "connection" => connection.to_owned()).set(if up { 1.0 } else { 0.0 });
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: &[&str] = &[
        MESSAGES_CONSUMED,
        DISPATCH_ATTEMPTS,
        MESSAGES_HANDLED,
        DECODE_ERRORS,
        DISPATCH_SECONDS,
        RUNS_IN_FLIGHT,
        PAUSED_PARTITIONS,
        STALLED_PARTITIONS,
        ASSIGNED_PARTITIONS,
        REBALANCES,
        COMMITS,
        REGISTRY_CACHE,
        CONSUMER_LAG,
        END_TO_END_SECONDS,
        DECODED,
        REGISTRY_ERRORS,
        PRODUCER_DELIVERIES,
        PRODUCER_SECONDS,
        BROKERS_UP,
        PRODUCE_REQUESTS,
        WORKER_PANICS,
    ];

    #[test]
    fn names_follow_the_conventions() {
        for name in ALL {
            assert!(name.starts_with("tessel_kafka_"), "{name}");
            let counter = name.ends_with("_total");
            let unit = ["_seconds", "_messages", "_partitions", "_flight", "_up"]
                .iter()
                .any(|u| name.ends_with(u));
            assert!(counter || unit, "{name} ends in neither _total nor a unit");
        }
    }

    #[test]
    fn dashboards_and_alerts_use_only_exported_metrics() {
        for file in [
            "deploy/prometheus/alerts.yml",
            "deploy/grafana/tessel-kafka.json",
        ] {
            let text =
                std::fs::read_to_string(format!("{}/{file}", env!("CARGO_MANIFEST_DIR"))).unwrap();
            let mut rest = text.as_str();
            while let Some(i) = rest.find("tessel_kafka_") {
                let tail = &rest[i..];
                let end = tail
                    .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                    .unwrap_or(tail.len());
                let name = &tail[..end];
                let base = ["_bucket", "_count", "_sum"]
                    .iter()
                    .fold(name, |n, s| n.strip_suffix(s).unwrap_or(n));
                assert!(
                    ALL.contains(&base),
                    "{file} uses {name}, which is not exported"
                );
                rest = &tail[end..];
            }
        }
    }
}
