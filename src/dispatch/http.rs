//! The HTTP client of the run dispatcher: a pooled keep-alive HTTP/1 client, shared by the
//! triggers that post to the same origin ([`super::pool`]).
//!
//! hyper's client is used directly: the URI, the fixed headers and the TLS configuration are
//! built once, and a request is the body plus two header values. (reqwest, which the registry
//! client and the OTLP exporter use, cost about 4 µs of CPU per event on this path: see
//! `docs/performance.md`.) The client does not follow redirects (a dispatcher answers; a
//! redirect would resend the run and its token elsewhere).
//!
//! How the dispatcher is reached is decided once, when the trigger starts (and is part of what
//! its pool is shared by): TLS with the
//! trigger's CA and client certificate when configured (see [`crate::tls`]), and directly or
//! through a CONNECT tunnel of an HTTP proxy (`dispatcher.proxy`, else the environment's
//! `HTTPS_PROXY` / `HTTP_PROXY` / `NO_PROXY`). Only connection set-up differs: a request
//! takes the same path through the pooled client either way.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full, Limited};
use hyper::header::{
    HeaderMap, HeaderName, HeaderValue, AUTHORIZATION, CONTENT_TYPE, HOST, LOCATION, RETRY_AFTER,
    USER_AGENT,
};
use hyper::{Method, Request, Uri};
use hyper_util::client::legacy::connect::proxy::Tunnel;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::proxy::matcher::{Intercept, Matcher};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};

use super::pool::{DispatchPools, Pool, PoolKey};
use super::retry::parse_retry_after;
use super::{classify, DispatchOutcome, DispatchRequest};
use crate::config::{DispatchConfig, DispatcherConfig, MAX_CONNECTIONS_PER_ORIGIN};

pub(super) type Connector = hyper_rustls::HttpsConnector<Route>;
type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The most of an error answer's body kept for the error message.
const MAX_ERROR_BODY: usize = 64 * 1024;
/// How long opening a connection (TCP, and the proxy's CONNECT) may take; a trigger's
/// `timeout_ms` bounds the whole request, this included.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The most of a batch's 2xx answer read: it may list the ids of failed events (10,000 ids
/// of about 100 bytes fit). A longer one is not taken as an acceptance.
const MAX_BATCH_ANSWER: usize = 4 * 1024 * 1024;

/// POSTs events to one trigger's dispatcher URL.
#[derive(Clone)]
pub struct HttpDispatcher {
    /// The origin's client and its bounds (shared with other triggers' dispatchers).
    pub(super) pool: Arc<Pool>,
    uri: Uri,
    /// Content type, user agent, authorization and the configured headers.
    headers: HeaderMap,
    timeout: Duration,
}

