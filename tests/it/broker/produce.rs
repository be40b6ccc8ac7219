//! The produce API and command against the real broker and registry: encoding checked by the
//! reference deserializers, refusals, ACLs, transactions.

use std::process::Stdio;
use std::time::Duration;

use serde_json::{json, Value};
use tessel_kafka::cli::dev_dispatcher::Faults;

use super::reference_consume;
use super::{
    create_topic, create_topic_with, dispatcher, high_watermarks, sasl_ssl_kafka_table, Connector,
};
use crate::support::{free_port, stack, temp_config, unique, wait_for_async};

/// A token the tests' configurations grant.
pub const TOKEN: &str = "it-produce-token-0123456789";

/// Registers `schema` of `schema_type` (AVRO, PROTOBUF, JSON) under `subject`; returns its id.
pub async fn register_schema(subject: &str, schema_type: &str, schema: &str) -> u32 {
    let resp = reqwest::Client::new()
        .post(format!(
            "{}/subjects/{subject}/versions",
            stack().registry_url
        ))
        .header("Content-Type", "application/vnd.schemaregistry.v1+json")
        .json(&json!({"schemaType": schema_type, "schema": schema}))
        .send()
        .await
        .expect("registry reachable");
    let status = resp.status();
    let body: Value = resp.json().await.expect("registry JSON");
    assert!(status.is_success(), "register {subject}: {status} {body}");
    u32::try_from(body["id"].as_u64().expect("id")).expect("u32 id")
}

/// The daemon in this process with its HTTP server (and so the produce API) on a free port.
pub struct ProducingDaemon {
    pub base: String,
    connector: Connector,
}

impl ProducingDaemon {
    /// Starts it from TOML text whose `[server] listen` is `127.0.0.1:{port}`.
    pub async fn start(toml: &str, port: u16) -> Self {
        let connector = Connector::start_with(toml, true);
        let base = format!("http://127.0.0.1:{port}");
        let probe = format!("{base}/healthz");
        wait_for_async("the HTTP server", Duration::from_secs(30), || {
            let probe = probe.clone();
            async move { reqwest::get(&probe).await.ok().map(|_| ()) }
        })
        .await;
        Self { base, connector }
    }

    /// POSTs `body` to the connection's messages endpoint with `token` (if any); sent again,
    /// as a client does, while the answer is 503 with `Retry-After` (the connection is still
    /// starting), for up to 60 s.
    pub async fn post(&self, connection: &str, token: Option<&str>, body: Vec<u8>) -> (u16, Value) {
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            let mut req = reqwest::Client::new()
                .post(format!(
                    "{}/v1/connections/{connection}/messages",
                    self.base
                ))
                .header("Content-Type", "application/json")
                .timeout(Duration::from_secs(120))
                .body(body.clone());
            if let Some(t) = token {
                req = req.bearer_auth(t);
            }
            let resp = req.send().await.expect("produce API reachable");
            let status = resp.status().as_u16();
            let retry = status == 503 && resp.headers().contains_key("retry-after");
            let answer = resp.json().await.unwrap_or(Value::Null);
            if retry && std::time::Instant::now() < deadline {
                eprintln!("produce API: 503 {answer}; asking again");
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
            return (status, answer);
        }
    }

    /// POSTs a JSON document with the tests' token.
    pub async fn produce(&self, body: Value) -> (u16, Value) {
        self.post("it", Some(TOKEN), body.to_string().into_bytes())
            .await
    }

    pub async fn stop(self) {
        self.connector.stop().await;
    }
}

/// A configuration with connection `it` (given `[connections.it.kafka]` table), a trigger on
/// `consumed`, the stack's registry, and a token granting topics starting with `grant`.
pub fn producing_toml(
    kafka: &str,
    consumed: &str,
    grant: &str,
    port: u16,
    dispatcher: &str,
    extra: &str,
) -> String {
    format!(
        r#"
[server]
listen = "127.0.0.1:{port}"
[produce]
max_body_bytes = 65536
max_batch_messages = 1000
[produce.tokens.workflows]
token = "{TOKEN}"
connections = ["it"]
topics = ["{grant}*"]
[connections.it]
drain_timeout_ms = 5000
{kafka}
[connections.it.schema_registry]
url = "{registry}"
[connections.it.triggers.main]
topics = ["{consumed}"]
workflow = "wf"
dispatcher = {{ url = "{dispatcher}", timeout_ms = 5000 }}
{extra}
"#,
        registry = stack().registry_url,
    )
}

