//! Where triggers' target states live (docs/architecture.md, "Operator controls").
//!
//! - Without a region cluster: a JSON file in `region.state_dir`
//!   (`target-states.json`, written to a temporary file, synced and renamed over), read when
//!   the daemon starts. Each replica keeps its own; an action is forwarded to the peers, and a
//!   replica that starts takes the peers' newer states ([`super::peers`]).
//! - With `[region.kafka]`: the region's compacted control topic (one partition), as Kafka
//!   Connect keeps target states in its config topic. Every replica reads it from the start
//!   before its connections start, then follows it, so a pause written by one replica reaches
//!   all; the topic also holds the replicas' directory (id → admin URL), written every 30 s.
//!
//! Nothing is ever written to a tenant's cluster.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::trigger::{now_ms, TargetState};
use crate::config::Config;

/// Applies a target state read from the store: (connection, trigger, state).
pub type ApplyFn = Box<dyn Fn(&str, &str, TargetState) + Send + Sync>;

/// The replicas of the region as the control topic lists them: id → (admin URL, when it
/// last said so, in milliseconds since the epoch).
pub type Directory = Arc<Mutex<BTreeMap<String, (String, i64)>>>;

/// How long a replica's directory entry counts after it was last written.
pub const DIRECTORY_TTL_MS: i64 = 90_000;
/// How often a replica writes its directory entry.
const DIRECTORY_EVERY: Duration = Duration::from_secs(30);
/// How long starting waits for the control topic to be read to its end.
const LOAD_WAIT: Duration = Duration::from_secs(30);

/// The target-state store of this replica.
pub enum TargetStore {
    /// A file in `region.state_dir`.
    File(FileStore),
    /// The region cluster's control topic.
    Topic(TopicStore),
}

impl TargetStore {
    /// The store `config` asks for: the control topic with `[region.kafka]`, else the file.
    pub fn for_config(config: &Config) -> Self {
        if config.region.has_cluster() {
            Self::Topic(TopicStore {
                topic: config.region.control_topic(),
                kafka: config.region.kafka.clone(),
                region: config.region.name.clone(),
                producer: Mutex::new(None),
                directory: Directory::default(),
            })
        } else {
            Self::File(FileStore {
                path: config.region.state_dir.join(FILE),
                write: tokio::sync::Mutex::new(()),
            })
        }
    }

    /// Whether every replica reads what one stores (the control topic).
    pub fn is_shared(&self) -> bool {
        matches!(self, Self::Topic(_))
    }

    /// The replica directory the control topic keeps.
    pub fn directory(&self) -> Option<Directory> {
        match self {
            Self::File(_) => None,
            Self::Topic(t) => Some(Arc::clone(&t.directory)),
        }
    }

    /// Reads the stored states and applies each; with the control topic, keeps applying
    /// what other replicas write until `shutdown`, and keeps this replica's directory entry.
    pub async fn start(
        &self,
        replica_id: &str,
        advertise: &str,
        apply: ApplyFn,
        shutdown: &tokio_util::sync::CancellationToken,
    ) -> anyhow::Result<()> {
        match self {
            Self::File(f) => {
                for (c, t, state) in f.load().await {
                    apply(&c, &t, state);
                }
                Ok(())
            }
            Self::Topic(t) => t.start(replica_id, advertise, apply, shutdown).await,
        }
    }

    /// Stores a trigger's target state; Err says why it could not be (nothing changed).
    pub async fn put(
        &self,
        connection: &str,
        trigger: &str,
        state: &TargetState,
    ) -> Result<(), String> {
        match self {
            Self::File(f) => f.put(connection, trigger, state).await,
            Self::Topic(t) => t.put(connection, trigger, state).await,
        }
    }
}

/// The file's name in `region.state_dir`.
pub const FILE: &str = "target-states.json";

/// The file's content.
#[derive(Debug, Default, Serialize, Deserialize)]
struct FileDoc {
    /// Format version (1).
    version: u32,
    /// connection → trigger → state.
    connections: BTreeMap<String, BTreeMap<String, TargetState>>,
}

/// Target states in a local file.
pub struct FileStore {
    path: PathBuf,
    /// One write at a time (read, change, write).
    write: tokio::sync::Mutex<()>,
}

