//! Shared test helpers: the stack's addresses, unique names, polling with a deadline, the
//! reference producer, and running the connector in-process or as a subprocess.
#![allow(dead_code, unreachable_pub)]

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The test stack, from the env file `scripts/stack` writes (exported by `scripts/test`).
#[derive(Debug, Clone)]
pub struct Stack {
    pub kafka_version: String,
    pub apicurio_version: String,
    pub bootstrap: String,
    pub bootstrap_sasl_plaintext: String,
    pub bootstrap_sasl_ssl: String,
    pub bootstrap_ssl: String,
    pub ca_pem: String,
    pub client_cert_pem: String,
    pub client_key_pem: String,
    pub wrong_ca_pem: String,
    pub admin_user: String,
    pub admin_password: String,
    pub limited_user: String,
    pub limited_password: String,
    pub acl_prefix: String,
    pub registry_url: String,
    pub python: String,
    pub stack_dir: String,
}

fn var(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| {
        panic!(
            "{name} is not set: the broker tests need the stack. Run them with scripts/test, \
             or `scripts/stack up` and `source \"$(scripts/stack env-file)\"` first"
        )
    })
}

/// The stack; panics (fails the test) when it is not configured.
pub fn stack() -> &'static Stack {
    static STACK: OnceLock<Stack> = OnceLock::new();
    STACK.get_or_init(|| Stack {
        kafka_version: var("TESSEL_IT_KAFKA_VERSION"),
        apicurio_version: var("TESSEL_IT_APICURIO_VERSION"),
        bootstrap: var("TESSEL_IT_BOOTSTRAP"),
        bootstrap_sasl_plaintext: var("TESSEL_IT_BOOTSTRAP_SASL_PLAINTEXT"),
        bootstrap_sasl_ssl: var("TESSEL_IT_BOOTSTRAP_SASL_SSL"),
        bootstrap_ssl: var("TESSEL_IT_BOOTSTRAP_SSL"),
        ca_pem: var("TESSEL_IT_CA_PEM"),
        client_cert_pem: var("TESSEL_IT_CLIENT_CERT_PEM"),
        client_key_pem: var("TESSEL_IT_CLIENT_KEY_PEM"),
        wrong_ca_pem: var("TESSEL_IT_WRONG_CA_PEM"),
        admin_user: var("TESSEL_IT_ADMIN_USER"),
        admin_password: var("TESSEL_IT_ADMIN_PASSWORD"),
        limited_user: var("TESSEL_IT_LIMITED_USER"),
        limited_password: var("TESSEL_IT_LIMITED_PASSWORD"),
        acl_prefix: var("TESSEL_IT_ACL_PREFIX"),
        registry_url: var("TESSEL_IT_REGISTRY_URL"),
        python: var("TESSEL_IT_PYTHON"),
        stack_dir: var("TESSEL_IT_STACK_DIR"),
    })
}

/// A name unique to this test run and call: `prefix-<pid>-<n>-<random>`.
pub fn unique(prefix: &str) -> String {
    static N: AtomicUsize = AtomicUsize::new(0);
    format!(
        "{prefix}-{}-{}-{:06x}",
        std::process::id(),
        N.fetch_add(1, Ordering::SeqCst),
        rand::random::<u32>() & 0xff_ffff
    )
}

/// Polls `check` until it returns Some or `timeout` passes; panics with `what` on timeout.
pub async fn wait_for<T>(what: &str, timeout: Duration, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = check() {
            return v;
        }
        if Instant::now() > deadline {
            panic!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Like [`wait_for`] with an async check.
pub async fn wait_for_async<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        if Instant::now() > deadline {
            panic!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The repository root.
pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The built `tessel-kafka` binary.
pub fn binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_tessel-kafka"))
}

/// Writes `text` to a temporary TOML file and returns its path (kept until the process ends).
pub fn temp_config(text: &str) -> PathBuf {
    let dir = std::env::temp_dir().join("tessel-kafka-tests");
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join(format!("{}.toml", unique("config")));
    std::fs::write(&path, text).expect("write config");
    path
}

/// A TCP port free on 127.0.0.1 right now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// A connector running in this process.
pub struct Connector {
    token: tokio_util::sync::CancellationToken,
    handle: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl Connector {
    /// Builds and starts the connector from TOML text.
    pub fn start(toml: &str) -> Self {
        Self::start_with(toml, false)
    }

    /// Like [`Connector::start`]; `serve` also starts its HTTP server (metrics, health and
    /// the produce API) on `[server] listen`.
    pub fn start_with(toml: &str, serve: bool) -> Self {
        let config = tessel_kafka::config::Config::from_toml_with_env(toml, Vec::new())
            .unwrap_or_else(|e| panic!("{e}\n{toml}"));
        let app = tessel_kafka::app::App::build(config).expect("app builds");
        let token = tokio_util::sync::CancellationToken::new();
        let handle = tokio::spawn(app.run(token.clone(), serve));
        Self { token, handle }
    }

    /// Orderly shutdown: drain, commit, close.
    pub async fn stop(self) {
        self.token.cancel();
        tokio::time::timeout(Duration::from_secs(60), self.handle)
            .await
            .expect("connector stops within 60 s")
            .expect("connector task")
            .expect("connector result");
    }
}