impl std::fmt::Debug for HttpDispatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpDispatcher")
            .field("uri", &crate::config::redact_text(&self.uri.to_string()))
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl HttpDispatcher {
    /// Builds a client of its own with the trigger's auth, headers, TLS files and proxy (the
    /// environment's proxy variables are read now), bounded only by the request count
    /// (commands and tools; the daemon's triggers share pools through [`DispatchPools`]).
    pub fn try_new(config: &DispatcherConfig) -> Result<Self, String> {
        Self::try_new_with_env(config, &Matcher::from_env())
    }

    /// [`HttpDispatcher::try_new`] with the proxy rules of the environment given.
    fn try_new_with_env(config: &DispatcherConfig, env: &Matcher) -> Result<Self, String> {
        let own = DispatchPools::new(DispatchConfig {
            max_connections_per_origin: MAX_CONNECTIONS_PER_ORIGIN,
            max_idle_per_origin: MAX_CONNECTIONS_PER_ORIGIN,
        });
        Self::try_new_in(config, env, &own)
    }

    /// The client of `config` in `pools`: the pool of its origin, TLS files and proxy, built
    /// when none is alive.
    pub(super) fn try_new_in(
        config: &DispatcherConfig,
        env: &Matcher,
        pools: &DispatchPools,
    ) -> Result<Self, String> {
        let url = config.url.expose();
        let mut headers = HeaderMap::new();
        let _ = headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        let _ = headers.insert(
            USER_AGENT,
            HeaderValue::from_static(concat!("tessel-kafka/", env!("CARGO_PKG_VERSION"))),
        );
        // Credentials in the URL become Basic authentication, as browsers and curl send them;
        // a token, when configured, wins.
        if !url.username().is_empty() {
            let user = percent_decode(url.username());
            let password = url.password().map(percent_decode).unwrap_or_default();
            let basic = base64::Engine::encode(
                &base64::engine::general_purpose::STANDARD,
                format!("{user}:{password}"),
            );
            let mut value = HeaderValue::from_str(&format!("Basic {basic}"))
                .map_err(|_| "dispatcher URL credentials are not a valid header".to_owned())?;
            value.set_sensitive(true);
            let _ = headers.insert(AUTHORIZATION, value);
        }
        for (k, v) in &config.headers {
            let name =
                HeaderName::from_bytes(k.as_bytes()).map_err(|e| format!("header {k}: {e}"))?;
            let mut value = HeaderValue::from_str(v).map_err(|e| format!("header {k}: {e}"))?;
            if crate::config::is_secret_header(k) {
                value.set_sensitive(true);
            }
            let _ = headers.insert(name, value);
        }
        if let Some(token) = &config.token {
            let mut value = HeaderValue::from_str(&format!("Bearer {}", token.expose()))
                .map_err(|_| "dispatcher token is not a valid header value".to_owned())?;
            value.set_sensitive(true);
            let _ = headers.insert(AUTHORIZATION, value);
        }
        // The URI without its user info (sent as the header above, never in the request line)
        // and with its port always written: a CONNECT tunnel takes the port from it (443
        // when absent, whatever the scheme). Only the path and query go in the request line.
        let port = url
            .port_or_known_default()
            .ok_or_else(|| "dispatcher URL has no port".to_owned())?;
        let uri: Uri = Uri::builder()
            .scheme(url.scheme())
            .authority(format!("{}:{port}", url.host_str().unwrap_or_default()))
            .path_and_query(&url[url::Position::BeforePath..url::Position::AfterQuery])
            .build()
            .map_err(|e| format!("dispatcher URL: {e}"))?;
        // Host, written once here (hyper's client would format it per request); the default
        // port of the scheme is left out, as clients do. A configured Host header wins.
        if !headers.contains_key(HOST) {
            let host = match (url.host_str(), url.port()) {
                (Some(host), Some(port)) => format!("{host}:{port}"),
                (Some(host), None) => host.to_owned(),
                (None, _) => return Err("dispatcher URL has no host".to_owned()),
            };
            let value =
                HeaderValue::from_str(&host).map_err(|e| format!("dispatcher host: {e}"))?;
            let _ = headers.insert(HOST, value);
        }

        let proxy = proxy_for(config, env, &uri)?;
        let origin = format!(
            "{}://{}",
            url.scheme(),
            uri.authority().map_or("", |a| a.as_str())
        );
        let files = config.tls_files();
        let read = |path: Option<&std::path::Path>| path.and_then(|p| std::fs::read(p).ok());
        let key = PoolKey {
            origin: origin.clone(),
            tls: [
                read(files.ca_location),
                read(files.certificate_location),
                read(files.key_location),
            ],
            proxy: proxy.as_ref().map(|p| {
                (
                    p.uri().to_string(),
                    p.basic_auth().map(|a| a.as_bytes().to_vec()),
                )
            }),
        };
        let pool = pools.get_or_build(key, |limits| {
            let client = client(config, proxy, limits.max_idle_per_origin)?;
            Ok(Pool::new(client, limits.max_connections_per_origin, origin))
        })?;
        Ok(Self {
            pool,
            uri,
            headers,
            timeout: Duration::from_millis(config.timeout_ms),
        })
    }

    /// Whether `self` and `other` share one pool (the same origin, TLS files and proxy).
    pub fn shares_pool_with(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.pool, &other.pool)
    }

    /// One attempt to start a run for `body`, with no envelope headers.
    pub async fn dispatch(
        &self,
        body: Vec<u8>,
        idempotency_key: &str,
        traceparent: Option<&str>,
    ) -> DispatchOutcome {
        let request = DispatchRequest {
            key: idempotency_key.to_owned(),
            body,
            envelope: HeaderMap::new(),
        };
        self.send(request, traceparent, false).await.0
    }

    /// One attempt to start the run (or runs, for a `batch`) of `request`. A batch's answer
    /// also brings the body of a 2xx (up to 4 MiB), which may name the events that failed; a
    /// 2xx answer to a batch that cannot be read whole is retryable, not an acceptance.
    /// Otherwise the body returned is empty.
    pub async fn send(
        &self,
        request: DispatchRequest,
        traceparent: Option<&str>,
        batch: bool,
    ) -> (DispatchOutcome, Bytes) {
        let DispatchRequest {
            key: idempotency_key,
            body,
            envelope,
        } = request;
        let idempotency_key = idempotency_key.as_str();
        let mut request = Request::new(Full::new(Bytes::from(body)));
        *request.method_mut() = Method::POST;
        *request.uri_mut() = self.uri.clone();
        let headers = request.headers_mut();
        headers.reserve(self.headers.len() + envelope.len() + 2);
        for (name, value) in &self.headers {
            let _ = headers.insert(name, value.clone());
        }
        for (name, value) in &envelope {
            let _ = headers.insert(name, value.clone());
        }
        let per_request = [
            ("idempotency-key", "Idempotency-Key", Some(idempotency_key)),
            ("traceparent", "traceparent", traceparent),
        ];
        for (name, shown, value) in per_request {
            let Some(value) = value else { continue };
            let Ok(value) = HeaderValue::from_str(value) else {
                return (
                    DispatchOutcome::Invalid {
                        reason: format!("the {shown} is not a valid header value"),
                    },
                    Bytes::new(),
                );
            };
            let _ = headers.insert(HeaderName::from_static(name), value);
        }
        // A slot of the origin's pool first: the request's timeout starts once it has one.
        let Some(slot) = self.pool.slot().await else {
            return (
                DispatchOutcome::Retryable {
                    status: None,
                    reason: "the dispatcher's connection pool is closed".to_owned(),
                    retry_after: None,
                },
                Bytes::new(),
            );
        };
        let exchange = async {
            let response = self.pool.client.request(request).await?;
            let (parts, incoming) = response.into_parts();
            let status = parts.status.as_u16();
            // The answer's body is read to its end (up to a bound) so that the connection
            // goes back to the pool; only an error answer's text is kept.
            let success_status = (200..300).contains(&status);
            let bound = if batch && success_status {
                MAX_BATCH_ANSWER
            } else {
                MAX_ERROR_BODY
            };
            let (text, success) = match Limited::new(incoming, bound).collect().await {
                Ok(collected) if !success_status => (
                    String::from_utf8_lossy(&collected.to_bytes()).into_owned(),
                    Some(Bytes::new()),
                ),
                Ok(collected) if batch => (String::new(), Some(collected.to_bytes())),
                Ok(_) => (String::new(), Some(Bytes::new())),
                // A batch answer not read whole (over the bound, or cut off) may name failed
                // events that would otherwise count as accepted.
                Err(_) if batch && success_status => (String::new(), None),
                Err(_) => (String::new(), Some(Bytes::new())),
            };
            Ok::<_, hyper_util::client::legacy::Error>((parts.headers, status, text, success))
        };
        let result = tokio::time::timeout(self.timeout, exchange).await;
        match &result {
            Ok(Err(e)) if crate::limits::out_of_fds(e) => self.pool.out_of_fds(slot),
            Ok(Ok(_)) => {
                drop(slot);
                self.pool.succeeded();
            }
            _ => drop(slot),
        }
        match result {
            Ok(Ok((_, status, _, None))) => (
                DispatchOutcome::Retryable {
                    status: Some(status),
                    reason: format!(
                        "the batch answer (HTTP {status}) could not be read whole (over \
                         {MAX_BATCH_ANSWER} bytes, or cut off); the batch is sent again"
                    ),
                    retry_after: None,
                },
                Bytes::new(),
            ),
            Ok(Ok((headers, status, text, Some(success)))) => {
                let retry_after = headers
                    .get(RETRY_AFTER)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| parse_retry_after(v, std::time::SystemTime::now()));
                let body = if (200..300).contains(&status) {
                    String::new()
                } else if (300..400).contains(&status) {
                    let location = headers
                        .get(LOCATION)
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or("(no Location)");
                    format!("(Location: {})", crate::config::redact_text(location))
                } else {
                    text
                };
                (classify(status, &body, retry_after), success)
            }
            Ok(Err(e)) if crate::limits::out_of_fds(&e) => (
                DispatchOutcome::Retryable {
                    status: None,
                    // Counting the open descriptors takes one, so only the limit is said.
                    reason: format!(
                        "out of file descriptors (the process's limit is {}): cannot connect \
                         to the dispatcher; its pool now allows {} connections",
                        crate::limits::open_files_limit()
                            .map_or("unlimited".to_owned(), |n| n.to_string()),
                        self.pool.capacity()
                    ),
                    retry_after: None,
                },
                Bytes::new(),
            ),
            Ok(Err(e)) => match tls_refusal(&e) {
                // No retry mends a certificate: a configuration error, as a 401 is.
                Some(reason) => (
                    DispatchOutcome::Unauthorized { status: 0, reason },
                    Bytes::new(),
                ),
                None => (
                    DispatchOutcome::Retryable {
                        status: None,
                        reason: match std::error::Error::source(&e) {
                            Some(cause) if e.is_connect() => format!(
                                "cannot connect to the dispatcher: {}",
                                crate::config::redacted_error_chain(cause)
                            ),
                            _ => crate::config::redacted_error_chain(&e),
                        },
                        retry_after: None,
                    },
                    Bytes::new(),
                ),
            },
            Err(_) => (
                DispatchOutcome::Retryable {
                    status: None,
                    reason: "request timed out".to_owned(),
                    retry_after: None,
                },
                Bytes::new(),
            ),
        }
    }
}

