//! Every metric the connector exports: names, descriptions, histogram buckets and the helpers
//! that record them. Labels are bounded: connection, trigger, topic, partition, outcome, class.
//! Never an offset, a key or an error text.
//!
//! Histograms are exported as Prometheus histograms (`_bucket`, `_sum`, `_count`), not
//! summaries: only buckets can be aggregated across replicas with `histogram_quantile`.
//! Consumer lag (in messages and in seconds) is kept here rather than in the recorder, because
//! its series have to disappear when a partition is revoked and the recorder cannot remove a
//! series. A partition between owners (a rebalance, a replica that died) has no series for a
//! while: the shipped queries bridge that gap with `last_over_time(...[2m])`, deduplicated by
//! `max by (..., partition)` (see deploy/prometheus/alerts.yml).
//!
//! The counters alerts look for by increase (records that started no run, worker panics,
//! commit errors) and the runs-in-flight gauges are registered at 0 when a connection starts
//! ([`register_connection`]): Prometheus sees no increase in a counter whose first sample is
//! already 1, so a series born with the first skip would never fire its alert.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;

use metrics::{counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram};
pub use metrics::{Counter, Gauge, Histogram};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

/// Messages received from Kafka.
pub const MESSAGES_CONSUMED: &str = "tessel_kafka_messages_consumed_total";
/// Dispatch attempts by outcome.
pub const DISPATCH_ATTEMPTS: &str = "tessel_kafka_dispatch_attempts_total";
/// Messages handled by outcome (accepted, skipped, dead_lettered, filtered, filter_error,
/// expired, expired_dead_lettered).
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
/// Consumer lag in time: age of the oldest record received and not yet handled.
pub const CONSUMER_LAG_SECONDS: &str = "tessel_kafka_consumer_lag_seconds";
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

/// Positions that moved back (an offset reset, a truncated log) and topics created again
/// under the same name, by connection, topic and reason.
pub const POSITION_RESETS: &str = "tessel_kafka_position_resets_total";
/// Panics in a connection's own tasks (poll, ops, supervisor), each followed by a restart of
/// the connection, by connection.
pub const CONNECTION_PANICS: &str = "tessel_kafka_connection_panics_total";
/// Keys parked: a run waiting to try its record again, by connection and trigger.
pub const PARKED_KEYS: &str = "tessel_kafka_parked_keys";
/// Operators' actions (pause, resume, retry, skip, redrive), by action and result.
pub const OPERATOR_ACTIONS: &str = "tessel_kafka_operator_actions_total";

/// Whether a connection runs (1) or waits to start again after a failure (0).
pub const CONNECTION_UP: &str = "tessel_kafka_connection_up";
/// Connections that could not start or stopped with an error, by connection.
pub const CONNECTION_FAILURES: &str = "tessel_kafka_connection_failures_total";
/// Configuration reloads, by result.
pub const CONFIG_RELOADS: &str = "tessel_kafka_config_reloads_total";
/// Whether the last configuration reload succeeded (1) or was refused (0).
pub const CONFIG_LAST_RELOAD_SUCCESSFUL: &str = "tessel_kafka_config_last_reload_successful";

/// Connections this replica runs (placed here by the region, or all of them without one).
pub const REGION_CONNECTIONS_PLACED: &str = "tessel_kafka_region_connections_placed";
/// librdkafka clients in this process (consumers, producers, the region's own).
pub const REGION_CLIENTS: &str = "tessel_kafka_region_clients";
/// The region group's generation as this replica knows it.
pub const REGION_GENERATION: &str = "tessel_kafka_region_generation";
/// This replica's share of the region's load: the consumer lag in seconds of each connection
/// it runs (its partitions' largest), summed.
pub const REGION_LOAD: &str = "tessel_kafka_region_load";
/// Open file descriptors of the process.
pub const OPEN_FDS: &str = "tessel_kafka_open_fds";
/// The process's soft limit on open file descriptors.
pub const OPEN_FDS_LIMIT: &str = "tessel_kafka_open_fds_limit";
/// Attempts that failed because the process ran out of file descriptors.
pub const FDS_EXHAUSTED: &str = "tessel_kafka_fds_exhausted_total";

/// Always 1, with the version and the librdkafka version as labels.
pub const BUILD_INFO: &str = "tessel_kafka_build_info";

/// What kind of metric a name is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Only goes up.
    Counter,
    /// Goes up and down.
    Gauge,
    /// Observations in buckets.
    Histogram,
}

