//! Kafka security settings: paste-friendly translation of the Java client properties that
//! Confluent Cloud, Aiven, Redpanda and Amazon MSK consoles hand out, and validation of the
//! combination (protocol, mechanism, credentials, TLS files) before any connection is made.
//!
//! Translation happens once, when the configuration is loaded; each one leaves a notice that
//! the daemon logs at start and `config check` prints. A notice names properties, never their
//! values.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::secret::Secret;

/// Amazon MSK IAM authentication (`"sasl.mechanism" = "AWS_MSK_IAM"`): OAUTHBEARER tokens
/// presigned with AWS SigV4 for the `kafka-cluster:Connect` action, refreshed before expiry.
///
/// Credentials are the static ones given here (both `access_key_id` and
/// `secret_access_key`), else the AWS default credential chain, as the AWS SDKs resolve it:
/// `AWS_ACCESS_KEY_ID` / `AWS_SECRET_ACCESS_KEY` / `AWS_SESSION_TOKEN`, the shared config and
/// credentials files (`AWS_PROFILE`), web identity (IRSA), ECS and EKS Pod Identity container
/// credentials, then the instance profile (IMDS). Chain credentials are resolved again before
/// they expire, and every token is signed with the current ones.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct AwsIamConfig {
    /// The cluster's region. Default: the region in the bootstrap host names
    /// (`b-1.x.y.kafka.<region>.amazonaws.com`), else `AWS_REGION` / `AWS_DEFAULT_REGION`.
    #[serde(default)]
    pub region: Option<String>,
    /// Static access key id (with `secret_access_key`); default: the credential chain.
    #[serde(default)]
    pub access_key_id: Option<Secret>,
    /// Static secret access key (with `access_key_id`); default: the credential chain.
    #[serde(default)]
    pub secret_access_key: Option<Secret>,
    /// Session token of static temporary credentials; default: none.
    #[serde(default)]
    pub session_token: Option<Secret>,
    /// The named profile of the shared config and credentials files the default chain
    /// reads (the MSK snippet's `IAMLoginModule required awsProfileName="…";` sets it).
    /// Default: `AWS_PROFILE`, else `default`. Not used with static keys.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<String>,
}

/// Why a connection's security settings cannot be used. Display never contains a value of a
/// secret property.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecurityError {
    /// A property has a value the connector does not accept.
    #[error("\"{property}\": {reason}")]
    Invalid {
        /// The property.
        property: String,
        /// Why.
        reason: String,
    },
    /// A property needed by the chosen protocol or mechanism is missing.
    #[error("\"{property}\" is required {because}")]
    Missing {
        /// The property.
        property: String,
        /// With what.
        because: String,
    },
}

fn invalid(property: &str, reason: impl Into<String>) -> SecurityError {
    SecurityError::Invalid {
        property: property.to_owned(),
        reason: reason.into(),
    }
}

fn missing(property: &str, because: impl Into<String>) -> SecurityError {
    SecurityError::Missing {
        property: property.to_owned(),
        because: because.into(),
    }
}

/// The mechanism name that selects Amazon MSK IAM.
pub const MSK_IAM_MECHANISM: &str = "AWS_MSK_IAM";

/// Java client properties with no librdkafka counterpart that a console's snippet carries and
/// that are safe to drop (their job is done by the connector or librdkafka itself).
const JAVA_ONLY: &[&str] = &[
    "sasl.client.callback.handler.class",
    "sasl.login.callback.handler.class",
    "client.dns.lookup",
    "ssl.truststore.type",
    "ssl.keystore.type",
    "key.deserializer",
    "value.deserializer",
    "key.serializer",
    "value.serializer",
];

