//! `tessel-kafka check`: for each connection, what the product page asks of a principal,
//! probed against the real cluster without side effects, one PASS or FAIL line per item.
//!
//! | check | how | fails as |
//! |---|---|---|
//! | brokers reachable | TCP connect to each bootstrap server | `cannot reach …` |
//! | authentication | a metadata request with the connection's security settings | `authentication failed: …`, `TLS handshake failed: …` |
//! | DESCRIBE on topic T | topic metadata | `missing DESCRIBE on topic T` |
//! | READ on topic T | a fetch at the end of partition 0 (answered by end-of-partition, reads nothing) | `missing READ on topic T` |
//! | READ on group G | the group's committed offsets (OffsetFetch; Kafka also lets DESCRIBE do this, so a principal with DESCRIBE only passes here and fails at JoinGroup) | `missing READ on group G` |
//! | WRITE on topic T | only where the connection produces: a produce request with `acks=2`, which the broker refuses after authorization (`INVALID_REQUIRED_ACKS`) and before writing anything | `missing WRITE on topic T` |
//! | idempotent producer id | only where the connection produces: an idempotent producer obtains a producer id | `missing IDEMPOTENT_WRITE on cluster …` |
//! | schema registry | `GET /subjects` with the configured credentials | the registry's answer |
//! | dispatcher | `GET` on the trigger's URL with its token, CA, client certificate and proxy (any answer but 401/403 passes) | the dispatcher's answer |
//!
//! Kafka treats READ, WRITE, DELETE and ALTER on a topic as implying DESCRIBE, so a principal
//! with READ passes the DESCRIBE line whether or not DESCRIBE was granted separately.

use std::time::Duration;

use crate::clients::probe::{kafka_checks, Report};
pub use crate::clients::probe::{CheckLine, CheckStatus};
use crate::codec::registry::RegistryClient;
use crate::config::{Config, ConnectionConfig};

/// Runs every check of every connection.
pub async fn run(config: &Config) -> Vec<CheckLine> {
    let mut lines = Vec::new();
    for (name, conn) in &config.connections {
        let kafka = {
            let owned = (name.clone(), conn.clone(), config.produced_topics(name));
            tokio::task::spawn_blocking(move || kafka_checks(&owned.0, &owned.1, &owned.2))
                .await
                .unwrap_or_else(|e| {
                    vec![CheckLine {
                        connection: name.clone(),
                        check: "kafka checks".into(),
                        status: CheckStatus::Fail,
                        detail: format!("the probe thread failed: {e}"),
                    }]
                })
        };
        lines.extend(kafka);
        let mut report = Report {
            connection: name,
            lines: Vec::new(),
        };
        registry_check(&mut report, conn).await;
        dispatcher_checks(&mut report, conn).await;
        lines.extend(report.lines);
    }
    lines
}

async fn registry_check(r: &mut Report<'_>, conn: &ConnectionConfig) {
    let Some(reg) = &conn.schema_registry else {
        return;
    };
    let check = "schema registry";
    match RegistryClient::try_new(reg) {
        Err(e) => r.fail(check, e.to_string()),
        Ok(client) => match client.probe().await {
            Ok(()) => r.pass(check, format!("{} answered", reg.url)),
            Err(e) => r.fail(check, format!("{}: {e}", reg.url)),
        },
    }
}

async fn dispatcher_checks(r: &mut Report<'_>, conn: &ConnectionConfig) {
    for (tname, t) in &conn.triggers {
        let check = format!("dispatcher of trigger {tname}");
        let client = match dispatcher_probe_client(&t.dispatcher) {
            Ok(c) => c,
            Err(e) => {
                r.fail(&check, format!("cannot build an HTTP client: {e}"));
                continue;
            }
        };
        let mut req = client.get(t.dispatcher.url.expose().clone());
        if let Some(token) = &t.dispatcher.token {
            req = req.bearer_auth(token.expose());
        }
        let url = &t.dispatcher.url;
        match req.send().await.map(|resp| resp.status().as_u16()) {
            Ok(status @ (401 | 403)) => {
                r.fail(&check, format!("{url} refused the token (HTTP {status})"));
            }
            Ok(status) => r.pass(&check, format!("{url} answered HTTP {status}")),
            Err(e) => r.fail(&check, format!("{url} unreachable: {}", e.without_url())),
        }
    }
}

