//! Probes of what a connection's principal may do on its cluster, without side effects: the
//! Kafka half of `tessel-kafka check` ([`crate::ops::check`], which documents each line), and
//! what the daemon's monitor asks when the broker refuses it something.

use std::collections::BTreeSet;
use std::net::ToSocketAddrs;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{Offset, TopicPartitionList};
use serde::Serialize;

use super::security::{ConnectFailure, SecurityContext};
use crate::config::security::{KafkaAuth, SaslMechanism};
use crate::config::ConnectionConfig;

/// How long one probe waits for the cluster.
const PROBE_TIMEOUT: Duration = Duration::from_secs(10);

/// How long authentication is retried when the failure is not an authentication or TLS one.
const AUTH_TIMEOUT: Duration = Duration::from_secs(30);

/// The result of one check.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum CheckStatus {
    /// Works.
    Pass,
    /// Does not work; the detail says what is missing.
    Fail,
    /// Not tried because an earlier check failed.
    Skip,
}

impl CheckStatus {
    /// `PASS`, `FAIL` or `SKIP`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pass => "PASS",
            Self::Fail => "FAIL",
            Self::Skip => "SKIP",
        }
    }
}

/// One line of the report.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CheckLine {
    /// The connection.
    pub connection: String,
    /// What was checked, e.g. `READ on group tessel-orders`.
    pub check: String,
    /// The result.
    pub status: CheckStatus,
    /// Details: what answered, or what is missing.
    pub detail: String,
}

pub(crate) struct Report<'a> {
    pub(crate) connection: &'a str,
    pub(crate) lines: Vec<CheckLine>,
}

impl Report<'_> {
    pub(crate) fn push(
        &mut self,
        check: impl Into<String>,
        status: CheckStatus,
        detail: impl Into<String>,
    ) {
        self.lines.push(CheckLine {
            connection: self.connection.to_owned(),
            check: check.into(),
            status,
            detail: detail.into(),
        });
    }
    pub(crate) fn pass(&mut self, check: impl Into<String>, detail: impl Into<String>) {
        self.push(check, CheckStatus::Pass, detail);
    }
    pub(crate) fn fail(&mut self, check: impl Into<String>, detail: impl Into<String>) {
        self.push(check, CheckStatus::Fail, detail);
    }
    pub(crate) fn skip(&mut self, check: impl Into<String>, detail: impl Into<String>) {
        self.push(check, CheckStatus::Skip, detail);
    }
}

/// The missing permissions of a consumer connection, in the product page's words (`READ on
/// group G`, `DESCRIBE on topic T`, `READ on topic T`); empty when nothing is missing or the
/// cluster cannot be asked. Used by the daemon to say precisely what an authorization error
/// means.
pub fn missing_consumer_permissions(name: &str, conn: &ConnectionConfig) -> Vec<String> {
    kafka_checks(name, conn, &BTreeSet::new())
        .into_iter()
        .filter(|l| l.status == CheckStatus::Fail && l.detail.starts_with("missing "))
        .map(|l| l.check)
        .filter(|c| !c.starts_with("WRITE") && !c.starts_with("idempotent"))
        .collect()
}

fn auth_description(conn: &ConnectionConfig) -> String {
    let user = conn
        .kafka
        .get("sasl.username")
        .map(|u| format!(" as {u}"))
        .unwrap_or_default();
    match conn.auth() {
        Ok(KafkaAuth::Plaintext) => "PLAINTEXT (no authentication)".to_owned(),
        Ok(KafkaAuth::Ssl { mutual: true }) => "SSL with a client certificate (mTLS)".to_owned(),
        Ok(KafkaAuth::Ssl { mutual: false }) => "SSL".to_owned(),
        Ok(KafkaAuth::Sasl { mechanism, tls }) => format!(
            "{} {}{}",
            if tls { "SASL_SSL" } else { "SASL_PLAINTEXT" },
            mechanism.as_str(),
            if matches!(
                mechanism,
                SaslMechanism::OauthbearerOidc | SaslMechanism::AwsMskIam
            ) {
                String::new()
            } else {
                user
            }
        ),
        Err(e) => format!("invalid security settings: {e}"),
    }
}

fn client_config(conn: &ConnectionConfig) -> ClientConfig {
    let mut cfg = ClientConfig::new();
    for (k, v) in &conn.kafka {
        let _ = cfg.set(k, v);
    }
    cfg
}