/// Every metric with its kind and HELP text: the inventory dashboards and alerts are checked
/// against.
pub const INVENTORY: &[(&str, Kind, &str)] = &[
    (MESSAGES_CONSUMED, Kind::Counter, "Messages received from Kafka, by connection and topic."),
    (DISPATCH_ATTEMPTS, Kind::Counter, "Requests to the run dispatcher, by trigger and outcome (accepted, retryable, rejected, ...)."),
    (MESSAGES_HANDLED, Kind::Counter, "Messages finished, by trigger and outcome (accepted, skipped, dead_lettered; filtered and filter_error for records a filter refused or could not be evaluated on; expired and expired_dead_lettered for records past max_record_age_ms)."),
    (DECODE_ERRORS, Kind::Counter, "Keys or values that failed to decode, by trigger and class."),
    (DISPATCH_SECONDS, Kind::Histogram, "Duration of one request to the run dispatcher, in seconds."),
    (RUNS_IN_FLIGHT, Kind::Gauge, "Records whose run is being dispatched (in flight), by connection and trigger (a trigger's concurrency caps its own)."),
    (PAUSED_PARTITIONS, Kind::Gauge, "Partitions paused because their buffer is full, by connection."),
    (CONSUMER_LAG, Kind::Gauge, "Messages not yet accepted: the partition's last stable offset minus the group's committed offset (or, before the first commit, minus where the consumer started). Present while the partition is assigned to this replica."),
    (CONSUMER_LAG_SECONDS, Kind::Gauge, "Age in seconds, by its Kafka timestamp, of the partition's oldest record received and not yet handled (0 when none waits). Present while the partition is assigned to this replica."),
    (END_TO_END_SECONDS, Kind::Histogram, "Time from a message's timestamp to the acceptance of its run, in seconds."),
    (DECODED, Kind::Counter, "Keys and values decoded, by trigger and format."),
    (REGISTRY_ERRORS, Kind::Counter, "Schema registry lookups that failed, by connection and class."),
    (PRODUCER_DELIVERIES, Kind::Counter, "Records written by the idempotent producer, by connection and result."),
    (PRODUCER_SECONDS, Kind::Histogram, "Time from sending a record to the broker's acknowledgement, in seconds."),
    (BROKERS_UP, Kind::Gauge, "Whether the connection reaches at least one Kafka broker (1) or none (0)."),
    (STALLED_PARTITIONS, Kind::Gauge, "Partitions with a backlog and no progress for stall_after_ms, by connection."),
    (ASSIGNED_PARTITIONS, Kind::Gauge, "Partitions assigned to this replica, by connection."),
    (REBALANCES, Kind::Counter, "Rebalance events, by connection and kind (assign, revoke, lost)."),
    (COMMITS, Kind::Counter, "Offset commits, by connection and result (ok, error)."),
    (REGISTRY_CACHE, Kind::Counter, "Schema cache lookups, by connection and result (hit, miss)."),
    (PRODUCE_REQUESTS, Kind::Counter, "Produce API requests, by connection and HTTP status."),
    (BUILD_INFO, Kind::Gauge, "Always 1; the labels say which build is running."),
    (CONNECTION_UP, Kind::Gauge, "Whether the connection runs (1) or waits to start again after a failure (0), by connection; only for connections that run on this replica (all of them without [region.kafka])."),
    (CONNECTION_FAILURES, Kind::Counter, "Connections that could not start (clients, consumer) or stopped with an error, by connection; each is retried with backoff while the others run."),
    (CONFIG_RELOADS, Kind::Counter, "Configuration reloads, by result (ok, invalid: refused, the running configuration kept)."),
    (POSITION_RESETS, Kind::Counter, "A partition's position moved back within an assignment (reason moved_back: an offset reset after an out-of-range fetch, a truncated log; its records from there run again) or its topic was deleted and created again under the same name (reason topic_recreated: read from auto.offset.reset; also when the group's commit, assigned, names an older topic's id), by connection and topic."),
    (CONNECTION_PANICS, Kind::Counter, "Panics in a connection's own tasks (polling, commits, its supervisor), by connection; each restarts the connection with backoff."),
    (CONFIG_LAST_RELOAD_SUCCESSFUL, Kind::Gauge, "Whether the last configuration reload succeeded (1, also before the first reload) or was refused (0: the files as they are now do not load; the running configuration is kept, and a restart would fail on them)."),
    (WORKER_PANICS, Kind::Counter, "Worker tasks that panicked while handling a record, by trigger (contained; the record is retried, then on_error applies)."),
    (PARKED_KEYS, Kind::Gauge, "Keys parked on this replica, by connection and trigger: a run waiting to try its record again after a failed attempt (its key's later records wait behind it). GET /api/v1/status names each."),
    (OPERATOR_ACTIONS, Kind::Counter, "Operators' actions through the API, console or ctl, by connection, trigger, action (pause, resume, retry, skip, redrive) and result (ok, refused, failed). Refused: no grant, a bad request or nothing to act on."),
    (REGION_CONNECTIONS_PLACED, Kind::Gauge, "Connections this replica runs: those the region placed here, or every configured one without [region.kafka]."),
    (REGION_CLIENTS, Kind::Gauge, "librdkafka clients in this process: consumers and producers of the connections it runs, and the region's own consumer."),
    (REGION_GENERATION, Kind::Gauge, "The region group's generation as this replica last saw it (0 before it joined, and without [region.kafka])."),
    (REGION_LOAD, Kind::Gauge, "This replica's share of the region's load: over the connections it runs, the consumer lag in seconds of each (its oldest record waiting), summed. sum() over the replicas is the region's load, what autoscaling follows."),
    (OPEN_FDS, Kind::Gauge, "Open file descriptors of the process (sockets, librdkafka's wake-up descriptors, files)."),
    (OPEN_FDS_LIMIT, Kind::Gauge, "The process's soft limit on open file descriptors (raised to the hard limit at start)."),
    (FDS_EXHAUSTED, Kind::Counter, "Dispatcher connections that could not be opened because the process ran out of file descriptors (EMFILE, ENFILE)."),
];