impl FileStore {
    /// Every stored state; none when the file is missing. An unreadable file is logged and
    /// kept aside (`.unreadable`) rather than overwritten blindly.
    async fn load(&self) -> Vec<(String, String, TargetState)> {
        match read_doc(&self.path).await {
            Ok(doc) => flatten(doc),
            Err(e) => {
                tracing::error!(path = %self.path.display(), error = %e, "cannot read the triggers' target states; every trigger starts running");
                let aside = self.path.with_extension("json.unreadable");
                let _ = tokio::fs::rename(&self.path, &aside).await;
                Vec::new()
            }
        }
    }

    async fn put(
        &self,
        connection: &str,
        trigger: &str,
        state: &TargetState,
    ) -> Result<(), String> {
        let _one = self.write.lock().await;
        let mut doc = read_doc(&self.path).await.map_err(|e| e.to_string())?;
        doc.version = 1;
        let _ = doc
            .connections
            .entry(connection.to_owned())
            .or_default()
            .insert(trigger.to_owned(), state.clone());
        let text = serde_json::to_vec_pretty(&doc).map_err(|e| e.to_string())?;
        write_atomically(&self.path, &text)
            .await
            .map_err(|e| format!("{}: {e}", self.path.display()))
    }
}

fn flatten(doc: FileDoc) -> Vec<(String, String, TargetState)> {
    doc.connections
        .into_iter()
        .flat_map(|(c, ts)| ts.into_iter().map(move |(t, s)| (c.clone(), t, s)))
        .collect()
}

/// The file's states; an empty document when it does not exist.
async fn read_doc(path: &std::path::Path) -> anyhow::Result<FileDoc> {
    match tokio::fs::read(path).await {
        Ok(bytes) => Ok(serde_json::from_slice(&bytes)?),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(FileDoc::default()),
        Err(e) => Err(e.into()),
    }
}

/// Writes `bytes` to `path` so that a crash leaves the old file or the new one: a temporary
/// file beside it, synced, renamed over it, the directory synced. Creates the directory.
async fn write_atomically(path: &std::path::Path, bytes: &[u8]) -> std::io::Result<()> {
    let path = path.to_owned();
    let bytes = bytes.to_vec();
    tokio::task::spawn_blocking(move || {
        use std::io::Write as _;
        let dir = path.parent().unwrap_or(std::path::Path::new("."));
        std::fs::create_dir_all(dir)?;
        let tmp = path.with_extension("json.tmp");
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(&bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, &path)?;
        std::fs::File::open(dir)?.sync_all()
    })
    .await
    .map_err(std::io::Error::other)?
}

/// A record of the control topic.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
enum ControlRecord {
    /// A trigger's target state (key `target-state/<connection>/<trigger>`).
    TargetState {
        connection: String,
        trigger: String,
        state: TargetState,
    },
    /// A replica's directory entry (key `replica/<id>`).
    Replica { id: String, url: String, at_ms: i64 },
}

/// Target states in the region cluster's compacted control topic.
pub struct TopicStore {
    topic: String,
    kafka: BTreeMap<String, String>,
    region: String,
    producer: Mutex<Option<rdkafka::producer::FutureProducer>>,
    directory: Directory,
}

impl TopicStore {
    fn client_config(&self) -> rdkafka::ClientConfig {
        let mut cfg = rdkafka::ClientConfig::new();
        for (k, v) in &self.kafka {
            let _ = cfg.set(k, v);
        }
        cfg
    }

    async fn start(
        &self,
        replica_id: &str,
        advertise: &str,
        apply: ApplyFn,
        shutdown: &tokio_util::sync::CancellationToken,
    ) -> anyhow::Result<()> {
        self.ensure_topic().await;
        let _ = self.producer().map_err(anyhow::Error::msg)?;
        let (loaded_tx, loaded) = tokio::sync::oneshot::channel();
        let reader = Reader {
            topic: self.topic.clone(),
            config: self.client_config(),
            region: self.region.clone(),
            directory: Arc::clone(&self.directory),
            apply,
            stop: shutdown.clone(),
        };
        drop(tokio::task::spawn_blocking(move || reader.run(loaded_tx)));
        match tokio::time::timeout(LOAD_WAIT, loaded).await {
            Ok(Ok(n)) => {
                tracing::info!(topic = %self.topic, records = n, "control topic read: target states applied")
            }
            _ => tracing::error!(topic = %self.topic, wait_s = LOAD_WAIT.as_secs(),
                "control topic not read to its end in time: triggers start running and follow their target states once it is read"),
        }
        let entry = ControlRecord::Replica {
            id: replica_id.to_owned(),
            url: advertise.to_owned(),
            at_ms: 0,
        };
        self.heartbeat(entry, shutdown.clone());
        Ok(())
    }