/// The Kafka checks of one connection; WRITE (and the producer id) only for `produced`.
pub(crate) fn kafka_checks(
    name: &str,
    conn: &ConnectionConfig,
    produced: &BTreeSet<String>,
) -> Vec<CheckLine> {
    let mut r = Report {
        connection: name,
        lines: Vec::new(),
    };
    let topics: BTreeSet<&str> = conn.topics();
    let group = conn.group_id().to_owned();
    let skip_all = |r: &mut Report<'_>, why: &str| {
        for t in &topics {
            r.skip(format!("DESCRIBE on topic {t}"), why);
            r.skip(format!("READ on topic {t}"), why);
        }
        if conn.consumes() {
            r.skip(format!("READ on group {group}"), why);
        }
        for t in produced {
            r.skip(format!("WRITE on topic {t}"), why);
        }
        if !produced.is_empty() {
            r.skip("idempotent producer id", why);
        }
    };

    // Brokers reachable (TCP).
    let servers: Vec<String> = conn
        .kafka
        .get("bootstrap.servers")
        .map(|s| s.split(',').map(|x| x.trim().to_owned()).collect())
        .unwrap_or_default();
    let mut reached = Vec::new();
    let mut unreached = Vec::new();
    for s in &servers {
        match tcp_reach(s) {
            Ok(()) => reached.push(s.clone()),
            Err(e) => unreached.push(format!("{s} ({e})")),
        }
    }
    if reached.is_empty() {
        r.fail(
            "brokers reachable",
            format!(
                "cannot reach any bootstrap server: {}",
                unreached.join(", ")
            ),
        );
        r.skip("authentication", "no broker reachable");
        skip_all(&mut r, "no broker reachable");
        return r.lines;
    }
    r.pass("brokers reachable", reached.join(", "));

    // Authentication: a metadata request.
    let context = match SecurityContext::for_connection(name, conn) {
        Ok(c) => c,
        Err(e) => {
            r.fail("authentication", e.to_string());
            skip_all(&mut r, "not authenticated");
            return r.lines;
        }
    };
    let mut cfg = client_config(conn);
    let _ = cfg
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("enable.partition.eof", "true")
        .set("allow.auto.create.topics", "false");
    let consumer: BaseConsumer<SecurityContext> = match cfg.create_with_context(context) {
        Ok(c) => c,
        Err(e) => {
            r.fail("authentication", format!("cannot create a client: {e}"));
            skip_all(&mut r, "not authenticated");
            return r.lines;
        }
    };
    if let Err(why) = authenticate(&consumer) {
        r.fail("authentication", why);
        skip_all(&mut r, "not authenticated");
        return r.lines;
    }
    r.pass("authentication", auth_description(conn));

    // Patterns stand for the topics they match now.
    let (patterns, named): (Vec<&str>, Vec<&str>) = topics
        .iter()
        .copied()
        .partition(|t| crate::config::is_pattern(t));
    let mut topics: BTreeSet<String> = named.into_iter().map(str::to_owned).collect();
    for pattern in patterns {
        let check = format!("topics matching {pattern}");
        match matching_topics(&consumer, &[pattern]) {
            Ok(found) if found.is_empty() => r.pass(
                &check,
                "none yet (topics created later are picked up by the running daemon)",
            ),
            Ok(found) => {
                r.pass(&check, found.join(", "));
                topics.extend(found);
            }
            Err(e) => r.fail(&check, format!("{e:#}")),
        }
    }

    // DESCRIBE and READ on each consumed topic.
    let mut described = Vec::new();
    let mut group_refused = false;
    for topic in &topics {
        let topic = &topic.as_str();
        let check = format!("DESCRIBE on topic {topic}");
        match describe(&consumer, topic) {
            Ok(partitions) => {
                r.pass(&check, format!("{partitions} partition(s)"));
                described.push((*topic, partitions));
            }
            Err(DescribeError::Unauthorized) => {
                r.fail(&check, format!("missing DESCRIBE on topic {topic}"));
                r.skip(format!("READ on topic {topic}"), "topic not described");
                continue;
            }
            Err(DescribeError::Other(why)) => {
                r.fail(&check, why);
                r.skip(format!("READ on topic {topic}"), "topic not described");
                continue;
            }
        }
        let check = format!("READ on topic {topic}");
        match fetch_probe(&consumer, topic, &mut group_refused) {
            Ok(detail) => r.pass(&check, detail),
            Err(ProbeError::Unauthorized) => {
                r.fail(&check, format!("missing READ on topic {topic}"))
            }
            Err(ProbeError::Other(why)) => r.fail(&check, why),
        }
    }

    // READ on the group, unless the connection only produces.
    let check = format!("READ on group {group}");
    if !conn.consumes() {
        // No group to check.
    } else if described.is_empty() {
        r.skip(&check, "no topic could be described");
    } else {
        let mut tpl = TopicPartitionList::new();
        for (t, n) in &described {
            for p in 0..*n {
                tpl.add_partition(t, p);
            }
        }
        match consumer.committed_offsets(tpl, PROBE_TIMEOUT) {
            Ok(c) => {
                let committed = c
                    .elements()
                    .iter()
                    .filter(|e| matches!(e.offset(), Offset::Offset(_)))
                    .count();
                r.pass(
                    &check,
                    format!("{committed} partition(s) with a committed offset"),
                );
            }
            Err(e) => {
                // A refused coordinator lookup reaches the application once, as an error on
                // the consumer's queue, while the offset request itself times out.
                let drain_until = Instant::now() + Duration::from_secs(2);
                let code = e.rdkafka_error_code();
                group_refused |= code == Some(RDKafkaErrorCode::GroupAuthorizationFailed);
                while !group_refused && Instant::now() < drain_until {
                    if let Some(Err(e)) = consumer.poll(Duration::from_millis(100)) {
                        group_refused |= e.rdkafka_error_code()
                            == Some(RDKafkaErrorCode::GroupAuthorizationFailed);
                    }
                    group_refused |= consumer.context().group_refused();
                }
                if group_refused {
                    r.fail(&check, format!("missing READ on group {group}"));
                } else {
                    r.fail(&check, format!("cannot read the group's offsets: {e}"));
                }
            }
        }
    }
    drop(consumer);

    // WRITE and the idempotent producer id, only where the connection produces.
    if !produced.is_empty() {
        write_checks(&mut r, name, conn, produced);
    }
    r.lines
}