/// The pooled client of `config`'s TLS files and route (`proxy`), keeping at most `max_idle`
/// idle connections.
fn client(
    config: &DispatcherConfig,
    proxy: Option<Intercept>,
    max_idle: usize,
) -> Result<Client<Connector, Full<Bytes>>, String> {
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    http.set_connect_timeout(Some(CONNECT_TIMEOUT));
    let route = match proxy {
        None => Route::Direct(http),
        Some(proxy) => {
            let tunnel = Tunnel::new(proxy.uri().clone(), http);
            Route::Tunnel(match proxy.basic_auth() {
                Some(auth) => tunnel.with_auth(auth.clone()),
                None => tunnel,
            })
        }
    };
    let tls_config =
        crate::tls::client_config("dispatcher", config.tls_files()).map_err(|e| e.to_string())?;
    let tls = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls_config)
        .https_or_http()
        .enable_http1()
        .wrap_connector(route);
    Ok(Client::builder(TokioExecutor::new())
        .pool_timer(TokioTimer::new())
        .pool_idle_timeout(Duration::from_secs(90))
        .pool_max_idle_per_host(max_idle)
        .build(tls))
}

/// How a trigger's connections reach the dispatcher, decided when the client is built.
#[derive(Clone, Debug)]
pub(super) enum Route {
    /// A TCP connection to the dispatcher.
    Direct(HttpConnector),
    /// A TCP connection to an HTTP proxy and a CONNECT tunnel through it to the dispatcher.
    Tunnel(Tunnel<HttpConnector>),
}

