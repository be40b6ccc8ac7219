//! Core pipeline: reference-serialized Avro, Protobuf and JSON Schema arrive at the dispatcher
//! as the documented JSON; offsets are committed only after acceptance.

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use serde_json::{json, Value};

use super::{committed, connection_toml, create_topic, dispatcher, reference_produce, Connector};
use crate::support::{stack, unique, wait_for};

const ORDER_AVRO: &str = r#"{"type":"record","name":"Order","namespace":"it","fields":[
 {"name":"id","type":"long"},
 {"name":"customer","type":{"type":"record","name":"Customer","fields":[
    {"name":"name","type":"string"},{"name":"email","type":["null","string"],"default":null}]}},
 {"name":"status","type":{"type":"enum","name":"Status","symbols":["NEW","PAID","SHIPPED"]}},
 {"name":"amount","type":{"type":"bytes","logicalType":"decimal","precision":10,"scale":2}},
 {"name":"placed_at","type":{"type":"long","logicalType":"timestamp-millis"}},
 {"name":"ship_date","type":{"type":"int","logicalType":"date"}},
 {"name":"tags","type":{"type":"array","items":"string"}},
 {"name":"attributes","type":{"type":"map","values":"long"}},
 {"name":"payload","type":"bytes"},
 {"name":"discount","type":["null","double","string"]}]}"#;

const ORDER_KEY_AVRO: &str = r#"{"type":"record","name":"OrderKey","namespace":"it","fields":[{"name":"order_id","type":"long"}]}"#;

const COMMON_PROTO: &str = r#"syntax = "proto3";
package it.common;
message Money { string currency = 1; int64 units = 2; }
"#;

const SHIPMENT_PROTO: &str = r#"syntax = "proto3";
package it;
import "common.proto";
import "google/protobuf/timestamp.proto";
message Unused { string x = 1; }
message Shipment {
  message Address { string city = 1; string zip = 2; }
  enum Status { UNKNOWN = 0; SENT = 1; }
  string id = 1;
  Address to = 2;
  it.common.Money cost = 3;
  google.protobuf.Timestamp shipped_at = 4;
  oneof carrier { string ups = 5; string fedex = 6; }
  repeated string items = 7;
  int64 weight_grams = 8;
  Status status = 9;
  bool fragile = 10;
}
"#;

const PING_JSON_SCHEMA: &str = r#"{"$schema":"http://json-schema.org/draft-07/schema#","title":"Ping","type":"object",
 "properties":{"n":{"type":"integer"},"tags":{"type":"array","items":{"type":"string"}}},"required":["n"]}"#;

pub(super) fn event_validator() -> jsonschema::Validator {
    let text = std::fs::read_to_string(crate::support::repo().join("docs/event.schema.json"))
        .expect("schema file");
    let schema: Value = serde_json::from_str(&text).expect("schema json");
    jsonschema::validator_for(&schema).expect("valid JSON Schema")
}

pub(super) fn assert_valid_event(v: &jsonschema::Validator, event: &Value) {
    let errors: Vec<String> = v
        .iter_errors(event)
        .map(|e| format!("{} at {}", e, e.instance_path))
        .collect();
    assert!(
        errors.is_empty(),
        "event does not validate: {errors:?}\n{event:#}"
    );
}

