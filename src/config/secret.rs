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
        s.serialize_str(REDACTED)
    }
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

impl Indirect {
    fn resolve(self) -> Result<String, String> {
        match (self.env, self.file) {
            (Some(var), None) => {
                std::env::var(&var).map_err(|_| format!("environment variable {var} is not set"))
            }
            (None, Some(path)) => std::fs::read_to_string(&path)
                .map(|s| s.trim_end_matches(['\r', '\n']).to_owned())
                .map_err(|e| format!("cannot read secret file {path}: {e}")),
            _ => Err("a secret is a string, { env = \"VAR\" } or { file = \"PATH\" }".to_owned()),
        }
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

/// `props` with the value of every secret property replaced by [`REDACTED`], for Debug and
/// `config check` output.
pub(crate) fn redacted_properties(
    props: &std::collections::BTreeMap<String, String>,
) -> std::collections::BTreeMap<&str, &str> {
    props
        .iter()
        .map(|(k, v)| {
            let v = if is_secret_property(k) {
                REDACTED
            } else {
                v.as_str()
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
