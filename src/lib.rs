//! tessel-kafka: Tessel's Kafka connector.
//!
//! # Layout
//! Floors, lowest first; a module imports only from floors below its own.
//! - [`core`], [`clock`]: the consumer core, pure, with its own types ([`core::types`]):
//!   partition state, offsets, the commit rule, batch bounds, as one state machine
//!   ([`core::Core`]) with no clock, and its deterministic simulator; the wall clock the shell
//!   reads.
//! - [`tls`], [`config`], [`limits`]: TLS client settings; TOML + environment configuration,
//!   validated, secrets redacted, with the filter language ([`config::filter`]: a trigger's
//!   `filter` is compiled at load); the open-files limit and the descriptors held.
//! - [`telemetry`], [`codec`]: metrics, traces, logs; Confluent wire format, Schema Registry
//!   client, Avro/Protobuf/JSON to JSON.
//! - [`dispatch`]: the run dispatcher client, retry timing, [`dispatch::event`], the event
//!   contract sent to the dispatcher, and [`dispatch::batch`], a batch's key and answer.
//! - [`clients`]: what every Kafka client shares: security, AWS credentials, client
//!   configuration, permission probes.
//! - [`produce`]: the idempotent producer, the produce API: encode, authorize, write.
//! - [`run`]: one run of 1..n records: record age, decode, filter (applied), dispatch, retry,
//!   `on_error`, dead letters.
//! - [`consumer`]: the shell around the core per connection: the poll task (which also
//!   pauses, resumes and seeks), the commit task, the supervisor, the monitor.
//! - [`control`]: operators' view and hands: the status model, parked keys, target states
//!   (pause, resume), retry, skip and redrive, as an API, a web console and `ctl`; its shared
//!   state sits beside [`run`], its service beside [`admin`].
//! - [`region`]: placement of connections on a region's replicas through the region group.
//! - [`admin`], [`app`], [`shutdown`]: running the daemon.
//! - [`cli`], [`cli::commands`]: the command line and what each command does; [`fuzz`]: the
//!   fuzz targets' entry points.
//! - [`ops::tools`]: offsets show / reset; [`ops::replay`]: dead-letter replay.
//! - [`ops::check`]: `tessel-kafka check`, the connection and permission checks.
//! - [`cli::dev_dispatcher`]: a local dispatcher for the quick start and tests.

pub mod admin;
pub mod app;
pub mod cli;
pub mod clients;
pub mod clock;
pub mod codec;
pub mod config;
pub mod consumer;
pub mod control;
pub mod core;
pub mod dispatch;
pub mod fuzz;
pub mod limits;
pub mod ops;
pub mod produce;
pub mod region;
pub mod run;
pub mod shutdown;
pub mod telemetry;
pub mod tls;
