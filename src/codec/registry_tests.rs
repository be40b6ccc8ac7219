//! Unit tests of `registry`.
#[test]
fn topic_name_strategy_subjects_are_matched_exactly() {
    assert!(is_topic_subject("orders-value", "orders", "value"));
    assert!(is_topic_subject("orders-key", "orders", "key"));
    assert!(is_topic_subject("a-b-value", "a-b", "value"));
    for (subject, topic) in [
        ("orders-value", "order"),
        ("ordersvalue", "orders"),
        ("orders-values", "orders"),
        ("orders-key", "orders-key"),
        ("xorders-value", "orders"),
    ] {
        assert!(
            !is_topic_subject(subject, topic, "value"),
            "{subject} {topic}"
        );
    }
}
use super::*;

#[tokio::test]
async fn a_registry_behind_a_private_ca_is_reached_with_the_configured_client_certificate() {
    use crate::tls::testing::{mtls_server, Pki};
    let pki = Pki::new("registry test CA", true);
    let (port, seen) = mtls_server(&pki).await;
    let url = url::Url::parse(&format!("https://127.0.0.1:{port}")).unwrap();
    let config = RegistryConfig {
        ca_location: Some(pki.path("ca.pem")),
        certificate_location: Some(pki.path("client.pem")),
        key_location: Some(pki.path("client.key")),
        ..RegistryConfig::new(crate::config::Endpoint::new(url))
    };
    RegistryClient::try_new(&config)
        .unwrap()
        .probe()
        .await
        .expect("the TLS registry answers");
    // Without the client certificate the server refuses the handshake.
    let without = RegistryConfig {
        certificate_location: None,
        key_location: None,
        ..config
    };
    let refused = RegistryClient::try_new(&without).unwrap().probe().await;
    assert!(
        matches!(refused, Err(RegistryError::Unavailable(_))),
        "{refused:?}"
    );
    let seen = seen.lock().unwrap();
    // One GET /subjects, bodiless, with one client certificate; one refused handshake.
    assert_eq!(seen.requests, [(String::new(), 1)]);
    assert_eq!(seen.refused, 1);
}

#[test]
fn classifies_registry_statuses() {
    assert!(matches!(
        classify_status(404, 40403, String::new(), 7),
        RegistryError::SchemaNotFound { id: 7 }
    ));
    assert!(matches!(
        classify_status(401, 0, String::new(), 7),
        RegistryError::Unauthorized { status: 401, .. }
    ));
    assert!(matches!(
        classify_status(403, 0, String::new(), 7),
        RegistryError::Unauthorized { .. }
    ));
    assert!(matches!(
        classify_status(429, 0, String::new(), 7),
        RegistryError::Unavailable(_)
    ));
    assert!(matches!(
        classify_status(503, 0, String::new(), 7),
        RegistryError::Unavailable(_)
    ));
    assert!(matches!(
        classify_status(422, 42201, String::new(), 7),
        RegistryError::Invalid { .. }
    ));
}

#[test]
fn compiles_proto_text_with_a_well_known_import() {
    let text = r#"syntax = "proto3"; package t; import "google/protobuf/timestamp.proto";
        message A { int32 x = 1; } message B { google.protobuf.Timestamp at = 1; A a = 2; }"#;
    let compiled = compile(5, SchemaType::Protobuf, text, &[]).unwrap();
    let CompiledSchema::Protobuf { file } = compiled else {
        panic!()
    };
    let names: Vec<_> = file.messages().map(|m| m.full_name().to_owned()).collect();
    assert_eq!(names, vec!["t.A", "t.B"]);
}

#[test]
fn compiles_avro_with_a_reference() {
    let child = r#"{"type":"record","name":"Address","namespace":"t","fields":[{"name":"city","type":"string"}]}"#;
    let parent = r#"{"type":"record","name":"Customer","namespace":"t","fields":[{"name":"home","type":"t.Address"}]}"#;
    let refs = vec![(
        "t.Address".to_owned(),
        SchemaResponse {
            schema: child.to_owned(),
            schema_type: None,
            references: vec![],
        },
    )];
    let compiled = compile(9, SchemaType::Avro, parent, &refs).unwrap();
    assert!(matches!(compiled, CompiledSchema::Avro { .. }));
}
