//! Client-side security: Amazon MSK IAM tokens (SigV4-presigned `kafka-cluster:Connect`
//! URLs, handed to librdkafka as OAUTHBEARER tokens and refreshed before they expire), a
//! client context for producers and probes that serves those tokens and remembers the last
//! connection error, and the wording of authentication and TLS failures.
//!
//! # MSK IAM token
//! The token is the base64url (no padding) encoding of
//! `https://kafka.<region>.amazonaws.com/?Action=kafka-cluster%3AConnect&X-Amz-Algorithm=…
//! &X-Amz-Credential=…&X-Amz-Date=…&X-Amz-Expires=900&X-Amz-SignedHeaders=host
//! [&X-Amz-Security-Token=…]&X-Amz-Signature=…&User-Agent=…`, a SigV4 query-string presigned
//! GET for the service `kafka-cluster` with an empty payload, as Amazon's aws-msk-iam-auth
//! signers produce it. Its lifetime is `X-Amz-Date + X-Amz-Expires`; librdkafka asks for a
//! new one at 80 % of it, on whichever thread polls the client (the consumer's poll round,
//! the producer's own polling thread even while it sends nothing).
//!
//! # Credentials
//! Static keys from `[connections.<name>.aws]`, else aws-config's default chain, resolved and
//! kept fresh by a background task (see [`crate::clients::aws_credentials`]): each token is signed with
//! the credentials current when librdkafka asks for it, and its lifetime ends no later than
//! theirs, so librdkafka asks again before they expire.

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use aws_credential_types::Credentials;
use aws_sigv4::http_request::{
    sign, SignableBody, SignableRequest, SignatureLocation, SigningSettings,
};
use aws_sigv4::sign::v4;
use base64::Engine as _;
use rdkafka::client::{ClientContext, OAuthToken};
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::error::KafkaError;
use thiserror::Error;

use crate::clients::aws_credentials::{CredentialSlot, FIRST_CREDENTIALS_WAIT};
use crate::config::security::{region_from_bootstrap, AwsIamConfig};
use crate::config::ConnectionConfig;

/// How long an MSK IAM token is valid (the signers' default).
pub const MSK_TOKEN_LIFETIME: Duration = Duration::from_secs(900);

/// The SigV4 service name of MSK IAM.
const MSK_SERVICE: &str = "kafka-cluster";

/// Why an MSK IAM token could not be made. Display never contains a credential.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum MskIamError {
    /// No region in the config, the bootstrap host names or the environment.
    #[error("no AWS region: set [connections.<name>.aws] region or AWS_REGION")]
    NoRegion,
    /// Only one of the access key id and the secret key is configured.
    #[error("[connections.<name>.aws] needs both access_key_id and secret_access_key (or neither, to use the AWS default credential chain)")]
    NoCredentials,
    /// The default credential chain has no usable credentials (why, without a credential).
    #[error("no AWS credentials: {0}")]
    Unavailable(String),
    /// Signing failed.
    #[error("cannot sign the MSK IAM token: {0}")]
    Signing(String),
}

/// Where the signer reads credentials.
#[derive(Clone, Debug)]
enum CredentialSource {
    /// From the configuration (read once, at load).
    Static {
        access_key_id: String,
        secret_access_key: String,
        session_token: Option<String>,
    },
    /// From aws-config's default chain, kept fresh by a background task.
    Chain(Arc<CredentialSlot>),
}

/// Makes MSK IAM tokens for one connection. Debug shows the region and the kind of
/// credentials, never a credential.
#[derive(Clone)]
pub struct MskIamSigner {
    region: String,
    credentials: CredentialSource,
}

impl std::fmt::Debug for MskIamSigner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let credentials = match &self.credentials {
            CredentialSource::Static { .. } => "static (config)",
            CredentialSource::Chain(_) => "default chain",
        };
        f.debug_struct("MskIamSigner")
            .field("region", &self.region)
            .field("credentials", &credentials)
            .finish()
    }
}

/// A signed token and when it stops being valid.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MskToken {
    /// The OAUTHBEARER token value.
    pub token: String,
    /// Expiry, in milliseconds since the Unix epoch.
    pub expires_at_ms: i64,
}

