//! TLS client settings from PEM files, shared by the Schema Registry client and the run
//! dispatcher client: `ca_location` (the CA bundle that signs the server's certificate,
//! *instead of* the system's roots), and `certificate_location` with `key_location` (the
//! client certificate and its unencrypted private key, for mTLS).
//!
//! Without `ca_location` the server is verified by the platform verifier (the system's trust
//! store), as both clients do by default. The system's roots are read and parsed once per
//! process, by the first configuration that needs them, and that verifier is shared by every
//! later one (a region starting 1,000 connections parses the store once, not 1,000 times); a
//! change to the system's store is seen when the process starts again.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use rustls::client::danger::ServerCertVerifier;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use thiserror::Error;

/// The PEM files of one TLS client; any may be absent. `certificate_location` and
/// `key_location` go together (the configuration checks it).
#[derive(Clone, Copy, Debug, Default)]
pub struct TlsFiles<'a> {
    /// CA certificates (PEM) that sign the server's certificate, instead of the system's.
    pub ca_location: Option<&'a Path>,
    /// Client certificate chain (PEM).
    pub certificate_location: Option<&'a Path>,
    /// Client private key (PEM: PKCS#8, PKCS#1 or SEC1, unencrypted).
    pub key_location: Option<&'a Path>,
}

impl<'a> TlsFiles<'a> {
    /// The files of a client configured by its `ca_location`, `certificate_location` and
    /// `key_location`.
    pub fn of(
        ca_location: &'a Option<PathBuf>,
        certificate_location: &'a Option<PathBuf>,
        key_location: &'a Option<PathBuf>,
    ) -> Self {
        Self {
            ca_location: ca_location.as_deref(),
            certificate_location: certificate_location.as_deref(),
            key_location: key_location.as_deref(),
        }
    }

    /// Whether any file is configured.
    pub fn any(&self) -> bool {
        self.ca_location.is_some()
            || self.certificate_location.is_some()
            || self.key_location.is_some()
    }

    /// Why the files cannot be used together, if they cannot: a client certificate needs its
    /// key, and a key its certificate (`role`: `registry`, `dispatcher`).
    pub fn unpaired(&self, role: &str) -> Option<String> {
        (self.certificate_location.is_some() != self.key_location.is_some())
            .then(|| format!("certificate_location and key_location go together ({role} mTLS)"))
    }
}

