//! tessel-kafka: Tessel's Kafka connector.
//!
//! # Layout
//! - [`config`]: TOML + environment configuration, validated, secrets redacted.
//! - [`kafka`]: the consumer per connection: poll thread, supervisor, per-key scheduling,
//!   offset tracking, workers.
//! - [`codec`]: Confluent wire format, Schema Registry client, Avro/Protobuf/JSON to JSON.
//! - [`dispatch`]: the run dispatcher client and retry policy.
//! - [`dispatch::event`]: the event contract sent to the dispatcher.
//! - [`produce`]: the produce API and command: encode, authorize, write.
//! - [`cli`], [`cli::commands`]: the command line and what each command does.
//! - [`app`], [`shutdown`], [`admin`], [`telemetry`]: running the daemon.
//! - [`ops::tools`]: offsets show / reset; [`ops::replay`]: dead-letter replay.
//! - [`ops::check`]: `tessel-kafka check`, the connection and permission checks.
//! - [`cli::dev_dispatcher`]: a local dispatcher for the quick start and tests.

pub mod admin;
pub mod app;
pub mod cli;
pub mod codec;
pub mod config;
pub mod dispatch;
pub mod fuzz;
pub mod kafka;
pub mod ops;
pub mod produce;
pub mod shutdown;
pub mod telemetry;
pub mod tls;
