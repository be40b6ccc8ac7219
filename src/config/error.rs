//! Configuration errors: each names the offending key.

use thiserror::Error;

/// Why a configuration could not be used. Display is one line that names the key.
#[derive(Debug, Error)]
pub enum ConfigError {
    /// The file could not be read. The I/O error is part of the message and not a source, so
    /// that a chain printed as `a: b: c` names it once.
    #[error("cannot read config file {path}: {error}")]
    Read {
        /// The path given.
        path: String,
        /// The I/O error.
        error: std::io::Error,
    },
    /// The text is not valid TOML or does not fit the structs (unknown key, wrong type).
    #[error("{}", match key { Some(k) => format!("invalid config at `{k}`: {message}"), None => format!("invalid config: {message}") })]
    Parse {
        /// What the parser said.
        message: String,
        /// The key path, when known.
        key: Option<String>,
    },
    /// The file is not valid TOML.
    #[error("invalid config: {}{line}:{column}: {message}", file.as_deref().map(|f| format!("{f}:")).unwrap_or_default())]
    Syntax {
        /// The file, when the text was read from one.
        file: Option<String>,
        /// 1-based line of the error.
        line: usize,
        /// 1-based column (in characters) of the error.
        column: usize,
        /// What the parser said.
        message: String,
    },
    /// A value is present but not acceptable.
    #[error("invalid config at `{key}`: {reason}")]
    Invalid {
        /// The key path.
        key: String,
        /// Why it is refused.
        reason: String,
    },
}

impl ConfigError {
    pub(crate) fn invalid(key: impl Into<String>, reason: impl Into<String>) -> Self {
        Self::Invalid {
            key: key.into(),
            reason: reason.into(),
        }
    }
}