/// Why a TLS client configuration could not be built. `what` names the file's role, e.g.
/// `registry CA` or `dispatcher client key`.
#[derive(Debug, Error)]
pub enum TlsError {
    /// A file could not be read.
    #[error("cannot read {what} {path}: {source}")]
    File {
        /// Which file.
        what: String,
        /// Its path.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A file holds no usable PEM item of the kind expected.
    #[error("{what} {path} is not a usable PEM file: {reason}")]
    Pem {
        /// Which file.
        what: String,
        /// Its path.
        path: String,
        /// Why.
        reason: String,
    },
    /// rustls refused the settings (a key that does not match its certificate, or the
    /// platform verifier could not start).
    #[error("TLS for the {peer}: {source}")]
    Rustls {
        /// `registry` or `dispatcher`.
        peer: &'static str,
        /// rustls' error.
        source: rustls::Error,
    },
}

/// Reads a file, naming it in the error.
fn read(what: String, path: &Path) -> Result<(String, Vec<u8>), TlsError> {
    match std::fs::read(path) {
        Ok(bytes) => Ok((what, bytes)),
        Err(source) => Err(TlsError::File {
            what,
            path: path.display().to_string(),
            source,
        }),
    }
}

/// The certificates of a PEM file (at least one).
fn certificates(what: String, path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let (what, pem) = read(what, path)?;
    let pem_error = |what: String, reason: String| TlsError::Pem {
        what,
        path: path.display().to_string(),
        reason,
    };
    let certs = match CertificateDer::pem_slice_iter(&pem).collect::<Result<Vec<_>, _>>() {
        Ok(certs) => certs,
        Err(e) => return Err(pem_error(what, e.to_string())),
    };
    if certs.is_empty() {
        return Err(pem_error(what, "no CERTIFICATE in it".to_owned()));
    }
    Ok(certs)
}

/// The platform verifier over the system's roots, made by the first call that succeeds and
/// shared by every later one. A failure (no usable root in the system's store) is not kept:
/// the next call tries again, as each call did before the verifier was shared.
fn platform_verifier() -> Result<Arc<dyn ServerCertVerifier>, rustls::Error> {
    static VERIFIER: OnceLock<Arc<dyn ServerCertVerifier>> = OnceLock::new();
    if let Some(verifier) = VERIFIER.get() {
        return Ok(Arc::clone(verifier));
    }
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let made: Arc<dyn ServerCertVerifier> =
        Arc::new(rustls_platform_verifier::Verifier::new(provider)?);
    // Two first calls at once: both made one; every caller from now on gets the one kept.
    Ok(Arc::clone(VERIFIER.get_or_init(|| made)))
}

/// A rustls client configuration for `peer` (`registry` or `dispatcher`) with the aws-lc-rs
/// provider, TLS 1.2 and 1.3, no ALPN (the callers set it), and the given files.
pub fn client_config(
    peer: &'static str,
    files: TlsFiles<'_>,
) -> Result<rustls::ClientConfig, TlsError> {
    let rustls_error = |source| TlsError::Rustls { peer, source };
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(rustls_error)?;
    let builder = match files.ca_location {
        Some(path) => {
            let mut roots = rustls::RootCertStore::empty();
            for cert in certificates(format!("{peer} CA"), path)? {
                roots.add(cert).map_err(|e| TlsError::Pem {
                    what: format!("{peer} CA"),
                    path: path.display().to_string(),
                    reason: e.to_string(),
                })?;
            }
            builder.with_root_certificates(roots)
        }
        None => builder
            .dangerous()
            .with_custom_certificate_verifier(platform_verifier().map_err(rustls_error)?),
    };
    match (files.certificate_location, files.key_location) {
        (Some(cert), Some(key)) => {
            let chain = certificates(format!("{peer} client certificate"), cert)?;
            let (what, pem) = read(format!("{peer} client key"), key)?;
            let key_der = PrivateKeyDer::from_pem_slice(&pem).map_err(|e| TlsError::Pem {
                what,
                path: key.display().to_string(),
                reason: e.to_string(),
            })?;
            builder
                .with_client_auth_cert(chain, key_der)
                .map_err(rustls_error)
        }
        _ => Ok(builder.with_no_client_auth()),
    }
}

#[cfg(test)]
#[path = "tls_testing.rs"]
pub(crate) mod testing;

#[cfg(test)]
mod tests {
    use super::*;

    /// The platform verifier is made once and shared: the system's roots are parsed once.
    #[test]
    fn the_platform_verifier_is_made_once_and_shared() {
        let Ok(first) = platform_verifier() else {
            // A machine without system roots: nothing to share (each call fails, as before).
            return;
        };
        assert!(Arc::ptr_eq(&first, &platform_verifier().unwrap()));
        // Configurations without `ca_location` are built over it, with or without ALPN set
        // by their callers.
        let config = client_config("dispatcher", TlsFiles::default()).unwrap();
        assert!(config.alpn_protocols.is_empty());
    }

    #[test]
    fn unreadable_and_unusable_files_are_named_by_role_and_path() {
        let err = client_config(
            "dispatcher",
            TlsFiles {
                ca_location: Some(Path::new("/nonexistent/ca.pem")),
                ..TlsFiles::default()
            },
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.starts_with("cannot read dispatcher CA /nonexistent/ca.pem: "),
            "{err}"
        );

        let dir = tempfile::tempdir().unwrap();
        let junk = dir.path().join("junk.pem");
        std::fs::write(&junk, "not a certificate").unwrap();
        let err = client_config(
            "dispatcher",
            TlsFiles {
                ca_location: Some(&junk),
                ..TlsFiles::default()
            },
        )
        .unwrap_err()
        .to_string();
        assert_eq!(
            err,
            format!(
                "dispatcher CA {} is not a usable PEM file: no CERTIFICATE in it",
                junk.display()
            )
        );
    }
}
