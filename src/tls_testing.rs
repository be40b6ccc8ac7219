//! Test support: a private CA made with the `openssl` command, a local TLS server that
//! requires and verifies client certificates, and a local CONNECT proxy that records its
//! tunnels. Compiled for tests only (the crate's, and tests/it's through `#[path]`).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};

const OPENSSL_CONFIG: &str = "\
[req]
distinguished_name = dn
prompt = no
[dn]
CN = tessel-kafka test
[ca]
basicConstraints = critical,CA:TRUE
keyUsage = critical,keyCertSign
subjectKeyIdentifier = hash
[server]
basicConstraints = CA:FALSE
extendedKeyUsage = serverAuth
subjectAltName = IP:127.0.0.1
[client]
basicConstraints = CA:FALSE
extendedKeyUsage = clientAuth
";

/// A private CA and a server and a client certificate it signed, in a temporary directory.
pub(crate) struct Pki {
    dir: tempfile::TempDir,
}

impl Pki {
    pub(crate) fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Makes `ca` (a CA named `name`), and with `leaves`, `server` (for 127.0.0.1) and
    /// `client`.
    pub(crate) fn new(name: &str, leaves: bool) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::write(dir.path().join("openssl.cnf"), OPENSSL_CONFIG).expect("openssl.cnf");
        let pki = Self { dir };
        let ec = [
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
        ];
        pki.openssl(&[
            &[
                "req",
                "-x509",
                "-config",
                "openssl.cnf",
                "-extensions",
                "ca",
            ],
            &ec[..],
            &["-subj", &format!("/CN={name}"), "-days", "2"],
            &["-keyout", "ca.key", "-out", "ca.pem"],
        ]);
        if leaves {
            for (serial, name) in [("2", "server"), ("3", "client")] {
                pki.openssl(&[
                    &["req", "-new", "-config", "openssl.cnf"],
                    &ec[..],
                    &["-subj", &format!("/CN={name}")],
                    &[
                        "-keyout",
                        &format!("{name}.key"),
                        "-out",
                        &format!("{name}.csr"),
                    ],
                ]);
                pki.openssl(&[
                    &["x509", "-req", "-in", &format!("{name}.csr")],
                    &["-CA", "ca.pem", "-CAkey", "ca.key", "-set_serial", serial],
                    &["-days", "2", "-extfile", "openssl.cnf", "-extensions", name],
                    &["-out", &format!("{name}.pem")],
                ]);
            }
        }
        pki
    }

    fn openssl(&self, args: &[&[&str]]) {
        let out = std::process::Command::new("openssl")
            .args(args.concat())
            .current_dir(self.dir.path())
            .output()
            .expect("the openssl command runs");
        assert!(
            out.status.success(),
            "openssl {:?}: {}",
            args.concat(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

fn certs(path: &Path) -> Vec<CertificateDer<'static>> {
    CertificateDer::pem_file_iter(path)
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

/// What the TLS dispatcher saw.
#[derive(Default)]
pub(crate) struct Seen {
    /// Request bodies, each with the number of client certificates presented.
    pub(crate) requests: Vec<(String, usize)>,
    /// TLS handshakes it refused.
    pub(crate) refused: usize,
}

/// An HTTP server on 127.0.0.1 serving TLS with `pki`'s server certificate, which requires a
/// client certificate signed by `pki`'s CA and answers each request with 200 and `[]`.
pub(crate) async fn mtls_server(pki: &Pki) -> (u16, Arc<Mutex<Seen>>) {
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for c in certs(&pki.path("ca.pem")) {
        roots.add(c).unwrap();
    }
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        Arc::clone(&provider),
    )
    .build()
    .unwrap();
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_client_cert_verifier(verifier)
        .with_single_cert(
            certs(&pki.path("server.pem")),
            PrivateKeyDer::from_pem_file(pki.path("server.key")).unwrap(),
        )
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen = Arc::new(Mutex::new(Seen::default()));
    let record = Arc::clone(&seen);
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            let record = Arc::clone(&record);
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(tcp).await else {
                    record.lock().unwrap().refused += 1;
                    return;
                };
                let presented = tls.get_ref().1.peer_certificates().map_or(0, <[_]>::len);
                while let Some(body) = read_request(&mut tls).await {
                    record.lock().unwrap().requests.push((body, presented));
                    let answer = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\
                                   content-length: 2\r\n\r\n[]";
                    if tls.write_all(answer).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (port, seen)
}

/// One HTTP/1.1 request's body, or None when the connection ends first.
pub(crate) async fn read_request(io: &mut (impl AsyncRead + Unpin)) -> Option<String> {
    let head = read_head(io).await?;
    let mut body = vec![0u8; content_length(&head)];
    io.read_exact(&mut body).await.ok()?;
    Some(String::from_utf8(body).unwrap())
}

/// The Content-Length a request or answer head gives, 0 without one.
pub(crate) fn content_length(head: &str) -> usize {
    head.lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("content-length: ")
                .map(|v| v.trim().parse().unwrap())
        })
        .unwrap_or(0)
}

/// A request or answer head up to its blank line, read byte by byte (nothing after it is
/// consumed), or None when the connection ends first.
pub(crate) async fn read_head(io: &mut (impl AsyncRead + Unpin)) -> Option<String> {
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        head.push(io.read_u8().await.ok()?);
    }
    Some(String::from_utf8(head).unwrap())
}

/// A CONNECT proxy on 127.0.0.1; returns its port and the head of each tunnel it opened.
pub(crate) async fn connect_proxy() -> (u16, Arc<Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let tunnels = Arc::new(Mutex::new(Vec::new()));
    let record = Arc::clone(&tunnels);
    tokio::spawn(async move {
        while let Ok((mut client, _)) = listener.accept().await {
            let record = Arc::clone(&record);
            tokio::spawn(async move {
                let Some(head) = read_head(&mut client).await else {
                    return;
                };
                let target = head
                    .strip_prefix("CONNECT ")
                    .and_then(|rest| rest.split(' ').next())
                    .expect("a CONNECT request")
                    .to_owned();
                record.lock().unwrap().push(head);
                let mut upstream = TcpStream::connect(target).await.unwrap();
                client
                    .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
                    .await
                    .unwrap();
                let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
            });
        }
    });
    (port, tunnels)
}