    /// Creates the control topic (compacted, one partition) if it is missing.
    async fn ensure_topic(&self) {
        use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
        let admin: AdminClient<rdkafka::client::DefaultClientContext> =
            match self.client_config().create() {
                Ok(a) => a,
                Err(e) => {
                    tracing::error!(error = %e, "cannot create a client for the region cluster");
                    return;
                }
            };
        let topic = NewTopic::new(&self.topic, 1, TopicReplication::Fixed(-1))
            .set("cleanup.policy", "compact");
        let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
        match admin.create_topics(&[topic], &options).await {
            Ok(results) => {
                for r in results {
                    match r {
                        Ok(t) => {
                            tracing::info!(topic = %t, "control topic created (compacted, one partition)")
                        }
                        Err((_, rdkafka::types::RDKafkaErrorCode::TopicAlreadyExists)) => {}
                        Err((t, e)) => {
                            tracing::warn!(topic = %t, error = %e, "cannot create the control topic")
                        }
                    }
                }
            }
            Err(e) => {
                tracing::warn!(topic = %self.topic, error = %e, "cannot create the control topic")
            }
        }
    }

    /// The control topic's producer, created on first use (an action may come before the
    /// topic is read).
    fn producer(&self) -> Result<rdkafka::producer::FutureProducer, String> {
        let mut slot = self.producer.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(p) = &*slot {
            return Ok(p.clone());
        }
        let mut cfg = self.client_config();
        let _ = cfg
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .set("message.timeout.ms", "10000")
            .set(
                "client.id",
                format!("tessel-kafka-region-{}-control", self.region),
            );
        let p: rdkafka::producer::FutureProducer = cfg
            .create()
            .map_err(|e| format!("cannot create the region cluster's producer: {e}"))?;
        *slot = Some(p.clone());
        Ok(p)
    }

    fn heartbeat(&self, entry: ControlRecord, stop: tokio_util::sync::CancellationToken) {
        let Ok(producer) = self.producer() else {
            return;
        };
        let topic = self.topic.clone();
        drop(tokio::spawn(async move {
            let ControlRecord::Replica { id, url, .. } = entry else {
                return;
            };
            let mut tick = tokio::time::interval(DIRECTORY_EVERY);
            loop {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tick.tick() => {}
                }
                let record = ControlRecord::Replica {
                    id: id.clone(),
                    url: url.clone(),
                    at_ms: now_ms(),
                };
                let key = format!("replica/{id}");
                if let Err(e) = send(&producer, &topic, &key, &record).await {
                    tracing::warn!(topic = %topic, error = %e, "cannot write this replica's directory entry");
                }
            }
        }));
    }

    async fn put(
        &self,
        connection: &str,
        trigger: &str,
        state: &TargetState,
    ) -> Result<(), String> {
        let producer = self.producer()?;
        let record = ControlRecord::TargetState {
            connection: connection.to_owned(),
            trigger: trigger.to_owned(),
            state: state.clone(),
        };
        let key = format!("target-state/{connection}/{trigger}");
        send(&producer, &self.topic, &key, &record).await
    }
}

async fn send(
    producer: &rdkafka::producer::FutureProducer,
    topic: &str,
    key: &str,
    record: &ControlRecord,
) -> Result<(), String> {
    let value = serde_json::to_vec(record).map_err(|e| e.to_string())?;
    let r = rdkafka::producer::FutureRecord::to(topic)
        .key(key)
        .payload(&value);
    producer
        .send(r, Duration::from_secs(10))
        .await
        .map(drop)
        .map_err(|(e, _)| format!("control topic {topic}: {e}"))
}

