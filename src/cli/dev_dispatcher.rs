//! A local run dispatcher for the quick start and the tests: accepts runs, prints one line per
//! run, remembers idempotency keys (answering 409 to a repeat), and injects faults on request:
//! latency, a share of failures, failures for given idempotency keys, or every request.
//! A batch (a batch trigger's `{"events": [...]}`, or a CloudEvents structured batch) is a run
//! per event, by the event's `id`; given events can be reported failed (`{"failed": [...]}`)
//! or make the batch rejected (422).
//! [`mod@bench`] is its measuring mode for `scripts/bench`.

pub mod bench;

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Router;
use tokio_util::sync::CancellationToken;

/// Fault injection settings; change them at any time through [`DevDispatcher::faults`].
#[derive(Clone, Debug)]
pub struct Faults {
    /// Each request waits a uniform time in this range (milliseconds).
    pub latency_ms: (u64, u64),
    /// Share of requests answered with `fail_status` (0.0 to 1.0).
    pub fail_ratio: f64,
    /// Status of injected failures.
    pub fail_status: u16,
    /// Retry-After (seconds) sent with injected 429 and 503 answers.
    pub retry_after_secs: Option<u64>,
    /// Idempotency keys that always fail with `fail_status`.
    pub fail_keys: HashSet<String>,
    /// When set, every request fails with this status.
    pub fail_all: Option<u16>,
    /// Per idempotency key, the statuses to answer its first attempts with, in order (then
    /// it is accepted).
    pub scripted: HashMap<String, Vec<u16>>,
    /// Batches: event ids answered as failed (`{"failed": [...]}` with a 202) this many times
    /// before they are accepted. Like a dispatcher that keeps key order, the later events of
    /// a failed event's key in that batch are not started either (nor named): the connector
    /// sends them again.
    pub fail_events: HashMap<String, u32>,
    /// Batches: event ids that make a batch holding them rejected with 422.
    pub reject_events: HashSet<String>,
    /// Per idempotency key, how long its first request waits (milliseconds) before it is
    /// answered, on top of `latency_ms`: a latency that replays (the simulations draw it
    /// from their seed).
    pub delays: HashMap<String, u64>,
}

impl Default for Faults {
    fn default() -> Self {
        Self {
            latency_ms: (0, 0),
            fail_ratio: 0.0,
            fail_status: 503,
            retry_after_secs: None,
            fail_keys: HashSet::new(),
            fail_all: None,
            scripted: HashMap::new(),
            fail_events: HashMap::new(),
            reject_events: HashSet::new(),
            delays: HashMap::new(),
        }
    }
}

/// One accepted run.
#[derive(Clone, Debug)]
pub struct AcceptedRun {
    /// The Idempotency-Key header.
    pub idempotency_key: String,
    /// The event.
    pub event: serde_json::Value,
    /// The traceparent header, if sent.
    pub traceparent: Option<String>,
    /// The Authorization header, if sent.
    pub authorization: Option<String>,
    /// When it was accepted.
    pub accepted_at: std::time::Instant,
}

/// One batch request, whatever it was answered.
#[derive(Clone, Debug)]
pub struct BatchSeen {
    /// The Idempotency-Key header.
    pub idempotency_key: String,
    /// Its events' ids, in order.
    pub ids: Vec<String>,
    /// Its events' partitions and offsets, in order.
    pub offsets: Vec<(i64, i64)>,
    /// The status answered.
    pub status: u16,
    /// When it arrived.
    pub arrived_at: std::time::Instant,
}

#[derive(Default)]
struct Inner {
    batches: Vec<BatchSeen>,
    runs: Vec<AcceptedRun>,
    accepted_keys: HashMap<String, usize>,
    repeated_keys: Vec<String>,
    /// Batches: how often each event was answered as failed.
    failed_events: HashMap<String, u32>,
    attempts: HashMap<String, Vec<(std::time::Instant, u16)>>,
    /// Requests being answered now, by idempotency key.
    answering: HashMap<String, usize>,
}

