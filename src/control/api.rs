//! The operator API and console on the admin listener (or `api.listen`):
//!
//! - `GET /console`: the web console (one page, no external assets);
//! - `GET /api/v1/whoami`: the token's name and grant;
//! - `GET /api/v1/status[?connection=&trigger=&parked=true&scope=local]`: the region's status
//!   ([`super::status`]); `scope=local`: this replica's part only;
//! - `POST /api/v1/connections/{c}/triggers/{t}/pause|resume` (`{"reason": …}` optional);
//! - `POST …/retry` (`{"topic", "partition", "offset"}`), `POST …/skip` (the same and a
//!   `"reason"`), `POST …/redrive` (`{"partitions", "from", "to", "dry_run"}`, all optional);
//! - `GET /api/v1/redrives[/{id}]`.
//!
//! Order of checks: token (401; 404 when no token is configured), grant (403), connection
//! and trigger (404), body (413, 400), then the action (404 not parked, 409 moved on, 503 a
//! store or dead-letter write failed, 504). Every refusal is `{"error": "…"}` and changes
//! nothing. Every action is logged with the token's name, its target and outcome (target
//! `tessel_kafka::audit`) and counted (`tessel_kafka_operator_actions_total`).

use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::json;

use super::auth::{authenticate, Caller};
use super::hub::{ApiError, ControlHub, StatusFilter};
use super::peers::{ACTION_TIMEOUT, FORWARDED_BY, REPLICA, STATUS_TIMEOUT, SYNC_TIMEOUT};
use super::status::{merge, RegionStatus, ReplicaStatus};
use super::trigger::{ActionOutcome, RunState, TargetState};
use crate::telemetry::metrics;

/// The largest request body.
const MAX_BODY: usize = 64 * 1024;
/// The longest reason an operator may give.
const MAX_REASON: usize = 500;

/// The console's page.
const CONSOLE: &str = include_str!("console/index.html");

/// The routes, to merge into the admin listener's.
pub fn router(hub: Arc<ControlHub>) -> Router {
    routes().with_state(hub)
}

/// The routes on a listener of their own (`api.listen`): any other path is a JSON 404.
pub fn standalone(hub: Arc<ControlHub>) -> Router {
    routes().fallback(not_found).with_state(hub)
}

fn routes() -> Router<Arc<ControlHub>> {
    Router::new()
        .route("/console", get(console))
        .route("/console/", get(console))
        .route("/api/v1/whoami", get(whoami))
        .route("/api/v1/status", get(status))
        .route(
            "/api/v1/connections/{connection}/triggers/{trigger}/{action}",
            post(action),
        )
        .route("/api/v1/redrives", get(redrives))
        .route("/api/v1/redrives/{id}", get(redrive))
        .route("/api/v1/internal/target-states", get(target_states))
}

/// The console's content security policy: its own inline script and style (by their
/// SHA-256) and calls to this API, nothing else.
fn console_policy() -> &'static str {
    static POLICY: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    POLICY.get_or_init(|| {
        let hash = |open: &str, close: &str| {
            use base64::Engine as _;
            use sha2::Digest as _;
            let body = CONSOLE
                .split_once(open)
                .and_then(|(_, rest)| rest.split_once(close))
                .map_or("", |(inner, _)| inner);
            let digest = sha2::Sha256::digest(body.as_bytes());
            format!("'sha256-{}'", base64::engine::general_purpose::STANDARD.encode(digest))
        };
        format!(
            "default-src 'none'; script-src {}; style-src {}; connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
            hash("<script>", "</script>"),
            hash("<style>", "</style>")
        )
    })
}

async fn console() -> Response {
    let mut resp = (StatusCode::OK, CONSOLE).into_response();
    let h = resp.headers_mut();
    let _ = h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    // The page loads nothing from elsewhere; it talks only to this API.
    if let Ok(policy) = HeaderValue::from_str(console_policy()) {
        let _ = h.insert(header::CONTENT_SECURITY_POLICY, policy);
    }
    let _ = h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    let _ = h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    resp
}

async fn not_found(State(hub): State<Arc<ControlHub>>) -> Response {
    refuse(
        &hub,
        &ApiError::NotFound("no such operator API path".to_owned()),
    )
}

