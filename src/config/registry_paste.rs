//! Schema Registry client properties pasted into a connection's `kafka` table.
//!
//! The client snippets of Confluent Cloud, Aiven, Redpanda and others put the registry's
//! settings (`schema.registry.url`, `basic.auth.credentials.source`, `basic.auth.user.info`,
//! `schema.registry.ssl.*`, …) next to the Kafka ones. They are taken out of the `kafka` table
//! when the configuration is loaded and mapped onto the connection's `[schema_registry]`; each
//! mapping leaves a notice (`kafka."schema.registry.url" → schema_registry.url`) that the
//! daemon logs at start and `config check` prints. A value the `[schema_registry]` table also
//! sets, differently, is an error naming both. Notices and errors name properties, never the
//! values of credentials.

use std::collections::BTreeMap;
use std::path::PathBuf;

use super::connection::RegistryConfig;
use super::secret::{Endpoint, Secret};
use super::security::SecurityError;
use super::ConfigError;

/// A registry setting taken from the `kafka` table, with the property it came from.
#[derive(Debug)]
struct Pasted<T> {
    /// The property the value was written under (`basic.auth.user.info`).
    property: String,
    value: T,
}

/// The registry settings found among a connection's Kafka properties.
#[derive(Debug, Default)]
pub(crate) struct PastedRegistry {
    url: Option<Pasted<Endpoint>>,
    username: Option<Pasted<String>>,
    password: Option<Pasted<Secret>>,
    bearer_token: Option<Pasted<Secret>>,
    ca_location: Option<Pasted<PathBuf>>,
    certificate_location: Option<Pasted<PathBuf>>,
    key_location: Option<Pasted<PathBuf>>,
    /// One line per property taken (mapped or dropped).
    notices: Vec<String>,
}

/// Serializer settings a snippet may carry; the connector only reads, by the schema id each
/// record names, so they have nothing to do.
const SERIALIZER_ONLY: &[&str] = &[
    "auto.register.schemas",
    "use.latest.version",
    "specific.avro.reader",
    "latest.compatibility.strict",
];

fn invalid(property: &str, reason: impl Into<String>) -> SecurityError {
    SecurityError::Invalid {
        property: property.to_owned(),
        reason: reason.into(),
    }
}

/// Removes the first of `names` present in `props` (a property and its `schema.registry.`
/// prefixed spelling mean the same); both present with different values is an error.
fn take_either(
    props: &mut BTreeMap<String, String>,
    names: &[&str],
) -> Result<Option<Pasted<String>>, SecurityError> {
    let mut found: Option<Pasted<String>> = None;
    for name in names {
        if let Some(value) = props.remove(*name) {
            match &found {
                Some(first) if first.value != value => {
                    return Err(invalid(
                        name,
                        format!("conflicts with \"{}\"; set one of them", first.property),
                    ))
                }
                Some(_) => {}
                None => {
                    found = Some(Pasted {
                        property: (*name).to_owned(),
                        value,
                    })
                }
            }
        }
    }
    Ok(found)
}

fn is_java_store(path: &str) -> bool {
    let lower = path.to_ascii_lowercase();
    [".jks", ".p12", ".pfx"].iter().any(|x| lower.ends_with(x))
}

impl PastedRegistry {
    /// `value`, pasted from `property` into `schema_registry.<field>`, with its notice.
    fn moved<T>(&mut self, property: String, field: &str, value: T) -> Option<Pasted<T>> {
        self.notices
            .push(format!("kafka.\"{property}\" → schema_registry.{field}"));
        Some(Pasted { property, value })
    }

