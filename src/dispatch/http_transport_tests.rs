//! How the dispatcher is reached: a private CA, mTLS and HTTP proxies, against a local TLS
//! dispatcher that requires and verifies client certificates (`crate::tls::testing`) and a
//! local CONNECT proxy that records its tunnels.

use std::sync::{Arc, Mutex};

use tokio::io::AsyncWriteExt as _;
use tokio::net::TcpListener;

use super::*;
use crate::tls::testing::{connect_proxy, mtls_server as tls_dispatcher, read_request, Pki};

/// A plain HTTP dispatcher answering every request with 200; returns its port and the
/// request bodies.
async fn plain_dispatcher() -> (u16, Arc<Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let bodies = Arc::new(Mutex::new(Vec::new()));
    let record = Arc::clone(&bodies);
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let record = Arc::clone(&record);
            tokio::spawn(async move {
                while let Some(body) = read_request(&mut socket).await {
                    record.lock().unwrap().push(body);
                    let answer = b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n";
                    if socket.write_all(answer).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (port, bodies)
}

fn dispatcher(toml_text: &str) -> HttpDispatcher {
    let config: DispatcherConfig = toml::from_str(toml_text).unwrap();
    // No proxy from this process's environment: each test says which proxy it means.
    HttpDispatcher::try_new_with_env(&config, &Matcher::builder().build()).unwrap()
}

fn mtls_config(pki: &Pki, port: u16) -> String {
    format!(
        "url = \"https://127.0.0.1:{port}/runs\"\nca_location = {:?}\n\
         certificate_location = {:?}\nkey_location = {:?}\n",
        pki.path("ca.pem"),
        pki.path("client.pem"),
        pki.path("client.key"),
    )
}

async fn send(d: &HttpDispatcher, body: &str, offset: u32) -> DispatchOutcome {
    d.dispatch(
        body.as_bytes().to_vec(),
        &format!("kafka:g:t:0:{offset}"),
        None,
    )
    .await
}

#[tokio::test]
async fn with_the_private_ca_and_a_client_certificate_the_tls_dispatcher_accepts() {
    let pki = Pki::new("tessel-kafka test CA", true);
    let (port, seen) = tls_dispatcher(&pki).await;
    let d = dispatcher(&mtls_config(&pki, port));
    for (offset, body) in [r#"{"n":1}"#, r#"{"n":2}"#].into_iter().enumerate() {
        let outcome = send(&d, body, offset as u32).await;
        assert_eq!(outcome, DispatchOutcome::Accepted { status: 200 });
    }
    let seen = seen.lock().unwrap();
    // Both over one TLS connection, with the client certificate presented.
    assert_eq!(
        seen.requests,
        [(r#"{"n":1}"#.to_owned(), 1), (r#"{"n":2}"#.to_owned(), 1)]
    );
    assert_eq!(seen.refused, 0);
}

#[tokio::test]
async fn without_a_client_certificate_the_refusal_is_a_configuration_error_not_a_retry() {
    let pki = Pki::new("tessel-kafka test CA", true);
    let (port, seen) = tls_dispatcher(&pki).await;
    let d = dispatcher(&format!(
        "url = \"https://127.0.0.1:{port}/runs\"\nca_location = {:?}\n",
        pki.path("ca.pem")
    ));
    match send(&d, "{}", 1).await {
        DispatchOutcome::Unauthorized { status: 0, reason } => {
            assert!(
                reason
                    .starts_with("the dispatcher refused the TLS handshake (CertificateRequired)"),
                "{reason}"
            );
        }
        other => panic!("expected the refusal to stop the trigger, got {other:?}"),
    }
    let seen = seen.lock().unwrap();
    assert!(seen.requests.is_empty());
    assert_eq!(seen.refused, 1);
}

#[tokio::test]
async fn a_dispatcher_certificate_the_configured_ca_did_not_sign_is_not_trusted() {
    let pki = Pki::new("tessel-kafka test CA", true);
    let other = Pki::new("another CA", false);
    let (port, seen) = tls_dispatcher(&pki).await;
    let d = dispatcher(&format!(
        "url = \"https://127.0.0.1:{port}/runs\"\nca_location = {:?}\n\
         certificate_location = {:?}\nkey_location = {:?}\n",
        other.path("ca.pem"),
        pki.path("client.pem"),
        pki.path("client.key"),
    ));
    match send(&d, "{}", 1).await {
        DispatchOutcome::Unauthorized { status: 0, reason } => {
            assert!(
                reason.starts_with("the dispatcher's TLS certificate is not trusted ("),
                "{reason}"
            );
            assert!(reason.contains("UnknownIssuer"), "{reason}");
        }
        other => panic!("expected an untrusted certificate, got {other:?}"),
    }
    assert!(seen.lock().unwrap().requests.is_empty());
}

#[tokio::test]
async fn an_unreachable_dispatcher_is_still_retried() {
    let pki = Pki::new("tessel-kafka test CA", true);
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let d = dispatcher(&mtls_config(&pki, port));
    match send(&d, "{}", 1).await {
        DispatchOutcome::Retryable {
            status: None,
            reason,
            ..
        } => assert!(
            reason.starts_with("cannot connect to the dispatcher: "),
            "{reason}"
        ),
        other => panic!("expected a retry, got {other:?}"),
    }
}

#[tokio::test]
async fn through_the_configured_proxy_mtls_runs_inside_one_tunnel() {
    let pki = Pki::new("tessel-kafka test CA", true);
    let (port, seen) = tls_dispatcher(&pki).await;
    let (proxy_port, tunnels) = connect_proxy().await;
    let d = dispatcher(&format!(
        "{}proxy = \"http://runner:pr%40xy@127.0.0.1:{proxy_port}\"\n",
        mtls_config(&pki, port)
    ));
    for offset in 0..3 {
        let outcome = send(&d, &format!("{{\"n\":{offset}}}"), offset).await;
        assert_eq!(outcome, DispatchOutcome::Accepted { status: 200 });
    }
    let tunnels = tunnels.lock().unwrap();
    assert_eq!(tunnels.len(), 1, "{tunnels:?}");
    let head = tunnels[0].to_ascii_lowercase();
    assert!(
        head.starts_with(&format!("connect 127.0.0.1:{port} http/1.1\r\n")),
        "{head}"
    );
    // "runner:pr@xy"
    assert!(
        head.contains("proxy-authorization: basic cnvubmvyonbyqhh5\r\n"),
        "{head}"
    );
    let seen = seen.lock().unwrap();
    let bodies: Vec<&str> = seen.requests.iter().map(|(b, _)| b.as_str()).collect();
    assert_eq!(bodies, [r#"{"n":0}"#, r#"{"n":1}"#, r#"{"n":2}"#]);
}

#[tokio::test]
async fn the_environment_proxy_carries_an_http_dispatcher_unless_no_proxy_names_it() {
    let (port, bodies) = plain_dispatcher().await;
    let (proxy_port, tunnels) = connect_proxy().await;
    let config: DispatcherConfig =
        toml::from_str(&format!("url = \"http://127.0.0.1:{port}/runs\"")).unwrap();
    let env = |no: &str| {
        Matcher::builder()
            .http(format!("127.0.0.1:{proxy_port}"))
            .no(no.to_owned())
            .build()
    };
    let proxied = HttpDispatcher::try_new_with_env(&config, &env("")).unwrap();
    assert_eq!(
        send(&proxied, r#"{"via":"proxy"}"#, 1).await,
        DispatchOutcome::Accepted { status: 200 }
    );
    let direct = HttpDispatcher::try_new_with_env(&config, &env("localhost,127.0.0.1")).unwrap();
    assert_eq!(
        send(&direct, r#"{"via":"direct"}"#, 2).await,
        DispatchOutcome::Accepted { status: 200 }
    );
    // One tunnel, to the dispatcher's port (written out although the URL is http), for the
    // first event only.
    let tunnels = tunnels.lock().unwrap();
    assert_eq!(tunnels.len(), 1, "{tunnels:?}");
    assert!(
        tunnels[0].starts_with(&format!("CONNECT 127.0.0.1:{port} HTTP/1.1\r\n")),
        "{tunnels:?}"
    );
    assert_eq!(
        *bodies.lock().unwrap(),
        [r#"{"via":"proxy"}"#, r#"{"via":"direct"}"#]
    );
}

#[test]
fn a_configured_proxy_wins_over_the_environment_and_its_no_proxy() {
    let config: DispatcherConfig =
        toml::from_str("url = \"https://runs.internal/v1\"\nproxy = \"http://configured:3128\"")
            .unwrap();
    let env = Matcher::builder()
        .all("http://from-env:8080")
        .no("runs.internal")
        .build();
    let target: Uri = "https://runs.internal:443/v1".parse().unwrap();
    let proxy = proxy_for(&config, &env, &target).unwrap().unwrap();
    assert_eq!(proxy.uri(), "http://configured:3128/");

    let unset: DispatcherConfig = toml::from_str("url = \"https://runs.internal/v1\"").unwrap();
    assert!(proxy_for(&unset, &env, &target).unwrap().is_none());
    let elsewhere: Uri = "https://runs.example:443/v1".parse().unwrap();
    assert_eq!(
        proxy_for(&unset, &env, &elsewhere).unwrap().unwrap().uri(),
        "http://from-env:8080/"
    );
    let tls_proxy = Matcher::builder()
        .https("https://u:s3cret@tls-proxy:443")
        .build();
    let err = proxy_for(&unset, &tls_proxy, &elsewhere).unwrap_err();
    assert!(err.contains("is not an http:// proxy"), "{err}");
    assert!(!err.contains("s3cret"), "{err}");
}

#[test]
fn tls_files_that_cannot_be_used_fail_the_build_with_their_path() {
    let config: DispatcherConfig = toml::from_str(
        "url = \"https://runs.internal/v1\"\nca_location = \"/nonexistent/dispatcher-ca.pem\"",
    )
    .unwrap();
    let err = HttpDispatcher::try_new(&config).unwrap_err();
    assert!(
        err.starts_with("cannot read dispatcher CA /nonexistent/dispatcher-ca.pem: "),
        "{err}"
    );
}