/// Shared state of a running dev dispatcher.
#[derive(Default)]
pub struct DevState {
    inner: Mutex<Inner>,
    faults: Mutex<Faults>,
    in_flight: AtomicUsize,
    max_in_flight: AtomicUsize,
    attempts: AtomicU64,
    repeats: AtomicU64,
    print: bool,
}

impl DevState {
    /// What it saw (a panic elsewhere while it was held leaves it usable).
    fn inner(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The fault settings.
    fn faults(&self) -> MutexGuard<'_, Faults> {
        self.faults.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A dev dispatcher bound to a local address.
#[derive(Clone)]
pub struct DevDispatcher {
    state: Arc<DevState>,
    addr: SocketAddr,
}

impl DevDispatcher {
    /// Binds `listen` and serves until `shutdown` fires. `print` writes a line per run to stdout.
    pub async fn start(
        listen: SocketAddr,
        faults: Faults,
        print: bool,
        shutdown: CancellationToken,
    ) -> std::io::Result<Self> {
        let state = Arc::new(DevState {
            faults: Mutex::new(faults),
            print,
            ..DevState::default()
        });
        let listener = tokio::net::TcpListener::bind(listen).await?;
        let addr = listener.local_addr()?;
        let app = Router::new()
            .fallback(handle)
            .with_state(Arc::clone(&state));
        serve_until(listener, app, shutdown);
        Ok(Self { state, addr })
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The URL runs are POSTed to.
    pub fn url(&self) -> String {
        format!("http://{}/runs", self.addr)
    }

    /// Changes the fault settings.
    pub fn faults(&self, f: impl FnOnce(&mut Faults)) {
        f(&mut self.state.faults());
    }

    /// Accepted runs, in acceptance order (first acceptance of each key only).
    pub fn runs(&self) -> Vec<AcceptedRun> {
        self.state.inner().runs.clone()
    }

    /// Accepted runs from the `from`th on (counting from 0), in acceptance order: what a
    /// reader that has seen `from` of them has not seen yet, without copying the others.
    pub fn runs_from(&self, from: usize) -> Vec<AcceptedRun> {
        self.state
            .inner()
            .runs
            .get(from..)
            .map_or_else(Vec::new, <[AcceptedRun]>::to_vec)
    }

    /// How many runs were accepted.
    pub fn accepted(&self) -> usize {
        self.state.inner().runs.len()
    }

    /// Batch requests, in arrival order (with injected failures, only those that reached the
    /// batch's events).
    pub fn batches(&self) -> Vec<BatchSeen> {
        self.state.inner().batches.clone()
    }

    /// Requests for an idempotency key that had already been accepted.
    pub fn repeats(&self) -> u64 {
        self.state.repeats.load(Ordering::SeqCst)
    }

    /// Every request for `key`: when it arrived and the status answered.
    pub fn attempts_for(&self, key: &str) -> Vec<(std::time::Instant, u16)> {
        let inner = self.state.inner();
        inner.attempts.get(key).cloned().unwrap_or_default()
    }

    /// Idempotency keys offered again after acceptance, in arrival order.
    pub fn repeated_keys(&self) -> Vec<String> {
        self.state.inner().repeated_keys.clone()
    }

    /// All requests received.
    pub fn attempts(&self) -> u64 {
        self.state.attempts.load(Ordering::SeqCst)
    }

    /// Requests being answered right now.
    pub fn in_flight(&self) -> usize {
        self.state.in_flight.load(Ordering::SeqCst)
    }

    /// Idempotency keys with a request being answered now.
    pub fn answering_keys(&self) -> Vec<String> {
        self.state.inner().answering.keys().cloned().collect()
    }

    /// The most requests ever in flight at once.
    pub fn max_in_flight(&self) -> usize {
        self.state.max_in_flight.load(Ordering::SeqCst)
    }
}

async fn handle(State(state): State<Arc<DevState>>, headers: HeaderMap, body: Bytes) -> Response {
    let arrived = std::time::Instant::now();
    let _ = state.attempts.fetch_add(1, Ordering::SeqCst);
    let now = state.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
    let _ = state.max_in_flight.fetch_max(now, Ordering::SeqCst);
    // The server drops this future when the client goes away mid-request; the guard still
    // counts the request out.
    let in_flight = InFlight(&state.in_flight);
    let key = headers.get("idempotency-key").and_then(|v| v.to_str().ok());
    let answering = key.map(|k| Answering::new(&state, k));
    let response = respond(&state, &headers, &body).await;
    drop(in_flight);
    drop(answering);
    if let Some(key) = headers.get("idempotency-key").and_then(|v| v.to_str().ok()) {
        let mut inner = state.inner();
        inner
            .attempts
            .entry(key.to_owned())
            .or_default()
            .push((arrived, response.status().as_u16()));
    }
    response
}

/// One request for an idempotency key being answered; counted out when dropped (also when
/// the client went away).
struct Answering<'a> {
    state: &'a DevState,
    key: String,
}

impl<'a> Answering<'a> {
    fn new(state: &'a DevState, key: &str) -> Self {
        *state.inner().answering.entry(key.to_owned()).or_default() += 1;
        Self {
            state,
            key: key.to_owned(),
        }
    }
}

impl Drop for Answering<'_> {
    fn drop(&mut self) {
        let mut inner = self.state.inner();
        if let Some(n) = inner.answering.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                inner.answering.remove(&self.key);
            }
        }
    }
}