impl MskIamSigner {
    /// The signer of a connection with MSK IAM: the region from the config, the bootstrap
    /// host names or the environment (`env` is the process's in production); static
    /// credentials from the config, else the AWS default chain, shared by the process's
    /// signers of that region and refreshed on the current tokio runtime.
    pub fn from_config(
        conn: &ConnectionConfig,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Option<Self>, MskIamError> {
        let Some(aws) = &conn.aws else {
            return Ok(None);
        };
        let bootstrap = conn
            .kafka
            .get("bootstrap.servers")
            .map_or("", String::as_str);
        Self::new(aws, bootstrap, env, |region, profile| {
            CredentialSlot::shared_default_chain(region, profile)
                .map_err(|e| MskIamError::Unavailable(e.to_string()))
        })
        .map(Some)
    }

    /// A signer for `region` whose credentials come from `slot` (a chain of the caller's
    /// choosing, see [`CredentialSlot::spawn`]).
    pub fn with_credentials(region: &str, slot: Arc<CredentialSlot>) -> Self {
        Self {
            region: region.to_owned(),
            credentials: CredentialSource::Chain(slot),
        }
    }

    fn new(
        aws: &AwsIamConfig,
        bootstrap: &str,
        env: impl Fn(&str) -> Option<String>,
        chain: impl FnOnce(&str, Option<&str>) -> Result<Arc<CredentialSlot>, MskIamError>,
    ) -> Result<Self, MskIamError> {
        let region = aws
            .region
            .clone()
            .or_else(|| region_from_bootstrap(bootstrap))
            .or_else(|| env("AWS_REGION"))
            .or_else(|| env("AWS_DEFAULT_REGION"))
            .filter(|r| !r.trim().is_empty())
            .ok_or(MskIamError::NoRegion)?;
        let credentials = match (&aws.access_key_id, &aws.secret_access_key) {
            (Some(id), Some(secret)) => CredentialSource::Static {
                access_key_id: id.expose().to_owned(),
                secret_access_key: secret.expose().to_owned(),
                session_token: aws.session_token.as_ref().map(|t| t.expose().to_owned()),
            },
            (None, None) => CredentialSource::Chain(chain(&region, aws.profile.as_deref())?),
            _ => return Err(MskIamError::NoCredentials),
        };
        Ok(Self {
            region,
            credentials,
        })
    }

    fn credentials(&self) -> Result<Credentials, MskIamError> {
        match &self.credentials {
            CredentialSource::Static {
                access_key_id,
                secret_access_key,
                session_token,
            } => Ok(Credentials::new(
                access_key_id,
                secret_access_key,
                session_token.clone(),
                None,
                "tessel-kafka-config",
            )),
            CredentialSource::Chain(slot) => slot
                .current(FIRST_CREDENTIALS_WAIT)
                .map_err(|e| MskIamError::Unavailable(e.to_string())),
        }
    }

    /// A token signed now.
    pub fn token(&self) -> Result<MskToken, MskIamError> {
        msk_token(&self.credentials()?, &self.region, SystemTime::now())
    }
}

/// Presigns `GET https://<host>/<path>?<query>` for `service` with SigV4 in the query string.
/// `unsigned_payload` selects `UNSIGNED-PAYLOAD` (S3) instead of the empty payload's hash.
/// Returns the query parameters that sign it, in order.
fn presign(
    credentials: &Credentials,
    region: &str,
    service: &str,
    url: &str,
    time: SystemTime,
    expires_in: Duration,
    unsigned_payload: bool,
) -> Result<Vec<(String, String)>, MskIamError> {
    let identity = credentials.clone().into();
    let mut settings = SigningSettings::default();
    settings.signature_location = SignatureLocation::QueryParams;
    settings.expires_in = Some(expires_in);
    let params = v4::SigningParams::builder()
        .identity(&identity)
        .region(region)
        .name(service)
        .time(time)
        .settings(settings)
        .build()
        .map_err(|e| MskIamError::Signing(e.to_string()))?
        .into();
    let body = if unsigned_payload {
        SignableBody::UnsignedPayload
    } else {
        SignableBody::Bytes(&[])
    };
    let request = SignableRequest::new("GET", url, std::iter::empty(), body)
        .map_err(|e| MskIamError::Signing(e.to_string()))?;
    let (instructions, _signature) = sign(request, &params)
        .map_err(|e| MskIamError::Signing(e.to_string()))?
        .into_parts();
    Ok(instructions
        .params()
        .iter()
        .map(|(k, v)| ((*k).to_owned(), v.to_string()))
        .collect())
}

/// The MSK IAM token for `credentials` in `region`, signed at `time`. It expires after
/// [`MSK_TOKEN_LIFETIME`], or with the credentials when they expire sooner.
pub fn msk_token(
    credentials: &Credentials,
    region: &str,
    time: SystemTime,
) -> Result<MskToken, MskIamError> {
    let host = format!("kafka.{region}.amazonaws.com");
    let base = format!("https://{host}/?Action=kafka-cluster%3AConnect");
    let signed = presign(
        credentials,
        region,
        MSK_SERVICE,
        &base,
        time,
        MSK_TOKEN_LIFETIME,
        false,
    )?;
    let mut url = url::Url::parse(&base).map_err(|e| MskIamError::Signing(e.to_string()))?;
    {
        let mut query = url.query_pairs_mut();
        for (k, v) in &signed {
            let _ = query.append_pair(k, v);
        }
        // Added after signing, as the reference signers do: the broker logs it.
        let _ = query.append_pair(
            "User-Agent",
            concat!("tessel-kafka/", env!("CARGO_PKG_VERSION")),
        );
    }
    let signed_at = time
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_err(|e| MskIamError::Signing(e.to_string()))?;
    let mut expires_at = signed_at + MSK_TOKEN_LIFETIME;
    if let Some(expiry) = credentials.expiry() {
        if let Ok(until) = expiry.duration_since(SystemTime::UNIX_EPOCH) {
            expires_at = expires_at.min(until);
        }
    }
    let expires_at_ms =
        i64::try_from(expires_at.as_millis()).map_err(|e| MskIamError::Signing(e.to_string()))?;
    Ok(MskToken {
        token: base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(url.as_str()),
        expires_at_ms,
    })
}

/// Hands an MSK IAM token to librdkafka (called from a client context's
/// `generate_oauth_token`).
pub(crate) fn oauth_token(
    signer: Option<&MskIamSigner>,
) -> Result<OAuthToken, Box<dyn std::error::Error>> {
    let Some(signer) = signer else {
        return Err("OAUTHBEARER needs sasl.oauthbearer.method=oidc or AWS_MSK_IAM".into());
    };
    match signer.token() {
        Ok(t) => {
            tracing::debug!(expires_at_ms = t.expires_at_ms, "msk iam token signed");
            Ok(OAuthToken {
                token: t.token,
                principal_name: "aws-msk-iam".to_owned(),
                lifetime_ms: t.expires_at_ms,
            })
        }
        Err(e) => {
            tracing::error!(error = %e, "cannot sign an msk iam token");
            Err(Box::new(e))
        }
    }
}

/// What went wrong connecting to the brokers, in the product's words.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ConnectFailure {
    /// The broker refused the credentials.
    Authentication(String),
    /// The TLS handshake failed (unknown CA, host name, refused client certificate).
    Tls(String),
    /// Nothing answered.
    Unreachable(String),
}

