//! Building a connection's parts from its configuration: the clients it shares with the
//! produce API, its triggers (each with its dispatcher, permits and decoder), its consumer.
//! Opens no connection.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, Semaphore};

use super::{consumer_config, AssignedPartition, ConsumerEvent};
use crate::codec::registry::RegistryClient;
use crate::codec::Decoder;
use crate::config::ConnectionConfig;
use crate::consumer::context::ConnectorContext;
use crate::consumer::port::KafkaPort;
use crate::core::partitions::{Limits, TriggerSlot};
use crate::core::Core;
use crate::dispatch::retry::Backoff;
use crate::dispatch::DispatchPools;
use crate::run::spawn::KafkaShell;
use crate::run::TriggerRuntime;
use thiserror::Error;

/// Why a connection could not start or stopped.
#[derive(Debug, Error)]
pub enum SupervisorError {
    /// The consumer could not be created or subscribed.
    #[error("kafka consumer for connection {connection}: {source}")]
    Kafka {
        /// Connection name.
        connection: String,
        /// librdkafka's error.
        source: rdkafka::error::KafkaError,
    },
    /// A trigger's dispatcher or the registry client could not be built.
    #[error("connection {connection}: {reason}")]
    Setup {
        /// Connection name.
        connection: String,
        /// Why.
        reason: String,
    },
    /// A thread of the connection could not be started, or ended.
    #[error("thread of connection {0}: {1}")]
    Thread(String, std::io::Error),
    /// One of the connection's own tasks panicked (or ended while the connection ran): the
    /// connection is started again.
    #[error("connection {connection}: its {task} task panicked: {reason}")]
    Panicked {
        /// Connection name.
        connection: String,
        /// Which task: poll, ops, supervisor.
        task: &'static str,
        /// The panic's message, or why the task ended.
        reason: String,
    },
}

impl SupervisorError {
    /// Whether a task of the connection panicked (see [`SupervisorError::Panicked`]).
    pub fn is_panic(&self) -> bool {
        matches!(self, Self::Panicked { .. })
    }
}

/// The message of a panic's payload.
pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_owned())
}

pub(super) type Trigger = Arc<TriggerRuntime>;

type Consumer_ = rdkafka::consumer::BaseConsumer<ConnectorContext>;

/// Clients of one connection that the consumer and the produce API share: one registry
/// client (one schema cache) and one idempotent producer; and the daemon's dispatcher pools,
/// which its triggers share with every other connection's.
#[derive(Debug, Default)]
pub struct SharedClients {
    /// The registry client, when the connection has a registry.
    pub registry: Option<Arc<RegistryClient>>,
    /// The idempotent producer, when the connection produces (dead letters, produce API).
    pub producer: Option<crate::produce::producer::IdempotentProducer>,
    /// The connection's operator controls (its triggers' target states and parked keys,
    /// the status its shell reports); a standalone one unless the daemon's hub set it.
    pub control: Arc<crate::control::ConnectionControl>,
    /// The dispatcher clients by origin (a set of its own unless
    /// [`SharedClients::with_dispatch_pools`] gives the daemon's).
    pub dispatch: Arc<DispatchPools>,
}

impl SharedClients {
    /// Builds the clients `config` needs; `produces` says whether the produce API uses this
    /// connection. Opens no connection yet.
    pub fn try_new(
        name: &str,
        config: &ConnectionConfig,
        produces: bool,
    ) -> Result<Self, SupervisorError> {
        let registry = match &config.schema_registry {
            Some(r) => Some(Arc::new(
                RegistryClient::try_new(r)
                    .map_err(|e| SupervisorError::Setup {
                        connection: name.to_owned(),
                        reason: format!("schema registry client: {e}"),
                    })?
                    .for_connection(name),
            )),
            None => None,
        };
        let dead_letters = config
            .triggers
            .values()
            .any(crate::config::TriggerConfig::dead_letters);
        let producer = if dead_letters || produces {
            Some(
                crate::produce::producer::IdempotentProducer::try_new(name, config).map_err(
                    |source| SupervisorError::Kafka {
                        connection: name.to_owned(),
                        source,
                    },
                )?,
            )
        } else {
            None
        };
        Ok(Self {
            registry,
            producer,
            control: Arc::new(crate::control::ConnectionControl::new(name)),
            dispatch: Arc::default(),
        })
    }