/// Rewrites Java-style properties into librdkafka's, in place. Returns one notice per
/// translation. `aws` is set when the mechanism is `AWS_MSK_IAM`.
pub(crate) fn normalize(
    props: &mut BTreeMap<String, String>,
    aws: &mut Option<AwsIamConfig>,
) -> Result<Vec<String>, SecurityError> {
    let mut notices = Vec::new();
    if let Some(m) = props.remove("sasl.mechanisms") {
        if props.get("sasl.mechanism").is_some_and(|v| *v != m) {
            return Err(invalid(
                "sasl.mechanisms",
                "conflicts with \"sasl.mechanism\"; set one of them",
            ));
        }
        let _ = props.insert("sasl.mechanism".to_owned(), m);
    }
    for key in ["security.protocol", "sasl.mechanism"] {
        if let Some(v) = props.get_mut(key) {
            *v = v.trim().to_ascii_uppercase();
        }
    }
    let mut profile = None;
    if let Some(jaas) = props.remove("sasl.jaas.config") {
        let mut login = parse_jaas(&jaas)?;
        if short_module(&login.module) == "IAMLoginModule" {
            profile = login.options.remove("awsProfileName");
        }
        notices.push(translate_jaas(props, &login)?);
    }
    for key in JAVA_ONLY {
        if props.remove(*key).is_some() {
            notices.push(format!(
                "dropped the Java client property \"{key}\": librdkafka has no such setting and does not need it"
            ));
        }
    }
    if let Some(truststore) = props.remove("ssl.truststore.location") {
        let lower = truststore.to_ascii_lowercase();
        if lower.ends_with(".jks") || lower.ends_with(".p12") || lower.ends_with(".pfx") {
            return Err(invalid(
                "ssl.truststore.location",
                "librdkafka reads CA certificates in PEM: convert the truststore (keytool -exportcert -rfc) and set \"ssl.ca.location\"",
            ));
        }
        if props.contains_key("ssl.ca.location") {
            return Err(invalid(
                "ssl.truststore.location",
                "conflicts with \"ssl.ca.location\"; set one of them",
            ));
        }
        let _ = props.remove("ssl.truststore.password");
        let _ = props.insert("ssl.ca.location".to_owned(), truststore);
        notices.push(
            "translated \"ssl.truststore.location\" (PEM) to librdkafka's \"ssl.ca.location\""
                .to_owned(),
        );
    }
    if props
        .get("ssl.keystore.location")
        .is_some_and(|l| l.to_ascii_lowercase().ends_with(".jks"))
    {
        return Err(invalid(
            "ssl.keystore.location",
            "a JKS keystore cannot be read by librdkafka: use PKCS#12 or PEM (\"ssl.certificate.location\" and \"ssl.key.location\")",
        ));
    }
    if props
        .get("ssl.endpoint.identification.algorithm")
        .is_some_and(|v| v.trim().is_empty())
    {
        // Java turns host name verification off with an empty value; librdkafka with "none".
        let _ = props.insert(
            "ssl.endpoint.identification.algorithm".to_owned(),
            "none".to_owned(),
        );
        notices.push(
            "translated the empty \"ssl.endpoint.identification.algorithm\" to \"none\" (broker host names are not verified)"
                .to_owned(),
        );
    }
    if props.get("sasl.mechanism").map(String::as_str) == Some(MSK_IAM_MECHANISM) {
        let _ = props.insert("sasl.mechanism".to_owned(), "OAUTHBEARER".to_owned());
        let aws = aws.get_or_insert_with(AwsIamConfig::default);
        if let Some(profile) = profile.take() {
            if aws.profile.as_ref().is_some_and(|p| *p != profile) {
                return Err(invalid(
                    "sasl.jaas.config",
                    "its awsProfileName conflicts with [connections.<name>.aws] profile; set one of them",
                ));
            }
            aws.profile = Some(profile);
            notices.push(
                "translated the IAMLoginModule option awsProfileName to [connections.<name>.aws] profile".to_owned(),
            );
        }
        notices.push(
            "AWS_MSK_IAM: authenticating with OAUTHBEARER tokens presigned with AWS SigV4 (kafka-cluster:Connect), refreshed before they expire".to_owned(),
        );
    }
    if profile.is_some() {
        return Err(invalid(
            "sasl.jaas.config",
            "awsProfileName is an IAMLoginModule option for sasl.mechanism AWS_MSK_IAM",
        ));
    }
    if props.contains_key("sasl.oauthbearer.token.endpoint.url")
        && !props.contains_key("sasl.oauthbearer.method")
    {
        let _ = props.insert("sasl.oauthbearer.method".to_owned(), "oidc".to_owned());
        notices.push(
            "set \"sasl.oauthbearer.method\" to \"oidc\": a token endpoint is configured"
                .to_owned(),
        );
    }
    Ok(notices)
}