/// Buckets of the dispatch latency, in seconds: a dispatcher answers in milliseconds to a few
/// hundred; the top buckets reach the default 30 s request timeout.
pub const DISPATCH_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// Buckets of the end-to-end latency, in seconds: sub-second when the connector keeps up, up
/// to an hour while a backlog drains or a run waits behind retries.
pub const END_TO_END_BUCKETS: &[f64] = &[
    0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0,
];

/// Buckets of the producer's delivery time, in seconds (acks=all within a region).
pub const PRODUCER_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
];

/// The recorder's configuration: histogram buckets per metric.
fn builder() -> PrometheusBuilder {
    [
        (DISPATCH_SECONDS, DISPATCH_BUCKETS),
        (END_TO_END_SECONDS, END_TO_END_BUCKETS),
        (PRODUCER_SECONDS, PRODUCER_BUCKETS),
    ]
    .into_iter()
    .fold(PrometheusBuilder::new(), |b, (name, buckets)| {
        b.set_buckets_for_metric(Matcher::Full(name.to_owned()), buckets)
            .expect("bucket lists are not empty")
    })
}

/// Describes every metric to the current recorder and sets `build_info`.
fn describe() {
    for (name, kind, help) in INVENTORY {
        match kind {
            Kind::Counter => describe_counter!(*name, *help),
            Kind::Gauge => describe_gauge!(*name, *help),
            Kind::Histogram => describe_histogram!(*name, *help),
        }
    }
    let (_, librdkafka) = rdkafka::util::get_rdkafka_version();
    gauge!(BUILD_INFO, "version" => env!("CARGO_PKG_VERSION"), "librdkafka" => librdkafka).set(1.0);
}

/// Installs the Prometheus recorder and describes every metric. None when a recorder is
/// already installed (a second daemon in one process, in tests).
pub fn install() -> Option<PrometheusHandle> {
    let handle = builder().install_recorder().ok()?;
    describe();
    Some(handle)
}

/// Drains recorded histogram samples into their buckets every few seconds until `shutdown`,
/// so memory stays flat when nothing scrapes.
pub async fn run_upkeep(handle: PrometheusHandle, shutdown: tokio_util::sync::CancellationToken) {
    let mut tick = tokio::time::interval(std::time::Duration::from_secs(5));
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => handle.run_upkeep(),
        }
    }
}

/// The `/metrics` text: the recorder's metrics, consumer lag, then what is read when scraped:
/// the region load, the clients and the process's descriptors.
pub fn render(handle: &PrometheusHandle) -> String {
    let mut text = handle.render();
    render_partition_gauge(&mut text, CONSUMER_LAG, &lag_series());
    let lag_seconds = lag_seconds_series();
    render_partition_gauge(&mut text, CONSUMER_LAG_SECONDS, &lag_seconds);
    let load = region_load(&lag_seconds);
    drop(lag_seconds);
    render_connection_gauge(&mut text, CONNECTION_UP, &connections_up());
    render_gauge(&mut text, REGION_LOAD, Some(load));
    render_gauge(&mut text, REGION_CLIENTS, Some(live_clients() as f64));
    render_gauge(
        &mut text,
        OPEN_FDS,
        crate::limits::open_fds().map(|n| n as f64),
    );
    render_gauge(
        &mut text,
        OPEN_FDS_LIMIT,
        crate::limits::open_files_limit().map(|n| n as f64),
    );
    text
}

/// The region load of this replica from the lag in seconds of its partitions: per connection
/// the age of its oldest record waiting (its partitions' largest lag), summed.
fn region_load(lag_seconds: &PartitionSeries) -> f64 {
    let mut per_connection: BTreeMap<&str, f64> = BTreeMap::new();
    for ((connection, _, _), seconds) in lag_seconds {
        let max = per_connection.entry(connection).or_insert(0.0);
        *max = max.max(*seconds);
    }
    per_connection.values().sum()
}

/// Writes a gauge's `# HELP` (from [`INVENTORY`]) and `# TYPE` lines.
fn gauge_header(out: &mut String, name: &str) {
    let help = INVENTORY
        .iter()
        .find(|(n, _, _)| *n == name)
        .map_or("", |(_, _, h)| *h);
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} gauge");
}

/// Writes a gauge labelled by connection (nothing when it has no series).
fn render_connection_gauge(out: &mut String, name: &str, series: &BTreeMap<String, f64>) {
    if series.is_empty() {
        return;
    }
    gauge_header(out, name);
    for (connection, value) in series {
        let _ = writeln!(
            out,
            "{name}{{connection=\"{}\"}} {value}",
            escape_label(connection)
        );
    }
    out.push('\n');
}

/// Writes a gauge without labels (nothing when `value` is None).
fn render_gauge(out: &mut String, name: &str, value: Option<f64>) {
    let Some(value) = value else {
        return;
    };
    gauge_header(out, name);
    let _ = writeln!(out, "{name} {value}\n");
}