/// A metadata request, retried until [`AUTH_TIMEOUT`] unless librdkafka reported an
/// authentication or TLS failure (its reports arrive on the consumer's queue, so the
/// consumer is polled in between).
fn authenticate(consumer: &BaseConsumer<SecurityContext>) -> Result<(), String> {
    let deadline = Instant::now() + AUTH_TIMEOUT;
    loop {
        let error = match consumer.fetch_metadata(None, PROBE_TIMEOUT) {
            Ok(_) => return Ok(()),
            Err(e) => e,
        };
        let drain_until = Instant::now() + Duration::from_millis(500);
        while Instant::now() < drain_until {
            let _ = consumer.poll(Duration::from_millis(100));
        }
        match consumer.context().last_failure() {
            Some(f @ (ConnectFailure::Authentication(_) | ConnectFailure::Tls(_))) => {
                return Err(f.to_string())
            }
            Some(f) if Instant::now() > deadline => return Err(f.to_string()),
            None if Instant::now() > deadline => {
                return Err(format!("no metadata from the brokers: {error}"))
            }
            _ => {}
        }
    }
}

fn tcp_reach(server: &str) -> Result<(), String> {
    let addrs: Vec<_> = server
        .to_socket_addrs()
        .map_err(|e| format!("cannot resolve: {e}"))?
        .collect();
    let mut last = "no address".to_owned();
    for a in addrs {
        match std::net::TcpStream::connect_timeout(&a, Duration::from_secs(5)) {
            Ok(_) => return Ok(()),
            Err(e) => last = e.to_string(),
        }
    }
    Err(last)
}

enum DescribeError {
    Unauthorized,
    Other(String),
}

fn describe(consumer: &BaseConsumer<SecurityContext>, topic: &str) -> Result<i32, DescribeError> {
    let md = consumer
        .fetch_metadata(Some(topic), PROBE_TIMEOUT)
        .map_err(|e| DescribeError::Other(format!("no metadata for topic {topic}: {e}")))?;
    let Some(t) = md.topics().iter().find(|t| t.name() == topic) else {
        return Err(DescribeError::Other(format!(
            "topic {topic} is not in the metadata"
        )));
    };
    match t.error().map(RDKafkaErrorCode::from) {
        None => Ok(t.partitions().len() as i32),
        Some(RDKafkaErrorCode::TopicAuthorizationFailed) => Err(DescribeError::Unauthorized),
        Some(RDKafkaErrorCode::UnknownTopicOrPartition) => Err(DescribeError::Other(format!(
            "topic {topic} does not exist"
        ))),
        Some(code) => Err(DescribeError::Other(format!("topic {topic}: {code}"))),
    }
}

