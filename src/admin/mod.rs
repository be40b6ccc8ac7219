//! The daemon's own HTTP server: `/metrics`, the probes and the produce API's routes
//! (`crate::produce::api`).
//!
//! - `/livez` (liveness): 503 when a connection's event loop has made no turn for
//!   [`health::LIVENESS_BOUND`]; restarting the process is then the fix.
//! - `/readyz` (readiness): 200 while this server answers. It starts only once the
//!   configuration is loaded and every client is built, and it serves the produce API on the
//!   same port, so answering is being ready. Downstream trouble of one tenant (a registry or
//!   dispatcher outage, stalled partitions, a stopped trigger, brokers down) never makes it
//!   false: taking the pod out of its Service would stop the produce API and block rolling
//!   updates for a reason a restart cannot fix.
//! - `/health`: that downstream state, per connection, as JSON (503 when a connection is
//!   degraded, for people and scripts; not a probe); with a region cluster, also this
//!   replica's place in the region and which connections it runs and why (`region`).
//! - `/healthz`: a constant `ok`, kept for existing checks (the image's HEALTHCHECK).

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
        .route("/livez", get(live_handler))
        .route("/readyz", get(ready_handler))
        .route("/health", get(health_handler))
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
            "cannot listen on {addr} (server.listen) for /metrics, the probes and the produce \
             API: {e}"
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

/// 200 while every connection's event loop turns, else 503 naming the wedged ones.
async fn live_handler(State(state): State<AdminState>) -> impl IntoResponse {
    liveness(&state.health, std::time::Instant::now())
}

/// `/livez`'s answer at `now`.
fn liveness(
    health: &HealthRegistry,
    now: std::time::Instant,
) -> (StatusCode, Json<serde_json::Value>) {
    let wedged = health.wedged(now, health::LIVENESS_BOUND);
    let failing = health.failing_restarts();
    if !failing.is_empty() {
        tracing::error!(connections = ?failing.keys().collect::<Vec<_>>(),
            "a connection panics again after every restart");
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(serde_json::json!({
                "status": "restarts_failing",
                "panics_in_a_row": failing,
            })),
        );
    }
    if wedged.is_empty() {
        return (StatusCode::OK, Json(serde_json::json!({"status": "ok"})));
    }
    let silent_ms: serde_json::Map<String, serde_json::Value> = wedged
        .into_iter()
        .map(|(name, silent)| (name, (silent.as_millis() as u64).into()))
        .collect();
    tracing::error!(connections = ?silent_ms.keys().collect::<Vec<_>>(),
        bound_s = health::LIVENESS_BOUND.as_secs(), "event loop made no turn within the liveness bound");
    (
        StatusCode::SERVICE_UNAVAILABLE,
        Json(serde_json::json!({
            "status": "wedged",
            "event_loop_silent_ms": silent_ms,
        })),
    )
}

/// The daemon is up and serving: this server (and the produce API on it) answers, which it
/// does only after the configuration is loaded. See the module docs for why nothing
/// downstream is looked at.
async fn ready_handler() -> Json<serde_json::Value> {
    Json(serde_json::json!({"status": "ready"}))
}

