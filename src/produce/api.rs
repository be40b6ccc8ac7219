//! `POST /v1/connections/{connection}/messages` on the daemon's HTTP server.
//!
//! Order of checks: bearer token (401), connection (404), body size (413), request shape
//! (400), batch size (413), token grant per topic (403); then the publisher's own checks
//! (unknown topic 404, schema mismatch 422, broker refusal 403, timeout 504). Every refusal
//! is a JSON body `{"error": "..."}`; nothing is written unless every message passed.

use std::collections::HashMap;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use serde_json::json;
use subtle::ConstantTimeEq;

use super::{parse_request, ProduceError, Publisher, RequestError};
use crate::config::ProduceConfig;

/// The produce API's state: one publisher per producing connection, and the tokens.
pub struct ProduceApi {
    /// Replaced whole when a connection starts or stops, or a reload changes the tokens:
    /// a request reads it once.
    routes: std::sync::RwLock<Arc<Routes>>,
}

/// The publishers of the connections running now, and the tokens and limits.
struct Routes {
    publishers: HashMap<String, Arc<Publisher>>,
    /// Connections this daemon runs with a producer, whether or not their publisher is there
    /// now: one starting, or starting again after an error, is answered 503 (try again),
    /// not 404.
    running: std::collections::BTreeSet<String>,
    config: ProduceConfig,
}

impl std::fmt::Debug for ProduceApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let routes = self.routes();
        f.debug_struct("ProduceApi")
            .field("connections", &routes.publishers.keys().collect::<Vec<_>>())
            .field("tokens", &routes.config.tokens.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl ProduceApi {
    /// The API over `publishers` with `config`'s tokens and limits.
    pub fn new(publishers: HashMap<String, Arc<Publisher>>, config: ProduceConfig) -> Self {
        Self {
            routes: std::sync::RwLock::new(Arc::new(Routes {
                publishers,
                running: std::collections::BTreeSet::new(),
                config,
            })),
        }
    }

    fn routes(&self) -> Arc<Routes> {
        Arc::clone(&self.routes.read().unwrap_or_else(|p| p.into_inner()))
    }

    fn update(
        &self,
        change: impl FnOnce(&mut HashMap<String, Arc<Publisher>>, &mut ProduceConfig),
    ) {
        let mut routes = self.routes.write().unwrap_or_else(|p| p.into_inner());
        let mut publishers = routes.publishers.clone();
        let mut config = routes.config.clone();
        change(&mut publishers, &mut config);
        *routes = Arc::new(Routes {
            publishers,
            running: routes.running.clone(),
            config,
        });
    }

    /// The connections this daemon runs with a producer (set at start and at each reload or
    /// placement): while one has no publisher (its clients are being made, or it starts again
    /// after an error) its requests are answered 503 with `Retry-After`.
    pub fn set_running(&self, names: impl IntoIterator<Item = String>) {
        let mut routes = self.routes.write().unwrap_or_else(|p| p.into_inner());
        *routes = Arc::new(Routes {
            publishers: routes.publishers.clone(),
            running: names.into_iter().collect(),
            config: routes.config.clone(),
        });
    }

    /// `connection`'s publisher, while it runs (None: it stopped or cannot start).
    pub fn set_publisher(&self, connection: &str, publisher: Option<Arc<Publisher>>) {
        self.update(|publishers, _| match publisher {
            Some(p) => {
                let _ = publishers.insert(connection.to_owned(), p);
            }
            None => {
                let _ = publishers.remove(connection);
            }
        });
    }

    /// The tokens and limits of a reloaded configuration.
    pub fn set_config(&self, config: ProduceConfig) {
        self.update(|_, c| *c = config);
    }

    /// The routes, to merge into the daemon's router.
    pub fn router(self: Arc<Self>) -> Router {
        Router::new()
            .route("/v1/connections/{connection}/messages", post(produce))
            .with_state(self)
    }
}

impl Routes {
    /// The name of the token presented, compared in constant time against every token.
    fn authenticate(&self, headers: &HeaderMap) -> Result<&str, &'static str> {
        let presented = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| {
                let (scheme, token) = v.split_once(' ')?;
                scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
            });
        let Some(presented) = presented else {
            return Err("missing bearer token (Authorization: Bearer <token>)");
        };
        let mut found = None;
        for (name, grant) in &self.config.tokens {
            // Every token is compared, match or not, so timing does not tell which matched.
            let equal: bool = grant
                .token
                .expose()
                .as_bytes()
                .ct_eq(presented.as_bytes())
                .into();
            if equal && found.is_none() {
                found = Some(name.as_str());
            }
        }
        found.ok_or("invalid bearer token")
    }
}

fn refuse(status: u16, message: &str) -> Response {
    let code = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut resp = (code, Json(json!({ "error": message }))).into_response();
    if status == 401 {
        let _ = resp.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            header::HeaderValue::from_static("Bearer"),
        );
    }
    resp
}