/// `[connections.it.kafka]` on the PLAINTEXT listener.
pub fn plain_kafka(group: &str) -> String {
    format!(
        r#"[connections.it.kafka]
"bootstrap.servers" = "{}"
"group.id" = "{group}"
"auto.offset.reset" = "earliest""#,
        stack().bootstrap
    )
}

const AVRO_ORDER: &str = r#"{"type":"record","name":"Order","namespace":"it.produce","fields":[
  {"name":"id","type":"long"},
  {"name":"customer","type":"string"},
  {"name":"amount","type":{"type":"bytes","logicalType":"decimal","precision":9,"scale":2}},
  {"name":"tags","type":{"type":"array","items":"string"},"default":[]},
  {"name":"note","type":["null","string"],"default":null},
  {"name":"at","type":{"type":"long","logicalType":"timestamp-millis"}}]}"#;

const PROTO_ORDER: &str = r#"syntax = "proto3";
package itproduce;
message Order {
  int64 id = 1;
  string customer = 2;
  repeated string tags = 3;
  Line line = 4;
  message Line { string sku = 1; int32 qty = 2; }
}
message Other { bool ok = 1; }
"#;

const JSON_ORDER: &str = r#"{"$schema":"http://json-schema.org/draft-07/schema#","type":"object",
  "properties":{"id":{"type":"integer"},"customer":{"type":"string"},
  "lines":{"type":"array","items":{"type":"object","properties":{"qty":{"type":"integer","minimum":1}},"required":["qty"]}}},
  "required":["id","customer"],"additionalProperties":false}"#;

struct Setup {
    daemon: ProducingDaemon,
    prefix: String,
    _dispatcher: tessel_kafka::cli::dev_dispatcher::DevDispatcher,
}