/// `{"error": …}` with the error's status.
fn refuse(hub: &ControlHub, e: &ApiError) -> Response {
    let code = StatusCode::from_u16(e.status()).unwrap_or(StatusCode::BAD_REQUEST);
    let mut resp = (code, Json(json!({ "error": e.to_string() }))).into_response();
    if e.status() == 401 {
        let _ = resp
            .headers_mut()
            .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    }
    stamp(hub, resp)
}

/// Marks an answer with the replica that gave it.
fn stamp(hub: &ControlHub, mut resp: Response) -> Response {
    if let Ok(v) = HeaderValue::from_str(hub.replica_id()) {
        let _ = resp.headers_mut().insert(REPLICA, v);
    }
    let _ = resp
        .headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    resp
}

fn ok(hub: &ControlHub, body: serde_json::Value) -> Response {
    stamp(hub, (StatusCode::OK, Json(body)).into_response())
}

fn caller(hub: &ControlHub, headers: &HeaderMap) -> Result<Caller, ApiError> {
    authenticate(&hub.config().api, headers)
}

/// Whether the request was forwarded by a peer (it acts here only).
fn forwarded(headers: &HeaderMap) -> bool {
    headers.contains_key(FORWARDED_BY)
}

fn authorization(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
}

async fn whoami(State(hub): State<Arc<ControlHub>>, headers: HeaderMap) -> Response {
    match caller(&hub, &headers) {
        Ok(Caller::Token { name, grant }) => ok(
            &hub,
            json!({
                "token": name,
                "access": grant.access,
                "connections": grant.connections,
                "triggers": grant.triggers,
                "replica": hub.replica_id(),
                "region": hub.config().region.name,
            }),
        ),
        Ok(Caller::Peer) => refuse(
            &hub,
            &ApiError::Forbidden("the peer key reads target states only".to_owned()),
        ),
        Err(e) => refuse(&hub, &e),
    }
}

/// The query of `GET /api/v1/status`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct StatusQuery {
    connection: Option<String>,
    trigger: Option<String>,
    #[serde(default)]
    parked: Option<bool>,
    /// `region` (default) or `local`.
    scope: Option<String>,
}

async fn status(
    State(hub): State<Arc<ControlHub>>,
    headers: HeaderMap,
    query: Result<Query<StatusQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let caller = match caller(&hub, &headers) {
        Ok(c) => c,
        Err(e) => return refuse(&hub, &e),
    };
    if let Err(e) = hub.ready() {
        return refuse(&hub, &e);
    }
    let Ok(Query(q)) = query else {
        return refuse(
            &hub,
            &ApiError::BadRequest(
                "the query takes connection, trigger, parked (true/false) and scope (region/local)"
                    .to_owned(),
            ),
        );
    };
    let local = match q.scope.as_deref() {
        None | Some("region") => forwarded(&headers),
        Some("local") => true,
        Some(other) => {
            return refuse(
                &hub,
                &ApiError::BadRequest(format!("scope {other:?}: use region or local")),
            )
        }
    };
    let filter = StatusFilter {
        connection: q.connection.clone(),
        trigger: q.trigger.clone(),
        parked_only: q.parked.unwrap_or(false),
    };
    let mut report = hub.local_status(|c, t| caller.may_read(c, t), &filter);
    if !local {
        let mut path = "/api/v1/status?scope=local".to_owned();
        for (k, v) in [("connection", &q.connection), ("trigger", &q.trigger)] {
            if let Some(v) = v {
                path.push_str(&format!(
                    "&{k}={}",
                    percent_encoding::utf8_percent_encode(v, percent_encoding::NON_ALPHANUMERIC)
                ));
            }
        }
        if filter.parked_only {
            path.push_str("&parked=true");
        }
        gather(&hub, &mut report, &path, authorization(&headers)).await;
    }
    ok(&hub, serde_json::to_value(&report).unwrap_or_default())
}