/// librdkafka clients alive in the process (see [`ClientCount`]).
static CLIENTS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

fn live_clients() -> usize {
    CLIENTS.load(std::sync::atomic::Ordering::Relaxed)
}

/// Counts one librdkafka client while it lives: held by the context every client of the
/// connector is created with (a context lives as long as its client), so the count is the
/// clients of the process.
#[derive(Debug)]
pub struct ClientCount(());

impl ClientCount {
    /// One more client.
    pub fn new() -> Self {
        let _ = CLIENTS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Self(())
    }
}

impl Default for ClientCount {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for ClientCount {
    fn drop(&mut self) {
        let _ = CLIENTS.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    }
}

/// The connections this replica runs.
pub fn region_connections_placed(n: usize) {
    gauge!(REGION_CONNECTIONS_PLACED).set(n as f64);
}

/// The region group's generation as this replica knows it.
pub fn region_generation(generation: i32) {
    gauge!(REGION_GENERATION).set(f64::from(generation));
}

/// A gauge per assigned partition, by (connection, topic, partition).
type PartitionSeries = BTreeMap<(String, String, i32), f64>;

/// Lag in messages of every assigned partition.
static LAG: Mutex<PartitionSeries> = Mutex::new(BTreeMap::new());
/// Lag in seconds of every assigned partition.
static LAG_SECONDS: Mutex<PartitionSeries> = Mutex::new(BTreeMap::new());

fn lag_series() -> std::sync::MutexGuard<'static, PartitionSeries> {
    LAG.lock().unwrap_or_else(|p| p.into_inner())
}

fn lag_seconds_series() -> std::sync::MutexGuard<'static, PartitionSeries> {
    LAG_SECONDS.lock().unwrap_or_else(|p| p.into_inner())
}

/// Writes a per-partition gauge's series in the Prometheus text format.
fn render_partition_gauge(out: &mut String, name: &str, series: &PartitionSeries) {
    if series.is_empty() {
        return;
    }
    gauge_header(out, name);
    for ((connection, topic, partition), value) in series.iter() {
        let _ = writeln!(
            out,
            "{name}{{connection=\"{}\",topic=\"{}\",partition=\"{partition}\"}} {value}",
            escape_label(connection),
            escape_label(topic)
        );
    }
    out.push('\n');
}

/// A label value in the text format: backslash, double quote and newline escaped.
fn escape_label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// A schema cache lookup of `connection`'s registry client.
pub fn registry_cache(connection: &str, hit: bool) {
    registry_cache_counter(connection, hit).increment(1);
}

/// The schema cache lookup counter of `connection`'s registry client, to keep.
pub fn registry_cache_counter(connection: &str, hit: bool) -> Counter {
    counter!(REGISTRY_CACHE, "connection" => connection.to_owned(), "result" => if hit { "hit" } else { "miss" })
}

/// `n` messages of `topic` were received.
pub fn consumed(connection: &str, topic: &str, n: u64) {
    counter!(MESSAGES_CONSUMED, "connection" => connection.to_owned(), "topic" => topic.to_owned())
        .increment(n);
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

/// Whether `connection` runs.
pub fn connection_up(connection: &str, up: bool) {
    let _ = connections_up().insert(connection.to_owned(), if up { 1.0 } else { 0.0 });
}

/// `connection` no longer runs here (removed by a reload, or placed on other replicas): its
/// `connection_up` series disappears, so 0 keeps meaning "should run here and cannot".
pub fn forget_connection(connection: &str) {
    let _ = connections_up().remove(connection);
}

/// `connection_up` of every connection that runs here (kept here rather than in the recorder,
/// which cannot remove a series).
static CONNECTIONS_UP: Mutex<BTreeMap<String, f64>> = Mutex::new(BTreeMap::new());

fn connections_up() -> std::sync::MutexGuard<'static, BTreeMap<String, f64>> {
    CONNECTIONS_UP.lock().unwrap_or_else(|p| p.into_inner())
}

/// `connection` could not start or stopped with an error.
pub fn connection_failure(connection: &str) {
    counter!(CONNECTION_FAILURES, "connection" => connection.to_owned()).increment(1);
}

/// A configuration reload ended with `result` (`ok`, `invalid`).
pub fn config_reload(result: &'static str) {
    counter!(CONFIG_RELOADS, "result" => result).increment(1);
    gauge!(CONFIG_LAST_RELOAD_SUCCESSFUL).set(if result == "ok" { 1.0 } else { 0.0 });
}

/// The daemon runs its configuration: the reload series alerts watch exist from the start
/// (reload counters at 0, the last reload successful).
pub fn config_loaded() {
    for result in ["ok", "invalid"] {
        counter!(CONFIG_RELOADS, "result" => result).increment(0);
    }
    gauge!(CONFIG_LAST_RELOAD_SUCCESSFUL).set(1.0);
}

/// A worker panicked on a record.
pub fn worker_panic(connection: &str, trigger: &str) {
    counter!(WORKER_PANICS, "connection" => connection.to_owned(), "trigger" => trigger.to_owned())
        .increment(1);
}