#[tokio::test]
async fn reference_serialized_values_arrive_as_the_documented_json() {
    let d = dispatcher(Default::default()).await;
    let avro_topic = unique("pipe-avro");
    let proto_topic = unique("pipe-proto");
    let json_topic = unique("pipe-json");
    for t in [&avro_topic, &proto_topic, &json_topic] {
        create_topic(t, 1).await;
    }
    let traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let avro = reference_produce(json!({
        "bootstrap": stack().bootstrap, "registry": stack().registry_url, "topic": avro_topic,
        "key": {"format": "avro", "schema": ORDER_KEY_AVRO},
        "value": {"format": "avro", "schema": ORDER_AVRO},
        "steps": [{"txn": null, "records": [
            {"key": {"order_id": 7}, "timestamp_ms": 1_700_000_000_123i64,
             "headers": [["h1", "a"], ["h1", "b"], ["bin", {"$bytes": "/w=="}], ["empty", null], ["traceparent", traceparent]],
             "value": {"id": 9_007_199_254_740_993i64, "customer": {"name": "ann", "email": "a@x"}, "status": "PAID",
                       "amount": {"$decimal": "1234.50"}, "placed_at": {"$datetime": "2024-03-01T12:34:56.789+00:00"},
                       "ship_date": {"$date": "2024-03-05"}, "tags": ["a", "b"], "attributes": {"x": 1, "y": 2},
                       "payload": {"$bytes": "AAEC"}, "discount": "ten"}},
            {"key": {"order_id": 8},
             "value": {"id": -1, "customer": {"name": "bo", "email": null}, "status": "NEW",
                       "amount": {"$decimal": "-0.05"}, "placed_at": {"$datetime": "1969-12-31T23:59:59.999+00:00"},
                       "ship_date": {"$date": "1970-01-01"}, "tags": [], "attributes": {},
                       "payload": {"$bytes": ""}, "discount": 2.5}}
        ]}]
    }))
    .await;
    let proto = reference_produce(json!({
        "bootstrap": stack().bootstrap, "registry": stack().registry_url, "topic": proto_topic,
        "key": {"format": "string"},
        "value": {"format": "protobuf", "message": "it.Shipment",
                  "proto_files": {"common.proto": COMMON_PROTO, "shipment.proto": SHIPMENT_PROTO}},
        "steps": [{"txn": null, "records": [
            {"key": "ship-1", "value": {"id": "s1", "to": {"city": "Oslo", "zip": "0150"},
              "cost": {"currency": "EUR", "units": "12"}, "shippedAt": "2024-03-01T12:00:00Z",
              "ups": "1Z999", "items": ["a", "b"], "weightGrams": "9007199254740993", "status": "SENT"}},
            {"key": "ship-2", "value": {"id": "s2", "fedex": "F-1"}}
        ]}]
    }))
    .await;
    let json_schema = reference_produce(json!({
        "bootstrap": stack().bootstrap, "registry": stack().registry_url, "topic": json_topic,
        "key": {"format": "string"},
        "value": {"format": "json_schema", "schema": PING_JSON_SCHEMA},
        "steps": [{"txn": null, "records": [{"key": "p", "value": {"n": 5, "tags": ["x"]}}]}]
    }))
    .await;

    let group = unique("pipe-group");
    let mut toml = connection_toml(&group, &avro_topic, &d.url(), "");
    for (name, topic) in [("proto", &proto_topic), ("json", &json_topic)] {
        toml.push_str(&format!(
            "[connections.it.triggers.{name}]\ntopics = [\"{topic}\"]\nworkflow = \"wf-{name}\"\ndispatcher = {{ url = \"{}\" }}\nvalue_format = \"schema_registry\"\n",
            d.url()
        ));
    }
    let connector = Connector::start(&toml);
    wait_for("5 runs", Duration::from_secs(60), || {
        (d.accepted() >= 5).then_some(())
    })
    .await;
    connector.stop().await;

    let runs = d.runs();
    assert_eq!(runs.len(), 5);
    assert_eq!(d.repeats(), 0);
    let validator = event_validator();
    for r in &runs {
        assert_valid_event(&validator, &r.event);
        assert_eq!(r.event["id"], Value::String(r.idempotency_key.clone()));
    }
    let by_topic = |t: &str| -> Vec<&Value> {
        let mut v: Vec<&Value> = runs
            .iter()
            .map(|r| &r.event)
            .filter(|e| e["topic"] == t)
            .collect();
        v.sort_by_key(|e| e["offset"].as_i64());
        v
    };

    // Avro, with an Avro key, headers, timestamp.
    let a = by_topic(&avro_topic);
    assert_eq!(a.len(), 2);
    assert_eq!(
        a[0]["value"],
        json!({"id": 9_007_199_254_740_993i64, "customer": {"name": "ann", "email": "a@x"}, "status": "PAID",
               "amount": "1234.50", "placed_at": "2024-03-01T12:34:56.789Z", "ship_date": "2024-03-05",
               "tags": ["a", "b"], "attributes": {"x": 1, "y": 2}, "payload": "AAEC", "discount": "ten"})
    );
    assert_eq!(
        a[1]["value"],
        json!({"id": -1, "customer": {"name": "bo", "email": null}, "status": "NEW", "amount": "-0.05",
               "placed_at": "1969-12-31T23:59:59.999Z", "ship_date": "1970-01-01", "tags": [], "attributes": {},
               "payload": "", "discount": 2.5})
    );
    assert_eq!(a[0]["key"], json!({"order_id": 7}));
    assert_eq!(a[0]["key_schema"]["format"], "avro");
    assert_eq!(a[0]["key_schema"]["name"], "it.OrderKey");
    assert_eq!(a[0]["value_schema"]["format"], "avro");
    assert_eq!(a[0]["value_schema"]["name"], "it.Order");
    assert!(a[0]["value_schema"]["id"].as_i64().unwrap() > 0);
    assert_eq!(
        a[0]["value_schema"]["subject"],
        format!("{avro_topic}-value")
    );
    assert_eq!(a[0]["partition"], 0);
    let offsets: Vec<i64> = avro["records"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["offset"].as_i64().unwrap())
        .collect();
    assert_eq!(
        a.iter()
            .map(|e| e["offset"].as_i64().unwrap())
            .collect::<Vec<_>>(),
        offsets
    );
    assert_eq!(a[0]["timestamp"], "2023-11-14T22:13:20.123Z");
    assert_eq!(a[0]["timestamp_ms"], 1_700_000_000_123i64);
    assert_eq!(a[0]["timestamp_type"], "create_time");
    assert_eq!(
        a[0]["headers"],
        json!([{"name": "h1", "value": "a", "encoding": "utf8"}, {"name": "h1", "value": "b", "encoding": "utf8"},
               {"name": "bin", "value": "/w==", "encoding": "base64"}, {"name": "empty", "value": null, "encoding": "utf8"},
               {"name": "traceparent", "value": traceparent, "encoding": "utf8"}])
    );
    let first = runs
        .iter()
        .find(|r| r.event["topic"] == avro_topic.as_str() && r.event["offset"] == 0)
        .unwrap();
    assert_eq!(first.traceparent.as_deref(), Some(traceparent));
    assert_eq!(
        first.idempotency_key,
        super::record_key(&group, &avro_topic, 0, 0)
    );

    // Protobuf: second message of its file, nested message, import (reference), oneof,
    // well-known type, 64-bit integers as strings, defaults written out.
    let p = by_topic(&proto_topic);
    assert_eq!(p.len(), 2);
    assert_eq!(p[0]["key"], "ship-1");
    assert_eq!(p[0]["key_schema"], json!({"format": "string"}));
    assert_eq!(
        p[0]["value"],
        json!({"id": "s1", "to": {"city": "Oslo", "zip": "0150"}, "cost": {"currency": "EUR", "units": "12"},
               "shipped_at": "2024-03-01T12:00:00Z", "ups": "1Z999", "items": ["a", "b"],
               "weight_grams": "9007199254740993", "status": "SENT", "fragile": false})
    );
    assert_eq!(
        p[1]["value"],
        json!({"id": "s2", "fedex": "F-1", "items": [],
               "weight_grams": "0", "status": "UNKNOWN", "fragile": false})
    );
    assert_eq!(p[0]["value_schema"]["format"], "protobuf");
    assert_eq!(p[0]["value_schema"]["name"], "it.Shipment");
    let _ = proto;

    // JSON Schema.
    let j = by_topic(&json_topic);
    assert_eq!(j.len(), 1);
    assert_eq!(j[0]["value"], json!({"n": 5, "tags": ["x"]}));
    assert_eq!(j[0]["value_schema"]["format"], "json_schema");
    assert_eq!(j[0]["value_schema"]["name"], "Ping");
    let _ = json_schema;
}

