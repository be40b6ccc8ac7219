//! Schema Registry client (Confluent REST API) with a cache of compiled schemas by id.
//!
//! Schemas are immutable under their id, so a compiled schema is cached for the life of the
//! process. Failures are never cached: a registry outage only delays decoding. One fetch per
//! id is in flight at a time; concurrent decoders of the same id share its result, failure
//! included, so an unresponsive registry costs each of them one timeout, not one each in turn.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine as _;
use futures::future::{BoxFuture, FutureExt, Shared};
use prost_reflect::{DescriptorPool, FileDescriptor};
use serde::Deserialize;
use thiserror::Error;

use crate::config::RegistryConfig;

/// The kinds of schema the registry holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SchemaType {
    /// Apache Avro.
    Avro,
    /// Protocol Buffers.
    Protobuf,
    /// JSON Schema.
    Json,
}

impl SchemaType {
    /// The name used in events and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Avro => "avro",
            Self::Protobuf => "protobuf",
            Self::Json => "json_schema",
        }
    }
}

/// A schema fetched and compiled, ready to decode with.
#[derive(Debug)]
pub struct ResolvedSchema {
    /// The registry id.
    pub id: u32,
    /// The compiled form.
    pub kind: CompiledSchema,
    /// Subjects and versions registered under this id, when the registry says.
    pub subjects: Vec<SubjectVersion>,
}

/// A subject and version a schema id is registered under.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct SubjectVersion {
    /// Subject name (shared: every decoded record's `schema.subject` points at it).
    pub subject: Arc<str>,
    /// Version within the subject.
    pub version: i64,
}

/// The compiled schema of each kind.
#[derive(Debug)]
pub enum CompiledSchema {
    /// An Avro writer schema and the schemas it references.
    Avro {
        /// The schema itself.
        schema: apache_avro::Schema,
        /// Referenced named schemas.
        references: Vec<apache_avro::Schema>,
        /// The schema's full name (record, enum or fixed), shared by every decoded record.
        name: Option<Arc<str>>,
    },
    /// A Protobuf file in a pool holding its imports and the well-known types.
    Protobuf {
        /// The schema's file.
        file: FileDescriptor,
    },
    /// A JSON Schema document.
    Json {
        /// The parsed schema.
        schema: serde_json::Value,
        /// Its validator, compiled once per schema id with the referenced schemas, used on
        /// consume and on produce.
        validator: Arc<jsonschema::Validator>,
        /// The document's `title`, shared by every decoded record.
        title: Option<Arc<str>>,
    },
}

impl ResolvedSchema {
    /// The schema type.
    pub fn schema_type(&self) -> SchemaType {
        match self.kind {
            CompiledSchema::Avro { .. } => SchemaType::Avro,
            CompiledSchema::Protobuf { .. } => SchemaType::Protobuf,
            CompiledSchema::Json { .. } => SchemaType::Json,
        }
    }

    /// The subject for `topic` under TopicNameStrategy when registered, else the first.
    pub fn subject_for(&self, topic: &str, is_key: bool) -> Option<&SubjectVersion> {
        // Runs per record: compared in place rather than by formatting `<topic>-<suffix>`.
        let suffix = if is_key { "key" } else { "value" };
        self.subjects
            .iter()
            .find(|s| is_topic_subject(&s.subject, topic, suffix))
            .or_else(|| self.subjects.first())
    }
}

/// Whether `subject` is `<topic>-<suffix>` (TopicNameStrategy).
fn is_topic_subject(subject: &str, topic: &str, suffix: &str) -> bool {
    subject
        .strip_prefix(topic)
        .and_then(|rest| rest.strip_prefix('-'))
        == Some(suffix)
}

/// Why a schema could not be had.
#[derive(Debug, Error, Clone)]
pub enum RegistryError {
    /// The registry says no schema has this id (error code 40403).
    #[error("schema {id} not found in the registry")]
    SchemaNotFound {
        /// The id asked for.
        id: u32,
    },
    /// 401 or 403: the registry credentials are wrong or lack permission.
    #[error("schema registry refused the credentials (HTTP {status}): {message}")]
    Unauthorized {
        /// HTTP status.
        status: u16,
        /// The registry's message.
        message: String,
    },
    /// The registry has no such subject, or no such version under it (40401, 40402).
    #[error("no schema registered under subject {subject:?} version {version}")]
    SubjectNotFound {
        /// The subject asked for.
        subject: String,
        /// The version asked for (`latest` or a number).
        version: String,
    },
    /// Timeouts, connection errors, 408, 429 and 5xx: try again later.
    #[error("schema registry unavailable: {0}")]
    Unavailable(String),
    /// Any other answer, or a schema that does not compile.
    #[error("schema {id} is unusable: {reason}")]
    Invalid {
        /// The id asked for.
        id: u32,
        /// Why.
        reason: String,
    },
}