    /// Takes every registry property out of `props` (after the JAAS translation, so that
    /// `SASL_INHERIT` finds `sasl.username` and `sasl.password`).
    pub(crate) fn take(props: &mut BTreeMap<String, String>) -> Result<Self, SecurityError> {
        let mut p = Self::default();
        if let Some(url) = props.remove("schema.registry.url") {
            p.set_url(url)?;
        }
        p.take_basic_auth(props)?;
        p.take_bearer(props)?;
        p.take_tls(props)?;
        for name in SERIALIZER_ONLY {
            for name in [(*name).to_owned(), format!("schema.registry.{name}")] {
                if props.remove(&name).is_some() {
                    p.notices.push(format!(
                        "dropped kafka.\"{name}\": a serializer setting; the connector decodes by the schema id each record carries"
                    ));
                }
            }
        }
        Ok(p)
    }

    fn set_url(&mut self, url: String) -> Result<(), SecurityError> {
        const P: &str = "schema.registry.url";
        if url.contains(',') {
            return Err(invalid(P, "lists several registries; give one URL"));
        }
        // The value is not quoted: it may carry credentials.
        let parsed =
            url::Url::parse(url.trim()).map_err(|e| invalid(P, format!("is not a URL ({e})")))?;
        if !matches!(parsed.scheme(), "http" | "https") {
            return Err(invalid(P, "must be an http:// or https:// URL"));
        }
        self.url = self.moved(P.to_owned(), "url", Endpoint::new(parsed));
        Ok(())
    }

    fn take_basic_auth(
        &mut self,
        props: &mut BTreeMap<String, String>,
    ) -> Result<(), SecurityError> {
        let source = take_either(
            props,
            &[
                "basic.auth.credentials.source",
                "schema.registry.basic.auth.credentials.source",
            ],
        )?;
        let user_info = take_either(
            props,
            &[
                "basic.auth.user.info",
                "schema.registry.basic.auth.user.info",
            ],
        )?;
        let source_name = source.as_ref().map_or_else(
            || "USER_INFO".to_owned(),
            |s| s.value.trim().to_ascii_uppercase(),
        );
        match source_name.as_str() {
            "USER_INFO" => {
                if let Some(info) = user_info {
                    let Some((user, password)) = info.value.split_once(':') else {
                        return Err(invalid(&info.property, "must be <username>:<password>"));
                    };
                    self.username = Some(Pasted {
                        property: info.property.clone(),
                        value: user.to_owned(),
                    });
                    self.password = Some(Pasted {
                        property: info.property.clone(),
                        value: Secret::new(password),
                    });
                    self.notices.push(format!(
                        "kafka.\"{}\" → schema_registry.username, schema_registry.password",
                        info.property
                    ));
                }
            }
            "URL" => {
                if let Some(info) = user_info {
                    return Err(invalid(
                        &info.property,
                        "is not used with basic.auth.credentials.source URL (the credentials are in schema.registry.url); remove one of them",
                    ));
                }
                self.credentials_from_url()?;
            }
            "SASL_INHERIT" => {
                if let Some(info) = user_info {
                    return Err(invalid(
                        &info.property,
                        "is not used with basic.auth.credentials.source SASL_INHERIT; remove one of them",
                    ));
                }
                let (Some(user), Some(password)) =
                    (props.get("sasl.username"), props.get("sasl.password"))
                else {
                    return Err(SecurityError::Missing {
                        property: "sasl.username\" and \"sasl.password".to_owned(),
                        because: "with basic.auth.credentials.source SASL_INHERIT".to_owned(),
                    });
                };
                self.username = Some(Pasted {
                    property: "sasl.username".to_owned(),
                    value: user.clone(),
                });
                self.password = Some(Pasted {
                    property: "sasl.password".to_owned(),
                    value: Secret::new(password.clone()),
                });
                self.notices.push(
                    "kafka.\"sasl.username\", kafka.\"sasl.password\" → schema_registry.username, schema_registry.password (basic.auth.credentials.source SASL_INHERIT)"
                        .to_owned(),
                );
            }
            _ => {
                let property = source.map_or_else(String::new, |s| s.property);
                return Err(invalid(&property, "must be USER_INFO, URL or SASL_INHERIT"));
            }
        }
        Ok(())
    }

