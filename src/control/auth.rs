//! Who is calling the operator API: a bearer token of `[api.tokens]`, compared in constant
//! time against every token as the produce API does, and what it grants (read, or act, on
//! some connections and triggers). Replicas call each other with the token of the request
//! they forward; a replica that starts asks its peers for their target states with the
//! region's peer key, derived from the configured tokens (every replica runs the same file,
//! so they derive the same key, and no one without a token can).

use axum::http::{header, HeaderMap};
use sha2::{Digest as _, Sha256};
use subtle::ConstantTimeEq;

use super::hub::ApiError;
use crate::config::{Access, ApiConfig, ApiGrant};

/// An authenticated caller.
#[derive(Clone, Debug)]
pub enum Caller {
    /// An operator's token: its name and grant.
    Token {
        /// The token's name (`[api.tokens.<name>]`): what the audit log shows.
        name: String,
        /// What it grants.
        grant: ApiGrant,
    },
    /// Another replica of the region, with the peer key: may read target states only.
    Peer,
}

impl Caller {
    /// The name the audit log shows.
    pub fn name(&self) -> &str {
        match self {
            Self::Token { name, .. } => name,
            Self::Peer => "peer",
        }
    }

    /// Whether it may see `trigger` of `connection`.
    pub fn may_read(&self, connection: &str, trigger: &str) -> bool {
        match self {
            Self::Token { grant, .. } => grant.covers(connection, trigger),
            Self::Peer => false,
        }
    }

    /// Whether it may act on `trigger` of `connection`.
    pub fn may_act(&self, connection: &str, trigger: &str) -> bool {
        match self {
            Self::Token { grant, .. } => {
                grant.access == Access::Act && grant.covers(connection, trigger)
            }
            Self::Peer => false,
        }
    }

    /// Acting on `trigger` of `connection`: Ok, or why not (403).
    pub fn check_act(&self, connection: &str, trigger: &str) -> Result<(), ApiError> {
        if self.may_act(connection, trigger) {
            return Ok(());
        }
        let why = if self.may_read(connection, trigger) {
            "grants reading only"
        } else {
            "does not cover it"
        };
        Err(ApiError::Forbidden(format!(
            "token {:?} may not act on trigger {trigger:?} of connection {connection:?}: its grant {why}",
            self.name()
        )))
    }
}

/// The bearer token of `headers`.
fn presented(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            let (scheme, token) = v.split_once(' ')?;
            scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
        })
}

/// The caller of a request with `headers`, per `config`'s tokens.
pub fn authenticate(config: &ApiConfig, headers: &HeaderMap) -> Result<Caller, ApiError> {
    if config.tokens.is_empty() {
        return Err(ApiError::NotFound(
            "the operator API is off: no [api.tokens] are configured".to_owned(),
        ));
    }
    let Some(presented) = presented(headers) else {
        return Err(ApiError::Unauthenticated(
            "missing bearer token (Authorization: Bearer <token>)".to_owned(),
        ));
    };
    let mut found = None;
    for (name, grant) in &config.tokens {
        // Every token is compared, match or not, so timing does not tell which matched.
        let equal: bool = grant
            .token
            .expose()
            .as_bytes()
            .ct_eq(presented.as_bytes())
            .into();
        if equal && found.is_none() {
            found = Some(Caller::Token {
                name: name.clone(),
                grant: grant.clone(),
            });
        }
    }
    let peer: bool = peer_key(config)
        .as_bytes()
        .ct_eq(presented.as_bytes())
        .into();
    match (found, peer) {
        (Some(c), _) => Ok(c),
        (None, true) => Ok(Caller::Peer),
        (None, false) => Err(ApiError::Unauthenticated("invalid bearer token".to_owned())),
    }
}

/// The region's peer key: a SHA-256 over the configured tokens, the same on every replica
/// that runs the same configuration.
pub fn peer_key(config: &ApiConfig) -> String {
    let mut h = Sha256::new();
    h.update(b"tessel-kafka peer key v1\0");
    for (name, grant) in &config.tokens {
        h.update(name.as_bytes());
        h.update([0]);
        h.update(grant.token.expose().as_bytes());
        h.update([0]);
    }
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Secret;

    fn config() -> ApiConfig {
        let grant = |token: &str, access, triggers: &[&str]| ApiGrant {
            token: Secret::new(token),
            access,
            connections: vec!["orders".into()],
            triggers: triggers.iter().map(|t| (*t).to_owned()).collect(),
        };
        ApiConfig {
            listen: None,
            tokens: [
                (
                    "viewer".to_owned(),
                    grant("read-token-0123456789", Access::Read, &["*"]),
                ),
                (
                    "oncall".to_owned(),
                    grant("act-token-0123456789", Access::Act, &["fraud"]),
                ),
            ]
            .into(),
        }
    }

    fn bearer(token: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        let _ = h.insert(
            header::AUTHORIZATION,
            format!("Bearer {token}").parse().unwrap(),
        );
        h
    }

    #[test]
    fn tokens_grant_reading_or_acting_on_their_triggers_only() {
        let c = config();
        let viewer = authenticate(&c, &bearer("read-token-0123456789")).unwrap();
        assert_eq!(viewer.name(), "viewer");
        assert!(viewer.may_read("orders", "audit"));
        assert!(!viewer.may_act("orders", "fraud"));
        assert!(viewer
            .check_act("orders", "fraud")
            .unwrap_err()
            .to_string()
            .contains("reading only"));
        let oncall = authenticate(&c, &bearer("act-token-0123456789")).unwrap();
        assert!(oncall.may_act("orders", "fraud"));
        assert!(!oncall.may_act("orders", "audit"), "wrong trigger");
        assert!(!oncall.may_read("payments", "fraud"), "wrong connection");
        assert_eq!(
            authenticate(&c, &HeaderMap::new()).unwrap_err().status(),
            401
        );
        assert_eq!(
            authenticate(&c, &bearer("nope-0123456789abcdef"))
                .unwrap_err()
                .status(),
            401
        );
        let off = ApiConfig::default();
        assert_eq!(authenticate(&off, &bearer("x")).unwrap_err().status(), 404);
    }

    #[test]
    fn the_peer_key_comes_from_the_tokens_and_reads_nothing_of_theirs() {
        let c = config();
        let key = peer_key(&c);
        assert_eq!(key.len(), 64);
        assert_eq!(key, peer_key(&config()), "the same on every replica");
        let peer = authenticate(&c, &bearer(&key)).unwrap();
        assert!(matches!(peer, Caller::Peer));
        assert!(!peer.may_read("orders", "fraud") && !peer.may_act("orders", "fraud"));
        let mut other = config();
        other.tokens.remove("viewer");
        assert_ne!(peer_key(&other), key);
    }
}