#[derive(Deserialize)]
pub(crate) struct SchemaResponse {
    schema: String,
    #[serde(rename = "schemaType", default)]
    schema_type: Option<String>,
    #[serde(default)]
    references: Vec<Reference>,
}

#[derive(Clone, Deserialize)]
struct Reference {
    name: String,
    subject: String,
    version: i64,
}

#[derive(Deserialize)]
struct ErrorBody {
    #[serde(default)]
    error_code: i64,
    #[serde(default)]
    message: String,
}

/// Most references followed for one schema (guards against cycles).
const MAX_REFERENCES: usize = 256;

type Fetch = Shared<BoxFuture<'static, Result<Arc<ResolvedSchema>, RegistryError>>>;

enum Slot {
    Ready(Arc<ResolvedSchema>),
    Fetching(Fetch),
}

/// A Schema Registry client with a process-wide cache keyed by schema id.
pub struct RegistryClient {
    inner: Arc<Inner>,
    cache: Mutex<HashMap<u32, Slot>>,
    /// Subject and version to schema id, with when it was learned (for `latest`).
    subjects: Mutex<HashMap<SubjectKey, (u32, std::time::Instant)>>,
    /// The connection named in this client's metrics (empty outside the daemon).
    connection: String,
    /// The cache-hit counter, registered on first use (once the recorder is installed).
    cache_hits: std::sync::OnceLock<crate::telemetry::metrics::Counter>,
}

/// A subject and a version (`None`: the latest).
type SubjectKey = (String, Option<i64>);

/// How long `latest` of a subject is trusted before it is asked for again.
const LATEST_TTL: Duration = Duration::from_secs(30);

struct Inner {
    http: reqwest::Client,
    base: String,
    auth: Auth,
}

enum Auth {
    None,
    Basic(String, Option<String>),
    Bearer(String),
}

impl std::fmt::Debug for RegistryClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegistryClient")
            .field("base", &self.inner.base)
            .finish_non_exhaustive()
    }
}