/// The runs-in-flight gauge of `trigger` of `connection`, to keep and move per run.
pub fn in_flight_gauge(connection: &str, trigger: &str) -> Gauge {
    gauge!(RUNS_IN_FLIGHT, "connection" => connection.to_owned(), "trigger" => trigger.to_owned())
}

/// Outcomes of the handled counter for records that started no run although the trigger
/// consumes them: alerted on (deploy/prometheus/alerts.yml), so registered at 0.
pub const NO_RUN_OUTCOMES: [&str; 3] = ["skipped", "filter_error", "expired"];

/// Outcomes of the handled counter for records written to the dead-letter topic: alerted on
/// by their increase (the first one must count), so registered at 0.
pub const DEAD_LETTER_OUTCOMES: [&str; 2] = ["dead_lettered", "expired_dead_lettered"];

/// Registers at 0 the series of `connection` and its `triggers` that alerts watch for an
/// increase: commit errors, worker panics, records that started no run, dead letters, and
/// failures of the connection (a connection that never started counts from its first). Called once the
/// recorder is installed, when the connection starts.
pub fn register_connection<'a>(connection: &str, triggers: impl IntoIterator<Item = &'a str>) {
    for result in ["ok", "error"] {
        counter!(COMMITS, "connection" => connection.to_owned(), "result" => result).increment(0);
    }
    counter!(CONNECTION_FAILURES, "connection" => connection.to_owned()).increment(0);
    for trigger in triggers {
        for outcome in NO_RUN_OUTCOMES.into_iter().chain(DEAD_LETTER_OUTCOMES) {
            counter!(MESSAGES_HANDLED, "connection" => connection.to_owned(), "trigger" => trigger.to_owned(), "outcome" => outcome).increment(0);
        }
        counter!(WORKER_PANICS, "connection" => connection.to_owned(), "trigger" => trigger.to_owned()).increment(0);
        // Present from the start (0 when nothing parks); its value is the trigger's registry's.
        gauge!(PARKED_KEYS, "connection" => connection.to_owned(), "trigger" => trigger.to_owned())
            .increment(0.0);
    }
}

/// Formats whose decoded counter a [`TriggerMetrics`] keeps a handle for.
const DECODED_FORMATS: [&str; 7] = [
    "avro",
    "protobuf",
    "json_schema",
    "json",
    "string",
    "bytes",
    "null",
];

/// The per-message metrics of one trigger as handles: labels are built and looked up once,
/// not per message (measured: labelled calls cost about 6% of the connector's CPU).
#[derive(Debug)]
pub struct TriggerMetrics {
    connection: String,
    trigger: String,
    attempts_accepted: Counter,
    dispatch_seconds: Histogram,
    end_to_end: Histogram,
    handled_accepted: Counter,
    decoded: [std::sync::OnceLock<Counter>; DECODED_FORMATS.len()],
}

impl TriggerMetrics {
    /// Registers the handles of `trigger` of `connection`.
    pub fn new(connection: &str, trigger: &str) -> Self {
        let labels = || {
            [
                ("connection", connection.to_owned()),
                ("trigger", trigger.to_owned()),
            ]
        };
        Self {
            connection: connection.to_owned(),
            trigger: trigger.to_owned(),
            attempts_accepted: counter!(DISPATCH_ATTEMPTS, "connection" => connection.to_owned(), "trigger" => trigger.to_owned(), "outcome" => "accepted"),
            dispatch_seconds: histogram!(DISPATCH_SECONDS, &labels()),
            end_to_end: histogram!(END_TO_END_SECONDS, &labels()),
            handled_accepted: counter!(MESSAGES_HANDLED, "connection" => connection.to_owned(), "trigger" => trigger.to_owned(), "outcome" => "accepted"),
            decoded: Default::default(),
        }
    }

    /// A dispatch attempt ended with `outcome` after `seconds`.
    pub fn dispatch_attempt(&self, outcome: &'static str, seconds: f64) {
        if outcome == "accepted" {
            self.attempts_accepted.increment(1);
        } else {
            counter!(DISPATCH_ATTEMPTS, "connection" => self.connection.clone(), "trigger" => self.trigger.clone(), "outcome" => outcome).increment(1);
        }
        self.dispatch_seconds.record(seconds);
    }

    /// A message was handled with `outcome`.
    pub fn handled(&self, outcome: &'static str) {
        if outcome == "accepted" {
            self.handled_accepted.increment(1);
        } else {
            handled(&self.connection, &self.trigger, outcome);
        }
    }

    /// A run was accepted `seconds` after its message's timestamp.
    pub fn end_to_end(&self, seconds: f64) {
        self.end_to_end.record(seconds);
    }

    /// A message decoded as `format`.
    pub fn decoded(&self, format: &'static str) {
        match DECODED_FORMATS.iter().position(|f| *f == format) {
            Some(i) => self.decoded[i]
                .get_or_init(|| counter!(DECODED, "connection" => self.connection.clone(), "trigger" => self.trigger.clone(), "format" => format))
                .increment(1),
            None => decoded(&self.connection, &self.trigger, format),
        }
    }
}

