//! The daemon reaches a dispatcher behind a private CA that requires a client certificate,
//! through an HTTP proxy, end to end from the topic to the commit.

use std::time::Duration;

use serde_json::Value;

use super::tls_testing::{connect_proxy, mtls_server, Pki};
use super::{committed, connection_toml, create_topic, produce_keyed, Connector};
use crate::support::{unique, wait_for};

#[tokio::test]
async fn records_reach_an_mtls_dispatcher_through_a_proxy_and_are_committed() {
    let pki = Pki::new("tessel-kafka e2e CA", true);
    let (port, seen) = mtls_server(&pki).await;
    let (proxy_port, tunnels) = connect_proxy().await;
    let topic = unique("dispatcher-tls");
    let group = unique("dispatcher-tls-group");
    create_topic(&topic, 1).await;
    produce_keyed(&topic, 0, 5, 5).await;
    let url = format!("https://127.0.0.1:{port}/runs");
    let toml = connection_toml(&group, &topic, &url, "").replace(
        &format!("url = \"{url}\""),
        &format!(
            "url = \"{url}\", ca_location = {:?}, certificate_location = {:?}, \
             key_location = {:?}, proxy = \"http://127.0.0.1:{proxy_port}\"",
            pki.path("ca.pem"),
            pki.path("client.pem"),
            pki.path("client.key"),
        ),
    );
    let connector = Connector::start(&toml);
    wait_for("5 runs and their commit", Duration::from_secs(60), || {
        (seen.lock().unwrap().requests.len() >= 5 && committed(&group, &topic, 1) == [5])
            .then_some(())
    })
    .await;
    connector.stop().await;

    let seen = seen.lock().unwrap();
    let mut values: Vec<i64> = seen
        .requests
        .iter()
        .map(|(body, certs)| {
            assert_eq!(*certs, 1, "the client certificate was presented");
            let event: Value = serde_json::from_str(body).unwrap();
            assert_eq!(event["topic"], topic.as_str());
            event["value"]["i"].as_i64().unwrap()
        })
        .collect();
    values.sort_unstable();
    assert_eq!(values, [0, 1, 2, 3, 4]);
    assert_eq!(seen.refused, 0);
    // Every connection to the dispatcher was a tunnel through the proxy.
    let tunnels = tunnels.lock().unwrap();
    assert!(!tunnels.is_empty());
    for head in tunnels.iter() {
        assert!(
            head.starts_with(&format!("CONNECT 127.0.0.1:{port} HTTP/1.1\r\n")),
            "{head}"
        );
    }
}