    /// `basic.auth.credentials.source = URL`: the user info of `schema.registry.url` becomes
    /// the username and password, and leaves the URL.
    fn credentials_from_url(&mut self) -> Result<(), SecurityError> {
        const SOURCE: &str = "basic.auth.credentials.source";
        let Some(url) = self.url.as_mut() else {
            return Err(SecurityError::Missing {
                property: "schema.registry.url".to_owned(),
                because: "with basic.auth.credentials.source URL".to_owned(),
            });
        };
        let mut bare = url.value.expose().clone();
        if bare.username().is_empty() {
            return Err(invalid(
                SOURCE,
                "is URL but schema.registry.url has no user info (https://<user>:<password>@host)",
            ));
        }
        let decode = |s: &str| {
            url::form_urlencoded::parse(format!("x={}", s.replace('+', "%2B")).as_bytes())
                .next()
                .map(|(_, v)| v.into_owned())
                .unwrap_or_default()
        };
        let user = decode(bare.username());
        let password = decode(bare.password().unwrap_or(""));
        let _ = bare.set_username("");
        let _ = bare.set_password(None);
        url.value = Endpoint::new(bare);
        self.username = Some(Pasted {
            property: "schema.registry.url".to_owned(),
            value: user,
        });
        self.password = Some(Pasted {
            property: "schema.registry.url".to_owned(),
            value: Secret::new(password),
        });
        self.notices.push(
            "kafka.\"schema.registry.url\" user info → schema_registry.username, schema_registry.password (basic.auth.credentials.source URL)"
                .to_owned(),
        );
        Ok(())
    }

    fn take_bearer(&mut self, props: &mut BTreeMap<String, String>) -> Result<(), SecurityError> {
        let source = take_either(
            props,
            &[
                "bearer.auth.credentials.source",
                "schema.registry.bearer.auth.credentials.source",
            ],
        )?;
        if let Some(source) = &source {
            if !source.value.trim().eq_ignore_ascii_case("STATIC_TOKEN") {
                return Err(invalid(
                    &source.property,
                    "only STATIC_TOKEN is supported (with bearer.auth.token); for other registry credentials use [schema_registry] username and password",
                ));
            }
        }
        if let Some(token) = take_either(
            props,
            &["bearer.auth.token", "schema.registry.bearer.auth.token"],
        )? {
            let value = Secret::new(token.value);
            self.bearer_token = self.moved(token.property, "bearer_token", value);
        } else if let Some(source) = source {
            return Err(SecurityError::Missing {
                property: "bearer.auth.token".to_owned(),
                because: format!("with {} STATIC_TOKEN", source.property),
            });
        }
        Ok(())
    }

