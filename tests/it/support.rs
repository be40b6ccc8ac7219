//! Shared test helpers: the stack's addresses, unique names, polling with a deadline, the
//! reference producer, and running the connector in-process or as a subprocess.
#![allow(dead_code, unreachable_pub)]

use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
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

/// Serves `app` on 127.0.0.1 from a thread and runtime of its own; returns the address.
///
/// A stand-in HTTP server spawned on a test's own runtime (`#[tokio::test]` is one
/// thread) answers only while the test awaits: a blocking call in the test (a Kafka query
/// such as [`crate::broker::committed`], which can take seconds while a coordinator loads
/// under the parallel tests) holds its answers past the connector's dispatch timeout, and
/// the connector sends the request again. A server that records raw requests then sees it
/// twice.
pub fn serve_on_own_thread(app: axum::Router) -> std::net::SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.set_nonblocking(true).expect("non-blocking");
    let addr = listener.local_addr().expect("address");
    std::thread::Builder::new()
        .name(format!("stand-in-{}", addr.port()))
        .spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).expect("listener");
                let _ = axum::serve(listener, app).await;
            });
        })
        .expect("thread");
    addr
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

/// A TCP port free on 127.0.0.1 right now, for a server a test starts (a daemon's listen
/// address), never handed out twice in this process.
///
/// Not a port the kernel picks (bind to port 0): it hands the same one to two tests that ask
/// one after the other once the first probe closed, and the kernel's ephemeral range
/// (32768-60999 on Linux by default) is also where the local ports of outgoing connections
/// come from, so a port found free there can be taken before the daemon binds it. Seen in
/// CI rehearsals: a replica failing with "Address already in use", and a test's produce
/// request answered by another test's daemon. These come from 23000-31999 (the local stack
/// listens below 20000), in turn from a start drawn from the process id.
pub fn free_port() -> u16 {
    const LOW: u32 = 23_000;
    const SPAN: u32 = 9_000;
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let start = std::process::id() % SPAN;
    for _ in 0..SPAN {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = u16::try_from(LOW + (start + n) % SPAN).expect("a port");
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port in {LOW}-{}", LOW + SPAN - 1)
}

/// A connector running in this process, on a thread and runtime of its own (a multi-thread
/// runtime, as the daemon's), so that nothing the test does blocks it: a blocking Kafka
/// query in a test, which can take seconds while a coordinator loads under the parallel
/// tests, used to hold the connector's tasks on the test's one-thread runtime, and its
/// dispatches timed out and went out again.
pub struct Connector {
    token: tokio_util::sync::CancellationToken,
    done: Option<tokio::sync::oneshot::Receiver<anyhow::Result<()>>>,
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
        let token = tokio_util::sync::CancellationToken::new();
        let (built_tx, built_rx) = std::sync::mpsc::channel::<Result<(), String>>();
        let (done_tx, done_rx) = tokio::sync::oneshot::channel();
        let run_token = token.clone();
        let _ = std::thread::Builder::new()
            .name("connector".to_owned())
            .spawn(move || {
                let runtime = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .enable_all()
                    .build()
                    .expect("the connector's runtime");
                let result = runtime.block_on(async move {
                    // Built on its own runtime: the clients and servers it makes belong there.
                    let app = match tessel_kafka::app::App::build(config) {
                        Ok(app) => {
                            let _ = built_tx.send(Ok(()));
                            app
                        }
                        Err(e) => {
                            let _ = built_tx.send(Err(format!("{e:#}")));
                            return Err(anyhow::Error::from(e));
                        }
                    };
                    app.run(run_token, serve).await
                });
                let _ = done_tx.send(result);
                runtime.shutdown_timeout(Duration::from_secs(10));
            })
            .expect("the connector's thread");
        match built_rx.recv() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => panic!("app builds: {e}"),
            Err(_) => panic!("app builds: its thread ended without a word (it panicked)"),
        }
        Self {
            token,
            done: Some(done_rx),
        }
    }

    /// Orderly shutdown: drain, commit, close.
    pub async fn stop(mut self) {
        self.token.cancel();
        let done = self.done.take().expect("running");
        tokio::time::timeout(Duration::from_secs(60), done)
            .await
            .expect("connector stops within 60 s")
            .expect("connector thread ended without a result (it panicked)")
            .expect("connector result");
    }
}

impl Drop for Connector {
    /// One not stopped (a test that failed midway) stops in the background.
    fn drop(&mut self) {
        self.token.cancel();
    }
}

/// `topic` as the records' idempotency keys name it: `<topic>@<id>` where the cluster at
/// `bootstrap` has topic ids, else the name (see `tessel_kafka::dispatch::event::key_topic`).
///
/// For a real broker: asked again until the answer names the topic (within 30 s). Under the
/// parallel tests one request can time out, and a topic just created can be described with
/// an error for a moment; either would give the bare name, which no record's key carries.
pub fn key_topic(bootstrap: &str, topic: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match topic_id(bootstrap, topic) {
            Ok(Some(id)) => {
                return tessel_kafka::dispatch::event::key_topic(topic, id.as_deref()).into_owned()
            }
            answer if Instant::now() < deadline => {
                eprintln!("topic id of {topic}: {answer:?}; asking again");
                std::thread::sleep(Duration::from_millis(200));
            }
            answer => panic!("no topic id of {topic} from {bootstrap} within 30 s: {answer:?}"),
        }
    }
}

/// Like [`key_topic`], asked once: for librdkafka's mock cluster, which does not answer
/// DescribeTopics (no id, as the connector then has none either).
pub fn key_topic_once(bootstrap: &str, topic: &str) -> String {
    let id = topic_id(bootstrap, topic).ok().flatten().flatten();
    tessel_kafka::dispatch::event::key_topic(topic, id.as_deref()).into_owned()
}

/// `topic`'s id as the cluster at `bootstrap` describes it: `Ok(None)` when the answer does
/// not name the topic, `Ok(Some(None))` when it names it without an id.
fn topic_id(bootstrap: &str, topic: &str) -> Result<Option<Option<String>>, String> {
    let consumer: rdkafka::consumer::BaseConsumer = rdkafka::config::ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .expect("consumer");
    tessel_kafka::consumer::topic_ids(
        rdkafka::consumer::Consumer::client(&consumer),
        &[topic.to_owned()],
        Duration::from_secs(5),
    )
    .map(|ids| ids.get(topic).cloned())
    .map_err(|e| e.to_string())
}
