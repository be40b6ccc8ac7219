//! The daemon's own HTTP server: `/metrics`, `/healthz`, `/readyz`, and the produce API's
//! routes (`crate::produce::api`).

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
    addr: SocketAddr,
    metrics: Option<PrometheusHandle>,
    health: HealthRegistry,
    extra: Router,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let state = AdminState { metrics, health };
    let app = Router::new()
        .route("/metrics", get(metrics_handler))
        .route(
            "/healthz",
            get(|| async { Json(serde_json::json!({"status": "ok"})) }),
        )
        .route("/readyz", get(ready_handler))
        .with_state(state)
        .merge(extra);
    let listener = tokio::net::TcpListener::bind(addr).await?;
    tracing::info!(%addr, "admin server listening");
    axum::serve(listener, app)
        .with_graceful_shutdown(async move { shutdown.cancelled().await })
        .await
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