type Connecting =
    Pin<Box<dyn Future<Output = Result<TokioIo<tokio::net::TcpStream>, BoxError>> + Send>>;

impl tower_service::Service<Uri> for Route {
    type Response = TokioIo<tokio::net::TcpStream>;
    type Error = BoxError;
    type Future = Connecting;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        match self {
            Self::Direct(c) => c.poll_ready(cx).map_err(Into::into),
            Self::Tunnel(t) => t.poll_ready(cx).map_err(Into::into),
        }
    }

    /// Runs once per new connection (the pool reuses it), not per request.
    fn call(&mut self, dst: Uri) -> Self::Future {
        match self {
            Self::Direct(c) => {
                let connecting = c.call(dst);
                Box::pin(async move { connecting.await.map_err(Into::into) })
            }
            Self::Tunnel(t) => {
                let connecting = t.call(dst);
                Box::pin(async move { connecting.await.map_err(Into::into) })
            }
        }
    }
}

/// The proxy `target` is reached through: `dispatcher.proxy` when set (always), else the
/// environment's (`env`: curl's rules, `NO_PROXY` included), else none.
fn proxy_for(
    config: &DispatcherConfig,
    env: &Matcher,
    target: &Uri,
) -> Result<Option<Intercept>, String> {
    let proxy = match &config.proxy {
        Some(p) => Matcher::builder()
            .all(p.expose().as_str().to_owned())
            .build()
            .intercept(target),
        None => env.intercept(target),
    };
    match proxy {
        Some(p) if p.uri().scheme_str() != Some("http") => Err(format!(
            "the dispatcher's proxy {} is not an http:// proxy (the only kind supported)",
            crate::config::redact_text(&p.uri().to_string())
        )),
        other => Ok(other),
    }
}