    /// These clients, with triggers' dispatchers taken from `pools`.
    pub fn with_dispatch_pools(mut self, pools: Arc<DispatchPools>) -> Self {
        self.dispatch = pools;
        self
    }
}

/// A connection's triggers, by topic and by name.
pub(super) struct Triggers {
    /// Each topic's trigger (topics matched by a pattern are added when first assigned).
    by_topic: HashMap<String, TriggerSlot<KafkaShell>>,
    /// Each trigger by name.
    by_name: HashMap<String, TriggerSlot<KafkaShell>>,
    /// Every trigger once, by index.
    pub(super) all: Vec<Trigger>,
}

impl Triggers {
    /// Builds each trigger of `config` (connection `name`) with its dispatcher.
    pub(super) fn try_new(
        name: &str,
        config: &ConnectionConfig,
        shared: &SharedClients,
    ) -> Result<Self, SupervisorError> {
        let setup = |reason: String| SupervisorError::Setup {
            connection: name.to_owned(),
            reason,
        };
        let decoder = Decoder::new(shared.registry.clone());
        let producer = shared.producer.clone();
        let mut by_topic = HashMap::new();
        let mut by_name = HashMap::new();
        let mut triggers = Vec::new();
        for (tname, t) in &config.triggers {
            let dispatcher = shared
                .dispatch
                .dispatcher(&t.dispatcher)
                .map_err(|e| setup(format!("trigger {tname} dispatcher: {e}")))?;
            let runtime = Arc::new(TriggerRuntime {
                connection: name.to_owned(),
                group: config.group_id().to_owned(),
                name: tname.clone(),
                config: t.clone(),
                dispatcher,
                permits: Arc::new(Semaphore::new(t.concurrency)),
                backoff: Backoff::from(&t.retry),
                decoder: decoder.clone(),
                producer: producer.clone(),
                throttle_until: std::sync::Mutex::new(None),
                warned_traceparent: std::sync::atomic::AtomicBool::new(false),
                stopped: std::sync::atomic::AtomicBool::new(false),
                last_failure: std::sync::Mutex::new(None),
                missing_permission: std::sync::Mutex::new(None),
                metrics: std::sync::OnceLock::new(),
                cloudevents: crate::dispatch::cloudevents::CloudEvents::for_dispatcher(
                    &t.dispatcher,
                    config
                        .kafka
                        .get("bootstrap.servers")
                        .map_or("", String::as_str),
                ),
                control: shared.control.trigger(tname),
            });
            let slot = TriggerSlot {
                index: triggers.len(),
                ordering: t.ordering,
                runtime: Arc::clone(&runtime),
                batch: t.batch.as_ref().map(crate::core::batch::BatchLimits::from),
            };
            for topic in t.topics.iter().filter(|t| !crate::config::is_pattern(t)) {
                let _ = by_topic.insert(topic.clone(), slot.clone());
            }
            let _ = by_name.insert(tname.clone(), slot);
            triggers.push(runtime);
        }
        if config.commit_fallback.is_some() {
            tracing::warn!(connection = name, "commit_fallback is removed and ignored: every commit goes through the consumer, in order (docs/delivery.md); delete it from the file");
        }
        Ok(Self {
            by_topic,
            by_name,
            all: triggers,
        })
    }