impl std::fmt::Display for ConnectFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Authentication(d) => write!(f, "authentication failed: {d}"),
            Self::Tls(d) => write!(f, "TLS handshake failed: {d}"),
            Self::Unreachable(d) => write!(f, "brokers unreachable: {d}"),
        }
    }
}

/// Classifies a librdkafka error report (`error` callback: code and reason).
pub fn classify_connect_error(error: &KafkaError, reason: &str) -> Option<ConnectFailure> {
    use rdkafka::types::RDKafkaErrorCode as C;
    let code = error.rdkafka_error_code();
    let lower = reason.to_ascii_lowercase();
    let detail = one_line(reason);
    if code == Some(C::Authentication)
        || code == Some(C::SaslAuthenticationFailed)
        || lower.contains("sasl authentication error")
        || lower.contains("authentication failed")
    {
        return Some(ConnectFailure::Authentication(detail));
    }
    if code == Some(C::SSL)
        || lower.contains("ssl handshake failed")
        || lower.contains("certificate verify failed")
    {
        return Some(ConnectFailure::Tls(detail));
    }
    if code == Some(C::AllBrokersDown)
        || code == Some(C::BrokerTransportFailure)
        || code == Some(C::Resolve)
    {
        return Some(ConnectFailure::Unreachable(detail));
    }
    None
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The client context of every librdkafka client of a connection: forwards librdkafka's log to
/// tracing, serves MSK IAM tokens, and remembers the last authentication, TLS or connection
/// failure. Producers and probes use it as it is; the consumer's
/// [`ConnectorContext`](crate::consumer::context::ConnectorContext) is built on it.
pub struct SecurityContext {
    connection: String,
    signer: Option<Arc<MskIamSigner>>,
    /// Shared, so that the owner of a client built with this context can still read it.
    last_failure: Arc<Mutex<Option<ConnectFailure>>>,
    /// The idempotent producer's state from the last statistics (`Assigned` once it has a
    /// producer id); shared so a probe can read it once the context belongs to a producer.
    idempotence: Arc<Mutex<Option<String>>>,
    /// The group coordinator lookup was refused (GROUP_AUTHORIZATION_FAILED); librdkafka
    /// reports it once, as an error event.
    group_refused: std::sync::atomic::AtomicBool,
    /// Counts the client this context belongs to (`tessel_kafka_region_clients`).
    _count: crate::telemetry::metrics::ClientCount,
}

impl SecurityContext {
    /// The context of `connection`.
    pub fn new(connection: &str, signer: Option<Arc<MskIamSigner>>) -> Self {
        Self {
            connection: connection.to_owned(),
            signer,
            last_failure: Arc::new(Mutex::new(None)),
            idempotence: Arc::new(Mutex::new(None)),
            group_refused: std::sync::atomic::AtomicBool::new(false),
            _count: crate::telemetry::metrics::ClientCount::new(),
        }
    }

    /// The context of a connection as configured (MSK IAM signer from config and environment).
    pub fn for_connection(name: &str, conn: &ConnectionConfig) -> Result<Self, MskIamError> {
        let signer = MskIamSigner::from_config(conn, |v| std::env::var(v).ok())?;
        Ok(Self::new(name, signer.map(Arc::new)))
    }

    /// The last connection failure librdkafka reported.
    pub fn last_failure(&self) -> Option<ConnectFailure> {
        self.last_failure
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Where the last connection failure is recorded; readable after the context was handed
    /// to a client.
    pub fn failure_slot(&self) -> Arc<Mutex<Option<ConnectFailure>>> {
        Arc::clone(&self.last_failure)
    }

    /// This context, recording connection failures in `slot` (of an earlier context).
    pub fn with_failure_slot(mut self, slot: Arc<Mutex<Option<ConnectFailure>>>) -> Self {
        self.last_failure = slot;
        self
    }

    /// Where the idempotent producer's state appears once statistics arrive (`Assigned`
    /// when it has a producer id).
    pub fn idempotence_state(&self) -> Arc<Mutex<Option<String>>> {
        Arc::clone(&self.idempotence)
    }

    /// Whether the broker refused the consumer group (GROUP_AUTHORIZATION_FAILED).
    pub fn group_refused(&self) -> bool {
        self.group_refused.load(std::sync::atomic::Ordering::SeqCst)
    }

    pub(crate) fn record(&self, failure: ConnectFailure) {
        *self.last_failure.lock().unwrap_or_else(|p| p.into_inner()) = Some(failure);
    }

    /// Forgets the last failure (a broker is up again).
    pub(crate) fn clear_failure(&self) {
        *self.last_failure.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }

    /// The connection's name.
    pub fn connection(&self) -> &str {
        &self.connection
    }

    /// The MSK IAM signer the clients of the connection share, if any.
    pub fn signer(&self) -> Option<Arc<MskIamSigner>> {
        self.signer.clone()
    }

    /// An OAUTHBEARER token (MSK IAM when configured).
    pub(crate) fn oauth_token(&self) -> Result<OAuthToken, Box<dyn std::error::Error>> {
        oauth_token(self.signer.as_deref())
    }
}

/// Records `line` when it reports an authentication or TLS failure.
pub(crate) fn failure_in_log(line: &str) -> Option<ConnectFailure> {
    let lower = line.to_ascii_lowercase();
    if lower.contains("sasl authentication error") || lower.contains("authentication failed") {
        Some(ConnectFailure::Authentication(one_line(line)))
    } else if lower.contains("ssl handshake failed") || lower.contains("certificate verify failed")
    {
        Some(ConnectFailure::Tls(one_line(line)))
    } else {
        None
    }
}

impl ClientContext for SecurityContext {
    const ENABLE_REFRESH_OAUTH_TOKEN: bool = true;

    fn log(&self, level: RDKafkaLogLevel, fac: &str, log_message: &str) {
        let c = self.connection.as_str();
        if let Some(f) = failure_in_log(log_message) {
            self.record(f);
        }
        log_to_tracing(c, level, fac, log_message);
    }

    fn stats(&self, stats: rdkafka::Statistics) {
        if let Some(eos) = stats.eos {
            *self.idempotence.lock().unwrap_or_else(|p| p.into_inner()) = Some(eos.idemp_state);
        }
    }

    fn error(&self, error: KafkaError, reason: &str) {
        if let Some(f) = classify_connect_error(&error, reason) {
            self.record(f);
        }
        if error.rdkafka_error_code()
            == Some(rdkafka::types::RDKafkaErrorCode::GroupAuthorizationFailed)
        {
            self.group_refused
                .store(true, std::sync::atomic::Ordering::SeqCst);
        }
        tracing::warn!(target: "librdkafka", connection = %self.connection, error = %error, "kafka client error: {reason}");
    }

    fn generate_oauth_token(
        &self,
        _oauthbearer_config: Option<&str>,
    ) -> Result<OAuthToken, Box<dyn std::error::Error>> {
        oauth_token(self.signer.as_deref())
    }
}

impl rdkafka::consumer::ConsumerContext for SecurityContext {}

/// Routes one librdkafka log line into tracing, under the target `librdkafka`, at the
/// matching level, with the connection.
pub(crate) fn log_to_tracing(c: &str, level: RDKafkaLogLevel, fac: &str, log_message: &str) {
    match level {
        RDKafkaLogLevel::Emerg
        | RDKafkaLogLevel::Alert
        | RDKafkaLogLevel::Critical
        | RDKafkaLogLevel::Error => {
            tracing::error!(target: "librdkafka", connection = c, facility = fac, "{log_message}")
        }
        RDKafkaLogLevel::Warning => {
            tracing::warn!(target: "librdkafka", connection = c, facility = fac, "{log_message}")
        }
        RDKafkaLogLevel::Notice | RDKafkaLogLevel::Info => {
            tracing::info!(target: "librdkafka", connection = c, facility = fac, "{log_message}")
        }
        RDKafkaLogLevel::Debug => {
            tracing::debug!(target: "librdkafka", connection = c, facility = fac, "{log_message}")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Secret;

    fn at(rfc_basic: (i32, u8, u8, u8, u8, u8)) -> SystemTime {
        let (y, mo, d, h, mi, s) = rfc_basic;
        // Days from 1970-01-01 to the date (proleptic Gregorian), enough for test dates.
        let days_from_civil = |y: i64, m: i64, d: i64| {
            let y = if m <= 2 { y - 1 } else { y };
            let era = if y >= 0 { y } else { y - 399 } / 400;
            let yoe = y - era * 400;
            let mp = (m + 9) % 12;
            let doy = (153 * mp + 2) / 5 + d - 1;
            let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
            era * 146_097 + doe - 719_468
        };
        let days = days_from_civil(i64::from(y), i64::from(mo), i64::from(d));
        let secs = days * 86_400 + i64::from(h) * 3600 + i64::from(mi) * 60 + i64::from(s);
        SystemTime::UNIX_EPOCH + Duration::from_secs(secs as u64)
    }

    /// AWS's documented example of a presigned URL ("Authenticating Requests: Using Query
    /// Parameters (AWS Signature Version 4)", Amazon S3 API reference): GET /test.txt on
    /// examplebucket, 2013-05-24T00:00:00Z, 86400 s, with the documentation's example keys.
    #[test]
    fn presigning_reproduces_the_documented_s3_example() {
        let creds = Credentials::new(
            "AKIAIOSFODNN7EXAMPLE",
            "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
            None,
            None,
            "test",
        );
        let params = presign(
            &creds,
            "us-east-1",
            "s3",
            "https://examplebucket.s3.amazonaws.com/test.txt",
            at((2013, 5, 24, 0, 0, 0)),
            Duration::from_secs(86_400),
            true,
        )
        .unwrap();
        assert_eq!(
            param(&params, "X-Amz-Signature"),
            "aeeed9bbccd4d02ee5c0109b86d86835f995330da4c265957d157751f604d404"
        );
        assert_presigned(
            &params,
            "AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request",
            "20130524T000000Z",
            "86400",
        );
    }

    /// The value of the query parameter `name`.
    fn param<'a>(params: &'a [(String, String)], name: &str) -> &'a str {
        let found = params.iter().find(|(n, _)| n == name);
        found.map(|(_, v)| v.as_str()).unwrap()
    }

    /// The SigV4 parameters of a URL presigned with `credential` (key id, date, region,
    /// service) at `date` for `expires` seconds, host alone signed.
    fn assert_presigned(params: &[(String, String)], credential: &str, date: &str, expires: &str) {
        assert_eq!(param(params, "X-Amz-Algorithm"), "AWS4-HMAC-SHA256");
        assert_eq!(param(params, "X-Amz-Credential"), credential);
        assert_eq!(param(params, "X-Amz-Date"), date);
        assert_eq!(param(params, "X-Amz-Expires"), expires);
        assert_eq!(param(params, "X-Amz-SignedHeaders"), "host");
    }

    fn hmac(key: &[u8], data: &str) -> Vec<u8> {
        use hmac::Mac;
        let mut m = hmac::Hmac::<sha2::Sha256>::new_from_slice(key).unwrap();
        m.update(data.as_bytes());
        m.finalize().into_bytes().to_vec()
    }

    fn sha256_hex(data: &str) -> String {
        use sha2::Digest;
        hex::encode(sha2::Sha256::digest(data.as_bytes()))
    }

    fn decode_token(token: &str) -> url::Url {
        let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(token)
            .expect("base64url without padding");
        url::Url::parse(std::str::from_utf8(&raw).unwrap()).unwrap()
    }

    /// The token has the aws-msk-iam-auth format, and its signature is the one the SigV4
    /// specification gives for the canonical request (computed here independently of the
    /// signing crate).
    #[test]
    fn msk_token_has_the_documented_format_and_a_valid_signature() {
        let creds = Credentials::new(
            "AKIDEXAMPLE",
            "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY",
            Some("session/token+x=".to_owned()),
            None,
            "test",
        );
        let time = at((2024, 3, 1, 12, 30, 0));
        let token = msk_token(&creds, "us-west-2", time).unwrap();
        assert!(!token.token.contains('='), "no padding");
        let url = decode_token(&token.token);
        assert_eq!(url.host_str(), Some("kafka.us-west-2.amazonaws.com"));
        let q: Vec<(String, String)> = url.query_pairs().into_owned().collect();
        let names: Vec<&str> = q.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(names[0], "Action");
        assert_eq!(q[0].1, "kafka-cluster:Connect");
        assert_eq!(*names.last().unwrap(), "User-Agent");
        assert_presigned(
            &q,
            "AKIDEXAMPLE/20240301/us-west-2/kafka-cluster/aws4_request",
            "20240301T123000Z",
            "900",
        );
        assert_eq!(param(&q, "X-Amz-Security-Token"), "session/token+x=");
        let signed_at_ms = time
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap()
            .as_millis() as i64;
        assert_eq!(token.expires_at_ms, signed_at_ms + 900_000);

        // SigV4 by hand: canonical query = every parameter but the signature, sorted by
        // name, RFC 3986-encoded.
        let enc = |s: &str| {
            s.bytes()
                .map(|b| match b {
                    b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                        (b as char).to_string()
                    }
                    _ => format!("%{b:02X}"),
                })
                .collect::<String>()
        };
        let mut canonical_query: Vec<(String, String)> = q
            .iter()
            .filter(|(k, _)| k != "X-Amz-Signature" && k != "User-Agent")
            .map(|(k, v)| (enc(k), enc(v)))
            .collect();
        canonical_query.sort();
        let canonical_query = canonical_query
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join("&");
        let canonical_request = format!(
            "GET\n/\n{canonical_query}\nhost:kafka.us-west-2.amazonaws.com\n\nhost\n{}",
            sha256_hex("")
        );
        let string_to_sign = format!(
            "AWS4-HMAC-SHA256\n20240301T123000Z\n20240301/us-west-2/kafka-cluster/aws4_request\n{}",
            sha256_hex(&canonical_request)
        );
        let k_date = hmac(b"AWS4wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", "20240301");
        let k_region = hmac(&k_date, "us-west-2");
        let k_service = hmac(&k_region, "kafka-cluster");
        let k_signing = hmac(&k_service, "aws4_request");
        let expected = hex::encode(hmac(&k_signing, &string_to_sign));
        assert_eq!(param(&q, "X-Amz-Signature"), expected);
    }

    /// A credential chain that never answers (for tests about regions and static keys).
    fn unfilled(_: &str, _: Option<&str>) -> Result<Arc<CredentialSlot>, MskIamError> {
        Ok(CredentialSlot::new())
    }

    #[test]
    fn signer_takes_region_from_bootstrap_and_refuses_half_credentials() {
        let aws = AwsIamConfig::default();
        let no_env = |_: &str| None;
        let s = MskIamSigner::new(
            &aws,
            "b-1.c.x.c2.kafka.ap-south-1.amazonaws.com:9098",
            no_env,
            unfilled,
        )
        .unwrap();
        assert_eq!(s.region, "ap-south-1");
        assert_eq!(
            MskIamSigner::new(&aws, "broker:9098", no_env, unfilled).unwrap_err(),
            MskIamError::NoRegion
        );
        let s = MskIamSigner::new(
            &aws,
            "broker:9098",
            |v| (v == "AWS_REGION").then(|| "eu-central-1".to_owned()),
            unfilled,
        )
        .unwrap();
        assert_eq!(s.region, "eu-central-1");
        let half = AwsIamConfig {
            region: Some("us-east-1".into()),
            access_key_id: Some(Secret::new("AKID")),
            ..AwsIamConfig::default()
        };
        assert_eq!(
            MskIamSigner::new(&half, "", no_env, unfilled).unwrap_err(),
            MskIamError::NoCredentials
        );
    }

    /// Each refresh signs anew: a later token has a later expiry, and static credentials
    /// never appear in Debug output.
    #[test]
    fn refresh_signs_a_new_token_with_a_later_expiry() {
        let aws = AwsIamConfig {
            region: Some("us-east-1".into()),
            access_key_id: Some(Secret::new("AKIDREFRESH")),
            secret_access_key: Some(Secret::new("very-secret-key")),
            session_token: None,
            profile: None,
        };
        let signer = MskIamSigner::new(&aws, "", |_| None, unfilled).unwrap();
        assert!(!format!("{signer:?}").contains("very-secret-key"));
        let creds = signer.credentials().unwrap();
        let t0 = SystemTime::now();
        let first = msk_token(&creds, "us-east-1", t0).unwrap();
        let second = msk_token(&creds, "us-east-1", t0 + Duration::from_secs(720)).unwrap();
        assert_ne!(first.token, second.token);
        assert_eq!(second.expires_at_ms - first.expires_at_ms, 720_000);
        let token = oauth_token(Some(&signer)).unwrap();
        assert!(token.lifetime_ms > first.expires_at_ms - 1_000);
        assert!(!decode_token(&token.token)
            .as_str()
            .contains("very-secret-key"));
        assert!(oauth_token(None).is_err());
    }

    #[test]
    fn connect_failures_are_classified() {
        use rdkafka::types::RDKafkaErrorCode as C;
        let auth = classify_connect_error(
            &KafkaError::Global(C::Authentication),
            "sasl_ssl://127.0.0.1:19095/bootstrap: SASL authentication error: Authentication failed during authentication due to invalid credentials with SASL mechanism SCRAM-SHA-512",
        );
        assert!(matches!(auth, Some(ConnectFailure::Authentication(_))));
        let tls = classify_connect_error(
            &KafkaError::Global(C::SSL),
            "ssl://127.0.0.1:19096/bootstrap: SSL handshake failed: error:0A000086:SSL routines::certificate verify failed",
        );
        assert!(tls.unwrap().to_string().starts_with("TLS handshake failed"));
        assert!(classify_connect_error(&KafkaError::Global(C::MessageTimedOut), "x").is_none());
    }
}
