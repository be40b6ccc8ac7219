//! AWS credentials for MSK IAM from the default chain, kept fresh by a background task.
//!
//! The chain is aws-config's, the one the AWS SDKs use: environment variables, the shared
//! config and credentials files (`AWS_PROFILE`), web identity (IRSA:
//! `AWS_WEB_IDENTITY_TOKEN_FILE` + `AWS_ROLE_ARN`), container credentials (ECS task roles and
//! EKS Pod Identity: `AWS_CONTAINER_CREDENTIALS_RELATIVE_URI` / `…_FULL_URI`), then the
//! instance profile (IMDS).
//!
//! # Why a task and a slot
//! librdkafka asks for a new OAUTHBEARER token in a callback on its own thread (whichever
//! thread polls the client), not on the tokio runtime, and the chain's providers are async
//! (HTTP to STS, the container endpoint, IMDS). So a task on the runtime resolves the chain and
//! keeps the latest credentials in a [`CredentialSlot`]; the callback only reads the slot (a
//! mutex held for a clone) and signs. The task resolves again before the credentials expire
//! (five minutes before, or halfway through a shorter life), every five minutes for
//! credentials without expiry (environment, profile keys), and after a failure with backoff
//! (1 s doubling to 60 s) while the last good credentials stay in use until they expire. It
//! ends when the last signer holding the slot is dropped.
//!
//! Nothing here logs or displays a credential: log lines carry the time to expiry only (`Credentials`' own Debug shows the access key id, so it is never logged).

use std::sync::{Arc, Condvar, Mutex, Weak};
use std::time::{Duration, SystemTime};

use aws_credential_types::provider::ProvideCredentials;
use aws_credential_types::Credentials;

/// How long before expiry credentials are resolved again (at most; half the lifetime for
/// shorter-lived ones).
const REFRESH_BEFORE_EXPIRY: Duration = Duration::from_secs(300);
/// How often credentials without an expiry are resolved again.
const REFRESH_WITHOUT_EXPIRY: Duration = Duration::from_secs(300);
/// The shortest wait between two resolutions that succeeded.
const MIN_REFRESH: Duration = Duration::from_secs(1);
/// One resolution of the chain may take this long (each provider has its own timeouts).
const RESOLVE_TIMEOUT: Duration = Duration::from_secs(30);
/// Backoff after a failed resolution: from 1 s, doubling, up to 60 s.
const MAX_BACKOFF: Duration = Duration::from_secs(60);
/// How long a token request waits for the chain's first answer.
pub(crate) const FIRST_CREDENTIALS_WAIT: Duration = Duration::from_secs(10);

#[derive(Default)]
struct SlotState {
    /// The latest credentials resolved.
    latest: Option<Credentials>,
    /// Why the last resolution failed (cleared by a success); never holds a credential.
    error: Option<String>,
    /// Resolutions finished, successful or not.
    resolutions: u64,
}

/// The latest credentials the background task resolved, readable from any thread.
pub struct CredentialSlot {
    state: Mutex<SlotState>,
    changed: Condvar,
}

impl std::fmt::Debug for CredentialSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = self.lock();
        f.debug_struct("CredentialSlot")
            .field("has_credentials", &state.latest.is_some())
            .field(
                "expiry",
                &state.latest.as_ref().and_then(Credentials::expiry),
            )
            .field("error", &state.error)
            .field("resolutions", &state.resolutions)
            .finish()
    }
}

/// Why no credentials can be used now. Never contains a credential.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CredentialsUnavailable {
    /// The chain has not answered yet.
    #[error("the AWS credential chain has not answered within {0:?}")]
    Pending(Duration),
    /// The chain found no credentials, or failed.
    #[error("the AWS credential chain found no credentials: {0}")]
    Failed(String),
    /// The last credentials expired and resolving new ones fails.
    #[error("the AWS credentials expired and new ones cannot be resolved: {0}")]
    Expired(String),
}

