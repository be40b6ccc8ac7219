//! Command-line interface of the `tessel-kafka` binary.

pub mod commands;
pub mod ctl;
pub mod dev_dispatcher;
pub mod http_load;
mod produce;

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Parser, Subcommand};

/// Tessel's Kafka connector.
#[derive(Debug, Parser)]
#[command(name = "tessel-kafka", version, about)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the connector daemon.
    Run {
        /// Configuration file (TOML); TESSEL_KAFKA__… variables override it.
        #[arg(long, short, env = "TESSEL_KAFKA_CONFIG")]
        config: PathBuf,
    },
    /// Check each connection against its cluster, registry and dispatchers: reach,
    /// authenticate, and hold the permissions the connector needs. Exits non-zero on a FAIL.
    Check {
        /// Configuration file (TOML); TESSEL_KAFKA__… variables override it.
        #[arg(long, short, env = "TESSEL_KAFKA_CONFIG")]
        config: PathBuf,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Configuration tools.
    Config {
        /// What to do with the configuration.
        #[command(subcommand)]
        command: ConfigCommand,
    },
    /// Committed offsets and lag, and resetting them.
    Offsets {
        /// What to do.
        #[command(subcommand)]
        command: OffsetsCommand,
    },
    /// Dead-letter topic tools.
    Dlq {
        /// What to do.
        #[command(subcommand)]
        command: DlqCommand,
    },
    /// Write records through a connection's idempotent producer (the produce API's encoding
    /// and checks, without a token). Records are JSON objects, one per line, as the API takes
    /// them; each acknowledged record prints `{"topic", "partition", "offset"}`.
    Produce(ProduceArgs),
    /// The operator API of a running daemon: the region's status with its parked keys;
    /// pause and resume a trigger; retry or skip a parked record; redrive dead letters.
    Ctl(ctl::CtlArgs),
    /// Run a local run dispatcher that prints one line per run.
    DevDispatcher {
        /// Address to listen on.
        #[arg(long, default_value = "127.0.0.1:8787")]
        listen: SocketAddr,
        /// Each request waits this many milliseconds.
        #[arg(long, default_value_t = 0)]
        latency_ms: u64,
        /// Share of requests (0.0 to 1.0) answered with --fail-status.
        #[arg(long, default_value_t = 0.0)]
        fail_ratio: f64,
        /// Status of injected failures.
        #[arg(long, default_value_t = 503)]
        fail_status: u16,
        /// Measuring mode for scripts/bench: no line per run, no fault injection (only
        /// --latency-ms); figures at GET /stats (see `dev_dispatcher::bench`). A tool of
        /// scripts/bench, hidden from the help.
        #[arg(long, hide = true, conflicts_with_all = ["fail_ratio", "fail_status"])]
        bench: bool,
    },
    /// POST one body to a dispatcher through the connector's own HTTP client, --connections
    /// requests at a time, for --seconds; prints what it did as JSON (scripts/bench's
    /// baseline for the HTTP path of a run, without Kafka).
    #[command(hide = true)]
    DevHttpLoad {
        /// The dispatcher URL.
        #[arg(long)]
        url: String,
        /// File holding the request body.
        #[arg(long)]
        body: PathBuf,
        /// Extra request header, `name: value` (repeatable).
        #[arg(long = "header")]
        headers: Vec<String>,
        /// Requests in flight at once.
        #[arg(long, default_value_t = 64)]
        connections: usize,
        /// How long to send for.
        #[arg(long, default_value_t = 10.0)]
        seconds: f64,
        /// Idempotency keys are `<prefix>:<n>`.
        #[arg(long, default_value = "load")]
        key_prefix: String,
    },
}

/// `tessel-kafka config …`.
#[derive(Debug, Subcommand)]
pub enum ConfigCommand {
    /// Validate a configuration and print it with defaults filled in and secrets redacted.
    Check {
        /// Configuration file (TOML).
        #[arg(long, short, env = "TESSEL_KAFKA_CONFIG")]
        config: PathBuf,
        /// Print `{"notices": [...], "config": {...}}` as JSON instead of TOML.
        #[arg(long)]
        json: bool,
    },
}