/// The parts of a Java `sasl.jaas.config` value.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct JaasLogin {
    /// The login module's class name.
    pub module: String,
    /// `key="value"` options.
    pub options: BTreeMap<String, String>,
}

/// Parses `<class> required|requisite|sufficient|optional key="value" ... ;`. Errors name the
/// problem but never quote the text, which holds a password.
pub(crate) fn parse_jaas(text: &str) -> Result<JaasLogin, SecurityError> {
    let bad = |why: &str| invalid("sasl.jaas.config", why);
    let text = text.trim();
    let text = text.strip_suffix(';').unwrap_or(text).trim_end();
    let mut chars = text.char_indices().peekable();
    let mut words = Vec::new();
    let mut options = BTreeMap::new();
    while let Some(&(start, c)) = chars.peek() {
        if c.is_whitespace() {
            let _ = chars.next();
            continue;
        }
        // A bare word, or key=value / key="value".
        let mut end = start;
        while let Some(&(i, c)) = chars.peek() {
            if c.is_whitespace() || c == '=' {
                break;
            }
            end = i + c.len_utf8();
            let _ = chars.next();
        }
        let word = &text[start..end];
        if chars.peek().map(|&(_, c)| c) != Some('=') {
            if word.is_empty() {
                return Err(bad("unexpected '='"));
            }
            words.push(word.to_owned());
            continue;
        }
        let _ = chars.next();
        let quote = chars
            .peek()
            .map(|&(_, c)| c)
            .filter(|c| *c == '"' || *c == '\'');
        let value = if let Some(quote) = quote {
            let _ = chars.next();
            let mut value = String::new();
            let mut closed = false;
            while let Some((_, c)) = chars.next() {
                match c {
                    '\\' => match chars.next() {
                        Some((_, e)) => value.push(e),
                        None => return Err(bad("ends inside an escape")),
                    },
                    c if c == quote => {
                        closed = true;
                        break;
                    }
                    _ => value.push(c),
                }
            }
            if !closed {
                return Err(bad("has an unclosed quote"));
            }
            value
        } else {
            let mut value = String::new();
            while let Some(&(_, c)) = chars.peek() {
                if c.is_whitespace() {
                    break;
                }
                value.push(c);
                let _ = chars.next();
            }
            value
        };
        if word.is_empty() {
            return Err(bad("has an option without a name"));
        }
        let _ = options.insert(word.to_owned(), value);
    }
    match words.as_slice() {
        [module, flag]
            if matches!(
                flag.as_str(),
                "required" | "requisite" | "sufficient" | "optional"
            ) =>
        {
            Ok(JaasLogin {
                module: module.clone(),
                options,
            })
        }
        _ => Err(bad(
            "expected `<LoginModule class> required key=\"value\" ...;`",
        )),
    }
}

fn short_module(module: &str) -> &str {
    module.rsplit('.').next().unwrap_or(module)
}

fn set_translated(
    props: &mut BTreeMap<String, String>,
    key: &str,
    value: &str,
) -> Result<(), SecurityError> {
    match props.get(key) {
        Some(existing) if existing != value => Err(invalid(
            "sasl.jaas.config",
            format!("conflicts with \"{key}\"; set one of them"),
        )),
        _ => {
            let _ = props.insert(key.to_owned(), value.to_owned());
            Ok(())
        }
    }
}