/// Adds every peer's report at `path` to `report`.
async fn gather(hub: &ControlHub, report: &mut RegionStatus, path: &str, auth: Option<&str>) {
    for answer in hub.peers.call_all(path, auth, None, STATUS_TIMEOUT).await {
        match answer {
            Ok(a) if a.status == 200 => match serde_json::from_value::<RegionStatus>(a.body) {
                Ok(peer) => {
                    report.replicas.push(ReplicaStatus {
                        id: peer.replica.clone(),
                        url: Some(a.url),
                        reachable: true,
                        error: None,
                    });
                    merge(report, peer);
                }
                Err(e) => report.replicas.push(unreachable(
                    a.url,
                    format!("its status is not understood: {e}"),
                )),
            },
            Ok(a) => {
                let why = a.body["error"].as_str().unwrap_or("no reason").to_owned();
                report
                    .replicas
                    .push(unreachable(a.url, format!("HTTP {}: {why}", a.status)));
            }
            Err((url, e)) => report.replicas.push(unreachable(url, e)),
        }
    }
}

fn unreachable(url: String, error: String) -> ReplicaStatus {
    ReplicaStatus {
        id: url.clone(),
        url: Some(url),
        reachable: false,
        error: Some(error),
    }
}

/// The body of pause and resume.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct StateBody {
    #[serde(default)]
    reason: Option<String>,
}

/// The body of retry.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RecordBody {
    topic: String,
    partition: i32,
    offset: i64,
}

/// The body of skip.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SkipBody {
    topic: String,
    partition: i32,
    offset: i64,
    reason: String,
}

/// The body of redrive.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RedriveBody {
    #[serde(default)]
    partitions: Vec<i32>,
    #[serde(default)]
    from: i64,
    #[serde(default)]
    to: Option<i64>,
    #[serde(default)]
    dry_run: bool,
}

/// The actions, as they appear in paths and metrics.
const ACTIONS: [&str; 5] = ["pause", "resume", "retry", "skip", "redrive"];

async fn action(
    State(hub): State<Arc<ControlHub>>,
    Path((connection, trigger, action)): Path<(String, String, String)>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let Some(action) = ACTIONS.iter().copied().find(|a| *a == action) else {
        return refuse(
            &hub,
            &ApiError::NotFound(format!(
                "no action {action:?}: use pause, resume, retry, skip or redrive"
            )),
        );
    };
    let caller = caller(&hub, &headers);
    let name = caller.as_ref().map_or("-", |c| c.name()).to_owned();
    let result = match caller {
        Ok(c) => act(&hub, &c, &connection, &trigger, action, &headers, body).await,
        Err(e) => Err(e),
    };
    audit(
        &hub,
        &name,
        action,
        &connection,
        &trigger,
        &result,
        forwarded(&headers),
    );
    match result {
        Ok(body) => ok(&hub, body),
        Err(e) => refuse(&hub, &e),
    }
}

/// The audit log line and the counter of one action.
fn audit(
    hub: &ControlHub,
    token: &str,
    action: &'static str,
    connection: &str,
    trigger: &str,
    result: &Result<serde_json::Value, ApiError>,
    forwarded: bool,
) {
    // Only configured names become labels.
    let known = hub.has_trigger(connection, trigger).is_ok();
    let (c, t) = if known {
        (connection, trigger)
    } else {
        ("", "")
    };
    // Counted where it was received: a forwarded request is the same action again.
    let count = |result: &'static str| {
        if !forwarded {
            metrics::operator_action(c, t, action, result);
        }
    };
    match result {
        Ok(body) => {
            count("ok");
            tracing::info!(target: "tessel_kafka::audit", token, action, connection, trigger,
                forwarded, outcome = %body["outcome"].as_str().unwrap_or("ok"),
                record = %body["record"], already = body["already"].as_bool().unwrap_or(false),
                "operator action");
        }
        Err(e) => {
            let kind = if matches!(e, ApiError::Unavailable(_) | ApiError::Timeout(_)) {
                "failed"
            } else {
                "refused"
            };
            count(kind);
            tracing::warn!(target: "tessel_kafka::audit", token, action, connection, trigger,
                forwarded, status = e.status(), error = %e, "operator action {kind}");
        }
    }
}