/// Partition counts of a connection.
pub fn partitions(connection: &str, assigned: usize, paused: usize) {
    gauge!(ASSIGNED_PARTITIONS, "connection" => connection.to_owned()).set(assigned as f64);
    gauge!(PAUSED_PARTITIONS, "connection" => connection.to_owned()).set(paused as f64);
}

/// The keys parked on this replica for `trigger` of `connection`.
pub fn parked_keys(connection: &str, trigger: &str, n: usize) {
    gauge!(PARKED_KEYS, "connection" => connection.to_owned(), "trigger" => trigger.to_owned())
        .set(n as f64);
}

/// An operator's action on `trigger` of `connection` (empty: not one configured) and how it
/// ended: `ok`, `refused` (no grant, bad input, nothing to act on) or `failed`.
pub fn operator_action(
    connection: &str,
    trigger: &str,
    action: &'static str,
    result: &'static str,
) {
    counter!(OPERATOR_ACTIONS, "connection" => connection.to_owned(), "trigger" => trigger.to_owned(), "action" => action, "result" => result).increment(1);
}

/// The lag of a partition as last reported here: in records (from librdkafka's statistics)
/// and in seconds; None while unknown or not assigned to this replica.
pub fn partition_lag(connection: &str, topic: &str, partition: i32) -> (Option<f64>, Option<f64>) {
    let key = (connection.to_owned(), topic.to_owned(), partition);
    let records = lag_series().get(&key).copied();
    let seconds = lag_seconds_series().get(&key).copied();
    (records, seconds)
}

/// A rebalance event.
pub fn rebalance(connection: &str, kind: &'static str) {
    counter!(REBALANCES, "connection" => connection.to_owned(), "kind" => kind).increment(1);
}

/// A partition's position moved back, or its topic was created again (`reason`).
pub fn position_reset(connection: &str, topic: &str, reason: &'static str) {
    counter!(POSITION_RESETS, "connection" => connection.to_owned(), "topic" => topic.to_owned(), "reason" => reason).increment(1);
}

/// A connection's task panicked; the connection restarts.
pub fn connection_panic(connection: &str) {
    counter!(CONNECTION_PANICS, "connection" => connection.to_owned()).increment(1);
}

/// An offset commit finished.
pub fn commit(connection: &str, ok: bool) {
    counter!(COMMITS, "connection" => connection.to_owned(), "result" => if ok { "ok" } else { "error" }).increment(1);
}

/// Stalled partitions of a connection.
pub fn stalled(connection: &str, n: usize) {
    gauge!(STALLED_PARTITIONS, "connection" => connection.to_owned()).set(n as f64);
}

/// Consumer lag of one assigned partition.
pub fn consumer_lag(connection: &str, topic: &str, partition: i32, lag: i64) {
    let _ = lag_series().insert(
        (connection.to_owned(), topic.to_owned(), partition),
        lag as f64,
    );
}

/// A partition was revoked: its lag series disappears (the new owner reports it).
pub fn remove_consumer_lag(connection: &str, topic: &str, partition: i32) {
    let _ = lag_series().remove(&(connection.to_owned(), topic.to_owned(), partition));
}

/// Lag in seconds of one assigned partition: the age of its oldest record not yet handled.
pub fn consumer_lag_seconds(connection: &str, topic: &str, partition: i32, seconds: f64) {
    let _ = lag_seconds_series().insert(
        (connection.to_owned(), topic.to_owned(), partition),
        seconds,
    );
}

/// A partition was revoked: its lag-in-seconds series disappears (the new owner reports it).
pub fn remove_consumer_lag_seconds(connection: &str, topic: &str, partition: i32) {
    let _ = lag_seconds_series().remove(&(connection.to_owned(), topic.to_owned(), partition));
}

/// A run was accepted `seconds` after its message's timestamp.
pub fn end_to_end(connection: &str, trigger: &str, seconds: f64) {
    histogram!(END_TO_END_SECONDS, "connection" => connection.to_owned(), "trigger" => trigger.to_owned()).record(seconds);
}

/// A message decoded.
pub fn decoded(connection: &str, trigger: &str, format: &'static str) {
    counter!(DECODED, "connection" => connection.to_owned(), "trigger" => trigger.to_owned(), "format" => format).increment(1);
}

