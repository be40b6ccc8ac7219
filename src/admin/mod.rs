//! The daemon's own HTTP server: `/metrics`, `/healthz`, `/livez`, `/readyz`, and the produce
//! API's routes (`crate::produce::api`).

pub mod health;

use std::net::SocketAddr;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::{Json, Router};
use metrics_exporter_prometheus::PrometheusHandle;
use tokio_util::sync::CancellationToken;

use crate::admin::health::HealthRegistry;

#[derive(Clone)]
struct AdminState {
    metrics: Option<PrometheusHandle>,
    health: HealthRegistry,
}

/// Serves the admin endpoints on `addr` until `shutdown` fires.
pub async fn serve(
    listener: tokio::net::TcpListener,
    metrics: Option<PrometheusHandle>,
    health: HealthRegistry,
    extra: Router,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let state = AdminState { metrics, health };
    let app = Router::new()
        .route("/metrics", get(metrics_handler))
        .route("/healthz", get(alive_handler))
        // The Kubernetes liveness probe's path (deploy/helm); for now it answers as /healthz.
        .route("/livez", get(alive_handler))
        .route("/readyz", get(ready_handler))
        .with_state(state)
        .merge(extra);
    axum::serve(listener, app)
        .with_graceful_shutdown(async move { shutdown.cancelled().await })
        .await
}

/// Binds the admin server's address. A daemon that cannot serve `/readyz` would never be
/// ready and could not be scraped, so the caller stops with this error.
pub async fn bind(addr: SocketAddr) -> anyhow::Result<tokio::net::TcpListener> {
    let listener = tokio::net::TcpListener::bind(addr).await.map_err(|e| {
        anyhow::anyhow!(
            "cannot listen on {addr} (server.listen) for /metrics, /healthz, /readyz and the \
             produce API: {e}"
        )
    })?;
    tracing::info!(addr = %listener.local_addr().unwrap_or(addr), "admin server listening");
    Ok(listener)
}

/// The process is up and its admin server answers.
async fn alive_handler() -> Json<serde_json::Value> {
    Json(serde_json::json!({"status": "ok"}))
}

async fn metrics_handler(State(state): State<AdminState>) -> impl IntoResponse {
    match state.metrics {
        Some(h) => (StatusCode::OK, crate::telemetry::metrics::render(&h)),
        None => (
            StatusCode::SERVICE_UNAVAILABLE,
            "metrics recorder not installed".to_owned(),
        ),
    }
}

/// 200 when every connection is ready, else 503; the body says why per connection.
async fn ready_handler(State(state): State<AdminState>) -> impl IntoResponse {
    let connections = state.health.snapshot();
    let ready = connections.values().all(|c| c.is_ready());
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let body = serde_json::json!({
        "status": if ready { "ready" } else { "not_ready" },
        "connections": connections,
    });
    (status, Json(body))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `/livez` (the chart's liveness probe) and `/healthz` answer 200 with the same body.
    #[tokio::test]
    async fn livez_answers_like_healthz() {
        let listener = bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let shutdown = CancellationToken::new();
        let server = tokio::spawn(serve(
            listener,
            None,
            HealthRegistry::default(),
            Router::new(),
            shutdown.clone(),
        ));
        let mut bodies = Vec::new();
        for path in ["/livez", "/healthz"] {
            let resp = reqwest::get(format!("http://{addr}{path}")).await.unwrap();
            assert_eq!(resp.status(), 200, "{path}");
            bodies.push(resp.json::<serde_json::Value>().await.unwrap());
        }
        assert_eq!(bodies[0], serde_json::json!({"status": "ok"}));
        assert_eq!(bodies[0], bodies[1]);
        shutdown.cancel();
        server.await.unwrap().unwrap();
    }
}