#[tokio::test]
async fn offset_is_committed_only_after_acceptance() {
    let topic = unique("pipe-commit");
    create_topic(&topic, 1).await;
    let group = unique("pipe-commit-group");
    let stuck = super::record_key(&group, &topic, 0, 2);
    let d = dispatcher(Default::default()).await;
    d.faults(|f| {
        f.fail_keys = HashSet::from([stuck.clone()]);
        f.fail_status = 500;
    });
    let records: Vec<Value> = (0..5)
        .map(|i| json!({"key": format!("k{i}"), "value": {"n": i}}))
        .collect();
    let _ = reference_produce(json!({
        "bootstrap": stack().bootstrap, "topic": topic,
        "key": {"format": "string"}, "value": {"format": "json"},
        "steps": [{"txn": null, "records": records}]
    }))
    .await;
    let toml = connection_toml(&group, &topic, &d.url(), "");
    let connector = Connector::start(&toml);
    wait_for("4 accepted runs", Duration::from_secs(60), || {
        (d.accepted() == 4).then_some(())
    })
    .await;
    // The stuck message has been retried, and the committed offset stays below it.
    let attempts_before = d.attempts();
    wait_for(
        "retries of the failing message",
        Duration::from_secs(30),
        || (d.attempts() >= attempts_before + 3).then_some(()),
    )
    .await;
    wait_for("committed offset 2", Duration::from_secs(30), || {
        (committed(&group, &topic, 1) == [2]).then_some(())
    })
    .await;
    connector.stop().await;
    assert_eq!(
        committed(&group, &topic, 1),
        vec![2],
        "shutdown must not commit past the failing message"
    );

    // After a restart the message is dispatched again with the same idempotency key; once the
    // dispatcher recovers it is accepted and the commit reaches the end.
    let connector = Connector::start(&toml);
    let attempts_before = d.attempts();
    wait_for("redelivery after restart", Duration::from_secs(60), || {
        (d.attempts() > attempts_before).then_some(())
    })
    .await;
    d.faults(|f| f.fail_keys.clear());
    wait_for("5 accepted runs", Duration::from_secs(60), || {
        (d.accepted() == 5).then_some(())
    })
    .await;
    wait_for("committed offset 5", Duration::from_secs(30), || {
        (committed(&group, &topic, 1) == [5]).then_some(())
    })
    .await;
    connector.stop().await;
    let runs = d.runs();
    let last = runs.last().unwrap();
    assert_eq!(last.idempotency_key, stuck);
    assert_eq!(last.event["offset"], 2);
    // Offsets 3 and 4 were accepted above the gap at 2; the commit metadata carried that over
    // the restart, so they were not offered again.
    assert_eq!(d.repeats(), 0, "no run offered again after it was accepted");
    let keys: BTreeMap<i64, String> = runs
        .iter()
        .map(|r| {
            (
                r.event["offset"].as_i64().unwrap(),
                r.idempotency_key.clone(),
            )
        })
        .collect();
    assert_eq!(keys.len(), 5);
}