/// Why TLS with the dispatcher cannot succeed however often it is tried, when an error's
/// chain says so: the dispatcher's certificate is not trusted, or the dispatcher refused
/// ours (or presented none we could use).
fn tls_refusal(e: &(dyn std::error::Error + 'static)) -> Option<String> {
    use rustls::AlertDescription as A;
    let mut cur = Some(e);
    while let Some(err) = cur {
        // rustls' errors reach hyper inside an io::Error (inside another, from a handshake),
        // whose source() skips the error it holds: that one is stepped into instead.
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            cur = match io.get_ref() {
                Some(inner) => Some(inner as &(dyn std::error::Error + 'static)),
                None => err.source(),
            };
            continue;
        }
        match err.downcast_ref::<rustls::Error>() {
            Some(rustls::Error::InvalidCertificate(why)) => {
                return Some(format!(
                    "the dispatcher's TLS certificate is not trusted ({why}); check \
                     dispatcher.ca_location and the url's host name"
                ))
            }
            Some(rustls::Error::AlertReceived(
                alert @ (A::CertificateRequired
                | A::BadCertificate
                | A::UnsupportedCertificate
                | A::CertificateRevoked
                | A::CertificateExpired
                | A::CertificateUnknown
                | A::UnknownCA
                | A::AccessDenied
                | A::HandshakeFailure),
            )) => {
                return Some(format!(
                    "the dispatcher refused the TLS handshake ({alert:?}); check \
                     dispatcher.certificate_location and key_location"
                ))
            }
            Some(_) => return None,
            None => cur = err.source(),
        }
    }
    None
}

/// A URL's user name or password as written (percent-decoded).
fn percent_decode(s: &str) -> String {
    percent_encoding::percent_decode_str(s)
        .decode_utf8_lossy()
        .into_owned()
}

#[cfg(test)]
#[path = "http_transport_tests.rs"]
mod transport_tests;

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_header_http_cannot_carry_is_invalid_not_retryable() {
        let config: DispatcherConfig =
            toml::from_str("url = \"http://u:s3cr3t@127.0.0.1:9/runs?token=t0k\"").unwrap();
        let d = HttpDispatcher::try_new(&config).unwrap();
        let outcome = d
            .dispatch(b"{}".to_vec(), "kafka:g:t:0:1", Some("00-bad\n"))
            .await;
        match outcome {
            DispatchOutcome::Invalid { reason } => {
                assert!(
                    !reason.contains("s3cr3t") && !reason.contains("t0k"),
                    "{reason}"
                );
            }
            other => panic!("expected Invalid, got {other:?}"),
        }
    }

    /// Accepts one connection and answers each request on it with `answer`; returns the
    /// requests' heads and bodies as text.
    async fn one_connection_server(
        answer: &'static str,
        requests: usize,
    ) -> (String, tokio::task::JoinHandle<Vec<String>>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let handle = tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut seen = Vec::new();
            let mut buf = Vec::new();
            while seen.len() < requests {
                let mut chunk = [0u8; 4096];
                let n = socket.read(&mut chunk).await.unwrap();
                assert!(n > 0, "connection closed after {} requests", seen.len());
                buf.extend_from_slice(&chunk[..n]);
                let text = String::from_utf8_lossy(&buf).into_owned();
                let Some(head_end) = text.find("\r\n\r\n") else {
                    continue;
                };
                let length = crate::tls::testing::content_length(&text[..head_end]);
                if buf.len() < head_end + 4 + length {
                    continue;
                }
                seen.push(text[..head_end + 4 + length].to_owned());
                buf.drain(..head_end + 4 + length);
                socket.write_all(answer.as_bytes()).await.unwrap();
            }
            seen
        });
        (format!("127.0.0.1:{}", addr.port()), handle)
    }

    #[tokio::test]
    async fn sends_the_event_with_its_headers_and_url_credentials_as_basic_auth() {
        let (addr, server) =
            one_connection_server("HTTP/1.1 202 Accepted\r\ncontent-length: 2\r\n\r\n{}", 2).await;
        let config: DispatcherConfig = toml::from_str(&format!(
            "url = \"http://runner:p%40ss@{addr}/runs?x=1\"\nheaders = {{ X-Tenant = \"t1\" }}"
        ))
        .unwrap();
        let d = HttpDispatcher::try_new(&config).unwrap();
        for offset in 0..2 {
            let outcome = d
                .dispatch(
                    br#"{"a":1}"#.to_vec(),
                    &format!("kafka:g:t:0:{offset}"),
                    Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
                )
                .await;
            assert!(
                matches!(outcome, DispatchOutcome::Accepted { .. }),
                "{outcome:?}"
            );
        }
        // Both requests went over the one connection the server accepted.
        let seen = server.await.unwrap();
        let first = seen[0].to_ascii_lowercase();
        assert!(first.starts_with("post /runs?x=1 http/1.1\r\n"), "{first}");
        // "runner:p@ss"
        assert!(
            first.contains("authorization: basic cnvubmvyonbac3m=\r\n"),
            "{first}"
        );
        assert!(
            first.contains("idempotency-key: kafka:g:t:0:0\r\n"),
            "{first}"
        );
        assert!(
            first.contains("content-type: application/json\r\n"),
            "{first}"
        );
        assert!(first.contains("x-tenant: t1\r\n"), "{first}");
        assert!(
            first.contains(
                "traceparent: 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\r\n"
            ),
            "{first}"
        );
        assert!(first.contains("user-agent: tessel-kafka/"), "{first}");
        assert!(first.contains(&format!("host: {addr}\r\n")), "{first}");
        assert!(first.ends_with("\r\n\r\n{\"a\":1}"), "{first}");
        assert!(seen[1].contains("kafka:g:t:0:1"), "{}", seen[1]);
    }

    #[tokio::test]
    async fn an_error_answer_keeps_its_text_and_retry_after() {
        let (addr, _server) = one_connection_server(
            "HTTP/1.1 503 Service Unavailable\r\nretry-after: 7\r\ncontent-length: 9\r\n\r\nbusy now!",
            1,
        )
        .await;
        let config: DispatcherConfig =
            toml::from_str(&format!("url = \"http://{addr}/runs\"")).unwrap();
        let d = HttpDispatcher::try_new(&config).unwrap();
        match d.dispatch(b"{}".to_vec(), "kafka:g:t:0:1", None).await {
            DispatchOutcome::Retryable {
                status: Some(503),
                reason,
                retry_after: Some(ra),
            } => {
                assert!(reason.contains("busy now!"), "{reason}");
                assert_eq!(ra, Duration::from_secs(7));
            }
            other => panic!("expected Retryable 503, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn a_connection_the_server_closed_while_idle_is_replaced_without_a_failure() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (closed_tx, closed_rx) = tokio::sync::oneshot::channel();
        let server = tokio::spawn(async move {
            let mut closed_tx = Some(closed_tx);
            for _ in 0..2 {
                let (mut socket, _) = listener.accept().await.unwrap();
                let mut buf = vec![0u8; 8192];
                let mut seen = Vec::new();
                loop {
                    let n = socket.read(&mut buf).await.unwrap();
                    seen.extend_from_slice(&buf[..n]);
                    if seen.ends_with(b"{}") {
                        break;
                    }
                }
                socket
                    .write_all(b"HTTP/1.1 202 Accepted\r\ncontent-length: 0\r\n\r\n")
                    .await
                    .unwrap();
                // Closes the connection after answering, as a server's idle timeout does.
                drop(socket);
                if let Some(tx) = closed_tx.take() {
                    let _ = tx.send(());
                }
            }
        });
        let config: DispatcherConfig =
            toml::from_str(&format!("url = \"http://{addr}/runs\"")).unwrap();
        let d = HttpDispatcher::try_new(&config).unwrap();
        let first = d.dispatch(b"{}".to_vec(), "kafka:g:t:0:1", None).await;
        assert!(
            matches!(first, DispatchOutcome::Accepted { .. }),
            "{first:?}"
        );
        closed_rx.await.unwrap();
        let second = d.dispatch(b"{}".to_vec(), "kafka:g:t:0:2", None).await;
        assert!(
            matches!(second, DispatchOutcome::Accepted { .. }),
            "{second:?}"
        );
        server.await.unwrap();
    }

    #[tokio::test]
    async fn an_answer_that_does_not_come_times_out_and_the_connection_is_not_reused() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let accepted = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let server = tokio::spawn({
            let accepted = std::sync::Arc::clone(&accepted);
            async move {
                // Holds every connection open without answering.
                let mut held = Vec::new();
                while let Ok((socket, _)) = listener.accept().await {
                    held.push(socket);
                    accepted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                }
            }
        });
        let config: DispatcherConfig =
            toml::from_str(&format!("url = \"http://{addr}/runs\"\ntimeout_ms = 200")).unwrap();
        let d = HttpDispatcher::try_new(&config).unwrap();
        for _ in 0..2 {
            match d.dispatch(b"{}".to_vec(), "kafka:g:t:0:1", None).await {
                DispatchOutcome::Retryable { reason, .. } => {
                    assert_eq!(reason, "request timed out");
                }
                other => panic!("expected a timeout, got {other:?}"),
            }
        }
        // Each attempt opened a connection of its own.
        assert_eq!(accepted.load(std::sync::atomic::Ordering::SeqCst), 2);
        server.abort();
    }

    #[test]
    fn the_host_header_leaves_out_the_default_port() {
        for (url, host) in [
            ("https://runs.example.com/v1/runs", "runs.example.com"),
            ("https://runs.example.com:443/v1/runs", "runs.example.com"),
            (
                "http://runs.example.com:8080/v1/runs",
                "runs.example.com:8080",
            ),
            ("http://[::1]:9000/runs", "[::1]:9000"),
        ] {
            let config: DispatcherConfig = toml::from_str(&format!("url = \"{url}\"")).unwrap();
            let d = HttpDispatcher::try_new(&config).unwrap();
            assert_eq!(d.headers.get(HOST).unwrap(), host, "{url}");
        }
    }

    #[tokio::test]
    async fn a_batch_answer_too_long_to_read_whole_is_not_an_acceptance() {
        let long = MAX_BATCH_ANSWER + 1;
        let answer: &'static str = Box::leak(
            format!(
                "HTTP/1.1 200 OK\r\ncontent-length: {long}\r\n\r\n{{\"failed\": [\"{}\"]}}",
                "x".repeat(long - 16)
            )
            .into_boxed_str(),
        );
        let (addr, _server) = one_connection_server(answer, 1).await;
        let config: DispatcherConfig =
            toml::from_str(&format!("url = \"http://{addr}/runs\"")).unwrap();
        let d = HttpDispatcher::try_new(&config).unwrap();
        let request = DispatchRequest {
            key: "kafka:g:t:0:1-2:2".to_owned(),
            body: b"{}".to_vec(),
            envelope: HeaderMap::new(),
        };
        let (outcome, body) = d.send(request, None, true).await;
        assert!(
            matches!(
                outcome,
                DispatchOutcome::Retryable {
                    status: Some(200),
                    ..
                }
            ),
            "{outcome:?}"
        );
        assert!(body.is_empty());
    }
}
