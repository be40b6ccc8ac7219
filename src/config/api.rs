//! `[api]`: the operator API and web console (`/api/v1/…`, `/console`): its bearer tokens,
//! each a read or an act grant on some connections and triggers, and an optional listener of
//! its own.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

use super::secret::Secret;
use super::ConfigError;

/// The operator API and console. Without tokens the API answers 404 to every request: seeing
/// and acting on a live region is off unless a token grants it.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ApiConfig {
    /// Serve the API and the console on this address only, apart from `server.listen`
    /// (which then keeps `/metrics`, the probes, `/health` and the produce API). Default
    /// none: both on `server.listen`.
    #[serde(default)]
    pub listen: Option<SocketAddr>,
    /// Bearer tokens by name (`[api.tokens.<name>]`). The name appears in the audit log,
    /// never the token.
    #[serde(default)]
    pub tokens: BTreeMap<String, ApiGrant>,
}

/// What a token may do: read the status, or read it and act.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Access {
    /// See the status of the connections and triggers granted.
    #[default]
    Read,
    /// See, and pause, resume, retry, skip and redrive on them.
    Act,
}

/// One bearer token of the operator API and what it grants.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ApiGrant {
    /// The token: inline, `{ env = "VAR" }` or `{ file = "/run/secrets/x" }`. At least 16
    /// characters.
    pub token: Secret,
    /// `read` (status only, the default) or `act` (status and actions).
    #[serde(default)]
    pub access: Access,
    /// Connections it covers; `"*"` for all.
    pub connections: Vec<String>,
    /// Triggers of those connections it covers; `"*"` (the default) for all.
    #[serde(default = "all")]
    pub triggers: Vec<String>,
}

fn all() -> Vec<String> {
    vec!["*".to_owned()]
}

impl ApiGrant {
    /// Whether the grant covers `trigger` of `connection` (for reading; acting also needs
    /// [`Access::Act`]).
    pub fn covers(&self, connection: &str, trigger: &str) -> bool {
        self.covers_connection(connection) && self.triggers.iter().any(|t| t == "*" || t == trigger)
    }

    /// Whether the grant covers at least a trigger of `connection`.
    pub fn covers_connection(&self, connection: &str) -> bool {
        self.connections.iter().any(|c| c == "*" || c == connection)
    }
}

impl ApiConfig {
    /// Rules serde cannot express: token length, connections and triggers that exist.
    pub(super) fn validate(
        &self,
        triggers: &BTreeMap<&str, Vec<&str>>,
        server: SocketAddr,
    ) -> Result<(), ConfigError> {
        if self.listen.is_some_and(|l| l == server) {
            return Err(ConfigError::invalid(
                "api.listen",
                "is server.listen; leave it out to serve the API there",
            ));
        }
        for (name, grant) in &self.tokens {
            let key = |k: &str| format!("api.tokens.{name}.{k}");
            if grant.token.expose().len() < 16 {
                return Err(ConfigError::invalid(
                    key("token"),
                    "must be at least 16 characters",
                ));
            }
            if grant.connections.is_empty() || grant.triggers.is_empty() {
                return Err(ConfigError::invalid(
                    key("connections"),
                    "a token needs at least one connection and one trigger (\"*\" for all)",
                ));
            }
            for c in grant.connections.iter().filter(|c| *c != "*") {
                if !triggers.contains_key(c.as_str()) {
                    return Err(ConfigError::invalid(
                        key("connections"),
                        format!("names connection {c:?}, which is not configured"),
                    ));
                }
            }
            for t in grant.triggers.iter().filter(|t| *t != "*") {
                let known = triggers
                    .iter()
                    .filter(|(c, _)| grant.covers_connection(c))
                    .any(|(_, ts)| ts.contains(&t.as_str()));
                if !known {
                    return Err(ConfigError::invalid(
                        key("triggers"),
                        format!("names trigger {t:?}, which none of its connections has"),
                    ));
                }
            }
        }
        let mut seen = BTreeMap::new();
        for (name, grant) in &self.tokens {
            if let Some(other) = seen.insert(grant.token.expose().to_owned(), name) {
                return Err(ConfigError::invalid(
                    format!("api.tokens.{name}.token"),
                    format!("is the same as api.tokens.{other}.token; each token must be its own"),
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant(connections: &[&str], triggers: &[&str]) -> ApiGrant {
        ApiGrant {
            token: Secret::new("x".repeat(16)),
            access: Access::Read,
            connections: connections.iter().map(|s| (*s).to_owned()).collect(),
            triggers: triggers.iter().map(|s| (*s).to_owned()).collect(),
        }
    }

    #[test]
    fn grants_cover_connections_and_triggers() {
        let g = grant(&["orders"], &["fraud"]);
        assert!(g.covers("orders", "fraud"));
        assert!(!g.covers("orders", "audit"));
        assert!(!g.covers("payments", "fraud"));
        assert!(g.covers_connection("orders"));
        let all = grant(&["*"], &["*"]);
        assert!(all.covers("any", "thing"));
    }

    #[test]
    fn unknown_names_short_and_shared_tokens_are_refused() {
        let triggers = BTreeMap::from([("orders", vec!["fraud"]), ("payments", vec!["audit"])]);
        let server: SocketAddr = "0.0.0.0:9464".parse().unwrap();
        let config = |grants: Vec<(&str, ApiGrant)>| ApiConfig {
            listen: None,
            tokens: grants.into_iter().map(|(n, g)| (n.to_owned(), g)).collect(),
        };
        let ok = config(vec![("a", grant(&["orders"], &["fraud"]))]);
        assert!(ok.validate(&triggers, server).is_ok());
        for (c, key) in [
            (
                config(vec![("a", grant(&["nope"], &["*"]))]),
                "api.tokens.a.connections",
            ),
            (
                config(vec![("a", grant(&["orders"], &["audit"]))]),
                "api.tokens.a.triggers",
            ),
            (
                config(vec![("a", grant(&[], &["*"]))]),
                "api.tokens.a.connections",
            ),
            (
                config(vec![
                    ("a", grant(&["*"], &["*"])),
                    ("b", grant(&["orders"], &["*"])),
                ]),
                "api.tokens.b.token",
            ),
        ] {
            let err = c.validate(&triggers, server).unwrap_err().to_string();
            assert!(err.contains(key), "{err}");
        }
        let mut short = grant(&["*"], &["*"]);
        short.token = Secret::new("short".to_owned());
        let err = config(vec![("s", short)])
            .validate(&triggers, server)
            .unwrap_err()
            .to_string();
        assert!(err.contains("api.tokens.s.token"), "{err}");
        let same = ApiConfig {
            listen: Some(server),
            tokens: BTreeMap::new(),
        };
        assert!(same
            .validate(&triggers, server)
            .unwrap_err()
            .to_string()
            .contains("api.listen"));
    }
}