fn translate_jaas(
    props: &mut BTreeMap<String, String>,
    login: &JaasLogin,
) -> Result<String, SecurityError> {
    let module = short_module(&login.module);
    let option = |name: &str| login.options.get(name).map(String::as_str);
    match module {
        "PlainLoginModule" | "ScramLoginModule" => {
            let (Some(user), Some(password)) = (option("username"), option("password")) else {
                return Err(invalid(
                    "sasl.jaas.config",
                    format!("{module} needs username=\"...\" and password=\"...\""),
                ));
            };
            set_translated(props, "sasl.username", user)?;
            set_translated(props, "sasl.password", password)?;
            Ok(format!(
                "translated \"sasl.jaas.config\" ({module}) to librdkafka's \"sasl.username\" and \"sasl.password\""
            ))
        }
        "OAuthBearerLoginModule" => {
            let mut set = Vec::new();
            for (java, rd) in [
                ("clientId", "sasl.oauthbearer.client.id"),
                ("clientSecret", "sasl.oauthbearer.client.secret"),
                ("scope", "sasl.oauthbearer.scope"),
            ] {
                if let Some(v) = option(java) {
                    set_translated(props, rd, v)?;
                    set.push(format!("\"{rd}\""));
                }
            }
            let extensions: Vec<String> = login
                .options
                .iter()
                .filter_map(|(k, v)| k.strip_prefix("extension_").map(|e| format!("{e}={v}")))
                .collect();
            if !extensions.is_empty() {
                set_translated(props, "sasl.oauthbearer.extensions", &extensions.join(","))?;
                set.push("\"sasl.oauthbearer.extensions\"".to_owned());
            }
            Ok(format!(
                "translated \"sasl.jaas.config\" (OAuthBearerLoginModule) to librdkafka's {}",
                if set.is_empty() {
                    "defaults".to_owned()
                } else {
                    set.join(", ")
                }
            ))
        }
        "IAMLoginModule" => {
            if let Some(unsupported) = login
                .options
                .keys()
                .find(|k| k.as_str() != "awsDebugCreds")
            {
                return Err(invalid(
                    "sasl.jaas.config",
                    format!("IAMLoginModule option {unsupported} is not supported: the AWS default credential chain (environment, profile files, IRSA, ECS/EKS container credentials, IMDS) or [connections.<name>.aws] gives the credentials"),
                ));
            }
            Ok("dropped \"sasl.jaas.config\" (IAMLoginModule): AWS_MSK_IAM tokens are signed by the connector".to_owned())
        }
        other => Err(invalid(
            "sasl.jaas.config",
            format!("login module {other} is not supported (PlainLoginModule, ScramLoginModule, OAuthBearerLoginModule and IAMLoginModule are)"),
        )),
    }
}

/// How a connection authenticates, as derived from its (normalized) properties.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KafkaAuth {
    /// No TLS, no SASL.
    Plaintext,
    /// TLS; `mutual` when a client certificate is configured.
    Ssl {
        /// A client certificate and key are configured (mTLS).
        mutual: bool,
    },
    /// SASL, over TLS when `tls`.
    Sasl {
        /// The mechanism.
        mechanism: SaslMechanism,
        /// SASL_SSL rather than SASL_PLAINTEXT.
        tls: bool,
    },
}

/// The SASL mechanisms the connector supports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SaslMechanism {
    /// PLAIN (Confluent Cloud API keys, Redpanda).
    Plain,
    /// SCRAM-SHA-256.
    ScramSha256,
    /// SCRAM-SHA-512.
    ScramSha512,
    /// OAUTHBEARER through OIDC client credentials (librdkafka fetches and refreshes).
    OauthbearerOidc,
    /// Amazon MSK IAM: OAUTHBEARER with SigV4-presigned tokens from the connector.
    AwsMskIam,
}

impl SaslMechanism {
    /// The name users write.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Plain => "PLAIN",
            Self::ScramSha256 => "SCRAM-SHA-256",
            Self::ScramSha512 => "SCRAM-SHA-512",
            Self::OauthbearerOidc => "OAUTHBEARER",
            Self::AwsMskIam => MSK_IAM_MECHANISM,
        }
    }
}

fn nonempty(props: &BTreeMap<String, String>, key: &str) -> bool {
    props.get(key).is_some_and(|v| !v.trim().is_empty())
}