/// Reads a JSON body of at most [`MAX_BODY`] bytes; an empty body is `{}`.
async fn read_body<T: serde::de::DeserializeOwned>(
    body: Body,
) -> Result<(T, serde_json::Value), ApiError> {
    let bytes: Bytes = axum::body::to_bytes(body, MAX_BODY)
        .await
        .map_err(|_| ApiError::TooLarge(format!("the body exceeds {MAX_BODY} bytes")))?;
    let bytes: &[u8] = if bytes.iter().all(u8::is_ascii_whitespace) {
        b"{}"
    } else {
        &bytes
    };
    let value: serde_json::Value = serde_json::from_slice(bytes)
        .map_err(|e| ApiError::BadRequest(format!("the body is not JSON: {e}")))?;
    let parsed = serde_json::from_value(value.clone())
        .map_err(|e| ApiError::BadRequest(format!("the body: {e}")))?;
    Ok((parsed, value))
}

fn check_reason(reason: &str, required: bool) -> Result<(), ApiError> {
    if required && reason.trim().is_empty() {
        return Err(ApiError::BadRequest(
            "a reason is required (\"reason\": \"…\")".to_owned(),
        ));
    }
    if reason.chars().count() > MAX_REASON {
        return Err(ApiError::BadRequest(format!(
            "the reason exceeds {MAX_REASON} characters"
        )));
    }
    Ok(())
}

fn check_record(topic: &str, partition: i32, offset: i64) -> Result<(), ApiError> {
    if topic.is_empty() || topic.len() > 249 {
        return Err(ApiError::BadRequest(
            "topic: 1 to 249 characters".to_owned(),
        ));
    }
    if partition < 0 || offset < 0 {
        return Err(ApiError::BadRequest(
            "partition and offset are not negative".to_owned(),
        ));
    }
    Ok(())
}

async fn act(
    hub: &Arc<ControlHub>,
    caller: &Caller,
    connection: &str,
    trigger: &str,
    action: &'static str,
    headers: &HeaderMap,
    body: Body,
) -> Result<serde_json::Value, ApiError> {
    caller.check_act(connection, trigger)?;
    hub.has_trigger(connection, trigger)?;
    hub.ready()?;
    let by = caller.name().to_owned();
    match action {
        "pause" | "resume" => {
            let (b, raw): (StateBody, _) = read_body(body).await?;
            if let Some(r) = &b.reason {
                check_reason(r, false)?;
            }
            let state = if action == "pause" {
                RunState::Paused
            } else {
                RunState::Running
            };
            let done = hub
                .set_state(connection, trigger, state, b.reason, &by)
                .await?;
            let mut out = outcome_json(&done);
            if !forwarded(headers) && !hub.store_is_shared() {
                out["replicas"] = broadcast(hub, connection, trigger, action, headers, &raw).await;
            }
            Ok(out)
        }
        "retry" => {
            let (b, raw): (RecordBody, _) = read_body(body).await?;
            check_record(&b.topic, b.partition, b.offset)?;
            let local = hub
                .retry(connection, trigger, &b.topic, b.partition, b.offset)
                .await;
            let done = or_peers(
                hub,
                local,
                connection,
                trigger,
                action,
                headers,
                &raw,
                (&b.topic, b.partition),
            )
            .await?;
            Ok(with_record(done, &b.topic, b.partition, b.offset))
        }
        "skip" => {
            let (b, raw): (SkipBody, _) = read_body(body).await?;
            check_record(&b.topic, b.partition, b.offset)?;
            check_reason(&b.reason, true)?;
            let target = (b.topic.as_str(), b.partition, b.offset);
            let local = hub.skip(connection, trigger, target, &b.reason, &by).await;
            let done = or_peers(
                hub,
                local,
                connection,
                trigger,
                action,
                headers,
                &raw,
                (&b.topic, b.partition),
            )
            .await?;
            Ok(with_record(done, &b.topic, b.partition, b.offset))
        }
        _ => {
            let (b, _): (RedriveBody, _) = read_body(body).await?;
            if b.from < 0 || b.to.is_some_and(|t| t < b.from) || b.partitions.iter().any(|p| *p < 0)
            {
                return Err(ApiError::BadRequest(
                    "from and to are offsets, to not below from; partitions are not negative"
                        .to_owned(),
                ));
            }
            let config = hub.config();
            let has_dlq = config.connections[connection].triggers[trigger]
                .dead_letter_topic
                .is_some();
            if !has_dlq {
                return Err(ApiError::Conflict(format!(
                    "trigger {trigger:?} has no dead_letter_topic to redrive"
                )));
            }
            let request = crate::ops::replay::ReplayRequest {
                trigger: trigger.to_owned(),
                partitions: b.partitions,
                from: b.from,
                to: b.to,
                dry_run: b.dry_run,
            };
            let progress = hub
                .redrives
                .start(config, connection, request, &by, hub.replica_id());
            let mut out = serde_json::to_value(&progress).unwrap_or_default();
            out["outcome"] = json!("started");
            Ok(out)
        }
    }
}

