//! Secret values: given inline, from an environment variable or from a file, and never printed.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// What Debug, Display and Serialize print instead of a secret.
pub const REDACTED: &str = "***redacted***";

/// A secret string. In TOML: `"inline"`, `{ env = "VAR" }` or `{ file = "/run/secrets/x" }`
/// (trailing newline trimmed). Resolved when the config is loaded.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps a value.
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The secret itself; call only where it is sent.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(REDACTED)
    }
}

impl Serialize for Secret {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(if exposing() { &self.0 } else { REDACTED })
    }
}

thread_local! {
    /// Set only while [`fingerprint`] serializes: secrets are then written as they are.
    static EXPOSING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

fn exposing() -> bool {
    EXPOSING.with(std::cell::Cell::get)
}

/// Whether [`fingerprint`] is serializing (for redacting serializers elsewhere in `config`).
pub(crate) fn exposing_for_fingerprint() -> bool {
    exposing()
}

/// A fingerprint of `value`'s serialized form with its secrets as they are (not redacted),
/// so that a changed password or token changes it. Only the 64-bit hash leaves this function.
/// A config reload restarts a connection whose fingerprint changed.
pub fn fingerprint<T: Serialize>(value: &T) -> u64 {
    use std::hash::{Hash as _, Hasher as _};
    struct Reset;
    impl Drop for Reset {
        fn drop(&mut self) {
            EXPOSING.with(|e| e.set(false));
        }
    }
    EXPOSING.with(|e| e.set(true));
    let _reset = Reset;
    let text = serde_json::to_string(value).unwrap_or_default();
    let mut h = std::collections::hash_map::DefaultHasher::new();
    text.hash(&mut h);
    h.finish()
}

/// A URL that may carry credentials (`https://user:pass@host/x?token=…`). Requests use
/// [`Endpoint::expose`]; Debug, Display and Serialize show it with the user info and
/// credential-like query values replaced (see [`redact_url`]).
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct Endpoint(url::Url);

impl Endpoint {
    /// Wraps a URL.
    pub fn new(url: url::Url) -> Self {
        Self(url)
    }

    /// The URL itself, credentials included; call only where it is sent.
    pub fn expose(&self) -> &url::Url {
        &self.0
    }

    /// The URL's scheme.
    pub fn scheme(&self) -> &str {
        self.0.scheme()
    }
}

impl fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&redact_url(&self.0), f)
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&redact_url(&self.0))
    }
}

impl Serialize for Endpoint {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        if exposing() {
            return s.serialize_str(self.0.as_str());
        }
        s.serialize_str(&redact_url(&self.0))
    }
}

/// Whether a URL query parameter carries a credential.
fn is_secret_param(name: &str) -> bool {
    let n = name.to_ascii_lowercase();
    [
        "token",
        "key",
        "secret",
        "password",
        "passwd",
        "pwd",
        "sig",
        "auth",
        "credential",
        "session",
    ]
    .iter()
    .any(|w| n.contains(w))
}

/// `url` with its user info replaced by `***` and the values of credential-like query
/// parameters (`token`, `key`, `secret`, `password`, `sig`, …) by `***`.
pub fn redact_url(url: &url::Url) -> String {
    let mut u = url.clone();
    if !u.username().is_empty() || u.password().is_some() {
        let _ = u.set_password(None);
        let _ = u.set_username("***");
    }
    if u.query().is_some() {
        let pairs: Vec<(String, String)> = u
            .query_pairs()
            .map(|(k, v)| {
                let v = if is_secret_param(&k) {
                    "***".to_owned()
                } else {
                    v.into_owned()
                };
                (k.into_owned(), v)
            })
            .collect();
        if pairs.is_empty() {
            u.set_query(None);
        } else {
            let _ = u.query_pairs_mut().clear().extend_pairs(pairs);
        }
    }
    u.to_string()
}

/// An error and its sources on one line (`a: b: c`), with every URL in it redacted: reqwest
/// names the URL, user info and query included. A source whose text the line already holds
/// (an error that prints its source in its own message, as many wrappers of an OS error do)
/// is not repeated.
pub fn redacted_error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let text = c.to_string();
        if !text.is_empty() && !s.contains(&text) {
            s.push_str(": ");
            s.push_str(&text);
        }
        cur = c.source();
    }
    redact_text(&s)
}