/// Checks the combination of protocol, mechanism and credentials of normalized properties.
pub(crate) fn auth_of(
    props: &BTreeMap<String, String>,
    aws: Option<&AwsIamConfig>,
) -> Result<KafkaAuth, SecurityError> {
    let protocol = props
        .get("security.protocol")
        .map_or("PLAINTEXT", String::as_str);
    let tls = match protocol {
        "PLAINTEXT" | "SASL_PLAINTEXT" => false,
        "SSL" | "SASL_SSL" => true,
        _ => {
            return Err(invalid(
                "security.protocol",
                "must be PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL",
            ))
        }
    };
    if tls {
        let cert =
            nonempty(props, "ssl.certificate.location") || nonempty(props, "ssl.certificate.pem");
        let key = nonempty(props, "ssl.key.location") || nonempty(props, "ssl.key.pem");
        if cert != key {
            return Err(missing(
                if cert {
                    "ssl.key.location"
                } else {
                    "ssl.certificate.location"
                },
                "for mTLS: give both the client certificate and its key (PEM)",
            ));
        }
    }
    let mechanism = match props.get("sasl.mechanism").map(String::as_str) {
        _ if !protocol.starts_with("SASL_") => {
            if aws.is_some() {
                return Err(invalid("security.protocol", "AWS_MSK_IAM needs SASL_SSL"));
            }
            let mutual = nonempty(props, "ssl.certificate.location")
                || nonempty(props, "ssl.certificate.pem")
                || nonempty(props, "ssl.keystore.location");
            return Ok(if tls {
                KafkaAuth::Ssl { mutual }
            } else {
                KafkaAuth::Plaintext
            });
        }
        None => {
            return Err(missing(
                "sasl.mechanism",
                format!("with security.protocol {protocol}"),
            ))
        }
        Some("PLAIN") => SaslMechanism::Plain,
        Some("SCRAM-SHA-256") => SaslMechanism::ScramSha256,
        Some("SCRAM-SHA-512") => SaslMechanism::ScramSha512,
        Some("OAUTHBEARER") if aws.is_some() => SaslMechanism::AwsMskIam,
        Some("OAUTHBEARER") => SaslMechanism::OauthbearerOidc,
        Some(_) => {
            return Err(invalid(
                "sasl.mechanism",
                "must be PLAIN, SCRAM-SHA-256, SCRAM-SHA-512, OAUTHBEARER or AWS_MSK_IAM",
            ))
        }
    };
    match mechanism {
        SaslMechanism::Plain | SaslMechanism::ScramSha256 | SaslMechanism::ScramSha512 => {
            for key in ["sasl.username", "sasl.password"] {
                if !nonempty(props, key) {
                    return Err(missing(
                        key,
                        format!("with sasl.mechanism {}", mechanism.as_str()),
                    ));
                }
            }
        }
        SaslMechanism::OauthbearerOidc => {
            if props.get("sasl.oauthbearer.method").map(String::as_str) != Some("oidc") {
                return Err(missing(
                    "sasl.oauthbearer.token.endpoint.url",
                    "with sasl.mechanism OAUTHBEARER (OIDC client credentials; or use AWS_MSK_IAM)",
                ));
            }
            for key in [
                "sasl.oauthbearer.token.endpoint.url",
                "sasl.oauthbearer.client.id",
                "sasl.oauthbearer.client.secret",
            ] {
                if !nonempty(props, key) {
                    return Err(missing(key, "with sasl.mechanism OAUTHBEARER"));
                }
            }
        }
        SaslMechanism::AwsMskIam => {
            if !tls {
                return Err(invalid("security.protocol", "AWS_MSK_IAM needs SASL_SSL"));
            }
        }
    }
    Ok(KafkaAuth::Sasl { mechanism, tls })
}

/// The AWS region of an MSK bootstrap host name (`….kafka.<region>.amazonaws.com[:port]`).
pub fn region_from_bootstrap(bootstrap: &str) -> Option<String> {
    bootstrap.split(',').find_map(|server| {
        let host = server.trim().split(':').next()?;
        let labels: Vec<&str> = host.split('.').collect();
        let at = labels.iter().position(|l| *l == "kafka")?;
        let region = labels.get(at + 1)?;
        (labels.get(at + 2) == Some(&"amazonaws")).then(|| (*region).to_owned())
    })
}

#[cfg(test)]
#[path = "security_tests.rs"]
mod tests;