fn outcome_json(done: &ActionOutcome) -> serde_json::Value {
    serde_json::to_value(done).unwrap_or_default()
}

fn with_record(
    done: serde_json::Value,
    topic: &str,
    partition: i32,
    offset: i64,
) -> serde_json::Value {
    let mut out = done;
    out["record"] = json!({ "topic": topic, "partition": partition, "offset": offset });
    out
}

/// A pause or resume received here goes to every peer (each stores and applies it); their
/// answers, for the caller.
async fn broadcast(
    hub: &ControlHub,
    connection: &str,
    trigger: &str,
    action: &str,
    headers: &HeaderMap,
    raw: &serde_json::Value,
) -> serde_json::Value {
    let path = action_path(connection, trigger, action);
    let answers = hub
        .peers
        .call_all(&path, authorization(headers), Some(raw), ACTION_TIMEOUT)
        .await;
    answers
        .into_iter()
        .map(|a| match a {
            Ok(a) => json!({
                "url": a.url, "replica": a.replica, "status": a.status,
                "outcome": a.body.get("outcome"), "error": a.body.get("error"),
            }),
            Err((url, e)) => json!({ "url": url, "error": e }),
        })
        .collect()
}

fn action_path(connection: &str, trigger: &str, action: &str) -> String {
    let enc = |s: &str| {
        percent_encoding::utf8_percent_encode(s, percent_encoding::NON_ALPHANUMERIC).to_string()
    };
    format!(
        "/api/v1/connections/{}/triggers/{}/{action}",
        enc(connection),
        enc(trigger)
    )
}

/// A retry or skip this replica could not carry out because the record is not parked here:
/// unless forwarded already or the partition is this replica's, the peers are asked; the
/// first that holds it answers.
#[allow(clippy::too_many_arguments)]
async fn or_peers(
    hub: &ControlHub,
    local: Result<ActionOutcome, ApiError>,
    connection: &str,
    trigger: &str,
    action: &str,
    headers: &HeaderMap,
    raw: &serde_json::Value,
    (topic, partition): (&str, i32),
) -> Result<serde_json::Value, ApiError> {
    match local {
        Ok(done) => {
            let mut out = outcome_json(&done);
            out["replica"] = json!(hub.replica_id());
            Ok(out)
        }
        Err(ApiError::NotFound(m))
            if !forwarded(headers) && !hub.owns(connection, topic, partition) =>
        {
            let path = action_path(connection, trigger, action);
            let answers = hub
                .peers
                .call_all(&path, authorization(headers), Some(raw), ACTION_TIMEOUT)
                .await;
            let mut other: Option<ApiError> = None;
            for a in answers.into_iter().flatten() {
                if (200..300).contains(&a.status) {
                    return Ok(a.body);
                }
                let why = a.body["error"].as_str().unwrap_or("no reason").to_owned();
                let e = match a.status {
                    409 => ApiError::Conflict(why),
                    503 => ApiError::Unavailable(why),
                    504 => ApiError::Timeout(why),
                    _ => continue,
                };
                other.get_or_insert(e);
            }
            Err(other.unwrap_or(ApiError::NotFound(m)))
        }
        Err(e) => Err(e),
    }
}

