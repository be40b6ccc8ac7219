#![allow(unreachable_pub)]
//! The one integration-test binary.
//!
//! - `cli`: the binary's behaviour that needs no broker (config errors).
//! - `console_snippets`: each provider's client snippet pasted whole into a `kafka` table,
//!   registry lines included, through `config check`.
//! - `oidc`: OAUTHBEARER OIDC token fetching against a local token endpoint (no broker).
//! - `registry_auth`: Schema Registry basic and bearer auth, refusals, TLS file errors.
//! - `deploy`: the Helm chart's renderings and the plain manifest made from it (restricted
//!   pod security, probes, resources, PDB/Service/ServiceMonitor/ScaledObject/NetworkPolicy
//!   consistent with the workload, computed config checksum; Helm through
//!   `scripts/chart-check`, needs Go).
//! - `hermetic`: the real daemon against librdkafka's mock cluster and the dev dispatcher:
//!   commits after acceptance, refused commits sent again, pauses across revoke and
//!   re-assignment, a lost assignment, shutdown with a revoke pending. Seconds, no broker.
//! - `config_builder`: the one builder of test configurations.
//! - `compose`: `docker-compose.yml` validated by Docker Compose's loader (compose-go, through
//!   `scripts/compose-check.sh`; needs Go, not Docker) and consistent with its connector config.
//! - `broker`: tests against the real Kafka broker and Schema Registry started by
//!   `scripts/stack up`; compiled only with the `kafka-integration-tests` feature, which
//!   `scripts/test` turns on. With the feature on, a missing stack fails the tests.
//!   `broker::image` (feature `image-tests`, run by `scripts/image-test`) runs the container
//!   image with podman against the stack.

mod cli;
mod compose;
mod config_builder;
mod console_snippets;
mod deploy;
mod hermetic;
mod oidc;
mod registry_auth;
mod support;

#[cfg(feature = "kafka-integration-tests")]
mod broker;