/// `text` (an error message, a log line) with every URL in it redacted as [`redact_url`]
/// does; a URL that does not parse loses everything between `://` and its last `@`.
pub fn redact_text(text: &str) -> String {
    let is_end = |c: char| c.is_whitespace() || "\"'<>()[]{}|\\^`,".contains(c);
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(sep) = rest.find("://") {
        // The scheme starts after the last character that cannot be part of one (which may
        // be several bytes long).
        let start = rest[..sep]
            .char_indices()
            .rev()
            .find(|(_, c)| !(c.is_ascii_alphanumeric() || "+-.".contains(*c)))
            .map_or(0, |(i, c)| i + c.len_utf8());
        let end = rest[sep + 3..]
            .find(is_end)
            .map_or(rest.len(), |i| sep + 3 + i);
        out.push_str(&rest[..start]);
        let candidate = &rest[start..end];
        match url::Url::parse(candidate) {
            Ok(u) if start < sep => out.push_str(&redact_url(&u)),
            _ => match candidate.rfind('@') {
                Some(at) if at > sep - start => {
                    out.push_str(&candidate[..sep - start + 3]);
                    out.push_str("***");
                    out.push_str(&candidate[at..]);
                }
                _ => out.push_str(candidate),
            },
        }
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
}

#[derive(Deserialize)]
#[serde(untagged)]
enum SecretSource {
    Inline(String),
    Indirect(Indirect),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Indirect {
    env: Option<String>,
    file: Option<String>,
}

thread_local! {
    /// While [`recording_secret_files`] runs on this thread: every file a secret was read from.
    static SECRET_FILES: std::cell::RefCell<Option<std::collections::BTreeSet<std::path::PathBuf>>> =
        const { std::cell::RefCell::new(None) };
}

/// Runs `f` (a deserialization) and returns, beside its result, the files it read secrets from
/// (`{ file = … }` and `"<property>_file"`): the daemon watches them and reloads when one
/// changes, as a rotated Kubernetes Secret does.
pub(crate) fn recording_secret_files<T>(
    f: impl FnOnce() -> T,
) -> (T, std::collections::BTreeSet<std::path::PathBuf>) {
    struct Stop;
    impl Drop for Stop {
        fn drop(&mut self) {
            let _ = SECRET_FILES.with(|s| s.borrow_mut().take());
        }
    }
    SECRET_FILES.with(|s| *s.borrow_mut() = Some(std::collections::BTreeSet::new()));
    let stop = Stop;
    let out = f();
    let files = SECRET_FILES
        .with(|s| s.borrow_mut().take())
        .unwrap_or_default();
    drop(stop);
    (out, files)
}

impl Indirect {
    fn resolve(self) -> Result<String, String> {
        match (self.env, self.file) {
            (Some(var), None) => {
                std::env::var(&var).map_err(|_| format!("environment variable {var} is not set"))
            }
            (None, Some(path)) => {
                SECRET_FILES.with(|s| {
                    if let Some(files) = s.borrow_mut().as_mut() {
                        let _ = files.insert(std::path::PathBuf::from(&path));
                    }
                });
                Self::read_file(&path)
            }
            _ => Err("a secret is a string, { env = \"VAR\" } or { file = \"PATH\" }".to_owned()),
        }
    }

    fn read_file(path: &str) -> Result<String, String> {
        std::fs::read_to_string(path)
            .map(|s| s.trim_end_matches(['\r', '\n']).to_owned())
            .map_err(|e| format!("cannot read secret file {path}: {e}"))
    }
}

impl<'de> Deserialize<'de> for Secret {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        match SecretSource::deserialize(d)? {
            SecretSource::Inline(s) => Ok(Self(s)),
            SecretSource::Indirect(i) => i.resolve().map(Self).map_err(D::Error::custom),
        }
    }
}

/// Kafka property names whose values are secrets.
pub fn is_secret_property(name: &str) -> bool {
    let n = name.to_ascii_lowercase();
    n.contains("password")
        || n.contains("secret")
        || n.ends_with(".key.pem")
        || n.contains("jaas")
        || n.contains("token")
        || n.contains("user.info")
        || n.ends_with("key.password")
}

#[derive(Deserialize)]
#[serde(untagged)]
enum RawProperty {
    Bool(bool),
    Int(i64),
    Float(f64),
    Text(String),
    Indirect(Indirect),
}

/// The property a `<property>_file` (or, from the environment, `<property>.file`) key names.
fn file_property(key: &str) -> Option<&str> {
    key.strip_suffix("_file")
        .or_else(|| key.strip_suffix(".file"))
        .filter(|k| !k.is_empty())
}

/// `props` with the value of every secret property replaced by [`REDACTED`], and
/// credentials in URL values (`sasl.oauthbearer.token.endpoint.url`) removed, for Debug and
/// `config check` output.
pub(crate) fn redacted_properties(
    props: &std::collections::BTreeMap<String, String>,
) -> std::collections::BTreeMap<&str, std::borrow::Cow<'_, str>> {
    use std::borrow::Cow;
    props
        .iter()
        .map(|(k, v)| {
            let v = if is_secret_property(k) {
                Cow::Borrowed(REDACTED)
            } else if v.contains("://") {
                Cow::Owned(redact_text(v))
            } else {
                Cow::Borrowed(v.as_str())
            };
            (k.as_str(), v)
        })
        .collect()
}