/// 200 when every connection is healthy, else 503; the body says why per connection, and
/// how long ago its event loop last turned (`event_loop_silent_ms`, while it runs).
async fn health_handler(State(state): State<AdminState>) -> impl IntoResponse {
    let connections = state.health.snapshot();
    let healthy = connections.values().all(|c| c.is_healthy());
    let status = if healthy {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let mut detail = serde_json::to_value(&connections).unwrap_or_default();
    let now = std::time::Instant::now();
    for (name, last) in state.health.last_turns() {
        if let (Some(c), Some(last)) = (detail.get_mut(&name), last) {
            let silent = now.saturating_duration_since(last).as_millis() as u64;
            c["event_loop_silent_ms"] = silent.into();
        }
    }
    let mut body = serde_json::json!({
        "status": if healthy { "healthy" } else { "degraded" },
        "connections": detail,
    });
    // With a region cluster: which connections run here and why.
    if let Some(region) = state.health.region() {
        body["region"] = region;
    }
    (status, Json(body))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admin::health::ConnectionHealth;

    /// Blocked event loops: `/livez` answers 200 within the bound after their last turn,
    /// then 503 naming each connection and how long it has been silent; a stopped loop (its
    /// heartbeat retired) is not judged. Which loops count as wedged is tested in `health`.
    #[test]
    fn livez_fails_once_a_loop_is_silent_past_the_bound() {
        let health = HealthRegistry::default();
        let orders = health.heartbeat("orders");
        let payments = health.heartbeat("payments");
        let before = std::time::Instant::now();
        orders.beat();
        payments.beat();
        let after = std::time::Instant::now();
        let bound = health::LIVENESS_BOUND;
        let second = std::time::Duration::from_secs(1);
        let (status, Json(body)) = liveness(&health, before + bound - second);
        assert_eq!(
            (status, body),
            (StatusCode::OK, serde_json::json!({"status": "ok"}))
        );
        let (status, Json(body)) = liveness(&health, after + bound + 2 * second);
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(body["status"], "wedged");
        for name in ["orders", "payments"] {
            let silent = body["event_loop_silent_ms"][name].as_u64().unwrap();
            assert!((32_000..33_000).contains(&silent), "{body}");
        }
        orders.retire();
        payments.retire();
        let (status, _) = liveness(&health, after + bound * 10);
        assert_eq!(status, StatusCode::OK);
    }

    /// The probes of a daemon whose only connection reports a stall, its registry down and a
    /// stopped trigger, while its event loop turns: alive and ready, and `/health` says why
    /// the connection is degraded.
    #[tokio::test]
    async fn downstream_trouble_shows_in_health_and_never_in_the_probes() {
        let listener = bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let health = HealthRegistry::default();
        health.heartbeat("orders").beat();
        let degraded = ConnectionHealth {
            brokers_up: true,
            registry_reachable: false,
            assigned_partitions: 2,
            stalled_partitions: [("orders[0]".to_owned(), "key parked".to_owned())].into(),
            stopped_triggers: [("t".to_owned(), "HTTP 401".to_owned())].into(),
            ..ConnectionHealth::default()
        };
        health.set("orders", degraded);
        let shutdown = CancellationToken::new();
        let server = tokio::spawn(serve(
            listener,
            None,
            health.clone(),
            Router::new(),
            shutdown.clone(),
        ));
        let get = |path: &'static str| async move {
            let resp = reqwest::get(format!("http://{addr}{path}")).await.unwrap();
            let status = resp.status().as_u16();
            (status, resp.json::<serde_json::Value>().await.unwrap())
        };
        assert_eq!(
            get("/livez").await,
            (200, serde_json::json!({"status": "ok"}))
        );
        assert_eq!(
            get("/healthz").await,
            (200, serde_json::json!({"status": "ok"}))
        );
        assert_eq!(
            get("/readyz").await,
            (200, serde_json::json!({"status": "ready"}))
        );
        let (status, body) = get("/health").await;
        assert_eq!(status, 503);
        assert_eq!(body["status"], "degraded");
        let orders = &body["connections"]["orders"];
        // Beaten just before the server started.
        assert!(
            orders["event_loop_silent_ms"]
                .as_u64()
                .is_some_and(|ms| ms < 10_000),
            "{body}"
        );
        assert_eq!(orders["registry_reachable"], false);
        assert_eq!(orders["assigned_partitions"], 2);
        assert_eq!(orders["stalled_partitions"]["orders[0]"], "key parked");
        assert_eq!(orders["stopped_triggers"]["t"], "HTTP 401");
        health.set(
            "orders",
            ConnectionHealth {
                brokers_up: true,
                registry_reachable: true,
                ..ConnectionHealth::default()
            },
        );
        let (status, body) = get("/health").await;
        assert_eq!(
            (status, &body["status"]),
            (200, &serde_json::json!("healthy"))
        );
        shutdown.cancel();
        server.await.unwrap().unwrap();
    }
}
