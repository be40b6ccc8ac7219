//! Schema Registry authentication against a local stand-in registry: basic auth (Confluent
//! Cloud's registry API key), bearer token, the registry's refusal, and `check`'s line for it.

use std::sync::{Arc, Mutex};

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::get;
use axum::Router;
use base64::Engine as _;
use tessel_kafka::codec::registry::{RegistryClient, RegistryError};
use tessel_kafka::config::{Config, RegistryConfig};

/// A registry that answers `GET /subjects` when the Authorization header is `expected`.
async fn registry(expected: String) -> (String, Arc<Mutex<Vec<String>>>) {
    let seen: Arc<Mutex<Vec<String>>> = Arc::default();
    let state = (expected, Arc::clone(&seen));
    let app = Router::new()
        .route(
            "/subjects",
            get(
                |State((expected, seen)): State<(String, Arc<Mutex<Vec<String>>>)>,
                 headers: HeaderMap| async move {
                    let got = headers
                        .get("authorization")
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or_default()
                        .to_owned();
                    seen.lock().unwrap().push(got.clone());
                    if got == expected {
                        (StatusCode::OK, "[]")
                    } else {
                        (
                            StatusCode::UNAUTHORIZED,
                            r#"{"error_code":401,"message":"Unauthorized"}"#,
                        )
                    }
                },
            ),
        )
        .with_state(state);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    drop(tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    }));
    (url, seen)
}

fn registry_config(toml_fields: &str, url: &str) -> RegistryConfig {
    let text = format!(
        r#"
[connections.c.kafka]
"bootstrap.servers" = "127.0.0.1:1"
"group.id" = "g"
[connections.c.schema_registry]
url = "{url}"
{toml_fields}
[connections.c.triggers.t]
topics = ["x"]
workflow = "w"
dispatcher = {{ url = "http://127.0.0.1:1/" }}
"#
    );
    let config = Config::from_toml_with_env(&text, Vec::new()).expect("valid config");
    config.connections["c"]
        .schema_registry
        .clone()
        .expect("registry")
}

#[tokio::test]
async fn basic_auth_sends_the_api_key_and_secret() {
    let expected = format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode("SR-KEY:sr-s3cret")
    );
    let (url, seen) = registry(expected.clone()).await;
    let cfg = registry_config("username = \"SR-KEY\"\npassword = \"sr-s3cret\"", &url);
    assert!(!format!("{cfg:?}").contains("sr-s3cret"));
    let client = RegistryClient::try_new(&cfg).unwrap();
    client.probe().await.expect("accepted");
    assert_eq!(seen.lock().unwrap().as_slice(), [expected]);

    let wrong = registry_config("username = \"SR-KEY\"\npassword = \"wrong\"", &url);
    let err = RegistryClient::try_new(&wrong)
        .unwrap()
        .probe()
        .await
        .unwrap_err();
    assert!(
        matches!(err, RegistryError::Unauthorized { status: 401, .. }),
        "{err}"
    );
    assert!(!err.to_string().contains("wrong"), "{err}");
}

#[tokio::test]
async fn bearer_token_is_sent_as_authorization() {
    let (url, seen) = registry("Bearer reg-tok3n".to_owned()).await;
    let cfg = registry_config("bearer_token = \"reg-tok3n\"", &url);
    assert!(!format!("{cfg:?}").contains("reg-tok3n"));
    RegistryClient::try_new(&cfg)
        .unwrap()
        .probe()
        .await
        .expect("accepted");
    assert_eq!(seen.lock().unwrap().as_slice(), ["Bearer reg-tok3n"]);
}

#[test]
fn unreadable_tls_files_are_named() {
    let cfg = registry_config(
        "ca_location = \"/nonexistent/registry-ca.pem\"",
        "https://registry.example",
    );
    let err = RegistryClient::try_new(&cfg).unwrap_err().to_string();
    assert!(err.contains("/nonexistent/registry-ca.pem"), "{err}");

    let dir = tempfile::tempdir().unwrap();
    let junk = dir.path().join("junk.pem");
    std::fs::write(&junk, "not a certificate").unwrap();
    let cfg = registry_config(
        &format!(
            "certificate_location = \"{0}\"\nkey_location = \"{0}\"",
            junk.display()
        ),
        "https://registry.example",
    );
    let err = RegistryClient::try_new(&cfg).unwrap_err().to_string();
    assert!(err.contains("junk.pem") && err.contains("PEM"), "{err}");
}