enum ProbeError {
    Unauthorized,
    Other(String),
}

/// Fetches at the end of partition 0: an authorized fetch answers with end-of-partition and
/// reads nothing.
fn fetch_probe(
    consumer: &BaseConsumer<SecurityContext>,
    topic: &str,
    group_refused: &mut bool,
) -> Result<String, ProbeError> {
    let (_, high) = consumer
        .fetch_watermarks(topic, 0, PROBE_TIMEOUT)
        .map_err(|e| match e.rdkafka_error_code() {
            Some(RDKafkaErrorCode::TopicAuthorizationFailed) => ProbeError::Unauthorized,
            _ => ProbeError::Other(format!("cannot read the end offsets of {topic}: {e}")),
        })?;
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, 0, Offset::Offset(high))
        .map_err(|e| ProbeError::Other(e.to_string()))?;
    consumer
        .assign(&tpl)
        .map_err(|e| ProbeError::Other(format!("cannot assign {topic}[0]: {e}")))?;
    let deadline = Instant::now() + PROBE_TIMEOUT;
    let result = loop {
        if Instant::now() > deadline {
            break Err(ProbeError::Other(format!(
                "no answer to a fetch from {topic}[0] within {PROBE_TIMEOUT:?}"
            )));
        }
        match consumer.poll(Duration::from_millis(200)) {
            Some(Err(KafkaError::PartitionEOF(_))) | Some(Ok(_)) => {
                break Ok("fetch authorized (nothing read)".to_owned())
            }
            Some(Err(e))
                if e.rdkafka_error_code() == Some(RDKafkaErrorCode::TopicAuthorizationFailed) =>
            {
                break Err(ProbeError::Unauthorized)
            }
            Some(Err(e))
                if e.rdkafka_error_code() == Some(RDKafkaErrorCode::GroupAuthorizationFailed) =>
            {
                // The group's coordinator lookup was refused; the group line reports it.
                *group_refused = true;
            }
            Some(Err(e)) => break Err(ProbeError::Other(format!("fetch from {topic}[0]: {e}"))),
            None => {}
        }
    };
    let _ = consumer.unassign();
    result
}