/// Serializes librdkafka properties with secret values redacted.
pub(crate) fn serialize_properties<S: Serializer>(
    props: &std::collections::BTreeMap<String, String>,
    s: S,
) -> Result<S::Ok, S::Error> {
    if exposing() {
        return props.serialize(s);
    }
    redacted_properties(props).serialize(s)
}

/// librdkafka properties: strings, numbers and booleans as written, and secrets given as
/// `{ env = … }` or `{ file = … }` resolved. `"<property>_file" = "/path"` reads the
/// property's value from the file (trailing newline trimmed), for mounted secrets.
pub(crate) fn deserialize_properties<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<std::collections::BTreeMap<String, String>, D::Error> {
    use serde::de::Error;
    let raw = std::collections::BTreeMap::<String, RawProperty>::deserialize(d)?;
    let mut out = std::collections::BTreeMap::new();
    for (k, v) in raw {
        let v = match v {
            RawProperty::Bool(b) => b.to_string(),
            RawProperty::Int(i) => i.to_string(),
            RawProperty::Float(f) => f.to_string(),
            RawProperty::Text(s) => s,
            RawProperty::Indirect(i) => i
                .resolve()
                .map_err(|e| D::Error::custom(format!("\"{k}\": {e}")))?,
        };
        let (key, value) = match file_property(&k) {
            Some(target) => {
                let value = Indirect {
                    env: None,
                    file: Some(v),
                }
                .resolve()
                .map_err(|e| D::Error::custom(format!("\"{k}\": {e}")))?;
                (target.to_owned(), value)
            }
            None => (k, v),
        };
        if out.contains_key(&key) {
            return Err(D::Error::custom(format!(
                "\"{key}\" is given twice (directly and as \"{key}_file\")"
            )));
        }
        let _ = out.insert(key, value);
    }
    Ok(out)
}

#[cfg(test)]
mod redaction_tests {
    use super::*;

    #[test]
    fn urls_lose_user_info_and_secret_query_values() {
        let u = url::Url::parse(
            "http://user:s3cr3t@host:8080/runs?token=abc&tenant=acme&X-Amz-Signature=f00",
        )
        .unwrap();
        assert_eq!(
            redact_url(&u),
            "http://***@host:8080/runs?token=***&tenant=acme&X-Amz-Signature=***"
        );
        let plain = url::Url::parse("https://host/runs?page=2").unwrap();
        assert_eq!(redact_url(&plain), "https://host/runs?page=2");
    }