/// Why a registry client could not be built.
#[derive(Debug, Error)]
pub enum RegistryClientError {
    /// A TLS file could not be read or used.
    #[error(transparent)]
    Tls(#[from] crate::tls::TlsError),
    /// The HTTP client could not be built.
    #[error("cannot build the registry's HTTP client: {0}")]
    Http(#[from] reqwest::Error),
}

impl RegistryClient {
    /// Builds the client (one pooled HTTP client per registry), with the configured CA and
    /// client certificate when given.
    pub fn try_new(config: &RegistryConfig) -> Result<Self, RegistryClientError> {
        let mut builder = reqwest::Client::builder()
            .timeout(Duration::from_millis(config.timeout_ms))
            .connect_timeout(Duration::from_millis(config.timeout_ms.min(5_000)))
            .pool_idle_timeout(Duration::from_secs(90))
            .user_agent(concat!("tessel-kafka/", env!("CARGO_PKG_VERSION")));
        let files = config.tls_files();
        if files.any() {
            // The same CA and mTLS settings as the dispatcher client's (`crate::tls`): the
            // configured CA replaces the system's roots.
            builder =
                builder.tls_backend_preconfigured(crate::tls::client_config("registry", files)?);
        }
        let http = builder.build()?;
        let auth = match (&config.username, &config.password, &config.bearer_token) {
            (_, _, Some(token)) => Auth::Bearer(token.expose().to_owned()),
            (Some(user), password, None) => Auth::Basic(
                user.clone(),
                password.as_ref().map(|p| p.expose().to_owned()),
            ),
            _ => Auth::None,
        };
        Ok(Self {
            inner: Arc::new(Inner {
                http,
                base: config
                    .url
                    .expose()
                    .as_str()
                    .trim_end_matches('/')
                    .to_owned(),
                auth,
            }),
            cache: Mutex::new(HashMap::new()),
            subjects: Mutex::new(HashMap::new()),
            connection: String::new(),
            cache_hits: std::sync::OnceLock::new(),
        })
    }

    /// Names `connection` in this client's metrics.
    pub fn for_connection(mut self, connection: &str) -> Self {
        connection.clone_into(&mut self.connection);
        self
    }

    /// The schema registered under `subject` at `version` (`None`: the latest), compiled.
    /// A numbered version is cached for good; `latest` is asked again after 30 s, so a new
    /// version is picked up without a restart. Never registers a schema.
    pub async fn schema_for_subject(
        &self,
        subject: &str,
        version: Option<i64>,
    ) -> Result<Arc<ResolvedSchema>, RegistryError> {
        let key = (subject.to_owned(), version);
        let known = {
            let subjects = self.subjects.lock().unwrap_or_else(|p| p.into_inner());
            subjects
                .get(&key)
                .filter(|(_, at)| version.is_some() || at.elapsed() < LATEST_TTL)
                .map(|(id, _)| *id)
        };
        let id = match known {
            Some(id) => id,
            None => {
                let id = self.inner.subject_version_id(subject, version).await?;
                let mut subjects = self.subjects.lock().unwrap_or_else(|p| p.into_inner());
                let _ = subjects.insert(key, (id, std::time::Instant::now()));
                id
            }
        };
        self.schema(id).await
    }

    /// The compiled schema for `id`, from the cache or the registry.
    pub async fn schema(&self, id: u32) -> Result<Arc<ResolvedSchema>, RegistryError> {
        let fetch = {
            let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
            match cache.get(&id) {
                Some(Slot::Ready(hit)) => {
                    self.cache_hits
                        .get_or_init(|| {
                            crate::telemetry::metrics::registry_cache_counter(
                                &self.connection,
                                true,
                            )
                        })
                        .increment(1);
                    return Ok(Arc::clone(hit));
                }
                Some(Slot::Fetching(f)) => f.clone(),
                None => {
                    crate::telemetry::metrics::registry_cache(&self.connection, false);
                    let inner = Arc::clone(&self.inner);
                    let f = async move { inner.fetch(id).await.map(Arc::new) }
                        .boxed()
                        .shared();
                    let _ = cache.insert(id, Slot::Fetching(f.clone()));
                    f
                }
            }
        };
        let result = fetch.await;
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(Slot::Fetching(_)) = cache.get(&id) {
            match &result {
                Ok(schema) => {
                    let _ = cache.insert(id, Slot::Ready(Arc::clone(schema)));
                }
                // Never cache a failure: the next decoder asks the registry again.
                Err(_) => {
                    let _ = cache.remove(&id);
                }
            }
        }
        result
    }

    /// Reachability probe for readiness: `GET /subjects`.
    pub async fn probe(&self) -> Result<(), RegistryError> {
        self.inner
            .get_json::<serde_json::Value>("/subjects", 0)
            .await
            .map(|_| ())
    }
}

impl Inner {
    async fn subject_version_id(
        &self,
        subject: &str,
        version: Option<i64>,
    ) -> Result<u32, RegistryError> {
        #[derive(Deserialize)]
        struct IdOnly {
            id: u32,
        }
        let v = version.map_or_else(|| "latest".to_owned(), |v| v.to_string());
        let path = format!("/subjects/{}/versions/{v}", urlencode(subject));
        match self.get_json::<IdOnly>(&path, 0).await {
            Ok(r) => Ok(r.id),
            Err(RegistryError::SchemaNotFound { .. }) => Err(RegistryError::SubjectNotFound {
                subject: subject.to_owned(),
                version: v,
            }),
            Err(e) => Err(e),
        }
    }

    async fn fetch(&self, id: u32) -> Result<ResolvedSchema, RegistryError> {
        let root: SchemaResponse = self.get_json(&format!("/schemas/ids/{id}"), id).await?;
        let schema_type = match root.schema_type.as_deref().unwrap_or("AVRO") {
            "AVRO" => SchemaType::Avro,
            "PROTOBUF" => SchemaType::Protobuf,
            "JSON" => SchemaType::Json,
            other => {
                return Err(RegistryError::Invalid {
                    id,
                    reason: format!("unsupported schema type {other}"),
                })
            }
        };
        let references = self.fetch_references(id, &root.references).await?;
        let kind = compile(id, schema_type, &root.schema, &references)?;
        // Subject and version are informative; a registry that cannot say is fine.
        let subjects = self
            .get_json::<Vec<SubjectVersion>>(&format!("/schemas/ids/{id}/versions"), id)
            .await
            .unwrap_or_default();
        Ok(ResolvedSchema { id, kind, subjects })
    }

    /// All schemas referenced, transitively, keyed by reference name, in dependency order.
    async fn fetch_references(
        &self,
        id: u32,
        direct: &[Reference],
    ) -> Result<Vec<(String, SchemaResponse)>, RegistryError> {
        let mut out: Vec<(String, SchemaResponse)> = Vec::new();
        let mut stack: Vec<Reference> = direct.iter().rev().cloned().collect();
        while let Some(r) = stack.pop() {
            if out.iter().any(|(n, _)| *n == r.name) {
                continue;
            }
            if out.len() >= MAX_REFERENCES {
                return Err(RegistryError::Invalid {
                    id,
                    reason: "too many schema references".to_owned(),
                });
            }
            let path = format!("/subjects/{}/versions/{}", urlencode(&r.subject), r.version);
            let resp: SchemaResponse = self.get_json(&path, id).await?;
            stack.extend(resp.references.iter().rev().cloned());
            out.push((r.name.clone(), resp));
        }
        Ok(out)
    }

    async fn get_json<T: serde::de::DeserializeOwned>(
        &self,
        path: &str,
        id: u32,
    ) -> Result<T, RegistryError> {
        let mut req = self.http.get(format!("{}{}", self.base, path)).header(
            "Accept",
            "application/vnd.schemaregistry.v1+json, application/json",
        );
        req = match &self.auth {
            Auth::None => req,
            Auth::Basic(u, p) => req.basic_auth(u, p.as_deref()),
            Auth::Bearer(t) => req.bearer_auth(t),
        };
        let resp = req
            .send()
            .await
            .map_err(|e| RegistryError::Unavailable(crate::config::redacted_error_chain(&e)))?;
        let status = resp.status();
        if status.is_success() {
            return resp
                .json::<T>()
                .await
                .map_err(|e| RegistryError::Unavailable(format!("unreadable answer: {e}")));
        }
        let body: ErrorBody = resp.json().await.unwrap_or(ErrorBody {
            error_code: 0,
            message: String::new(),
        });
        Err(classify_status(
            status.as_u16(),
            body.error_code,
            body.message,
            id,
        ))
    }
}

fn classify_status(status: u16, error_code: i64, message: String, id: u32) -> RegistryError {
    match status {
        401 | 403 => RegistryError::Unauthorized { status, message },
        404 if matches!(error_code, 0 | 40401 | 40402 | 40403) => {
            RegistryError::SchemaNotFound { id }
        }
        408 | 429 | 500..=599 => RegistryError::Unavailable(format!("HTTP {status} {message}")),
        _ => RegistryError::Invalid {
            id,
            reason: format!("HTTP {status} (error code {error_code}) {message}"),
        },
    }
}

/// A chain of local `$ref`s and in-place applicators (`allOf`, `anyOf`, `oneOf`, `not`, `if`,
/// `then`, `else`) that leads back to where it started, applying the schema to the same
/// instance for ever: jsonschema would recurse without end compiling it (found by the
/// `json_schema` fuzz target, which ran out of memory on `{"$defs": {"node": {"$ref":
/// "#/$defs/node"}}}`). Keywords that descend into the instance (`properties`, `items`, …)
/// end a chain. Returns the pointer where the cycle closes.
fn same_instance_cycle(root: &serde_json::Value) -> Option<String> {
    use serde_json::Value;
    fn edges(node: &Value) -> Vec<String> {
        let mut out = Vec::new();
        let Value::Object(map) = node else {
            return out;
        };
        if let Some(Value::String(r)) = map.get("$ref") {
            if let Some(pointer) = r.strip_prefix('#') {
                out.push(pointer.to_owned());
            }
        }
        out
    }
    // Walk every subschema (pointer, value), then follow in-place edges from each.
    fn walk<'a>(pointer: String, node: &'a Value, all: &mut Vec<(String, &'a Value)>) {
        if all.len() > 100_000 {
            return;
        }
        match node {
            Value::Object(map) => {
                all.push((pointer.clone(), node));
                for (k, v) in map {
                    let key = k.replace('~', "~0").replace('/', "~1");
                    walk(format!("{pointer}/{key}"), v, all);
                }
            }
            Value::Array(items) => {
                for (i, v) in items.iter().enumerate() {
                    walk(format!("{pointer}/{i}"), v, all);
                }
            }
            _ => {}
        }
    }
    fn in_place(pointer: &str, node: &Value) -> Vec<String> {
        let mut out = edges(node);
        let Value::Object(map) = node else {
            return out;
        };
        for key in ["allOf", "anyOf", "oneOf"] {
            if let Some(Value::Array(items)) = map.get(key) {
                out.extend((0..items.len()).map(|i| format!("{pointer}/{key}/{i}")));
            }
        }
        for key in ["not", "if", "then", "else"] {
            if map.get(key).is_some_and(Value::is_object) {
                out.push(format!("{pointer}/{key}"));
            }
        }
        out
    }
    let mut all = Vec::new();
    walk(String::new(), root, &mut all);
    let by_pointer: std::collections::HashMap<&str, &Value> =
        all.iter().map(|(p, v)| (p.as_str(), *v)).collect();
    // Depth-first search for a cycle over in-place edges (colours: 1 on the stack, 2 done).
    let mut colour: std::collections::HashMap<String, u8> = std::collections::HashMap::new();
    for (start, _) in &all {
        if colour.contains_key(start) {
            continue;
        }
        let mut stack: Vec<(String, Vec<String>)> = Vec::new();
        let node = by_pointer[start.as_str()];
        let _ = colour.insert(start.clone(), 1);
        stack.push((start.clone(), in_place(start, node)));
        while let Some((at, next)) = stack.last_mut() {
            match next.pop() {
                Some(to) => match colour.get(&to) {
                    Some(1) => return Some(to),
                    Some(_) => {}
                    None => {
                        if let Some(target) = by_pointer.get(to.as_str()) {
                            let _ = colour.insert(to.clone(), 1);
                            let edges = in_place(&to, target);
                            stack.push((to, edges));
                        }
                    }
                },
                None => {
                    let _ = colour.insert(at.clone(), 2);
                    let _ = stack.pop();
                }
            }
        }
    }
    None
}

#[cfg(test)]
mod json_schema_cycle_tests {
    use super::same_instance_cycle;
    use serde_json::json;

    #[test]
    fn a_schema_that_refers_to_itself_in_place_is_found() {
        // The fuzz target's out-of-memory input.
        assert!(same_instance_cycle(
            &json!({"$defs": {"node": {"$ref": "#/$defs/node"}}, "$ref": "#/$defs/node"})
        )
        .is_some());
        assert!(same_instance_cycle(&json!({"$defs": {"a": {"anyOf": [{"$ref": "#/$defs/b"}]}, "b": {"not": {"$ref": "#/$defs/a"}}}})).is_some());
        assert!(same_instance_cycle(&json!({"allOf": [{"$ref": "#"}]})).is_some());
        // Recursion through a descending keyword is fine (a tree of nodes).
        assert!(same_instance_cycle(&json!({"$defs": {"node": {"type": "object", "properties": {"next": {"$ref": "#/$defs/node"}}}}, "$ref": "#/$defs/node"})).is_none());
        assert!(same_instance_cycle(&json!({"type": "array", "items": {"$ref": "#"}})).is_none());
    }

    #[test]
    fn compiling_such_a_schema_is_an_invalid_schema_not_an_endless_compile() {
        let Err(e) = super::compile(
            9,
            super::SchemaType::Json,
            r##"{"$defs":{"node":{"$ref":"#/$defs/node"}},"$ref":"#/$defs/node"}"##,
            &[],
        ) else {
            panic!("a self-referring schema was compiled");
        };
        assert!(e.to_string().contains("refers to itself"), "{e}");
    }
}

fn urlencode(s: &str) -> String {
    url::form_urlencoded::byte_serialize(s.as_bytes())
        .collect::<String>()
        .replace('+', "%20")
}

pub(crate) fn compile(
    id: u32,
    schema_type: SchemaType,
    text: &str,
    references: &[(String, SchemaResponse)],
) -> Result<CompiledSchema, RegistryError> {
    let invalid = |reason: String| RegistryError::Invalid { id, reason };
    match schema_type {
        SchemaType::Avro => {
            // parse_str_with_list wants referenced schemas first; it resolves names itself.
            let texts: Vec<&str> = references
                .iter()
                .rev()
                .map(|(_, r)| r.schema.as_str())
                .collect();
            let (schema, references) = apache_avro::Schema::parse_str_with_list(text, texts)
                .map_err(|e| invalid(format!("avro schema does not parse: {e}")))?;
            let name = super::avro::schema_name(&schema).map(Arc::from);
            Ok(CompiledSchema::Avro {
                schema,
                references,
                name,
            })
        }
        SchemaType::Json => {
            let schema = serde_json::from_str(text)
                .map_err(|e| invalid(format!("json schema does not parse: {e}")))?;
            let mut options = jsonschema::options();
            for (name, r) in references {
                let doc: serde_json::Value = serde_json::from_str(&r.schema).map_err(|e| {
                    invalid(format!("referenced json schema {name} does not parse: {e}"))
                })?;
                let resource = jsonschema::Resource::from_contents(doc).map_err(|e| {
                    invalid(format!("referenced json schema {name} is not usable: {e}"))
                })?;
                // A relative `$ref` resolves against the root's default base URI.
                let uri = if name.contains(':') {
                    name.clone()
                } else {
                    format!("json-schema:///{}", name.trim_start_matches('/'))
                };
                options = options.with_resource(uri, resource);
            }
            if let Some(cycle) = same_instance_cycle(&schema) {
                return Err(invalid(format!(
                    "json schema refers to itself without descending into the instance ({cycle}): it would never finish compiling"
                )));
            }
            let validator = options
                .build(&schema)
                .map_err(|e| invalid(format!("json schema does not compile: {e}")))?;
            let title = schema
                .get("title")
                .and_then(serde_json::Value::as_str)
                .map(Arc::from);
            Ok(CompiledSchema::Json {
                schema,
                validator: Arc::new(validator),
                title,
            })
        }
        SchemaType::Protobuf => {
            let main_name = format!("tessel-registry-schema-{id}.proto");
            let mut files = HashMap::new();
            for (name, r) in references {
                let _ = files.insert(name.clone(), proto_file(name, &r.schema).map_err(&invalid)?);
            }
            let main = proto_file(&main_name, text).map_err(&invalid)?;
            let main_name = main.name().to_owned();
            let _ = files.insert(main_name.clone(), main);
            let mut resolver = protox::file::ChainFileResolver::new();
            resolver.add(MapResolver(files));
            resolver.add(protox::file::GoogleFileResolver::new());
            let mut compiler = protox::Compiler::with_file_resolver(resolver);
            let _ = compiler.include_imports(true);
            let _ = compiler
                .open_file(&main_name)
                .map_err(|e| invalid(format!("protobuf schema does not compile: {e}")))?;
            let pool: DescriptorPool = compiler.descriptor_pool();
            let file = pool
                .get_file_by_name(&main_name)
                .ok_or_else(|| invalid("compiled protobuf file is missing".to_owned()))?;
            Ok(CompiledSchema::Protobuf { file })
        }
    }
}

/// A registered Protobuf schema is `.proto` text (Confluent, Java serializers) or a base64
/// `FileDescriptorProto` (what the Python serializer registers, returned as is by Apicurio).
fn proto_file(name: &str, text: &str) -> Result<protox::file::File, String> {
    let trimmed = text.trim();
    let looks_base64 = !trimmed.is_empty()
        && trimmed
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'/' | b'='));
    if looks_base64 {
        if let Ok(bytes) = base64::engine::general_purpose::STANDARD.decode(trimmed) {
            if let Ok(file) = protox::file::File::decode_file_descriptor_proto(bytes.as_slice()) {
                return Ok(rename_descriptor(file, name));
            }
        }
    }
    protox::file::File::from_source(name, text).map_err(|e| format!("protobuf schema {name}: {e}"))
}

/// References are imported under their reference name, which is what the importing file's
/// dependency list says; a descriptor's own name may differ, so it is renamed to match.
fn rename_descriptor(file: protox::file::File, name: &str) -> protox::file::File {
    let mut fdp = file.file_descriptor_proto().clone();
    if name.starts_with("tessel-registry-schema-")
        && fdp.name.as_deref().is_some_and(|n| !n.is_empty())
    {
        // The main schema keeps its own name.
        return protox::file::File::from_file_descriptor_proto(fdp);
    }
    fdp.name = Some(name.to_owned());
    protox::file::File::from_file_descriptor_proto(fdp)
}

struct MapResolver(HashMap<String, protox::file::File>);

impl protox::file::FileResolver for MapResolver {
    fn open_file(&self, name: &str) -> Result<protox::file::File, protox::Error> {
        self.0
            .get(name)
            .cloned()
            .ok_or_else(|| protox::Error::file_not_found(name))
    }
}

#[cfg(test)]
#[path = "registry_tests.rs"]
mod tests;