    /// Each assigned partition with the trigger of its topic (logged; one no trigger
    /// consumes is left out).
    pub(super) fn slots(
        &mut self,
        connection: &str,
        config: &ConnectionConfig,
        assigned: Vec<AssignedPartition>,
    ) -> Vec<(AssignedPartition, TriggerSlot<KafkaShell>)> {
        let mut slots = Vec::with_capacity(assigned.len());
        for a in assigned {
            let (topic, partition) = (&a.tp.topic, a.tp.partition);
            let Some(trigger) = self.of(connection, config, topic) else {
                tracing::warn!(connection, %topic, partition, "assigned a partition of a topic no trigger consumes; its messages are ignored");
                continue;
            };
            tracing::info!(connection, %topic, partition, "partition assigned");
            slots.push((a, trigger));
        }
        slots
    }

    /// The trigger of `topic`: named by one, or matched by a pattern (then remembered).
    fn of(
        &mut self,
        connection: &str,
        config: &ConnectionConfig,
        topic: &str,
    ) -> Option<TriggerSlot<KafkaShell>> {
        if let Some(slot) = self.by_topic.get(topic) {
            return Some(slot.clone());
        }
        let (name, _) = config.trigger_for(topic)?;
        let slot = self.by_name.get(name)?.clone();
        tracing::info!(
            connection,
            topic,
            trigger = name,
            "topic matched by the trigger's pattern"
        );
        let _ = self.by_topic.insert(topic.to_owned(), slot.clone());
        Some(slot)
    }
}

/// Accepted offsets reach the group within this interval plus one round trip; the broker
/// sees at most 100 commit requests a second per connection, and none while nothing is
/// accepted.
const COMMIT_INTERVAL: Duration = Duration::from_millis(10);

/// The longest new runs wait while the broker refuses commits (a classic-protocol rebalance
/// lasts until a dead member's session times out, 45 s by default).
const COMMIT_HOLD_LIMIT: Duration = Duration::from_secs(60);

/// The consumer core of a connection, with its limits.
pub(super) fn core(config: &ConnectionConfig) -> Core<KafkaShell> {
    let limits = Limits {
        per_partition: config.max_buffered_per_partition,
        max_bytes: config.max_buffered_bytes,
        max_tracked_above: crate::core::offsets::MAX_TRACKED_ABOVE,
        metadata_max_chars: config.commit_metadata_max_bytes,
    };
    let drain = Duration::from_millis(config.drain_timeout_ms);
    Core::new(limits, COMMIT_INTERVAL, COMMIT_HOLD_LIMIT, drain)
}

/// Subscribes `consumer` to the topics of `config`.
pub(super) fn subscribe(
    name: &str,
    config: &ConnectionConfig,
    consumer: &impl KafkaPort,
) -> Result<(), SupervisorError> {
    let topics: Vec<&str> = config.topics().into_iter().collect();
    consumer
        .subscribe(&topics)
        .map_err(|source| SupervisorError::Kafka {
            connection: name.to_owned(),
            source,
        })?;
    tracing::info!(connection = name, topics = ?topics, group = config.group_id(), "consumer subscribed");
    Ok(())
}

/// Creates the consumer of connection `name`, whose callbacks hand events to `events_tx`.
pub(super) fn consumer(
    name: &str,
    config: &ConnectionConfig,
    events_tx: mpsc::Sender<ConsumerEvent>,
) -> Result<Consumer_, SupervisorError> {
    let revoke_wait = Duration::from_millis(config.drain_timeout_ms) + Duration::from_secs(10);
    let signer =
        crate::clients::security::MskIamSigner::from_config(config, |v| std::env::var(v).ok())
            .map_err(|e| SupervisorError::Setup {
                connection: name.to_owned(),
                reason: format!("AWS_MSK_IAM: {e}"),
            })?
            .map(Arc::new);
    let context = ConnectorContext::new(name.to_owned(), events_tx, revoke_wait, signer)
        .with_offset_reset(config.kafka.get("auto.offset.reset").map(String::as_str));
    consumer_config(name, config)
        .create_with_context(context)
        .map_err(|source| SupervisorError::Kafka {
            connection: name.to_owned(),
            source,
        })
}