/// A daemon on the PLAINTEXT listener granting topics under a fresh prefix.
async fn setup(extra: &str) -> Setup {
    let prefix = unique("prod");
    let consumed = format!("{prefix}-consumed");
    create_topic(&consumed, 1).await;
    let d = dispatcher(Faults::default()).await;
    let port = free_port();
    let toml = producing_toml(
        &plain_kafka(&unique("prod-group")),
        &consumed,
        &prefix,
        port,
        &d.url(),
        extra,
    );
    Setup {
        daemon: ProducingDaemon::start(&toml, port).await,
        prefix,
        _dispatcher: d,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn json_is_encoded_to_avro_protobuf_and_json_schema_as_the_reference_reads_it() {
    let s = setup("").await;
    let (avro_t, proto_t, json_t) = (
        format!("{}-avro", s.prefix),
        format!("{}-proto", s.prefix),
        format!("{}-json", s.prefix),
    );
    for t in [&avro_t, &proto_t, &json_t] {
        create_topic(t, 2).await;
    }
    let avro_id = register_schema(&format!("{avro_t}-value"), "AVRO", AVRO_ORDER).await;
    let _ = register_schema(&format!("{proto_t}-value"), "PROTOBUF", PROTO_ORDER).await;
    let _ = register_schema(&format!("{json_t}-value"), "JSON", JSON_ORDER).await;

    // Avro: one message (latest of TopicNameStrategy), then a batch pinned to the id.
    let (status, body) = s
        .daemon
        .produce(
            json!({"topic": avro_t, "key": "o-1", "headers": {"source": "wf-1"},
            "value": {"id": 1, "customer": "ada", "amount": "12.30", "tags": ["a", "b"],
                      "note": "first", "at": "2026-12-02T10:00:00.250Z"}}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["topic"], avro_t);
    assert!(body["offset"].as_i64().is_some(), "{body}");
    let (status, body) = s
        .daemon
        .produce(json!({"topic": avro_t, "value_schema": {"id": avro_id}, "messages": [
            {"key": "o-2", "value": {"id": 2, "customer": "bob", "amount": 5, "at": 0}},
            {"key": "o-3", "value": {"id": 3, "customer": "cy", "amount": "-0.01", "note": null, "at": 1_700_000_000_123_i64}}]}))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["results"].as_array().map(Vec::len), Some(2), "{body}");

    // Protobuf: the first message type by default, another by name.
    let (status, body) = s
        .daemon
        .produce(json!({"topic": proto_t, "messages": [
            {"key": "p-1", "value": {"id": "7", "customer": "ada", "tags": ["x"], "line": {"sku": "s-1", "qty": 2}}},
            {"key": "p-2", "value": {"id": 8, "customer": "bob"}}]}))
        .await;
    assert_eq!(status, 200, "{body}");

    // JSON Schema.
    let (status, body) = s
        .daemon
        .produce(json!({"topic": json_t, "key": "j-1",
            "value": {"id": 1, "customer": "ada", "lines": [{"qty": 3}]}}))
        .await;
    assert_eq!(status, 200, "{body}");

    let st = stack();
    let avro = reference_consume(
        json!({"bootstrap": st.bootstrap, "registry": st.registry_url,
        "topic": avro_t, "expect": 3, "key": {"format": "string"}, "value": {"format": "avro"}}),
    )
    .await;
    let by_key = |records: &[Value], key: &str| -> Value {
        records
            .iter()
            .find(|r| r["key"] == key)
            .unwrap_or_else(|| panic!("no record with key {key} in {records:?}"))
            .clone()
    };
    let o1 = by_key(&avro, "o-1");
    assert_eq!(o1["value"]["customer"], "ada");
    assert_eq!(o1["value"]["amount"], "12.30");
    assert_eq!(o1["value"]["tags"], json!(["a", "b"]));
    assert_eq!(o1["value"]["note"], "first");
    assert_eq!(o1["value"]["at"], "2026-12-02T10:00:00.250000+00:00");
    assert_eq!(o1["headers"], json!([["source", "wf-1"]]));
    let o2 = by_key(&avro, "o-2");
    assert_eq!(o2["value"]["amount"], "5.00");
    assert_eq!(o2["value"]["tags"], json!([]), "default applied");
    assert_eq!(o2["value"]["note"], Value::Null);
    assert_eq!(by_key(&avro, "o-3")["value"]["amount"], "-0.01");

    let proto = reference_consume(
        json!({"bootstrap": st.bootstrap, "topic": proto_t, "expect": 2,
        "key": {"format": "string"},
        "value": {"format": "protobuf", "message": "itproduce.Order",
                  "proto_files": {"order.proto": PROTO_ORDER}}}),
    )
    .await;
    let p1 = by_key(&proto, "p-1");
    assert_eq!(
        p1["value"],
        json!({"id": "7", "customer": "ada", "tags": ["x"], "line": {"sku": "s-1", "qty": 2}})
    );
    assert_eq!(by_key(&proto, "p-2")["value"]["id"], "8");

    let js = reference_consume(json!({"bootstrap": st.bootstrap, "registry": st.registry_url,
        "topic": json_t, "expect": 1, "key": {"format": "string"}, "value": {"format": "json_schema"}}))
    .await;
    assert_eq!(
        js[0]["value"],
        json!({"id": 1, "customer": "ada", "lines": [{"qty": 3}]})
    );
    s.daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bad_requests_get_a_clear_4xx_and_nothing_is_written() {
    let s = setup("").await;
    let avro_t = format!("{}-avro", s.prefix);
    let json_t = format!("{}-json", s.prefix);
    create_topic(&avro_t, 1).await;
    create_topic(&json_t, 1).await;
    let _ = register_schema(&format!("{avro_t}-value"), "AVRO", AVRO_ORDER).await;
    let _ = register_schema(&format!("{json_t}-value"), "JSON", JSON_ORDER).await;
    let good = json!({"id": 1, "customer": "ada", "amount": "1.00", "at": 0});
    let d = &s.daemon;

    let expect = |(status, body): (u16, Value), want: u16, words: &str| {
        assert_eq!(status, want, "{body}");
        let error = body["error"].as_str().unwrap_or_default();
        assert!(error.contains(words), "error {error:?} lacks {words:?}");
    };
    let one = json!({"topic": avro_t, "value": good})
        .to_string()
        .into_bytes();
    expect(
        d.post("it", None, one.clone()).await,
        401,
        "missing bearer token",
    );
    expect(
        d.post("it", Some("not-the-token-at-all"), one.clone())
            .await,
        401,
        "invalid bearer token",
    );
    expect(
        d.post("nope", Some(TOKEN), one.clone()).await,
        404,
        "unknown connection \"nope\"",
    );
    expect(
        d.post("it", Some(TOKEN), b"{\"topic\": ".to_vec()).await,
        400,
        "not valid JSON",
    );
    expect(
        d.produce(json!({"topic": "outside-the-grant", "value": 1}))
            .await,
        403,
        "may not produce to topic \"outside-the-grant\"",
    );
    let missing = format!("{}-missing", s.prefix);
    expect(
        d.produce(json!({"topic": missing, "value": good})).await,
        404,
        "does not exist",
    );
    expect(
        d.produce(
            json!({"topic": avro_t, "value": {"id": 1, "customer": 5, "amount": "1", "at": 0}}),
        )
        .await,
        422,
        "$.customer: expected a string, got a number",
    );
    expect(
        d.produce(
            json!({"topic": json_t, "value": {"id": 1, "customer": "x", "lines": [{"qty": 0}]}}),
        )
        .await,
        422,
        "$.lines[0].qty",
    );
    // A batch whose second message is bad writes nothing, not even the first.
    expect(
        d.produce(json!({"topic": avro_t, "messages": [{"value": good}, {"value": {"id": "x"}}]}))
            .await,
        422,
        "messages[1]: value does not match subject",
    );
    expect(
        d.produce(json!({"topic": avro_t, "partition": 5, "value": good}))
            .await,
        422,
        "partition 5 does not exist",
    );
    expect(
        d.produce(json!({"topic": avro_t, "value": "x".repeat(70_000)}))
            .await,
        413,
        "exceeds 65536 bytes",
    );
    let many: Vec<Value> = (0..1001).map(|_| json!({"value": 1})).collect();
    expect(
        d.post(
            "it",
            Some(TOKEN),
            json!({"topic": avro_t, "value_format": "json", "messages": many})
                .to_string()
                .into_bytes(),
        )
        .await,
        413,
        "the limit is 1000",
    );
    expect(
        d.produce(
            json!({"topic": avro_t, "value": good, "value_schema": {"subject": "no-such-subject"}}),
        )
        .await,
        422,
        "no schema registered under subject \"no-such-subject\"",
    );
    expect(
        d.produce(json!({"topic": avro_t, "transactional": true, "messages": [{"value": good}]}))
            .await,
        422,
        "transactional_id_prefix",
    );
    assert_eq!(high_watermarks(&avro_t, 1), vec![0], "nothing was written");
    assert_eq!(high_watermarks(&json_t, 1), vec![0], "nothing was written");
    // The same token and topic work once the input is right.
    let (status, body) = d.produce(json!({"topic": avro_t, "value": good})).await;
    assert_eq!(status, 200, "{body}");
    s.daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_transactional_batch_that_fails_part_way_leaves_nothing_visible() {
    let tx_prefix = unique("it-tx");
    let s = setup(&format!(
        "[connections.it.producer]\ntransactional_id_prefix = \"{tx_prefix}\"\nack_timeout_ms = 20000\n"
    ))
    .await;
    let ok_t = format!("{}-ok", s.prefix);
    let small_t = format!("{}-small", s.prefix);
    create_topic(&ok_t, 2).await;
    create_topic_with(&small_t, 1, &[("max.message.bytes", "1000")]).await;

    let (status, body) = s
        .daemon
        .produce(
            json!({"transactional": true, "value_format": "json", "messages": [
            {"topic": ok_t, "key": "a", "value": {"n": 1}},
            {"topic": ok_t, "key": "b", "value": {"n": 2}},
            {"topic": small_t, "key": "c", "value": {"blob": "x".repeat(5_000)}}]}),
        )
        .await;
    assert_eq!(status, 413, "{body}");
    let error = body["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("messages[2]") && error.contains("transaction was aborted"),
        "{error}"
    );

    let st = stack();
    let read = |isolation: &str| {
        json!({"bootstrap": st.bootstrap, "topic": ok_t, "isolation": isolation,
               "key": {"format": "string"}, "value": {"format": "json"}, "timeout_s": 60})
    };
    let committed = reference_consume(read("read_committed")).await;
    assert!(committed.is_empty(), "visible after abort: {committed:?}");
    // The first two records did reach the log, inside the aborted transaction.
    let uncommitted = reference_consume(read("read_uncommitted")).await;
    assert_eq!(uncommitted.len(), 2, "{uncommitted:?}");

    // A transactional batch that succeeds is visible whole.
    let (status, body) = s
        .daemon
        .produce(
            json!({"transactional": true, "value_format": "json", "topic": ok_t, "messages": [
            {"key": "a", "value": {"n": 3}}, {"key": "b", "value": {"n": 4}}]}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["transactional"], true);
    let committed = reference_consume(read("read_committed")).await;
    let values: Vec<i64> = committed
        .iter()
        .map(|r| r["value"]["n"].as_i64().unwrap())
        .collect();
    let mut sorted = values.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, vec![3, 4], "{committed:?}");
    s.daemon.stop().await;
}

/// A fresh SCRAM principal with the product page's consumer ACLs and READ and DESCRIBE, but
/// not WRITE, on the topic it is asked to produce to: the API answers 403 with the broker's
/// reason and writes nothing; once WRITE is granted, the same request goes through.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_limited_principal_produces_with_write_and_gets_403_without() {
    use super::security::{acl, consumer_acls, scram_user};
    let prefix = unique("prod-acl");
    let consumed = format!("{prefix}-consumed");
    let out = format!("{prefix}-out");
    let group = format!("{prefix}-group");
    for t in [&consumed, &out] {
        create_topic(t, 1).await;
    }
    let p = scram_user("prod-acl-user").await;
    let mut grants = consumer_acls(&consumed, &group);
    grants.push(format!("topic:{out}:READ"));
    grants.push(format!("topic:{out}:DESCRIBE"));
    acl(&p, true, &grants).await;

    let d = dispatcher(Faults::default()).await;
    let port = free_port();
    let kafka = sasl_ssl_kafka_table(&p.user, &p.password, &group);
    let toml = producing_toml(&kafka, &consumed, &prefix, port, &d.url(), "");
    let daemon = ProducingDaemon::start(&toml, port).await;
    let request = json!({"topic": out, "key": "k", "value_format": "json", "value": {"ok": true}});
    let (status, body) = daemon.produce(request.clone()).await;
    assert_eq!(status, 403, "{body}");
    let error = body["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("authorization failed"),
        "the broker's reason: {error}"
    );
    assert!(
        error.contains(&format!("WRITE on topic {out}")),
        "the missing ACL: {error}"
    );
    assert!(!error.contains(&p.password));
    assert_eq!(high_watermarks(&out, 1), vec![0], "nothing written");

    acl(&p, true, &[format!("topic:{out}:WRITE")]).await;
    let body = wait_for_async(
        "a write once WRITE is granted",
        Duration::from_secs(60),
        || {
            let (daemon, request) = (&daemon, request.clone());
            async move {
                let (status, body) = daemon.produce(request).await;
                (status == 200).then_some(body)
            }
        },
    )
    .await;
    assert_eq!(body["topic"], out);
    assert_eq!(high_watermarks(&out, 1), vec![1], "written once");
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_produce_command_writes_and_prints_offsets() {
    let topic = unique("prod-cmd");
    let consumed = unique("prod-cmd-consumed");
    create_topic(&topic, 1).await;
    create_topic(&consumed, 1).await;
    let _ = register_schema(&format!("{topic}-value"), "AVRO", AVRO_ORDER).await;
    let config = temp_config(&producing_toml(
        &plain_kafka(&unique("prod-cmd-group")),
        &consumed,
        "none",
        free_port(),
        "http://127.0.0.1:9/",
        "",
    ));
    let mut child = std::process::Command::new(crate::support::binary())
        .args(["produce", "--config"])
        .arg(&config)
        .args(["--topic", &topic])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run tessel-kafka produce");
    {
        use std::io::Write as _;
        let mut stdin = child.stdin.take().expect("stdin");
        for i in 0..3 {
            writeln!(stdin, "{}", json!({"key": format!("c-{i}"), "value": {"id": i, "customer": "cli", "amount": "1.50", "at": 0}}))
                .expect("write");
        }
    }
    let out = child.wait_with_output().expect("produce output");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let offsets: Vec<i64> = stdout
        .lines()
        .map(|l| {
            serde_json::from_str::<Value>(l).expect("JSON line")["offset"]
                .as_i64()
                .unwrap()
        })
        .collect();
    assert_eq!(offsets, vec![0, 1, 2]);
    let st = stack();
    let back = reference_consume(
        json!({"bootstrap": st.bootstrap, "registry": st.registry_url,
        "topic": topic, "expect": 3, "key": {"format": "string"}, "value": {"format": "avro"}}),
    )
    .await;
    assert_eq!(back[2]["key"], "c-2");
    assert_eq!(back[2]["value"]["amount"], "1.50");

    // A mismatch fails the command with the path and writes nothing more.
    let out = std::process::Command::new(crate::support::binary())
        .args(["produce", "--config"])
        .arg(&config)
        .args(["--topic", &topic, "--value", r#"{"id":"x"}"#])
        .output()
        .expect("run tessel-kafka produce");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("$.id"), "{stderr}");
    assert_eq!(high_watermarks(&topic, 1), vec![3]);
}

/// A connection without triggers runs no consumer and needs no group: it serves the produce
/// API, `/health` reports its brokers, and `check` probes authentication and WRITE only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_without_triggers_only_produces() {
    let topic = unique("produce-only");
    create_topic(&topic, 2).await;
    let port = free_port();
    let toml = format!(
        r#"
[server]
listen = "127.0.0.1:{port}"
[produce.tokens.workflows]
token = "{TOKEN}"
connections = ["it"]
topics = ["{topic}"]
[connections.it]
produce_topics = ["{topic}"]
[connections.it.kafka]
"bootstrap.servers" = "{bootstrap}"
"#,
        bootstrap = stack().bootstrap
    );
    let daemon = ProducingDaemon::start(&toml, port).await;
    let health = format!("{}/health", daemon.base);
    let ready = wait_for_async("/health 200", Duration::from_secs(60), || {
        let health = health.clone();
        async move {
            let resp = reqwest::get(&health).await.ok()?;
            if resp.status() != 200 {
                return None;
            }
            resp.json::<Value>().await.ok()
        }
    })
    .await;
    assert_eq!(ready["connections"]["it"]["brokers_up"], true, "{ready}");
    assert_eq!(
        ready["connections"]["it"]["assigned_partitions"], 0,
        "{ready}"
    );
    let (status, body) = daemon
        .produce(json!({"topic": topic, "key": "k-1", "value": {"a": 1}}))
        .await;
    assert_eq!(status, 200, "{body}");
    daemon.stop().await;
    assert_eq!(high_watermarks(&topic, 2).iter().sum::<i64>(), 1);

    let config = temp_config(&toml);
    let (ok, out) = super::security::check(&config, true).await;
    assert!(ok, "check:\n{out}");
    let names = super::security::check_names(&out);
    assert!(
        names.contains(&format!("WRITE on topic {topic}")),
        "{names:?}"
    );
    assert!(
        !names
            .iter()
            .any(|n| n.contains("group") || n.starts_with("READ")),
        "a connection without triggers has no consumer checks: {names:?}"
    );
    assert_eq!(
        high_watermarks(&topic, 2).iter().sum::<i64>(),
        1,
        "check wrote nothing"
    );
}