async fn produce(
    State(api): State<Arc<ProduceApi>>,
    Path(connection): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let routes = api.routes();
    let resp = handle(&routes, &connection, &headers, body).await;
    // Only configured connection names become labels.
    let label = if routes.publishers.contains_key(&connection) {
        connection.as_str()
    } else {
        "unknown"
    };
    crate::telemetry::metrics::produce_request(label, resp.status().as_u16());
    resp
}

async fn handle(api: &Routes, connection: &str, headers: &HeaderMap, body: Body) -> Response {
    if api.config.tokens.is_empty() {
        return refuse(
            404,
            "the produce API is off: no [produce.tokens] are configured",
        );
    }
    let token = match api.authenticate(headers) {
        Ok(t) => t.to_owned(),
        Err(reason) => return refuse(401, reason),
    };
    let Some(publisher) = api.publishers.get(connection) else {
        if api.running.contains(connection) {
            let mut resp = refuse(
                503,
                &format!(
                    "connection {connection:?} is not ready: it is starting, or starting again \
                     after an error (see GET /health); try again"
                ),
            );
            let _ = resp
                .headers_mut()
                .insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
            return resp;
        }
        return refuse(404, &format!("unknown connection {connection:?}"));
    };
    let limit = api.config.max_body_bytes;
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    let too_large = || {
        refuse(
            413,
            &format!("the body exceeds {limit} bytes (produce.max_body_bytes)"),
        )
    };
    if declared.is_some_and(|n| n > limit) {
        return too_large();
    }
    let Ok(bytes) = axum::body::to_bytes(body, limit).await else {
        return too_large();
    };
    let request = match parse_request(&bytes, api.config.max_batch_messages) {
        Ok(r) => r,
        Err(e @ RequestError::TooMany { .. }) => return refuse(413, &e.to_string()),
        Err(e) => return refuse(400, &e.to_string()),
    };
    let grant = &api.config.tokens[&token];
    for (i, m) in request.messages.iter().enumerate() {
        if !grant.allows(connection, &m.topic) {
            let msg = format!(
                "messages[{i}]: token {token:?} may not produce to topic {:?} on connection {connection:?}",
                m.topic
            );
            return refuse(403, &msg);
        }
    }
    match publisher
        .publish(&request.messages, request.transactional)
        .await
    {
        Ok(written) => {
            tracing::debug!(connection, token = %token, records = written.len(), "produced");
            let body = if request.batch {
                json!({ "results": written, "transactional": request.transactional })
            } else {
                json!(written[0])
            };
            (StatusCode::OK, Json(body)).into_response()
        }
        Err(e) => {
            log_failure(connection, &token, &e);
            let mut body = json!({ "error": e.to_string() });
            if let Some(results) = e.results() {
                body["results"] = json!(results);
            }
            let code = StatusCode::from_u16(e.status()).unwrap_or(StatusCode::BAD_GATEWAY);
            (code, Json(body)).into_response()
        }
    }
}

fn log_failure(connection: &str, token: &str, e: &ProduceError) {
    if e.status() >= 500 {
        tracing::warn!(connection, token, status = e.status(), error = %e, "produce request failed");
    } else {
        tracing::info!(connection, token, status = e.status(), error = %e, "produce request refused");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOKEN: &str = "0123456789abcdef-unit";

    async fn answer(api: &ProduceApi, connection: &str) -> (u16, Option<String>) {
        let config: ProduceConfig = toml::from_str(&format!(
            "[tokens.t]\ntoken = \"{TOKEN}\"\nconnections = [\"*\"]\ntopics = [\"*\"]\n"
        ))
        .expect("produce config");
        api.update(|_, c| *c = config);
        let mut headers = HeaderMap::new();
        let _ = headers.insert(
            header::AUTHORIZATION,
            header::HeaderValue::from_str(&format!("Bearer {TOKEN}")).expect("header"),
        );
        let resp = handle(&api.routes(), connection, &headers, Body::from("{}")).await;
        let retry_after = resp
            .headers()
            .get(header::RETRY_AFTER)
            .map(|v| v.to_str().unwrap_or_default().to_owned());
        (resp.status().as_u16(), retry_after)
    }

    #[tokio::test]
    async fn a_connection_without_its_publisher_yet_is_answered_503_and_an_unknown_one_404() {
        let api = ProduceApi::new(HashMap::new(), ProduceConfig::default());
        api.set_running(["orders".to_owned()]);
        assert_eq!(answer(&api, "orders").await, (503, Some("1".to_owned())));
        assert_eq!(answer(&api, "nope").await, (404, None));
        // A reload that drops the connection: unknown again.
        api.set_running(Vec::new());
        assert_eq!(answer(&api, "orders").await, (404, None));
    }
}