    fn take_tls(&mut self, props: &mut BTreeMap<String, String>) -> Result<(), SecurityError> {
        const TRUSTSTORE: &str = "schema.registry.ssl.truststore.location";
        const KEYSTORE: &str = "schema.registry.ssl.keystore.location";
        if let Some(kind) = props.remove("schema.registry.ssl.truststore.type") {
            if !kind.trim().eq_ignore_ascii_case("PEM") {
                return Err(invalid(
                    "schema.registry.ssl.truststore.type",
                    "the registry's CA is read in PEM: convert the truststore (keytool -exportcert -rfc) and give the PEM file",
                ));
            }
            self.notices.push(
                "dropped kafka.\"schema.registry.ssl.truststore.type\" (PEM): the registry's CA file is PEM"
                    .to_owned(),
            );
        }
        if props
            .remove("schema.registry.ssl.truststore.password")
            .is_some()
        {
            self.notices.push(
                "dropped kafka.\"schema.registry.ssl.truststore.password\": a PEM CA file has no password"
                    .to_owned(),
            );
        }
        let ca = take_either(props, &[TRUSTSTORE, "schema.registry.ssl.ca.location"])?;
        if let Some(ca) = ca {
            if is_java_store(&ca.value) {
                return Err(invalid(
                    &ca.property,
                    "the registry's CA is read in PEM: convert the truststore (keytool -exportcert -rfc) and give the PEM file",
                ));
            }
            self.ca_location = self.moved(ca.property, "ca_location", PathBuf::from(ca.value));
        }
        if props.contains_key(KEYSTORE) {
            return Err(invalid(
                KEYSTORE,
                "registry mTLS reads PEM: extract the certificate and key (openssl pkcs12 -nokeys / -nocerts -nodes) and set \"schema.registry.ssl.certificate.location\" and \"schema.registry.ssl.key.location\"",
            ));
        }
        const CERTIFICATE: &str = "schema.registry.ssl.certificate.location";
        const KEY: &str = "schema.registry.ssl.key.location";
        if let Some(value) = props.remove(CERTIFICATE) {
            let value = PathBuf::from(value);
            self.certificate_location =
                self.moved(CERTIFICATE.to_owned(), "certificate_location", value);
        }
        if let Some(value) = props.remove(KEY) {
            self.key_location = self.moved(KEY.to_owned(), "key_location", PathBuf::from(value));
        }
        for property in [
            "schema.registry.ssl.endpoint.identification.algorithm",
            "schema.registry.ssl.keystore.type",
            "schema.registry.ssl.keystore.password",
            "schema.registry.ssl.key.password",
        ] {
            let Some(value) = props.remove(property) else {
                continue;
            };
            if property.ends_with("identification.algorithm") && value.trim().is_empty() {
                return Err(invalid(
                    property,
                    "turning off the registry's host name verification is not supported",
                ));
            }
            self.notices.push(format!(
                "dropped kafka.\"{property}\": the registry client verifies host names and reads unencrypted PEM keys"
            ));
        }
        Ok(())
    }

    /// Whether any registry setting was found.
    fn is_empty(&self) -> bool {
        self.url.is_none()
            && self.username.is_none()
            && self.password.is_none()
            && self.bearer_token.is_none()
            && self.ca_location.is_none()
            && self.certificate_location.is_none()
            && self.key_location.is_none()
    }