/// A registry lookup of `connection` failed.
pub fn registry_error(connection: &str, class: &'static str) {
    counter!(REGISTRY_ERRORS, "connection" => connection.to_owned(), "class" => class).increment(1);
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

/// A dispatcher connection could not be opened for lack of file descriptors.
pub fn fds_exhausted() {
    counter!(FDS_EXHAUSTED).increment(1);
}

/// Broker reachability of a connection.
pub fn brokers_up(connection: &str, up: bool) {
    gauge!(BROKERS_UP, "connection" => connection.to_owned()).set(if up { 1.0 } else { 0.0 });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The value of the sample whose name and labels are exactly `series`.
    fn sample(text: &str, series: &str) -> Option<f64> {
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
    }

    /// Records one of each metric through the helpers into a fresh recorder and renders it.
    fn render_one_of_each() -> String {
        let recorder = builder().build_recorder();
        let handle = recorder.handle();
        metrics::with_local_recorder(&recorder, || {
            describe();
            consumed("c", "t", 1);
            for seconds in [0.03, 0.04, 0.2] {
                dispatch_attempt("c", "tr", "accepted", seconds);
            }
            handled("c", "tr", "accepted");
            decode_error("c", "tr", "schema");
            in_flight_gauge("c", "tr").increment(1.0);
            partitions("c", 3, 1);
            rebalance("c", "assign");
            commit("c", true);
            stalled("c", 0);
            end_to_end("c", "tr", 120.0);
            decoded("c", "tr", "avro");
            registry_error("c", "unreachable");
            registry_cache("c", true);
            producer_delivery("c", true, 0.002);
            produce_request("c", 200);
            brokers_up("c", true);
            worker_panic("c", "tr");
            position_reset("c", "t", "moved_back");
            connection_panic("c");
            parked_keys("c", "tr", 1);
            operator_action("c", "tr", "pause", "ok");
            connection_up("c", true);
            connection_failure("c");
            config_loaded();
            config_reload("ok");
            region_connections_placed(3);
            region_generation(7);
            fds_exhausted();
            // Registering after the fact (a restarted connection) leaves the values alone.
            register_connection("c", ["tr"]);
        });
        consumer_lag("render-one-of-each", "t", 0, 7);
        consumer_lag_seconds("render-one-of-each", "t", 0, 2.5);
        let text = render(&handle);
        remove_consumer_lag("render-one-of-each", "t", 0);
        remove_consumer_lag_seconds("render-one-of-each", "t", 0);
        text
    }

    #[test]
    fn the_region_load_sums_each_connections_oldest_wait() {
        let series: PartitionSeries = [
            (("a", "t", 0), 4.0),
            (("a", "t", 1), 10.0),
            (("a", "u", 0), 0.0),
            (("b", "t", 0), 2.5),
            (("c", "t", 0), 0.0),
        ]
        .into_iter()
        .map(|((c, t, p), v)| ((c.to_owned(), t.to_owned(), p), v))
        .collect();
        assert_eq!(region_load(&series), 12.5);
        assert_eq!(region_load(&PartitionSeries::new()), 0.0);
        let text = render_one_of_each();
        assert!(
            sample(&text, "tessel_kafka_region_load").is_some(),
            "{text}"
        );
        assert!(sample(&text, "tessel_kafka_open_fds").is_some_and(|n| n >= 3.0));
        assert!(sample(&text, "tessel_kafka_region_clients").is_some());
    }

    #[test]
    fn names_follow_the_conventions() {
        for (name, kind, _) in INVENTORY {
            assert!(name.starts_with("tessel_kafka_"), "{name}");
            // A unit, or what is counted; `_successful` as Prometheus's own
            // prometheus_config_last_reload_successful.
            let unit = [
                "_seconds",
                "_messages",
                "_partitions",
                "_flight",
                "_up",
                "_info",
                "_successful",
                // Counts named by what they count (the region's, agreed with the chart).
                "_placed",
                "_clients",
                "_generation",
                "_load",
                "_fds",
                "_limit",
                "_keys",
            ]
            .iter()
            .any(|u| name.ends_with(u));
            match kind {
                Kind::Counter => assert!(name.ends_with("_total"), "{name}"),
                Kind::Gauge => assert!(unit, "{name} ends in no unit"),
                Kind::Histogram => assert!(name.ends_with("_seconds"), "{name}"),
            }
        }
    }

    #[test]
    fn every_metric_is_exported_with_help_and_its_type() {
        let text = render_one_of_each();
        for (name, kind, help) in INVENTORY {
            assert!(
                text.contains(&format!("# HELP {name} {help}\n")),
                "{name} has no HELP in:\n{text}"
            );
            let kind = match kind {
                Kind::Counter => "counter",
                Kind::Gauge => "gauge",
                Kind::Histogram => "histogram",
            };
            assert!(
                text.contains(&format!("# TYPE {name} {kind}\n")),
                "{name} is not a {kind} in:\n{text}"
            );
        }
        let (_, librdkafka) = rdkafka::util::get_rdkafka_version();
        assert_eq!(
            sample(
                &text,
                &format!(
                    "tessel_kafka_build_info{{version=\"{}\",librdkafka=\"{librdkafka}\"}}",
                    env!("CARGO_PKG_VERSION")
                )
            ),
            Some(1.0),
            "{text}"
        );
        assert_eq!(
            sample(
                &text,
                "tessel_kafka_registry_errors_total{connection=\"c\",class=\"unreachable\"}"
            ),
            Some(1.0)
        );
        assert_eq!(
            sample(
                &text,
                "tessel_kafka_registry_cache_lookups_total{connection=\"c\",result=\"hit\"}"
            ),
            Some(1.0)
        );
        assert_eq!(
            sample(
                &text,
                "tessel_kafka_runs_in_flight{connection=\"c\",trigger=\"tr\"}"
            ),
            Some(1.0)
        );
        assert_eq!(
            sample(
                &text,
                "tessel_kafka_consumer_lag_seconds{connection=\"render-one-of-each\",topic=\"t\",partition=\"0\"}"
            ),
            Some(2.5)
        );
    }

    /// What alerts watch for an increase exists at 0 from the start, beside what moved.
    #[test]
    fn alerted_counters_start_at_zero() {
        let text = render_one_of_each();
        for outcome in NO_RUN_OUTCOMES.into_iter().chain(DEAD_LETTER_OUTCOMES) {
            let series = format!(
                "tessel_kafka_messages_handled_total{{connection=\"c\",trigger=\"tr\",outcome=\"{outcome}\"}}"
            );
            assert_eq!(sample(&text, &series), Some(0.0), "{series} in:\n{text}");
        }
        assert_eq!(
            sample(
                &text,
                "tessel_kafka_config_reloads_total{result=\"invalid\"}"
            ),
            Some(0.0),
            "{text}"
        );
        assert_eq!(
            sample(&text, "tessel_kafka_config_last_reload_successful"),
            Some(1.0)
        );
        let handled = "tessel_kafka_messages_handled_total{connection=\"c\",trigger=\"tr\",outcome=\"accepted\"}";
        assert_eq!(sample(&text, handled), Some(1.0));
        assert_eq!(
            sample(
                &text,
                "tessel_kafka_offset_commits_total{connection=\"c\",result=\"ok\"}"
            ),
            Some(1.0)
        );
        assert_eq!(
            sample(
                &text,
                "tessel_kafka_offset_commits_total{connection=\"c\",result=\"error\"}"
            ),
            Some(0.0)
        );
        assert_eq!(
            sample(
                &text,
                "tessel_kafka_worker_panics_total{connection=\"c\",trigger=\"tr\"}"
            ),
            Some(1.0)
        );
    }

    #[test]
    fn latencies_are_histograms_with_their_buckets() {
        let text = render_one_of_each();
        // A bucket of a trigger's histogram.
        let bucket = |histogram: &str, le: &str| {
            sample(
                &text,
                &format!("{histogram}_bucket{{connection=\"c\",trigger=\"tr\",le=\"{le}\"}}"),
            )
        };
        let dispatch = |le: &str| bucket("tessel_kafka_dispatch_duration_seconds", le);
        assert_eq!(dispatch("0.025"), Some(0.0), "{text}");
        assert_eq!(dispatch("0.05"), Some(2.0));
        assert_eq!(dispatch("0.25"), Some(3.0));
        assert_eq!(dispatch("+Inf"), Some(3.0));
        let series = "{connection=\"c\",trigger=\"tr\"}";
        assert_eq!(
            sample(
                &text,
                &format!("tessel_kafka_dispatch_duration_seconds_count{series}")
            ),
            Some(3.0)
        );
        let sum = sample(
            &text,
            &format!("tessel_kafka_dispatch_duration_seconds_sum{series}"),
        )
        .unwrap();
        assert!((sum - 0.27).abs() < 1e-9, "{sum}");
        let e2e = |le: &str| bucket("tessel_kafka_end_to_end_latency_seconds", le);
        assert_eq!(e2e("60"), Some(0.0), "{text}");
        assert_eq!(e2e("300"), Some(1.0));
        assert_eq!(e2e("3600"), Some(1.0));
        assert_eq!(
            sample(
                &text,
                "tessel_kafka_producer_delivery_duration_seconds_bucket{connection=\"c\",le=\"0.0025\"}"
            ),
            Some(1.0)
        );
        assert!(!text.contains("quantile="), "no summaries:\n{text}");
    }

    #[test]
    fn lag_series_exist_while_assigned_and_disappear_on_revoke() {
        let recorder = builder().build_recorder();
        let handle = recorder.handle();
        let series = |p: i32| {
            format!(
                "tessel_kafka_consumer_lag_messages{{connection=\"lag-test\",topic=\"a\\\"b\",partition=\"{p}\"}}"
            )
        };
        consumer_lag("lag-test", "a\"b", 0, 12);
        consumer_lag("lag-test", "a\"b", 1, 0);
        let text = render(&handle);
        assert_eq!(sample(&text, &series(0)), Some(12.0), "{text}");
        assert_eq!(sample(&text, &series(1)), Some(0.0), "{text}");
        remove_consumer_lag("lag-test", "a\"b", 0);
        let text = render(&handle);
        assert_eq!(sample(&text, &series(0)), None, "{text}");
        assert_eq!(sample(&text, &series(1)), Some(0.0), "{text}");
        remove_consumer_lag("lag-test", "a\"b", 1);
    }

    /// Names in the dashboard and the alerts exist, and are queried the way their kind is
    /// exported: histograms only through `_bucket`, `_sum` or `_count`, other kinds by name.
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
                let exported = INVENTORY.iter().any(|(n, kind, _)| match kind {
                    Kind::Histogram => ["_bucket", "_sum", "_count"]
                        .iter()
                        .any(|s| name.strip_suffix(s) == Some(*n)),
                    Kind::Counter | Kind::Gauge => name == *n,
                });
                assert!(exported, "{file} uses {name}, which is not exported");
                rest = &tail[end..];
            }
        }
    }
}