/// One request in flight; counted out when dropped.
struct InFlight<'a>(&'a AtomicUsize);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        let _ = self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

async fn respond(state: &DevState, headers: &HeaderMap, body: &Bytes) -> Response {
    let faults = state.faults().clone();
    let (lo, hi) = faults.latency_ms;
    if hi > 0 {
        let ms = if hi > lo {
            rand::random_range(lo..=hi)
        } else {
            hi
        };
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    // Looked up only where delays were given: most dispatchers have none.
    let delay = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .and_then(|k| Some(k).zip(faults.delays.get(k).copied()))
        .and_then(|(k, ms)| (!state.inner().attempts.contains_key(k)).then_some(ms));
    if let Some(ms) = delay {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let Some(key) = header("idempotency-key") else {
        return (StatusCode::BAD_REQUEST, "missing Idempotency-Key").into_response();
    };
    let scripted = faults.scripted.get(&key).and_then(|script| {
        let inner = state.inner();
        let seen = inner.attempts.get(&key).map_or(0, Vec::len);
        script.get(seen).copied()
    });
    let fail = faults.fail_all.or(scripted).or_else(|| {
        let random = faults.fail_ratio > 0.0 && rand::random::<f64>() < faults.fail_ratio;
        (random || faults.fail_keys.contains(&key)).then_some(faults.fail_status)
    });
    if let Some(status) = fail {
        let status = StatusCode::from_u16(status).unwrap_or(StatusCode::SERVICE_UNAVAILABLE);
        let mut resp = (status, "injected failure").into_response();
        if let (Some(s), 429 | 503) = (faults.retry_after_secs, status.as_u16()) {
            let _ = resp.headers_mut().insert("retry-after", s.into());
        }
        return resp;
    }
    let Ok(event) = serde_json::from_slice::<serde_json::Value>(body) else {
        return (StatusCode::BAD_REQUEST, "body is not JSON").into_response();
    };
    let events = match &event {
        serde_json::Value::Array(events) => Some(events.clone()),
        serde_json::Value::Object(o) => match o.get("events") {
            Some(serde_json::Value::Array(events)) => Some(events.clone()),
            _ => None,
        },
        _ => None,
    };
    if let Some(events) = events {
        return respond_batch(
            state,
            &faults,
            key,
            events,
            header("traceparent"),
            header("authorization"),
        );
    }
    let mut inner = state.inner();
    let run = AcceptedRun {
        idempotency_key: key,
        event,
        traceparent: header("traceparent"),
        authorization: header("authorization"),
        accepted_at: std::time::Instant::now(),
    };
    if accept_run(state, &mut inner, run, "run accepted") {
        (StatusCode::ACCEPTED, "accepted").into_response()
    } else {
        (StatusCode::CONFLICT, "already accepted").into_response()
    }
}

/// Keeps `run`, unless a run was accepted under its idempotency key already: then counts a
/// repeat and returns false. With `print`, says `said` and the event on stdout.
fn accept_run(state: &DevState, inner: &mut Inner, run: AcceptedRun, said: &str) -> bool {
    let count = inner
        .accepted_keys
        .entry(run.idempotency_key.clone())
        .or_default();
    *count += 1;
    if *count > 1 {
        let _ = state.repeats.fetch_add(1, Ordering::SeqCst);
        inner.repeated_keys.push(run.idempotency_key);
        return false;
    }
    if state.print {
        let event = &run.event;
        println!(
            "{said} workflow={} topic={} partition={} offset={} key={} value={}",
            event["workflow"].as_str().unwrap_or("?"),
            event["topic"].as_str().unwrap_or("?"),
            event["partition"],
            event["offset"],
            event["key"],
            event["value"]
        );
    }
    inner.runs.push(run);
    true
}

/// A batch: each event is a run of its own, by its `id`.
fn respond_batch(
    state: &DevState,
    faults: &Faults,
    key: String,
    events: Vec<serde_json::Value>,
    traceparent: Option<String>,
    authorization: Option<String>,
) -> Response {
    let id_of = |e: &serde_json::Value| e["id"].as_str().unwrap_or_default().to_owned();
    let ids: Vec<String> = events.iter().map(id_of).collect();
    let offsets = events
        .iter()
        .map(|e| {
            let number = |v: &serde_json::Value| {
                v.as_i64()
                    .or_else(|| v.as_str().and_then(|s| s.parse().ok()))
                    .unwrap_or(-1)
            };
            if e.get("offset").is_some() {
                (number(&e["partition"]), number(&e["offset"]))
            } else {
                (number(&e["kafkapartition"]), number(&e["kafkaoffset"]))
            }
        })
        .collect();
    let mut inner = state.inner();
    let mut seen = BatchSeen {
        idempotency_key: key,
        ids: ids.clone(),
        offsets,
        status: 202,
        arrived_at: std::time::Instant::now(),
    };
    if ids.iter().any(|id| faults.reject_events.contains(id)) {
        seen.status = 422;
        inner.batches.push(seen);
        return (
            StatusCode::UNPROCESSABLE_ENTITY,
            "the batch holds a rejected event",
        )
            .into_response();
    }
    inner.batches.push(seen);
    let mut failed = Vec::new();
    let mut held_keys: HashSet<String> = HashSet::new();
    for (event, id) in events.into_iter().zip(ids) {
        let event_key = if event.get("offset").is_some() {
            event["key"].to_string()
        } else {
            event["partitionkey"].to_string()
        };
        if held_keys.contains(&event_key) {
            continue;
        }
        let seen_failures = inner.failed_events.get(&id).copied().unwrap_or(0);
        if faults
            .fail_events
            .get(&id)
            .is_some_and(|n| seen_failures < *n)
        {
            let _ = inner.failed_events.insert(id.clone(), seen_failures + 1);
            failed.push(id);
            let _ = held_keys.insert(event_key);
            continue;
        }
        let run = AcceptedRun {
            idempotency_key: id,
            event,
            traceparent: traceparent.clone(),
            authorization: authorization.clone(),
            accepted_at: std::time::Instant::now(),
        };
        // A repeated event is left out of the answer: it was accepted before.
        let _ = accept_run(state, &mut inner, run, "run accepted (batch)");
    }
    if failed.is_empty() {
        (StatusCode::ACCEPTED, "accepted").into_response()
    } else {
        (
            StatusCode::ACCEPTED,
            axum::Json(serde_json::json!({ "failed": failed })),
        )
            .into_response()
    }
}

/// Serves `app` on `listener` in the background until `shutdown` fires.
pub(crate) fn serve_until(
    listener: tokio::net::TcpListener,
    app: Router,
    shutdown: CancellationToken,
) {
    drop(tokio::spawn(async move {
        let _ = axum::serve(listener, app)
            .with_graceful_shutdown(async move { shutdown.cancelled().await })
            .await;
    }));
}
