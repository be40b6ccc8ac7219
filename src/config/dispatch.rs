//! `[dispatch]`: the connections the daemon keeps to run dispatchers, shared by every trigger
//! that posts to the same origin.

use serde::{Deserialize, Serialize};

use super::ConfigError;

/// How many connections the daemon keeps to each dispatcher origin. Triggers whose
/// dispatchers have the same origin (scheme, host and port) and the same TLS files and proxy
/// share one HTTP client and its pool, so a region whose tenants all post to Tessel's run
/// dispatcher holds sockets in proportion to the runs in flight, not to the triggers.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct DispatchConfig {
    /// The most requests in flight to one origin, and so the most connections in use to it;
    /// a run beyond it waits for one to finish (before its `timeout_ms` starts). Default 1024.
    #[serde(default = "default_max_connections")]
    pub max_connections_per_origin: usize,
    /// The most idle keep-alive connections kept open to one origin once a burst is over.
    /// Default 128.
    #[serde(default = "default_max_idle")]
    pub max_idle_per_origin: usize,
}

impl Default for DispatchConfig {
    fn default() -> Self {
        Self {
            max_connections_per_origin: default_max_connections(),
            max_idle_per_origin: default_max_idle(),
        }
    }
}

fn default_max_connections() -> usize {
    1_024
}

fn default_max_idle() -> usize {
    128
}

/// The largest `max_connections_per_origin`.
pub const MAX_CONNECTIONS_PER_ORIGIN: usize = 100_000;

impl DispatchConfig {
    /// Rules serde cannot express.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.max_connections_per_origin == 0
            || self.max_connections_per_origin > MAX_CONNECTIONS_PER_ORIGIN
        {
            return Err(ConfigError::invalid(
                "dispatch.max_connections_per_origin",
                format!("must be between 1 and {MAX_CONNECTIONS_PER_ORIGIN}"),
            ));
        }
        if self.max_idle_per_origin > self.max_connections_per_origin {
            return Err(ConfigError::invalid(
                "dispatch.max_idle_per_origin",
                "must not exceed max_connections_per_origin",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_are_checked() {
        let d: DispatchConfig = toml::from_str("").unwrap();
        assert_eq!(d, DispatchConfig::default());
        d.validate().unwrap();
        for (text, key) in [
            (
                "max_connections_per_origin = 0",
                "max_connections_per_origin",
            ),
            (
                "max_connections_per_origin = 4\nmax_idle_per_origin = 5",
                "max_idle_per_origin",
            ),
        ] {
            let d: DispatchConfig = toml::from_str(text).unwrap();
            let err = d.validate().unwrap_err().to_string();
            assert!(err.contains(key), "{text}: {err}");
        }
    }
}