async fn redrives(State(hub): State<Arc<ControlHub>>, headers: HeaderMap) -> Response {
    let caller = match caller(&hub, &headers) {
        Ok(c) => c,
        Err(e) => return refuse(&hub, &e),
    };
    let list: Vec<_> = hub
        .redrives
        .list()
        .into_iter()
        .filter(|r| caller.may_read(&r.connection, &r.trigger))
        .collect();
    ok(&hub, json!({ "redrives": list }))
}

async fn redrive(
    State(hub): State<Arc<ControlHub>>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Response {
    let caller = match caller(&hub, &headers) {
        Ok(c) => c,
        Err(e) => return refuse(&hub, &e),
    };
    if let Some(r) = hub.redrives.get(&id) {
        if caller.may_read(&r.connection, &r.trigger) {
            return ok(&hub, serde_json::to_value(&r).unwrap_or_default());
        }
    } else if !forwarded(&headers) {
        let path = format!(
            "/api/v1/redrives/{}",
            percent_encoding::utf8_percent_encode(&id, percent_encoding::NON_ALPHANUMERIC)
        );
        for a in hub
            .peers
            .call_all(&path, authorization(&headers), None, STATUS_TIMEOUT)
            .await
            .into_iter()
            .flatten()
        {
            if a.status == 200 {
                return ok(&hub, a.body);
            }
        }
    }
    refuse(&hub, &ApiError::NotFound(format!("no redrive {id:?}")))
}

/// A peer that starts asks for the target states applied here (peer key only).
async fn target_states(State(hub): State<Arc<ControlHub>>, headers: HeaderMap) -> Response {
    match caller(&hub, &headers) {
        Ok(Caller::Peer) => {}
        Ok(_) => {
            return refuse(
                &hub,
                &ApiError::Forbidden("for the region's replicas only".to_owned()),
            )
        }
        Err(e) => return refuse(&hub, &e),
    }
    let states: Vec<serde_json::Value> = hub
        .target_states()
        .into_iter()
        .map(|(c, t, s)| json!({ "connection": c, "trigger": t, "state": s }))
        .collect();
    ok(&hub, json!({ "target_states": states }))
}

/// A replica that starts without a shared store takes its peers' newer target states: a
/// pause made while it was away (or before it existed) holds here too.
pub(super) async fn sync_from_peers(hub: &Arc<ControlHub>) {
    if hub.store_is_shared() || hub.config().api.tokens.is_empty() {
        return;
    }
    let key = format!("Bearer {}", super::auth::peer_key(&hub.config().api));
    let answers = hub
        .peers
        .call_all(
            "/api/v1/internal/target-states",
            Some(&key),
            None,
            SYNC_TIMEOUT,
        )
        .await;
    for a in answers {
        let a = match a {
            Ok(a) if a.status == 200 => a,
            Ok(a) => {
                tracing::warn!(peer = %a.url, status = a.status, "a peer did not give its target states");
                continue;
            }
            Err((url, e)) => {
                tracing::info!(peer = %url, error = %e, "a peer could not be asked for its target states");
                continue;
            }
        };
        for s in a.body["target_states"].as_array().into_iter().flatten() {
            let (Some(c), Some(t)) = (s["connection"].as_str(), s["trigger"].as_str()) else {
                continue;
            };
            let Ok(state) = serde_json::from_value::<TargetState>(s["state"].clone()) else {
                continue;
            };
            let known = hub.connection(c).trigger(t).target();
            if state.at_ms > known.at_ms && hub.has_trigger(c, t).is_ok() {
                if let Err(e) = hub.store_locally(c, t, &state).await {
                    tracing::warn!(connection = c, trigger = t, error = %e, "cannot store a peer's target state");
                }
                hub.apply_target(c, t, state);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const ACT: &str = "act-token-0123456789";
    const READ: &str = "read-token-0123456789";

    /// A hub for a configuration with one connection (not running) and two triggers, its
    /// states in a temporary directory, served on a loopback port of `rt`.
    fn serve(rt: &tokio::runtime::Runtime, state: &std::path::Path) -> String {
        let text = format!(
            r#"
[api.tokens.oncall]
token = "{ACT}"
access = "act"
connections = ["*"]
[api.tokens.viewer]
token = "{READ}"
connections = ["orders"]
[region]
replica_id = "tk-0"
state_dir = "{}"
[connections.orders.kafka]
"bootstrap.servers" = "127.0.0.1:1"
"group.id" = "g"
[connections.orders.triggers.fraud]
topics = ["payments"]
workflow = "w"
dispatcher = {{ url = "http://127.0.0.1:1/runs" }}
[connections.orders.triggers.audit]
topics = ["audit"]
workflow = "w"
dispatcher = {{ url = "http://127.0.0.1:1/runs" }}
"#,
            state.display()
        );
        let config = Config::from_toml_with_env(&text, Vec::new()).unwrap();
        let store = super::super::store::TargetStore::for_config(&config);
        let hub = ControlHub::new(
            Arc::new(config),
            crate::admin::health::HealthRegistry::default(),
            store,
        );
        rt.block_on(async {
            hub.start(&tokio_util::sync::CancellationToken::new())
                .await
                .unwrap();
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap();
            drop(tokio::spawn(async move {
                let _ = axum::serve(listener, standalone(hub)).await;
            }));
            format!("http://{addr}")
        })
    }

    use crate::config::Config;

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    thread_local! {
        /// One client per test (a client per request costs its setup each time).
        static CLIENT: reqwest::Client = reqwest::Client::new();
    }

    fn client() -> reqwest::Client {
        CLIENT.with(Clone::clone)
    }

    async fn post(base: &str, path: &str, token: Option<&str>, body: Vec<u8>) -> (u16, Value) {
        let mut req = client()
            .post(format!("{base}{path}"))
            .header("content-type", "application/json")
            .body(body);
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        let resp = req.send().await.unwrap();
        let status = resp.status().as_u16();
        (status, resp.json().await.unwrap_or(Value::Null))
    }

    use serde_json::Value;

    /// JSON values of every kind, nested, with the keys the bodies take among others.
    fn json_value() -> impl Strategy<Value = Value> {
        let key = prop_oneof![
            Just("topic".to_owned()),
            Just("partition".to_owned()),
            Just("offset".to_owned()),
            Just("reason".to_owned()),
            Just("from".to_owned()),
            Just("to".to_owned()),
            Just("partitions".to_owned()),
            Just("dry_run".to_owned()),
            "[a-z_]{1,8}",
        ];
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            any::<f64>()
                .prop_filter("finite", |f| f.is_finite())
                .prop_map(Value::from),
            ".{0,40}".prop_map(Value::from),
            "x{600}".prop_map(Value::from),
        ];
        leaf.prop_recursive(4, 32, 6, move |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                prop::collection::btree_map(key.clone(), inner, 0..6)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    /// Fuzzed bodies (bytes, JSON of any shape, mutated valid bodies) at every action, with
    /// every kind of token: always a 4xx with a message, never a 5xx; 200 only for a body
    /// that is what the action takes. Nothing is stored by a refused request.
    #[test]
    fn fuzzed_bodies_get_a_4xx_never_a_5xx() {
        let rt = runtime();
        let state = tempfile::tempdir().unwrap();
        let base = serve(&rt, state.path());
        let actions = ["pause", "resume", "retry", "skip", "redrive", "nope"];
        let body = prop_oneof![
            prop::collection::vec(any::<u8>(), 0..200),
            json_value().prop_map(|v| serde_json::to_vec(&v).unwrap()),
            (json_value(), 0..3usize).prop_map(|(v, i)| {
                let mut valid = serde_json::json!({"topic": "payments", "partition": 0, "offset": 5, "reason": "x"});
                let key = ["topic", "partition", "offset"][i];
                valid[key] = v;
                serde_json::to_vec(&valid).unwrap()
            }),
        ];
        let token = prop_oneof![
            Just(None),
            Just(Some(READ)),
            Just(Some(ACT)),
            Just(Some("x"))
        ];
        let trigger = prop_oneof![Just("fraud"), Just("audit"), Just("none"), Just("%2e%2e")];
        let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
            cases: 400,
            ..ProptestConfig::default()
        });
        runner
            .run(
                &(body, token, trigger, 0..actions.len()),
                |(body, token, trigger, a)| {
                    let path = format!(
                        "/api/v1/connections/orders/triggers/{trigger}/{}",
                        actions[a]
                    );
                    let (status, answer) = rt.block_on(post(&base, &path, token, body.clone()));
                    prop_assert!(
                        status < 500,
                        "{path} {token:?} {}: {status} {answer}",
                        String::from_utf8_lossy(&body)
                    );
                    if status >= 400 {
                        prop_assert!(answer["error"].is_string(), "{status} {answer}");
                    } else {
                        // Only pause and resume can succeed here (nothing is parked, no
                        // dead-letter topic to redrive), with an act token and a body they take.
                        prop_assert!(
                            token == Some(ACT) && ["pause", "resume"].contains(&actions[a]),
                            "{path}: {answer}"
                        );
                    }
                    Ok(())
                },
            )
            .unwrap();
        // Queries of the status too.
        let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
            cases: 100,
            ..ProptestConfig::default()
        });
        runner
            .run(&".{0,60}", |query| {
                let url = format!(
                    "{base}/api/v1/status?{}",
                    percent_encoding::utf8_percent_encode(&query, percent_encoding::CONTROLS)
                );
                let status = rt.block_on(async {
                    reqwest::Client::new()
                        .get(&url)
                        .bearer_auth(READ)
                        .send()
                        .await
                        .map(|r| r.status().as_u16())
                });
                if let Ok(status) = status {
                    prop_assert!(status == 200 || status == 400, "{url}: {status}");
                }
                Ok(())
            })
            .unwrap();
    }

    /// The console is one page with nothing from elsewhere, and its policy allows only its
    /// own script and style (by hash) and calls to this API.
    #[test]
    fn the_console_loads_nothing_from_elsewhere() {
        let rt = runtime();
        let state = tempfile::tempdir().unwrap();
        let base = serve(&rt, state.path());
        let (policy, page) = rt.block_on(async {
            let resp = client()
                .get(format!("{base}/console"))
                .send()
                .await
                .unwrap();
            assert_eq!(resp.status(), 200);
            let policy = resp.headers()["content-security-policy"]
                .to_str()
                .unwrap()
                .to_owned();
            (policy, resp.text().await.unwrap())
        });
        assert!(
            policy.starts_with("default-src 'none'; script-src 'sha256-"),
            "{policy}"
        );
        assert!(policy.contains("style-src 'sha256-") && policy.contains("connect-src 'self'"));
        for external in ["src=\"http", "href=\"http", "@import", "url(http", "<link"] {
            assert!(!page.contains(external), "the page has {external}");
        }
        assert_eq!(
            page.matches("<script>").count(),
            1,
            "one inline script, the one hashed"
        );
    }

    /// The grant matrix on one hub: no token 401, a wrong one 401, a read token 403, an act
    /// token 200; the API off (no tokens) 404; and a read token sees only its connections.
    #[test]
    fn only_an_act_grant_acts_and_read_grants_see_their_share() {
        let rt = runtime();
        let state = tempfile::tempdir().unwrap();
        let base = serve(&rt, state.path());
        let pause = "/api/v1/connections/orders/triggers/fraud/pause";
        for (token, want) in [
            (None, 401),
            (Some("wrong-token-0123456789"), 401),
            (Some(READ), 403),
            (Some(ACT), 200),
        ] {
            let (status, body) = rt.block_on(post(&base, pause, token, b"{}".to_vec()));
            assert_eq!(status, want, "{token:?}: {body}");
        }
        let stored = std::fs::read_to_string(state.path().join(super::super::store::FILE)).unwrap();
        assert!(
            stored.contains("\"paused\"") && stored.contains("oncall"),
            "{stored}"
        );
        let status: Value = rt.block_on(async {
            client()
                .get(format!("{base}/api/v1/status"))
                .bearer_auth(READ)
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap()
        });
        let triggers = &status["connections"][0]["triggers"];
        assert_eq!(triggers.as_array().unwrap().len(), 2, "{status}");
        assert_eq!(triggers[1]["state"], "paused", "{status}");
        assert_eq!(triggers[1]["target"]["by"], "oncall");
    }
}
