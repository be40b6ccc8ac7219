//! The other replicas of the region and calls to them: an action received by a replica that
//! does not hold the record goes to its peers, the status gathers their reports, and a
//! replica that starts takes its peers' newer target states.
//!
//! Peers are `region.peers` (a name that resolves to several addresses, a Kubernetes headless
//! Service, names one replica per address) and, with a region cluster, the replicas the
//! control topic's directory lists as alive. A forwarded request carries the caller's token
//! and `x-tessel-forwarded-by`, so the peer acts only on what it holds and forwards nothing;
//! every answer carries `x-tessel-replica`, so a replica that reaches itself through a
//! Service ignores its own answer.

use std::sync::RwLock;
use std::time::Duration;

use super::store::{Directory, DIRECTORY_TTL_MS};
use super::trigger::now_ms;
use crate::config::Config;

/// The header a forwarded request carries: the replica that forwarded it.
pub const FORWARDED_BY: &str = "x-tessel-forwarded-by";
/// The header every API answer carries: the replica that answered.
pub const REPLICA: &str = "x-tessel-replica";
/// How long a forwarded action may take (a skip waits for its dead-letter write).
pub const ACTION_TIMEOUT: Duration = Duration::from_secs(45);
/// How long a peer's part of the status may take.
pub const STATUS_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a starting replica waits for a peer's target states; also the connect timeout.
pub const SYNC_TIMEOUT: Duration = Duration::from_secs(5);

/// A peer's answer.
#[derive(Debug)]
pub struct PeerAnswer {
    /// The URL called.
    pub url: String,
    /// The replica that answered (its `x-tessel-replica`).
    pub replica: Option<String>,
    /// The HTTP status.
    pub status: u16,
    /// The JSON body (null when it was not JSON).
    pub body: serde_json::Value,
}

/// This replica's peers.
#[derive(Debug)]
pub struct Peers {
    /// This replica's admin URL.
    pub advertise: String,
    self_id: String,
    configured: RwLock<Vec<String>>,
    directory: Option<Directory>,
    client: reqwest::Client,
}

impl Peers {
    /// The peers `config` names, and those `directory` lists.
    pub fn new(
        config: &Config,
        self_id: &str,
        advertise: &str,
        directory: Option<Directory>,
    ) -> Self {
        Self {
            advertise: advertise.to_owned(),
            self_id: self_id.to_owned(),
            configured: RwLock::new(config.region.peers.clone()),
            directory,
            client: reqwest::Client::builder()
                .connect_timeout(SYNC_TIMEOUT)
                .redirect(reqwest::redirect::Policy::none())
                .build()
                .unwrap_or_default(),
        }
    }

    /// A reloaded configuration's peers.
    pub fn set_config(&self, config: &Config) {
        *self.configured.write().unwrap_or_else(|p| p.into_inner()) = config.region.peers.clone();
    }

    /// This replica's id.
    pub fn self_id(&self) -> &str {
        &self.self_id
    }

    /// The peers' admin URLs now, never this replica's advertised one.
    pub async fn urls(&self) -> Vec<String> {
        let configured = self
            .configured
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let mut urls = Vec::new();
        for peer in configured {
            urls.extend(resolve(&peer).await);
        }
        if let Some(dir) = &self.directory {
            let now = now_ms();
            let dir = dir.lock().unwrap_or_else(|p| p.into_inner());
            urls.extend(
                dir.iter()
                    .filter(|(id, (_, at))| **id != self.self_id && now - *at <= DIRECTORY_TTL_MS)
                    .map(|(_, (url, _))| url.clone()),
            );
        }
        urls.retain(|u| u.trim_end_matches('/') != self.advertise.trim_end_matches('/'));
        urls.sort();
        urls.dedup();
        urls
    }

    /// Calls `path_and_query` on every peer at once with `auth` (the caller's
    /// `Authorization`) and `body` (a POST; a GET without one), each within `timeout`;
    /// answers from this replica itself are left out.
    pub async fn call_all(
        &self,
        path_and_query: &str,
        auth: Option<&str>,
        body: Option<&serde_json::Value>,
        timeout: Duration,
    ) -> Vec<Result<PeerAnswer, (String, String)>> {
        let urls = self.urls().await;
        let calls = urls
            .into_iter()
            .map(|url| self.call(url, path_and_query, auth, body, timeout));
        futures::future::join_all(calls)
            .await
            .into_iter()
            .filter(|r| !matches!(r, Ok(a) if a.replica.as_deref() == Some(self.self_id.as_str())))
            .collect()
    }

    async fn call(
        &self,
        url: String,
        path_and_query: &str,
        auth: Option<&str>,
        body: Option<&serde_json::Value>,
        timeout: Duration,
    ) -> Result<PeerAnswer, (String, String)> {
        let full = format!("{}{path_and_query}", url.trim_end_matches('/'));
        let mut req = match body {
            Some(b) => self.client.post(&full).json(b),
            None => self.client.get(&full),
        };
        req = req.timeout(timeout).header(FORWARDED_BY, &self.self_id);
        if let Some(a) = auth {
            req = req.header(reqwest::header::AUTHORIZATION, a);
        }
        let resp = req
            .send()
            .await
            .map_err(|e| (url.clone(), crate::config::redact_text(&e.to_string())))?;
        let status = resp.status().as_u16();
        let replica = resp
            .headers()
            .get(REPLICA)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let body = resp.json().await.unwrap_or(serde_json::Value::Null);
        Ok(PeerAnswer {
            url,
            replica,
            status,
            body,
        })
    }
}

/// `peer` as one URL per address its host name resolves to (one replica each), or as it is
/// (an address, a name that resolves to one address or not at all).
async fn resolve(peer: &str) -> Vec<String> {
    let Ok(url) = reqwest::Url::parse(peer) else {
        return Vec::new();
    };
    let (Some(host), Some(port)) = (url.host_str(), url.port_or_known_default()) else {
        return vec![peer.to_owned()];
    };
    if host.parse::<std::net::IpAddr>().is_ok() || host.starts_with('[') {
        return vec![peer.to_owned()];
    }
    let addrs: Vec<std::net::SocketAddr> = match tokio::net::lookup_host((host, port)).await {
        Ok(a) => a.collect(),
        Err(_) => return vec![peer.to_owned()],
    };
    let mut ips: Vec<std::net::IpAddr> = addrs.iter().map(std::net::SocketAddr::ip).collect();
    ips.sort();
    ips.dedup();
    if ips.len() <= 1 {
        return vec![peer.to_owned()];
    }
    ips.into_iter()
        .filter_map(|ip| {
            let mut u = url.clone();
            u.set_ip_host(ip).ok()?;
            Some(u.to_string())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_name_of_several_addresses_is_one_peer_per_address() {
        assert_eq!(
            resolve("http://127.0.0.1:9464").await,
            ["http://127.0.0.1:9464"]
        );
        // `localhost` resolves to one address or to two (127.0.0.1 and ::1): each is a peer.
        let local = resolve("http://localhost:9464/").await;
        assert!(!local.is_empty());
        if local.len() > 1 {
            assert!(local.iter().all(|u| !u.contains("localhost")), "{local:?}");
        }
        assert_eq!(
            resolve("http://no-such-host.invalid:1").await,
            ["http://no-such-host.invalid:1"]
        );
        assert!(resolve("not a url").await.is_empty());
    }
}
