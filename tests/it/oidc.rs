//! OAUTHBEARER with OIDC client credentials, without a broker: the daemon's consumer, built
//! from a pasted Java `sasl.jaas.config` (OAuthBearerLoginModule), asks a local token
//! endpoint for a token with the client id, secret and scope, as librdkafka's OIDC flow does.
//! (No OAUTHBEARER listener exists in the test stack, so the token is not presented to a
//! broker here.)

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::routing::post;
use axum::{Json, Router};
use base64::Engine as _;
use tessel_kafka::app::App;
use tessel_kafka::config::Config;

use crate::support::wait_for;

#[derive(Clone, Debug)]
struct TokenRequest {
    authorization: String,
    body: String,
}

type Seen = Arc<Mutex<Vec<TokenRequest>>>;

fn jwt(sub: &str) -> String {
    let b64 = |v: serde_json::Value| {
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string())
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    format!(
        "{}.{}.c2lnbmF0dXJl",
        b64(serde_json::json!({"alg": "RS256", "typ": "JWT"})),
        b64(serde_json::json!({"sub": sub, "iat": now, "exp": now + 3600}))
    )
}

async fn token(
    State(seen): State<Seen>,
    headers: HeaderMap,
    body: Bytes,
) -> Json<serde_json::Value> {
    seen.lock().unwrap().push(TokenRequest {
        authorization: headers
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned(),
        body: String::from_utf8_lossy(&body).into_owned(),
    });
    Json(serde_json::json!({
        "access_token": jwt("tessel"),
        "token_type": "bearer",
        "expires_in": 3600
    }))
}

#[tokio::test]
async fn oidc_client_credentials_are_fetched_from_the_token_endpoint() {
    let seen: Seen = Arc::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = Router::new()
        .route("/oauth2/token", post(token))
        .with_state(Arc::clone(&seen));
    drop(tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    }));
    let unused = crate::support::free_port();
    let toml = format!(
        r#"
[connections.oidc.kafka]
"bootstrap.servers" = "127.0.0.1:{unused}"
"security.protocol" = "SASL_PLAINTEXT"
"sasl.mechanism" = "OAUTHBEARER"
"sasl.oauthbearer.token.endpoint.url" = "http://{addr}/oauth2/token"
"sasl.login.callback.handler.class" = "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginCallbackHandler"
"sasl.jaas.config" = 'org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required clientId="tessel-client" clientSecret="oidc-s3cret" scope="kafka.read";'
"group.id" = "tessel-oidc"
[connections.oidc.triggers.t]
topics = ["payments"]
workflow = "w"
dispatcher = {{ url = "http://127.0.0.1:{unused}/runs" }}
"#
    );
    let config = Config::from_toml_with_env(&toml, Vec::new()).expect("valid config");
    assert!(!format!("{config:?}").contains("oidc-s3cret"));
    // Starting the daemon creates the connection's consumer, whose OIDC flow fetches a
    // token at once.
    let app = App::build(config).expect("app builds");
    let token = tokio_util::sync::CancellationToken::new();
    let running = tokio::spawn(app.run(token.clone(), false));
    let request = wait_for("a token request", Duration::from_secs(30), || {
        seen.lock().unwrap().first().cloned()
    })
    .await;
    token.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(30), running).await;
    let expected = base64::engine::general_purpose::STANDARD.encode("tessel-client:oidc-s3cret");
    assert_eq!(request.authorization, format!("Basic {expected}"));
    assert!(
        request.body.contains("grant_type=client_credentials"),
        "{}",
        request.body
    );
    assert!(
        request.body.contains("scope=kafka.read"),
        "{}",
        request.body
    );
}
