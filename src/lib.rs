//! tessel-kafka: Tessel's Kafka connector.
//!
//! # Layout
//! - [`config`]: TOML + environment configuration, validated, secrets redacted.
//! - [`kafka`]: the consumer per connection: poll thread, supervisor, per-key scheduling,
//!   offset tracking, workers.
//! - [`codec`]: Confluent wire format, Schema Registry client, Avro/Protobuf/JSON to JSON.
//! - [`dispatch`]: the run dispatcher client and retry policy.
//! - [`event`]: the event contract sent to the dispatcher.
//! - [`cli`]: the command line.
//! - [`app`], [`shutdown`], [`admin`], [`telemetry`]: running the daemon.
//! - [`dev_dispatcher`]: a local dispatcher for the quick start and tests.

pub mod admin;
pub mod app;
pub mod cli;
pub mod codec;
pub mod config;
pub mod dev_dispatcher;
pub mod dispatch;
pub mod event;
pub mod kafka;
pub mod shutdown;
pub mod telemetry;