/// `tessel-kafka offsets …`.
#[derive(Debug, Subcommand)]
pub enum OffsetsCommand {
    /// Committed offset, watermarks and lag of every partition of a connection's topics.
    Show {
        /// Configuration file (TOML).
        #[arg(long, short, env = "TESSEL_KAFKA_CONFIG")]
        config: PathBuf,
        /// The connection (needed when the file has several).
        #[arg(long)]
        connection: Option<String>,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Plan moving the group's committed offsets, printing the current and planned offset of
    /// each partition; with --execute, commit them (refused while a member of the group is
    /// active). Without --execute nothing is written.
    Reset {
        /// Configuration file (TOML).
        #[arg(long, short, env = "TESSEL_KAFKA_CONFIG")]
        config: PathBuf,
        /// The connection (needed when the file has several).
        #[arg(long)]
        connection: Option<String>,
        /// earliest, latest, timestamp:MS (milliseconds since the epoch) or offset:N.
        #[arg(long)]
        to: crate::ops::tools::ResetTo,
        /// Only this topic (default: all of the connection's topics).
        #[arg(long)]
        topic: Option<String>,
        /// Only this partition of --topic (repeatable; default: every partition).
        #[arg(long = "partition", requires = "topic")]
        partitions: Vec<i32>,
        /// Commit the planned offsets (default: a dry run that writes nothing).
        #[arg(long)]
        execute: bool,
        /// Print the plan (and whether it was executed) as JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
}

/// `tessel-kafka dlq …`.
#[derive(Debug, Subcommand)]
pub enum DlqCommand {
    /// Dispatch a trigger's dead letters again, as the daemon dispatches records: in its
    /// envelope, with the original idempotency keys, in batches for a batch trigger, retried
    /// per its `retry` settings. Reads every partition of the dead-letter topic, a record at
    /// a time, and prints a line per record as it is settled.
    Replay {
        /// Configuration file (TOML).
        #[arg(long, short, env = "TESSEL_KAFKA_CONFIG")]
        config: PathBuf,
        /// The connection (needed when the file has several).
        #[arg(long)]
        connection: Option<String>,
        /// The trigger whose dead_letter_topic is replayed.
        #[arg(long)]
        trigger: String,
        /// Only this partition of the dead-letter topic (repeatable; default: every one).
        #[arg(long = "partition")]
        partitions: Vec<i32>,
        /// First offset to replay in each partition.
        #[arg(long, default_value_t = 0)]
        from: i64,
        /// Stop before this offset in each partition (default: the end).
        #[arg(long)]
        to: Option<i64>,
        /// Say which requests would be sent (outcome `dry_run`), and send nothing.
        #[arg(long)]
        dry_run: bool,
        /// Print the records as a JSON array instead of tab-separated lines.
        #[arg(long)]
        json: bool,
    },
}

/// `tessel-kafka produce`.
#[derive(Debug, clap::Args)]
pub struct ProduceArgs {
    /// Configuration file (TOML).
    #[arg(long, short, env = "TESSEL_KAFKA_CONFIG")]
    pub config: PathBuf,
    /// The connection (needed when the file has several).
    #[arg(long)]
    pub connection: Option<String>,
    /// Topic of records that name none.
    #[arg(long)]
    pub topic: Option<String>,
    /// One record's value (JSON); without it, records are read from --input.
    #[arg(long)]
    pub value: Option<String>,
    /// That record's key (a string).
    #[arg(long, requires = "value")]
    pub key: Option<String>,
    /// A header `name=value` of that record; repeatable.
    #[arg(long = "header", requires = "value")]
    pub headers: Vec<String>,
    /// Value format of records that name none: schema_registry, json, string, bytes.
    #[arg(long)]
    pub value_format: Option<String>,
    /// File of JSON lines (`-`: standard input).
    #[arg(long, default_value = "-")]
    pub input: PathBuf,
    /// Records per batch (one round of acknowledgements).
    #[arg(long, default_value_t = 1000)]
    pub batch: usize,
    /// Write each batch in one transaction (needs transactional_id_prefix).
    #[arg(long)]
    pub transactional: bool,
    /// Print only a summary line, not one line per record.
    #[arg(long)]
    pub quiet: bool,
}