    /// An error that prints its source in its own message (thiserror's `{source}`) is not
    /// followed by the same source again; sources it does not print are.
    #[test]
    fn an_error_chain_names_each_cause_once() {
        #[derive(Debug, thiserror::Error)]
        #[error("cannot read offsets file x: {source}")]
        struct Prints {
            source: std::io::Error,
        }
        #[derive(Debug, thiserror::Error)]
        #[error("cannot start")]
        struct Wraps(#[source] Prints);
        let os = || std::io::Error::from_raw_os_error(2);
        let chain = redacted_error_chain(&Wraps(Prints { source: os() }));
        assert_eq!(chain.matches(&os().to_string()).count(), 1, "{chain}");
        assert!(
            chain.starts_with("cannot start: cannot read offsets file x: "),
            "{chain}"
        );
        // A config file that cannot be read, as `Config::load` reports it.
        let read =
            crate::config::Config::load(std::path::Path::new("/nonexistent/tk.toml")).unwrap_err();
        let chain = redacted_error_chain(&read);
        assert_eq!(chain.matches("(os error 2)").count(), 1, "{chain}");
    }

    #[test]
    fn text_loses_credentials_of_every_url_in_it() {
        let text = "error sending request for url (https://u:p4ss@reg.example/schemas/ids/1?api_key=k3y): \
                    connect failed; then amqp://bad url@host and sasl://a:b@c";
        let out = redact_text(text);
        for secret in ["p4ss", "k3y", "a:b"] {
            assert!(!out.contains(secret), "{out}");
        }
        assert!(
            out.contains("https://***@reg.example/schemas/ids/1?api_key=***)"),
            "{out}"
        );
        assert_eq!(redact_text("no url here"), "no url here");
        assert_eq!(redact_text("://@"), "://***@");
        assert_eq!(redact_text("x://"), "x://");
    }

    #[test]
    fn text_with_multibyte_characters_before_a_scheme_is_redacted_without_panicking() {
        // Found by the dispatcher_answer fuzz target: a scheme after a two-byte character.
        let input = "\0\0M/\0\0\0//\0\0M/\0\0\0//0://0:\nzFư0://0:\nzFư";
        let out = redact_text(input);
        assert!(out.contains("zFư"), "{out:?}");
        assert_eq!(redact_text("é://u:p@h/x"), "é://***@h/x");
        assert_eq!(redact_text("ǅhttp://u:p@h/x"), "ǅhttp://***@h/x");
    }

    #[test]
    fn config_check_and_debug_never_show_url_credentials() {
        let text = r#"
[connections.orders.kafka]
"bootstrap.servers" = "127.0.0.1:9092"
"group.id" = "tessel-orders"
"security.protocol" = "SASL_SSL"
"sasl.mechanism" = "OAUTHBEARER"
"sasl.oauthbearer.method" = "oidc"
"sasl.oauthbearer.client.id" = "tessel"
"sasl.oauthbearer.client.secret" = "client-s3cr3t"
"sasl.oauthbearer.token.endpoint.url" = "https://idp-user:idp-s3cr3t@idp.example/token?key=idp-k3y"

[connections.orders.schema_registry]
url = "https://reg-user:reg-s3cr3t@registry.example/apis/ccompat/v7"

[connections.orders.triggers.fraud]
topics = ["payments"]
workflow = "fraud-check"
dispatcher = { url = "http://user:s3cr3t@127.0.0.1:8080/runs?token=t0ken-value&tenant=acme" }
"#;
        let c = crate::config::Config::from_toml_with_env(text, Vec::new()).unwrap();
        let t = &c.connections["orders"].triggers["fraud"];
        assert_eq!(t.dispatcher.url.expose().password(), Some("s3cr3t"));
        let shown = format!(
            "{}{c:?}{}",
            toml::to_string_pretty(&c).unwrap(),
            t.dispatcher.url
        );
        for secret in [
            "s3cr3t",
            "t0ken-value",
            "reg-s3cr3t",
            "idp-s3cr3t",
            "idp-k3y",
        ] {
            assert!(!shown.contains(secret), "{secret} in {shown}");
        }
        assert!(shown.contains("tenant=acme"), "{shown}");
    }
}

#[cfg(test)]
mod fingerprint_tests {
    use super::*;

    #[derive(Serialize)]
    struct Conn {
        password: Secret,
        url: Endpoint,
        #[serde(serialize_with = "serialize_properties")]
        kafka: std::collections::BTreeMap<String, String>,
    }

    fn conn(password: &str, url: &str, sasl: &str) -> Conn {
        Conn {
            password: Secret::new(password),
            url: Endpoint::new(url::Url::parse(url).unwrap()),
            kafka: [("sasl.password".to_owned(), sasl.to_owned())].into(),
        }
    }

    #[test]
    fn a_fingerprint_sees_secrets_and_redaction_is_back_after_it() {
        let a = conn("p1", "https://u:t1@h/x", "s1");
        let same = conn("p1", "https://u:t1@h/x", "s1");
        assert_eq!(fingerprint(&a), fingerprint(&same));
        assert_ne!(
            fingerprint(&a),
            fingerprint(&conn("p2", "https://u:t1@h/x", "s1"))
        );
        assert_ne!(
            fingerprint(&a),
            fingerprint(&conn("p1", "https://u:t2@h/x", "s1"))
        );
        assert_ne!(
            fingerprint(&a),
            fingerprint(&conn("p1", "https://u:t1@h/x", "s2"))
        );
        let shown = serde_json::to_string(&a).unwrap();
        assert!(
            !shown.contains("p1") && !shown.contains("t1") && !shown.contains("s1"),
            "{shown}"
        );
    }
}