/// Reads the control topic from its start, for ever, on a thread of the blocking pool.
struct Reader {
    topic: String,
    config: rdkafka::ClientConfig,
    region: String,
    directory: Directory,
    apply: ApplyFn,
    stop: tokio_util::sync::CancellationToken,
}

impl Reader {
    fn run(mut self, loaded: tokio::sync::oneshot::Sender<usize>) {
        use rdkafka::consumer::{BaseConsumer, Consumer as _};
        use rdkafka::message::Message as _;
        let _ = self
            .config
            .set(
                "group.id",
                format!("tessel-region-{}-control-reader", self.region),
            )
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("auto.offset.reset", "earliest")
            .set("isolation.level", "read_committed");
        let consumer: BaseConsumer = match self.config.create() {
            Ok(c) => c,
            Err(e) => {
                tracing::error!(error = %e, "cannot create the control topic's reader");
                return;
            }
        };
        let mut tpl = rdkafka::TopicPartitionList::new();
        let _ = tpl.add_partition_offset(&self.topic, 0, rdkafka::Offset::Beginning);
        if let Err(e) = consumer.assign(&tpl) {
            tracing::error!(topic = %self.topic, error = %e, "cannot read the control topic");
            return;
        }
        // Where "read to its end" is: the end when reading began (retried until the
        // cluster answers).
        let mut end = None;
        let mut loaded = Some(loaded);
        let mut read = 0usize;
        let mut position = 0i64;
        while !self.stop.is_cancelled() {
            if end.is_none() {
                end = consumer
                    .fetch_watermarks(&self.topic, 0, Duration::from_secs(5))
                    .ok()
                    .map(|(_, high)| high);
            }
            if let (Some(e), true) = (end, loaded.is_some()) {
                if position >= e {
                    if let Some(tx) = loaded.take() {
                        let _ = tx.send(read);
                    }
                }
            }
            let Some(result) = consumer.poll(Duration::from_millis(200)) else {
                // Nothing more for now: the consumer's own position says how far it read
                // (past compacted offsets and markers no record stands for).
                if let Ok(tpl) = consumer.position() {
                    if let Some(rdkafka::Offset::Offset(o)) =
                        tpl.find_partition(&self.topic, 0).map(|e| e.offset())
                    {
                        position = position.max(o);
                    }
                }
                continue;
            };
            let msg = match result {
                Ok(m) => m,
                Err(e) => {
                    tracing::debug!(topic = %self.topic, error = %e, "control topic read error");
                    continue;
                }
            };
            position = msg.offset() + 1;
            read += 1;
            let Some(payload) = msg.payload() else {
                continue;
            };
            match serde_json::from_slice::<ControlRecord>(payload) {
                Ok(ControlRecord::TargetState {
                    connection,
                    trigger,
                    state,
                }) => (self.apply)(&connection, &trigger, state),
                Ok(ControlRecord::Replica { id, url, at_ms }) => {
                    let _ = self
                        .directory
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .insert(id, (url, at_ms));
                }
                Err(e) => {
                    tracing::warn!(topic = %self.topic, offset = msg.offset(), error = %e, "control topic record not understood; ignored")
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::trigger::RunState;

    #[tokio::test]
    async fn the_file_keeps_every_triggers_latest_state_across_restarts() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nested").join(FILE);
        let store = FileStore {
            path: path.clone(),
            write: tokio::sync::Mutex::new(()),
        };
        assert!(store.load().await.is_empty(), "no file: every trigger runs");
        let paused = TargetState {
            state: RunState::Paused,
            reason: Some("workflow broken".into()),
            by: Some("oncall".into()),
            at_ms: 7,
        };
        store.put("orders", "fraud", &paused).await.unwrap();
        store
            .put("orders", "audit", &TargetState::default())
            .await
            .unwrap();
        let again = FileStore {
            path: path.clone(),
            write: tokio::sync::Mutex::new(()),
        };
        let mut states = again.load().await;
        states.sort_by(|a, b| a.1.cmp(&b.1));
        assert_eq!(states.len(), 2);
        assert_eq!(states[1], ("orders".into(), "fraud".into(), paused));
        std::fs::write(&path, b"{ not json").unwrap();
        assert!(
            again.load().await.is_empty(),
            "unreadable: logged, kept aside"
        );
        assert!(path.with_extension("json.unreadable").exists());
    }
}