impl CredentialSlot {
    /// A slot nothing fills (its token requests wait, then fail as pending).
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::new(SlotState::default()),
            changed: Condvar::new(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, SlotState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Starts resolving `provider` on the runtime of `handle`, now and whenever the
    /// credentials near their expiry.
    pub fn spawn<P>(provider: P, handle: &tokio::runtime::Handle) -> Arc<Self>
    where
        P: ProvideCredentials + 'static,
    {
        let slot = Self::new();
        // Detached: the task ends by itself once the slot is dropped.
        drop(handle.spawn(keep_fresh(provider, Arc::downgrade(&slot))));
        slot
    }

    /// Starts resolving aws-config's default chain (with `region` for STS, and the shared
    /// files' `profile` instead of `AWS_PROFILE` when given) on the runtime of `handle`.
    pub fn spawn_default_chain(
        region: String,
        profile: Option<String>,
        handle: &tokio::runtime::Handle,
    ) -> Arc<Self> {
        let slot = Self::new();
        let weak = Arc::downgrade(&slot);
        drop(handle.spawn(async move {
            let mut builder =
                aws_config::default_provider::credentials::DefaultCredentialsChain::builder()
                    .region(aws_config::Region::new(region));
            if let Some(profile) = &profile {
                builder = builder.profile_name(profile);
            }
            let chain = builder.build().await;
            keep_fresh(chain, weak).await;
        }));
        slot
    }

    /// The default chain's slot for `region` and `profile`, shared by every signer of the
    /// process with both (the consumer's, the producer's, probes'), so the chain is resolved
    /// once per refresh whatever the number of clients. Started on the current tokio runtime.
    pub fn shared_default_chain(
        region: &str,
        profile: Option<&str>,
    ) -> Result<Arc<Self>, CredentialsUnavailable> {
        type Chains = Vec<((String, Option<String>), Weak<CredentialSlot>)>;
        static CHAINS: Mutex<Chains> = Mutex::new(Vec::new());
        let key = (region.to_owned(), profile.map(str::to_owned));
        let mut chains = CHAINS.lock().unwrap_or_else(|p| p.into_inner());
        chains.retain(|(_, slot)| slot.strong_count() > 0);
        if let Some(slot) = chains
            .iter()
            .find(|(k, _)| *k == key)
            .and_then(|(_, slot)| slot.upgrade())
        {
            return Ok(slot);
        }
        let handle = tokio::runtime::Handle::try_current().map_err(|_| {
            CredentialsUnavailable::Failed(
                "the credential chain needs the tokio runtime".to_owned(),
            )
        })?;
        let slot = Self::spawn_default_chain(key.0.clone(), key.1.clone(), &handle);
        chains.push((key, Arc::downgrade(&slot)));
        Ok(slot)
    }

    /// The current credentials, waiting up to `first_wait` for the chain's first answer.
    /// Credentials past their expiry are not handed out.
    pub fn current(&self, first_wait: Duration) -> Result<Credentials, CredentialsUnavailable> {
        let state = self.lock();
        let (state, _) = self
            .changed
            .wait_timeout_while(state, first_wait, |s| s.resolutions == 0)
            .unwrap_or_else(|p| p.into_inner());
        match (&state.latest, &state.error) {
            (Some(c), _) if c.expiry().is_none_or(|e| e > SystemTime::now()) => Ok(c.clone()),
            (Some(_), error) => Err(CredentialsUnavailable::Expired(
                error.clone().unwrap_or_else(|| "no answer yet".to_owned()),
            )),
            (None, Some(error)) => Err(CredentialsUnavailable::Failed(error.clone())),
            (None, None) => Err(CredentialsUnavailable::Pending(first_wait)),
        }
    }

    fn store(&self, result: Result<Credentials, String>) {
        let mut state = self.lock();
        state.resolutions += 1;
        match result {
            Ok(c) => {
                state.latest = Some(c);
                state.error = None;
            }
            Err(e) => state.error = Some(e),
        }
        drop(state);
        self.changed.notify_all();
    }
}

/// When to resolve again credentials that expire at `expiry`, seen at `now`.
pub(crate) fn next_refresh(expiry: Option<SystemTime>, now: SystemTime) -> Duration {
    let Some(expiry) = expiry else {
        return REFRESH_WITHOUT_EXPIRY;
    };
    let left = expiry.duration_since(now).unwrap_or_default();
    let before = REFRESH_BEFORE_EXPIRY.min(left / 2);
    (left - before).max(MIN_REFRESH)
}

/// Resolves `provider` into `slot` until the slot is dropped.
async fn keep_fresh<P: ProvideCredentials>(provider: P, slot: Weak<CredentialSlot>) {
    let mut backoff = MIN_REFRESH;
    loop {
        let result =
            match tokio::time::timeout(RESOLVE_TIMEOUT, provider.provide_credentials()).await {
                Ok(Ok(c)) => Ok(c),
                Ok(Err(e)) => Err(crate::config::redacted_error_chain(&e)),
                Err(_) => Err(format!("no answer within {RESOLVE_TIMEOUT:?}")),
            };
        let Some(target) = slot.upgrade() else {
            return;
        };
        let wait = match &result {
            Ok(c) => {
                backoff = MIN_REFRESH;
                let expires_in_s = c.expiry().map(|e| {
                    e.duration_since(SystemTime::now())
                        .unwrap_or_default()
                        .as_secs()
                });
                tracing::info!(expires_in_s, "aws credentials resolved");
                next_refresh(c.expiry(), SystemTime::now())
            }
            Err(error) => {
                tracing::warn!(error = %error, retry_in_ms = backoff.as_millis() as u64, "cannot resolve aws credentials");
                let wait = backoff;
                backoff = (backoff * 2).min(MAX_BACKOFF);
                wait
            }
        };
        target.store(result);
        drop(target);
        tokio::time::sleep(wait).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clients::security::{MskIamSigner, SecurityContext};
    use base64::Engine as _;
    use rdkafka::client::ClientContext as _;
    use std::sync::atomic::{AtomicU64, Ordering};

    #[test]
    fn refresh_comes_before_expiry() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let h = Duration::from_secs(3600);
        // Six-hour role credentials: five minutes before they expire.
        assert_eq!(
            next_refresh(Some(now + 6 * h), now),
            6 * h - Duration::from_secs(300)
        );
        // Short-lived ones: halfway.
        assert_eq!(
            next_refresh(Some(now + Duration::from_secs(4)), now),
            Duration::from_secs(2)
        );
        // Expired or about to: soon, but not in a tight loop.
        assert_eq!(next_refresh(Some(now - h), now), MIN_REFRESH);
        assert_eq!(next_refresh(None, now), REFRESH_WITHOUT_EXPIRY);
    }

    /// A chain that answers once with credentials valid for a few seconds, then fails: the
    /// good credentials stay in use until they expire, and a chain that never had any says
    /// why; neither shows a secret.
    #[test]
    fn a_failing_chain_keeps_the_last_good_credentials_and_says_why_without_secrets() {
        use aws_credential_types::credential_fn::provide_credentials_fn;
        use aws_credential_types::provider::error::CredentialsError;
        let rt = tokio::runtime::Runtime::new().unwrap();
        let calls = Arc::new(AtomicU64::new(0));
        let counted = Arc::clone(&calls);
        let expiry = SystemTime::now() + Duration::from_secs(8);
        let slot = CredentialSlot::spawn(
            provide_credentials_fn(move || {
                let n = counted.fetch_add(1, Ordering::SeqCst);
                async move {
                    if n == 0 {
                        Ok(Credentials::new(
                            "AKIDONCE",
                            "once-secret-do-not-log",
                            None,
                            Some(expiry),
                            "test",
                        ))
                    } else {
                        Err(CredentialsError::provider_error("endpoint down"))
                    }
                }
            }),
            rt.handle(),
        );
        assert_eq!(
            slot.current(FIRST_CREDENTIALS_WAIT)
                .unwrap()
                .access_key_id(),
            "AKIDONCE"
        );
        // Resolved again halfway (4 s), which fails.
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while slot.lock().error.is_none() {
            assert!(std::time::Instant::now() < deadline, "no second resolution");
            std::thread::sleep(Duration::from_millis(10));
        }
        let checked_at = SystemTime::now();
        let still = slot.current(Duration::ZERO);
        if checked_at < expiry {
            assert_eq!(still.unwrap().access_key_id(), "AKIDONCE");
        }
        let failing = CredentialSlot::spawn(
            provide_credentials_fn(|| async {
                Err(CredentialsError::not_loaded(
                    "no provider in the chain had credentials",
                ))
            }),
            rt.handle(),
        );
        let e = failing.current(FIRST_CREDENTIALS_WAIT).unwrap_err();
        assert!(
            matches!(&e, CredentialsUnavailable::Failed(why) if why.contains("no provider in the chain had credentials")),
            "{e}"
        );
        let shown = format!("{slot:?}{e}");
        assert!(shown.contains("endpoint down"), "{shown}");
        assert!(
            !shown.contains("do-not-log") && !shown.contains("AKIDONCE"),
            "{shown}"
        );
    }

    /// Marks the child process of the rotation test (which runs alone, with its own
    /// environment, so that no other test sees the AWS variables it sets).
    const CHILD: &str = "TESSEL_KAFKA_TEST_ROTATION_CHILD";
    /// How long each served credential lives.
    const SERVED_LIFETIME: Duration = Duration::from_secs(3);
    /// Distinct credentials the child must see signed into tokens.
    const ROTATIONS: usize = 3;

    /// RFC 3339 UTC (`2026-12-03T14:00:00Z`) of `t`, as container endpoints write Expiration.
    fn rfc3339(t: SystemTime) -> String {
        let secs = t.duration_since(SystemTime::UNIX_EPOCH).unwrap().as_secs() as i64;
        let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
        // Civil date from days since 1970-01-01 (proleptic Gregorian).
        let z = days + 719_468;
        let era = z.div_euclid(146_097);
        let doe = z - era * 146_097;
        let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
        let mp = (5 * doy + 2) / 153;
        let d = doy - (153 * mp + 2) / 5 + 1;
        let m = if mp < 10 { mp + 3 } else { mp - 9 };
        let y = yoe + era * 400 + i64::from(m <= 2);
        format!(
            "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
            rem / 3600,
            rem % 3600 / 60,
            rem % 60
        )
    }

    #[test]
    fn rfc3339_formats_known_instants() {
        let at = |s: u64| SystemTime::UNIX_EPOCH + Duration::from_secs(s);
        assert_eq!(rfc3339(at(0)), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(at(1_709_296_200)), "2024-03-01T12:30:00Z");
        assert_eq!(rfc3339(at(951_782_400)), "2000-02-29T00:00:00Z");
    }

    /// The ECS / EKS Pod Identity container-credentials endpoint: each request gets new
    /// keys (`ASIAROTATE000001`, …) that expire [`SERVED_LIFETIME`] later.
    async fn serve_rotating_credentials(served: Arc<AtomicU64>) -> std::net::SocketAddr {
        use axum::routing::get;
        let app = axum::Router::new().route(
            "/creds",
            get(move || {
                let n = served.fetch_add(1, Ordering::SeqCst) + 1;
                async move {
                    axum::Json(serde_json::json!({
                        "AccessKeyId": format!("ASIAROTATE{n:06}"),
                        "SecretAccessKey": format!("rotating-secret-{n}-do-not-log"),
                        "Token": format!("rotating-session-{n}-do-not-log"),
                        "Expiration": rfc3339(SystemTime::now() + SERVED_LIFETIME),
                    }))
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        addr
    }

    /// MSK IAM with the default chain, credentials from a container endpoint that rotates
    /// them every few seconds: every token librdkafka's callback gets is signed with the
    /// credentials current then (its X-Amz-Credential names their access key id, and its
    /// session token is theirs), the signed key changes as they rotate, the token expires no
    /// later than its credentials, and no credential reaches a log line or Debug output.
    ///
    /// A signer whose connection names a profile (`awsProfileName`) signs with that
    /// profile's keys from the shared credentials file instead.
    ///
    /// The chain reads the process environment, so the scenario runs in a child process
    /// (this test binary, this test alone) with a cleared environment holding only
    /// `AWS_CONTAINER_CREDENTIALS_FULL_URI`, no profile files and IMDS disabled.
    #[test]
    fn msk_tokens_are_signed_with_rotating_credentials_from_the_default_chain() {
        if std::env::var_os(CHILD).is_some() {
            return rotation_child();
        }
        let rt = tokio::runtime::Runtime::new().unwrap();
        let served = Arc::new(AtomicU64::new(0));
        let addr = rt.block_on(serve_rotating_credentials(Arc::clone(&served)));
        let name = format!(
            "{}::msk_tokens_are_signed_with_rotating_credentials_from_the_default_chain",
            module_path!().trim_start_matches("tessel_kafka::")
        );
        let empty = std::env::temp_dir().join("tessel-kafka-no-aws-config");
        // A shared credentials file with one named profile (no default profile).
        let credentials = std::env::temp_dir().join(format!(
            "tessel-kafka-aws-credentials-{}",
            std::process::id()
        ));
        std::fs::write(
            &credentials,
            "[tessel-msk]\naws_access_key_id = AKIDPROFILE0001\naws_secret_access_key = profile-secret-do-not-log\n",
        )
        .unwrap();
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([name.as_str(), "--exact", "--nocapture", "--test-threads=1"])
            .env_clear()
            .env(CHILD, "1")
            .env(
                "AWS_CONTAINER_CREDENTIALS_FULL_URI",
                format!("http://{addr}/creds"),
            )
            .env("AWS_EC2_METADATA_DISABLED", "true")
            .env("AWS_CONFIG_FILE", &empty)
            .env("AWS_SHARED_CREDENTIALS_FILE", &credentials)
            .output()
            .unwrap();
        let output = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "child failed: {output}");
        if let Some(at) = output.find("signed with") {
            println!("child: {}", output[at..].lines().next().unwrap_or_default());
        }
        assert!(
            output.contains("1 passed"),
            "the child did not run the test: {output}"
        );
        assert!(
            served.load(Ordering::SeqCst) >= ROTATIONS as u64,
            "the endpoint served {} credentials: {output}",
            served.load(Ordering::SeqCst)
        );
    }

    /// A log writer into a shared buffer.
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn rotation_child() {
        let logs = Captured::default();
        let writer = logs.clone();
        tracing_subscriber::fmt()
            // The daemon's filter at its most verbose setting (`log.level = "debug"`).
            .with_env_filter(crate::telemetry::quiet_aws_credentials(
                tracing_subscriber::EnvFilter::new("debug"),
            ))
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .init();
        let rt = tokio::runtime::Runtime::new().unwrap();
        let slot = CredentialSlot::spawn_default_chain("us-east-1".to_owned(), None, rt.handle());
        let signer = Arc::new(MskIamSigner::with_credentials(
            "us-east-1",
            Arc::clone(&slot),
        ));
        let context = SecurityContext::new("orders", Some(Arc::clone(&signer)));
        // This thread is not a runtime thread, like librdkafka's that calls back for tokens.
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        let mut seen: Vec<String> = Vec::new();
        while seen.len() < ROTATIONS {
            assert!(
                std::time::Instant::now() < deadline,
                "saw only {seen:?} in 60 s; slot: {slot:?}"
            );
            let asked_s = SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .unwrap()
                .as_secs() as i64;
            let token = context.generate_oauth_token(None).expect("a token");
            let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
                .decode(&token.token)
                .expect("base64url");
            let url = url::Url::parse(std::str::from_utf8(&raw).unwrap()).unwrap();
            let param = |k: &str| {
                url.query_pairs()
                    .find(|(n, _)| n == k)
                    .map(|(_, v)| v.into_owned())
                    .unwrap_or_else(|| panic!("no {k} in the token"))
            };
            let credential = param("X-Amz-Credential");
            let key_id = credential.split('/').next().unwrap().to_owned();
            let n: u64 = key_id
                .strip_prefix("ASIAROTATE")
                .and_then(|d| d.parse().ok())
                .unwrap_or_else(|| panic!("signed with an unexpected key {key_id}"));
            assert_eq!(
                param("X-Amz-Security-Token"),
                format!("rotating-session-{n}-do-not-log"),
                "key and session token of one set of credentials"
            );
            assert!(
                credential.ends_with("/us-east-1/kafka-cluster/aws4_request"),
                "{credential}"
            );
            // Signed at or after `asked_s` (X-Amz-Date is whole seconds): a token that ends
            // before asked_s + 900 s ends with its credentials, not after the 900 s a token
            // otherwise lives.
            assert!(
                token.lifetime_ms < asked_s * 1000 + 900_000,
                "the token lives past its credentials"
            );
            if !seen.contains(&key_id) {
                seen.push(key_id);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        // The named profile, through the same chain.
        let profiled = CredentialSlot::spawn_default_chain(
            "us-east-1".to_owned(),
            Some("tessel-msk".to_owned()),
            rt.handle(),
        );
        let profiled = MskIamSigner::with_credentials("us-east-1", profiled);
        let token = profiled.token().expect("a token from the profile");
        let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(&token.token)
            .unwrap();
        let url = url::Url::parse(std::str::from_utf8(&raw).unwrap()).unwrap();
        let credential = url
            .query_pairs()
            .find(|(n, _)| n == "X-Amz-Credential")
            .map(|(_, v)| v.into_owned())
            .unwrap();
        assert!(credential.starts_with("AKIDPROFILE0001/"), "{credential}");
        assert!(!url.query_pairs().any(|(n, _)| n == "X-Amz-Security-Token"));
        let shown = format!(
            "{}{signer:?}{slot:?}{profiled:?}",
            String::from_utf8_lossy(&logs.0.lock().unwrap())
        );
        assert!(shown.contains("aws credentials resolved"), "{shown}");
        for secret in ["do-not-log", "ASIAROTATE", "AKIDPROFILE"] {
            assert!(!shown.contains(secret), "{secret} shown: {shown}");
        }
        println!("signed with {seen:?}");
    }
}