/// A client that reaches the dispatcher as the trigger does: its CA and client certificate,
/// its proxy (else the environment's, as reqwest reads it).
fn dispatcher_probe_client(d: &crate::config::DispatcherConfig) -> Result<reqwest::Client, String> {
    let mut builder = reqwest::Client::builder().timeout(Duration::from_secs(5));
    if d.tls_files().any() {
        let tls =
            crate::tls::client_config("dispatcher", d.tls_files()).map_err(|e| e.to_string())?;
        builder = builder.tls_backend_preconfigured(tls);
    }
    if let Some(proxy) = &d.proxy {
        let proxy = reqwest::Proxy::all(proxy.expose().as_str())
            .map_err(|e| format!("proxy {proxy}: {}", e.without_url()))?;
        builder = builder.proxy(proxy);
    }
    builder.build().map_err(|e| e.to_string())
}

/// The report as a table: one line per check.
pub fn render_table(lines: &[CheckLine]) -> String {
    // A column is as wide as its widest value, or its header.
    let width = |header: &str, column: fn(&CheckLine) -> &str| {
        lines
            .iter()
            .map(|l| column(l).len())
            .fold(header.len(), usize::max)
    };
    let cw = width("CONNECTION", |l| &l.connection);
    let kw = width("CHECK", |l| &l.check);
    let mut out = format!(
        "{:<cw$}  {:<kw$}  {:<6}  {}\n",
        "CONNECTION", "CHECK", "RESULT", "DETAIL"
    );
    for l in lines {
        out.push_str(&format!(
            "{:<cw$}  {:<kw$}  {:<6}  {}\n",
            l.connection,
            l.check,
            l.status.as_str(),
            l.detail
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_dispatcher_probe_uses_the_triggers_ca_client_certificate_and_proxy() {
        use crate::tls::testing::{connect_proxy, mtls_server, Pki};
        let pki = Pki::new("check test CA", true);
        let (port, seen) = mtls_server(&pki).await;
        let (proxy_port, tunnels) = connect_proxy().await;
        let config: crate::config::DispatcherConfig = toml::from_str(&format!(
            "url = \"https://127.0.0.1:{port}/runs\"\nca_location = {:?}\n\
             certificate_location = {:?}\nkey_location = {:?}\n\
             proxy = \"http://127.0.0.1:{proxy_port}\"",
            pki.path("ca.pem"),
            pki.path("client.pem"),
            pki.path("client.key"),
        ))
        .unwrap();
        let client = dispatcher_probe_client(&config).unwrap();
        let answer = client
            .get(config.url.expose().clone())
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status().as_u16(), 200);
        assert_eq!(seen.lock().unwrap().requests, [(String::new(), 1)]);
        let tunnels = tunnels.lock().unwrap();
        assert_eq!(tunnels.len(), 1);
        assert!(
            tunnels[0].starts_with(&format!("CONNECT 127.0.0.1:{port} HTTP/1.1\r\n")),
            "{tunnels:?}"
        );
    }

    #[test]
    fn table_aligns_and_names_the_missing_permission() {
        let lines = vec![
            CheckLine {
                connection: "orders".into(),
                check: "READ on group tessel-orders".into(),
                status: CheckStatus::Fail,
                detail: "missing READ on group tessel-orders".into(),
            },
            CheckLine {
                connection: "orders".into(),
                check: "authentication".into(),
                status: CheckStatus::Pass,
                detail: "SASL_SSL SCRAM-SHA-512 as tessel".into(),
            },
        ];
        let t = render_table(&lines);
        let rows: Vec<&str> = t.lines().collect();
        assert_eq!(rows.len(), 3);
        assert!(rows[1].contains("FAIL") && rows[1].contains("READ on group tessel-orders"));
        assert_eq!(rows[1].find("FAIL"), rows[2].find("PASS"));
        let json = serde_json::to_value(&lines).unwrap();
        assert_eq!(json[0]["status"], "FAIL");
    }
}