    /// Applies the settings to connection `name`'s `registry` (created when absent, which
    /// needs `schema.registry.url`) and returns the notices. A field `registry` already sets
    /// to another value is an error naming the property and the field.
    pub(crate) fn apply(
        self,
        name: &str,
        registry: &mut Option<RegistryConfig>,
    ) -> Result<Vec<String>, ConfigError> {
        if self.is_empty() {
            return Ok(self.notices);
        }
        let conflict = |property: &str, field: &str| {
            ConfigError::invalid(
                format!("connections.{name}.kafka.\"{property}\""),
                format!(
                    "conflicts with connections.{name}.schema_registry.{field}; set one of them"
                ),
            )
        };
        let registry = match registry {
            Some(r) => r,
            None => {
                let Some(url) = &self.url else {
                    let property = [
                        self.username.as_ref().map(|p| &p.property),
                        self.bearer_token.as_ref().map(|p| &p.property),
                        self.ca_location.as_ref().map(|p| &p.property),
                        self.certificate_location.as_ref().map(|p| &p.property),
                        self.key_location.as_ref().map(|p| &p.property),
                    ]
                    .into_iter()
                    .flatten()
                    .next()
                    .cloned()
                    .unwrap_or_default();
                    return Err(ConfigError::invalid(
                        format!("connections.{name}.kafka.\"{property}\""),
                        format!("is a Schema Registry setting but no registry URL is given: add \"schema.registry.url\" or connections.{name}.schema_registry.url"),
                    ));
                };
                registry.insert(RegistryConfig::new(url.value.clone()))
            }
        };
        fn merge<T: PartialEq>(
            slot: &mut Option<T>,
            pasted: Option<Pasted<T>>,
            field: &str,
            conflict: &dyn Fn(&str, &str) -> ConfigError,
        ) -> Result<(), ConfigError> {
            let Some(pasted) = pasted else {
                return Ok(());
            };
            match slot {
                Some(existing) if *existing != pasted.value => {
                    Err(conflict(&pasted.property, field))
                }
                Some(_) => Ok(()),
                None => {
                    *slot = Some(pasted.value);
                    Ok(())
                }
            }
        }
        if let Some(url) = self.url {
            if registry.url != url.value {
                return Err(conflict(&url.property, "url"));
            }
        }
        merge(&mut registry.username, self.username, "username", &conflict)?;
        merge(&mut registry.password, self.password, "password", &conflict)?;
        merge(
            &mut registry.bearer_token,
            self.bearer_token,
            "bearer_token",
            &conflict,
        )?;
        merge(
            &mut registry.ca_location,
            self.ca_location,
            "ca_location",
            &conflict,
        )?;
        merge(
            &mut registry.certificate_location,
            self.certificate_location,
            "certificate_location",
            &conflict,
        )?;
        merge(
            &mut registry.key_location,
            self.key_location,
            "key_location",
            &conflict,
        )?;
        Ok(self.notices)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn props(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn paste(pairs: &[(&str, &str)]) -> Result<(Option<RegistryConfig>, Vec<String>), String> {
        let mut p = props(pairs);
        let pasted = PastedRegistry::take(&mut p).map_err(|e| e.to_string())?;
        assert!(
            p.keys()
                .all(|k| k == "sasl.username" || k == "sasl.password"),
            "left in the kafka table: {p:?}"
        );
        let mut registry = None;
        let notices = pasted
            .apply("orders", &mut registry)
            .map_err(|e| e.to_string())?;
        Ok((registry, notices))
    }

    /// The pasted registry has these basic-auth credentials.
    fn assert_credentials(r: Option<RegistryConfig>, username: &str, password: &str) {
        let r = r.expect("a registry");
        assert_eq!(r.username.as_deref(), Some(username));
        assert_eq!(r.password.expect("a password").expose(), password);
    }

    /// Why a registry URL without user info, with credentials from `source`, is refused.
    fn refusal_without_credentials(source: &str) -> String {
        paste(&[
            ("schema.registry.url", "https://sr.example.invalid"),
            ("basic.auth.credentials.source", source),
        ])
        .unwrap_err()
    }

    #[test]
    fn user_info_becomes_username_and_password_and_is_never_shown() {
        let (r, notices) = paste(&[
            ("schema.registry.url", "https://psrc-1.example.invalid"),
            ("basic.auth.credentials.source", "USER_INFO"),
            ("basic.auth.user.info", "SRKEY:sr:secret-1"),
        ])
        .unwrap();
        let r = r.unwrap();
        assert_eq!(r.url.expose().as_str(), "https://psrc-1.example.invalid/");
        assert_eq!(r.username.as_deref(), Some("SRKEY"));
        assert_eq!(r.password.as_ref().unwrap().expose(), "sr:secret-1");
        assert!(notices
            .iter()
            .any(|n| n == "kafka.\"schema.registry.url\" → schema_registry.url"));
        assert!(notices.iter().any(|n| {
            n
            == "kafka.\"basic.auth.user.info\" → schema_registry.username, schema_registry.password"
        }));
        assert!(!format!("{notices:?}{r:?}").contains("secret-1"));
    }

    #[test]
    fn sasl_inherit_takes_the_kafka_credentials() {
        let (r, _) = paste(&[
            ("schema.registry.url", "https://sr.example.invalid:30081"),
            ("basic.auth.credentials.source", "SASL_INHERIT"),
            ("sasl.username", "rp-user"),
            ("sasl.password", "rp-pass"),
        ])
        .unwrap();
        assert_credentials(r, "rp-user", "rp-pass");
        let e = refusal_without_credentials("SASL_INHERIT");
        assert!(e.contains("sasl.username"), "{e}");
    }

    #[test]
    fn url_source_moves_the_user_info_out_of_the_url() {
        let (r, _) = paste(&[
            (
                "schema.registry.url",
                "https://sr%2Duser:p%40ss@sr.example.invalid/apis/ccompat/v7",
            ),
            ("basic.auth.credentials.source", "URL"),
        ])
        .unwrap();
        let url = r.as_ref().map(|r| r.url.expose().to_string());
        assert_eq!(url.unwrap(), "https://sr.example.invalid/apis/ccompat/v7");
        assert_credentials(r, "sr-user", "p@ss");
        let e = refusal_without_credentials("URL");
        assert!(e.contains("user info"), "{e}");
    }

    #[test]
    fn malformed_values_are_refused_without_echoing_them() {
        for (pairs, names) in [
            (
                vec![
                    ("schema.registry.url", "https://sr.example.invalid"),
                    ("basic.auth.user.info", "no-colon-secret-2"),
                ],
                "basic.auth.user.info",
            ),
            (
                vec![("schema.registry.url", "https://a.invalid,https://b.invalid")],
                "schema.registry.url",
            ),
            (
                vec![
                    ("schema.registry.url", "https://sr.example.invalid"),
                    ("basic.auth.credentials.source", "OAUTH"),
                ],
                "basic.auth.credentials.source",
            ),
            (
                vec![
                    ("basic.auth.user.info", "k:secret-2"),
                    ("schema.registry.basic.auth.user.info", "k:other-secret-2"),
                ],
                "schema.registry.basic.auth.user.info",
            ),
            (
                vec![
                    ("schema.registry.url", "https://sr.example.invalid"),
                    (
                        "schema.registry.ssl.truststore.location",
                        "/etc/sr.truststore.jks",
                    ),
                ],
                "keytool",
            ),
            (
                vec![
                    ("schema.registry.url", "https://sr.example.invalid"),
                    (
                        "schema.registry.ssl.keystore.location",
                        "/etc/sr.keystore.p12",
                    ),
                ],
                "schema.registry.ssl.certificate.location",
            ),
            (
                vec![("basic.auth.user.info", "k:secret-2")],
                "schema.registry.url",
            ),
        ] {
            let e = paste(&pairs).unwrap_err();
            assert!(e.contains(names), "{pairs:?}: {e}");
            assert!(!e.contains("secret-2"), "{e}");
        }
    }

    #[test]
    fn an_explicit_registry_value_that_differs_is_a_conflict_naming_both() {
        let explicit = || {
            let mut r = RegistryConfig::new(Endpoint::new(
                url::Url::parse("https://sr.example.invalid").unwrap(),
            ));
            r.username = Some("KEY".to_owned());
            r.password = Some(Secret::new("explicit-secret-3"));
            Some(r)
        };
        let apply = |pairs: &[(&str, &str)]| {
            let mut p = props(pairs);
            let mut r = explicit();
            PastedRegistry::take(&mut p)
                .unwrap()
                .apply("orders", &mut r)
                .map(|_| r.unwrap())
                .map_err(|e| e.to_string())
        };
        let e = apply(&[("schema.registry.url", "https://other.example.invalid")]).unwrap_err();
        assert!(
            e.contains("connections.orders.kafka.\"schema.registry.url\"")
                && e.contains("connections.orders.schema_registry.url"),
            "{e}"
        );
        let e = apply(&[("basic.auth.user.info", "KEY:pasted-secret-3")]).unwrap_err();
        assert!(
            e.contains("\"basic.auth.user.info\"")
                && e.contains("connections.orders.schema_registry.password"),
            "{e}"
        );
        assert!(!e.contains("secret-3"), "{e}");
        // The same values twice are no conflict; a field only the paste sets is added.
        let r = apply(&[
            ("schema.registry.url", "https://sr.example.invalid"),
            ("basic.auth.user.info", "KEY:explicit-secret-3"),
            ("schema.registry.ssl.ca.location", "/etc/sr-ca.pem"),
        ])
        .unwrap();
        assert_eq!(r.ca_location.unwrap(), PathBuf::from("/etc/sr-ca.pem"));
    }
}