fn write_checks(
    r: &mut Report<'_>,
    name: &str,
    conn: &ConnectionConfig,
    produced: &BTreeSet<String>,
) {
    let producer_cfg = |idempotent: bool| {
        let mut cfg = super::producer_config(name, conn);
        if !idempotent {
            // acks=2 is refused by the broker after authorization and before any write
            // (INVALID_REQUIRED_ACKS), so the probe never leaves a record behind.
            let _ = cfg
                .set("enable.idempotence", "false")
                .set("acks", "2")
                .set("retries", "0");
        }
        let _ = cfg
            .set("message.timeout.ms", PROBE_TIMEOUT.as_millis().to_string())
            .set("statistics.interval.ms", "200");
        cfg
    };
    let context = || SecurityContext::for_connection(name, conn);
    let probe: Result<FutureProducer<SecurityContext>, String> =
        context().map_err(|e| e.to_string()).and_then(|c| {
            producer_cfg(false)
                .create_with_context(c)
                .map_err(|e| e.to_string())
        });
    match probe {
        Err(e) => {
            for t in produced {
                r.fail(
                    format!("WRITE on topic {t}"),
                    format!("cannot create a producer: {e}"),
                );
            }
        }
        Ok(producer) => {
            for topic in produced {
                let check = format!("WRITE on topic {topic}");
                let record: FutureRecord<'_, [u8], [u8]> = FutureRecord::to(topic)
                    .payload(b"tessel-kafka check: never written".as_slice());
                let result = futures::executor::block_on(producer.send(record, PROBE_TIMEOUT))
                    .map_err(|(e, _)| e);
                match result.err().and_then(|e| e.rdkafka_error_code()) {
                    Some(RDKafkaErrorCode::InvalidRequiredAcks) => {
                        r.pass(&check, "produce authorized (probe refused before writing, nothing written)")
                    }
                    Some(RDKafkaErrorCode::TopicAuthorizationFailed) => {
                        r.fail(&check, format!("missing WRITE on topic {topic}"))
                    }
                    Some(RDKafkaErrorCode::UnknownTopicOrPartition) | Some(RDKafkaErrorCode::UnknownTopic) => {
                        r.fail(&check, format!("topic {topic} does not exist"))
                    }
                    Some(code) => r.fail(&check, format!("produce probe answered {code}")),
                    None => r.fail(&check, "the broker accepted a probe with acks=2; cannot tell (nothing should have been written)"),
                }
            }
        }
    }

    let check = "idempotent producer id";
    let mut state_handle = None;
    let producer: Result<FutureProducer<SecurityContext>, String> =
        context().map_err(|e| e.to_string()).and_then(|c| {
            state_handle = Some(c.idempotence_state());
            producer_cfg(true)
                .create_with_context(c)
                .map_err(|e| e.to_string())
        });
    let (producer, state_handle) = match (producer, state_handle) {
        (Ok(p), Some(h)) => (p, h),
        (Err(e), _) => {
            r.fail(check, format!("cannot create the idempotent producer: {e}"));
            return;
        }
        (Ok(_), None) => {
            r.fail(check, "cannot create the idempotent producer");
            return;
        }
    };
    let deadline = Instant::now() + PROBE_TIMEOUT;
    loop {
        let state = state_handle
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        if state.as_deref() == Some("Assigned") {
            r.pass(check, "producer id assigned");
            break;
        }
        if let Err(e) = producer
            .client()
            .fatal_error()
            .map_or(Ok(()), |(code, reason)| Err((code, reason)))
        {
            let (code, reason) = e;
            let detail = if code == RDKafkaErrorCode::ClusterAuthorizationFailed
                || reason.to_ascii_lowercase().contains("authoriz")
            {
                "missing WRITE on the produced topics (Kafka 2.8 and later), or IDEMPOTENT_WRITE on cluster (older clusters)".to_owned()
            } else {
                format!("the idempotent producer failed: {reason}")
            };
            r.fail(check, detail);
            break;
        }
        if Instant::now() > deadline {
            r.fail(
                check,
                format!(
                    "no producer id within {PROBE_TIMEOUT:?} (state {}); on clusters older than 2.8 the principal needs IDEMPOTENT_WRITE on cluster",
                    state.unwrap_or_else(|| "unknown".into())
                ),
            );
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}
/// The cluster's topics that one of `patterns` (regular expressions, `^…`) matches.
pub(crate) fn matching_topics(
    consumer: &BaseConsumer<SecurityContext>,
    patterns: &[&str],
) -> anyhow::Result<Vec<String>> {
    let regexes = patterns
        .iter()
        .map(|p| regex::Regex::new(p).with_context(|| format!("topic pattern {p}")))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let md = consumer
        .fetch_metadata(None, PROBE_TIMEOUT)
        .context("cannot list the cluster's topics")?;
    Ok(md
        .topics()
        .iter()
        .map(|t| t.name())
        .filter(|n| !n.starts_with("__") && regexes.iter().any(|r| r.is_match(n)))
        .map(str::to_owned)
        .collect())
}

/// How many partitions the topics of connection `name` have in all (a pattern counts the
/// topics it matches now): the most members its consumer group can give work to. With a
/// short-lived client of the connection's own settings.
pub fn partition_count(name: &str, conn: &ConnectionConfig) -> anyhow::Result<usize> {
    let context = SecurityContext::for_connection(name, conn)?;
    let consumer: BaseConsumer<SecurityContext> = client_config(conn)
        .create_with_context(context)
        .context("cannot create a client")?;
    let (patterns, named): (Vec<&str>, Vec<&str>) = conn
        .topics()
        .into_iter()
        .partition(|t| crate::config::is_pattern(t));
    let mut topics: BTreeSet<String> = named.into_iter().map(str::to_owned).collect();
    if !patterns.is_empty() {
        topics.extend(matching_topics(&consumer, &patterns)?);
    }
    let mut total = 0;
    for topic in &topics {
        let md = consumer
            .fetch_metadata(Some(topic), PROBE_TIMEOUT)
            .with_context(|| format!("metadata of {topic}"))?;
        total += md
            .topics()
            .iter()
            .filter(|t| t.name() == topic && t.error().is_none())
            .map(|t| t.partitions().len())
            .sum::<usize>();
    }
    Ok(total)
}
