//! Foundation: the stack works on every listener, the registry answers, ACLs are enforced.

use std::time::Duration;

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{Offset, TopicPartitionList};

use super::create_topic;
use crate::support::{stack, unique};

fn listener_config(listener: &str) -> ClientConfig {
    let s = stack();
    let mut c = ClientConfig::new();
    match listener {
        "PLAINTEXT" => {
            let _ = c.set("bootstrap.servers", &s.bootstrap);
        }
        "SASL_PLAINTEXT" => {
            let _ = c
                .set("bootstrap.servers", &s.bootstrap_sasl_plaintext)
                .set("security.protocol", "SASL_PLAINTEXT")
                .set("sasl.mechanism", "SCRAM-SHA-512")
                .set("sasl.username", &s.admin_user)
                .set("sasl.password", &s.admin_password);
        }
        "SASL_SSL" => {
            let _ = c
                .set("bootstrap.servers", &s.bootstrap_sasl_ssl)
                .set("security.protocol", "SASL_SSL")
                .set("sasl.mechanism", "SCRAM-SHA-512")
                .set("sasl.username", &s.admin_user)
                .set("sasl.password", &s.admin_password)
                .set("ssl.ca.location", &s.ca_pem);
        }
        "SSL" => {
            let _ = c
                .set("bootstrap.servers", &s.bootstrap_ssl)
                .set("security.protocol", "SSL")
                .set("ssl.ca.location", &s.ca_pem)
                .set("ssl.certificate.location", &s.client_cert_pem)
                .set("ssl.key.location", &s.client_key_pem);
        }
        other => panic!("unknown listener {other}"),
    }
    c
}

async fn round_trip(listener: &str, topic_prefix: &str) {
    let topic = unique(&format!("{topic_prefix}smoke-{}", listener.to_lowercase()));
    create_topic(&topic, 1).await;
    let producer: FutureProducer = listener_config(listener)
        .set("message.timeout.ms", "20000")
        .create()
        .expect("producer");
    let payload = format!("hello over {listener}");
    let delivery = producer
        .send(
            FutureRecord::to(&topic).key("k").payload(&payload),
            Duration::from_secs(20),
        )
        .await
        .unwrap_or_else(|(e, _)| panic!("produce over {listener}: {e}"));
    assert_eq!((delivery.partition, delivery.offset), (0, 0));

    let consumer: BaseConsumer = listener_config(listener)
        .set("group.id", unique(&format!("{topic_prefix}smoke")))
        .create()
        .expect("consumer");
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(&topic, 0, Offset::Beginning)
        .unwrap();
    consumer.assign(&tpl).expect("assign");
    let got = tokio::task::spawn_blocking(move || {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while std::time::Instant::now() < deadline {
            match consumer.poll(Duration::from_millis(200)) {
                Some(Ok(m)) => return m.payload().map(|p| p.to_vec()),
                Some(Err(e)) => panic!("consume: {e}"),
                None => {}
            }
        }
        None
    })
    .await
    .unwrap();
    assert_eq!(
        got.as_deref(),
        Some(payload.as_bytes()),
        "nothing consumed over {listener}"
    );
}

#[tokio::test]
async fn produces_and_consumes_over_plaintext() {
    round_trip("PLAINTEXT", "").await;
}

#[tokio::test]
async fn produces_and_consumes_over_sasl_plaintext_scram() {
    round_trip("SASL_PLAINTEXT", "").await;
}

#[tokio::test]
async fn produces_and_consumes_over_sasl_ssl_scram() {
    round_trip("SASL_SSL", "").await;
}

#[tokio::test]
async fn produces_and_consumes_over_mtls_as_the_limited_principal() {
    round_trip("SSL", &stack().acl_prefix).await;
}

#[tokio::test]
async fn limited_principal_is_refused_without_an_acl() {
    let s = stack();
    let topic = unique("no-acl");
    create_topic(&topic, 1).await;
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", &s.bootstrap_sasl_ssl)
        .set("security.protocol", "SASL_SSL")
        .set("sasl.mechanism", "SCRAM-SHA-512")
        .set("sasl.username", &s.limited_user)
        .set("sasl.password", &s.limited_password)
        .set("ssl.ca.location", &s.ca_pem)
        .set("message.timeout.ms", "15000")
        .create()
        .expect("producer");
    let err = producer
        .send(
            FutureRecord::to(&topic).key("k").payload("x"),
            Duration::from_secs(20),
        )
        .await
        .expect_err("the limited principal must not write here");
    assert!(
        matches!(
            err.0,
            KafkaError::MessageProduction(RDKafkaErrorCode::TopicAuthorizationFailed)
        ),
        "expected TOPIC_AUTHORIZATION_FAILED, got {:?}",
        err.0
    );
}

#[tokio::test]
async fn registers_a_schema_and_reads_it_back_by_id() {
    let s = stack();
    let http = reqwest::Client::new();
    let subject = unique("smoke-subject");
    let schema = r#"{"type":"record","name":"Ping","namespace":"smoke","fields":[{"name":"n","type":"long"}]}"#;
    let resp: serde_json::Value = http
        .post(format!("{}/subjects/{subject}/versions", s.registry_url))
        .header("Content-Type", "application/vnd.schemaregistry.v1+json")
        .json(&serde_json::json!({ "schema": schema }))
        .send()
        .await
        .expect("register")
        .error_for_status()
        .expect("register status")
        .json()
        .await
        .expect("register json");
    let id = resp["id"].as_i64().expect("id");
    let got: serde_json::Value = http
        .get(format!("{}/schemas/ids/{id}", s.registry_url))
        .send()
        .await
        .expect("get")
        .error_for_status()
        .expect("get status")
        .json()
        .await
        .expect("get json");
    let stored: serde_json::Value =
        serde_json::from_str(got["schema"].as_str().expect("schema text")).unwrap();
    let sent: serde_json::Value = serde_json::from_str(schema).unwrap();
    assert_eq!(stored, sent);
}
